"""Threshold detection: readings (+ sensor registrations) -> threshold events.

One transformWithState (Row interface) keyed by sensor_id sees two kinds of rows: the
sensor's registrations (from the compacted `sensor-registration` topic, to learn
its sensor type and so its limits) and its readings. Per sensor it keeps:
- `sensor_type`: no TTL; bounded by the registry, cleared by a tombstone;
- `episode`: the hysteresis state, with a processing-time TTL (STATE_TTL_SECONDS)
  refreshed by every reading, so sensors that went away do not keep state. An
  open episode of a sensor silent for longer than the TTL is dropped without a
  closing event.
Within a micro-batch, registrations apply first, then readings in Kafka offset order.

In ProcessingTime mode Spark runs a micro-batch on every trigger even without
input (to fire timers); the detector has no timers, so its session disables
no-data micro-batches (SESSION_CONF) and TTL eviction runs with the data batches.
"""
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
# Columns of the unioned input of the state machine.
KIND_REGISTRATION, KIND_READING = 0, 1
SESSION_CONF = {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}
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


def detect_thresholds(readings: DataFrame, registrations: DataFrame | None, config: ThresholdConfig,
                      ttl_ms: int) -> DataFrame:
    """Readings (valid_readings) and registrations (registration_rows) -> THRESHOLD_EVENT rows."""
    rows = reading_rows(readings)
    if registrations is not None:
        rows = rows.unionByName(registrations)
    # The Row interface, not transformWithStateInPandas: a micro-batch holds a few readings of each of many
    # sensors, and building a pandas DataFrame per sensor made each batch cost seconds at a thousand sensors
    # (Spark's guide recommends transformWithState for high key cardinality; scripts/bench spark --sensors 1000).
    return rows.groupBy("sensor_id").transformWithState(
        statefulProcessor=HysteresisProcessor(config, ttl_ms),
        outputStructType=EVENT_DDL,
        outputMode="Append",
        timeMode="ProcessingTime",   # needed for state TTL
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


class HysteresisProcessor(StatefulProcessor):
    def __init__(self, config: ThresholdConfig, ttl_ms: int) -> None:
        self.config = config
        self.ttl_ms = ttl_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.episode = handle.getValueState("episode", STATE_DDL, self.ttl_ms)
        self.sensor_type = handle.getValueState("sensor_type", "sensor_type_id STRING")

    def handleInputRows(self, key, rows: Iterator[Row], timerValues) -> Iterator[Row]:
        (sensor_id,) = key
        sensor_type, registered, readings = None, False, []
        for row in sorted(rows, key=lambda r: (r.kind, r.partition, r.offset)):
            if row.kind == KIND_REGISTRATION:
                registered, sensor_type = True, row.sensor_type_id
                if sensor_type is None:
                    self.sensor_type.clear()
                else:
                    self.sensor_type.update((sensor_type,))
            else:
                readings.append((row.timestamp, row.celsius, row.site))
        if not readings:
            return
        # Each state call is a round trip to the JVM: read the type only when a reading could open an episode.
        if not registered and max(celsius for _, celsius, _ in readings) > self.config.lowest_threshold:
            stored_type = self.sensor_type.get()
            sensor_type = stored_type[0] if stored_type else None
        stored = self.episode.get()
        state = SensorState(*stored) if stored is not None else SensorState()
        state, events = run_sequence(sensor_id, state, readings, sensor_type, self.config)
        self.episode.update(tuple(state.__dict__.values()))   # also refreshes the TTL
        for event in events:
            yield EVENT_ROW(*(event[name] for name in EVENT_FIELDS))

    def close(self) -> None:
        pass
