"""Dead-letter records: the one builder every service uses for the `dead-letter` topic.

A dead-letter record carries the original key (else the source, so it is never
keyless), the original bytes (cut at DLQ_VALUE_LIMIT, with a note in the reason,
so the dead-letter record itself always fits in Kafka) and the original headers
minus dead-letter headers of an earlier round, then (names.py):

  dlq_source   the MQTT topic or Kafka topic the record came from
  dlq_reason   "<reason>: <detail>": a reason code (the metric label; the generic
               ones below, service-specific ones beside their service) and what
               is wrong and the fix
  dlq_time_ms  when it was dead-lettered, epoch milliseconds
  dlq_offset   "<partition>:<offset>" of the source record; Kafka-sourced dead
               letters only (bridge command path, adapter, Spark), none for MQTT

The Spark jobs cannot call Python per row: they build the same headers as columns
(iot_jobs.readings.dead_letters) from DLQ_HEADERS and reason_text. Standard library only.
"""
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

# Kafka's default max.message.bytes is ~1 MB and Mosquitto's max_packet_size 1 MiB: a dead-letter
# value above this is cut so that the dead-letter record itself can always be written.
DLQ_VALUE_LIMIT = 900_000

# Headers a dead-letter producer owns: dropped from the original headers, then set anew.
DLQ_HEADERS = frozenset({names.HEADER_DLQ_SOURCE, names.HEADER_DLQ_REASON, names.HEADER_DLQ_TIME_MS,
                         names.HEADER_DLQ_OFFSET})

Headers = list[tuple[str, bytes]]


@dataclass(slots=True)
class DeadLetter:
    """A record for the dead-letter topic (same fields as the bridge's OutRecord, reason always set)."""
    topic: str
    key: bytes
    value: bytes | None      # None only for a tombstone (a Kafka record without a value)
    headers: Headers
    reason: str


def reason_text(reason: str, detail: str) -> str:
    """The dlq_reason header: the reason code, then what is wrong and the fix."""
    return f"{reason}: {detail}"


def bounded_detail(text: str) -> str:
    """A dead letter's detail: at most DETAIL_LIMIT characters (then "..."), and valid UTF-8 whatever the
    record put into the message (a lone surrogate becomes its backslash escape, so .encode() cannot fail)."""
    text = text if len(text) <= DETAIL_LIMIT else f"{text[:DETAIL_LIMIT]}..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def offset_text(partition: int, offset: int) -> str:
    """The dlq_offset header: where the source record was."""
    return f"{partition}:{offset}"


def dead_letter_headers(source: str, reason: str, detail: str, now_ms: int, headers=None,
                        partition: int | None = None, offset: int | None = None) -> Headers:
    """The original headers without old dlq_* ones, then dlq_source, dlq_reason, dlq_time_ms [, dlq_offset]."""
    out = [h for h in (headers or ()) if h[0] not in DLQ_HEADERS]
    out += [(names.HEADER_DLQ_SOURCE, source.encode()),
            (names.HEADER_DLQ_REASON, reason_text(reason, detail).encode()),
            (names.HEADER_DLQ_TIME_MS, str(now_ms).encode())]
    if partition is not None and offset is not None:
        out.append((names.HEADER_DLQ_OFFSET, offset_text(partition, offset).encode()))
    return out


def dead_letter(dlq_topic: str, source: str, key: str | bytes | None, value: bytes | None, reason: str,
                detail: str, now_ms: int, headers=None, partition: int | None = None,
                offset: int | None = None) -> DeadLetter:
    """The dead-letter record: original key (else the source), original bytes, headers naming why.

    `partition` and `offset` locate a Kafka source record (dlq_offset); leave them out for MQTT messages.
    """
    if value is not None and len(value) > DLQ_VALUE_LIMIT:
        detail = f"{detail} (value cut to its first {DLQ_VALUE_LIMIT} of {len(value)} bytes)"
        value = value[:DLQ_VALUE_LIMIT]
    raw_key = key if key is not None else source
    return DeadLetter(dlq_topic, raw_key if isinstance(raw_key, bytes) else raw_key.encode(), value,
                      dead_letter_headers(source, reason, detail, now_ms, headers, partition, offset), reason)
