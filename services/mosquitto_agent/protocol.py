"""The iot_gate plugin's control protocol as bytes: requests to `$CONTROL/iot-gate/v1`, answers from
`$CONTROL/iot-gate/v1/response` (images/mosquitto/plugin/iot_gate.c). Pure functions, no I/O.

A request is UTF-8 text, lines separated by '\\n'; the first line is the command:
  snapshot <token> <part> <parts>   then device lines; part == parts replaces the table atomically
  upsert                            then device lines: add or replace those devices
  remove                            then one device id per line
  stats                             no body
Device line: `<id> <enabled 1|0> <password|certificate> <hash or ->`.
Every request gets one JSON answer, in order: {"ok", "command", "error", "devices", "gate_open",
"uptime_s", "kicked", "counters": {...}, "offences": {login: {offence: n}}}; the counters are the
plugin's totals since Mosquitto started (counters.offences: every offence of every login), the
offences those of the logins that offended most recently (a device's id or a service's login).
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.common.device_credentials import Credential

SNAPSHOT, UPSERT, REMOVE, STATS = "snapshot", "upsert", "remove", "stats"
STATS_REQUEST = b"stats"
# Room for the command line and the PUBLISH's own header and topic within a maximum packet size.
PACKET_OVERHEAD = 256
# Largest request body: well under the site's max_packet_size (64 KiB), whatever the broker states.
MAX_REQUEST_BYTES = 32 * 1024


def device_line(device: str, credential: Credential) -> str:
    """The plugin's line of one device."""
    return f"{device} {1 if credential.enabled else 0} {credential.auth} {credential.hash or '-'}"


def chunks(lines: Iterable[str], max_lines: int, max_bytes: int) -> list[list[str]]:
    """`lines` in order, cut into runs of at most `max_lines` lines whose '\\n'-joined text (with the
    '\\n' that follows the command line) fits `max_bytes`. A line longer than max_bytes gets a run of
    its own (the broker then refuses that one message, not its neighbours)."""
    out: list[list[str]] = []
    run: list[str] = []
    size = 0
    for line in lines:
        cost = len(line.encode()) + 1
        if run and (len(run) >= max_lines or size + cost > max_bytes):
            out.append(run)
            run, size = [], 0
        run.append(line)
        size += cost
    if run:
        out.append(run)
    return out


def _body(first: str, lines: list[str]) -> bytes:
    return ("\n".join([first, *lines])).encode()


def snapshot_requests(lines: list[str], token: str, max_lines: int, max_bytes: int) -> list[bytes]:
    """The parts of a full snapshot (one empty part for an empty table)."""
    parts = chunks(lines, max_lines, max_bytes) or [[]]
    return [_body(f"{SNAPSHOT} {token} {i} {len(parts)}", part) for i, part in enumerate(parts, start=1)]


def upsert_requests(lines: list[str], max_lines: int, max_bytes: int) -> list[bytes]:
    return [_body(UPSERT, part) for part in chunks(lines, max_lines, max_bytes)]


def remove_requests(devices: list[str], max_lines: int, max_bytes: int) -> list[bytes]:
    return [_body(REMOVE, part) for part in chunks(devices, max_lines, max_bytes)]


def request_size(payload: bytes) -> int:
    """Devices named in a request: its lines after the command line."""
    return max(0, payload.count(b"\n"))


@dataclass(frozen=True)
class Answer:
    ok: bool
    command: str
    error: str = ""
    devices: int | None = None
    connected: int | None = None          # device connections the gate let in and Mosquitto has not closed
    gate_open: bool | None = None
    uptime_s: float | None = None
    kicked: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
    offences: dict[str, dict[str, int]] = field(default_factory=dict)     # login -> offence -> count


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_answer(payload: bytes) -> Answer:
    """The plugin's answer; ValueError naming what is wrong. Unknown fields are ignored, fields of the
    wrong type are left out (a newer plugin must not stop the agent)."""
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"not JSON ({err}): {payload[:200]!r}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("ok"), bool) or not isinstance(raw.get("command"), str):
        raise ValueError(f"not an answer object with ok and command: {payload[:200]!r}")
    counters = raw.get("counters") if isinstance(raw.get("counters"), dict) else {}
    offences = raw.get("offences") if isinstance(raw.get("offences"), dict) else {}
    uptime = raw.get("uptime_s")
    return Answer(
        ok=raw["ok"], command=raw["command"], error=str(raw.get("error") or ""),
        devices=_count(raw.get("devices")), connected=_count(raw.get("connected")),
        gate_open=raw.get("gate_open") if isinstance(raw.get("gate_open"), bool) else None,
        uptime_s=float(uptime) if isinstance(uptime, int | float) and not isinstance(uptime, bool) else None,
        kicked=_count(raw.get("kicked")),
        counters=_counts(counters),
        offences={login: _counts(counts) for login, counts in offences.items() if isinstance(counts, dict)})


def _counts(raw: dict) -> dict[str, int]:
    return {k: v for k, v in raw.items() if isinstance(k, str) and _count(v) is not None}
