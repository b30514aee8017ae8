"""One device login as the `device-credentials` topic holds it: the id rule and the record's JSON.

Key: the device id (UTF-8), `^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`, never starting with a service's client id
prefix (`bridge-`, `mosquitto-agent-`). Value (UTF-8 JSON):
  {"enabled": true, "auth": "password"|"certificate", "hash": "$7$<iterations>$<salt b64>$<digest b64>"|null,
   "source": "cli"|"inventory", "updated_ms": 1732...}
`hash` is PBKDF2-HMAC-SHA512 in Mosquitto's `$7$` form, null for a certificate device. A tombstone (no
value) removes the device. iot-devices writes these records, mosquitto-agent reads them; a record that
does not parse counts as no login at all (fail closed). Standard library only.
"""
from __future__ import annotations

import base64
import json
import re
from dataclasses import asdict, dataclass

DEVICE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")      # whole text: use fullmatch
RESERVED_PREFIXES = ("bridge-", "mosquitto-agent-")     # the services' client ids (the plugin refuses them too)
PASSWORD, CERTIFICATE = "password", "certificate"
AUTHS = (PASSWORD, CERTIFICATE)
CLI, INVENTORY = "cli", "inventory"
SOURCES = (CLI, INVENTORY)
# "$7$<iterations>$<salt>$<digest>", standard base64 with its padding (the plugin decodes whole 4-char groups).
_B64 = r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)"
HASH_RE = re.compile(rf"\$7\$[1-9][0-9]{{0,7}}\${_B64}\${_B64}")     # whole text: use fullmatch
# What the plugin takes (iot_gate.c parse_secret): one bad line fails a whole snapshot part, so the agent must
# never send one.
MAX_ITERATIONS, MAX_SALT_BYTES, MAX_DIGEST_BYTES = 10_000_000, 64, 64


class CredentialError(ValueError):
    """A device id or record breaks the rules above; the message names the device and the fix."""


def device_id_error(device_id: object) -> str | None:
    """Why `device_id` cannot be a device id, or None when it can."""
    if not isinstance(device_id, str) or not DEVICE_ID_RE.fullmatch(device_id):
        return (f"device id {device_id!r} is not valid: 1 to 64 of letters, digits, '_', '.', '-', "
                "starting with a letter or digit")
    for prefix in RESERVED_PREFIXES:
        if device_id.startswith(prefix):
            return f"device id {device_id!r} starts with {prefix!r}, which is reserved for the services' client ids"
    return None


def hash_error(hashed: object) -> str | None:
    """Why `hashed` is not a `$7$` hash the plugin takes, or None when it is."""
    if not isinstance(hashed, str) or not HASH_RE.fullmatch(hashed):
        return "'hash' must be $7$<iterations>$<salt b64>$<digest b64>"
    _, _, iterations, salt, digest = hashed.split("$")
    if int(iterations) > MAX_ITERATIONS:
        return f"'hash' has {iterations} iterations, more than {MAX_ITERATIONS}"
    if len(base64.b64decode(salt)) > MAX_SALT_BYTES or len(base64.b64decode(digest)) > MAX_DIGEST_BYTES:
        return f"'hash' has a salt or digest longer than {MAX_DIGEST_BYTES} bytes"
    return None


def check_device_id(device_id: object) -> str:
    """`device_id` itself, or CredentialError saying why it cannot be one."""
    error = device_id_error(device_id)
    if error:
        raise CredentialError(error)
    return device_id  # type: ignore[return-value]


@dataclass(frozen=True)
class Credential:
    enabled: bool
    auth: str
    hash: str | None
    source: str
    updated_ms: int

    def to_json(self) -> bytes:
        """The record's value as iot-devices writes it."""
        return json.dumps(asdict(self), separators=(",", ":")).encode()


def parse_credential(device_id: str, value: bytes | str) -> Credential:
    """The record of `device_id` (its key) from its value; CredentialError naming what is wrong."""
    check_device_id(device_id)
    try:
        raw = json.loads(value)
    except (ValueError, UnicodeDecodeError) as err:
        raise CredentialError(f"device {device_id}: the record is not JSON ({err})") from None
    if not isinstance(raw, dict):
        raise CredentialError(f"device {device_id}: the record must be a JSON object, got {type(raw).__name__}")
    enabled, auth, hashed = raw.get("enabled"), raw.get("auth"), raw.get("hash")
    source, updated = raw.get("source", CLI), raw.get("updated_ms", 0)
    if not isinstance(enabled, bool):
        raise CredentialError(f"device {device_id}: 'enabled' must be true or false, got {enabled!r}")
    if auth not in AUTHS:
        raise CredentialError(f"device {device_id}: 'auth' must be one of {', '.join(AUTHS)}, got {auth!r}")
    if auth == PASSWORD and hash_error(hashed):
        raise CredentialError(f"device {device_id}: a password device needs a valid hash: {hash_error(hashed)}")
    if auth == CERTIFICATE and hashed is not None:
        raise CredentialError(f"device {device_id}: a certificate device has 'hash' null")
    if source not in SOURCES:
        raise CredentialError(f"device {device_id}: 'source' must be one of {', '.join(SOURCES)}, got {source!r}")
    if not isinstance(updated, int) or isinstance(updated, bool):
        raise CredentialError(f"device {device_id}: 'updated_ms' must be a whole number, got {updated!r}")
    return Credential(enabled, auth, hashed, source, updated)
