"""The lab's status table: readings per second, consumer and relay lag, Cassandra rows.

Read-only: offsets come from each site's Kafka through its external listener,
row counts from cqlsh inside each site's Cassandra container.
"""
from __future__ import annotations

import re
import time

from confluent_kafka import Consumer, TopicPartition

from tooling import lab

READINGS = "temperature-data"
EVENTS = "temperature-threshold-events"
ADAPTER_GROUP = "cassandra-adapter"
KEYSPACE = "iot"


def _consumer(bootstrap: str, group: str = "iot-lab-status") -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "socket.timeout.ms": 5000})


def _partitions(consumer: Consumer, topic: str) -> list[TopicPartition]:
    metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return []
    return [TopicPartition(topic, p) for p in metadata.partitions]


def end_offsets(bootstrap: str, topic: str) -> int:
    consumer = _consumer(bootstrap)
    try:
        return sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in _partitions(consumer, topic))
    finally:
        consumer.close()


def group_lag(bootstrap: str, topic: str, group: str) -> int:
    consumer = _consumer(bootstrap, group)
    try:
        partitions = _partitions(consumer, topic)
        committed = consumer.committed(partitions, timeout=10)
        lag = 0
        for tp in committed:
            high = consumer.get_watermark_offsets(tp, timeout=10)[1]
            lag += high - (tp.offset if tp.offset >= 0 else 0)
        return lag
    finally:
        consumer.close()


def cql(host: lab.LabHost, site: str, query: str) -> str:
    """Run one CQL statement with cqlsh inside the site's cassandra-1 container; returns its output."""
    script = (f"c=$(docker ps -q -f name={site}_cassandra-1 | head -1); [ -n \"$c\" ] || exit 3; "
              f"docker exec $c cqlsh -e \"{query}\"")
    return lab.host_exec(host, "bash", "-c", script, check=False, timeout=60).stdout


def cassandra_rows(host: lab.LabHost, site: str, table: str) -> str:
    """Row count of one table (the lab's tables are small enough for count(*))."""
    match = re.search(r"^\s*(\d+)\s*$", cql(host, site, f"SELECT count(*) FROM {KEYSPACE}.{table};"), re.MULTILINE)
    return match.group(1) if match else "n/a"


def table(hosts: list[lab.LabHost], sample_s: float = 5.0) -> list[dict]:
    managers = lab.site_managers(hosts)
    bootstraps = {site: f"{lab.host_ip(h)}:9094" for site, h in managers.items()}
    first = {site: _safe(end_offsets, b, READINGS) for site, b in bootstraps.items() if site != "datacenter"}
    time.sleep(sample_s)
    rows = []
    datacenter = bootstraps.get("datacenter")
    for site, bootstrap in sorted(bootstraps.items()):
        if site == "datacenter":
            continue
        now = _safe(end_offsets, bootstrap, READINGS)
        rate = (now - first[site]) / sample_s if isinstance(now, int) and isinstance(first[site], int) else "n/a"
        events_site = _safe(end_offsets, bootstrap, EVENTS)
        events_dc = _safe(end_offsets, datacenter, f"{site}.{EVENTS}") if datacenter else "n/a"
        relay_lag = (events_site - events_dc) if isinstance(events_site, int) and isinstance(events_dc, int) \
            else "n/a"
        rows.append({
            "site": site,
            "readings/s": f"{rate:.0f}" if isinstance(rate, float) else rate,
            "readings in kafka": now,
            "adapter lag": _safe(group_lag, bootstrap, READINGS, ADAPTER_GROUP),
            "events": events_site,
            "relay lag": relay_lag,
            "cassandra readings": cassandra_rows(managers[site], site, "temperature_readings"),
            "cassandra events": cassandra_rows(managers[site], site, "temperature_threshold_events"),
        })
    if datacenter:
        rows.append({"site": "datacenter", "readings/s": "-", "readings in kafka": "-",
                     "adapter lag": "-", "events": "-", "relay lag": "-", "cassandra readings": "-",
                     "cassandra events": cassandra_rows(managers["datacenter"], "datacenter",
                                                        "temperature_threshold_events")})
    return rows


def _safe(func, *args):
    try:
        return func(*args)
    except Exception as err:  # noqa: BLE001 - a status table shows what it cannot read
        return f"error: {type(err).__name__}"
