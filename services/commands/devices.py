"""Manage the device logins of one edge site: the compacted Kafka topic `device-credentials`.

  iot-devices --bootstrap kafka-1:9092 --site site-a add press-7
  iot-devices --bootstrap ... --site site-a add cam-2 --certificate --ca-cert ca.crt --ca-key ca.key --days 365
  iot-devices --bootstrap ... --site site-a import devices.csv      (columns device_id[,auth]; '-' reads stdin)
  iot-devices --bootstrap ... disable ID | enable ID | remove ID
  iot-devices --bootstrap ... --site site-a rotate ID
  iot-devices --bootstrap ... list [--all]
  iot-devices --bootstrap ... --site site-a sync-inventory --salt-key-file F < devices.json

Each device is one record keyed by its id (services/common/device_credentials.py); mosquitto-agent hands
every change to Mosquitto's iot_gate plugin, which kicks a connected device whose login was removed,
disabled or rotated. Ids, what each command prints (add, import and rotate: each new credential once),
hashing, sync-inventory, logins and exit codes: at the end of --help (EPILOG).
Tests: tests/unit/commands/test_devices.py.
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import hmac
import io
import json
import logging
import os
import re
import secrets
import string
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from services.common import kafka_auth, names, settings
from services.common.device_credentials import (
    CERTIFICATE,
    CLI,
    INVENTORY,
    PASSWORD,
    Credential,
    CredentialError,
    device_id_error,
    hash_error,
    parse_credential,
)

PROG = "iot-devices"
# The long help: ids, what is printed, hashing, sync-inventory, logins, exit codes (`--help` ends with it).
EPILOG = """\
Device ids are 1 to 64 of letters, digits, '_', '.', '-', starting with a letter or digit, and never start
with `bridge-` or `mosquitto-agent-`. The username of a device is its id.

add, import and rotate print each new credential once, one JSON line per device:
  {"device": ..., "username": ..., "password": ..., "site": ...}
(a certificate device gets "key" and "certificate" PEM instead of a password when --ca-cert and --ca-key
are given: its certificate names the device in its CN and is signed by that CA; without them the device is
only registered, its certificate being made elsewhere, e.g. by the devices role on the controller; no hash
is stored for it). New passwords are 32 random letters and digits, stored as PBKDF2-HMAC-SHA512
`$7$1000$<salt>$<digest>` (12-byte random salt). Nothing else prints a secret: list shows id, enabled,
auth, source and updated_ms (disabled devices only with --all). A CSV import is checked whole first and
produced in one go (one flush): a bad row or an id that exists stops it before anything is written.

sync-inventory makes the topic's inventory devices (source "inventory") exactly those it reads on stdin,
in either of two forms:
  {"<device>": "<password>", ...}       the inventory's stack_mqtt_devices; needs --site and
                                        --salt-key-file. An inventory device's salt is
                                        HMAC-SHA256(salt key, "<site>:<device>:<password>")[:12], as the
                                        stack role's filters derive it; a stored hash that verifies
                                        against the password is kept.
  {"devices": {"<device>": "$7$...", ...}}   the same, hashed on the controller (filter
                                        mqtt_device_hashes): a device whose stored hash differs is rewritten.
It adds the new ones, rewrites the changed ones, removes inventory devices no longer listed, never touches
a device added with this tool (source "cli"), and prints {"added": [...], "changed": [...], "removed":
[...], "unchanged": N}; a rerun reports nothing changed. --dry-run prints the same and writes nothing. A
device the inventory manages is changed or removed through the inventory only (rotate and remove refuse
it); disable and enable work on every device.

--stdin-envelope: stdin is {"kafka_password": "...", "input": "..."}: the password of KAFKA_USERNAME
(instead of the secret file) and the text the command would read on stdin (the CSV of `import -`, the
JSON of sync-inventory), so that one pipe carries both and no secret lands in a file or on a command line.

The current table is read from the topic's beginning up to its high watermarks, with no consumer group.
Kafka login: on a site's overlay as KAFKA_USERNAME with the secret kafka_password (KAFKA_PASSWORD_FILE,
else /run/secrets/kafka_password), inside TLS to SERVICES with KAFKA_CA_FILE (the brokers CA), none without
KAFKA_USERNAME (a test cluster);
with --external the same login over SASL_SSL to a site's EXTERNAL listener (host port 9094), the brokers'
certificate checked against --ca-file, showing the operator's client certificate (--cert-file, --key-file),
without which EXTERNAL refuses any login.

