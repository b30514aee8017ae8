"""Data contracts: the one definition of every record on the wire.

The bridge validates with it, the Cassandra adapter maps with it, the Spark jobs
build their schemas from it (`spark_ddl`). JSON on the wire; field names follow
the seed thesis' schemas. Pure Python, no third-party imports, so every image and
the unit tests can load it.

Whatever the bytes, parse_json and Contract.validate either return a clean record
or raise ContractError (InvalidJson for bytes that are no JSON Python can hold),
which every consumer turns into a dead letter: one bad record must never stop a
consumer (a crash would meet the same record again after every restart). A clean
record fits every store: each long fits 64 bits, each time field is a date that
Python, Spark and Cassandra can all represent, each double is finite, each string
is encodable Unicode.
"""
from __future__ import annotations

import json
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


# ------------------------------------------------------------------ errors

class ContractError(ValueError):
    """A record breaks its contract; the message names the field and the fix."""


class InvalidJson(ContractError):
    """The bytes are not a JSON document Python can hold (syntax, encoding, nesting, number size)."""


# ------------------------------------------------------------------ parsing

_DECODE = json.JSONDecoder().decode


def decode_json(value: bytes | str) -> Any:
    """json.loads(value), minus its encoding sniffing for the usual case: a UTF-8 object.

    json.loads on bytes picks UTF-8 whenever the first two bytes are not NUL and
    there is no byte-order mark, and then decodes with 'surrogatepass'; for such
    values this is exactly that (same results, same errors). Anything else takes
    json.loads itself. The consumers' hot path, so no checks beyond that."""
    if value[:1] == b"{" and value[1:2] != b"\x00":
        return _DECODE(value.decode("utf-8", "surrogatepass"))
    return json.loads(value)


def parse_json(value: bytes | str) -> Any:
    """The JSON value of a record, or InvalidJson, whatever the bytes.

    json.loads raises more than JSONDecodeError: UnicodeDecodeError (not UTF-8),
    RecursionError (nesting deeper than the interpreter's recursion limit),
    ValueError (an integer over Python's 4300-digit limit), TypeError (no bytes
    at all). Each is the record's fault, so each becomes InvalidJson, the
    ContractError a consumer dead-letters. Numbers that parse but do not fit
    (1e999 is inf) are left to Contract.validate."""
    try:
        return decode_json(value)
    except RecursionError:
        raise InvalidJson("not JSON Python can hold: nested too deeply") from None
    except Exception as err:  # noqa: BLE001 - whatever the bytes: a dead letter, never a crash
        raise InvalidJson(f"not JSON: {type(err).__name__}: {str(err)[:200]}") from None


# ------------------------------------------------------------------ validation

# A `long` is 64 bits everywhere (Spark BIGINT, Cassandra bigint/timestamp).
LONG_BOUNDS = (-2 ** 63, 2 ** 63 - 1)
# Event times in epoch ms from 0001-01-01 to 9999-12-31 UTC: what Python's datetime holds, well inside
# Spark's timestamp_millis (which overflows beyond +-9.2e15 ms and fails the query) and Cassandra's
# `date` of a row's day partition (+-1.8e17 ms). A time outside them is a contract violation.
EPOCH_MS_MIN, EPOCH_MS_MAX = -62_135_596_800_000, 253_402_300_799_999
TIME_BOUNDS = (EPOCH_MS_MIN, EPOCH_MS_MAX)


@dataclass(frozen=True)
class Field:
    name: str
    kind: str              # string | long | double | boolean
    required: bool = True
    choices: tuple[str, ...] = ()
    bounds: tuple[int, int] | None = None     # (lowest, highest) of a long; LONG_BOUNDS unless given

    def __post_init__(self) -> None:
        if self.kind == "long" and self.bounds is None:
            object.__setattr__(self, "bounds", LONG_BOUNDS)


