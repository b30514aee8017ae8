"""Per-sensor hysteresis state machine and its threshold configuration (no Spark).

A sensor enters "exceeding" on a reading strictly above its threshold and leaves
it on a reading strictly below threshold - hysteresis; readings in between keep
the current state. Each transition yields one event.

Out-of-order rule: readings of a sensor are applied in arrival order (Kafka
offset order; the contract keys readings by sensor_id, so one sensor's readings
share a partition). A reading whose event time is older than the newest one
already applied for that sensor is late and ignored by the state machine (it
still counts in rollups and storage). Equal timestamps are applied. The outcome
therefore depends only on the sequence, not on how it was cut into micro-batches.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from services.common import settings

# Used when the configuration names no default (degrees Celsius).
BUILTIN_DEFAULT = {"threshold": 30.0, "hysteresis": 2.0}


class ConfigError(ValueError):
    """Bad job configuration; the message names the setting and the fix."""


THRESHOLD_OPTIONS = (
    settings.Option("thresholds_file", "THRESHOLDS_FILE", "",
                    "path of the thresholds JSON (e.g. a Swarm config); not with THRESHOLDS"),
    settings.Option("thresholds", "THRESHOLDS", "",
                    'the thresholds JSON itself: {"default": {"threshold": 30, "hysteresis": 2}, "types": '
                    '{"<sensor_type_id>": {"threshold": 200, "hysteresis": 10}}} in degrees Celsius; '
                    "neither set: 30 / 2"),
)


@dataclass(frozen=True)
class Limits:
    threshold: float      # degrees Celsius: enter above this
    hysteresis: float     # degrees Celsius: leave below threshold - hysteresis


@dataclass(frozen=True)
class ThresholdConfig:
    """Limits per sensor type (sensor_type_id of the sensor registration), with a default."""
    default: Limits
    by_type: dict[str, Limits]

    @property
    def lowest_threshold(self) -> float:
        """No reading at or below this can open an episode, whatever the sensor type."""
        return min([self.default.threshold, *(limits.threshold for limits in self.by_type.values())])

    def limits_for(self, sensor_type_id: str | None) -> Limits:
        if sensor_type_id is None:
            return self.default
        return self.by_type.get(sensor_type_id, self.default)

    @classmethod
    def parse(cls, text: str, where: str) -> ThresholdConfig:
        """JSON: {"default": {"threshold": 30, "hysteresis": 2}, "types": {"<sensor_type_id>": {...}}}."""
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}: not valid JSON ({err})") from None
        if not isinstance(doc, dict) or set(doc) - {"default", "types"}:
            raise ConfigError(f"{where}: expected an object with keys 'default' and 'types', got {text[:80]!r}")
        default = _limits(doc.get("default", BUILTIN_DEFAULT), f"{where}: default")
        types = doc.get("types", {})
        if not isinstance(types, dict):
            raise ConfigError(f"{where}: 'types' must map sensor_type_id to limits")
        return cls(default, {str(k): _limits(v, f"{where}: types.{k}") for k, v in types.items()})

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ThresholdConfig:
        """THRESHOLDS_FILE (path to JSON) or THRESHOLDS (inline JSON); neither: built-in default."""
        values = settings.from_env(THRESHOLD_OPTIONS, environ)
        path, inline = values["thresholds_file"], values["thresholds"]
        if path and inline:
            raise ConfigError("set THRESHOLDS_FILE or THRESHOLDS, not both")
        if path:
            try:
                with open(path, encoding="utf-8") as handle:
                    return cls.parse(handle.read(), f"THRESHOLDS_FILE={path}")
            except OSError as err:
                raise ConfigError(f"THRESHOLDS_FILE={path}: cannot read it ({err.strerror})") from None
        if inline:
            return cls.parse(inline, "THRESHOLDS")
        return cls(_limits(BUILTIN_DEFAULT, "built-in default"), {})


def _limits(value: object, where: str) -> Limits:
    if not isinstance(value, dict) or set(value) - {"threshold", "hysteresis"} or "threshold" not in value:
        raise ConfigError(f"{where}: expected {{\"threshold\": <C>, \"hysteresis\": <C>}}, got {value!r}")
    numbers = {}
    for name in ("threshold", "hysteresis"):
        number = value.get(name, 0.0)
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise ConfigError(f"{where}: '{name}' must be a finite number of degrees Celsius, got {number!r}")
        numbers[name] = float(number)
    if numbers["hysteresis"] < 0:
        raise ConfigError(f"{where}: 'hysteresis' must be >= 0, got {numbers['hysteresis']}")
    return Limits(numbers["threshold"], numbers["hysteresis"])


@dataclass(frozen=True)
class SensorState:
    newest_ms: int | None = None   # newest event time applied; older readings are late
    exceeding: bool = False
    threshold: float = 0.0         # limits fixed when the episode opened
    hysteresis: float = 0.0
    first_ms: int = 0              # first transgression of the episode
    last_ms: int = 0               # last reading above the threshold
    total: float = 0.0             # sum and count of all readings while exceeding
    count: int = 0
    peak: float = 0.0


@dataclass(frozen=True)
class Transition:
    """A THRESHOLD_EVENT without sensor_id and site."""
    timestamp: int
    temperature_threshold: float
    average_transgression: float
    max_transgression: float
    exceeded_for_ms: int
    first_transgression: int
    last_transgression: int
    is_first: bool
    is_last: bool


def advance(state: SensorState, timestamp_ms: int, celsius: float,
            limits: Limits) -> tuple[SensorState, Transition | None]:
    """Apply one reading; return the new state and the transition it caused, if any."""
    if state.newest_ms is not None and timestamp_ms < state.newest_ms:
        return state, None                                    # late: see the module docstring
    state = replace(state, newest_ms=timestamp_ms)
    if not state.exceeding:
        if celsius <= limits.threshold:
            return state, None
        state = replace(state, exceeding=True, threshold=limits.threshold, hysteresis=limits.hysteresis,
                        first_ms=timestamp_ms, last_ms=timestamp_ms, total=celsius, count=1, peak=celsius)
        return state, _event(state, timestamp_ms, is_first=True)
    if celsius < state.threshold - state.hysteresis:
        event = _event(state, timestamp_ms, is_first=False)
        return SensorState(newest_ms=timestamp_ms), event
    return replace(state, total=state.total + celsius, count=state.count + 1, peak=max(state.peak, celsius),
                   last_ms=timestamp_ms if celsius > state.threshold else state.last_ms), None


def _event(state: SensorState, timestamp_ms: int, is_first: bool) -> Transition:
    return Transition(
        timestamp=timestamp_ms,
        temperature_threshold=state.threshold,
        average_transgression=state.total / state.count,
        max_transgression=state.peak,
        exceeded_for_ms=timestamp_ms - state.first_ms,
        first_transgression=state.first_ms,
        last_transgression=state.last_ms,
        is_first=is_first,
        is_last=not is_first,
    )