stdout carries only JSON lines; warnings and errors go to stderr. Exit codes: 0 done; 1 Kafka failed or
the table does not allow it (an id that exists, an unknown id); 2 bad arguments or bad input.
"""
PASSWORD_LENGTH = 32
PASSWORD_ALPHABET = string.ascii_letters + string.digits
ITERATIONS = 1000            # PBKDF2 iterations of new hashes (the plugin reads whatever a hash says)
SALT_BYTES, DIGEST_BYTES = 12, 64
SALT_KEY_MIN = 32            # as the stack role's mosquitto_passwd filter demands
SITE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class InputError(ValueError):
    """A flag, the CSV or stdin is wrong; the message names the row or field and the fix (exit 2)."""


class DevicesError(RuntimeError):
    """Kafka failed, or the table does not allow the change (exit 1)."""


# ------------------------------------------------------------------ passwords and hashes


def new_password(length: int = PASSWORD_LENGTH) -> str:
    """A random password of letters and digits (secrets module)."""
    return "".join(secrets.choice(PASSWORD_ALPHABET) for _ in range(length))


def hash_password(password: str, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """Mosquitto's `$7$<iterations>$<salt b64>$<digest b64>`: PBKDF2-HMAC-SHA512, 64-byte digest;
    a random 12-byte salt unless one is given."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, DIGEST_BYTES)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(password: str, hashed: str | None) -> bool:
    """True when `hashed` ($7$) is the hash of `password`; False for anything else, malformed included."""
    parts = (hashed or "").split("$")
    if len(parts) != 5 or parts[:2] != ["", "7"]:
        return False
    try:
        iterations = int(parts[2])
        salt, digest = base64.b64decode(parts[3], validate=True), base64.b64decode(parts[4], validate=True)
    except ValueError:
        return False
    if not 1 <= iterations <= 10_000_000 or not digest:
        return False
    mine = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, len(digest))
    return hmac.compare_digest(mine, digest)


def inventory_salt(salt_key: str, site: str, device: str, password: str) -> bytes:
    """The salt of an inventory device: stable across runs, unpredictable without the salt key."""
    return hmac.new(salt_key.encode(), f"{site}:{device}:{password}".encode(), hashlib.sha256).digest()[:SALT_BYTES]


# ------------------------------------------------------------------ output lines


def credential_line(device: str, site: str, password: str | None = None, key_pem: str | None = None,
                    certificate_pem: str | None = None) -> str:
    """The one line that hands a new credential over: password, or key and certificate."""
    line: dict[str, str] = {"device": device, "username": device}
    if password is not None:
        line["password"] = password
    else:
        line["key"], line["certificate"] = key_pem or "", certificate_pem or ""
    line["site"] = site
    return json.dumps(line)


def listing_line(device: str, credential: Credential) -> str:
    """A device as `list` shows it: never its hash."""
    return json.dumps({"device": device, "enabled": credential.enabled, "auth": credential.auth,
                       "source": credential.source, "updated_ms": credential.updated_ms})


# ------------------------------------------------------------------ input


def check_ids(ids: Iterable[str]) -> list[str]:
    """The ids, or InputError listing every invalid one."""
    ids = list(ids)
    errors = [e for e in map(device_id_error, ids) if e]
    if errors:
        raise InputError("\n".join(errors))
    return ids


