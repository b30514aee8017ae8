"""The Spark jobs take any record (issue 12, case 2): a bad reading becomes a dead letter, a bad
event is skipped (the datacenter adapter dead-letters it), and no query fails on data.

A query that fails on a record fails again on it after every restart (the
checkpoint points at it), so "the job exits" means "the job is down" here.
Spark's timestamp_millis overflows beyond +-9.2e15 ms; these tests feed such
values, 1e999, deep nesting and arbitrary bytes through the jobs' transforms.
"""
from __future__ import annotations

import json
import math
from functools import reduce

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")

from iot_jobs import detector, notifier, readings, rollups  # noqa: E402
from iot_jobs.hysteresis import Limits, ThresholdConfig  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from services.common import contracts, names  # noqa: E402
from services.common.site import resolve_site  # noqa: E402
from tests.unit.poison import (  # noqa: E402
    DEEP,
    EPOCH_MS_MAX,
    EPOCH_MS_MIN,
    POISON_SETTINGS,
    any_document,
    is_clean,
)

KAFKA_DDL = ("key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>, "
             "topic STRING, partition INT, offset BIGINT")
# Each example runs several Spark jobs over a whole batch of documents: few examples, many records each.
SPARK_POISON = settings(POISON_SETTINGS, max_examples=5)
LONG_MAX = 2 ** 63 - 1
GOOD = {"sensor_id": "s-1", "timestamp": 1_700_000_000_000, "temperature": 21.5, "unit": "C"}


def records(spark, values, topic="temperature-data", headers=None):
    rows = [(b"k", v if isinstance(v, bytes) else json.dumps(v).encode(), headers, topic, 0, i)
            for i, v in enumerate(values)]
    return spark.createDataFrame(rows, KAFKA_DDL)


# ------------------------------------------------------------------ readings, rollups

POISON_READINGS = [
    dict(GOOD, timestamp=LONG_MAX), dict(GOOD, timestamp=-LONG_MAX), dict(GOOD, timestamp=10 ** 16),
    dict(GOOD, timestamp=EPOCH_MS_MAX + 1), dict(GOOD, timestamp=EPOCH_MS_MIN - 1),
    dict(GOOD, temperature=1.7e308, unit="F"),           # finite, but its Celsius value is not
    b'{"sensor_id": "s-1", "timestamp": 1e999, "temperature": 1, "unit": "C"}',
    b'{"sensor_id": "s-1", "timestamp": 1, "temperature": 1e999, "unit": "C"}',
    b'{"sensor_id": "s-1", "timestamp": 1, "temperature": 1, "unit": "C", "x": ' + DEEP[:20_000] + b"}",
]


def test_a_reading_whose_time_or_value_spark_cannot_hold_is_dead_lettered_and_rollups_go_on(spark):
    parsed = readings.parse_readings(records(spark, [GOOD, *POISON_READINGS]), "site-a")
    errors = [r.error for r in parsed.orderBy("offset").collect()]
    assert errors[0] is None and all(errors[1:]), errors
    assert "'timestamp'" in errors[1] and "'temperature'" in errors[6]
    assert readings.dead_letters(parsed, "dead-letter").count() == len(POISON_READINGS)
    windows = rollups.rollup_1m(readings.valid_readings(parsed), "30 seconds").collect()   # no overflow
    assert [(w.sensor_id, w["count"]) for w in windows] == [("s-1", 1)]


def _check_readings(spark, values, headers):
    parsed = readings.parse_readings(records(spark, values, headers=headers), "site-a").cache()
    rows = parsed.collect()
    assert len(rows) == len(values)
    for row in rows:
        if row.error is None:
            assert row.sensor_id and row.unit in contracts.UNITS and row.site
            assert EPOCH_MS_MIN <= row.timestamp <= EPOCH_MS_MAX and math.isfinite(row.celsius)
        else:
            assert isinstance(row.error, str) and row.error
    dead = readings.dead_letters(parsed, "dead-letter").collect()
    assert len(dead) == sum(r.error is not None for r in rows)
    for record in dead:
        reason = {h.key: bytes(h.value) for h in record.headers}[names.HEADER_DLQ_REASON]
        assert reason.startswith(b"contract_violation: ")
    rollups.rollup_1m(readings.valid_readings(parsed), "30 seconds").collect()
    parsed.unpersist()


@SPARK_POISON
@given(values=st.lists(any_document(contracts.READING), min_size=1, max_size=40),
       headers=st.none() | st.sampled_from([[("site", b"")], [("site", b"\xff")], [("site", b"site-h")]]))
def test_any_reading_is_valid_and_in_range_or_a_dead_letter_and_rollups_never_fail(spark, values, headers):
    _check_readings(spark, values, headers)


# ------------------------------------------------------------------ detector

