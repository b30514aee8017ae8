"""Smoke job for the spark image: JSON readings from Kafka in, enriched JSON out.

Used by test_spark_image.py only. It reads everything in the input topic that
exists at start (availableNow), adds a Fahrenheit field and stops, so a test can
wait for the driver to exit.
"""
from __future__ import annotations

import argparse
import logging

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

READING = T.StructType([
    T.StructField("sensor", T.StringType()),
    T.StructField("seq", T.LongType()),
    T.StructField("celsius", T.DoubleType()),
])


def with_fahrenheit(records: DataFrame) -> DataFrame:
    """Kafka records (value = reading JSON) -> Kafka records keyed by sensor, with fahrenheit added."""
    reading = records.select(F.from_json(F.col("value").cast("string"), READING).alias("r"))
    return reading.select(
        F.col("r.sensor").alias("key"),
        F.to_json(F.struct(
            F.col("r.sensor").alias("sensor"),
            F.col("r.seq").alias("seq"),
            F.col("r.celsius").alias("celsius"),
            (F.col("r.celsius") * 9 / 5 + 32).alias("fahrenheit"),
        )).alias("value"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--input", required=True, help="topic with reading JSON")
    parser.add_argument("--output", required=True, help="topic for the enriched JSON")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory of the query")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="level=%(levelname)s logger=%(name)s %(message)s")

    spark = SparkSession.builder.appName(f"smoke-{args.input}").getOrCreate()
    records = (spark.readStream.format("kafka")
               .option("kafka.bootstrap.servers", args.bootstrap)
               .option("subscribe", args.input)
               .option("startingOffsets", "earliest")
               .load())
    query = (with_fahrenheit(records).writeStream.format("kafka")
             .option("kafka.bootstrap.servers", args.bootstrap)
             .option("topic", args.output)
             .option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True)
             .start())
    query.awaitTermination()
    logging.getLogger("smoke").info("done input=%s output=%s progress=%s",
                                    args.input, args.output, query.lastProgress)
    spark.stop()


if __name__ == "__main__":
    main()
