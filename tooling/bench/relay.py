"""Benchmark: the relay (MirrorMaker 2, as the datacenter runs it) reading a site over SASL_SSL as the relay
principal versus over plaintext, side by side in one run.

    python -m tooling.bench.relay [--records 200000] [--value-bytes 150]
    python -m tooling.bench.relay --paced 1000 [--seconds 30]

Two single-broker "sites" (one secured as the stacks secure a site, one plaintext) and one "datacenter" start
from the project's kafka image; each site's backlog is drained by MirrorMaker (exactly once) and counted at
the datacenter, total and distinct, so nothing lost is checked, not assumed. --secure-first swaps the order.
With --paced RATE it measures latency instead: MirrorMaker with exactly-once delivery, then without it.
Figures are indicative (a 2-core machine shared with whatever else runs). Method and figures:
docs/development.md, "Benchmarks" ("The relay", and the end of the section).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer

from deploy.kafka_acls import relay_acls, scram_jaas_config  # the relay's ACLs and login, as the stack role's
from tooling.build.progress import log
from tooling.testbed.docker_lab import Lab, docker, free_port, image
from tooling.testbed.kafka_cluster import (
    MM2_SINGLE_BROKER,
    KafkaCluster,
    create_topics,
    ensure_access,
    start_kafka_cluster,
)

TOPIC = "temperature-rollups-1m"
PARTITIONS = 3
OPERATOR = ("operator", "bench-operator-password-1")
RELAY = ("relay", "bench-relay-password-2")


def _fill(site: KafkaCluster, records: int, value_bytes: int) -> None:
    producer = Producer(site.client(**{"linger.ms": 20, "batch.num.messages": 10000, "acks": "all",
                                       "queue.buffering.max.messages": 1000000}))
    pad = "x" * max(0, value_bytes - 40)
    for i in range(records):
        producer.produce(TOPIC, key=f"sensor-{i % 50}".encode(), value=f'{{"n": {i}, "pad": "{pad}"}}'.encode())
        if i % 10000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left:
        raise SystemExit(f"bench relay: {left} records not written to the site")


def _mm2_properties(site: KafkaCluster, datacenter: KafkaCluster, alias: str, secure: bool,
                    exactly_once: bool = True) -> str:
    lines = [f"clusters = {alias}, datacenter", f"listeners = http://127.0.0.1:{free_port()}",
             f"{alias}.bootstrap.servers = {site.external}", f"datacenter.bootstrap.servers = {datacenter.external}",
             f"{alias}->datacenter.enabled = true", f"{alias}->datacenter.topics = {TOPIC}",
             f"datacenter->{alias}.enabled = false", "offset-syncs.topic.location = target",
             "sync.topic.acls.enabled = false", "refresh.topics.interval.seconds = 5", "tasks.max = 2"]
    if exactly_once:
        lines += ["datacenter.exactly.once.source.support = enabled", "dedicated.mode.enable.internal.rest = true"]
    lines += MM2_SINGLE_BROKER.splitlines()
    if secure:
        lines += [f"{alias}.security.protocol = SASL_SSL", f"{alias}.sasl.mechanism = SCRAM-SHA-512",
                  f"{alias}.sasl.jaas.config = {scram_jaas_config(*RELAY)}",
                  f"{alias}.ssl.truststore.type = PEM", f"{alias}.ssl.truststore.location = /etc/mirrormaker/ca.pem",
                  # the relay's client certificate: EXTERNAL asks for one (mutual TLS), as at a site
                  f"{alias}.ssl.keystore.type = PEM",
                  f"{alias}.ssl.keystore.location = /etc/mirrormaker/relay-keystore.pem"]
    return "\n".join(lines) + "\n"


def _start_mirrormaker(lab: Lab, site: KafkaCluster, properties: str, alias: str) -> str:
    """MirrorMaker (kafka image, dedicated mode) with these properties; returns its container's name."""
    config_dir = Path(tempfile.mkdtemp(prefix=f"bench-relay-{alias}-"))
    config_dir.chmod(0o755)
    (config_dir / "mm2.properties").write_text(properties)
    if site.ca_file:
        (config_dir / "ca.pem").write_bytes(Path(site.ca_file).read_bytes())
        (config_dir / "relay-keystore.pem").write_bytes((Path(site.pki) / "relay-keystore.pem").read_bytes())
    for path in config_dir.iterdir():
        path.chmod(0o644)
    name = f"{lab.network}-mm-{alias}"
    docker("run", "-d", "--name", name, "--network", "host", "--memory", "1g", "-e", "MM2_CLUSTERS=datacenter",
           "-e", "MM2_HEAP_OPTS=-Xms256m -Xmx512m", "-v", f"{config_dir}:/etc/mirrormaker:ro", image("kafka"),
           "mirrormaker")
    lab.containers.append(name)
    return name


