"""Benchmark: what one edge site costs, idle and per reading, and its latencies under load.

    scripts/bench site [--rates 0,500,1000,2000] [--window 60] [--devices 20] [--baseline]

One edge site as plain containers with the settings the stack role renders (tooling.testbed.pipeline): ZooKeeper,
Kafka, Cassandra, Mosquitto, bridge, adapter, threshold-detector and rollups; a scraper reads the exporters as the
site's Prometheus would. Devices are `mosquitto_pub -l` processes (C, QoS 1, TLS) fed by a pacer here. Per rate:
each service's CPU from its cgroup's counters (tooling.bench.cgroup) over --window, its memory, the machine's busy
cores, Kafka's requests by type, and the latencies a (device -> site Kafka), b (-> site Cassandra) and e (hot
reading -> threshold event). --baseline runs the same site first with Spark's old settings and prints ratios.
Method, what differs from a deployment, and the figures: docs/development.md, "What a site costs".
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tooling.bench import cgroup
from tooling.bench.e2e import COLD, HOT, READINGS_TABLE, KafkaObserver, episodes, group_lag, stored_latencies
from tooling.bench.latency import percentiles

SPARK_JOBS = ("threshold-detector", "rollups")
# Services in the table's order: the site's stateful core, then its data path, then the jobs.
SERVICES = ("zookeeper", "kafka", "cassandra", "mosquitto", "bridge", "cassandra-adapter", *SPARK_JOBS)
PATHS = {"a": "device -> site Kafka", "b": "device -> site Cassandra", "e": "hot reading -> event at the site"}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench site", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="0,500,1000,2000", help="readings per second, comma separated; 0 = idle")
    p.add_argument("--window", type=float, default=60, help="measured seconds per rate (60)")
    p.add_argument("--ramp", type=float, default=20, help="publishing seconds before each window (20)")
    p.add_argument("--settle", type=float, default=60, help="quiet seconds before the idle window (60)")
    p.add_argument("--devices", type=int, default=20, help="mosquitto_pub processes, one device and sensor each (20)")
    p.add_argument("--run", type=int, default=25, help="readings per hot or cold run of a sensor (25)")
    p.add_argument("--drain", type=float, default=180, help="max seconds to wait for the last records per rate")
    p.add_argument("--warmup-timeout", type=float, default=900, help="max seconds until the site is warm")
    p.add_argument("--steady", type=float, default=300,
                   help="seconds of publishing at the first rate above 0, once the site is warm and before any "
                        "window, so that the JVMs' JIT compilation is mostly over, as on a site that has run for "
                        "days (300; 0 measures a freshly started site)")
    p.add_argument("--env", action="append", default=[], metavar="SERVICE:NAME=VALUE",
                   help="an environment variable of zookeeper, kafka or cassandra on top of the stack's, to try a "
                        "setting (e.g. kafka:KAFKA_JVM_OPTS=-XX:TieredStopAtLevel=1); repeatable")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for every job on top of the stack's, to try one (e.g. "
                        "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1); repeatable")
    p.add_argument("--baseline", action="store_true",
                   help="first run the same site with the Spark jobs as before the cuts (back to back, 10 ms "
                        "polling) and print the ratios")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    try:
        args.rates = [int(r) for r in args.rates.split(",")]
    except ValueError:
        p.error(f"--rates: expected whole numbers separated by commas, got {args.rates!r}")
    if min(args.rates) < 0 or args.window <= 0 or args.ramp < 0 or args.steady < 0 or args.devices < 1 or args.run < 1:
        p.error("--rates must be 0 or more; --window, --devices and --run positive; --ramp and --steady 0 or more")
    try:
        args.env = jvm_overrides(args.env)
    except ValueError as err:
        p.error(f"--env: {err}")
    args.conf_items = list(args.conf) + [f"{k}:{n}={v}" for k, pairs in args.env.items() for n, v in pairs.items()]
    try:
        args.conf = spark_conf(args.conf)
    except ValueError as err:
        p.error(f"--conf: {err}")
    if shutil.which("mosquitto_pub") is None:
        p.error("mosquitto_pub is missing: install Debian's mosquitto-clients (scripts/bench does)")
    return args


def jvm_overrides(items: list[str]) -> dict[str, dict[str, str]]:
    """--env's SERVICE:NAME=VALUE items as service -> {name: value}."""
    overrides: dict[str, dict[str, str]] = {}
    for item in items:
        service, _, assignment = item.partition(":")
        name, equals, value = assignment.partition("=")
        if service not in ("zookeeper", "kafka", "cassandra") or not name or not equals:
            raise ValueError(f"expected zookeeper|kafka|cassandra:NAME=VALUE, got {item!r}")
        overrides.setdefault(service, {})[name] = value
    return overrides


