"""Spark jobs' transforms on a local SparkSession: parsing, dead letters, the
stateful detector over several micro-batches, rollups with late data, notifier join.

The SparkSession comes from conftest.py; streaming tests feed JSON files one
micro-batch at a time into a file source.
"""
from __future__ import annotations

import json
import sys
from functools import reduce
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "spark"))

pyspark = pytest.importorskip("pyspark")

from iot_jobs import detector, notifier, readings, rollups  # noqa: E402
from iot_jobs.hysteresis import Limits, SensorState, ThresholdConfig, advance  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from services.common import contracts, names  # noqa: E402
from services.common.dead_letter import CONTRACT_VIOLATION, DLQ_VALUE_LIMIT, dead_letter  # noqa: E402
from services.common.site import resolve_site  # noqa: E402

KAFKA_DDL = ("key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, "
             "topic STRING, partition INT, offset BIGINT")


def kafka_rows(spark, values, topic="temperature-data", headers=None):
    rows = [(None if v is None else (v if isinstance(v, bytes) else json.dumps(v).encode()),
             headers, topic, 0, i) for i, v in enumerate(values)]
    frame = spark.createDataFrame(rows, "value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, "
                                        "topic STRING, partition INT, offset BIGINT")
    return frame.select(F.lit(b"k").alias("key"), "*")


class FileStream:
    """A directory fed one JSON-lines file per micro-batch."""

    def __init__(self, spark, path: Path, ddl: str) -> None:
        path.mkdir()
        self.path, self.count = path, 0
        self.frame = spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).json(str(path))

    def put(self, rows: list[dict]) -> None:
        target = self.path / f"{self.count:05d}.json"
        target.with_suffix(".tmp").write_text("".join(json.dumps(r) + "\n" for r in rows))
        target.with_suffix(".tmp").rename(target)    # the file source must never see a partial file
        self.count += 1


# ------------------------------------------------------------------ parsing

def test_celsius_column_matches_the_contract_conversion(spark):
    cases = [(32.0, "F"), (212.0, "F"), (-40.0, "F"), (98.6, "F"), (273.15, "K"), (0.0, "K"), (21.5, "C")]
    frame = spark.createDataFrame(cases, "temperature DOUBLE, unit STRING")
    got = frame.select(readings.celsius(F.col("temperature"), F.col("unit")).alias("c")).collect()
    assert [row.c for row in got] == pytest.approx([contracts.to_celsius(v, u) for v, u in cases])


def test_parse_readings_takes_site_from_header_else_setting_and_flags_every_bad_record(spark):
    good = {"sensor_id": "s1", "timestamp": 1000, "temperature": 212.0, "unit": "F"}
    values = [good, {**good, "unit": "K", "temperature": 300.15}, b"{not json", None,
              {"sensor_id": "s1", "timestamp": 1000, "temperature": 20.0},
              {**good, "unit": "R"}, {**good, "timestamp": "soon"}, {**good, "sensor_id": ""}, {"other": 1}]
    headed = kafka_rows(spark, values[:1], headers=[("site", b"site-b"), ("ingest_ms", b"5")])
    plain = kafka_rows(spark, values[1:])
    parsed = readings.parse_readings(headed.unionByName(plain), default_site="site-a").collect()
    assert [(r.site, r.celsius, r.error) for r in parsed[:2]] == [("site-b", 100.0, None), ("site-a", 27.0, None)]
    assert [r.error for r in parsed[2:]] == [
        "value is not a temperature-reading JSON object",
        "empty value (expected a temperature-reading JSON object)",
        "missing field 'unit' (expected C, F, K)",
        "unknown unit 'R' (expected C, F, K)",
        "missing or invalid field 'timestamp' (integer epoch ms)",
        "missing or empty field 'sensor_id' (string)",
        "value is not a temperature-reading JSON object",
    ]


