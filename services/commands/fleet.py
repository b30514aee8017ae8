"""A simulated fleet: device/sensor ids and the thesis' temperature formula.

Shared by the simulator (which publishes readings) and the registrar (which
registers the same devices, sensors and sensor types), so their ids agree.

Temperature model (after the seed thesis): each sensor starts at `base` and
approaches `target` exponentially with time constant `tau_s`; Gaussian noise
with standard deviation `noise` is added to every reading, and with probability
`spike_probability` a reading jumps by `spike_magnitude` (sign random). "Hot"
sensors have their target raised by `hot_offset`, so they cross thresholds.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from services.common import contracts, names


@dataclass(frozen=True)
class Profile:
    base: float = 20.0
    target: float = 24.0
    tau_s: float = 60.0
    noise: float = 0.3
    spike_probability: float = 0.001
    spike_magnitude: float = 15.0
    hot_offset: float = 60.0
    unit: str = "C"

    def __post_init__(self) -> None:
        if self.unit not in contracts.UNITS:
            raise ValueError(f"unknown unit '{self.unit}' (expected C, F or K)")
        if self.tau_s <= 0:
            raise ValueError("tau must be positive")
        if not 0.0 <= self.spike_probability <= 1.0:
            raise ValueError("spike probability must be between 0 and 1")


@dataclass(frozen=True)
class Sensor:
    site: str
    device_id: str
    sensor_id: str
    hot: bool

    @property
    def mqtt_topic(self) -> str:
        return names.MQTT_READINGS.format(site=self.site, device_id=self.device_id, sensor_id=self.sensor_id)


def sensor_type_id(unit: str) -> str:
    return f"temperature-{unit.lower()}"


def build_fleet(site: str, devices: int, sensors_per_device: int, hot_sensors: int = 0) -> list[Sensor]:
    """Devices `<site>-dev-<n>` with sensors `<site>-dev-<n>-s<m>`; the first `hot_sensors` run hot."""
    if devices < 1 or sensors_per_device < 1:
        raise ValueError("need at least one device with one sensor")
    sensors = []
    for d in range(1, devices + 1):
        device_id = f"{site}-dev-{d}"
        for s in range(1, sensors_per_device + 1):
            sensors.append(Sensor(site, device_id, f"{device_id}-s{s}", hot=len(sensors) < hot_sensors))
    return sensors


def temperature(profile: Profile, elapsed_s: float, hot: bool, rng: random.Random) -> float:
    """One reading, in degrees of `profile.unit`, `elapsed_s` seconds after the sensor started."""
    target = profile.target + (profile.hot_offset if hot else 0.0)
    celsius = target + (profile.base - target) * math.exp(-elapsed_s / profile.tau_s)
    celsius += rng.gauss(0.0, profile.noise)
    if rng.random() < profile.spike_probability:
        celsius += profile.spike_magnitude * rng.choice((-1.0, 1.0))
    return round(contracts.from_celsius(celsius, profile.unit), 3)


def reading(sensor: Sensor, profile: Profile, elapsed_s: float, now_ms: int, rng: random.Random) -> dict:
    return {"sensor_id": sensor.sensor_id, "timestamp": now_ms,
            "temperature": temperature(profile, elapsed_s, sensor.hot, rng), "unit": profile.unit}


def registrations(sensors: list[Sensor], unit: str) -> dict[str, list[dict]]:
    """Registration records for a fleet, by Kafka topic, each valid against its contract."""
    type_id = sensor_type_id(unit)
    devices = {s.device_id: s for s in sensors}
    records = {
        names.SENSOR_TYPE_REGISTRATION: [contracts.SENSOR_TYPE.validate({
            "sensor_type_id": type_id, "name": f"Temperature ({unit})",
            "description": f"Temperature sensor reporting degrees {unit}", "unit": unit})],
        names.DEVICE_REGISTRATION: [contracts.DEVICE.validate({
            "device_id": device_id, "name": f"Device {device_id}",
            "description": "simulated device", "location": f"{s.site} hall 1"})
            for device_id, s in devices.items()],
        names.SENSOR_REGISTRATION: [contracts.SENSOR.validate({
            "sensor_id": s.sensor_id, "name": f"Sensor {s.sensor_id}", "description": "simulated sensor",
            "device_id": s.device_id, "sensor_type_id": type_id}) for s in sensors],
    }
    return records
