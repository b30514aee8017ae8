"""Prometheus metrics of the Cassandra adapter (served on /metrics by observability.serve_http)."""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest

CONSUMED = Counter("iot_adapter_consumed_total", "Records consumed", ["table"])
WRITTEN = Counter("iot_adapter_written_total", "Rows written to Cassandra", ["table"])
DEAD_LETTERED = Counter("iot_adapter_dead_lettered_total", "Records sent to dead-letter", ["topic"])
SKIPPED = Counter("iot_adapter_tombstones_total", "Null-value records (compaction tombstones), nothing to write")
RETRIED = Counter("iot_adapter_write_retries_total", "Cassandra requests that failed and were scheduled again")
IN_FLIGHT = Gauge("iot_adapter_in_flight", "Records consumed and not yet written or dead-lettered")
PAUSED = Gauge("iot_adapter_paused", "1 while consumption is paused (window full, Cassandra slow or down)")
UNREAD_PARTITIONS = Gauge("iot_adapter_unread_partitions",
                          "Subscribed partitions no member of the group has held for two checks (assignment.py)")
WRITE_SECONDS = Histogram("iot_adapter_write_seconds", "Latency of one Cassandra request (a row or a batch)",
                          buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10))


def exposition() -> tuple[bytes, str]:
    """The /metrics body and Content-Type (for observability.serve_http)."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
