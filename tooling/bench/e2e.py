"""Benchmark: the whole data path, from a device's MQTT publish to both tiers' Kafka and Cassandra.

    scripts/bench e2e [--rates 1000,5000,10000] [--seconds 60] [--sensors 1000] [--publishers 2]

One edge site and the datacenter run as plain containers of the project's images with the settings the stack
role renders (tooling.testbed.pipeline says what differs). Paced publishers (paho-mqtt, QoS 1, over TLS as
devices) send readings at each rate for --seconds, each sensor alternating --run hot and --run cold readings.
Every figure is measured against a reading's publish time:

  a  device -> site Kafka              b  device -> site Cassandra (b1: -> bridge, b2: -> adapter; b0: thesis adapter)
  c  device -> datacenter Kafka        d  device -> datacenter Cassandra
  e  hot reading -> event at the site  f  hot reading -> event in the datacenter's Cassandra

Counts are checked, not assumed. How each path is measured, what the counts hold, and the figures:
docs/development.md, "Benchmarks". Figures are indicative: everything shares one 2-core machine.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from tooling.bench.latency import percentiles

PATHS = {
    "a": "device -> site Kafka",
    "b": "device -> site Cassandra",
    "b1": "  of which device -> bridge",
    "b2": "  of which device -> adapter",
    "b0": "  thesis adapter (sync INSERT)",
    "c": "device -> datacenter Kafka",
    "d": "device -> datacenter Cassandra",
    "e": "hot reading -> event, site Kafka",
    "f": "hot reading -> event, dc Cassandra",
}
HOT, COLD = 35.0, 20.0           # the threshold detector's default limit is 30 C with 2 C hysteresis
BASELINE_KEYSPACE = "thesis"
READINGS_TABLE = "temperature_readings"
EVENTS_TABLE = "temperature_threshold_events"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench e2e", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="1000,5000,10000", help="readings per second, comma separated")
    p.add_argument("--seconds", type=float, default=60, help="publishing time per rate (60)")
    p.add_argument("--sensors", type=int, default=1000, help="sensors per rate, spread over the publishers (1000)")
    p.add_argument("--publishers", type=int, default=2, help="publishing processes, one device login each (2)")
    p.add_argument("--run", type=int, default=25, help="readings per hot or cold run of a sensor (25)")
    p.add_argument("--drain", type=float, default=180, help="max seconds to wait for the last records per rate")
    p.add_argument("--warmup-timeout", type=float, default=900, help="max seconds until the pipeline is warm")
    args = p.parse_args(argv)
    try:
        args.rates = [int(r) for r in args.rates.split(",")]
    except ValueError:
        p.error(f"--rates: expected whole numbers separated by commas, got {args.rates!r}")
    if min(args.rates) < 1 or args.seconds <= 0 or args.run < 1 or args.publishers < 1 \
            or args.sensors < args.publishers:
        p.error("--rates, --seconds and --run must be positive, and --sensors at least --publishers")
    return args


# ------------------------------------------------------------------ devices (one process each)

def temperature(n: int, run: int) -> float:
    """The n-th reading of a sensor: `run` hot, `run` cold, and so on."""
    return HOT if (n // run) % 2 == 0 else COLD


def episodes(readings: int, run: int) -> int:
    """Hot runs begun by a sensor's first `readings` readings (each opens one threshold episode)."""
    return (readings + 2 * run - 1) // (2 * run)


