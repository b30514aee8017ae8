"""Pure logic of the bridge: MQTT message -> Kafka record, dead-letter records, the ack window.

No network here, so all of it is unit-tested without brokers.
"""
from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

from services import contracts
from services.contracts import ContractError
from services.mapping import Mapping, MappingError

# Dead-letter reasons: the metric label and the first word of the dlq_reason header.
OVERSIZED = "oversized"
INVALID_JSON = "invalid_json"
CONTRACT_VIOLATION = "contract_violation"
UNMAPPED = "unmapped"
KAFKA_REJECTED = "kafka_rejected"
UNPROCESSABLE = "unprocessable"
REASONS = (OVERSIZED, INVALID_JSON, CONTRACT_VIOLATION, UNMAPPED, KAFKA_REJECTED, UNPROCESSABLE)

# Headers the bridge owns: a device's user property of the same name is dropped, not trusted.
RESERVED_HEADERS = frozenset({contracts.HEADER_SITE, contracts.HEADER_INGEST_MS, contracts.HEADER_MQTT_TOPIC,
                              contracts.HEADER_DLQ_SOURCE, contracts.HEADER_DLQ_REASON, contracts.HEADER_DLQ_TIME_MS})

# Kafka's default max.message.bytes is ~1 MB and Mosquitto's max_packet_size 1 MiB: a dead-letter
# value above this is cut so that the dead-letter record itself can always be written.
DLQ_VALUE_LIMIT = 900_000

Headers = list[tuple[str, bytes]]


@dataclass
class OutRecord:
    topic: str
    key: bytes
    value: bytes
    headers: Headers
    reason: str | None = None          # set on dead-letter records


def base_headers(mqtt_topic: str, user_properties: list[tuple[str, str]] | None, site: str | None,
                 ingest_ms: int) -> Headers:
    """MQTT v5 user properties as headers, then the bridge's own (which a device cannot spoof)."""
    headers: Headers = [(k, v.encode()) for k, v in (user_properties or ()) if k not in RESERVED_HEADERS]
    headers.append((contracts.HEADER_MQTT_TOPIC, mqtt_topic.encode()))
    if site:
        headers.append((contracts.HEADER_SITE, site.encode()))
    headers.append((contracts.HEADER_INGEST_MS, str(ingest_ms).encode()))
    return headers


def dead_letter(dlq_topic: str, source: str, key: str | bytes | None, value: bytes, reason: str, detail: str,
                now_ms: int, headers: Headers | None = None) -> OutRecord:
    """The dead-letter record: original key (else the source topic), original bytes, headers naming why."""
    if len(value) > DLQ_VALUE_LIMIT:
        detail = f"{detail} (value cut to its first {DLQ_VALUE_LIMIT} of {len(value)} bytes)"
        value = value[:DLQ_VALUE_LIMIT]
    raw_key = key if key is not None else source
    out = [h for h in (headers or ()) if h[0] not in (contracts.HEADER_DLQ_SOURCE, contracts.HEADER_DLQ_REASON,
                                                       contracts.HEADER_DLQ_TIME_MS)]
    out += [(contracts.HEADER_DLQ_SOURCE, source.encode()),
            (contracts.HEADER_DLQ_REASON, f"{reason}: {detail}".encode()),
            (contracts.HEADER_DLQ_TIME_MS, str(now_ms).encode())]
    return OutRecord(dlq_topic, raw_key if isinstance(raw_key, bytes) else raw_key.encode(), value, out, reason)


def known_key(mapping: Mapping, topic: str) -> str | None:
    """The Kafka key the topic implies even when the payload is bad (e.g. the sensor id)."""
    for rule in mapping.rules:
        segments = rule.match(topic)
        if segments is not None:
            return rule.key.format(**segments)
    return None


_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
_TOPIC_CACHE = 10000      # devices publish to a fixed set of topics: remember what each one implies