def _datacenter_consumer(datacenter: KafkaCluster, alias: str) -> Consumer:
    return Consumer(datacenter.client(**{"group.id": f"bench-{alias}", "enable.auto.commit": False,
                                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                                         "topic.metadata.refresh.interval.ms": 2000}))


def _paced(lab: Lab, site: KafkaCluster, datacenter: KafkaCluster, alias: str, exactly_once: bool,
           rate: int, seconds: float) -> dict:
    """Latency of MirrorMaker relaying `rate` records/s: produce time -> received at the datacenter."""
    from tooling.bench.latency import percentiles

    name = _start_mirrormaker(lab, site, _mm2_properties(site, datacenter, alias, False, exactly_once), alias)
    consumer = _datacenter_consumer(datacenter, alias)
    consumer.subscribe([f"{alias}.{TOPIC}"])
    producer = Producer(site.client(**{"linger.ms": 5, "acks": "all"}))
    latencies: list[int] = []
    try:
        # Until MirrorMaker relays: a record a second, then the measured run.
        deadline = time.monotonic() + 300
        while not consumer.consume(100, timeout=1.0):
            producer.produce(TOPIC, key=b"warm", value=b'{"warm": true}')
            producer.poll(0)
            log("bench", f"{alias}: waiting for MirrorMaker's first record", every=10)
            if time.monotonic() > deadline:
                raise SystemExit(f"bench relay: MirrorMaker ({alias}) relayed nothing in 300 s")
        counted_from = int(time.time() * 1000) + 10_000
        start, sent, expected = time.monotonic(), 0, 0
        last_arrival = start
        while True:
            elapsed = time.monotonic() - start
            now_ms = int(time.time() * 1000)
            while elapsed < seconds and sent < int(elapsed * rate):
                # The record's timestamp is its produce time; MirrorMaker keeps it.
                producer.produce(TOPIC, key=f"sensor-{sent % 50}".encode(), value=b'{"n": %d}' % sent,
                                 timestamp=now_ms)
                sent += 1
                expected += now_ms >= counted_from
            producer.poll(0)
            got = [m for m in consumer.consume(10000, timeout=0.005) if m.error() is None and m.key() != b"warm"]
            received_ms = int(time.time() * 1000)
            latencies += [received_ms - m.timestamp()[1] for m in got if m.timestamp()[1] >= counted_from]
            log("bench", f"{alias}: {sent} sent, {len(latencies)} of {expected} counted", every=5)
            last_arrival = time.monotonic() if got else last_arrival
            if elapsed >= seconds and (len(latencies) >= expected or time.monotonic() - last_arrival > 30):
                break
    finally:
        producer.flush(30)
        consumer.close()
        docker("rm", "-f", name, check=False)
    return {"variant": alias, "exactly_once": exactly_once, "expected": expected, **percentiles(latencies)}


