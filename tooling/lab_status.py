"""The lab's status table: readings per second, consumer and relay lag, Cassandra rows.

Read-only: offsets come from each site's Kafka through its external listener,
row counts from cqlsh inside each site's Cassandra container. This module knows
no lab hosts: tooling.lab passes each site's client settings (bootstrap, SASL_SSL
as the operator) and a `cql(site, query)`
that runs cqlsh where the site's Cassandra is (so the import runs lab -> lab_status only).
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable

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
    return sum(high for _low, high in partition_ends(client, topic).values())


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


def partition_ends(client: Client, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (low, high) watermark offsets of `topic`."""
    consumer = _consumer(client)
    try:
        return {tp.partition: consumer.get_watermark_offsets(tp, timeout=10) for tp in _partitions(consumer, topic)}
    finally:
        consumer.close()


def mm2_offsets_topic(site: str) -> str:
    """Where MirrorMaker 2 (dedicated mode) keeps its connectors' source offsets for one flow: in the
    target cluster, one topic per source (Kafka 3.9 MirrorMakerConfig: mm2-offsets.<source>.internal)."""
    return f"mm2-offsets.{site}.internal"


def copied_offsets(records: Iterable[tuple[bytes | None, bytes | None]], site: str, topic: str) -> dict[int, int]:
    """partition -> the next offset of `topic` at `site` that MirrorMaker has not copied yet, from the
    records (key, value) of its offsets topic, oldest first: the source connector stores, per source
    partition, the last upstream offset it copied ({"offset": N}); a later record replaces an earlier
    one and a null value deletes it. Records of other connectors, sites or topics, and bytes that are
    not the expected JSON, are ignored."""
    copied: dict[int, int] = {}
    for key, value in records:
        try:
            connector, partition = json.loads(key or b"null")
        except (TypeError, ValueError):
            continue
        if connector != "MirrorSourceConnector" or not isinstance(partition, dict) \
                or partition.get("cluster") != site or partition.get("topic") != topic \
                or not isinstance(partition.get("partition"), int):
            continue
        if value is None:
            copied.pop(partition["partition"], None)
            continue
        try:
            offset = json.loads(value)["offset"]
        except (TypeError, ValueError, KeyError):
            continue
        if isinstance(offset, int):
            copied[partition["partition"]] = offset + 1
    return copied


def relay_lag(site_ends: dict[int, tuple[int, int]], copied: dict[int, int]) -> int:
    """Records of a site's topic that MirrorMaker has not copied: per partition, from the next offset
    to copy (or the oldest offset there, if it has copied nothing yet) to the end. Offsets, not
    end-offset differences between the tiers: under exactly-once MirrorMaker's transaction markers
    take offsets at the datacenter too, which made the old difference go negative."""
    return sum(max(0, high - max(low, copied.get(partition, low))) for partition, (low, high) in site_ends.items())


def read_all(client: Client, topic: str, timeout: float = 15) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed record (key, value) of a small topic, oldest first per partition. Read to the end:
    the last record read in each partition is at most one offset before its end, which leaves room for
    the marker that commits a transaction (MirrorMaker writes its offsets in transactions)."""
    consumer = _consumer(client)
    try:
        partitions = _partitions(consumer, topic)
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions}
        consumer.assign([TopicPartition(topic, tp.partition, 0) for tp in partitions])  # 0: from the earliest
        records: list[tuple[bytes | None, bytes | None]] = []
        last = {p: -1 for p in ends}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = consumer.consume(1000, timeout=1.0)
            for msg in batch:
                if msg.error() is None:
                    records.append((msg.key(), msg.value()))
                    last[msg.partition()] = msg.offset()
            if not batch and all(end == 0 or last[p] >= max(0, end - 2) for p, end in ends.items()):
                return records
        raise TimeoutError(f"{topic} not read to the end in {timeout:.0f}s")
    finally:
        consumer.close()


def site_relay_lag(site_client: Client, datacenter: Client, site: str, topic: str) -> int:
    return relay_lag(partition_ends(site_client, topic),
                     copied_offsets(read_all(datacenter, mm2_offsets_topic(site)), site, topic))


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
        # Threshold events at the site that the datacenter's MirrorMaker has not copied yet.
        lag = _safe(site_relay_lag, client, datacenter, site, names.THRESHOLD_EVENTS) if datacenter else "n/a"
        rows.append({
            "site": site,
            "readings/s": f"{rate:.0f}" if isinstance(rate, float) else rate,
            "readings in kafka": now,
            # Each site's adapter runs in its own group, "<site>-cassandra-adapter" (services/common/names.py).
            "adapter lag": _safe(group_lag, client, names.TEMPERATURE_DATA,
                                 f"{site}-{names.CONSUMER_GROUPS['adapter']}"),
            "events": events_site,
            "relay lag": lag,
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
