"""Threshold events from every site + latest registrations -> readable notifications.

The registries are compacted topics read as a batch (earliest..latest) in each
micro-batch that has events: they are small, and this always joins the latest
registration without keeping a second copy of them in state.

Each event is announced once (`announce_once`): a site's threshold detector
writes to Kafka at least once, so after it crashes between writing a batch and
committing it, the replayed batch repeats the same events (same sensor, time and
kind), and MirrorMaker relays both copies.
"""
from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from iot_jobs import records
from iot_jobs.readings import conforms, header, site_column
from services.common import contracts, names

EVENT_DDL = contracts.spark_ddl(contracts.THRESHOLD_EVENT.name)
# announce_once has no timers: no micro-batch without input (the trigger is "0 seconds").
SESSION_CONF = {"spark.sql.streaming.noDataMicroBatches.enabled": "false"}
# Value of a `notifications` record: the text plus the joined fields.
NOTIFICATION_FIELDS = (
    "sensor_id", "site", "text", "state", "sensor_name", "device_id", "device_name", "location",
    "sensor_registered", "device_registered", *[f for f in contracts.THRESHOLD_EVENT.field_names()
                                                if f not in ("sensor_id", "site")])


def parse_events(records: DataFrame, default_site: str) -> DataFrame:
    """Kafka records of (mirrored) threshold-event topics -> THRESHOLD_EVENT rows.

    Site by the one rule (services.common.site, as readings.site_column): the `site`
    header, else the event's site field, else the '<site>.' topic prefix, else
    default_site. Events that break the contract are skipped, not dead-lettered:
    the datacenter's adapter reads the same topics and dead-letters them (once,
    not once per consumer). Skipping matters: an event time beyond what
    timestamp_millis takes would fail the query, and again after every restart."""
    parsed = records.select("topic", "headers",
                            F.from_json(F.col("value").cast("string"), EVENT_DDL).alias("e"))
    site = site_column(header=header(names.HEADER_SITE), field=F.col("e.site"), topic=F.col("topic"),
                       default=default_site)
    return parsed.where(conforms(contracts.THRESHOLD_EVENT, "e", skip=("site",))).select(
        *[F.col(f"e.{f}").alias(f) for f in contracts.THRESHOLD_EVENT.field_names() if f != "site"],
        site.alias("site"))


def announce_once(events: DataFrame, ttl_ms: int) -> DataFrame:
    """THRESHOLD_EVENT rows (parse_events) -> the same rows without repeats of an event already seen.

    An event is (site, sensor_id, timestamp, is_last): the detector makes at most
    one transition per reading, so no two different events share it. Per sensor,
    the events seen are kept for ttl_ms of processing time (a repeat comes when the
    detector is back, minutes later). State is keyed per sensor, not by a watermark
    on event time: one device with a wrong clock cannot make other sensors' events late.
    """
    return events.groupBy("site", "sensor_id").transformWithStateInPandas(
        statefulProcessor=AnnounceOnce(ttl_ms, events.columns),
        outputStructType=events.schema,
        outputMode="Append",
        timeMode="ProcessingTime",   # needed for state TTL
    )


class AnnounceOnce(StatefulProcessor):
    def __init__(self, ttl_ms: int, columns: list[str]) -> None:
        self.ttl_ms, self.columns = ttl_ms, columns

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.seen = handle.getMapState("seen", "timestamp BIGINT, is_last BOOLEAN", "seen BOOLEAN", self.ttl_ms)

    def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        batch = pd.concat(list(rows), ignore_index=True)
        fresh, this_batch = [], set()
        for i, (timestamp, is_last) in enumerate(zip(batch["timestamp"], batch["is_last"], strict=True)):
            event = (int(timestamp), bool(is_last))
            if event in this_batch or self.seen.containsKey(event):
                continue
            this_batch.add(event)
            self.seen.updateValue(event, (True,))
            fresh.append(i)
        if fresh:
            yield batch.iloc[fresh][self.columns]

    def close(self) -> None:
        pass