@dataclass(frozen=True)
class Router:
    """Turns one MQTT message into the record to produce: the mapped record or a dead-letter one."""
    mapping: Mapping
    dlq_topic: str
    max_payload: int
    site: str | None = None
    _topics: dict = field(default_factory=dict, compare=False, repr=False)

    def route(self, topic: str, payload: bytes, user_properties: list[tuple[str, str]] | None,
              now_ms: int) -> OutRecord:
        mapping, site, key = self._topic(topic)
        headers = base_headers(topic, user_properties, site, now_ms)

        def dlq(reason: str, detail: str) -> OutRecord:
            return dead_letter(self.dlq_topic, topic, key, payload, reason, detail, now_ms, headers)

        if len(payload) > self.max_payload:
            return dlq(OVERSIZED, f"payload of {len(payload)} bytes exceeds BRIDGE_MAX_PAYLOAD_BYTES="
                                  f"{self.max_payload} (send smaller messages or raise the limit)")
        try:
            data = json.loads(payload)
        except (ValueError, RecursionError) as err:   # UnicodeDecodeError is a ValueError
            return dlq(INVALID_JSON, f"payload is not JSON: {err}")
        try:
            mapped = mapping.apply(topic, data)
        except MappingError as err:
            return dlq(UNMAPPED, f"{err} (add a [[rule]] to the mapping file)")
        except ContractError as err:
            return dlq(CONTRACT_VIOLATION, str(err))
        return OutRecord(mapped.kafka_topic, mapped.key.encode(), _ENCODE(mapped.value).encode(), headers)

    def _topic(self, topic: str) -> tuple[Mapping, str | None, str | None]:
        """(mapping holding just the matching rule, site, Kafka key) for a topic, cached."""
        hit = self._topics.get(topic)
        if hit is None:
            rule = next((r for r in self.mapping.rules if r.match(topic) is not None), None)
            segments = rule.match(topic) if rule else {}
            hit = (Mapping([rule]) if rule else self.mapping, segments.get("site") or self.site,
                   known_key(self.mapping, topic))
            if len(self._topics) >= _TOPIC_CACHE:
                self._topics.clear()
            self._topics[topic] = hit
        return hit


# ------------------------------------------------------------------ ack window

@dataclass
class Entry:
    seq: int
    mid: int
    qos: int
    received: float                    # monotonic time of receipt, for the latency histogram
    record: OutRecord
    delivered: bool = False


@dataclass
class Window:
    """Messages received on the current MQTT connection and not yet acked, in arrival order.

    PUBACKs go out in arrival order (MQTT v5 4.6: a receiver acks QoS 1 PUBLISHes in the order
    received), so a delivered entry waits for older ones. On a lost connection every entry is
    dropped (`reset`): the broker redelivers those messages on the resumed session, and acking an
    old packet id on a new connection could ack a *different* message that reused the id.
    """
    size: int
    _order: deque[Entry] = field(default_factory=deque)
    _by_seq: dict[int, Entry] = field(default_factory=dict)
    _next: int = 0

    def __len__(self) -> int:
        return len(self._by_seq)

    @property
    def added(self) -> int:
        """Messages added so far (a cheap 'did that read bring a message?')."""
        return self._next

    def room(self) -> int:
        return max(0, self.size - len(self._by_seq))

    def add(self, mid: int, qos: int, received: float, record: OutRecord) -> Entry:
        self._next += 1
        entry = Entry(self._next, mid, qos, received, record)
        self._order.append(entry)
        self._by_seq[entry.seq] = entry
        return entry

    def get(self, seq: int) -> Entry | None:
        """The live entry, or None when it was dropped by a reset (its delivery no longer acks anything)."""
        return self._by_seq.get(seq)

    def delivered(self, seq: int) -> Entry | None:
        entry = self._by_seq.get(seq)
        if entry is not None:
            entry.delivered = True
        return entry

    def pop_ackable(self) -> list[Entry]:
        """Remove and return the delivered prefix: these are the messages to PUBACK now."""
        out = []
        while self._order and self._order[0].delivered:
            entry = self._order.popleft()
            del self._by_seq[entry.seq]
            out.append(entry)
        return out

    def reset(self) -> int:
        """Forget everything (connection lost); returns how many messages the broker will redeliver."""
        dropped = len(self._by_seq)
        self._order.clear()
        self._by_seq.clear()
        return dropped
