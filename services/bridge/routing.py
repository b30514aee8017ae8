"""Pure logic of the bridge: MQTT message -> Kafka record or dead-letter record (services.common.dead_letter).

Every record it returns fits in `max_record` bytes (key, value, headers: dead_letter.record_bytes): a
reading whose MQTT user properties would make it larger is dead-lettered (`oversized`), and a dead
letter drops what it must to fit. With `owners` (sensor_id -> device_id, services.bridge.owners), a
reading of a rule with a {device_id} segment and a {sensor_id} key is dead-lettered unless its sensor
is registered to that device. No network here, so all of it is unit-tested without brokers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from json.encoder import c_make_encoder, encode_basestring_ascii
from math import isfinite
from typing import Any

from services.bridge.rules import Mapping
from services.common import contracts, names
from services.common.contracts import ContractError
from services.common.dead_letter import (
    CONTRACT_VIOLATION,
    DLQ_HEADERS,
    HEADER_OVERHEAD,
    INVALID_JSON,
    SERVICE_HEADERS,
    UNMAPPED,
    UNPROCESSABLE,
    DeadLetter,
    Headers,
    dead_letter,
    headers_bytes,
    utf8,
)

# Dead-letter reasons of the bridge: the metric label and the first word of the dlq_reason header.
# The generic ones come from services.common.dead_letter; these only the bridge has.
OVERSIZED = "oversized"
KAFKA_REJECTED = "kafka_rejected"
UNREGISTERED_SENSOR = "unregistered_sensor"
FOREIGN_SENSOR = "foreign_sensor"
REASONS = (OVERSIZED, INVALID_JSON, CONTRACT_VIOLATION, UNMAPPED, KAFKA_REJECTED, UNPROCESSABLE,
           UNREGISTERED_SENSOR, FOREIGN_SENSOR)

# The default bound of a whole Kafka record (BRIDGE_MAX_RECORD_BYTES): Kafka's default max.message.bytes
# (1048588) and librdkafka's message.max.bytes (1000000) with room to spare.
MAX_RECORD_BYTES = 900_000

# Headers the bridge owns: a device's user property of the same name is dropped, not trusted.
RESERVED_HEADERS = SERVICE_HEADERS | DLQ_HEADERS
# The ingest_ms header as the size bound counts it: its name and the longest epoch-ms text (int64).
_INGEST_BYTES = headers_bytes([(names.HEADER_INGEST_MS, b"-9223372036854775808")])


@dataclass(slots=True)
class OutRecord:
    """A mapped record to produce. Dead-letter records are services.common.dead_letter.DeadLetter
    (same fields, `reason` set), so `record.reason` tells the two apart."""
    topic: str
    key: bytes
    value: bytes
    headers: Headers
    reason: str | None = None          # always None here


Record = OutRecord | DeadLetter        # what the bridge produces for one MQTT message


def base_headers(mqtt_topic: str, user_properties: list[tuple[str, str]] | None, site: str | None,
                 ingest_ms: int) -> Headers:
    """MQTT v5 user properties as headers, then the bridge's own (which a device cannot spoof)."""
    headers = user_headers(user_properties)[0] if user_properties else []
    headers.append((names.HEADER_MQTT_TOPIC, utf8(mqtt_topic)))
    if site:
        headers.append((names.HEADER_SITE, utf8(site)))
    headers.append((names.HEADER_INGEST_MS, str(ingest_ms).encode()))
    return headers


def user_headers(user_properties: list[tuple[str, str]]) -> tuple[Headers, int]:
    """MQTT v5 user properties as Kafka headers (names the bridge owns dropped) and their size in bytes
    (dead_letter.headers_bytes). The MQTT client decodes bad UTF-8 with replacement characters, so a name
    or value without UTF-8 (a lone surrogate) comes only from code; it gets its backslash escape."""
    try:
        headers = [(k, v.encode()) for k, v in user_properties if k not in RESERVED_HEADERS]
        return headers, sum([len(k.encode()) + len(v) for k, v in headers]) + HEADER_OVERHEAD * len(headers)
    except UnicodeEncodeError:
        headers = [(utf8(k).decode(), utf8(v)) for k, v in user_properties if k not in RESERVED_HEADERS]
        return headers, headers_bytes(headers)


