"""Threshold detection: readings (+ sensor registrations) -> threshold events.

One transformWithState (Row interface) sees two kinds of rows: the sensors' registrations (from the compacted
`sensor-registration` topic, to learn each sensor type and so its limits) and their readings. Its key is not
the sensor but one of BUCKETS buckets of sensors (sensor_bucket). A bucket's state is one list, read once and
written once per micro-batch, with one entry per sensor (SENSOR_DDL):
- `sensor_type`: no TTL; bounded by the registry, cleared by a tombstone;
- `seen_ms` and the hysteresis state: kept for STATE_TTL_SECONDS of processing time after the sensor's last
  reading, so sensors that went away do not keep state. An open episode of a sensor silent for longer than the
  TTL is dropped without a closing event. A bucket drops its expired entries when it next has input.
Within a micro-batch, registrations apply first, then readings in Kafka offset order. BUCKETS is fixed once a
checkpoint exists (the state is keyed by it). SESSION_CONF turns off no-data micro-batches: in ProcessingTime
mode Spark runs one on every trigger to fire timers, and the detector has none. Tests:
tests/unit/spark/test_detector_buckets.py, test_spark_jobs.py. Why buckets, not sensors: spark/README.md
("State"); the measured figures: docs/operations.md ("Benchmarks")."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from iot_jobs import records
from iot_jobs.hysteresis import SensorState, ThresholdConfig, advance
from services.common import contracts

EVENT_DDL = contracts.spark_ddl(contracts.THRESHOLD_EVENT.name)
EVENT_FIELDS = contracts.THRESHOLD_EVENT.field_names()
EVENT_ROW = Row(*EVENT_FIELDS)
STATE_DDL = ("newest_ms BIGINT, exceeding BOOLEAN, threshold DOUBLE, hysteresis DOUBLE, first_ms BIGINT, "
             "last_ms BIGINT, total DOUBLE, count BIGINT, peak DOUBLE")
# One sensor of a bucket: its registered type, when its last reading was processed (null: none within the
# TTL), then its hysteresis state (STATE_DDL).
SENSOR_DDL = "sensor_id STRING, sensor_type STRING, seen_ms BIGINT, " + STATE_DDL
STATE_NAMES = tuple(SensorState.__dataclass_fields__)
STATE_FIELDS = len(STATE_NAMES)
SENSOR_NAMES = ("sensor_id", "sensor_type", "seen_ms", *STATE_NAMES)
# 16, 4 and 64 buckets gave micro-batches of 532, 514 and 724 ms at 5,000 readings/s from 1,000 sensors
# (scripts/bench spark): fewer keys, fewer round trips. A bucket's entries are all rewritten when it has
# input, so fewer buckets rewrite more idle sensors, and the buckets bound the state's parallelism.
BUCKETS = 16
CHECKPOINT = "threshold-buckets"     # the query's checkpoint, under CHECKPOINT_DIR (legacy_state.py)
# Columns of the unioned input of the state machine.
KIND_REGISTRATION, KIND_READING = 0, 1
# One state partition: a state store's commit costs about 85 ms a micro-batch whatever it holds (4 partitions:
# 341 ms of a 1,003 ms batch at 5,000 readings/s, 1 partition: 62 of 799; scripts/bench spark), and the job
# runs on one core by default (stack_spark.jobs). Fixed once the checkpoint exists; a job given more cores
# can set spark.sql.shuffle.partitions in its `conf` before its first start.
SESSION_CONF = {"spark.sql.streaming.noDataMicroBatches.enabled": "false", "spark.sql.shuffle.partitions": "1"}
INPUT_COLUMNS = ("sensor_id", "kind", "partition", "offset", "timestamp", "celsius", "site", "sensor_type_id")


def registration_rows(records: DataFrame) -> DataFrame:
    """Kafka records of sensor-registration -> rows for the state machine (tombstone: null sensor_type_id).

    Values without a sensor_type_id that are not tombstones are ignored: the
    registrar validates registrations, and a broken one must not unset a good type.
    """
    parsed = records.select(
        F.col("key").cast("string").alias("sensor_id"), "value", "partition", "offset",
        F.from_json(F.col("value").cast("string"), contracts.spark_ddl(contracts.SENSOR.name)).alias("r"))
    return parsed.where(F.col("sensor_id").isNotNull()
                        & (F.col("value").isNull() | F.col("r.sensor_type_id").isNotNull())).select(
        "sensor_id", F.lit(KIND_REGISTRATION).alias("kind"), "partition", "offset",
        F.lit(None).cast("bigint").alias("timestamp"), F.lit(None).cast("double").alias("celsius"),
        F.lit(None).cast("string").alias("site"), F.col("r.sensor_type_id").alias("sensor_type_id"))


def reading_rows(readings: DataFrame) -> DataFrame:
    """valid_readings rows -> rows for the state machine."""
    return readings.select(
        "sensor_id", F.lit(KIND_READING).alias("kind"), "partition", "offset", "timestamp", "celsius", "site",
        F.lit(None).cast("string").alias("sensor_type_id"))


def sensor_bucket(sensor_id):
    """The state key of a sensor (a Column): one of BUCKETS, by a hash Spark computes the same everywhere."""
    return F.pmod(F.xxhash64(sensor_id), F.lit(BUCKETS)).cast("int")


def detect_thresholds(readings: DataFrame, registrations: DataFrame | None, config: ThresholdConfig,
                      ttl_ms: int, initial: DataFrame | None = None) -> DataFrame:
    """Readings (valid_readings) and registrations (registration_rows) -> THRESHOLD_EVENT rows.

    initial: the state a new checkpoint starts from (bucket and SENSOR_NAMES columns; legacy_state.py)."""
    rows = reading_rows(readings)
    if registrations is not None:
        rows = rows.unionByName(registrations)
    # The Row interface, not transformWithStateInPandas: a pandas DataFrame per group and batch cost seconds
    # per batch at a thousand sensors (Spark's guide recommends transformWithState for many keys).
    return rows.withColumn("bucket", sensor_bucket(F.col("sensor_id"))).groupBy("bucket").transformWithState(
        statefulProcessor=HysteresisProcessor(config, ttl_ms),
        outputStructType=EVENT_DDL,
        outputMode="Append",
        timeMode="ProcessingTime",   # for the TTL: timerValues give the batch's processing time
        initialState=initial.groupBy("bucket") if initial is not None else None,
    )


def events_to_kafka(events: DataFrame) -> DataFrame:
    """THRESHOLD_EVENT rows -> Kafka records keyed by sensor_id, with the site header like readings."""
    return records.keyed_by_sensor(events, EVENT_FIELDS)


def run_sequence(sensor_id: str, state: SensorState, readings: Iterable[tuple[int, float, str]],
                 sensor_type: str | None, config: ThresholdConfig) -> tuple[SensorState, list[dict]]:
    """Apply one sensor's readings (timestamp, celsius, site; already ordered) to its state; return the new
    state and the event rows."""
    events = []
    limits = config.limits_for(sensor_type)
    for timestamp, value, site in readings:
        state, transition = advance(state, int(timestamp), float(value), limits)
        if transition is not None:
            events.append({"sensor_id": sensor_id, "site": site, **transition.__dict__})
    return state, events


def apply_bucket(entries: Iterable[tuple], rows: Iterable[Row], now_ms: int, ttl_ms: int,
                 config: ThresholdConfig) -> tuple[list[tuple], list[dict]]:
    """One bucket's micro-batch: its stored entries (SENSOR_DDL tuples) and input rows -> the entries to store
    and the event rows. Entries whose last reading is more than ttl_ms before now_ms lose their hysteresis
    state first; an entry with neither a type nor a state is dropped."""
    sensors: dict[str, list] = {}
    for entry in entries:
        sensor_id, sensor_type, seen_ms, *state = entry
        if seen_ms is not None and now_ms - seen_ms > ttl_ms:
            seen_ms, state = None, None
        if sensor_type is not None or seen_ms is not None:
            sensors[sensor_id] = [sensor_type, seen_ms, state]
    readings: dict[str, list[tuple[int, float, str]]] = {}
    for row in sorted(rows, key=lambda r: (r.kind, r.partition, r.offset)):
        sensor = sensors.setdefault(row.sensor_id, [None, None, None])
        if row.kind == KIND_REGISTRATION:
            sensor[0] = row.sensor_type_id          # None for a tombstone: back to the default limits
        else:
            readings.setdefault(row.sensor_id, []).append((row.timestamp, row.celsius, row.site))
    events: list[dict] = []
    for sensor_id, sensor_readings in readings.items():
        sensor = sensors[sensor_id]
        state = SensorState(*sensor[2]) if sensor[2] is not None else SensorState()
        state, sensor_events = run_sequence(sensor_id, state, sensor_readings, sensor[0], config)
        sensor[1], sensor[2] = now_ms, list(state.__dict__.values())
        events += sensor_events
    stored = [(sensor_id, sensor_type, seen_ms, *(state if state is not None else [None] * STATE_FIELDS))
              for sensor_id, (sensor_type, seen_ms, state) in sensors.items()
              if sensor_type is not None or seen_ms is not None]
    return stored, events


class HysteresisProcessor(StatefulProcessor):
    def __init__(self, config: ThresholdConfig, ttl_ms: int) -> None:
        self.config = config
        self.ttl_ms = ttl_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.sensors = handle.getListState("sensors", SENSOR_DDL)

    def handleInitialState(self, key, initialState: Row, timerValues) -> None:
        """A new checkpoint's first batch: one sensor of the state it starts from (legacy_state.py)."""
        self.sensors.appendValue(tuple(initialState[name] for name in SENSOR_NAMES))

    def handleInputRows(self, key, rows: Iterator[Row], timerValues) -> Iterator[Row]:
        # Three round trips per bucket and batch: the key (Spark's), one read, one write.
        stored, events = apply_bucket(self.sensors.get(), rows, timerValues.getCurrentProcessingTimeInMs(),
                                      self.ttl_ms, self.config)
        if stored:
            self.sensors.put(stored)
        else:
            self.sensors.clear()
        for event in events:
            yield EVENT_ROW(*(event[name] for name in EVENT_FIELDS))

    def close(self) -> None:
        pass