def spark_conf(items: list[str]) -> dict[str, str]:
    """--conf's KEY=VALUE items as {key: value}; a key is a Spark setting (spark.*)."""
    conf = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not key.startswith("spark.") or not equals:
            raise ValueError(f"expected spark.KEY=VALUE, got {item!r}")
        conf[key] = value
    return conf


# ------------------------------------------------------------------ devices

def reading(n: int, run: int, now_ms: int) -> str:
    """The n-th reading of a sensor as its device sends it: `run` hot, `run` cold, and so on."""
    temperature = HOT if (n // run) % 2 == 0 else COLD
    return json.dumps({"timestamp": now_ms, "temperature": temperature, "unit": "C"})


def due(elapsed: float, rate: float, sent: int) -> int:
    """Readings to send now so that `sent` catches up with `rate` after `elapsed` seconds."""
    return max(int(elapsed * rate) - sent, 0)


@dataclass
class Devices:
    """One `mosquitto_pub -l` per device, fed one reading per line at `rate` in all (round robin)."""
    port: int
    ca: str
    logins: dict[str, str]                 # device -> password
    topics: dict[str, str]                 # device -> its sensor's topic
    rate: float
    run: int
    sent: dict[str, int] = field(default_factory=dict)
    last_ms: dict[str, int] = field(default_factory=dict)   # a device's last event time: one row per reading
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    stopped: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        for device, topic in self.topics.items():
            self.processes[device] = subprocess.Popen(
                ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(self.port), "--cafile", self.ca, "-V", "mqttv5",
                 "-q", "1", "-i", device, "-u", device, "-P", self.logins[device], "-t", topic, "-l"],
                stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
            self.sent[device], self.last_ms[device] = 0, 0
        self.pacer = threading.Thread(target=self._pace, daemon=True, name="pacer")
        self.pacer.start()

    def _pace(self) -> None:
        devices, total, begin = list(self.processes), 0, time.monotonic()
        while not self.stopped.is_set():
            now_ms = int(time.time() * 1000)
            for _ in range(due(time.monotonic() - begin, self.rate, total)):
                device = devices[total % len(devices)]
                # Readings of a sensor are stored by their event time: two in the same millisecond would be one row.
                event_ms = self.last_ms[device] = max(now_ms, self.last_ms[device] + 1)
                self.processes[device].stdin.write(reading(self.sent[device], self.run, event_ms) + "\n")
                self.sent[device] += 1
                total += 1
            time.sleep(0.005)

    def cpu_seconds(self) -> float:
        """CPU time the mosquitto_pub processes used so far (the load generator, outside the site)."""
        ticks = 0
        for process in self.processes.values():
            fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])          # utime, stime
        return ticks / 100

    def stop(self, timeout: float = 120) -> list[str]:
        """Close every device's input; each sends what it holds, waits for its acks and exits. Returns the
        problems (a device that failed or did not finish)."""
        self.stopped.set()
        self.pacer.join()
        problems = []
        for process in self.processes.values():
            process.stdin.close()
        for device, process in self.processes.items():
            try:
                if process.wait(timeout) != 0:
                    problems.append(f"{device}: mosquitto_pub exited {process.returncode}: {process.stderr.read()}")
            except subprocess.TimeoutExpired:
                process.kill()
                problems.append(f"{device}: mosquitto_pub still sending after {timeout:.0f}s")
        return problems


# ------------------------------------------------------------------ the site's services

