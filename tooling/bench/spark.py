"""Benchmark: threshold-detector micro-batch latency at given reading rates.

    python -m tooling.bench.spark [--rates 1000,5000] [--seconds 60] [--sensors 100] [--warmup 15]
                                  [--conf KEY=VALUE] [--env NAME=VALUE]

Kafka (one broker) and the threshold-detector job (spark image, local mode, `submit` role exactly as
deployed) run as containers on a fresh lab network, removed at the end. This process produces readings to
`temperature-data` at each rate for `--seconds`; every sensor alternates five hot and five cold readings, so
one reading in five causes a threshold event. Each reading's `timestamp` is its produce time, and the event
it causes carries that timestamp, so latency = Kafka timestamp of the output event (set when Spark's
producer sends it) - reading time: input record time to output record time, through the whole micro-batch.
Events of the first `--warmup` seconds of each rate are left out. Figures are indicative: a 2-core machine
shared with whatever else runs (docs/development.md, "Benchmarks").
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer

from services.common import names
from tooling.build.progress import log
from tooling.testbed.docker_lab import Lab, docker, wait_until
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster

JOB = "/opt/iot-stack/spark/jobs/threshold_detector.py"
HOT, COLD, RUN = 35.0, 20.0, 5          # default limits: threshold 30 C, hysteresis 2 C


def temperature(n: int) -> float:
    return HOT if (n // RUN) % 2 == 0 else COLD


class EventReader(threading.Thread):
    """Collects (reading time, output record time) of every threshold event."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
        self.consumer.subscribe([names.THRESHOLD_EVENTS])
        self.samples: list[tuple[int, int]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            for msg in self.consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is None:
                    self.samples.append((json.loads(msg.value())["timestamp"], msg.timestamp()[1]))
        self.consumer.close()


def produce_at(producer: Producer, rate: int, seconds: float, sensors: int, counters: list[int],
               tag: str) -> int:
    """Produce `rate` readings/s for `seconds`, round-robin over sensors, paced every 10 ms."""
    start = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate)
        now_ms = int(time.time() * 1000)
        while sent < due:
            sensor = sent % sensors
            n = counters[sensor]
            counters[sensor] += 1
            sensor_id = f"{tag}-{sensor}"
            producer.produce(names.TEMPERATURE_DATA, key=sensor_id, headers=[(names.HEADER_SITE, b"bench")],
                             value=json.dumps({"sensor_id": sensor_id, "timestamp": now_ms,
                                               "temperature": temperature(n), "unit": "C"}))
            sent += 1
        producer.poll(0)
        log("produce", f"rate={rate}/s sent={sent}", every=10)
        time.sleep(0.01)
    producer.flush(60)
    return sent


def percentile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


STAGE_FIELD = re.compile(r"\b([a-z_]+_ms)=(\d+)")


def stage_breakdown(log_lines: list[str], since: float, until: float) -> dict[str, float]:
    """Mean milliseconds per stage (iot_jobs.runtime.stage_fields) of the threshold query's micro-batches
    that held rows and were logged between since and until (epoch seconds; the job logs UTC times)."""
    sums: dict[str, int] = {}
    batches = 0
    for line in log_lines:
        if "progress query=threshold" not in line or " rows=0 " in line:
            continue
        try:
            when = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=datetime.UTC)
        except ValueError:
            continue
        if not since <= when.timestamp() <= until:
            continue
        batches += 1
        for name, value in STAGE_FIELD.findall(line):
            sums[name] = sums.get(name, 0) + int(value)
    return {"batches": batches, **{name: round(total / batches) for name, total in sums.items()}} if batches else {}


