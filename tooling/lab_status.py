"""The lab's status table: readings per second, consumer and relay lag, Cassandra rows.

Read-only: offsets come from each site's Kafka through its external listener,
row counts from cqlsh inside each site's Cassandra container. This module knows
no lab hosts: tooling.lab passes each site's client settings (bootstrap, SASL_SSL
as the operator) and a `cql(site, query)`
that runs cqlsh where the site's Cassandra is (so the import runs lab -> lab_status only).
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition

from services.common import names

KEYSPACE = "iot"

# (site, CQL statement) -> cqlsh output, run inside the site's Cassandra (tooling.lab.cql).
Cql = Callable[[str, str], str]
# confluent-kafka settings of one site's EXTERNAL listener (tooling.lab.kafka_client).
Client = dict


def _consumer(client: Client, group: str = "iot-lab-status") -> Consumer:
    return Consumer({**client, "group.id": group, "enable.auto.commit": False,
                     "socket.timeout.ms": 5000})


def _partitions(consumer: Consumer, topic: str) -> list[TopicPartition]:
    metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return []
    return [TopicPartition(topic, p) for p in metadata.partitions]


def end_offsets(client: Client, topic: str) -> int:
    consumer = _consumer(client)
    try:
        return sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in _partitions(consumer, topic))
    finally:
        consumer.close()


def group_lag(client: Client, topic: str, group: str) -> int:
    consumer = _consumer(client, group)
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


def cassandra_rows(cql: Cql, site: str, table: str) -> str:
    """Row count of one table (the lab's tables are small enough for count(*))."""
    match = re.search(r"^\s*(\d+)\s*$", cql(site, f"SELECT count(*) FROM {KEYSPACE}.{table};"), re.MULTILINE)
    return match.group(1) if match else "n/a"


def table(clients: dict[str, Client], cql: Cql, sample_s: float = 5.0) -> list[dict]:
    """One row per edge site (and one for the datacenter); `clients`: site alias -> Kafka client settings."""
    first = {site: _safe(end_offsets, c, names.TEMPERATURE_DATA) for site, c in clients.items()
             if site != "datacenter"}
    time.sleep(sample_s)
    rows = []
    datacenter = clients.get("datacenter")
    for site, client in sorted(clients.items()):
        if site == "datacenter":
            continue
        now = _safe(end_offsets, client, names.TEMPERATURE_DATA)
        rate = (now - first[site]) / sample_s if isinstance(now, int) and isinstance(first[site], int) else "n/a"
        events_site = _safe(end_offsets, client, names.THRESHOLD_EVENTS)
        # The datacenter's relay (MirrorMaker 2) prefixes each mirrored topic with the source site's alias.
        events_dc = _safe(end_offsets, datacenter, f"{site}.{names.THRESHOLD_EVENTS}") if datacenter else "n/a"
        relay_lag = (events_site - events_dc) if isinstance(events_site, int) and isinstance(events_dc, int) \
            else "n/a"
        rows.append({
            "site": site,
            "readings/s": f"{rate:.0f}" if isinstance(rate, float) else rate,
            "readings in kafka": now,
            # Each site's adapter runs in its own group, "<site>-cassandra-adapter" (services/common/names.py).
            "adapter lag": _safe(group_lag, client, names.TEMPERATURE_DATA,
                                 f"{site}-{names.CONSUMER_GROUPS['adapter']}"),
            "events": events_site,
            "relay lag": relay_lag,
            "cassandra readings": cassandra_rows(cql, site, "temperature_readings"),
            "cassandra events": cassandra_rows(cql, site, "temperature_threshold_events"),
        })
    if datacenter:
        rows.append({"site": "datacenter", "readings/s": "-", "readings in kafka": "-",
                     "adapter lag": "-", "events": "-", "relay lag": "-", "cassandra readings": "-",
                     "cassandra events": cassandra_rows(cql, "datacenter", "temperature_threshold_events")})
    return rows


def _safe(func, *args):
    try:
        return func(*args)
    except Exception as err:  # noqa: BLE001 - a status table shows what it cannot read
        return f"error: {type(err).__name__}"