def _drain(lab: Lab, site: KafkaCluster, datacenter: KafkaCluster, alias: str, secure: bool,
           records: int, timeout_s: float) -> dict:
    name = _start_mirrormaker(lab, site, _mm2_properties(site, datacenter, alias, secure), alias)
    topic = f"{alias}.{TOPIC}"
    consumer = _datacenter_consumer(datacenter, alias)
    started = time.monotonic()
    seen: set[bytes] = set()
    total, first, last = 0, None, None
    try:
        consumer.subscribe([topic])
        while len(seen) < records and time.monotonic() - started < timeout_s:
            for msg in consumer.consume(10000, timeout=1.0):
                if msg.error() is None:
                    now = time.monotonic()
                    first = first or now
                    last = now
                    total += 1
                    seen.add(msg.value())
            log("bench", f"{alias}: {len(seen)} of {records} at the datacenter", every=10)
    finally:
        consumer.close()
        docker("rm", "-f", name, check=False)
    drain_s = (last - first) if first and last and last > first else float("nan")
    return {"variant": alias, "secure": secure, "mirrored": total, "distinct": len(seen),
            "startup_s": (first - started) if first else float("nan"), "drain_s": drain_s,
            "rate": len(seen) / drain_s if drain_s == drain_s and drain_s > 0 else float("nan")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench relay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=200_000, help="backlog per site (default 200000)")
    p.add_argument("--value-bytes", type=int, default=150, help="size of each record's value (default 150)")
    p.add_argument("--timeout", type=float, default=900, help="seconds to wait for a drain (default 900)")
    p.add_argument("--secure-first", action="store_true",
                   help="drain the SASL_SSL site first (the first drain also warms the datacenter's broker)")
    p.add_argument("--paced", type=int, default=0, metavar="RATE",
                   help="measure the relay's latency at RATE records/s instead of draining a backlog")
    p.add_argument("--seconds", type=float, default=30, help="with --paced: seconds of producing per variant (30)")
    args = p.parse_args(argv)
    if args.records < 1 or args.value_bytes < 40 or args.paced < 0 or args.seconds <= 10:
        p.error("--records must be at least 1, --value-bytes at least 40, --paced positive and --seconds over 10")
    if args.paced:
        return _paced_main(args)
    lab = Lab()
    try:
        log("bench", "starting the datacenter and two sites (plaintext, SASL_SSL)", force=True)
        datacenter = start_kafka_cluster(lab, prefix="dc-")
        plain = start_kafka_cluster(lab, prefix="plain-")
        secure = start_kafka_cluster(lab, prefix="secure-", operator=OPERATOR)
        ensure_access(lab, secure, dict([OPERATOR, RELAY]), relay_acls(RELAY[0], [TOPIC], []))
        results = []
        variants = [("plain", plain, False), ("secure", secure, True)]
        for alias, site, is_secure in (variants[::-1] if args.secure_first else variants):
            create_topics(site, TOPIC, partitions=PARTITIONS)
            log("bench", f"{alias}: writing a backlog of {args.records} records", force=True)
            _fill(site, args.records, args.value_bytes)
            log("bench", f"{alias}: starting MirrorMaker", force=True)
            results.append(_drain(lab, site, datacenter, alias, is_secure, args.records, args.timeout))
    finally:
        lab.close()
    print(f"\nrelay drain of {args.records} records ({args.value_bytes} B values), exactly-once into the datacenter")
    print(f"{'site listener':<28}{'mirrored':>10}{'distinct':>10}{'start-up s':>12}{'drain s':>10}{'records/s':>11}")
    for r in results:
        label = "SASL_SSL, relay principal" if r["secure"] else "PLAINTEXT (baseline)"
        print(f"{label:<28}{r['mirrored']:>10}{r['distinct']:>10}{r['startup_s']:>12.1f}{r['drain_s']:>10.1f}"
              f"{r['rate']:>11.0f}")
    results.sort(key=lambda r: r["secure"])
    plain_rate, secure_rate = results[0]["rate"], results[1]["rate"]
    print(f"SASL_SSL / PLAINTEXT drain rate: {secure_rate / plain_rate:.2f}")
    lost = [r["variant"] for r in results if r["distinct"] < args.records]
    if lost:
        print(f"bench relay: not every record arrived for {', '.join(lost)}", file=sys.stderr)
        return 1
    return 0


def _paced_main(args: argparse.Namespace) -> int:
    lab = Lab()
    try:
        log("bench", "starting the datacenter and a plaintext site", force=True)
        datacenter = start_kafka_cluster(lab, prefix="dc-")
        site = start_kafka_cluster(lab, prefix="site-")
        create_topics(site, TOPIC, partitions=PARTITIONS)
        results = [_paced(lab, site, datacenter, alias, exactly_once, args.paced, args.seconds)
                   for alias, exactly_once in (("eos", True), ("plain", False))]
    finally:
        lab.close()
    print(f"\nrelay latency at {args.paced:,} records/s for {args.seconds:.0f}s: produced at the site -> received "
          "by a read_committed consumer at the datacenter, ms (the first 10 s not counted)")
    print(f"{'MirrorMaker':<34}{'counted':>17}{'p50':>7}{'p95':>7}{'p99':>7}{'max':>7}")
    for r in results:
        label = "exactly once (as deployed)" if r["exactly_once"] else "at least once (baseline)"
        print(f"{label:<34}{r['n']:>8,}/{r['expected']:<8,}{r['p50']!s:>7}{r['p95']!s:>7}{r['p99']!s:>7}"
              f"{r['max']!s:>7}")
    missing = [r["variant"] for r in results if r["n"] < r["expected"]]
    if missing:
        print(f"bench relay: not every record arrived for {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
