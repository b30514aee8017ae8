"""Carrying the threshold detector over from its per-sensor checkpoint (iot_jobs.legacy_state): the offset
log it resumes from, and the state it starts from, read from a real per-sensor checkpoint on a local
SparkSession (conftest.py)."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "spark"))

pyspark = pytest.importorskip("pyspark")

from iot_jobs import detector, legacy_state  # noqa: E402
from iot_jobs.hysteresis import Limits, SensorState, ThresholdConfig, advance  # noqa: E402
from pyspark.sql import Row  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.streaming import StatefulProcessor  # noqa: E402

from tests.unit.spark.test_spark_jobs import READING_DDL, REGISTRATION_DDL, FileStream  # noqa: E402

CONFIG = ThresholdConfig(Limits(30.0, 2.0), {"oven": Limits(200.0, 10.0)})
TTL_MS = 3_600_000


def _offset_log(checkpoint: Path, batch: int, *sources: str, committed: bool = True) -> None:
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(['v1', '{"batchWatermarkMs":0}', *sources]))
    if committed:
        (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_the_readings_resume_where_the_last_committed_batch_of_the_per_sensor_query_ended(tmp_path):
    legacy = tmp_path / "threshold-events"
    _offset_log(legacy, 3, '{"temperature-data":{"0":10,"1":7}}', '{"sensor-registration":{"0":2}}')
    _offset_log(legacy, 4, '{"temperature-data":{"0":12,"1":9}}', '{"sensor-registration":{"0":2}}',
                committed=False)                     # planned, never committed: read again
    (legacy / "commits" / ".3.crc").write_text("")
    assert legacy_state.committed_batch(legacy) == 3
    offsets = legacy_state.batch_end_offsets(legacy, 3)
    assert legacy_state.readings_start(offsets, "temperature-data", "") == {"temperature-data": {"0": 10, "1": 7}}
    pattern = legacy_state.readings_start(offsets, "", r"[a-z-]+\.temperature-data|temperature-data")
    assert pattern == {"temperature-data": {"0": 10, "1": 7}}
    assert legacy_state.readings_start(offsets, "other", "") is None


def test_nothing_is_carried_over_without_a_per_sensor_commit_or_once_the_new_query_committed(tmp_path, spark):
    new = tmp_path / detector.CHECKPOINT
    assert legacy_state.carry_over(spark, str(new), "temperature-data", "", TTL_MS) == (None, None)
    _offset_log(tmp_path / "threshold-events", 0, '{"temperature-data":{"0":1}}')
    _offset_log(new, 0, '{"temperature-data":{"0":1}}')
    assert legacy_state.carry_over(spark, str(new), "temperature-data", "", TTL_MS) == (None, None)
    with pytest.raises(RuntimeError, match="no source reads only readings"):
        legacy_state.carry_over(spark, str(tmp_path / "other"), "readings", "", TTL_MS)


class PerSensorProcessor(StatefulProcessor):
    """The detector's operator before the buckets (keyed by sensor_id; state variables `episode` with a TTL
    and `sensor_type`), to write a per-sensor checkpoint as deployed sites have one."""

    def init(self, handle) -> None:
        self.episode = handle.getValueState("episode", detector.STATE_DDL, TTL_MS)
        self.sensor_type = handle.getValueState("sensor_type", "sensor_type_id STRING")

    def handleInputRows(self, key, rows: Iterator[Row], timerValues) -> Iterator[Row]:
        (sensor_id,) = key
        rows = sorted(rows, key=lambda r: (r.kind, r.partition, r.offset))
        for row in rows:
            if row.kind == detector.KIND_REGISTRATION:
                self.sensor_type.update((row.sensor_type_id,))
        readings = [(r.timestamp, r.celsius, r.site) for r in rows if r.kind == detector.KIND_READING]
        if not readings:
            return
        stored_type = self.sensor_type.get()
        stored = self.episode.get()
        state = SensorState(*stored) if stored is not None else SensorState()
        state, events = detector.run_sequence(sensor_id, state, readings, stored_type[0] if stored_type else None,
                                              CONFIG)
        self.episode.update(tuple(state.__dict__.values()))
        for event in events:
            yield detector.EVENT_ROW(*(event[name] for name in detector.EVENT_FIELDS))

    def close(self) -> None:
        pass


def _run(events, name: str, checkpoint: Path, feed) -> list[tuple]:
    query = (events.writeStream.format("memory").queryName(name).outputMode("append")
             .option("checkpointLocation", str(checkpoint)).start())
    try:
        feed()
        query.processAllAvailable()
    finally:
        query.stop()
    return sorted(tuple(r) for r in events.sparkSession.sql(f"select * from {name}").collect())


def test_the_bucketed_detector_goes_on_from_the_per_sensor_state(spark, tmp_path):
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")   # as the job does
    registry = FileStream(spark, tmp_path / "registry", REGISTRATION_DDL)
    registrations = detector.registration_rows(
        registry.frame.select(F.col("key").cast("binary").alias("key"), F.col("value").cast("binary").alias("value"),
                              "partition", "offset"))
    registry.put([{"key": "oven-1", "partition": 0, "offset": 0, "value": json.dumps(
        {"sensor_id": "oven-1", "name": "Oven", "device_id": "d1", "sensor_type_id": "oven"})}])
    first = [("a", 1000, 35.0), ("c", 1000, 40.0), ("oven-1", 1000, 150.0), ("b", 1000, 20.0)]
    second = [("a", 2000, 27.0), ("c", 2000, 39.0), ("oven-1", 2000, 201.0), ("d", 2000, 31.0)]

    def rows(batch, start):
        return [{"sensor_id": s, "site": "site-a", "timestamp": ts, "celsius": c, "partition": 0, "offset": start + i}
                for i, (s, ts, c) in enumerate(batch)]

    # Before: the per-sensor operator, as deployed, sees the first batch.
    old_source = FileStream(spark, tmp_path / "old", READING_DDL)
    old_rows = detector.reading_rows(old_source.frame).unionByName(registrations)
    old_events = old_rows.groupBy("sensor_id").transformWithState(
        PerSensorProcessor(), detector.EVENT_DDL, "Append", "ProcessingTime")
    legacy = tmp_path / "checkpoints" / legacy_state.LEGACY_QUERY
    before = _run(old_events, "before", legacy, lambda: old_source.put(rows(first, 0)))
    assert sorted((e[0], e[9]) for e in before) == [("a", True), ("c", True)]

    # After: the bucketed operator starts from that state, on a checkpoint of its own.
    initial = legacy_state.initial_state(spark, legacy, TTL_MS)
    carried = {r.sensor_id: r for r in initial.collect()}
    assert set(carried) == {"a", "b", "c", "oven-1"} and carried["oven-1"].sensor_type == "oven"
    assert carried["a"].exceeding and carried["a"].first_ms == 1000 and carried["a"].seen_ms > 0
    new_source = FileStream(spark, tmp_path / "new", READING_DDL)
    new_events = detector.detect_thresholds(new_source.frame, None, CONFIG, TTL_MS, initial)
    after = _run(new_events, "after", tmp_path / "checkpoints" / detector.CHECKPOINT,
                 lambda: new_source.put(rows(second, len(first))))

    # The same events as the state machine run over both batches without a break.
    states, expected = {}, []
    for sensor, ts, celsius in first + second:
        limits = CONFIG.limits_for("oven" if sensor == "oven-1" else None)
        states[sensor], event = advance(states.get(sensor, SensorState()), ts, celsius, limits)
        if event and ts == 2000:
            expected.append((sensor, "site-a", *event.__dict__.values()))
    assert after == sorted(expected)
    assert sorted((e[0], e[9]) for e in after) == [("a", False), ("d", True), ("oven-1", True)]
