"""The fault suite's count of the threshold events a device's hot readings imply (tooling/lab/chaos.py,
Device.transitions): all acknowledged readings, or only those the site stored when a case may lose some."""
from __future__ import annotations

from types import SimpleNamespace

from tooling.lab import chaos
from tooling.lab.chaos import Device

# One hot sensor: above 30 opens an event, below 28 closes it (spark/iot_jobs/hysteresis.py).
READINGS = {"s-hot0": [(1, 25.0), (2, 31.0), (3, 27.0), (4, 32.0), (5, 26.0)]}


def _transitions(kept=None) -> int:
    return Device.transitions(SimpleNamespace(hot_readings=READINGS), kept)


def test_every_acknowledged_reading_counts():
    assert _transitions() == 4


def test_a_lost_reading_takes_its_events_away():
    """Reading 4 lost with Mosquitto: the detector saw 31, 27, 26: one event opened and closed."""
    assert _transitions({"s-hot0": {1, 2, 3, 5}}) == 2


def test_an_older_reading_after_a_newer_one_is_skipped():
    late = {"s-hot0": [(2, 31.0), (1, 20.0), (3, 29.0)]}
    assert Device.transitions(SimpleNamespace(hot_readings=late)) == 1


def test_kafkas_order_decides_when_readings_arrive_out_of_order():
    """node-power-cut-mqtt: readings the dead broker had handed to a bridge reach Kafka after newer ones the
    device sent again through the new broker; the detector ignores them, so their events are not expected."""
    arrived = {"s-hot0": [(1, 25.0), (2, 31.0), (5, 26.0), (3, 27.0), (4, 32.0)]}
    assert chaos.transitions(arrived) == 2
    assert chaos.transitions({"s-hot0": sorted(arrived["s-hot0"])}) == 4
