"""Benchmark: the Cassandra adapter versus one synchronous INSERT per record (the thesis adapter).

Starts one Kafka broker and one Cassandra node from the project's images (lab
network and loopback only), produces the same readings for both, then drains
them three times in the same run:

  warm-up   the adapter into its own keyspace, untimed for the comparison: a
            freshly started Cassandra runs interpreted bytecode for its first
            tens of thousands of writes (measured: 11.6k rows/s on the first
            pass, 25.5k on the next), and a production node is warm
  adapter   services.adapter.app.Adapter (in this process): bounded
            async writes, single-partition UNLOGGED batches, commits after write
  baseline  poll one record, INSERT it with session.execute (blocking), next

Prints rows/s of each, the ratio, and checks that each keyspace holds exactly
the produced number of rows. Every phase is bounded in time; a baseline cut
short by --phase-timeout still yields its rate (and says so). Figures are
indicative: the machine is shared with other containers.

    python -m tooling.bench_adapter [--records 200000] [--sensors 200]
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid

from services.common import names
from tooling import progress

TOPIC = "bench-readings"
SITE = "bench"
TARGET_ROWS_S = 15_000


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench adapter", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=200_000, help="readings produced and written by each (200000)")
    p.add_argument("--sensors", type=int, default=200, help="distinct sensors, i.e. partitions per day (200)")
    p.add_argument("--partitions", type=int, default=6, help="Kafka partitions of the topic (6)")
    p.add_argument("--window", type=int, default=10000, help="adapter's in-flight window (10000)")
    p.add_argument("--phase-timeout", type=float, default=60.0, help="seconds each drain may take at most (60)")
    return p.parse_args(argv)


def _produce(bootstrap: str, records: int, sensors: int) -> tuple[int, int]:
    """Readings with distinct (sensor, timestamp); returns the first and last event time."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 200_000})
    start = int(time.time() * 1000) - records
    for i in range(records):
        sensor = f"s-{i % sensors}"
        ts = start + i
        value = json.dumps({"sensor_id": sensor, "timestamp": ts, "temperature": 20 + (i % 50) / 10, "unit": "C"})
        producer.produce(TOPIC, key=sensor, value=value,
                         headers=[(names.HEADER_SITE, SITE), (names.HEADER_INGEST_MS, str(ts + 2))])
        if i % 5000 == 0:
            producer.poll(0)
            progress.log("produce", f"{i}/{records}", every=2)
    if producer.flush(60):
        raise SystemExit("bench adapter: Kafka did not acknowledge every produced record")
    progress.log("produce", f"{records} readings on {TOPIC}", force=True)
    return start, start + records - 1


def _run_adapter(bootstrap: str, cql_port: int, args: argparse.Namespace, keyspace: str,
                 stage: str = "adapter") -> tuple[float, bool]:
    from services.adapter.app import Adapter
    from services.adapter.mappings import parse_mappings
    from services.adapter.settings import load, parser

    settings = load(parser().parse_args([
        "--kafka-bootstrap", bootstrap, "--cassandra-hosts", "127.0.0.1", "--cassandra-port", str(cql_port),
        "--local-dc", "dc1", "--keyspace", keyspace, "--replication", "dc1:1", "--metrics-port", "0",
        "--group-id", f"bench-adapter-{uuid.uuid4().hex[:6]}", "--window", str(args.window)]))
    mappings = parse_mappings(f'[[table]]\ntopics = ["{TOPIC}"]\ntable = "readings"\n'
                              'contract = "temperature-reading"\n')
    stop = threading.Event()
    adapter = Adapter(settings, mappings, stop)
    thread = threading.Thread(target=adapter.run, name="adapter", daemon=True)
    thread.start()
    try:
        # In flight near --window means Cassandra is the limit; far below it, this process's CPU is.
        return _measure(stage, lambda: adapter.written, args.records, args.phase_timeout,
                        lambda: f", in flight {adapter.writer.in_flight if adapter.writer else 0}")
    finally:
        stop.set()
        thread.join(60)