def publish(port: int, ca: str, device: str, password: str, rate: float, seconds: float, sensors: list[str],
            run: int, results) -> None:
    """Publish `rate` readings/s for `seconds` round robin over `sensors`; put the counts on `results`."""
    import paho.mqtt.client as mqtt

    from services.common import names

    acked, refused, lock = [0], [0], threading.Lock()

    def on_publish(_client, _userdata, _mid, reason, _properties) -> None:
        with lock:
            if getattr(reason, "value", reason) == 0:
                acked[0] += 1
            else:
                refused[0] += 1

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=device, protocol=mqtt.MQTTv5)
    client.username_pw_set(device, password)
    client.tls_set(ca_certs=ca)
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    client.on_publish = on_publish
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    counts = [0] * len(sensors)         # readings sent per sensor (its hot/cold phase)
    last_ms = [0] * len(sensors)
    topics = [names.MQTT_READINGS.format(site="site-a", device_id=device, sensor_id=s) for s in sensors]
    sent, start = 0, time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) - sent
        now_ms = int(time.time() * 1000)
        for _ in range(due):
            i = sent % len(sensors)
            event_ms = last_ms[i] = max(now_ms, last_ms[i] + 1)      # one row per reading
            client.publish(topics[i], json.dumps({"timestamp": event_ms, "temperature": temperature(counts[i], run),
                                                  "unit": "C"}), qos=1)
            counts[i] += 1
            sent += 1
        time.sleep(0.005)
    took = time.monotonic() - start
    deadline = time.monotonic() + 60
    while acked[0] + refused[0] < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    client.disconnect()
    client.loop_stop()
    # PUBACKs come in publish order: the acknowledged readings are the first acked[0] sent, round robin.
    share = [acked[0] // len(sensors) + (i < acked[0] % len(sensors)) for i in range(len(sensors))]
    results.put({"device": device, "sent": sent, "acked": acked[0], "refused": refused[0], "seconds": took,
                 "episodes": sum(episodes(c, run) for c in share)})


# ------------------------------------------------------------------ the thesis adapter (its own process)

def thesis_adapter(bootstrap: str, offsets: dict[int, int], cql_port: int, stop, written, ca_file: str = "") -> None:
    """The baseline: from `offsets` of temperature-data on, poll one record, INSERT it with a blocking
    execute, next. Same row builder and table shape as the adapter; server-side write timestamps."""
    from cassandra.cluster import Cluster
    from confluent_kafka import Consumer, TopicPartition

    from services.adapter.schema import create_keyspace_cql, create_table_cql, insert_cql, layout, row_builder
    from services.common import contracts, names
    from services.common.cql_tls import cql_tls_context
    from tooling.bench.adapter import insert_one

    cluster = Cluster(["127.0.0.1"], port=cql_port, protocol_version=5, ssl_context=cql_tls_context(ca_file))
    session = cluster.connect()
    session.use_client_timestamp = False
    lay = layout(contracts.READING.name)
    build = row_builder(lay)
    session.execute(create_keyspace_cql(BASELINE_KEYSPACE, {"site-a": 1}), timeout=60)
    session.execute(create_table_cql(BASELINE_KEYSPACE, READINGS_TABLE, lay), timeout=60)
    insert = session.prepare(insert_cql(BASELINE_KEYSPACE, READINGS_TABLE, lay))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-thesis-adapter",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(names.TEMPERATURE_DATA, p, o) for p, o in offsets.items()])
    while not stop.is_set():
        msg = consumer.poll(0.1)
        if msg is None or msg.error():
            continue
        insert_one(session, insert, build, msg)
        written.value += 1
    consumer.close()
    cluster.shutdown()


# ------------------------------------------------------------------ observers (threads here)

class KafkaObserver(threading.Thread):
    """Receipt time - event time of every record of `topic`, per rate tag (the sensor id's prefix)."""

    def __init__(self, client: dict, topic: str, opening_events_only: bool = False) -> None:
        from confluent_kafka import Consumer

        super().__init__(daemon=True, name=f"observe {topic}")
        self.consumer = Consumer({**client, "group.id": f"bench-e2e-{topic}", "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False, "isolation.level": "read_committed",
                                  "topic.metadata.refresh.interval.ms": 2000})
        self.topic, self.opening_only = topic, opening_events_only
        self.latencies: dict[str, list[int]] = defaultdict(list)
        self.stopped = threading.Event()

    def run(self) -> None:
        self.consumer.subscribe([self.topic])
        while not self.stopped.is_set():
            # consume() waits until it has the whole batch or the timeout passed: keep that wait short
            batch = self.consumer.consume(num_messages=2000, timeout=0.005)
            now_ms = int(time.time() * 1000)
            for msg in batch:
                if msg.error() is not None:
                    continue
                value = json.loads(msg.value())
                if self.opening_only and not value.get("is_first"):
                    continue
                self.latencies[value["sensor_id"].split("-", 1)[0]].append(now_ms - value["timestamp"])
        self.consumer.close()

    def count(self, tag: str) -> int:
        return len(self.latencies.get(tag, ()))


def stored_latencies(session, keyspace: str, table: str, sensors: list[str], days: list, opening_only: bool = False,
                     stages: dict[str, list[int]] | None = None) -> list[int]:
    """WRITETIME - event time of every row of `sensors` (opening events only, for the events table); with
    `stages`, each reading's ingest_latency_ms (the bridge's receipt) and write_latency_ms (the adapter's
    bind) are appended to stages["b1"] and stages["b2"]."""
    column = "temperature" if table == READINGS_TABLE else "temperature_threshold"
    extra = ", is_first" if opening_only else ", ingest_latency_ms, write_latency_ms" if stages is not None else ""
    query = session.prepare(f"SELECT WRITETIME({column}) AS written, event_time{extra} FROM {keyspace}.{table} "
                            "WHERE site = ? AND sensor_id = ? AND day = ?")
    futures = [session.execute_async(query, ("site-a", s, day)) for s in sensors for day in days]
    latencies = []
    for future in futures:
        for row in future.result():
            if opening_only and not row.is_first:
                continue
            event_ms = int(row.event_time.timestamp() * 1000)
            latencies.append(row.written // 1000 - event_ms)
            if stages is not None:
                stages["b1"].append(row.ingest_latency_ms)
                stages["b2"].append(row.write_latency_ms)
    return latencies


def end_offsets(client: dict, topic: str) -> dict[int, int]:
    """partition -> end offset of `topic`."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**client, "group.id": "bench-e2e-offsets"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def group_lag(client: dict, topic: str, group: str) -> int:
    """Records of `topic` that `group` has not committed (the adapters commit after the write)."""
    from confluent_kafka import Consumer, TopicPartition

    ends = end_offsets(client, topic)
    consumer = Consumer({**client, "group.id": group, "enable.auto.commit": False})
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in ends], timeout=10)
        return sum(ends[tp.partition] - max(tp.offset, 0) for tp in committed)
    finally:
        consumer.close()


# ------------------------------------------------------------------ one rate

def publish_phase(pipeline, observers: dict, args: argparse.Namespace, rate: int, tag: str,
                  baseline_written=None) -> tuple[list[str], dict]:
    """Every publisher at its share of `rate` for --seconds; returns the phase's sensors and counts."""
    from tooling.build.progress import log

    spawn = multiprocessing.get_context("spawn")
    devices = sorted(pipeline.devices)[:args.publishers]
    sensors = {d: [f"{tag}-{d}-{k}" for k in range(args.sensors // len(devices))] for d in devices}
    from tooling.testbed import pipeline as stack
    stack.register_sensors(pipeline, sensors)
    results = spawn.Queue()
    publishers = [spawn.Process(target=publish, args=(pipeline.mqtt_port, pipeline.mqtt_ca, d, pipeline.devices[d],
                                                      rate / len(devices), args.seconds, sensors[d], args.run, results),
                                daemon=True) for d in devices]
    for p in publishers:
        p.start()
    cpu: dict[str, float] = {}
    sampler = threading.Timer(args.seconds / 2, lambda: cpu.update(container_cpu(pipeline.lab)))
    sampler.start()
    while any(p.is_alive() for p in publishers):
        time.sleep(1)
        log("publish", f"{tag}: {observers['a'].count(tag)} readings in the site's Kafka, "
                       f"{observers['c'].count(tag)} at the datacenter"
                       + ("" if baseline_written is None else f", thesis adapter {baseline_written.value}"),
            every=10)
    sent = [results.get(timeout=30) for _ in publishers]
    counts = {"published": sum(r["sent"] for r in sent), "acked": sum(r["acked"] for r in sent),
              "refused": sum(r["refused"] for r in sent), "events_expected": sum(r["episodes"] for r in sent),
              "achieved_rate": round(sum(r["sent"] for r in sent) / max(r["seconds"] for r in sent))}
    sampler.join()
    counts["cpu"] = cpu
    log("publish", f"{tag}: {counts['published']} published, {counts['acked']} acknowledged", force=True)
    return [s for group in sensors.values() for s in group], counts


def container_cpu(lab) -> dict[str, float]:
    """CPU of each container now, in % of one core (docker stats), largest first: where the time goes."""
    from tooling.testbed.docker_lab import docker

    out = docker("stats", "--no-stream", "--format", "{{.Name}} {{.CPUPerc}}", *lab.containers, check=False).stdout
    cpu = {}
    for line in out.splitlines():
        name, _, percent = line.rpartition(" ")
        try:
            cpu[name.removeprefix(lab.network + "-")] = float(percent.rstrip("%"))
        except ValueError:
            continue
    return dict(sorted(cpu.items(), key=lambda item: -item[1]))


def run_rate(pipeline, observers: dict, sessions: dict, args: argparse.Namespace, rate: int) -> dict:
    """The pipeline at `rate`, then the thesis adapter at the same rate with the site's adapter paused (so
    each has the site's Cassandra to itself, and the pipeline's figures do not pay for the baseline's CPU)."""
    from services.adapter.schema import utc_day
    from services.common import names
    from tooling.build.progress import log
    from tooling.testbed import pipeline as stack
    from tooling.testbed.docker_lab import docker

    tag = f"r{rate}"
    site, dc = pipeline.site_kafka.client(), pipeline.dc_kafka.client()
    begin_ms = int(time.time() * 1000)
    sensors, counts = publish_phase(pipeline, observers, args, rate, tag)
    acked, expected_events = counts["acked"], counts["events_expected"]
    relayed = [stack.RELAYED_READINGS, f"{stack.SITE}.{names.THRESHOLD_EVENTS}"]

    def drained() -> bool:
        # At the datacenter each partition may end in a transaction marker that no commit passes.
        return (observers["a"].count(tag) >= acked and observers["c"].count(tag) >= acked
                and observers["e"].count(tag) >= expected_events
                and group_lag(site, names.TEMPERATURE_DATA, f"{stack.SITE}-cassandra-adapter") == 0
                and all(group_lag(dc, topic, f"{stack.DATACENTER}-cassandra-adapter") <= len(end_offsets(dc, topic))
                        for topic in relayed))

    deadline = time.monotonic() + args.drain
    while time.monotonic() < deadline and not drained():
        time.sleep(2)
        log("drain", f"{tag}: site {observers['a'].count(tag)}/{acked}, datacenter "
                     f"{observers['c'].count(tag)}/{acked}, events {observers['e'].count(tag)}/{expected_events}",
            every=10)
    days = sorted({utc_day(begin_ms).date, utc_day(int(time.time() * 1000)).date})
    log("count", f"{tag}: reading write times from both Cassandras", force=True)
    stages: dict[str, list[int]] = {"b1": [], "b2": []}
    figures = {
        "a": observers["a"].latencies.get(tag, []),
        "b": stored_latencies(sessions["site"], "iot", READINGS_TABLE, sensors, days, stages=stages),
        **stages,
        "c": observers["c"].latencies.get(tag, []),
        "d": stored_latencies(sessions["dc"], "iot", READINGS_TABLE, sensors, days),
        "e": observers["e"].latencies.get(tag, []),
        "f": stored_latencies(sessions["dc"], "iot", EVENTS_TABLE, sensors, days, opening_only=True),
    }

    log("baseline", f"{rate}/s again, into the thesis adapter; the site's adapter paused", force=True)
    adapter = f"{pipeline.lab.network}-cassandra-adapter"
    spawn = multiprocessing.get_context("spawn")
    stop_baseline, written = spawn.Event(), spawn.Value("q", 0)
    baseline = spawn.Process(target=thesis_adapter, args=(pipeline.site_kafka.external,
                                                           end_offsets(site, names.TEMPERATURE_DATA),
                                                           pipeline.site_cassandra.host_port, stop_baseline, written,
                                                           pipeline.site_cassandra.ca_file),
                             daemon=True)
    docker("pause", adapter)
    try:
        baseline.start()
        baseline_sensors, baseline_counts = publish_phase(pipeline, observers, args, rate, f"{tag}t", written)
        deadline = time.monotonic() + args.drain
        while time.monotonic() < deadline and written.value < baseline_counts["acked"]:
            time.sleep(1)
            log("drain", f"{tag}t: thesis adapter {written.value}/{baseline_counts['acked']}", every=10)
        stop_baseline.set()
        baseline.join(30)
    finally:
        docker("unpause", adapter)
    figures["b0"] = stored_latencies(sessions["site"], BASELINE_KEYSPACE, READINGS_TABLE, baseline_sensors, days)
    deadline = time.monotonic() + args.drain       # the site's adapter catches up before the next rate
    while time.monotonic() < deadline and group_lag(site, names.TEMPERATURE_DATA, f"{stack.SITE}-cassandra-adapter"):
        time.sleep(2)
        log("drain", f"{tag}t: the site's adapter catching up", every=10)
    return {"rate": rate, **counts, "baseline_acked": baseline_counts["acked"],
            "paths": {k: percentiles(v) for k, v in figures.items()}}


# ------------------------------------------------------------------ warm-up, table, main

def warm_up(pipeline, observers: dict, sessions: dict, args: argparse.Namespace) -> None:
    """Publish a little until every stage has handled a record: the Spark job has started, MirrorMaker
    has found the topics and the datacenter adapter subscribed to the relayed ones."""
    from tooling.build.progress import log
    from tooling.testbed import pipeline as stack

    spawn = multiprocessing.get_context("spawn")
    device = sorted(pipeline.devices)[0]
    sensors = [f"warm-{device}-{k}" for k in range(20)]
    stack.register_sensors(pipeline, {device: sensors})    # the bridge dead-letters a sensor not registered to it
    deadline = time.monotonic() + args.warmup_timeout
    while time.monotonic() < deadline:
        results = spawn.Queue()
        p = spawn.Process(target=publish, args=(pipeline.mqtt_port, pipeline.mqtt_ca, device,
                                                pipeline.devices[device], 100, 5, sensors, 5, results), daemon=True)
        p.start()
        p.join(120)
        stages = {"site kafka": observers["a"].count("warm"), "datacenter kafka": observers["c"].count("warm"),
                  "site events": observers["e"].count("warm"),
                  "datacenter events": len(stored_latencies(sessions["dc"], "iot", EVENTS_TABLE, sensors,
                                                            _today(), opening_only=True))}
        log("warm-up", ", ".join(f"{k} {v}" for k, v in stages.items()), force=True)
        if all(stages.values()):
            return
        if dead := stack.stopped(pipeline.lab):
            raise SystemExit(f"bench e2e: {', '.join(dead)} stopped:\n{pipeline.lab.all_logs(tail=40)}")
    raise SystemExit(f"bench e2e: the pipeline did not warm up in {args.warmup_timeout:.0f}s\n"
                     f"{pipeline.lab.all_logs(tail=40)}")


def _today() -> list:
    from services.adapter.schema import utc_day
    return [utc_day(int(time.time() * 1000)).date]


def _cell(value) -> str:
    return "-" if value is None else f"{value:,}"


def print_table(results: list[dict]) -> None:
    print("\nend-to-end latency, ms (event time = the device's publish time; one 2-core machine, indicative)")
    print(f"{'rate/s':>7} {'path':<38}{'count':>16}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}")
    for r in results:
        counts = {**dict.fromkeys(("a", "b", "b1", "b2", "c", "d"), r["acked"]), "b0": r["baseline_acked"],
                  "e": r["events_expected"], "f": r["events_expected"]}
        for key, label in PATHS.items():
            f = r["paths"][key]
            print(f"{r['rate']:>7} {key + ' ' + label:<38}{f['n']:>8,}/{counts[key]:<7,}{_cell(f['p50']):>9}"
                  f"{_cell(f['p95']):>9}{_cell(f['p99']):>9}{_cell(f['max']):>9}")
        b, b0 = r["paths"]["b"], r["paths"]["b0"]
        if b["p50"] and b0["p50"]:
            print(f"{'':>8}thesis adapter / adapter, p50: {b0['p50'] / b['p50']:.1f}x   p99: "
                  f"{b0['p99'] / max(b['p99'], 1):.1f}x   (stored {b0['n']:,} vs {b['n']:,})")
        print(f"{'':>8}published {r['published']:,} (achieved {r['achieved_rate']:,}/s), acknowledged "
              f"{r['acked']:,}, refused {r['refused']:,}; counts are received or stored / expected")
        if r.get("cpu"):
            total = sum(r["cpu"].values())
            print(f"{'':>8}CPU mid-run, % of one core (2 cores = 200): containers {total:.0f}, "
                  + ", ".join(f"{name} {percent:.0f}" for name, percent in r["cpu"].items() if percent >= 1))


def lost(results: list[dict]) -> list[str]:
    """Paths of the pipeline (not the baseline) that hold fewer records than were acknowledged or expected."""
    problems = []
    for r in results:
        for key in ("a", "b", "c", "d"):
            if r["paths"][key]["n"] < r["acked"]:
                problems.append(f"{r['rate']}/s {key}: {r['paths'][key]['n']:,} of {r['acked']:,}")
        for key in ("e", "f"):
            if r["paths"][key]["n"] < r["events_expected"]:
                problems.append(f"{r['rate']}/s {key}: {r['paths'][key]['n']:,} of {r['events_expected']:,} events")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from services.common import names
    from tooling.build.progress import log
    from tooling.testbed import pipeline as stack
    from tooling.testbed.docker_lab import Lab

    lab = Lab()
    sessions: dict = {}
    observers: dict = {}
    try:
        devices = {f"bench-device-{i}": f"bench-device-password-{i}" for i in range(args.publishers)}
        pipeline = stack.start(lab, Path(tempfile.mkdtemp(prefix="bench-e2e-")), devices)
        sessions = {"site": pipeline.site_cassandra.session(timeout=60),
                    "dc": pipeline.dc_cassandra.session(timeout=60)}
        observers = {"a": KafkaObserver(pipeline.site_kafka.client(), names.TEMPERATURE_DATA),
                     "c": KafkaObserver(pipeline.dc_kafka.client(), stack.RELAYED_READINGS),
                     "e": KafkaObserver(pipeline.site_kafka.client(), names.THRESHOLD_EVENTS,
                                        opening_events_only=True)}
        for observer in observers.values():
            observer.start()
        log("warm-up", "publishing 100 readings/s until every stage has handled one", force=True)
        warm_up(pipeline, observers, sessions, args)
        results = []
        for rate in args.rates:
            log("measure", f"{rate} readings/s for {args.seconds:.0f}s", force=True)
            results.append(run_rate(pipeline, observers, sessions, args, rate))
            log("measure", json.dumps(results[-1]), force=True)
            if dead := stack.stopped(lab):
                raise SystemExit(f"bench e2e: {', '.join(dead)} stopped:\n{lab.all_logs(tail=40)}")
    finally:
        for observer in observers.values():
            observer.stopped.set()
        for session in sessions.values():
            session.cluster.shutdown()
        lab.close()
    print_table(results)
    if problems := lost(results):
        print("bench e2e: not everything arrived within --drain: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