def test_the_detector_keeps_running_through_poison_readings(spark, tmp_path):
    """The job's path: Kafka records -> parse_readings -> valid_readings -> the state machine."""
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    (tmp_path / "in").mkdir()
    source = (spark.readStream.schema("value STRING, partition INT, offset BIGINT")
              .option("maxFilesPerTrigger", 1).json(str(tmp_path / "in")))
    kafka = source.select(F.lit(b"k").alias("key"), F.col("value").cast("binary").alias("value"),
                          F.lit(None).cast("array<struct<key:string,value:binary>>").alias("headers"),
                          F.lit("temperature-data").alias("topic"), "partition", "offset")
    parsed = readings.parse_readings(kafka, "site-a")
    config = ThresholdConfig(Limits(30.0, 2.0), {})
    events = detector.detect_thresholds(readings.valid_readings(parsed), None, config, ttl_ms=3_600_000)
    query = (events.writeStream.format("memory").queryName("poison_events").outputMode("append")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    # An episode from the earliest to the latest time the contract allows, and poison around it.
    batch = [dict(GOOD, timestamp=EPOCH_MS_MIN, temperature=40.0), dict(GOOD, timestamp=-LONG_MAX, temperature=50.0),
             *POISON_READINGS, dict(GOOD, timestamp=EPOCH_MS_MAX, temperature=10.0)]
    lines = [json.dumps({"value": v.decode("utf-8", "replace") if isinstance(v, bytes) else json.dumps(v),
                         "partition": 0, "offset": i}) for i, v in enumerate(batch)]
    (tmp_path / "in" / "00000.json").write_text("\n".join(lines) + "\n")
    try:
        query.processAllAvailable()
        assert query.exception() is None and query.isActive
        got = sorted((r.is_first, r.timestamp, r.exceeded_for_ms) for r in spark.sql("select * from poison_events")
                     .collect())
    finally:
        query.stop()
    assert got == [(False, EPOCH_MS_MAX, EPOCH_MS_MAX - EPOCH_MS_MIN), (True, EPOCH_MS_MIN, 0)]


# ------------------------------------------------------------------ notifier

def event(**fields):
    base = {"sensor_id": "s1", "site": "site-a", "timestamp": 1_700_000_125_000, "temperature_threshold": 30.0,
            "average_transgression": 33.25, "max_transgression": 35.0, "exceeded_for_ms": 125_000,
            "first_transgression": 1_700_000_000_000, "last_transgression": 1_700_000_120_000,
            "is_first": False, "is_last": True}
    return {**base, **fields}


def _notify(spark, values, topic="site-a.temperature-threshold-events", headers=None):
    events = notifier.parse_events(records(spark, values, topic=topic, headers=headers), "datacenter")
    empty = spark.createDataFrame([], "topic STRING, key BINARY, value BINARY, partition INT, offset BIGINT")
    rows = notifier.notifications(events, notifier.latest_registrations(empty, contracts.SENSOR, "dc"),
                                  notifier.latest_registrations(empty, contracts.DEVICE, "dc"))
    return events.collect(), notifier.notifications_to_kafka(rows).collect()


def test_an_event_whose_time_spark_cannot_hold_is_skipped_and_the_others_are_notified(spark):
    poison = [event(timestamp=LONG_MAX), event(first_transgression=-LONG_MAX), event(timestamp=EPOCH_MS_MAX + 1),
              event(exceeded_for_ms=1e999), event(sensor_id=""), event(is_first=None),
              b'{"sensor_id": "s1", "timestamp": 1e999}', DEEP[:20_000], b"\xff"]
    events, notes = _notify(spark, [event(), *poison])
    assert len(events) == 1 and len(notes) == 1


SITE_CASES = [   # (topic, headers, the event's site field)
    ("site-m.temperature-threshold-events", [("site", b"site-h")], "site-f"),
    ("site-m.temperature-threshold-events", [("site", b"")], "site-f"),
    ("site-m.temperature-threshold-events", None, ""),
    ("site-m.temperature-threshold-events", None, None),
    ("temperature-threshold-events", None, None),
    ("a.b.temperature-threshold-events", None, None),
    ("temperature-threshold-events", [("site", b"site-h")], "site-f"),
    ("temperature-threshold-events", None, "site-f"),
]


def test_parse_events_site_follows_the_one_rule_topic_prefix_header_field_default(spark):
    frames = [records(spark, [{k: v for k, v in event(sensor_id=f"s{i}", site=field).items() if v is not None}],
                      topic=topic, headers=headers) for i, (topic, headers, field) in enumerate(SITE_CASES)]
    events = notifier.parse_events(reduce(lambda a, b: a.unionByName(b), frames), "datacenter").collect()
    got = [site for _, site in sorted((e.sensor_id, e.site) for e in events)]
    assert got == [resolve_site(header=headers[0][1].decode() if headers else None, field=field, topic=topic,
                                default="datacenter") for topic, headers, field in SITE_CASES]
    assert got == ["site-m", "site-m", "site-m", "site-m", "datacenter", "a", "site-h", "site-f"]


@SPARK_POISON
@given(values=st.lists(any_document(contracts.THRESHOLD_EVENT), min_size=1, max_size=40))
def test_any_event_is_a_valid_notification_or_skipped_and_the_notifier_never_fails(spark, values):
    events, notes = _notify(spark, values)
    assert len(notes) == len(events) <= len(values)
    for row in events:
        assert is_clean(contracts.THRESHOLD_EVENT, row.asDict()), row


def test_registrations_never_fail_the_notifier_join(spark):
    bad = [b"\xff", DEEP[:20_000], b'{"sensor_id": 1e999, "device_id": "d1"}', b'{"sensor_id": "s1"}']
    sensors = spark.createDataFrame([("site-a.sensor-registration", b"s1", v, 0, i) for i, v in enumerate(bad)],
                                    "topic STRING, key BINARY, value BINARY, partition INT, offset BIGINT")
    events = notifier.parse_events(records(spark, [event()], topic="site-a.temperature-threshold-events"), "dc")
    empty = sensors.limit(0)
    frames = [notifier.latest_registrations(sensors, contracts.SENSOR, "dc"),
              notifier.latest_registrations(empty, contracts.DEVICE, "dc")]
    assert len(notifier.notifications(events, *frames).collect()) == 1
    assert reduce(lambda a, b: a + b, [f.count() for f in frames]) == 1