def _run_baseline(bootstrap: str, session, args: argparse.Namespace) -> tuple[float, bool]:
    """The thesis adapter's loop: one record, one blocking INSERT, repeat."""
    from confluent_kafka import Consumer

    from services.adapter.schema import create_keyspace_cql, create_table_cql, insert_cql, layout, row_builder
    from services.common import contracts

    lay = layout(contracts.READING.name)
    build = row_builder(lay)          # the adapter's row builder: the baseline differs only in how it writes
    session.execute(create_keyspace_cql("bench_sync", {"dc1": 1}), timeout=60)
    session.execute(create_table_cql("bench_sync", "readings", lay), timeout=60)
    insert = session.prepare(insert_cql("bench_sync", "readings", lay))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-sync-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([TOPIC])
    written = [0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set() and written[0] < args.records:
            msg = consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            insert_one(session, insert, build, msg)
            written[0] += 1

    thread = threading.Thread(target=loop, name="baseline", daemon=True)
    thread.start()
    try:
        return _measure("baseline", lambda: written[0], args.records, args.phase_timeout)
    finally:
        stop.set()
        thread.join(30)
        consumer.close()


def insert_one(session, insert, build, msg) -> None:
    """The thesis adapter's write: one reading, one blocking INSERT (the adapter's row builder and table)."""
    from services.common import contracts

    record = contracts.READING.validate(json.loads(msg.value()))
    headers = dict(msg.headers())
    row = build(record, headers[names.HEADER_SITE].decode(), int(headers[names.HEADER_INGEST_MS]))
    session.execute(insert, row.bind(int(time.time() * 1000), True))


def _measure(stage: str, written, total: int, timeout: float, detail=lambda: "") -> tuple[float, bool]:
    """Rows/s from the first written row to the last (or to the timeout); True when all were written."""
    deadline = time.monotonic() + timeout + 60          # + time to join the group and get the first rows
    while written() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0, w0 = time.monotonic(), written()
    deadline = t0 + timeout
    while written() < total and time.monotonic() < deadline:
        time.sleep(0.05)
        done = written()
        elapsed = time.monotonic() - t0
        progress.log(stage, f"{done}/{total} rows, {(done - w0) / max(elapsed, 1e-9):,.0f} rows/s{detail()}",
                     every=2)
    elapsed, done = time.monotonic() - t0, written()
    rate = (done - w0) / max(elapsed, 1e-9)
    progress.log(stage, f"{done}/{total} rows in {elapsed:.1f}s: {rate:,.0f} rows/s", force=True)
    return rate, done >= total


def _count(session, keyspace: str, sensors: int, span: tuple[int, int]) -> int:
    from services.adapter.schema import utc_day

    days = {utc_day(span[0]).date, utc_day(span[1]).date}
    query = session.prepare(f"SELECT count(*) FROM {keyspace}.readings WHERE site = ? AND sensor_id = ? AND day = ?")
    return sum(session.execute(query, (SITE, f"s-{s}", day), timeout=60).one()[0]
               for s in range(sensors) for day in days)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from tooling.testbed.cassandra_node import start_cassandra
    from tooling.testbed.docker_lab import Lab, docker
    from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster

    if docker("info", check=False).returncode != 0:
        print("bench adapter: no Docker engine answers (run scripts/engine)", file=sys.stderr)
        return 1
    lab = Lab()
    try:
        progress.log("setup", f"starting kafka and cassandra on network {lab.network}", force=True)
        kafka = start_kafka_cluster(lab, prefix="bench-")
        create_topics(kafka, TOPIC, partitions=args.partitions)
        node = start_cassandra(lab, memory="2g", heap="1G")
        span = _produce(kafka.external, args.records, args.sensors)

        warmup_rate, _ = _run_adapter(kafka.external, node.host_port, args, "bench_warmup", "warm-up")
        adapter_rate, adapter_all = _run_adapter(kafka.external, node.host_port, args, "bench_adapter")
        session = node.session(timeout=60)
        try:
            baseline_rate, baseline_all = _run_baseline(kafka.external, session, args)
            progress.log("verify", "counting rows", force=True)
            adapter_rows = _count(session, "bench_adapter", args.sensors, span)
            baseline_rows = _count(session, "bench_sync", args.sensors, span)
        finally:
            session.cluster.shutdown()
    finally:
        lab.close()

    ratio = adapter_rate / baseline_rate if baseline_rate else float("inf")
    print(f"records produced:            {args.records:,} ({args.sensors} sensors, {args.partitions} partitions)")
    print(f"warm-up pass (cold node):    {warmup_rate:>10,.0f} rows/s   (adapter, first writes of a new JVM)")
    print(f"adapter (async, batched):    {adapter_rate:>10,.0f} rows/s   rows in table {adapter_rows:,}")
    print(f"baseline (sync INSERT/rec):  {baseline_rate:>10,.0f} rows/s   rows in table {baseline_rows:,}"
          + ("" if baseline_all else f"   (stopped after --phase-timeout {args.phase_timeout:.0f}s)"))
    print(f"ratio adapter/baseline:      {ratio:>10.1f}x")
    print(f"target {TARGET_ROWS_S:,} rows/s:        {'met' if adapter_rate >= TARGET_ROWS_S else 'NOT met'}"
          " (indicative: shared 2-core machine)")
    ok = adapter_all and adapter_rows == args.records and (baseline_rows == args.records or not baseline_all)
    if not ok:
        print("row count check FAILED: the adapter must write exactly --records rows", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
