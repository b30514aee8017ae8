"""Carry the threshold detector over from its per-sensor checkpoint to the bucketed one.

Before its state moved into buckets the detector kept one state per sensor, checkpointed in
<CHECKPOINT_DIR>/threshold-events (LEGACY_QUERY). The bucketed operator (detector.py) has another
key, so Spark cannot resume that checkpoint; the bucketed query has its own (detector.CHECKPOINT).
On its first start beside a per-sensor checkpoint that committed a micro-batch, the job:
- reads the readings from where the per-sensor query's last committed micro-batch ended, so no
  reading is skipped or applied twice;
- starts from the per-sensor state, read with Spark's state data source: every sensor's open
  episode, its TTL and its registered type.
The per-sensor checkpoint stays where it is, unused; docs/operations.md says when to remove it.
Only a checkpoint on the job's own file system (a path, as the stacks mount) is carried over.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from iot_jobs import detector

LEGACY_QUERY = "threshold-events"


def committed_batch(checkpoint: Path) -> int | None:
    """The id of the last micro-batch the query committed, or None."""
    ids = [int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()]
    return max(ids) if ids else None


def batch_end_offsets(checkpoint: Path, batch: int) -> list[dict]:
    """Each Kafka source's end offsets of a micro-batch ({topic: {partition: offset}}), in the query's source
    order; a source without offsets yet is {}. The offset log: a version line, the batch's metadata, then
    one line per source."""
    lines = (checkpoint / "offsets" / str(batch)).read_text(encoding="utf-8").splitlines()
    if not lines or not lines[0].startswith("v"):
        raise ValueError(f"{checkpoint}/offsets/{batch}: not a Spark offset log")
    return [json.loads(line) if line.strip() not in ("", "-") else {} for line in lines[2:]]


def readings_start(offsets: list[dict], topic: str, pattern: str) -> dict | None:
    """The startingOffsets of the readings source (topic, or the Java regex pattern) from the per-sensor
    query's end offsets: the one source whose topics all match; None when none or several do."""
    def matches(name: str) -> bool:
        return re.fullmatch(pattern, name) is not None if pattern else name == topic

    found = [source for source in offsets if source and all(matches(name) for name in source)]
    return found[0] if len(found) == 1 else None


def initial_state(spark: SparkSession, checkpoint: Path, ttl_ms: int) -> DataFrame:
    """The per-sensor state as bucket entries: bucket, then detector.SENSOR_DDL's columns. seen_ms is
    recovered from the episode's TTL expiry (the last reading's batch time + the TTL)."""
    def read(variable: str) -> DataFrame:
        return (spark.read.format("statestore").option("path", str(checkpoint))
                .option("stateVarName", variable).load())

    episodes = read("episode").select(
        F.col("key.sensor_id").alias("sensor_id"),
        (F.col("value.ttlExpirationMs") - F.lit(ttl_ms)).alias("seen_ms"),
        *[F.col(f"value.value.{name}").alias(name) for name in detector.STATE_NAMES])
    types = read("sensor_type").select(F.col("key.sensor_id").alias("sensor_id"),
                                       F.col("value.sensor_type_id").alias("sensor_type"))
    entries = episodes.join(types, "sensor_id", "full_outer")
    return entries.select(detector.sensor_bucket(F.col("sensor_id")).alias("bucket"),
                          *[F.col(name) for name in detector.SENSOR_NAMES])


def carry_over(spark: SparkSession, checkpoint_dir: str, topic: str, pattern: str,
               ttl_ms: int) -> tuple[dict | None, DataFrame | None]:
    """(startingOffsets of the readings, initial state) when the bucketed query at checkpoint_dir has never
    committed and a per-sensor checkpoint beside it has; (None, None) otherwise."""
    if "://" in checkpoint_dir:
        return None, None
    new = Path(checkpoint_dir)
    legacy = new.parent / LEGACY_QUERY
    batch = committed_batch(legacy)
    if batch is None or committed_batch(new) is not None:
        return None, None
    start = readings_start(batch_end_offsets(legacy, batch), topic, pattern)
    if start is None:
        raise RuntimeError(f"{legacy}/offsets/{batch}: no source reads only {pattern or topic}; the "
                           f"per-sensor checkpoint belongs to another subscription. Move it away to start "
                           f"afresh from STARTING_OFFSETS.")
    return start, initial_state(spark, legacy, ttl_ms)
