"""Kafka records of `temperature-data` -> typed readings in Celsius, or dead letters."""
from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from services.common import contracts, names

READING_DDL = contracts.spark_ddl(contracts.READING.name)


def celsius(value: Column, unit: Column) -> Column:
    """Temperature in degrees Celsius (same formulas as contracts.to_celsius); null for an unknown unit."""
    return (F.when(unit == "C", value)
            .when(unit == "F", (value - F.lit(32.0)) * F.lit(5.0) / F.lit(9.0))
            .when(unit == "K", value - F.lit(273.15)))


def header(name: str) -> Column:
    """Value of the first Kafka header called `name`, as a string (null when absent)."""
    matches = F.filter(F.coalesce(F.col("headers"), F.array()), lambda h: h["key"] == F.lit(name))
    return F.try_element_at(matches, F.lit(1))["value"].cast("string")


def parse_readings(records: DataFrame, default_site: str) -> DataFrame:
    """Kafka records -> Kafka coordinates, original bytes, reading fields, celsius, site and `error`.

    `error` is null for a valid reading, else the dead-letter reason. Site: the
    bridge's `site` header, else `default_site` (the SITE setting).
    """
    parsed = records.select(
        "key", "value", "headers", "topic", "partition", "offset",
        F.from_json(F.col("value").cast("string"), READING_DDL).alias("r"))
    unit_names = ", ".join(contracts.UNITS)
    temperature = F.col("r.temperature")
    any_field = reduce(lambda a, b: a | b, [F.col(f"r.{f}").isNotNull() for f in contracts.READING.field_names()])
    error = (
        F.when(F.col("value").isNull(), F.lit("empty value (expected a temperature-reading JSON object)"))
        .when(F.col("r").isNull() | ~any_field, F.lit("value is not a temperature-reading JSON object"))
        .when(F.col("r.sensor_id").isNull() | (F.col("r.sensor_id") == ""),
              F.lit("missing or empty field 'sensor_id' (string)"))
        .when(F.col("r.timestamp").isNull(), F.lit("missing or invalid field 'timestamp' (integer epoch ms)"))
        .when(temperature.isNull(), F.lit("missing or invalid field 'temperature' (number)"))
        .when(F.isnan(temperature) | (F.abs(temperature) == F.lit(float("inf"))),
              F.lit("field 'temperature' must be a finite number"))
        .when(F.col("r.unit").isNull(), F.lit(f"missing field 'unit' (expected {unit_names})"))
        .when(~F.col("r.unit").isin(*contracts.UNITS),
              F.format_string(f"unknown unit '%s' (expected {unit_names})", F.col("r.unit")))
    )
    return parsed.select(
        "key", "value", "headers", "topic", "partition", "offset",
        F.col("r.sensor_id").alias("sensor_id"),
        F.col("r.timestamp").alias("timestamp"),
        F.col("r.temperature").alias("temperature"),
        F.col("r.unit").alias("unit"),
        celsius(temperature, F.col("r.unit")).alias("celsius"),
        F.coalesce(header(names.HEADER_SITE), F.lit(default_site)).alias("site"),
        error.alias("error"),
    )


def valid_readings(parsed: DataFrame) -> DataFrame:
    """Rows of parse_readings without an error: sensor_id, site, timestamp, celsius, partition, offset."""
    return parsed.where(F.col("error").isNull()).select(
        "sensor_id", "site", "timestamp", "celsius", "partition", "offset")


def dead_letters(parsed: DataFrame, topic: str) -> DataFrame:
    """Invalid rows -> dead-letter Kafka records: original key, value and headers plus the dlq_* headers."""
    def h(name: str, value: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), value.cast("binary").alias("value"))
    return parsed.where(F.col("error").isNotNull()).select(
        F.col("key"),
        F.col("value"),
        F.concat(F.coalesce(F.col("headers"), F.array().cast("array<struct<key:string,value:binary>>")),
                 F.array(h(names.HEADER_DLQ_SOURCE, F.col("topic")),
                         h(names.HEADER_DLQ_REASON, F.col("error")),
                         h(names.HEADER_DLQ_TIME_MS,
                           F.unix_millis(F.current_timestamp()).cast("string")))).alias("headers"),
        F.lit(topic).alias("topic"),
    )