_DEFAULT_ENCODER = json.JSONEncoder(separators=(",", ":"))
_ENCODE = _DEFAULT_ENCODER.encode
_KIND_TYPES = {"string": str, "long": int, "double": float, "boolean": bool}
# The C encoder behind _ENCODE, built once (JSONEncoder.encode builds it per call). No circular-reference
# markers: a validated record is a flat dict of scalars. Same bytes as _ENCODE.
_ENCODE_FLAT = c_make_encoder(None, _DEFAULT_ENCODER.default, encode_basestring_ascii, None, ":", ",", False,
                              False, True) if c_make_encoder else None
_DECODE = json.JSONDecoder().decode


def _encode(value: dict[str, Any]) -> bytes:
    return "".join(_ENCODE_FLAT(value, 0)).encode() if _ENCODE_FLAT else _ENCODE(value).encode()


def _loads(payload: bytes) -> Any:
    """json.loads(payload), without its encoding detection for the usual UTF-8 payload.

    Anything the fast path cannot take (not UTF-8, a BOM, UTF-16/32, invalid JSON) goes to
    json.loads itself, so results and errors are exactly json.loads's.
    """
    try:
        return _DECODE(payload.decode())
    except (ValueError, RecursionError):
        return json.loads(payload)
_TOPIC_CACHE = 10000      # devices publish to a fixed set of topics: remember what each one implies


class _TopicPlan:
    """Everything one MQTT topic implies, worked out once: its rule (the first that matches), the
    segments that fill payload fields, the Kafka topic and key, the site and the bridge's own headers
    for it, the bytes a record of it takes besides its value and user properties (`size`) and the
    (sensor, device) its ownership check compares (`owner`). tests/unit/bridge/reference.py keeps the
    plain per-message mapping this must equal."""
    __slots__ = ("rule", "contract", "fills", "fields", "kafka_topic", "key", "headers", "foreign_site", "size",
                 "owner")

    def __init__(self, mapping: Mapping, topic: str, default_site: str | None):
        rule, segments = None, {}
        for candidate in mapping.rules:
            found = candidate.match(topic)
            if found is not None:
                rule, segments = candidate, found
                break
        self.rule = rule
        # The site is where the device connected: this bridge's BRIDGE_SITE. The topic's {site} segment
        # must agree (Mosquitto's ACL lets a device write only under its own site; a topic naming another
        # site is dead-lettered, never recorded as that site). Without BRIDGE_SITE, the segment.
        topic_site = segments.get("site")
        site = default_site or topic_site
        self.foreign_site = (f"topic names site '{topic_site}' but this bridge serves site '{default_site}' "
                             f"(BRIDGE_SITE): devices publish under their own site's topics"
                             if default_site and topic_site and topic_site != default_site else None)
        self.headers = tuple(base_headers(topic, None, site, 0)[:-1])     # all but the per-message ingest time
        self.owner = None
        if rule is None:
            self.contract, self.fills, self.fields, self.kafka_topic, self.key = None, (), (), None, None
            self.size = headers_bytes(self.headers) + _INGEST_BYTES
            return
        self.contract = contracts.contract(rule.contract)
        names = self.contract.field_names()
        self.fills = tuple((name, value) for name, value in segments.items() if name in names)
        self.fields = tuple((f.name, _KIND_TYPES[f.kind], f.required, f.choices, f.bounds)
                            for f in self.contract.fields)
        self.kafka_topic = rule.kafka_topic
        self.key = utf8(rule.key.format(**segments))
        self.size = len(self.key) + headers_bytes(self.headers) + _INGEST_BYTES
        if rule.key == "{sensor_id}" and "device_id" in segments:
            self.owner = (segments["sensor_id"], segments["device_id"])

    def apply(self, data: Any) -> dict[str, Any]:
        """The mapped record for this topic's rule (same result, same errors as the reference mapping in
        tests/unit/bridge/reference.py) without matching the topic again."""
        if type(data) is not dict:
            return self.contract.validate(data)          # raises: not a JSON object
        for name, value in self.fills:
            current = data.get(name)
            if current is not None and current != value and str(current) != value:
                raise ContractError(f"{self.contract.name}: field '{name}' is '{current}' but the topic says "
                                    f"'{value}'")
            data[name] = value
        # Fast path for values already of their contract type; anything else takes Contract.validate,
        # which coerces (e.g. 20 -> 20.0) or raises exactly as before.
        clean: dict[str, Any] = {}
        get = data.get
        for name, want, required, choices, bounds in self.fields:
            value = get(name)
            if type(value) is want:
                if want is float:
                    if not isfinite(value):
                        return self.contract.validate(data)
                elif want is int and not bounds[0] <= value <= bounds[1]:     # 64 bits; times: years 1-9999
                    return self.contract.validate(data)
                elif want is str and (not value or (choices and value not in choices)):
                    return self.contract.validate(data)
                clean[name] = value
            elif value is None and not required:
                clean[name] = None
            else:
                return self.contract.validate(data)
        return clean


