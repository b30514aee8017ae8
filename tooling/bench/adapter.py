"""Benchmark: the Cassandra adapter versus one synchronous INSERT per record (the thesis adapter).

    python -m tooling.bench.adapter [--records 200000] [--sensors 200] [--paced 1000 | --tls-cost]

Starts one Kafka broker and one Cassandra node from the project's images (lab network and loopback only) and
produces the same readings for both. Without --paced it drains them three times in the same run: a warm-up
(the adapter into its own keyspace, untimed), the adapter (services.adapter.app.Adapter, in this process) and
the baseline (poll one record, INSERT it with session.execute, next); it prints rows/s of each and the ratio,
and checks that each keyspace holds exactly the produced number of rows. Every phase is bounded in time; a
baseline cut short by --phase-timeout still yields its rate (and says so). With --paced RATE it prints
device-to-stored latency (the row's WRITETIME - the reading's time) and the writer's CPU instead; with
--tls-cost, its rows/s inside TLS on both links as deployed (Kafka's SERVICES, CQL over TLS) against both
in clear (a plaintext broker with the same readings), and the ratio. Method, figures and why the warm-up:
docs/development.md, "Benchmarks" ("The adapter").
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import threading
import time
import uuid

from services.common import names
from tooling.build import progress

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
    p.add_argument("--paced", type=int, default=0, metavar="RATE",
                   help="measure latency at RATE readings/s instead of draining a backlog")
    p.add_argument("--tls-cost", action="store_true",
                   help="the adapter inside TLS (Kafka SERVICES, CQL) against both in clear, instead of the baseline")
    p.add_argument("--seconds", type=float, default=30.0, help="with --paced: seconds each writer is measured (30)")
    args = p.parse_args(argv)
    if args.paced < 0 or args.seconds <= 0:
        p.error("--paced and --seconds must be positive")
    return args


def _produce(client: dict, records: int, sensors: int) -> tuple[int, int]:
    """Readings with distinct (sensor, timestamp), written with the host client settings `client`; returns
    the first and last event time."""
    from confluent_kafka import Producer

    producer = Producer({**client, "linger.ms": 20, "batch.num.messages": 10000,
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


def _produce_paced(bootstrap: str, topic: str, rate: int, seconds: float, sensors: int, tag: str, count) -> None:
    """RATE readings/s for `seconds` (a child process), each stamped with the time it is sent; the number
    sent goes into `count` (a shared Value)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    start, sent, last = time.monotonic(), 0, {}
    while (elapsed := time.monotonic() - start) < seconds:
        while sent < int(elapsed * rate):
            now = int(time.time() * 1000)
            sensor = f"{tag}-{sent % sensors}"
            # A row is (sensor, timestamp): a sensor's next reading is at least 1 ms after its last, also
            # when this process catches up after a stall.
            stamp = last[sensor] = max(now, last.get(sensor, 0) + 1)
            value = json.dumps({"sensor_id": sensor, "timestamp": stamp, "temperature": 20.0, "unit": "C"})
            producer.produce(topic, key=sensor, value=value,
                             headers=[(names.HEADER_SITE, SITE), (names.HEADER_INGEST_MS, str(now))])
            sent += 1
        producer.poll(0)
        time.sleep(0.002)
    if producer.flush(60):
        raise SystemExit("bench adapter: Kafka did not acknowledge every produced record")
    count.value = sent


def _paced_phase(bootstrap: str, topic: str, rate: int, seconds: float, sensors: int, tag: str,
                 written) -> tuple[int, float]:
    """Produce at `rate` from a child process while this one writes; (readings sent, CPU % of one core
    this process used meanwhile). Waits until `written()` has caught up."""
    import multiprocessing
    import resource

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    context = multiprocessing.get_context("spawn")
    count = context.Value("q", 0)
    child = context.Process(target=_produce_paced, args=(bootstrap, topic, rate, seconds, sensors, tag, count))
    before, t0 = written(), time.monotonic()
    cpu0 = cpu()
    child.start()
    while child.is_alive():
        progress.log("paced", f"{tag}: {written() - before} rows written", every=5)
        time.sleep(0.5)
    used = 100 * (cpu() - cpu0) / (time.monotonic() - t0)
    if child.exitcode != 0:
        raise SystemExit(f"bench adapter: the producer process failed (exit {child.exitcode})")
    sent = count.value
    deadline = time.monotonic() + 60
    while written() - before < sent and time.monotonic() < deadline:
        time.sleep(0.2)
    return sent, used


