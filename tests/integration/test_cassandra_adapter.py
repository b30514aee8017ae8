"""The Cassandra adapter from the services image against the real Kafka and Cassandra images.

One adapter runs for the whole module; each test uses its own sensor ids, so it
counts only its own rows. Every test ends by checking that the group's committed
offsets reached the end of the topic: nothing skipped, nothing left behind.
"""
from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from services.adapter.schema import utc_day
from tooling.testbed.cassandra_node import TLS_DIR, restart, start_cassandra
from tooling.testbed.docker_lab import docker, free_port, wait_until
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster
from tooling.testbed.stack_render import REPO, load_inventory, render_role_template, stack_defaults

TOPIC, DEAD_LETTER, PARTITIONS = "temperature-data", "dead-letter", 3
KEYSPACE, GROUP, SITE = "itest", "itest-adapter", "site-it"
MAPPINGS = f"""
[[table]]
topics = ["{TOPIC}"]
table = "temperature_readings"
contract = "temperature-reading"
ttl_seconds = 86400
"""


@pytest.fixture(scope="module")
def stack(lab, tmp_path_factory):
    kafka = start_kafka_cluster(lab)
    create_topics(kafka, TOPIC, partitions=PARTITIONS)
    create_topics(kafka, DEAD_LETTER, partitions=1)
    cassandra = start_cassandra(lab, memory="1536m", heap="512M", tls=True)      # CQL over TLS, as at a site
    mappings = tmp_path_factory.mktemp("adapter") / "mappings.toml"
    mappings.write_text(MAPPINGS)
    mappings.chmod(0o644)
    metrics_port = free_port()
    lab.run("services", "adapter", "iot-cassandra-adapter", memory="384m", ports={metrics_port: 9102},
            volumes={str(mappings): "/etc/iot/adapter-mappings.toml:ro", cassandra.tls_dir: f"{TLS_DIR}:ro"}, env={
                "ADAPTER_KAFKA_BOOTSTRAP": kafka.internal,
                "ADAPTER_CASSANDRA_HOSTS": cassandra.internal,
                "ADAPTER_CASSANDRA_LOCAL_DC": "dc1",
                "ADAPTER_CASSANDRA_CA_FILE": f"{TLS_DIR}/ca.pem",
                "ADAPTER_GROUP_ID": GROUP,
                "ADAPTER_KEYSPACE": KEYSPACE,
                "ADAPTER_REPLICATION": "dc1:1",
                "ADAPTER_MAPPINGS_FILE": "/etc/iot/adapter-mappings.toml",
                "ADAPTER_WINDOW": "2000",
            })
    session = cassandra.session(timeout=60)
    # A query on the table itself: system_schema can list a new table a moment before it can be used.
    wait_until("adapter created its table", lambda: session.execute(
        f"SELECT sensor_id FROM {KEYSPACE}.temperature_readings LIMIT 1") is not None, timeout=240,
        on_timeout=lambda: lab.logs("adapter"))
    yield lab, kafka, cassandra, session
    session.cluster.shutdown()


def _readings(sensors: int, count: int, start_ms: int) -> list[dict]:
    prefix = uuid.uuid4().hex[:6]
    return [{"sensor_id": f"{prefix}-{i % sensors}", "timestamp": start_ms + i, "temperature": 15 + (i % 100) / 10,
             "unit": "C"} for i in range(count)]