def parse_csv(text: str, source: str = "CSV") -> list[tuple[str, str]]:
    """(device id, auth) per row of `device_id[,auth]` (auth password or certificate, default password).

    A first row `device_id[,auth]` is a header; empty rows and rows starting with '#' are skipped.
    Every problem is reported at once (InputError naming the rows): nothing of a bad file is used."""
    rows: list[tuple[str, str]] = []
    errors: list[str] = []
    seen: dict[str, int] = {}
    first = True
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [c.strip() for c in row]
        while cells and not cells[-1]:
            cells.pop()
        if not cells or cells[0].startswith("#"):
            continue
        if first:
            first = False
            if cells[0].lower() == "device_id":
                continue
        if len(cells) > 2:
            errors.append(f"{source} row {number}: expected device_id[,auth], got {len(cells)} columns")
            continue
        device, auth = cells[0], cells[1].lower() if len(cells) == 2 else PASSWORD
        problem = device_id_error(device)
        if problem:
            errors.append(f"{source} row {number}: {problem}")
        elif auth not in (PASSWORD, CERTIFICATE):
            errors.append(f"{source} row {number}: auth {auth!r} of {device} must be password or certificate")
        elif device in seen:
            errors.append(f"{source} row {number}: {device} is listed twice (first in row {seen[device]})")
        else:
            seen[device] = number
            rows.append((device, auth))
    if errors:
        raise InputError("\n".join(errors))
    if not rows:
        raise InputError(f"{source}: no devices (one device_id[,auth] per row)")
    return rows


@dataclass(frozen=True)
class Inventory:
    """The inventory's devices: passwords (stack_mqtt_devices) or their $7$ hashes, never both."""
    passwords: dict[str, str] | None = None
    hashes: dict[str, str] | None = None


def parse_inventory(text: str) -> Inventory:
    """stdin of sync-inventory: {"<device>": "<password>"} or {"devices": {"<device>": "$7$..."}}."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise InputError(f"stdin is not JSON ({err}); give an object {{\"<device id>\": \"<password>\"}}") from None
    if not isinstance(raw, dict):
        raise InputError("stdin must be a JSON object {\"<device id>\": \"<password>\"} (stack_mqtt_devices) "
                         "or {\"devices\": {\"<device id>\": \"<$7$ hash>\"}}")
    hashed = list(raw) == ["devices"] and isinstance(raw["devices"], dict)
    entries = raw["devices"] if hashed else raw
    errors = [e for e in map(device_id_error, entries) if e]
    for device, value in entries.items():
        if device_id_error(device):
            continue
        if hashed and hash_error(value):
            errors.append(f"stdin: device {device}: {hash_error(value)}")
        elif not hashed and not (isinstance(value, str) and value):
            errors.append(f"stdin: device {device} needs a non-empty password string")
    if errors:
        raise InputError("\n".join(errors))
    return Inventory(hashes=dict(entries)) if hashed else Inventory(passwords=dict(entries))


# ------------------------------------------------------------------ the table


def fold_records(records: Iterable[tuple[bytes | None, bytes | None]]) -> tuple[dict[str, Credential], list[str]]:
    """The table the records add up to, in topic order (the last record of a key wins, a tombstone
    removes it), and warnings for records that do not parse: those count as removed (fail closed)."""
    table: dict[str, Credential] = {}
    bad: dict[str, str] = {}
    for key, value in records:
        try:
            device = (key or b"").decode()
        except UnicodeDecodeError:
            bad[repr(key)] = f"key {key!r} is not UTF-8; ignored"
            continue
        table.pop(device, None)
        bad.pop(device, None)
        if value is None:
            continue
        try:
            table[device] = parse_credential(device, value)
        except CredentialError as err:
            bad[device] = f"{err}; it counts as removed (mosquitto-agent does the same)"
    return table, list(bad.values())


@dataclass
class InventoryPlan:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    cli_owned: list[str] = field(default_factory=list)       # listed, but added with iot-devices: left alone
    records: dict[str, Credential | None] = field(default_factory=dict)    # what to write (None: tombstone)

    def summary(self) -> str:
        return json.dumps({"added": sorted(self.added), "changed": sorted(self.changed),
                           "removed": sorted(self.removed), "unchanged": self.unchanged})


def inventory_hashes(table: Mapping[str, Credential], passwords: Mapping[str, str], site: str,
                     salt_key: str) -> dict[str, str]:
    """The hash each inventory device should have: the stored one while it verifies against the password
    (whatever its salt or iterations), else the stable one of the stack role's filters."""
    hashes = {}
    for device, password in passwords.items():
        current = table.get(device)
        if current is not None and current.auth == PASSWORD and verify_password(password, current.hash):
            hashes[device] = current.hash
        else:
            hashes[device] = hash_password(password, inventory_salt(salt_key, site, device, password))
    return hashes


