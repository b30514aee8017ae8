"""The detector's state per bucket of sensors (iot_jobs.detector.apply_bucket), without a SparkSession:
what one micro-batch of one bucket stores and emits. The same logic through real Spark, across
micro-batches, is test_spark_jobs.py::test_detector_state_machine_through_transform_with_state_..."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "spark"))

pytest.importorskip("pyspark")

from iot_jobs import detector  # noqa: E402
from iot_jobs.hysteresis import Limits, SensorState, ThresholdConfig, advance  # noqa: E402
from pyspark.sql import Row  # noqa: E402

CONFIG = ThresholdConfig(Limits(30.0, 2.0), {"oven": Limits(200.0, 10.0)})
TTL = 60_000
ROW = Row(*detector.INPUT_COLUMNS)
_offsets = iter(range(10**9))


def reading(sensor: str, ts: int, celsius: float, site: str = "site-a") -> Row:
    return ROW(sensor, detector.KIND_READING, 0, next(_offsets), ts, celsius, site, None)


def registration(sensor: str, sensor_type: str | None) -> Row:
    return ROW(sensor, detector.KIND_REGISTRATION, 0, next(_offsets), None, None, None, sensor_type)


def by_sensor(stored: list[tuple]) -> dict[str, tuple]:
    return {entry[0]: entry for entry in stored}


def test_each_sensor_of_a_bucket_keeps_its_own_episode_across_batches():
    stored, events = detector.apply_bucket([], [reading("a", 1, 31.0), reading("b", 1, 25.0)], 1_000, TTL, CONFIG)
    assert [(e["sensor_id"], e["is_first"]) for e in events] == [("a", True)]
    stored, events = detector.apply_bucket(stored, [reading("b", 2, 35.0), reading("a", 2, 27.0)], 2_000, TTL,
                                           CONFIG)
    assert sorted((e["sensor_id"], e["is_first"], e["exceeded_for_ms"]) for e in events) == [
        ("a", False, 1), ("b", True, 0)]
    assert by_sensor(stored)["b"][2] == 2_000                      # seen_ms: the batch's processing time
    assert by_sensor(stored)["a"][4] is False and by_sensor(stored)["b"][4] is True   # exceeding


def test_registrations_apply_before_readings_and_a_tombstone_restores_the_default():
    stored, events = detector.apply_bucket([], [reading("o", 1, 150.0), registration("o", "oven")], 0, TTL, CONFIG)
    assert events == []                                             # 150 C is below an oven's 200 C
    assert by_sensor(stored)["o"][1] == "oven"
    stored, events = detector.apply_bucket(stored, [registration("o", None), reading("o", 2, 150.0)], 0, TTL,
                                           CONFIG)
    assert [e["temperature_threshold"] for e in events] == [30.0]
    assert by_sensor(stored)["o"][1] is None


def test_a_registered_sensor_without_readings_is_kept_and_one_with_neither_is_dropped():
    stored, _ = detector.apply_bucket([], [registration("r", "oven"), registration("x", None)], 0, TTL, CONFIG)
    assert list(by_sensor(stored)) == ["r"]
    assert by_sensor(stored)["r"][2:] == (None,) * (1 + detector.STATE_FIELDS)


def test_the_ttl_drops_an_open_episode_but_keeps_the_sensor_type():
    stored, _ = detector.apply_bucket([], [registration("o", "oven"), reading("o", 1, 250.0),
                                           reading("d", 1, 40.0)], 1_000, TTL, CONFIG)
    # Within the TTL the episodes stay open: the next hot readings open nothing new.
    kept, events = detector.apply_bucket(stored, [], 1_000 + TTL, TTL, CONFIG)
    assert events == [] and {e[0]: e[4] for e in kept} == {"o": True, "d": True}
    # Past it, "d" is gone and "o" keeps only its type: a hot reading opens a new episode with the oven's limit.
    expired, events = detector.apply_bucket(stored, [], 1_001 + TTL, TTL, CONFIG)
    assert events == [] and list(by_sensor(expired)) == ["o"] and by_sensor(expired)["o"][2] is None
    _, events = detector.apply_bucket(expired, [reading("o", 2, 250.0)], 1_002 + TTL, TTL, CONFIG)
    assert [(e["is_first"], e["temperature_threshold"]) for e in events] == [(True, 200.0)]


def test_batches_give_the_same_events_as_the_state_machine_reading_by_reading():
    rng = random.Random(7)
    sensors = [f"s{i}" for i in range(20)]
    stream = [(rng.choice(sensors), t, rng.choice([20.0, 29.0, 31.0, 40.0])) for t in range(2_000)]
    stored, got, position = [], [], 0
    while position < len(stream):
        size = rng.randint(1, 200)
        batch = [reading(s, ts, c) for s, ts, c in stream[position:position + size]]
        position += size
        stored, events = detector.apply_bucket(stored, batch, 0, TTL, CONFIG)
        got += [(e["sensor_id"], e["timestamp"], e["is_first"]) for e in events]
    states: dict[str, SensorState] = {}
    expected = []
    for sensor, ts, celsius in stream:
        states[sensor], event = advance(states.get(sensor, SensorState()), ts, celsius, CONFIG.default)
        if event:
            expected.append((sensor, ts, event.is_first))
    assert sorted(got) == sorted(expected) and expected


def test_sensors_spread_over_the_buckets(spark):
    from pyspark.sql import functions as F
    frame = spark.range(5_000).select(F.concat(F.lit("sensor-"), F.col("id").cast("string")).alias("sensor_id"))
    counts = [r[1] for r in frame.groupBy(detector.sensor_bucket(F.col("sensor_id"))).count().collect()]
    assert len(counts) == detector.BUCKETS
    assert max(counts) < 2 * 5_000 / detector.BUCKETS