def _produce(bootstrap: str, records: list, rate: float | None = None) -> None:
    """Readings as the bridge sends them (site and ingest time as headers); raw bytes as they are."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    started = time.monotonic()
    for i, record in enumerate(records):
        if isinstance(record, bytes):
            producer.produce(TOPIC, key=b"bad", value=record, headers=[("site", SITE)])
        else:
            producer.produce(TOPIC, key=record["sensor_id"], value=json.dumps(record), headers=[
                ("site", SITE), ("ingest_ms", str(record["timestamp"] + 3))])
        producer.poll(0)
        if rate:
            time.sleep(max(0.0, started + (i + 1) / rate - time.monotonic()))
    assert producer.flush(60) == 0, "producer could not deliver everything"


def _row_count(session, records: list[dict]) -> int:
    partitions = {(r["sensor_id"], utc_day(r["timestamp"]).date) for r in records if isinstance(r, dict)}
    query = session.prepare(f"SELECT count(*) FROM {KEYSPACE}.temperature_readings "
                            "WHERE site = ? AND sensor_id = ? AND day = ?")
    return sum(session.execute(query, (SITE, sensor, day)).one()[0] for sensor, day in partitions)


def _committed_lag(bootstrap: str) -> int:
    """End offsets minus the group's committed offsets, summed over the partitions."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=20)
        lag = 0
        for tp in committed:
            _low, high = consumer.get_watermark_offsets(tp, timeout=20)
            lag += high - max(tp.offset, 0)
        return lag
    finally:
        consumer.close()


def _wait_written(lab, kafka, session, records: list, timeout: float) -> None:
    expected = sum(1 for r in records if isinstance(r, dict))
    wait_until(f"{expected} rows in cassandra", lambda: _row_count(session, records) >= expected,
               timeout=timeout, interval=3, on_timeout=lambda: lab.logs("adapter"))
    wait_until("committed offsets at the end of the topic", lambda: _committed_lag(kafka.external) == 0,
               timeout=60, interval=2, on_timeout=lambda: lab.logs("adapter"))
    assert _row_count(session, records) == expected


def _adapter_running(lab) -> bool:
    state = docker("inspect", "-f", "{{.State.Running}}", f"{lab.network}-adapter").stdout.strip()
    return state == "true"


def test_adapter_writes_5000_readings_as_5000_rows_with_latency_fields(stack):
    lab, kafka, _cassandra, session = stack
    records = _readings(sensors=20, count=5000, start_ms=int(time.time() * 1000) - 10_000)
    _produce(kafka.external, records)
    _wait_written(lab, kafka, session, records, timeout=240)

    sample = records[1234]
    row = session.execute(
        f"SELECT temperature, unit, event_time, ingest_time, write_time, ingest_latency_ms, write_latency_ms "
        f"FROM {KEYSPACE}.temperature_readings WHERE site = %s AND sensor_id = %s AND day = %s AND event_time = %s",
        (SITE, sample["sensor_id"], utc_day(sample["timestamp"]).date, sample["timestamp"])).one()
    assert row.temperature == sample["temperature"] and row.unit == "C"
    assert row.ingest_latency_ms == 3
    assert row.write_latency_ms >= 3 and row.write_time >= row.ingest_time >= row.event_time
    # The latency query of docs/architecture.md ("Inside the adapter"): one CQL statement per sensor-day.
    stats = session.execute(
        f"SELECT count(*), avg(write_latency_ms), max(write_latency_ms) FROM {KEYSPACE}.temperature_readings "
        "WHERE site = %s AND sensor_id = %s AND day = %s",
        (SITE, sample["sensor_id"], utc_day(sample["timestamp"]).date)).one()
    assert stats[0] == 250 and 0 < stats[1] <= stats[2]
    # Stored latency from the row itself: the coordinator stamped the write when it applied it, after the
    # adapter bound it (write_time), so it is the longer one; the query is docs/architecture.md's.
    stored = session.execute(
        f"SELECT WRITETIME(temperature) / 1000 - toUnixTimestamp(event_time) AS stored_latency_ms, write_latency_ms "
        f"FROM {KEYSPACE}.temperature_readings WHERE site = %s AND sensor_id = %s AND day = %s",
        (SITE, sample["sensor_id"], utc_day(sample["timestamp"]).date)).all()
    assert len(stored) == 250
    assert all(r.write_latency_ms <= r.stored_latency_ms < 300_000 for r in stored), stored[:3]


