"""Dead-letter records: the one builder every service uses for the `dead-letter` topic.

A dead-letter record carries the original key (else the source, so it is never keyless), the original bytes
and the original headers minus dead-letter headers of an earlier round, then (names.py) dlq_source (the MQTT
or Kafka topic), dlq_reason ("<reason>: <detail>": a reason code, which is the metric label, with the generic
codes here and service-specific ones beside their service, then what is wrong and the fix), dlq_time_ms and,
for Kafka-sourced records only, dlq_offset ("<partition>:<offset>"). See docs/architecture.md, "Dead letters".

It is bounded so that it can always be written. With `max_bytes` (the bridge: BRIDGE_MAX_RECORD_BYTES) the
whole record (key, value, every header's name and value: record_bytes) stays within it: headers our services
did not set (an MQTT device's user properties) are dropped first, then the value is cut, then, only under a
bound too small for what is left, our own headers, the key and the source; the detail says what was dropped
or cut. Without it (Kafka-sourced records, which already fit Kafka) the value is cut at DLQ_VALUE_LIMIT, with a
note in the reason (tests/unit/common/test_dead_letter.py). The Spark jobs build the same headers as columns
(iot_jobs.readings.dead_letters) from DLQ_HEADERS and reason_text. Standard library only."""
from __future__ import annotations

from dataclasses import dataclass

from services.common import names

# Reason codes every service may use (the first word of dlq_reason).
INVALID_JSON = "invalid_json"
CONTRACT_VIOLATION = "contract_violation"
UNMAPPED = "unmapped"
UNPROCESSABLE = "unprocessable"

# Characters of a dead letter's detail (the text after "<reason>: " in dlq_reason): it is a Kafka
# header, not a log, and the detail often quotes the record (bounded_detail).
DETAIL_LIMIT = 1000

# Kafka's default max.message.bytes is ~1 MB and Mosquitto's max_packet_size 1 MiB: without a whole-record
# bound (max_bytes), a dead-letter value above this is cut so that the dead-letter record can be written.
DLQ_VALUE_LIMIT = 900_000

# Headers a dead-letter producer owns: dropped from the original headers, then set anew.
DLQ_HEADERS = frozenset({names.HEADER_DLQ_SOURCE, names.HEADER_DLQ_REASON, names.HEADER_DLQ_TIME_MS,
                         names.HEADER_DLQ_OFFSET})
# Headers our services set (the bridge, beside a reading): kept while a bounded dead letter shrinks. Every
# other header came with the message (an MQTT device's user properties) and is dropped first.
SERVICE_HEADERS = frozenset({names.HEADER_SITE, names.HEADER_INGEST_MS, names.HEADER_MQTT_TOPIC})

# What one header costs a Kafka record beyond its name and value: two length varints (at most 5 bytes each).
HEADER_OVERHEAD = 10
# The smallest whole-record bound: what a dead letter keeps whatever it drops (dlq_reason with a detail of
# DETAIL_LIMIT characters and the notes, dlq_time_ms, dlq_offset) takes well under this.
MIN_RECORD_BYTES = 16384
_NOTE_ROOM = 400          # bytes kept free in dlq_reason for the notes on what was cut (ASCII, ~260 at most)

Headers = list[tuple[str, bytes]]


@dataclass(slots=True)
class DeadLetter:
    """A record for the dead-letter topic (same fields as the bridge's OutRecord, reason always set)."""
    topic: str
    key: bytes
    value: bytes | None      # None only for a tombstone (a Kafka record without a value)
    headers: Headers
    reason: str


def utf8(text: str) -> bytes:
    """UTF-8 bytes of any str: a lone surrogate (no UTF-8 for it) becomes its backslash escape."""
    return text.encode("utf-8", "backslashreplace")


def headers_bytes(headers) -> int:
    """What `headers` add to a Kafka record: each name (UTF-8) and value, plus HEADER_OVERHEAD each."""
    return sum(len(utf8(name)) + len(value or b"") for name, value in headers) + HEADER_OVERHEAD * len(headers)


def record_bytes(key: bytes | None, value: bytes | None, headers) -> int:
    """The size of a Kafka record as its bound counts it: key + value + headers_bytes(headers). At least
    what librdkafka checks against message.max.bytes (key, value and serialized headers)."""
    return len(key or b"") + len(value or b"") + headers_bytes(headers)


def reason_text(reason: str, detail: str) -> str:
    """The dlq_reason header: the reason code, then what is wrong and the fix."""
    return f"{reason}: {detail}"


def bounded_detail(text: str) -> str:
    """A dead letter's detail: at most DETAIL_LIMIT characters (then "..."), and valid UTF-8 whatever the
    record put into the message (a lone surrogate becomes its backslash escape, so .encode() cannot fail)."""
    text = text if len(text) <= DETAIL_LIMIT else f"{text[:DETAIL_LIMIT]}..."
    return utf8(text).decode("utf-8")


