"""MQTT topic -> Kafka topic mapping rules: configuration, not code.

A rule names the segments of an MQTT topic filter, e.g.
`sites/{site}/devices/{device_id}/sensors/{sensor_id}/temperature`; a message whose topic matches is
produced to `kafka_topic` with the key rendered from `key` (e.g. `{sensor_id}`) after its payload passed
`contract`. Named segments fill payload fields the device left out; a payload that contradicts its topic is a
contract violation. This module parses and matches rules; services.bridge.routing applies them to messages.

Rules are read from a TOML file:

    [[rule]]
    mqtt = "sites/{site}/devices/{device_id}/sensors/{sensor_id}/temperature"
    kafka_topic = "temperature-data"
    key = "{sensor_id}"
    contract = "temperature-reading"
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from services.common import contracts, names

_NAMED = re.compile(r"^\{([a-z_][a-z0-9_]*)\}$")


class MappingError(ValueError):
    """A mapping rule or the mapping file is wrong; the message names it and the fix."""


@dataclass(frozen=True)
class Rule:
    mqtt: str
    kafka_topic: str
    key: str
    contract: str

    def __post_init__(self) -> None:
        for segment in self.mqtt.split("/"):
            if "{" in segment and not _NAMED.match(segment):
                raise MappingError(f"rule '{self.mqtt}': segment '{segment}' must be a whole {{name}}")
            if segment == "#":
                raise MappingError(f"rule '{self.mqtt}': '#' is not supported; name each segment")
        contracts.contract(self.contract)  # raises with the known names
        missing = set(re.findall(r"\{(\w+)\}", self.key)) - set(self.segment_names())
        if missing:
            raise MappingError(f"rule '{self.mqtt}': key '{self.key}' uses {sorted(missing)} "
                               "which the MQTT filter does not name")

    def segment_names(self) -> list[str]:
        return [m.group(1) for s in self.mqtt.split("/") if (m := _NAMED.match(s))]

    @property
    def subscription(self) -> str:
        """The MQTT subscription filter: named segments become '+'."""
        return "/".join("+" if _NAMED.match(s) else s for s in self.mqtt.split("/"))

    def match(self, topic: str) -> dict[str, str] | None:
        pattern, actual = self.mqtt.split("/"), topic.split("/")
        if len(pattern) != len(actual):
            return None
        values: dict[str, str] = {}
        for want, got in zip(pattern, actual, strict=True):
            named = _NAMED.match(want)
            if named:
                if not got:
                    return None
                values[named.group(1)] = got
            elif want != "+" and want != got:
                return None
        return values


class Mapping:
    def __init__(self, rules: list[Rule]):
        if not rules:
            raise MappingError("no mapping rules: add at least one [[rule]]")
        self.rules = rules

    @classmethod
    def from_file(cls, path: str | Path) -> Mapping:
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise MappingError(f"mapping file {path} not found (set BRIDGE_MAPPING_FILE)") from None
        except tomllib.TOMLDecodeError as err:
            raise MappingError(f"mapping file {path} is not valid TOML: {err}") from None
        return cls.from_dicts(raw.get("rule", []), str(path))

    @classmethod
    def from_dicts(cls, items: list[dict[str, str]], where: str = "mapping") -> Mapping:
        rules = []
        for i, item in enumerate(items, start=1):
            unknown = set(item) - {"mqtt", "kafka_topic", "key", "contract"}
            missing = {"mqtt", "kafka_topic", "key", "contract"} - set(item)
            if unknown or missing:
                raise MappingError(f"{where}: rule {i} has unknown keys {sorted(unknown)} / "
                                   f"misses {sorted(missing)} (expected mqtt, kafka_topic, key, contract)")
            rules.append(Rule(**item))
        return cls(rules)

    def subscriptions(self) -> list[str]:
        return sorted({rule.subscription for rule in self.rules})


DEFAULT_RULES = [
    {"mqtt": names.MQTT_READINGS, "kafka_topic": names.TEMPERATURE_DATA,
     "key": "{sensor_id}", "contract": contracts.READING.name},
]
