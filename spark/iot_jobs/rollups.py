"""One-minute tumbling windows per sensor (count, avg, min, max in Celsius)."""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from iot_jobs import records
from services.common import contracts

ROLLUP_FIELDS = contracts.ROLLUP.field_names()


def rollup_1m(readings: DataFrame, watermark: str) -> DataFrame:
    """valid_readings rows -> ROLLUP rows, one per (sensor, site, minute) once the watermark passes it.

    Append mode: a window is emitted once, when the watermark (newest event time
    seen minus `watermark`) passes its end; readings for a window already emitted
    are dropped by Spark as too late.
    """
    windows = (readings
               .withColumn("event_time", F.timestamp_millis(F.col("timestamp")))
               .withWatermark("event_time", watermark)
               .groupBy(F.window("event_time", "1 minute"), "sensor_id", "site")
               .agg(F.count(F.lit(1)).alias("count"), F.avg("celsius").alias("avg"),
                    F.min("celsius").alias("min"), F.max("celsius").alias("max")))
    return windows.select(
        "sensor_id", "site",
        F.unix_millis(F.col("window.start")).alias("window_start"),
        F.unix_millis(F.col("window.end")).alias("window_end"),
        "count", "avg", "min", "max",
    )


def rollups_to_kafka(rollups: DataFrame) -> DataFrame:
    return records.keyed_by_sensor(rollups, ROLLUP_FIELDS)
