"""Rows -> Kafka records as every job writes them: key sensor_id, the contract's
fields as a JSON value, and the `site` header (as the bridge sets it on readings)."""
from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from services.common import names


def keyed_by_sensor(rows: DataFrame, fields: Sequence[str]) -> DataFrame:
    return rows.select(
        F.col("sensor_id").alias("key"),
        F.to_json(F.struct(*[F.col(f) for f in fields])).alias("value"),
        F.array(F.struct(F.lit(names.HEADER_SITE).alias("key"),
                         F.col("site").cast("binary").alias("value"))).alias("headers"),
    )
