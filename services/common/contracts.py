"""Data contracts: the one definition of every record on the wire.

The bridge validates with it, the Cassandra adapter maps with it, the Spark jobs
build their schemas from it (`spark_ddl`). JSON on the wire; field names follow
the seed thesis' schemas. Pure Python, no third-party imports, so every image and
the unit tests can load it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# ------------------------------------------------------------------ units

UNITS = ("C", "F", "K")


def to_celsius(value: float, unit: str) -> float:
    """Convert a temperature to degrees Celsius."""
    if unit == "C":
        return value
    if unit == "F":
        return (value - 32.0) * 5.0 / 9.0
    if unit == "K":
        return value - 273.15
    raise ContractError(f"unknown unit '{unit}' (expected C, F or K)")


def from_celsius(value: float, unit: str) -> float:
    """Convert degrees Celsius to `unit`."""
    if unit == "C":
        return value
    if unit == "F":
        return value * 9.0 / 5.0 + 32.0
    if unit == "K":
        return value + 273.15
    raise ContractError(f"unknown unit '{unit}' (expected C, F or K)")


# ------------------------------------------------------------------ validation

class ContractError(ValueError):
    """A record breaks its contract; the message names the field and the fix."""


@dataclass(frozen=True)
class Field:
    name: str
    kind: str              # string | long | double | boolean
    required: bool = True
    choices: tuple[str, ...] = ()


# Spark SQL types for each kind; used by spark_ddl.
_SPARK_TYPES = {"string": "STRING", "long": "BIGINT", "double": "DOUBLE", "boolean": "BOOLEAN"}


@dataclass(frozen=True)
class Contract:
    name: str
    key_field: str
    fields: tuple[Field, ...]

    def field_names(self) -> list[str]:
        return [f.name for f in self.fields]

    def validate(self, record: Any) -> dict[str, Any]:
        """Return the record with only contract fields, typed; raise ContractError otherwise."""
        if not isinstance(record, dict):
            raise ContractError(f"{self.name}: expected a JSON object, got {type(record).__name__}")
        clean: dict[str, Any] = {}
        for f in self.fields:
            value = record.get(f.name)
            if value is None:
                if f.required:
                    raise ContractError(f"{self.name}: missing field '{f.name}' ({f.kind})")
                clean[f.name] = None
                continue
            clean[f.name] = _coerce(self.name, f, value)
        return clean

    def key(self, record: dict[str, Any]) -> str:
        return str(record[self.key_field])


def _coerce(contract: str, f: Field, value: Any) -> Any:
    where = f"{contract}: field '{f.name}'"
    if f.kind == "string":
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ContractError(f"{where} must be a string, got {type(value).__name__}")
        text = str(value)
        if not text:
            raise ContractError(f"{where} must not be empty")
        if f.choices and text not in f.choices:
            raise ContractError(f"{where}: unknown value '{text}' (expected {', '.join(f.choices)})")
        return text
    if f.kind == "long":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise ContractError(f"{where} must be an integer, got {value!r}")
        return int(value)
    if f.kind == "double":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ContractError(f"{where} must be a finite number, got {value!r}")
        return float(value)
    if f.kind == "boolean":
        if not isinstance(value, bool):
            raise ContractError(f"{where} must be true or false, got {value!r}")
        return value
    raise AssertionError(f"unknown field kind {f.kind}")


READING = Contract("temperature-reading", "sensor_id", (
    Field("sensor_id", "string"),
    Field("timestamp", "long"),            # event time, epoch milliseconds
    Field("temperature", "double"),
    Field("unit", "string", choices=UNITS),
))

DEVICE = Contract("device-registration", "device_id", (
    Field("device_id", "string"),
    Field("name", "string"),
    Field("description", "string", required=False),
    Field("location", "string", required=False),
))

SENSOR = Contract("sensor-registration", "sensor_id", (
    Field("sensor_id", "string"),
    Field("name", "string"),
    Field("description", "string", required=False),
    Field("device_id", "string"),
    Field("sensor_type_id", "string"),
))

SENSOR_TYPE = Contract("sensor-type-registration", "sensor_type_id", (
    Field("sensor_type_id", "string"),
    Field("name", "string"),
    Field("description", "string", required=False),
    Field("unit", "string", choices=UNITS),
))

THRESHOLD_EVENT = Contract("temperature-threshold-event", "sensor_id", (
    Field("sensor_id", "string"),
    Field("site", "string"),
    Field("timestamp", "long"),                 # time of the transition (epoch ms)
    Field("temperature_threshold", "double"),   # degrees Celsius
    Field("average_transgression", "double"),   # average temperature during the episode (C)
    Field("max_transgression", "double"),       # maximum temperature during the episode (C)
    Field("exceeded_for_ms", "long"),
    Field("first_transgression", "long"),       # first reading above the threshold (epoch ms)
    Field("last_transgression", "long"),        # last reading above the threshold (epoch ms)
    Field("is_first", "boolean"),               # the event that opens an episode
    Field("is_last", "boolean"),                # the event that closes it
))

ROLLUP = Contract("temperature-rollup-1m", "sensor_id", (
    Field("sensor_id", "string"),
    Field("site", "string", required=False),
    Field("window_start", "long"),
    Field("window_end", "long"),
    Field("count", "long"),
    Field("avg", "double"),
    Field("min", "double"),
    Field("max", "double"),
))

DEVICE_COMMAND = Contract("device-command", "device_id", (
    Field("device_id", "string"),
    Field("command", "string"),
    Field("site", "string", required=False),
))

# Contract by name, as configuration refers to them (mapping rules, adapter tables).
CONTRACTS: dict[str, Contract] = {c.name: c for c in (
    READING, DEVICE, SENSOR, SENSOR_TYPE, THRESHOLD_EVENT, ROLLUP, DEVICE_COMMAND)}


def contract(name: str) -> Contract:
    try:
        return CONTRACTS[name]
    except KeyError:
        raise ContractError(f"unknown contract '{name}' (known: {', '.join(sorted(CONTRACTS))})") from None


def spark_ddl(name: str) -> str:
    """Spark DDL schema string for a contract, e.g. 'sensor_id STRING, timestamp BIGINT, ...'."""
    return ", ".join(f"`{f.name}` {_SPARK_TYPES[f.kind]}" for f in contract(name).fields)