def measure(reader: EventReader, producer: Producer, rate: int, seconds: float, sensors: int,
            warmup: float, drain: float) -> dict:
    counters = [0] * sensors
    tag = f"r{rate}"
    begin_ms = int(time.time() * 1000)
    sent = produce_at(producer, rate, seconds, sensors, counters, tag)
    expected = sum((c + RUN - 1) // RUN for c in counters)   # a transition at reading 0, RUN, 2*RUN...
    deadline = time.monotonic() + drain
    window = [s for s in reader.samples if s[0] >= begin_ms]
    while time.monotonic() < deadline and len(window) < expected:
        time.sleep(1)
        window = [s for s in reader.samples if s[0] >= begin_ms]
        log("drain", f"rate={rate}/s events={len(window)}/{expected}", every=5)
    latencies = [out - when for when, out in window if when >= begin_ms + warmup * 1000]
    return {"rate": rate, "window": (begin_ms / 1000 + warmup, time.time()),
            "sent": sent, "achieved_rate": round(sent / seconds), "events_expected": expected,
            "events_received": len(window), "samples": len(latencies),
            "p50_ms": percentile(latencies, 0.50) if latencies else None,
            "p95_ms": percentile(latencies, 0.95) if latencies else None,
            "p99_ms": percentile(latencies, 0.99) if latencies else None,
            "max_ms": max(latencies) if latencies else None,
            "mean_ms": round(statistics.fmean(latencies), 1) if latencies else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1000,5000", help="readings per second, comma separated")
    parser.add_argument("--seconds", type=float, default=60, help="production time per rate")
    parser.add_argument("--sensors", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=15, help="seconds of each rate left out of the figures")
    parser.add_argument("--drain", type=float, default=60, help="max wait for the last events after producing")
    parser.add_argument("--trigger", default="", help="TRIGGER_INTERVAL of the job (default: back to back)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the job (spark-submit --conf), e.g. spark.sql.shuffle.partitions=1; "
                             "repeatable")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of the job, e.g. DEAD_LETTER_TRIGGER_INTERVAL='0 seconds'; "
                             "repeatable")
    args = parser.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",")]
    if bad := [c for c in args.conf + args.env if "=" not in c]:
        parser.error(f"--conf and --env take KEY=VALUE, got {bad[0]!r}")

    lab = Lab()
    try:
        log("setup", "starting kafka")
        cluster = start_kafka_cluster(lab)
        create_topics(cluster, names.TEMPERATURE_DATA, names.THRESHOLD_EVENTS, names.DEAD_LETTER)
        create_topics(cluster, names.SENSOR_REGISTRATION, partitions=1, config={"cleanup.policy": "compact"})
        log("setup", "starting threshold-detector (spark image, local mode)")
        confs = [arg for c in args.conf for arg in ("--conf", c)]
        lab.run("spark", "detector", "submit", "--name", "threshold-detector", *confs, JOB, memory="3g", env={
            "KAFKA_BOOTSTRAP_SERVERS": cluster.internal, "SITE": "bench", "CHECKPOINT_DIR": "/tmp/checkpoints",
            "STARTING_OFFSETS": "latest", **({"TRIGGER_INTERVAL": args.trigger} if args.trigger else {}),
            **dict(e.split("=", 1) for e in args.env)})
        reader = EventReader(cluster.external)
        reader.start()
        producer = Producer({"bootstrap.servers": cluster.external, "linger.ms": 5, "acks": "all"})

        def warmed_up() -> bool:
            if docker("inspect", "-f", "{{.State.Running}}", f"{lab.network}-detector").stdout.strip() != "true":
                raise SystemExit(f"threshold-detector died:\n{lab.logs('detector', tail=60)}")
            # Readings produced before the query started are skipped (latest): keep nudging.
            produce_at(producer, 50, 1.0, 5, warm_counters, "warm")
            return any(True for _ in reader.samples)
        warm_counters = [0] * 5
        wait_until("threshold-detector to emit its first event", warmed_up, timeout=600, interval=2,
                   on_timeout=lambda: lab.logs("detector", tail=100))
        log("setup", "job is up")
        results = []
        for rate in rates:
            log("measure", f"rate={rate}/s for {args.seconds:.0f}s")
            results.append(measure(reader, producer, rate, args.seconds, args.sensors, args.warmup, args.drain))
            log("measure", json.dumps(results[-1]), force=True)
        reader.stopped.set()
        progress = [line for line in lab.logs("detector", tail=2000).splitlines() if "progress query=threshold" in line]
        print("last micro-batches of the job:\n" + "\n".join(progress[-12:]))
        alive = docker("inspect", "-f", "{{.State.Running}}", f"{lab.network}-detector").stdout.strip()
        print("\nthreshold-detector latency, input reading time -> output event time (Kafka timestamps)")
        print(f"{'rate/s':>8} {'achieved':>9} {'events':>13} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
              f"{'max ms':>8} {'mean ms':>8}")
        for r in results:
            print(f"{r['rate']:>8} {r['achieved_rate']:>9} {r['events_received']:>6}/{r['events_expected']:<6} "
                  f"{r['p50_ms']!s:>8} {r['p95_ms']!s:>8} {r['p99_ms']!s:>8} {r['max_ms']!s:>8} {r['mean_ms']!s:>8}")
        logs = lab.logs("detector", tail=10**9).splitlines()
        print("\nwhere a micro-batch's time goes: mean ms per stage of the batches with rows, after the warm-up")
        for r in results:
            stages = stage_breakdown(logs, *r["window"])
            print(f"{r['rate']:>8}/s " + (" ".join(f"{k}={v}" for k, v in stages.items()) or "no batches logged"))
        print(f"job still running at the end: {alive}; figures are indicative (shared 2-core machine)")
        return 0 if alive == "true" and all(r["samples"] for r in results) else 1
    finally:
        lab.close()


if __name__ == "__main__":
    sys.exit(main())