def offset_text(partition: int, offset: int) -> str:
    """The dlq_offset header: where the source record was."""
    return f"{partition}:{offset}"


def dead_letter_headers(source: str | bytes, reason: str, detail: str, now_ms: int, headers=None,
                        partition: int | None = None, offset: int | None = None) -> Headers:
    """The original headers without old dlq_* ones, then dlq_source, dlq_reason, dlq_time_ms [, dlq_offset]."""
    out = [h for h in (headers or ()) if h[0] not in DLQ_HEADERS]
    out += [(names.HEADER_DLQ_SOURCE, source if isinstance(source, bytes) else utf8(source)),
            (names.HEADER_DLQ_REASON, utf8(reason_text(reason, detail))),
            (names.HEADER_DLQ_TIME_MS, str(now_ms).encode())]
    if partition is not None and offset is not None:
        out.append((names.HEADER_DLQ_OFFSET, offset_text(partition, offset).encode()))
    return out


def dead_letter(dlq_topic: str, source: str, key: str | bytes | None, value: bytes | None, reason: str,
                detail: str, now_ms: int, headers=None, partition: int | None = None,
                offset: int | None = None, max_bytes: int | None = None) -> DeadLetter:
    """The dead-letter record: original key (else the source), original bytes, headers naming why.

    `partition` and `offset` locate a Kafka source record (dlq_offset); leave them out for MQTT messages.
    With `max_bytes` (at least MIN_RECORD_BYTES) the whole record fits in it (module docstring) and the
    detail is bounded_detail's; without, only the value is cut, at DLQ_VALUE_LIMIT.
    """
    raw_key = key if key is not None else source
    key = raw_key if isinstance(raw_key, bytes) else utf8(raw_key)
    if max_bytes is not None:
        return _bounded(dlq_topic, source, key, value, reason, detail, now_ms, headers, partition, offset,
                        max_bytes)
    if value is not None and len(value) > DLQ_VALUE_LIMIT:
        detail = f"{detail} (value cut to its first {DLQ_VALUE_LIMIT} of {len(value)} bytes)"
        value = value[:DLQ_VALUE_LIMIT]
    return DeadLetter(dlq_topic, key, value,
                      dead_letter_headers(source, reason, detail, now_ms, headers, partition, offset), reason)


def _bounded(dlq_topic: str, source: str, key: bytes, value: bytes | None, reason: str, detail: str, now_ms: int,
             headers, partition: int | None, offset: int | None, max_bytes: int) -> DeadLetter:
    """dead_letter within max_bytes: drop the message's own headers, cut the value, then (a bound too small
    for the rest) drop our headers, cut the key, cut the source; dlq_reason says what went."""
    if max_bytes < MIN_RECORD_BYTES:
        raise ValueError(f"a dead letter's bound of {max_bytes} bytes is below the minimum {MIN_RECORD_BYTES}")
    detail = bounded_detail(detail)
    # Names as Kafka takes them: a name without UTF-8 (a lone surrogate) would make the producer refuse the record.
    kept = [(k if k.isascii() else utf8(k).decode(), v) for k, v in headers or () if k not in DLQ_HEADERS]
    source_bytes = utf8(source)
    record = DeadLetter(dlq_topic, key, value,
                        dead_letter_headers(source_bytes, reason, detail, now_ms, kept, partition, offset), reason)
    if record_bytes(key, value, record.headers) <= max_bytes:
        return record
    notes: list[str] = []

    def room() -> int:
        """Bytes left for the value (negative: even without it the record is too large)."""
        frame = dead_letter_headers(source_bytes, reason, detail, now_ms, kept, partition, offset)
        return max_bytes - _NOTE_ROOM - record_bytes(key, None, frame)

    theirs = [h for h in kept if h[0] not in SERVICE_HEADERS]
    if theirs:
        kept = [h for h in kept if h[0] in SERVICE_HEADERS]
        notes.append(f"dropped the {len(theirs)} headers that came with the message ({headers_bytes(theirs)} "
                     "bytes, e.g. MQTT user properties)")
    left = room()
    size = len(value or b"")
    if size > max(left, 0):
        notes.append(f"value cut to its first {max(left, 0)} of {size} bytes")
        value = value[:max(left, 0)]
    if left < 0 and kept:
        notes.append(f"dropped {len(kept)} more headers ({headers_bytes(kept)} bytes)")
        kept = []
        left = room()
    if left < 0:
        cut = max(len(key) + left, 0)
        notes.append(f"key cut to its first {cut} of {len(key)} bytes")
        key = key[:cut]
        left = room()
    if left < 0:
        cut = max(len(source_bytes) + left, 0)
        notes.append(f"source cut to its first {cut} of {len(source_bytes)} bytes")
        source_bytes = source_bytes[:cut]
    detail = f"{detail} ({'; '.join(notes)}; to fit {max_bytes} bytes)"
    return DeadLetter(dlq_topic, key, value,
                      dead_letter_headers(source_bytes, reason, detail, now_ms, kept, partition, offset), reason)