@dataclass(frozen=True)
class Router:
    """Turns one MQTT message into the record to produce: the mapped record or a dead-letter one.

    `owners` (sensor_id -> device_id) is read, never copied: the bridge keeps it current. None: no check."""
    mapping: Mapping
    dlq_topic: str
    max_payload: int
    site: str | None = None
    max_record: int = MAX_RECORD_BYTES
    owners: dict[str, str] | None = None
    _topics: dict = field(default_factory=dict, compare=False, repr=False)

    def route(self, topic: str, payload: bytes, user_properties: list[tuple[str, str]] | None,
              now_ms: int) -> Record:
        plan = self._topics.get(topic) or self._plan(topic)
        ingest = (names.HEADER_INGEST_MS, str(now_ms).encode())
        if user_properties:
            headers, user_bytes = user_headers(user_properties)
            headers += plan.headers
            headers.append(ingest)
        else:
            headers, user_bytes = [*plan.headers, ingest], 0
        if len(payload) > self.max_payload:
            return self._dlq(plan, topic, payload, headers, now_ms, OVERSIZED,
                             f"payload of {len(payload)} bytes exceeds BRIDGE_MAX_PAYLOAD_BYTES="
                             f"{self.max_payload} (send smaller messages or raise the limit)")
        try:
            data = _loads(payload)
        except (ValueError, RecursionError) as err:   # UnicodeDecodeError is a ValueError
            return self._dlq(plan, topic, payload, headers, now_ms, INVALID_JSON, f"payload is not JSON: {err}")
        if plan.rule is None:
            return self._dlq(plan, topic, payload, headers, now_ms, UNMAPPED,
                             f"no mapping rule matches MQTT topic '{topic}' (add a [[rule]] to the mapping file)")
        if plan.foreign_site:
            return self._dlq(plan, topic, payload, headers, now_ms, CONTRACT_VIOLATION, plan.foreign_site)
        try:
            value = plan.apply(data)
        except ContractError as err:
            return self._dlq(plan, topic, payload, headers, now_ms, CONTRACT_VIOLATION, str(err))
        if self.owners is not None and plan.owner is not None:
            sensor, device = plan.owner
            owner = self.owners.get(sensor)
            if owner != device:
                return self._dlq(plan, topic, payload, headers, now_ms, *_ownership(sensor, device, owner))
        encoded = _encode(value)
        size = plan.size + user_bytes + len(encoded)
        if size > self.max_record:
            return self._dlq(plan, topic, payload, headers, now_ms, OVERSIZED,
                             f"the Kafka record would be {size} bytes, over BRIDGE_MAX_RECORD_BYTES="
                             f"{self.max_record}: its {len(user_properties or ())} MQTT user properties take "
                             f"{user_bytes} bytes (send fewer or smaller user properties)")
        return OutRecord(plan.kafka_topic, plan.key, encoded, headers)

    def _dlq(self, plan: _TopicPlan, topic: str, payload: bytes, headers: Headers, now_ms: int, reason: str,
             detail: str) -> DeadLetter:
        return dead_letter(self.dlq_topic, topic, plan.key, payload, reason, detail, now_ms, headers,
                           max_bytes=self.max_record)

    def _plan(self, topic: str) -> _TopicPlan:
        plan = _TopicPlan(self.mapping, topic, self.site)
        if len(self._topics) >= _TOPIC_CACHE:
            self._topics.clear()
        self._topics[topic] = plan
        return plan


def _ownership(sensor: str, device: str, owner: str | None) -> tuple[str, str]:
    """The dead-letter reason and detail of a reading whose sensor is not registered to its device."""
    if owner is None:
        return UNREGISTERED_SENSOR, (f"sensor {sensor} is not registered; register it with iot-registrar "
                                     f"({names.SENSOR_REGISTRATION}) before its device publishes")
    return FOREIGN_SENSOR, f"sensor {sensor} belongs to device {owner}, not {device}"