def test_dead_letters_keep_original_bytes_and_headers_and_add_reason(spark):
    records = kafka_rows(spark, [b"{not json", {"sensor_id": "s1", "timestamp": 1, "temperature": 1.0,
                                                "unit": "C"}], headers=[("site", b"site-a")])
    dead = readings.dead_letters(readings.parse_readings(records, "site-a"), "dead-letter").collect()
    assert len(dead) == 1
    assert bytes(dead[0].value) == b"{not json" and bytes(dead[0].key) == b"k" and dead[0].topic == "dead-letter"
    headers = {h.key: bytes(h.value).decode() for h in dead[0].headers}
    assert headers["site"] == "site-a"
    assert headers[names.HEADER_DLQ_SOURCE] == "temperature-data"
    assert headers[names.HEADER_DLQ_REASON] == "contract_violation: value is not a temperature-reading JSON object"
    assert int(headers[names.HEADER_DLQ_TIME_MS]) > 1_600_000_000_000
    assert headers[names.HEADER_DLQ_OFFSET] == "0:0"


def test_dead_letters_are_what_the_python_builder_makes_of_the_same_records(spark):
    """Spark builds dead letters as columns; they must equal services.common.dead_letter's (but for the time)."""
    big = b"{" + b"x" * (DLQ_VALUE_LIMIT + 5)
    old = [("site", b"site-a"), (names.HEADER_DLQ_REASON, b"from an earlier round")]
    rows = [(b"k", big, old, "temperature-data", 3, 17), (None, b"{nope", None, "temperature-data", 1, 2)]
    dead = readings.dead_letters(readings.parse_readings(spark.createDataFrame(rows, KAFKA_DDL), "site-a"),
                                 "dead-letter").collect()

    def shape(key, value, headers):
        return (bytes(key), bytes(value), [(k, bytes(v)) for k, v in headers if k != names.HEADER_DLQ_TIME_MS])
    expected = [dead_letter("dead-letter", topic, key, value, CONTRACT_VIOLATION,
                            "value is not a temperature-reading JSON object", 0, headers, partition, offset)
                for key, value, headers, topic, partition, offset in rows]
    assert {r.topic for r in dead} == {"dead-letter"}
    assert sorted(shape(r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in dead) == sorted(
        shape(d.key, d.value, d.headers) for d in expected)


def test_parse_readings_site_follows_the_one_rule_topic_prefix_then_header_then_setting(spark):
    good = {"sensor_id": "s1", "timestamp": 1000, "temperature": 20.0, "unit": "C"}
    cases = [("site-m.temperature-data", [("site", b"site-h")]), ("site-m.temperature-data", None),
             ("site-m.temperature-data", [("site", b"")]), ("temperature-data", None), (".temperature-data", None),
             ("temperature-data", [("site", b"site-h")])]
    frames = [kafka_rows(spark, [good], topic=topic, headers=headers) for topic, headers in cases]
    parsed = readings.parse_readings(reduce(lambda a, b: a.unionByName(b), frames), default_site="site-a")
    got = sorted((r.topic, r.site) for r in parsed.collect())
    expected = [(topic, resolve_site(header=headers[0][1].decode() if headers else None, topic=topic,
                                     default="site-a")) for topic, headers in cases]
    assert got == sorted(expected)
    assert sorted(site for _, site in expected) == ["site-a", "site-a", "site-h", "site-m", "site-m", "site-m"]


# ------------------------------------------------------------------ detector

READING_DDL = "sensor_id STRING, site STRING, timestamp BIGINT, celsius DOUBLE, partition INT, offset BIGINT"
REGISTRATION_DDL = "key STRING, value STRING, partition INT, offset BIGINT"
CONFIG = ThresholdConfig(Limits(30.0, 2.0), {"oven": Limits(200.0, 10.0)})


def test_detector_state_machine_through_transform_with_state_across_micro_batches(spark, tmp_path):
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")   # as the job does
    source = FileStream(spark, tmp_path / "readings", READING_DDL)
    registry = FileStream(spark, tmp_path / "registry", REGISTRATION_DDL)
    registrations = detector.registration_rows(
        registry.frame.select(F.col("key").cast("binary").alias("key"), F.col("value").cast("binary").alias("value"),
                              "partition", "offset"))
    events = detector.detect_thresholds(source.frame, registrations, CONFIG, ttl_ms=3_600_000)
    query = (events.writeStream.format("memory").queryName("threshold_events").outputMode("append")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    # Three sensors interleaved; "oven-1" is registered as an oven (threshold 200 C).
    batches = [
        [("a", 1000, 25.0), ("b", 1000, 31.0), ("oven-1", 1000, 150.0), ("a", 2000, 31.0), ("a", 3000, 29.0)],
        [("b", 2000, 28.5), ("a", 4000, 28.5), ("oven-1", 2000, 201.0), ("a", 2500, 10.0),   # a: late, ignored
         ("b", 3000, 27.0), ("b", 4000, 33.0)],                                              # b: leave, re-enter
        [("a", 5000, 27.9), ("oven-1", 3000, 195.0), ("oven-1", 4000, 189.0), ("b", 5000, 20.0)],
    ]
    registry.put([{"key": "oven-1", "value": json.dumps({"sensor_id": "oven-1", "name": "Oven", "device_id": "d1",
                                                         "sensor_type_id": "oven"}), "partition": 0, "offset": 0},
                  {"key": "a", "value": json.dumps({"sensor_id": "a", "name": "A", "device_id": "d1",
                                                    "sensor_type_id": "oven"}), "partition": 0, "offset": 1},
                  {"key": "a", "value": None, "partition": 0, "offset": 2}])      # tombstone: a uses the default
    offset = 0
    try:
        for batch in batches:
            rows = []
            for sensor, ts, celsius in batch:
                rows.append({"sensor_id": sensor, "site": "site-a", "timestamp": ts, "celsius": celsius,
                             "partition": 0, "offset": offset})
                offset += 1
            source.put(rows)
            query.processAllAvailable()
        got = sorted(tuple(r) for r in spark.sql("select * from threshold_events").collect())
    finally:
        query.stop()

    # Same answer as the pure state machine run reading by reading.
    states, expected = {}, []
    for batch in batches:
        for sensor, ts, celsius in batch:
            limits = CONFIG.limits_for("oven" if sensor == "oven-1" else None)
            states[sensor], event = advance(states.get(sensor, SensorState()), ts, celsius, limits)
            if event:
                expected.append((sensor, "site-a", *event.__dict__.values()))
    assert got == sorted(expected)
    assert [(s, ts, first) for s, _, ts, *_, first, _last in sorted(got, key=lambda e: (e[0], e[2]))] == [
        ("a", 2000, True), ("a", 5000, False),
        ("b", 1000, True), ("b", 3000, False), ("b", 4000, True), ("b", 5000, False),
        ("oven-1", 2000, True), ("oven-1", 4000, False)]


# ------------------------------------------------------------------ rollups

def test_rollups_emit_each_minute_once_after_the_watermark_and_drop_late_readings(spark, tmp_path):
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "true")   # windows close without new data
    source = FileStream(spark, tmp_path / "readings", READING_DDL)
    query = (rollups.rollup_1m(source.frame, "10 seconds").writeStream.format("memory").queryName("rollups")
             .outputMode("append").option("checkpointLocation", str(tmp_path / "checkpoint")).start())

    def reading(sensor, second, celsius):
        return {"sensor_id": sensor, "site": "site-a", "timestamp": second * 1000, "celsius": celsius,
                "partition": 0, "offset": 0}
    try:
        source.put([reading("s1", 5, 20.0), reading("s1", 50, 22.0), reading("s2", 30, -5.0),
                    reading("s1", 70, 30.0)])
        query.processAllAvailable()
        source.put([reading("s1", 150, 25.0)])          # watermark -> 140 s: minutes 0 and 1 close
        query.processAllAvailable()
        source.put([reading("s1", 30, 99.0),             # late for a closed window: dropped
                    reading("s1", 155, 26.0)])
        query.processAllAvailable()
        got = sorted(tuple(r) for r in spark.sql("select * from rollups").collect())
    finally:
        query.stop()
    assert got == [("s1", "site-a", 0, 60_000, 2, 21.0, 20.0, 22.0),
                   ("s1", "site-a", 60_000, 120_000, 1, 30.0, 30.0, 30.0),
                   ("s2", "site-a", 0, 60_000, 1, -5.0, -5.0, -5.0)]


# ------------------------------------------------------------------ notifier

def registry_records(spark, rows):
    """rows: (topic, key, value dict or None for a tombstone), offsets in order."""
    data = [(topic, key.encode(), None if value is None else json.dumps(value).encode(), 0, i)
            for i, (topic, key, value) in enumerate(rows)]
    return spark.createDataFrame(data, "topic STRING, key BINARY, value BINARY, partition INT, offset BIGINT")


def test_latest_registration_wins_and_tombstone_removes_it(spark):
    records = registry_records(spark, [
        ("site-a.sensor-registration", "s1", {"sensor_id": "s1", "name": "old", "device_id": "d1",
                                              "sensor_type_id": "t"}),
        ("site-a.sensor-registration", "s1", {"sensor_id": "s1", "name": "new", "device_id": "d1",
                                              "sensor_type_id": "t"}),
        ("site-b.sensor-registration", "s1", {"sensor_id": "s1", "name": "b", "device_id": "d9",
                                              "sensor_type_id": "t"}),
        ("site-a.sensor-registration", "s2", {"sensor_id": "s2", "name": "gone", "device_id": "d1",
                                              "sensor_type_id": "t"}),
        ("site-a.sensor-registration", "s2", None),
        ("sensor-registration", "s3", {"sensor_id": "s3", "name": "local", "device_id": "d1",
                                       "sensor_type_id": "t"}),
    ])
    got = sorted((r.site, r.sensor_id, r.name) for r in
                 notifier.latest_registrations(records, contracts.SENSOR, "datacenter").collect())
    assert got == [("datacenter", "s3", "local"), ("site-a", "s1", "new"), ("site-b", "s1", "b")]


def event(sensor_id, site, is_first, **fields):
    base = {"sensor_id": sensor_id, "site": site, "timestamp": 1_700_000_125_000, "temperature_threshold": 30.0,
            "average_transgression": 33.25, "max_transgression": 35.0, "exceeded_for_ms": 125_000,
            "first_transgression": 1_700_000_000_000, "last_transgression": 1_700_000_120_000,
            "is_first": is_first, "is_last": not is_first}
    return {**base, **fields}


def test_notifier_announces_a_repeated_event_once(spark, tmp_path):
    """A detector that crashed before committing replays its batch: the same events come again
    (same site, sensor, time, kind), in a later micro-batch or twice in one, and across a
    restart of the notifier itself. Each is announced once; other sites' and kinds' are not dropped."""
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")   # as the job does
    source = FileStream(spark, tmp_path / "events", "topic STRING, value STRING")
    headers = F.lit(None).cast("array<struct<key: string, value: binary>>")
    announced = []

    def start():     # foreachBatch, as the job: the memory sink cannot restart from a checkpoint
        records = source.frame.select("topic", F.col("value").cast("binary").alias("value"), headers.alias("headers"))
        events = notifier.announce_once(notifier.parse_events(records, "datacenter"), ttl_ms=3_600_000)
        return (events.writeStream.foreachBatch(lambda frame, _batch: announced.extend(frame.collect()))
                .option("checkpointLocation", str(tmp_path / "checkpoint")).start())

    def put(*events):
        source.put([{"topic": f"{e['site']}.temperature-threshold-events", "value": json.dumps(e)} for e in events])

    opened = event("s1", "site-a", True, exceeded_for_ms=0)
    closed = event("s1", "site-a", False, timestamp=1_700_000_200_000)
    other_site = event("s1", "site-b", True, exceeded_for_ms=0)
    query = start()
    try:
        put(opened, event("s2", "site-a", False))
        query.processAllAvailable()
        put(opened, closed, other_site)          # opened: the replayed batch
        query.processAllAvailable()
        put(closed, closed)                      # twice within one micro-batch
        query.processAllAvailable()
        query.stop()
        query = start()                          # the notifier restarted: what it announced is in its checkpoint
        put(opened, other_site, event("s2", "site-a", True, timestamp=1_700_000_300_000, exceeded_for_ms=0))
        query.processAllAvailable()
    finally:
        query.stop()
    got = sorted((r.site, r.sensor_id, r.timestamp, r.is_last) for r in announced)
    assert got == sorted([
        ("site-a", "s1", 1_700_000_125_000, False), ("site-a", "s1", 1_700_000_200_000, True),
        ("site-a", "s2", 1_700_000_125_000, True), ("site-a", "s2", 1_700_000_300_000, False),
        ("site-b", "s1", 1_700_000_125_000, False)])


def test_notifier_joins_latest_registrations_and_says_when_one_is_missing(spark):
    sensors = registry_records(spark, [
        ("site-a.sensor-registration", "s1", {"sensor_id": "s1", "name": "Boiler probe", "device_id": "d1",
                                              "sensor_type_id": "t"}),
        ("site-a.sensor-registration", "s2", {"sensor_id": "s2", "name": "Loose probe", "device_id": "d404",
                                              "sensor_type_id": "t"})])
    devices = registry_records(spark, [
        ("site-a.device-registration", "d1", {"device_id": "d1", "name": "Boiler 3", "location": "Hall 2"})])
    events_kafka = spark.createDataFrame(
        [("site-a.temperature-threshold-events", json.dumps(e).encode(), None) for e in (
            event("s1", "site-a", False), event("s1", "site-a", True, exceeded_for_ms=0, max_transgression=31.0),
            event("s2", "site-a", False, exceeded_for_ms=4_000_000),
            event("s9", "site-a", False, exceeded_for_ms=900))],
        "topic STRING, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
    events = notifier.parse_events(events_kafka, "datacenter")
    frame = notifier.notifications(events, notifier.latest_registrations(sensors, contracts.SENSOR, "dc"),
                                   notifier.latest_registrations(devices, contracts.DEVICE, "dc"))
    rows = frame.collect()
    texts = sorted(r.text for r in rows)
    assert texts == sorted([
        "[site-a] Sensor 'Boiler probe' (s1) on device 'Boiler 3' (d1) at Hall 2 stopped exceeding 30.0 °C at "
        "2023-11-14 22:15:25 UTC after 2 min 5 s: average 33.3 °C, maximum 35.0 °C.",
        "[site-a] Sensor 'Boiler probe' (s1) on device 'Boiler 3' (d1) at Hall 2 started exceeding 30.0 °C at "
        "2023-11-14 22:15:25 UTC (reading 31.0 °C).",
        "[site-a] Sensor 'Loose probe' (s2) on device d404 (not registered) stopped exceeding 30.0 °C at "
        "2023-11-14 22:15:25 UTC after 1 h 6 min: average 33.3 °C, maximum 35.0 °C.",
        "[site-a] Sensor s9 (not registered) on an unknown device stopped exceeding 30.0 °C at "
        "2023-11-14 22:15:25 UTC after 0.9 s: average 33.3 °C, maximum 35.0 °C.",
    ])
    by_sensor = {(r.sensor_id, r.state): r for r in rows}
    assert by_sensor[("s1", "stopped")].asDict() | {"text": ""} == {
        "sensor_id": "s1", "site": "site-a", "text": "", "state": "stopped", "sensor_name": "Boiler probe",
        "device_id": "d1", "device_name": "Boiler 3", "location": "Hall 2", "sensor_registered": True,
        "device_registered": True, **{k: v for k, v in event("s1", "site-a", False).items()
                                      if k not in ("sensor_id", "site")}}
    assert (by_sensor[("s9", "stopped")].sensor_registered, by_sensor[("s2", "stopped")].device_registered) == (
        False, False)
    value = json.loads(notifier.notifications_to_kafka(frame.where(F.col("sensor_id") == "s9")).collect()[0].value)
    assert value["text"].startswith("[site-a] Sensor s9 (not registered)") and value["exceeded_for_ms"] == 900