def plan_inventory(table: Mapping[str, Credential], hashes: Mapping[str, str], now_ms: int) -> InventoryPlan:
    """What sync-inventory writes so the topic's inventory devices are exactly `hashes` (id -> $7$ hash)."""
    plan = InventoryPlan()
    for device in sorted(hashes):
        current = table.get(device)
        if current is not None and current.source != INVENTORY:
            plan.cli_owned.append(device)
            continue
        if current is not None and current.auth == PASSWORD and current.hash == hashes[device]:
            plan.unchanged += 1
            continue
        # A device the operator disabled stays disabled when the inventory gives it a new password.
        enabled = current.enabled if current is not None else True
        plan.records[device] = Credential(enabled, PASSWORD, hashes[device], INVENTORY, now_ms)
        (plan.added if current is None else plan.changed).append(device)
    for device, current in sorted(table.items()):
        if current.source == INVENTORY and device not in hashes:
            plan.records[device] = None
            plan.removed.append(device)
    return plan


# ------------------------------------------------------------------ certificates


def make_certificate(device: str, ca_cert_pem: bytes, ca_key_pem: bytes, days: int) -> tuple[str, str]:
    """(key PEM, certificate PEM) of a new client certificate: CN = the device id, signed by the CA."""
    try:
        import datetime as dt

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise InputError("--certificate needs the Python package cryptography (the deploy venv has it: "
                         "pip install cryptography)") from None
    try:
        ca = x509.load_pem_x509_certificate(ca_cert_pem)
        ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    except (ValueError, TypeError) as err:
        raise InputError(f"--ca-cert/--ca-key: not a PEM certificate and unencrypted PEM key ({err})") from None
    if ca_key.public_key().public_numbers() != ca.public_key().public_numbers():
        raise InputError("--ca-key is not the key of --ca-cert")
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return key_pem, cert.public_bytes(pem).decode()


@dataclass(frozen=True)
class Issuer:
    """What a certificate device needs: the CA's certificate and key, and how long certificates last."""
    ca_cert: bytes
    ca_key: bytes
    days: int


def load_issuer(args: argparse.Namespace) -> Issuer:
    if not args.ca_cert or not args.ca_key:
        raise InputError("certificate devices need --ca-cert and --ca-key (the CA that Mosquitto's device "
                         "listener trusts)")
    if args.days < 1:
        raise InputError(f"--days must be 1 or more (got {args.days})")
    try:
        return Issuer(Path(args.ca_cert).read_bytes(), Path(args.ca_key).read_bytes(), args.days)
    except OSError as err:
        raise InputError(f"cannot read {err.filename}: {err.strerror}") from None


# ------------------------------------------------------------------ Kafka


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


# What --external's files are (a missing one is named with its flag).
TLS_FILES = ("the CA that signed the brokers' certificates",
             "the operator's client certificate, pki_dir/clients/operator.crt on the controller",
             "the operator's client key, pki_dir/clients/operator.key")


def kafka_security(external: bool, tls_files: tuple[str, str, str], password: str | None = None) -> dict[str, str]:
    """librdkafka login settings: SCRAM as KAFKA_USERNAME on the overlay (inside TLS with KAFKA_CA_FILE), or
    with --external over SASL_SSL to EXTERNAL with `tls_files` (--ca-file, --cert-file, --key-file: the brokers' CA, the
    operator's client certificate and its key); the password is `password` (from --stdin-envelope) or the
    secret kafka_password. No KAFKA_USERNAME: no login (a test cluster's plaintext INTERNAL)."""
    user = os.environ.get(kafka_auth.USERNAME_ENV, "").strip()
    if password is not None and not user:
        raise InputError(f"the envelope's kafka_password needs {kafka_auth.USERNAME_ENV} (whose password it is)")
    login = (user, password) if password is not None else kafka_auth.internal_login()
    if not external:
        return kafka_auth.overlay_config(*login) if login else {}
    if login is None:
        raise InputError(f"--external needs a login: set {kafka_auth.USERNAME_ENV} (and the secret "
                         f"{kafka_auth.PASSWORD_SECRET}: {kafka_auth.PASSWORD_SECRET.upper()}_FILE)")
    flags = ("--ca-file", "--cert-file", "--key-file")
    problem = kafka_auth.missing_file(zip(flags, tls_files, TLS_FILES, strict=True))
    if problem:
        raise InputError(problem)
    return kafka_auth.sasl_ssl_config(*login, *tls_files)