class Site:
    """The site's containers: their cgroup counters and, as Prometheus would, their exporters scraped."""

    def __init__(self, lab, interval: float, jmx_port: int) -> None:
        from tooling.testbed.docker_lab import docker

        self.lab, self.interval, self.jmx_port = lab, interval, jmx_port
        names = [f"{lab.network}-{s}" for s in SERVICES]
        out = docker("inspect", "-f", "{{.Name}} {{.State.Pid}} {{range .NetworkSettings.Networks}}"
                     "{{.IPAddress}}{{end}}", *names).stdout
        self.pids, self.addresses = {}, {}
        for line in out.splitlines():
            name, pid, address = line.split()
            service = name.removeprefix(f"/{lab.network}-")
            self.pids[service], self.addresses[service] = int(pid), address
        self.stopped = threading.Event()

    def counters(self) -> dict[str, cgroup.Counters]:
        return {service: cgroup.read(pid) for service, pid in self.pids.items()}

    def kafka_requests(self) -> dict[str, float]:
        """The broker's requests so far by type (its JMX exporter); empty if it did not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.addresses['kafka']}:{self.jmx_port}/metrics", timeout=10) as r:
                return request_counts(r.read().decode())
        except OSError:
            return {}

    def targets(self) -> list[str]:
        """The /metrics the site's Prometheus scrapes on these services (prometheus.yml.j2)."""
        jvms = [f"http://{self.addresses[s]}:{self.jmx_port}/metrics" for s in ("zookeeper", "kafka", "cassandra")]
        python = [f"http://{self.addresses[s]}:9102/metrics" for s in ("bridge", "cassandra-adapter")]
        return jvms + python

    def scrape(self, targets: list[str]) -> None:
        """Every target every `interval` seconds until stopped (a thread); failures are retried next time."""
        def loop() -> None:
            while not self.stopped.wait(self.interval):
                for url in targets:
                    try:
                        urllib.request.urlopen(url, timeout=10).read()
                    except OSError:
                        pass
        threading.Thread(target=loop, daemon=True, name="scraper").start()


def measure(site: Site, seconds: float) -> dict:
    """Over the next `seconds`: each service's mean cores and its memory (MiB) at their end, the whole
    machine's busy cores (everything on it, the bench included), and Kafka's requests per second by type."""
    before, machine, requests, begin = site.counters(), busy_ticks(), site.kafka_requests(), time.monotonic()
    time.sleep(seconds)
    after, took = site.counters(), time.monotonic() - begin
    services = {s: {"cores": cgroup.cores(before[s], after[s], took), "memory_mib": after[s].memory_bytes / 2**20}
                for s in before}
    rates = {k: (v - requests.get(k, 0)) / took for k, v in site.kafka_requests().items()}
    return {"services": services, "machine_cores": (busy_ticks() - machine) / 100 / took,
            "kafka_requests": dict(sorted(((k, v) for k, v in rates.items() if v >= 1), key=lambda kv: -kv[1]))}


