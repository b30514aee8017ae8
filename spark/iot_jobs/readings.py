"""Kafka records of `temperature-data` -> typed readings in Celsius, or dead letters."""
from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from services.common import contracts, names
from services.common.dead_letter import CONTRACT_VIOLATION, DLQ_HEADERS, DLQ_VALUE_LIMIT, reason_text

READING_DDL = contracts.spark_ddl(contracts.READING.name)
HEADERS_TYPE = "array<struct<key:string,value:binary>>"
_INF = float("inf")


def _finite(value: Column) -> Column:
    return ~(F.isnan(value) | (F.abs(value) == F.lit(_INF)))


def conforms(contract: contracts.Contract, struct: str, skip: tuple[str, ...] = ()) -> Column:
    """True where the parsed struct column `struct` holds what Contract.validate accepts, as far as
    Spark's from_json lets it through: required fields set, strings not empty and within their
    choices, longs within their bounds (event times Spark's timestamp_millis can take), doubles
    finite. Null where a field is null, so use it in `where`. Fields in `skip` are not checked."""
    checks = []
    for f in contract.fields:
        if f.name in skip:
            continue
        column = F.col(f"{struct}.{f.name}")
        if f.kind == "string":
            ok = (column != F.lit("")) & (column.isin(*f.choices) if f.choices else F.lit(True))
        elif f.kind == "long":
            ok = column.between(*f.bounds)
        elif f.kind == "double":
            ok = _finite(column)
        else:
            ok = F.lit(True)
        checks.append(ok if f.required else (column.isNull() | ok))
        if f.required:
            checks.append(column.isNotNull())
    return reduce(lambda a, b: a & b, checks)


def celsius(value: Column, unit: Column) -> Column:
    """Temperature in degrees Celsius (same formulas as contracts.to_celsius); null for an unknown unit."""
    return (F.when(unit == "C", value)
            .when(unit == "F", (value - F.lit(32.0)) * F.lit(5.0) / F.lit(9.0))
            .when(unit == "K", value - F.lit(273.15)))


def header(name: str) -> Column:
    """Value of the first Kafka header called `name`, as a string (null when absent)."""
    matches = F.filter(F.coalesce(F.col("headers"), F.array()), lambda h: h["key"] == F.lit(name))
    return F.try_element_at(matches, F.lit(1))["value"].cast("string")


def site_column(header: Column | None = None, field: Column | None = None, topic: Column | None = None,
                default: str | None = None) -> Column:
    """services.common.site.resolve_site as a column (Spark cannot call Python per row without a UDF):
    the same precedence (the '<site>.' prefix of a mirrored topic, the `site` header, the record's site
    field, the default) and, as there, an empty string counts as absent."""
    candidates = []
    if topic is not None:
        candidates.append(F.when(F.instr(topic, ".") > 1, F.substring_index(topic, ".", 1)))
    candidates += [F.nullif(c, F.lit("")) for c in (header, field) if c is not None]
    if default:
        candidates.append(F.lit(default))
    return F.coalesce(*candidates) if candidates else F.lit(None).cast("string")