def parse_envelope(text: str) -> tuple[str, str]:
    """(Kafka password, the command's own stdin) of --stdin-envelope's {"kafka_password", "input"}."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise InputError(f"--stdin-envelope: stdin is not JSON ({err})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("kafka_password"), str) or not raw["kafka_password"]:
        raise InputError('--stdin-envelope: stdin must be {"kafka_password": "<non-empty>", "input": "<text>"}')
    given = raw.get("input", "")
    return raw["kafka_password"], given if isinstance(given, str) else json.dumps(given)


class _Quiet(logging.Handler):
    """librdkafka's latest log line, named in an error instead of printing them all."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage()


def _client_config(bootstrap: str, security: dict[str, str], quiet: _Quiet) -> dict:
    logger = logging.getLogger(f"{PROG}.librdkafka")
    logger.propagate = False
    logger.handlers = [quiet]
    return {"bootstrap.servers": bootstrap, "logger": logger, **security}


def read_table(bootstrap: str, topic: str, security: dict[str, str],
               timeout: float) -> tuple[dict[str, Credential], list[str]]:
    """The device table: `topic` read from its beginning up to its high watermarks (no consumer group
    joins or commits; librdkafka wants a group id all the same, so a throw-away one is given)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    quiet = _Quiet()
    consumer = Consumer({**_client_config(bootstrap, security, quiet), "group.id": f"{PROG}-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.auto.offset.store": False,
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    deadline = time.monotonic() + timeout
    records: list[tuple[bytes | None, bytes | None]] = []
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as err:
            raise DevicesError(f"Kafka at {bootstrap} did not answer within {timeout:.0f}s ({err.args[0]}; "
                               f"librdkafka: {quiet.last})") from None
        if metadata is None or metadata.error is not None or not metadata.partitions:
            why = metadata.error.str() if metadata is not None and metadata.error else "no partitions"
            raise DevicesError(f"topic {topic} is not readable at {bootstrap} ({why}); the topics role creates "
                               "it at each edge site, and the login needs READ on it")
        ends: dict[int, int] = {}
        for p in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=max(1.0, timeout))
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        todo = set(ends)
        while todo:
            if time.monotonic() > deadline:
                raise DevicesError(f"could not read {topic} to its end within {timeout:.0f}s "
                                   f"(librdkafka: {quiet.last}); try again or raise --timeout")
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error():
                    continue        # e.g. no rights on the throw-away group: only partitions are assigned
                records.append((msg.key(), msg.value()))
                if msg.offset() >= ends[msg.partition()] - 1:
                    todo.discard(msg.partition())
            for tp in consumer.position([TopicPartition(topic, p) for p in todo]):
                if tp.offset >= ends[tp.partition]:
                    todo.discard(tp.partition)
    finally:
        consumer.close()
    return fold_records(records)


def write_records(bootstrap: str, topic: str, security: dict[str, str], records: Mapping[str, Credential | None],
                  timeout: float) -> set[str]:
    """Produce every record (None: a tombstone), flush once; returns the ids Kafka acknowledged."""
    from confluent_kafka import Producer

    quiet = _Quiet()
    producer = Producer({**_client_config(bootstrap, security, quiet), "acks": "all", "enable.idempotence": True,
                         "linger.ms": 20})
    delivered: set[str] = set()
    failures: list[str] = []

    def on_delivery(err, msg) -> None:
        if err is None:
            delivered.add(msg.key().decode())
        else:
            failures.append(f"{msg.key().decode()}: {err.str()}")

    for device, credential in records.items():
        value = credential.to_json() if credential is not None else None
        while True:
            try:
                producer.produce(topic, value, device.encode(), on_delivery=on_delivery)
                break
            except BufferError:          # local queue full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)
    left = producer.flush(timeout)
    if left or failures:
        _say(f"{len(records) - len(delivered)} of {len(records)} records not written to {topic} "
             f"(errors: {failures[:3]}, librdkafka: {quiet.last})")
    return delivered


# ------------------------------------------------------------------ commands


@dataclass
class Context:
    args: argparse.Namespace
    security: dict[str, str]
    stdin: str | None = None       # the command's stdin when it came in the envelope

    def read_stdin(self) -> str:
        return self.stdin if self.stdin is not None else sys.stdin.read()

    def table(self) -> dict[str, Credential]:
        table, warnings = read_table(self.args.bootstrap, self.args.topic, self.security, self.args.timeout)
        for warning in warnings:
            _say(f"warning: {warning}")
        return table

    def write(self, records: Mapping[str, Credential | None]) -> set[str]:
        return write_records(self.args.bootstrap, self.args.topic, self.security, records, self.args.timeout)

    def site(self) -> str:
        site = self.args.site
        if not site:
            raise InputError(f"{self.args.command} needs --site (or DEVICES_SITE): the site's alias, which the "
                             "printed credentials and inventory salts name")
        if not SITE_RE.match(site):
            raise InputError(f"--site {site!r} is not a site alias (letters, digits, '.', '_', '-')")
        return site


def _now_ms() -> int:
    return int(time.time() * 1000)


def _known(table: Mapping[str, Credential], device: str) -> Credential:
    if device not in table:
        raise DevicesError(f"device {device} is not in the table (iot-devices list --all shows the devices; "
                           "add creates one)")
    return table[device]


def _not_inventory(device: str, credential: Credential, action: str) -> None:
    if credential.source == INVENTORY:
        raise DevicesError(f"device {device} is managed by the inventory (stack_mqtt_devices): {action} it there "
                           "and deploy; `iot-devices disable` stops it at once")


def _issue(ctx: Context, devices: list[tuple[str, str]], table: Mapping[str, Credential],
           keep: Mapping[str, Credential] | None = None) -> int:
    """New credentials for `devices` ((id, auth)); writes them, then prints each one Kafka took."""
    site = ctx.site()
    certificates = any(auth == CERTIFICATE for _, auth in devices)
    issuer = load_issuer(ctx.args) if certificates and (ctx.args.ca_cert or ctx.args.ca_key) else None
    now, lines, records = _now_ms(), {}, {}
    for device, auth in devices:
        old = (keep or {}).get(device)
        enabled = old.enabled if old is not None else True
        if auth == CERTIFICATE:
            records[device] = Credential(enabled, CERTIFICATE, None, CLI, now)
            if issuer is None:          # registered only: its certificate is made elsewhere
                lines[device] = json.dumps({"device": device, "username": device, "site": site})
            else:
                key_pem, cert_pem = make_certificate(device, issuer.ca_cert, issuer.ca_key, issuer.days)
                lines[device] = credential_line(device, site, key_pem=key_pem, certificate_pem=cert_pem)
        else:
            password = new_password()
            records[device] = Credential(enabled, PASSWORD, hash_password(password), CLI, now)
            lines[device] = credential_line(device, site, password=password)
    delivered = ctx.write(records)
    for device, _ in devices:
        if device in delivered:
            print(lines[device])
            if not records[device].enabled:
                _say(f"note: {device} is disabled; `iot-devices enable {device}` lets it in")
    if len(delivered) < len(records):
        raise DevicesError(f"{len(records) - len(delivered)} of {len(records)} devices were not written (their "
                           "credentials are not printed and do not work); run the command again for them")
    return 0


def cmd_add(ctx: Context) -> int:
    device = check_ids([ctx.args.device])[0]
    ctx.site()
    table = ctx.table()
    if device in table:
        raise DevicesError(f"device {device} exists already; `iot-devices rotate {device}` gives it a new "
                           "password")
    return _issue(ctx, [(device, CERTIFICATE if ctx.args.certificate else PASSWORD)], table)


def cmd_import(ctx: Context) -> int:
    source = ctx.args.csv_file
    try:
        text = ctx.read_stdin() if source == "-" else Path(source).read_text()
    except OSError as err:
        raise InputError(f"cannot read {source}: {err.strerror}") from None
    rows = parse_csv(text, "stdin" if source == "-" else source)
    ctx.site()
    table = ctx.table()
    existing = [device for device, _ in rows if device in table]
    if existing:
        shown = ", ".join(existing[:10]) + (f" and {len(existing) - 10} more" if len(existing) > 10 else "")
        raise DevicesError(f"{len(existing)} devices exist already ({shown}); nothing was imported. Take them out "
                           "of the file, or give them new passwords with `iot-devices rotate`")
    return _issue(ctx, rows, table)


def cmd_rotate(ctx: Context) -> int:
    device = check_ids([ctx.args.device])[0]
    ctx.site()
    table = ctx.table()
    current = _known(table, device)
    _not_inventory(device, current, "change its password")
    if current.auth == CERTIFICATE:
        raise DevicesError(f"device {device} logs in with a certificate, which stays valid until it expires "
                           "(there is no revocation list): `iot-devices disable` or `remove` shuts it out")
    return _issue(ctx, [(device, PASSWORD)], table, keep=table)


def _set_enabled(ctx: Context, enabled: bool) -> int:
    device = check_ids([ctx.args.device])[0]
    current = _known(ctx.table(), device)
    changed = current.enabled != enabled
    if changed:
        record = replace(current, enabled=enabled, updated_ms=_now_ms())
        if device not in ctx.write({device: record}):
            raise DevicesError(f"device {device} was not written; nothing changed")
    print(json.dumps({"device": device, "enabled": enabled, "changed": changed}))
    return 0


def cmd_disable(ctx: Context) -> int:
    return _set_enabled(ctx, False)


def cmd_enable(ctx: Context) -> int:
    return _set_enabled(ctx, True)


def cmd_remove(ctx: Context) -> int:
    device = check_ids([ctx.args.device])[0]
    _not_inventory(device, _known(ctx.table(), device), "remove")
    if device not in ctx.write({device: None}):
        raise DevicesError(f"the removal of {device} was not written; nothing changed")
    print(json.dumps({"device": device, "removed": True}))
    return 0


def cmd_list(ctx: Context) -> int:
    for device, credential in sorted(ctx.table().items()):
        if credential.enabled or ctx.args.all:
            print(listing_line(device, credential))
    return 0


def cmd_sync_inventory(ctx: Context) -> int:
    inventory = parse_inventory(ctx.read_stdin())
    salt_key = site = ""
    if inventory.passwords is not None:
        site, salt_key = ctx.site(), _salt_key(ctx.args.salt_key_file)
    table = ctx.table()
    hashes = inventory.hashes if inventory.hashes is not None else \
        inventory_hashes(table, inventory.passwords, site, salt_key)
    plan = plan_inventory(table, hashes, _now_ms())
    for device in plan.cli_owned:
        _say(f"warning: {device} is in stack_mqtt_devices but was added with iot-devices; left as it is "
             f"(`iot-devices remove {device}` hands it to the inventory on the next run)")
    if plan.records and ctx.args.dry_run:
        _say(f"dry run: {len(plan.records)} records not written")
    elif plan.records:
        delivered = ctx.write(plan.records)
        missing = sorted(set(plan.records) - delivered)
        if missing:
            raise DevicesError(f"{len(missing)} inventory devices were not written ({', '.join(missing[:10])}); "
                               "run again")
    print(plan.summary())
    return 0


def _salt_key(path: str) -> str:
    if not path:
        raise InputError("sync-inventory of passwords needs --salt-key-file (the pki role's password-salt.key)")
    try:
        salt_key = Path(path).read_text().strip()
    except OSError as err:
        raise InputError(f"--salt-key-file {path}: {err.strerror}") from None
    if len(salt_key) < SALT_KEY_MIN:
        raise InputError(f"--salt-key-file {path}: the salt key must be at least {SALT_KEY_MIN} characters")
    return salt_key


# ------------------------------------------------------------------ CLI

OPTIONS: tuple[settings.Option, ...] = (
    settings.Option("bootstrap", "DEVICES_BOOTSTRAP", None,
                    "Kafka bootstrap servers of the site, e.g. kafka-1:9092 (overlay) or <host>:9094 with "
                    "--external", required=True),
    settings.Option("site", "DEVICES_SITE", "", "the site's alias (add, import, rotate, sync-inventory)"),
    settings.Option("topic", "DEVICES_TOPIC", names.DEVICE_CREDENTIALS, "the device table's compacted topic"),
    settings.Option("external", "DEVICES_EXTERNAL", False,
                    "log in over SASL_SSL to the site's EXTERNAL listener (KAFKA_USERNAME, kafka_password)", bool),
    settings.Option("ca_file", "DEVICES_CA_FILE", "/run/secrets/kafka_ca.pem",
                    "CA certificate (PEM) that signed the brokers' certificates, with --external"),
    # EXTERNAL asks for a client certificate of the clients CA (mutual TLS): the operator's, from the pki role.
    settings.Option("cert_file", "DEVICES_CERT_FILE", "/run/secrets/kafka_client.crt",
                    "client certificate (PEM) of the clients CA, with --external (pki_dir/clients/operator.crt)"),
    settings.Option("key_file", "DEVICES_KEY_FILE", "/run/secrets/kafka_client.key",
                    "its private key (PEM), with --external (pki_dir/clients/operator.key)"),
    settings.Option("timeout", "DEVICES_TIMEOUT_S", 30.0, "seconds to wait for Kafka to read or write", float),
    settings.Option("stdin_envelope", "DEVICES_STDIN_ENVELOPE", False,
                    'stdin is {"kafka_password": ..., "input": ...}: the Kafka password of KAFKA_USERNAME and '
                    "what the command reads on stdin", bool),
)
CERT_OPTIONS: tuple[settings.Option, ...] = (
    settings.Option("ca_cert", "DEVICES_CA_CERT", "", "CA certificate (PEM) that signs device certificates"),
    settings.Option("ca_key", "DEVICES_CA_KEY", "", "its private key (PEM, unencrypted)"),
    settings.Option("days", "DEVICES_CERT_DAYS", 365, "how many days a device certificate is valid", int),
)
SYNC_OPTIONS: tuple[settings.Option, ...] = (
    settings.Option("salt_key_file", "DEVICES_SALT_KEY_FILE", "",
                    "file holding the deployment's salt key (the pki role's password-salt.key)"),
)
COMMANDS = {
    "add": (cmd_add, "add a device and print its new password (or key and certificate)"),
    "import": (cmd_import, "add every device of a CSV file (device_id[,auth]; '-': stdin) in one go"),
    "disable": (cmd_disable, "refuse a device's logins and disconnect it, keeping its credentials"),
    "enable": (cmd_enable, "let a disabled device log in again"),
    "rotate": (cmd_rotate, "give a device a new password (printed) and disconnect it"),
    "remove": (cmd_remove, "remove a device (a tombstone) and disconnect it"),
    "list": (cmd_list, "print the enabled devices, one JSON line each (--all: disabled ones too)"),
    "sync-inventory": (cmd_sync_inventory,
                       "make the inventory's devices (stdin: JSON id -> password) exactly those of the table"),
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, epilog=settings.epilog(OPTIONS, EPILOG),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    settings.add_options(p, OPTIONS)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {}
    for name, (_, help_text) in COMMANDS.items():
        parsers[name] = sub.add_parser(name, help=help_text, description=help_text)
    for name in ("add", "disable", "enable", "rotate", "remove"):
        parsers[name].add_argument("device", metavar="ID", help="device id (also its MQTT username and client id)")
    parsers["add"].add_argument("--certificate", action="store_true",
                                help="a certificate device: print a key and a certificate instead of a password")
    parsers["import"].add_argument("csv_file", metavar="CSV_FILE", help="CSV of device_id[,auth]; '-' reads stdin")
    for name in ("add", "import"):
        settings.add_options(parsers[name], CERT_OPTIONS)
    parsers["list"].add_argument("--all", action="store_true", help="disabled devices too")
    parsers["sync-inventory"].add_argument("--dry-run", action="store_true",
                                           help="print what would change, write nothing")
    settings.add_options(parsers["sync-inventory"], SYNC_OPTIONS)
    return p, parsers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p, parsers = build_parser()
    args = p.parse_args(argv)
    sub = parsers[args.command]
    extra = {"add": CERT_OPTIONS, "import": CERT_OPTIONS, "sync-inventory": SYNC_OPTIONS}.get(args.command, ())
    try:
        settings.apply(p, OPTIONS, args)
        settings.apply(sub, extra, args)
    except settings.SettingsError as err:     # a bad variable: a usage error too (exit 2)
        sub.error(str(err))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        password, stdin = parse_envelope(sys.stdin.read()) if args.stdin_envelope else (None, None)
        tls_files = (args.ca_file, args.cert_file, args.key_file)
        ctx = Context(args, kafka_security(args.external, tls_files, password), stdin)
        return COMMANDS[args.command][0](ctx)
    except (InputError, CredentialError, settings.SettingsError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except DevicesError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