def _time(name: str) -> Field:
    """An event time, epoch milliseconds within TIME_BOUNDS."""
    return Field(name, "long", bounds=TIME_BOUNDS)


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
            try:
                clean[f.name] = _coerce(self.name, f, value)
            except ContractError:
                raise
            except Exception as err:  # noqa: BLE001 - a value no check foresaw is still the record's fault
                raise ContractError(f"{self.name}: field '{f.name}' has an unusable value "
                                    f"({type(err).__name__})") from None
        return clean

    def key(self, record: dict[str, Any]) -> str:
        return str(record[self.key_field])


def _coerce(contract: str, f: Field, value: Any) -> Any:
    where = f"{contract}: field '{f.name}'"
    if f.kind == "string":
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ContractError(f"{where} must be a string, got {_show(value)}")
        text = str(value)
        if not text:
            raise ContractError(f"{where} must not be empty")
        if not text.isascii() and not _encodable(text):     # JSON "\ud800": no UTF-8 for it, no store takes it
            raise ContractError(f"{where} must be Unicode text, got a lone surrogate in {_show(text)}")
        if f.choices and text not in f.choices:
            raise ContractError(f"{where}: unknown value {_show(text)} (expected {', '.join(f.choices)})")
        return text
    if f.kind == "long":
        # JSON 1e999 is inf, and int(inf) raises OverflowError: check finiteness first.
        if isinstance(value, bool) or not (isinstance(value, int) or (
                isinstance(value, float) and math.isfinite(value) and value.is_integer())):
            raise ContractError(f"{where} must be an integer, got {_show(value)}")
        number = int(value)
        low, high = f.bounds
        if not low <= number <= high:
            what = ("an epoch time in ms from 0001-01-01 to 9999-12-31" if f.bounds == TIME_BOUNDS
                    else "a 64-bit integer")
            raise ContractError(f"{where} must be {what} ({low} to {high}), got {_show(value)}")
        return number
    if f.kind == "double":
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() <= 1000:
            return float(value)          # a larger int would overflow float()
        if not isinstance(value, float) or not math.isfinite(value):
            raise ContractError(f"{where} must be a finite number, got {_show(value)}")
        return value
    if f.kind == "boolean":
        if not isinstance(value, bool):
            raise ContractError(f"{where} must be true or false, got {_show(value)}")
        return value
    raise AssertionError(f"unknown field kind {f.kind}")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _show(value: Any) -> str:
    """A value for an error message: short (it ends up in a Kafka header), never raising."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"      # repr of a huge int is long, or raises
    text = repr(value)       # str, float, bool, int: repr escapes surrogates and control characters
    return text if len(text) <= 80 else f"{text[:77]}..."


READING = Contract("temperature-reading", "sensor_id", (
    Field("sensor_id", "string"),
    _time("timestamp"),                    # event time, epoch milliseconds
    Field("temperature", "double"),
    Field("unit", "string", choices=UNITS),
    # The device that published it: the bridge fills it from the MQTT topic's {device_id} segment (a payload
    # naming another device is a violation). Optional: readings written before it, and by other producers.
    Field("device_id", "string", required=False),
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
    _time("timestamp"),                         # time of the transition (epoch ms)
    Field("temperature_threshold", "double"),   # degrees Celsius
    Field("average_transgression", "double"),   # average temperature during the episode (C)
    Field("max_transgression", "double"),       # maximum temperature during the episode (C)
    Field("exceeded_for_ms", "long"),
    _time("first_transgression"),               # first reading above the threshold (epoch ms)
    _time("last_transgression"),                # last reading above the threshold (epoch ms)
    Field("is_first", "boolean"),               # the event that opens an episode
    Field("is_last", "boolean"),                # the event that closes it
))

ROLLUP = Contract("temperature-rollup-1m", "sensor_id", (
    Field("sensor_id", "string"),
    Field("site", "string", required=False),
    _time("window_start"),
    _time("window_end"),
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