def parse_readings(records: DataFrame, default_site: str) -> DataFrame:
    """Kafka records -> Kafka coordinates, original bytes, reading fields, celsius, site and `error`.

    `error` is null for a valid reading, else what is wrong (the dead-letter detail).
    Site by the one rule (site_column): the '<site>.' prefix of a mirrored topic, else the
    bridge's `site` header, else `default_site` (the SITE setting); readings have no site field.
    """
    parsed = records.select(
        "key", "value", "headers", "topic", "partition", "offset",
        F.from_json(F.col("value").cast("string"), READING_DDL).alias("r"))
    unit_names = ", ".join(contracts.UNITS)
    temperature = F.col("r.temperature")
    converted = celsius(temperature, F.col("r.unit"))
    earliest, latest = next(f.bounds for f in contracts.READING.fields if f.name == "timestamp")
    any_field = reduce(lambda a, b: a | b, [F.col(f"r.{f}").isNotNull() for f in contracts.READING.field_names()])
    error = (
        F.when(F.col("value").isNull(), F.lit("empty value (expected a temperature-reading JSON object)"))
        .when(F.col("r").isNull() | ~any_field, F.lit("value is not a temperature-reading JSON object"))
        .when(F.col("r.sensor_id").isNull() | (F.col("r.sensor_id") == ""),
              F.lit("missing or empty field 'sensor_id' (string)"))
        .when(F.col("r.timestamp").isNull(), F.lit("missing or invalid field 'timestamp' (integer epoch ms)"))
        # Beyond these, timestamp_millis (rollups, notifier) overflows and fails the query on every restart.
        .when(~F.col("r.timestamp").between(earliest, latest),
              F.format_string(f"field 'timestamp' must be an epoch time in ms from 0001-01-01 to 9999-12-31 "
                              f"({earliest} to {latest}), got %d", F.col("r.timestamp")))
        .when(temperature.isNull(), F.lit("missing or invalid field 'temperature' (number)"))
        .when(~_finite(temperature), F.lit("field 'temperature' must be a finite number"))
        .when(F.col("r.unit").isNull(), F.lit(f"missing field 'unit' (expected {unit_names})"))
        .when(~F.col("r.unit").isin(*contracts.UNITS),
              F.format_string(f"unknown unit '%s' (expected {unit_names})", F.col("r.unit")))
        .when(~_finite(converted), F.lit("field 'temperature' is out of range: not a finite number in Celsius"))
    )
    return parsed.select(
        "key", "value", "headers", "topic", "partition", "offset",
        F.col("r.sensor_id").alias("sensor_id"),
        F.col("r.timestamp").alias("timestamp"),
        F.col("r.temperature").alias("temperature"),
        F.col("r.unit").alias("unit"),
        converted.alias("celsius"),
        site_column(header=header(names.HEADER_SITE), topic=F.col("topic"), default=default_site).alias("site"),
        error.alias("error"),
    )


def valid_readings(parsed: DataFrame) -> DataFrame:
    """Rows of parse_readings without an error: sensor_id, site, timestamp, celsius, partition, offset."""
    return parsed.where(F.col("error").isNull()).select(
        "sensor_id", "site", "timestamp", "celsius", "partition", "offset")


def dead_letters(parsed: DataFrame, topic: str) -> DataFrame:
    """Invalid rows -> dead-letter Kafka records, as services.common.dead_letter.dead_letter builds them
    (a unit test compares the two): original key, original bytes (cut at DLQ_VALUE_LIMIT, noted in the
    reason), the original headers without old dlq_* ones, then dlq_source, dlq_reason
    ("contract_violation: <error>"), dlq_time_ms and dlq_offset ("<partition>:<offset>")."""
    def h(name: str, value: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), value.cast("binary").alias("value"))
    size = F.length(F.col("value"))         # bytes, for a binary column
    cut = size > F.lit(DLQ_VALUE_LIMIT)
    detail = F.when(cut, F.concat(F.col("error"), F.lit(f" (value cut to its first {DLQ_VALUE_LIMIT} of "),
                                  size.cast("string"), F.lit(" bytes)"))).otherwise(F.col("error"))
    original = F.filter(F.coalesce(F.col("headers"), F.array().cast(HEADERS_TYPE)),
                        lambda x: ~x["key"].isin(*sorted(DLQ_HEADERS)))
    return parsed.where(F.col("error").isNotNull()).select(
        F.coalesce(F.col("key"), F.col("topic").cast("binary")).alias("key"),
        F.when(cut, F.substring(F.col("value"), 1, DLQ_VALUE_LIMIT)).otherwise(F.col("value")).alias("value"),
        F.concat(original,
                 F.array(h(names.HEADER_DLQ_SOURCE, F.col("topic")),
                         h(names.HEADER_DLQ_REASON, F.concat(F.lit(reason_text(CONTRACT_VIOLATION, "")), detail)),
                         h(names.HEADER_DLQ_TIME_MS,
                           F.unix_millis(F.current_timestamp()).cast("string")),
                         h(names.HEADER_DLQ_OFFSET,
                           F.concat_ws(":", F.col("partition").cast("string"),
                                       F.col("offset").cast("string"))))).alias("headers"),
        F.lit(topic).alias("topic"),
    )