def latest_registrations(records: DataFrame, contract: contracts.Contract, default_site: str) -> DataFrame:
    """Kafka records of (mirrored) compacted registries -> the latest registration per (site, key).

    A key always lands on one partition, so the highest offset is the latest; a
    tombstone (null value) as the latest record means the entity was removed.
    """
    latest = (records
              .select(site_column(topic=F.col("topic"), default=default_site).alias("site"),
                      F.col("key").cast("string").alias("id"), "offset", "value")
              .groupBy("site", "id")
              .agg(F.max_by(F.col("value"), F.col("offset")).alias("value")))
    parsed = latest.where(F.col("value").isNotNull()).select(
        "site", "id", F.from_json(F.col("value").cast("string"), contracts.spark_ddl(contract.name)).alias("r"))
    return parsed.select("site", F.col("id").alias(contract.key_field),
                         *[F.col(f"r.{f}").alias(f) for f in contract.field_names() if f != contract.key_field])


def _temp(column: str) -> Column:
    return F.format_string("%.1f °C", F.col(column))


def _duration(ms: Column) -> Column:
    seconds = F.floor(ms / 1000)
    return (F.when(ms < 60_000, F.format_string("%.1f s", ms / 1000))
            .when(ms < 3_600_000, F.format_string("%d min %d s", F.floor(seconds / 60), seconds % 60))
            .otherwise(F.format_string("%d h %d min", F.floor(seconds / 3600), F.floor(seconds / 60) % 60)))


def _time(ms: Column) -> Column:
    return F.date_format(F.timestamp_millis(ms), "yyyy-MM-dd HH:mm:ss 'UTC'")


def notifications(events: DataFrame, sensors: DataFrame, devices: DataFrame) -> DataFrame:
    """THRESHOLD_EVENT rows + latest SENSOR and DEVICE registrations (with site) -> notification rows.

    Left joins: an event whose sensor or device is not registered still yields a
    notification, and the text says what is missing.
    """
    s, d = sensors.alias("s"), devices.alias("d")
    joined = (events.alias("e")
              .join(s, (F.col("e.site") == F.col("s.site")) & (F.col("e.sensor_id") == F.col("s.sensor_id")),
                    how="left")
              .join(d, (F.col("s.site") == F.col("d.site")) & (F.col("s.device_id") == F.col("d.device_id")),
                    how="left"))
    sensor_registered = F.col("s.sensor_id").isNotNull()
    device_registered = F.col("d.device_id").isNotNull()
    sensor_text = (F.when(sensor_registered,
                          F.format_string("Sensor '%s' (%s)", F.col("s.name"), F.col("e.sensor_id")))
                   .otherwise(F.format_string("Sensor %s (not registered)", F.col("e.sensor_id"))))
    device_text = (F.when(device_registered,
                          F.concat(F.format_string(" on device '%s' (%s)", F.col("d.name"), F.col("d.device_id")),
                                   F.when(F.col("d.location").isNotNull(),
                                          F.format_string(" at %s", F.col("d.location"))).otherwise(F.lit(""))))
                   .when(sensor_registered,
                         F.format_string(" on device %s (not registered)", F.col("s.device_id")))
                   .otherwise(F.lit(" on an unknown device")))
    started = F.col("e.is_first")
    what = F.when(
        started,
        F.format_string(" started exceeding %s at %s (reading %s).", _temp("e.temperature_threshold"),
                        _time(F.col("e.timestamp")), _temp("e.max_transgression"))
    ).otherwise(
        F.format_string(" stopped exceeding %s at %s after %s: average %s, maximum %s.",
                        _temp("e.temperature_threshold"), _time(F.col("e.timestamp")),
                        _duration(F.col("e.exceeded_for_ms")), _temp("e.average_transgression"),
                        _temp("e.max_transgression")))
    text = F.concat(F.format_string("[%s] ", F.col("e.site")), sensor_text, device_text, what)
    return joined.select(
        F.col("e.sensor_id").alias("sensor_id"), F.col("e.site").alias("site"), text.alias("text"),
        F.when(started, F.lit("started")).otherwise(F.lit("stopped")).alias("state"),
        F.col("s.name").alias("sensor_name"), F.col("s.device_id").alias("device_id"),
        F.col("d.name").alias("device_name"), F.col("d.location").alias("location"),
        sensor_registered.alias("sensor_registered"), device_registered.alias("device_registered"),
        *[F.col(f"e.{f}").alias(f) for f in NOTIFICATION_FIELDS[10:]],
    )


def notifications_to_kafka(rows: DataFrame) -> DataFrame:
    return records.keyed_by_sensor(rows, NOTIFICATION_FIELDS)