def _stored_latencies(session, keyspace: str, sensors: int, tag: str) -> list[int]:
    """WRITETIME - event time (ms) of every row of the tag's sensors."""
    from services.adapter.schema import utc_day

    now = int(time.time() * 1000)
    days = {utc_day(now - 120_000).date, utc_day(now).date}
    query = session.prepare(f"SELECT WRITETIME(ingest_time), event_time FROM {keyspace}.readings "
                            "WHERE site = ? AND sensor_id = ? AND day = ?")
    found = []
    for s in range(sensors):
        for day in days:
            for written_us, event_time in session.execute(query, (SITE, f"{tag}-{s}", day), timeout=60):
                event_ms = int(event_time.replace(tzinfo=datetime.UTC).timestamp() * 1000)
                found.append(written_us // 1000 - event_ms)
    return found


def _paced_main(args: argparse.Namespace, kafka, node) -> int:
    """--paced: latency of the adapter and of the baseline at the same rate, one after the other."""
    from tooling.bench.latency import percentiles
    from tooling.testbed.kafka_cluster import create_topics

    sync_topic = f"{TOPIC}-sync"
    create_topics(kafka, sync_topic, partitions=args.partitions)
    adapter, thread, stop = _start_adapter(kafka.external, node.host_port, args.window, "bench_adapter")
    results = {}
    try:
        _paced_phase(kafka.external, TOPIC, args.paced, 10, args.sensors, "warm", lambda: adapter.written)
        results["adapter"] = _paced_phase(kafka.external, TOPIC, args.paced, args.seconds, args.sensors, "a",
                                          lambda: adapter.written)
    finally:
        stop.set()
        thread.join(60)
    session = node.session(timeout=60)
    try:
        written, sync_stop = [0], threading.Event()
        sync = threading.Thread(target=_sync_loop, args=(kafka.external, session, sync_topic, written, sync_stop),
                                daemon=True)
        sync.start()
        try:
            _paced_phase(kafka.external, sync_topic, args.paced, 10, args.sensors, "warm", lambda: written[0])
            results["baseline"] = _paced_phase(kafka.external, sync_topic, args.paced, args.seconds, args.sensors,
                                               "b", lambda: written[0])
        finally:
            sync_stop.set()
            sync.join(30)
        figures = {"adapter": percentiles(_stored_latencies(session, "bench_adapter", args.sensors, "a")),
                   "baseline": percentiles(_stored_latencies(session, "bench_sync", args.sensors, "b"))}
    finally:
        session.cluster.shutdown()
    print(f"device -> stored (WRITETIME - reading time) at {args.paced:,} readings/s for {args.seconds:.0f}s, "
          f"{args.sensors} sensors, ms")
    print(f"{'writer':<30} {'rows':>15} {'p50':>7} {'p95':>7} {'p99':>7} {'max':>7} {'cpu %':>6}")
    labels = {"adapter": "adapter (async, batched)", "baseline": "baseline (sync INSERT/rec)"}
    for name, (sent, cpu) in results.items():
        f = figures[name]
        print(f"{labels[name]:<30} {f['n']:>7,}/{sent:<7,} {f['p50']!s:>7} {f['p95']!s:>7} {f['p99']!s:>7} "
              f"{f['max']!s:>7} {cpu:>6.0f}")
    if figures["adapter"]["p50"] and figures["baseline"]["p50"]:
        print(f"ratio baseline/adapter, p50: {figures['baseline']['p50'] / max(figures['adapter']['p50'], 1):.1f}x")
    # The adapter must have stored every reading. The thesis adapter may still be behind a rate it cannot
    # keep (its figures then leave out the readings not yet written: they understate it).
    behind = results["baseline"][0] - figures["baseline"]["n"]
    if behind > 0:
        print(f"the thesis adapter was {behind:,} readings behind when measured (60 s after the last was sent)")
    ok = figures["adapter"]["n"] == results["adapter"][0]
    if not ok:
        print("row count check FAILED: the adapter must store every produced reading once", file=sys.stderr)
    return 0 if ok else 1


def _start_adapter(bootstrap: str, cql_port: int, window: int, keyspace: str, ca_file: str = ""):
    """services.adapter.app.Adapter writing TOPIC into keyspace.readings (over TLS with `ca_file`), running in a
    thread of this process; returns (adapter, its thread, the event that stops it)."""
    from services.adapter.app import Adapter
    from services.adapter.mappings import parse_mappings
    from services.adapter.settings import load, parser

    settings = load(parser().parse_args([
        "--kafka-bootstrap", bootstrap, "--cassandra-hosts", "127.0.0.1", "--cassandra-port", str(cql_port),
        "--local-dc", "dc1", "--keyspace", keyspace, "--replication", "dc1:1", "--metrics-port", "0",
        "--group-id", f"bench-adapter-{uuid.uuid4().hex[:6]}", "--window", str(window),
        "--cassandra-ca-file", ca_file]))
    mappings = parse_mappings(f'[[table]]\ntopics = ["{TOPIC}"]\ntable = "readings"\n'
                              'contract = "temperature-reading"\n')
    stop = threading.Event()
    adapter = Adapter(settings, mappings, stop)
    thread = threading.Thread(target=adapter.run, name="adapter", daemon=True)
    thread.start()
    return adapter, thread, stop


def _run_adapter(bootstrap: str, cql_port: int, args: argparse.Namespace, keyspace: str,
                 stage: str = "adapter", ca_file: str = "", login: dict[str, str] | None = None) -> tuple[float, bool]:
    """One drain; `login`: the KAFKA_* variables of its Kafka login (tooling.testbed.kafka_cluster)."""
    from tooling.testbed.kafka_cluster import login_environment

    with login_environment(login or {}):     # the adapter opens its Kafka clients in its thread, as it starts
        adapter, thread, stop = _start_adapter(bootstrap, cql_port, args.window, keyspace, ca_file)
        return _drain(adapter, thread, stop, stage, args)


def _drain(adapter, thread, stop, stage: str, args: argparse.Namespace) -> tuple[float, bool]:
    try:
        # In flight near --window means Cassandra is the limit; far below it, this process's CPU is.
        return _measure(stage, lambda: adapter.written, args.records, args.phase_timeout,
                        lambda: f", in flight {adapter.writer.in_flight if adapter.writer else 0}")
    finally:
        stop.set()
        thread.join(60)


def _run_baseline(bootstrap: str, session, args: argparse.Namespace) -> tuple[float, bool]:
    """The thesis adapter's loop: one record, one blocking INSERT, repeat."""
    written = [0]
    stop = threading.Event()
    thread = threading.Thread(target=_sync_loop, args=(bootstrap, session, TOPIC, written, stop, args.records),
                              name="baseline", daemon=True)
    thread.start()
    try:
        return _measure("baseline", lambda: written[0], args.records, args.phase_timeout)
    finally:
        stop.set()
        thread.join(30)


def _sync_loop(bootstrap: str, session, topic: str, written: list[int], stop: threading.Event,
               limit: int | None = None) -> None:
    """The thesis adapter into keyspace bench_sync: poll one record, INSERT it (blocking), count it in
    written[0]; until stop is set (or `limit` rows)."""
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
    consumer.subscribe([topic])
    try:
        while not stop.is_set() and (limit is None or written[0] < limit):
            msg = consumer.poll(0.1)
            if msg is None or msg.error():
                continue
            insert_one(session, insert, build, msg)
            written[0] += 1
    finally:
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


def _tls_cost_main(args: argparse.Namespace, kafka, secure, node) -> int:
    """The adapter's drain rate inside TLS (Kafka's SERVICES from `secure`, CQL over TLS) against both links
    in clear (`kafka`, plaintext; CQL in clear), on the same Cassandra node (issue 30's cost target: TLS keeps
    at least 80 %). Each way drains twice, in the order clear, TLS, TLS, clear, so that the node warming up or
    compacting favours neither."""
    from tooling.testbed.kafka_cluster import services_login

    span = _produce(kafka.client(), args.records, args.sensors)
    secure_span = _produce(secure.client(), args.records, args.sensors)
    _run_adapter(kafka.external, node.host_port, args, "bench_warmup", "warm-up")
    tls_login = services_login(secure)
    rates: dict[str, list[float]] = {"clear": [], "tls": []}
    complete = True
    for i, way in enumerate(("clear", "tls", "tls", "clear")):
        tls = way == "tls"
        rate, all_rows = _run_adapter(secure.services_host if tls else kafka.external, node.host_port, args,
                                      f"bench_{way}_{i}", f"{way} #{i + 1}", node.ca_file if tls else "",
                                      tls_login if tls else None)
        rates[way].append(rate)
        complete = complete and all_rows
    session = node.session(timeout=60)
    try:
        progress.log("verify", "counting rows", force=True)
        counts = [_count(session, f"bench_{way}_{i}", args.sensors, secure_span if way == "tls" else span)
                  for i, way in enumerate(("clear", "tls", "tls", "clear"))]
    finally:
        session.cluster.shutdown()
    clear, tls = (sum(rates[way]) / 2 for way in ("clear", "tls"))
    print(f"records produced:            {args.records:,} ({args.sensors} sensors, {args.partitions} partitions)")
    runs = {way: ", ".join(f"{rate:,.0f}" for rate in rates[way]) for way in rates}
    print(f"adapter, Kafka and CQL in clear:  {clear:>10,.0f} rows/s   (runs: {runs['clear']})")
    print(f"adapter, Kafka and CQL over TLS:  {tls:>10,.0f} rows/s   (runs: {runs['tls']})")
    print(f"ratio TLS/clear:                  {tls / clear if clear else 0:>10.2f}    (target >= 0.80)")
    ok = complete and counts == [args.records] * 4
    if not ok:
        print(f"row count check FAILED: each drain must write exactly --records rows, got {counts}", file=sys.stderr)
    return 0 if ok else 1


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
        node = start_cassandra(lab, memory="2g", heap="1G", tls=args.tls_cost,
                               env={"CASSANDRA_CLIENT_TLS": "optional"} if args.tls_cost else None)
        if args.paced:
            return _paced_main(args, kafka, node)
        if args.tls_cost:
            secure = start_kafka_cluster(lab, prefix="tls-", operator=("operator", "bench-operator-pw"),
                                         services_on_host=True)
            create_topics(secure, TOPIC, partitions=args.partitions)
            return _tls_cost_main(args, kafka, secure, node)
        span = _produce(kafka.client(), args.records, args.sensors)

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