def busy_ticks(stat: str | None = None) -> int:
    """The machine's non-idle CPU time in clock ticks (1/100 s): /proc/stat's first line less idle and iowait."""
    fields = [int(f) for f in (stat or Path("/proc/stat").read_text()).splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def request_counts(metrics: str) -> dict[str, float]:
    """kafka_network_requests_total of a broker's /metrics, summed over API versions, by request type."""
    counts: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("kafka_network_requests_total{"):
            labels, _, value = line.rpartition(" ")
            request = labels.split('request="', 1)[1].split('"', 1)[0]
            counts[request] = counts.get(request, 0.0) + float(value)
    return counts


def per_thousand(points: dict[int, float]) -> float | None:
    """Cores per 1,000 readings/s: the slope of the least-squares line through (rate, cores)."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_r, mean_c = sum(points) / n, sum(points.values()) / n
    spread = sum((r - mean_r) ** 2 for r in points)
    if spread == 0:
        return None
    return 1000 * sum((r - mean_r) * (c - mean_c) for r, c in points.items()) / spread


# ------------------------------------------------------------------ one rate

def sensor_feed(pipeline, tag: str, rate: int, run: int) -> tuple[Devices, dict[str, list[str]]]:
    """Every device publishing for one new sensor, `<tag>-<device>` (registered first), `rate` readings/s in all;
    returns the (not yet started) feed and device -> its sensors."""
    from services.common import names
    from tooling.testbed import pipeline as stack

    devices = sorted(pipeline.devices)
    sensors = {d: [f"{tag}-{d}"] for d in devices}
    stack.register_sensors(pipeline, sensors)
    feed = Devices(pipeline.mqtt_port, pipeline.mqtt_ca, pipeline.devices,
                   {d: names.MQTT_READINGS.format(site=stack.SITE, device_id=d, sensor_id=sensors[d][0])
                    for d in devices}, rate, run)
    return feed, sensors


def run_rate(pipeline, site: Site, observers: dict, session, args: argparse.Namespace, rate: int) -> dict:
    from services.adapter.schema import utc_day
    from services.common import names
    from tooling.build.progress import log
    from tooling.testbed import pipeline as stack

    if rate == 0:
        log("measure", f"idle: {args.settle:.0f}s of quiet, then {args.window:.0f}s measured", force=True)
        time.sleep(args.settle)
        return {"rate": 0, **measure(site, args.window)}
    tag = f"r{rate}"
    feed, sensors = sensor_feed(pipeline, tag, rate, args.run)
    begin_ms = int(time.time() * 1000)
    log("measure", f"{rate} readings/s: {args.ramp:.0f}s ramp, then {args.window:.0f}s measured", force=True)
    feed.start()
    time.sleep(args.ramp)
    load_before = feed.cpu_seconds()
    window = measure(site, args.window)
    generator = (feed.cpu_seconds() - load_before) / args.window
    problems = feed.stop()
    sent = sum(feed.sent.values())
    expected_events = sum(episodes(n, args.run) for n in feed.sent.values())
    client = pipeline.site_kafka.client()

    def drained() -> bool:
        return (observers["a"].count(tag) >= sent and observers["e"].count(tag) >= expected_events
                and group_lag(client, names.TEMPERATURE_DATA, f"{stack.SITE}-cassandra-adapter") == 0)

    deadline = time.monotonic() + args.drain
    while time.monotonic() < deadline and not drained():
        time.sleep(2)
        log("drain", f"{tag}: site Kafka {observers['a'].count(tag)}/{sent}, "
                     f"events {observers['e'].count(tag)}/{expected_events}", every=10)
    days = sorted({utc_day(begin_ms).date, utc_day(int(time.time() * 1000)).date})
    all_sensors = [s for group in sensors.values() for s in group]
    paths = {"a": observers["a"].latencies.get(tag, []),
             "b": stored_latencies(session, "iot", READINGS_TABLE, all_sensors, days),
             "e": observers["e"].latencies.get(tag, [])}
    return {"rate": rate, "sent": sent, "events_expected": expected_events, "generator_cores": generator,
            "devices": problems, **window, "paths": {k: percentiles(v) for k, v in paths.items()}}


# ------------------------------------------------------------------ table, main

SATURATED = 0.9        # a window in which the machine was this busy (of its cores) measured a queue, not a cost


def saturated(result: dict, cpus: int) -> bool:
    return result["machine_cores"] >= SATURATED * cpus


def print_table(results: list[dict], startup: dict[str, float], cpus: int | None = None) -> None:
    cpus = cpus or os.cpu_count() or 1
    rates = [r["rate"] for r in results]
    fitted = {r["rate"] for r in results if not saturated(r, cpus)}
    print("\nsite CPU, cores (core-seconds per second from cgroup counters, mean over each window); memory at the")
    print("end of the last window, MiB. 'per 1k/s': cores per 1,000 readings/s, the least-squares slope through the")
    spare = ", ".join(f"{r}/s" for r in sorted(fitted)) or "none"
    print(f"rates at which the machine had CPU to spare ({spare}); a rate marked * saturated it: its")
    print("services got what was left, not what they needed.")
    print("'start': core-seconds from the container's start until the site was warm (JIT, start-up, first batches).")
    head = "".join(f"{f'{r}/s' + ('*' if r not in fitted else ''):>9}" for r in rates)
    print(f"{'service':<20}{head}{'per 1k/s':>10}{'MiB':>8}{'start':>8}")
    for service in [*SERVICES, "total"]:
        if service == "total":
            cores = {r["rate"]: sum(s["cores"] for s in r["services"].values()) for r in results}
            memory = sum(s["memory_mib"] for s in results[-1]["services"].values())
            started = sum(startup.values())
        else:
            cores = {r["rate"]: r["services"][service]["cores"] for r in results}
            memory = results[-1]["services"][service]["memory_mib"]
            started = startup.get(service, 0.0)
        slope = per_thousand({r: c for r, c in cores.items() if r in fitted})
        cells = "".join(f"{cores[r]:>9.3f}" for r in rates)
        print(f"{service:<20}{cells}{'-' if slope is None else f'{slope:.3f}':>10}{memory:>8.0f}{started:>8.0f}")
    print("machine, all of it (the site, the bench, the load generator), busy cores: "
          + ", ".join(f"{r['rate']}/s {r['machine_cores']:.2f}" for r in results) + f" of {cpus}")
    for r in results:
        print(f"kafka requests/s at {r['rate']}/s: "
              + (", ".join(f"{k} {v:.0f}" for k, v in r["kafka_requests"].items()) or "-"))
    loaded = [r for r in results if r["rate"]]
    if loaded:
        print("load generator (mosquitto_pub processes, outside the site): "
              + ", ".join(f"{r['rate']}/s {r['generator_cores']:.3f}" for r in loaded))
        print("\nlatency, ms (event time = the device's publish time; one 2-core machine, indicative)")
        print(f"{'rate/s':>7} {'path':<36}{'count':>18}{'p50':>8}{'p95':>8}{'p99':>8}{'max':>8}")
        for r in loaded:
            expected = {"a": r["sent"], "b": r["sent"], "e": r["events_expected"]}
            for key, label in PATHS.items():
                f = r["paths"][key]
                cells = "".join(f"{'-' if f[q] is None else f'{f[q]:,}':>8}" for q in ("p50", "p95", "p99", "max"))
                print(f"{r['rate']:>7} {key + ' ' + label:<36}{f['n']:>9,}/{expected[key]:<8,}{cells}")


def lost(results: list[dict]) -> list[str]:
    """Readings or events that did not arrive, and devices that failed."""
    problems = []
    for r in (r for r in results if r["rate"]):
        problems += [f"{r['rate']}/s {p}" for p in r["devices"]]
        for key in ("a", "b"):
            if r["paths"][key]["n"] < r["sent"]:
                problems.append(f"{r['rate']}/s {key}: {r['paths'][key]['n']:,} of {r['sent']:,}")
        if r["paths"]["e"]["n"] < r["events_expected"]:
            problems.append(f"{r['rate']}/s e: {r['paths']['e']['n']:,} of {r['events_expected']:,} events")
    return problems


def warm_up(pipeline, observers: dict, args: argparse.Namespace) -> None:
    """Publish a little until the readings reach Kafka and the detector has announced an event."""
    from services.common import names
    from tooling.build.progress import log
    from tooling.testbed import pipeline as stack

    devices = sorted(pipeline.devices)[:2]
    sensors = {d: [f"warm-{d}"] for d in devices}
    stack.register_sensors(pipeline, sensors)
    deadline = time.monotonic() + args.warmup_timeout
    while time.monotonic() < deadline:
        feed = Devices(pipeline.mqtt_port, pipeline.mqtt_ca, pipeline.devices,
                       {d: names.MQTT_READINGS.format(site=stack.SITE, device_id=d, sensor_id=sensors[d][0])
                        for d in devices}, 50, 5)
        feed.start()
        time.sleep(5)
        if problems := feed.stop():
            raise SystemExit("bench site: a device failed while warming up: " + "; ".join(problems))
        log("warm-up", f"site Kafka {observers['a'].count('warm')}, events {observers['e'].count('warm')}",
            force=True)
        if observers["a"].count("warm") and observers["e"].count("warm"):
            return
        if dead := stack.stopped(pipeline.lab):
            raise SystemExit(f"bench site: {', '.join(dead)} stopped:\n{pipeline.lab.all_logs(tail=40)}")
    raise SystemExit(f"bench site: the site did not warm up in {args.warmup_timeout:.0f}s\n"
                     f"{pipeline.lab.all_logs(tail=40)}")


def run_steady(pipeline, args: argparse.Namespace) -> None:
    """--steady seconds at the first rate above 0, with sensors of their own (left out of every figure). At 100
    readings/s on the test machine the detector's JVM still spent a sixth of its CPU compiling after 8 minutes,
    and a fresh site's window measured a quarter more than one after 7 minutes (docs/development.md)."""
    from tooling.build.progress import log

    rate = next((r for r in args.rates if r), 0)
    if not args.steady or not rate:
        return
    feed, _ = sensor_feed(pipeline, "steady", rate, args.run)
    log("steady", f"{rate} readings/s for {args.steady:.0f}s before measuring (JIT compilation)", force=True)
    feed.start()
    for _ in range(int(args.steady // 30)):
        time.sleep(30)
        log("steady", f"{sum(feed.sent.values())} readings sent", force=True)
    time.sleep(args.steady % 30)
    if problems := feed.stop():
        raise SystemExit("bench site: a device failed before the measurements: " + "; ".join(problems))


# The baseline: the Spark jobs as they ran before the cuts of docs/development.md ("What a site costs"): back to
# back (no trigger), an idle query asking Kafka again after Spark's own 10 ms.
BASELINE = {"job_env": {"TRIGGER_INTERVAL": ""}, "job_conf": {"spark.sql.streaming.pollingDelay": "10ms"}}


def run_site(args: argparse.Namespace, name: str, settings: dict) -> tuple[dict[str, float], list[dict]]:
    """One site with the stack's settings and `settings` (pipeline.start's job_env, job_conf) through every rate;
    returns the core-seconds of its start-up per service and the figures of each rate."""
    from services.common import names
    from tooling.build.progress import log
    from tooling.testbed import pipeline as stack
    from tooling.testbed import stack_render
    from tooling.testbed.docker_lab import Lab

    defaults = stack_render.stack_defaults()
    interval = float(str(defaults["stack_prometheus_scrape_interval"]).removesuffix("s"))
    lab, session, observers, results = Lab(), None, {}, []
    site, startup = None, {}
    log("site", f"{name}: starting the site", force=True)
    try:
        devices = {f"bench-device-{i}": f"bench-device-password-{i}" for i in range(args.devices)}
        pipeline = stack.start(lab, Path(tempfile.mkdtemp(prefix="bench-site-")), devices, datacenter=False,
                               jobs=SPARK_JOBS, site_jvms=True, site_env=args.env,
                               job_env=settings.get("job_env"),
                               job_conf={**settings.get("job_conf", {}), **args.conf})
        session = pipeline.site_cassandra.session(timeout=60)
        site = Site(lab, interval, int(defaults["stack_jmx_exporter_port"]))
        site.scrape(site.targets())
        observers = {"a": KafkaObserver(pipeline.site_kafka.client(), names.TEMPERATURE_DATA),
                     "e": KafkaObserver(pipeline.site_kafka.client(), names.THRESHOLD_EVENTS,
                                        opening_events_only=True)}
        for observer in observers.values():
            observer.start()
        log("warm-up", "50 readings/s until readings reach Kafka and the detector announces an event", force=True)
        warm_up(pipeline, observers, args)
        # CPU from each container's start until the site is warm: JIT compilation, start-up, the first batches.
        startup = {s: c.cpu_ns / 1e9 for s, c in site.counters().items()}
        log("warm-up", "core-seconds since start: " + json.dumps({s: round(v, 1) for s, v in startup.items()}),
            force=True)
        run_steady(pipeline, args)
        for rate in args.rates:
            results.append(run_rate(pipeline, site, observers, session, args, rate))
            log("measure", json.dumps(results[-1]), force=True)
            if dead := stack.stopped(lab):
                raise SystemExit(f"bench site: {', '.join(dead)} stopped:\n{lab.all_logs(tail=40)}")
    finally:
        if site:
            site.stopped.set()
        for observer in observers.values():
            observer.stopped.set()
        if session:
            session.cluster.shutdown()
        lab.close()
    return startup, results


def ratio(after: float | None, before: float | None) -> str:
    return f"{after / before:.2f}x" if after is not None and before else "-"


def print_ratios(baseline: list[dict], stack: list[dict]) -> None:
    """The stack's site against the baseline's, rate by rate: total cores and the p50 latencies."""
    print("\nthe stack's settings / the baseline (Spark back to back, 10 ms polling), same rates:")
    before = {r["rate"]: r for r in baseline}
    for r in stack:
        b = before.get(r["rate"])
        if not b:
            continue
        total = sum(s["cores"] for s in r["services"].values())
        cells = [f"cores {ratio(total, sum(s['cores'] for s in b['services'].values()))}"]
        if r["rate"]:
            cells += [f"{k} p50 {ratio(r['paths'][k]['p50'], b['paths'][k]['p50'])}" for k in PATHS]
        print(f"{r['rate']:>7}/s  " + "   ".join(cells))


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    runs = ([("baseline", BASELINE)] if args.baseline else []) + [("stack", {})]
    figures = {name: run_site(args, name, settings) for name, settings in runs}
    for name, (startup, results) in figures.items():
        settings = "Spark back to back, 10 ms polling" if name == "baseline" else "the stack's settings"
        tried = "".join(f", {item}" for item in args.conf_items)
        print(f"\n===== {name}: {settings}{tried}; measured after {args.steady:.0f}s of steady load (--steady)")
        print_table(results, startup)
    if args.baseline:
        print_ratios(figures["baseline"][1], figures["stack"][1])
    if args.json:
        Path(args.json).write_text(json.dumps({name: {"startup": startup, "rates": results}
                                               for name, (startup, results) in figures.items()}, indent=1))
    problems = [f"{name}: {p}" for name, (_, results) in figures.items() for p in lost(results)]
    if problems:
        print("bench site: not everything arrived within --drain: " + "; ".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
