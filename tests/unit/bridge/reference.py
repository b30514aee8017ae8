"""Plain reference versions of what the bridge does on its fast paths; tests only.

The bridge maps messages through per-topic plans (services.bridge.routing._TopicPlan)
and acks through Window entries. These are the straightforward versions the tests
pin the fast paths to (tests/unit/bridge/test_bridge.py) and use to state the rules
(tests/unit/bridge/test_rules.py). Production code and tooling never import this.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.bridge.rules import Mapping, MappingError
from services.bridge.window import Entry, Window
from services.common import contracts


@dataclass(frozen=True)
class Mapped:
    """A message that passed its rule: where it goes and what it says."""
    kafka_topic: str
    key: str
    value: dict[str, Any]
    segments: dict[str, str]


def apply(mapping: Mapping, topic: str, payload: Any) -> Mapped:
    """Map one decoded message; raises MappingError (unmapped) or ContractError (invalid)."""
    for rule in mapping.rules:
        segments = rule.match(topic)
        if segments is None:
            continue
        contract = contracts.contract(rule.contract)
        if isinstance(payload, dict):
            payload = dict(payload)
            for name, value in segments.items():
                if name not in contract.field_names():
                    continue
                if name in payload and payload[name] is not None and str(payload[name]) != value:
                    raise contracts.ContractError(
                        f"{contract.name}: field '{name}' is '{payload[name]}' but the topic says '{value}'")
                payload[name] = value
        value = contract.validate(payload)
        return Mapped(rule.kafka_topic, rule.key.format(**segments), value, segments)
    raise MappingError(f"no mapping rule matches MQTT topic '{topic}'")


def known_key(mapping: Mapping, topic: str) -> str | None:
    """The Kafka key the topic implies even when the payload is bad (e.g. the sensor id)."""
    for rule in mapping.rules:
        segments = rule.match(topic)
        if segments is not None:
            return rule.key.format(**segments)
    return None


def delivered(window: Window, seq: int) -> Entry | None:
    """Mark an entry as in Kafka, as the bridge's delivery report does; None when a reset dropped it."""
    entry = window.get(seq)
    if entry is not None:
        entry.delivered = True
    return entry