def test_adapter_catches_up_after_cassandra_is_stopped_for_30s_without_loss_or_skipped_offsets(stack):
    lab, kafka, cassandra, session = stack
    records = _readings(sensors=10, count=6000, start_ms=int(time.time() * 1000))
    # ~60 s of traffic at 100/s; Cassandra goes down 10 s in and stays down 30 s.
    producing = threading.Thread(target=_produce, args=(kafka.external, records, 100.0))
    producing.start()
    time.sleep(10)
    assert _row_count(session, records) > 0, "the adapter was not writing before the outage"
    session.cluster.shutdown()
    lab.stop(cassandra.name)
    time.sleep(30)
    assert _adapter_running(lab), "the adapter exited while Cassandra was down:\n" + lab.logs("adapter")
    restart(lab, cassandra)
    producing.join(timeout=120)
    session = cassandra.session(timeout=60)
    try:
        _wait_written(lab, kafka, session, records, timeout=300)
    finally:
        session.cluster.shutdown()
    assert "consumption paused" in lab.logs("adapter", tail=2000)


def test_invalid_records_go_to_dead_letter_with_reason_and_the_adapter_keeps_writing(stack):
    lab, kafka, cassandra, _session = stack
    good = _readings(sensors=2, count=10, start_ms=int(time.time() * 1000))
    bad_unit = {"sensor_id": "bad-unit", "timestamp": 1, "temperature": 1.0, "unit": "X"}
    _produce(kafka.external, [b"{not json", json.dumps(bad_unit).encode(), *good])
    session = cassandra.session(timeout=60)
    try:
        _wait_written(lab, kafka, session, good, timeout=120)
    finally:
        session.cluster.shutdown()

    consumer = Consumer({"bootstrap.servers": kafka.external, "group.id": f"dlq-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([DEAD_LETTER])
    found: dict[bytes, dict[str, str]] = {}
    deadline = time.monotonic() + 60
    try:
        while len(found) < 2 and time.monotonic() < deadline:
            msg = consumer.poll(1)
            if msg is not None and not msg.error():
                found[msg.value()] = {k: v.decode() for k, v in msg.headers()}
    finally:
        consumer.close()
    not_json = found[b"{not json"]
    assert not_json["dlq_source"] == TOPIC and "invalid JSON" in not_json["dlq_reason"]
    assert int(not_json["dlq_time_ms"]) > 0 and not_json["site"] == SITE   # original headers kept
    assert "unknown value 'X'" in found[json.dumps(bad_unit).encode()]["dlq_reason"]
    assert _adapter_running(lab)


def _committed_total(bootstrap: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=20)
        return sum(max(tp.offset, 0) for tp in committed)
    finally:
        consumer.close()


def test_adapter_on_sigterm_finishes_writes_commits_only_written_records_and_exits_0(stack):
    lab, kafka, cassandra, _session = stack
    before = _committed_total(kafka.external)
    records = _readings(sensors=5, count=20_000, start_ms=int(time.time() * 1000))
    _produce(kafka.external, records)
    session = cassandra.session(timeout=60)
    try:
        wait_until("the adapter writing", lambda: _row_count(session, records) > 0, timeout=120)
        docker("stop", "-t", "30", f"{lab.network}-adapter", timeout=60)
        exit_code = docker("inspect", "-f", "{{.State.ExitCode}}", f"{lab.network}-adapter").stdout.strip()
        assert exit_code == "0", lab.logs("adapter")
        assert "unfinished=0" in lab.logs("adapter", tail=20)
        committed = _committed_total(kafka.external) - before
        assert 0 < committed <= _row_count(session, records)
    finally:
        session.cluster.shutdown()



def test_the_datacenter_stores_relayed_readings_with_their_site_when_the_inventory_relays_them(stack, tmp_path):
    """A datacenter adapter with the mappings the stack role renders when `temperature-data` is in
    stack_relay_topics reads the mirrored `<site>.temperature-data` and writes each reading under the
    site it came from (its `site` header, which MirrorMaker copies along)."""
    lab, kafka, cassandra, _session = stack
    hostvars, groups = load_inventory(REPO / "inventory.example")
    relayed = [*stack_defaults()["stack_relay_topics"], TOPIC]
    mappings = tmp_path / "dc-mappings.toml"
    mappings.write_text(render_role_template("adapter-mappings.toml.j2", hostvars, groups, "datacenter", "datacenter",
                                             stack_relay_topics=relayed))
    mappings.chmod(0o644)
    tmp_path.chmod(0o755)
    mirrored, keyspace = f"site-a.{TOPIC}", "itest_dc"
    create_topics(kafka, mirrored, partitions=PARTITIONS)
    lab.run("services", "dc-adapter", "iot-cassandra-adapter", memory="384m",
            volumes={str(mappings): "/etc/iot/adapter-mappings.toml:ro", cassandra.tls_dir: f"{TLS_DIR}:ro"}, env={
                "ADAPTER_KAFKA_BOOTSTRAP": kafka.internal, "ADAPTER_CASSANDRA_HOSTS": cassandra.internal,
                "ADAPTER_CASSANDRA_LOCAL_DC": "dc1",
                "ADAPTER_CASSANDRA_CA_FILE": f"{TLS_DIR}/ca.pem",
                "ADAPTER_GROUP_ID": "datacenter-cassandra-adapter",
                "ADAPTER_KEYSPACE": keyspace, "ADAPTER_REPLICATION": "dc1:1",
                "ADAPTER_MAPPINGS_FILE": "/etc/iot/adapter-mappings.toml"})
    session = cassandra.session(timeout=60)      # the module's session predates Cassandra's restart above
    try:
        # Prepared once the table is usable: system_schema can list a new table a moment before a
        # statement on it prepares ("table temperature_readings does not exist", CI 2026-11-25).
        prepared = []

        def table_usable() -> bool:
            prepared.append(session.prepare(f"SELECT count(*) FROM {keyspace}.temperature_readings "
                                            "WHERE site = ? AND sensor_id = ? AND day = ?"))
            return True

        wait_until("the datacenter adapter created its readings table", table_usable, timeout=240,
                   on_timeout=lambda: lab.logs("dc-adapter"))
        query = prepared[-1]
        records = _readings(sensors=4, count=200, start_ms=int(time.time() * 1000))
        producer = Producer({"bootstrap.servers": kafka.external})
        for record in records:
            producer.produce(mirrored, key=record["sensor_id"], value=json.dumps(record),
                             headers=[("site", "site-a"), ("ingest_ms", str(record["timestamp"] + 2))])
        assert producer.flush(60) == 0
        partitions = {(r["sensor_id"], utc_day(r["timestamp"]).date) for r in records}

        def stored() -> int:
            return sum(session.execute(query, ("site-a", sensor, day)).one()[0] for sensor, day in partitions)

        wait_until("200 relayed readings in the datacenter's table under site-a", lambda: stored() >= 200,
                   timeout=240, interval=3, on_timeout=lambda: lab.logs("dc-adapter"))
        assert stored() == 200
    finally:
        session.cluster.shutdown()
        docker("rm", "-f", f"{lab.network}-dc-adapter", check=False)


def test_a_readings_table_created_before_device_id_gets_the_column_at_start_and_stores_it(stack, tmp_path):
    """Issue 26: readings name their device. A table an older adapter created has no device_id column; the
    adapter adds it at start (ALTER TABLE ... ADD IF NOT EXISTS) and writes the device of each reading."""
    from dataclasses import replace

    from services.adapter.schema import create_keyspace_cql, create_table_cql, layout
    from services.common import contracts

    lab, kafka, cassandra, _session = stack
    keyspace, topic = "itest_old", "legacy-temperature-data"
    readings = layout(contracts.READING.name)
    before = replace(readings, columns=tuple(c for c in readings.columns if c[0] != "device_id"))
    session = cassandra.session(timeout=60)
    try:
        session.execute(create_keyspace_cql(keyspace, {"dc1": 1}), timeout=60)
        session.execute(create_table_cql(keyspace, "temperature_readings", before), timeout=60)

        def columns() -> set[str]:
            return {r.column_name for r in session.execute(
                "SELECT column_name FROM system_schema.columns WHERE keyspace_name = %s AND table_name = %s",
                (keyspace, "temperature_readings"))}

        assert "device_id" not in columns()
        create_topics(kafka, topic, partitions=1)
        mappings = tmp_path / "legacy-mappings.toml"
        mappings.write_text(MAPPINGS.replace(f'topics = ["{TOPIC}"]', f'topics = ["{topic}"]'))
        mappings.chmod(0o644)
        tmp_path.chmod(0o755)
        lab.run("services", "legacy-adapter", "iot-cassandra-adapter", memory="384m",
                volumes={str(mappings): "/etc/iot/adapter-mappings.toml:ro", cassandra.tls_dir: f"{TLS_DIR}:ro"}, env={
                    "ADAPTER_KAFKA_BOOTSTRAP": kafka.internal, "ADAPTER_CASSANDRA_HOSTS": cassandra.internal,
                    "ADAPTER_CASSANDRA_LOCAL_DC": "dc1",
                    "ADAPTER_CASSANDRA_CA_FILE": f"{TLS_DIR}/ca.pem", "ADAPTER_GROUP_ID": "itest-legacy-adapter",
                    "ADAPTER_KEYSPACE": keyspace, "ADAPTER_REPLICATION": "dc1:1",
                    "ADAPTER_MAPPINGS_FILE": "/etc/iot/adapter-mappings.toml"})
        # Prepared once the column is usable: system_schema can list it a moment before a statement naming
        # it prepares ("Undefined column name device_id", 2026-11-29), as with a new table above.
        prepared = []

        def column_usable() -> bool:
            prepared.append(session.prepare(f"SELECT sensor_id, toUnixTimestamp(event_time) AS ms, device_id "
                                            f"FROM {keyspace}.temperature_readings "
                                            "WHERE site = ? AND sensor_id = ? AND day = ?"))
            return "device_id" in columns()

        wait_until("the adapter added device_id", column_usable, timeout=240,
                   on_timeout=lambda: lab.logs("legacy-adapter"))
        records = _readings(sensors=2, count=10, start_ms=int(time.time() * 1000))
        for i, record in enumerate(records):
            if i % 2:
                record["device_id"] = f"dev-{record['sensor_id']}"      # every other one names its device
        producer = Producer({"bootstrap.servers": kafka.external})
        for record in records:
            producer.produce(topic, key=record["sensor_id"], value=json.dumps(record),
                             headers=[("site", SITE), ("ingest_ms", str(record["timestamp"] + 1))])
        assert producer.flush(60) == 0
        query = prepared[-1]
        partitions = {(r["sensor_id"], utc_day(r["timestamp"]).date) for r in records}

        def stored() -> dict:
            rows = [row for sensor, day in partitions for row in session.execute(query, (SITE, sensor, day))]
            return {(row.sensor_id, row.ms): row.device_id for row in rows}

        wait_until("10 readings stored", lambda: len(stored()) >= 10, timeout=240, interval=3,
                   on_timeout=lambda: lab.logs("legacy-adapter"))
        assert stored() == {(r["sensor_id"], r["timestamp"]): r.get("device_id") for r in records}
        assert "added a column to an existing table" in lab.logs("legacy-adapter", tail=400)
    finally:
        session.cluster.shutdown()
        docker("rm", "-f", f"{lab.network}-legacy-adapter", check=False)
