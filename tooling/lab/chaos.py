"""The fault suite: publish at a steady rate, inject one fault, count what was kept.

Each case runs against the lab (`scripts/lab up`) from outside, like an operator: a real MQTT v5 client
publishes readings at QoS 1 to site-a's Mosquitto (one steady sensor at `rate` readings/s, plus "hot" sensors
that open and close a threshold episode every few seconds), one fault is injected while it publishes, and
after the stack has settled the case counts what was acknowledged, stored, lost and duplicated, how long the
fault held data up (recovery) and, for the datacenter cut-off, how fast the relay's backlog drained. The
Mosquitto cases also run with a device that ignores reason codes and with an MQTT 3.1.1 device (VARIANTS).
The abusive-device cases (tooling/lab/abuse.py, `--case abuse-<name>`) run beside them and print a table of their
own.

Every column, every case and its bound: docs/faults.md, "The fault suite". `scripts/lab chaos [--case NAME ...]`
prints the tables; tests/lab/test_5_faults.py runs the same cases and asserts each one's bound.
"""
from __future__ import annotations

import contextlib
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from tooling.build.progress import log
from tooling.lab import lab, upgrade
from tooling.lab.alerts_seen import AlertWatch, key, matches
from tooling.testbed.alert_receiver import AlertLog
from tooling.testbed.windowed_client import WindowedClient

if TYPE_CHECKING:
    from confluent_kafka import Message

SITE, DC = "site-a", "datacenter"
HOT_C, NORMAL_C = 50.0, 20.0           # above / well below the default threshold (30 C, hysteresis 2)
HOT_PERIOD_S = 4.0                      # a hot sensor: 2 s above the threshold, 2 s below, again
HOT_RATE = 4.0                          # readings/s of each hot sensor
DRAIN_LIMIT_S = 600.0                   # how long a cut's relay backlog may take to reach the datacenter
DRAIN_TARGET = 5.0                      # the backlog drains at this many times the ingest rate or more
ALERT_WAIT_S = 180.0                    # a case's alert must fire within this after the fault
IN_FLIGHT_S = 1.0                       # a crash may lose readings published this long before it, no others


# ---------------------------------------------------------------- the device

@dataclass(frozen=True)
class Variant:
    """How a device speaks MQTT and what it takes as delivered."""
    name: str
    protocol: str               # "5" or "3.1.1"
    resends_not_routed: bool    # publishes a reading again when its PUBACK says 0x10 "no matching subscribers"
    about: str


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("v5", "5", True, "MQTT v5; a PUBACK 0x10 means not delivered: publish it again (the project's devices, "
                             "docs/architecture.md)"),
    Variant("v5-ignore-codes", "5", False, "MQTT v5 as the standard allows: every PUBACK below 0x80 (0x10 too) "
                                           "is delivered, nothing is resent"),
    Variant("v3.1.1", "3.1.1", False, "MQTT 3.1.1: a PUBACK carries no reason code, every one is delivered"),
)}


def transitions(readings: dict[str, list[tuple[int, float]]], kept: dict[str, set[int]] | None = None) -> int:
    """Threshold transitions (opening + closing events) of each sensor's (event ms, temperature) readings in the
    order given, skipping readings older than one already applied: the detector's out-of-order rule
    (spark/iot_jobs/hysteresis.py); with `kept` (sensor -> event times), only those readings."""
    count = 0
    for sensor, sequence in readings.items():
        exceeding, newest = False, 0
        for ms, temperature in sequence:
            if kept is not None and ms not in kept.get(sensor, ()):
                continue
            if ms < newest:
                continue
            newest = ms
            if not exceeding and temperature > 30.0:
                exceeding, count = True, count + 1
            elif exceeding and temperature < 28.0:
                exceeding, count = False, count + 1
    return count


class Device:
    """A paho MQTT client publishing at QoS 1 over TLS as one device login (the site's test device unless
    `device` says which); remembers which readings were acknowledged, as its `variant` (VARIANTS) takes a
    PUBACK. Registers its sensors to its device first (lab.register_sensors, through `host`'s 9094) unless
    `register` is False. It is given every mqtt_node's address (`mqtt_hosts`) and tries them in turn."""

    def __init__(self, host: str, site: str, sensor: str, hot_sensors: int = 2, *, mqtt_hosts: list[str],
                 device: str | None = None, variant: str = "v5", register: bool = True):
        import paho.mqtt.client as mqtt
        self.site, self.sensor = site, sensor
        self.variant = VARIANTS[variant]
        self.hot = [f"{sensor}-hot{k}" for k in range(hot_sensors)]
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[str, int, float]] = {}     # mid -> (sensor, event ms, temperature)
        self.early: dict[int, int] = {}                          # mid -> PUBACK reason that came first
        self.acked: dict[str, set[int]] = {s: set() for s in [sensor, *self.hot]}
        self.hot_readings: dict[str, list[tuple[int, float]]] = {s: [] for s in self.hot}
        self.not_routed: set[tuple[str, int]] = set()            # readings answered PUBACK 0x10
        self.not_routed_times: list[float] = []                  # when each 0x10 came
        self.refused = 0                                         # other reason codes >= 0x80
        self.published = 0
        self.last_ms = 0
        # Over TLS to 8883 as every device (its certificate names every mqtt_node's address).
        self.device = device or lab.test_device(site)
        if register:
            lab.register_sensors(site, self.device, [sensor, *self.hot], bootstrap=f"{host}:9094")
        protocol = mqtt.MQTTv5 if self.variant.protocol == "5" else mqtt.MQTTv311
        # Its window kept after a reconnection too, as docs/operations.md asks of a device.
        self.client = WindowedClient(mqtt.CallbackAPIVersion.VERSION2, client_id=self.device, protocol=protocol)
        self.client.username_pw_set(self.device, lab.device_password(self.device))
        self.client.tls_set(ca_certs=str(lab.pki_dir() / "ca.crt"))
        self.client.reconnect_delay_set(0.2, 2)
        self.client.max_inflight_messages_set(200)
        self.client.max_queued_messages_set(0)
        self.client.on_publish = self._on_publish
        self.client.connect_any(mqtt_hosts, 8883, keepalive=10)
        self.client.loop_start()

    def _now_ms(self) -> int:
        """Wall-clock event time, strictly increasing: every reading is its own row."""
        self.last_ms = max(int(time.time() * 1000), self.last_ms + 1)
        return self.last_ms

    def publish(self, sensor: str, temperature: float, event_ms: int | None = None) -> None:
        from services.common import names
        event_ms = event_ms or self._now_ms()
        payload = json.dumps({"timestamp": event_ms, "temperature": temperature, "unit": "C"})
        # Not under self.lock: paho's network thread holds its own lock while it calls _on_publish.
        topic = names.MQTT_READINGS.format(site=self.site, device_id=self.device, sensor_id=sensor)
        info = self.client.publish(topic, payload, qos=1)
        sent = (sensor, event_ms, temperature)
        with self.lock:
            self.published += 1
            code = self.early.pop(info.mid, None)      # the PUBACK can beat us here
            if code is None:
                self.pending[info.mid] = sent
                return
        self._settle(sent, code)

    def _on_publish(self, _client, _userdata, mid, reason_code, _properties) -> None:
        code = getattr(reason_code, "value", reason_code)
        with self.lock:
            sent = self.pending.pop(mid, None)
            if sent is None:
                self.early[mid] = code
                return
        self._settle(sent, code)

    def _settle(self, sent: tuple[str, int, float], code: int) -> None:
        sensor, event_ms, temperature = sent
        if code == 0:
            with self.lock:
                self.acked[sensor].add(event_ms)
                if sensor in self.hot_readings:
                    self.hot_readings[sensor].append((event_ms, temperature))
        elif code == 0x10 and self.variant.resends_not_routed:   # routed nowhere: publish it again
            with self.lock:
                self.not_routed.add((sensor, event_ms))
                self.not_routed_times.append(time.time())
            threading.Timer(0.2, self.publish, (sensor, temperature, event_ms)).start()
        elif code < 0x80:                # a success code this device takes as delivered (0x10 included)
            with self.lock:
                self.acked[sensor].add(event_ms)
                if sensor in self.hot_readings:
                    self.hot_readings[sensor].append((event_ms, temperature))
                if code == 0x10:
                    self.not_routed.add((sensor, event_ms))
                    self.not_routed_times.append(time.time())
        else:
            with self.lock:
                self.refused += 1

    def run(self, seconds: float, rate: float, at: dict[float, Callable[[], None]] | None = None,
            stop: threading.Event | None = None) -> None:
        """Publish for `seconds` (or until `stop` is set) at `rate` readings/s (plus the hot sensors); call at[t]
        at t seconds."""
        todo = sorted((at or {}).items())
        started = time.monotonic()
        step, hot_step = 1.0 / rate, 1.0 / HOT_RATE
        n = hot_n = 0
        while (elapsed := time.monotonic() - started) < seconds and not (stop and stop.is_set()):
            while todo and todo[0][0] <= elapsed:
                threading.Thread(target=todo.pop(0)[1], daemon=True).start()
            if elapsed >= hot_n * hot_step:
                hot = (hot_n * hot_step) % HOT_PERIOD_S < HOT_PERIOD_S / 2
                for sensor in self.hot:
                    self.publish(sensor, HOT_C if hot else NORMAL_C)
                hot_n += 1
            self.publish(self.sensor, NORMAL_C + (n % 10) / 10)
            n += 1
            time.sleep(max(0.0, started + n * step - time.monotonic()))
        for sensor in self.hot:          # close every open episode, so each one has two events
            self.publish(sensor, NORMAL_C)

    def finish(self, timeout: float = 120.0) -> None:
        """Wait for the PUBACKs still due, then disconnect."""
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.2)
        self.client.disconnect()
        self.client.loop_stop()

    def transitions(self, kept: dict[str, set[int]] | None = None) -> int:
        """Threshold transitions the acknowledged hot readings imply, in acknowledgement order (a reading
        resent after PUBACK 0x10 arrives late); with `kept` (sensor -> event times), only those readings: a
        case that may lose readings (Mosquitto's window) counts the events of what the site stored."""
        return transitions(self.hot_readings, kept)


# ---------------------------------------------------------------- reading the stack

def cql_rows(host: lab.LabHost, site: str, query: str) -> list[list[str]]:
    """Rows of a cqlsh result table (the lines between the header rule and the blank line)."""
    lines = lab.cql(host, site, query).splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() and set(line.strip()) <= set("-+")), None)
    out = []
    for line in lines[start + 1:] if start is not None else []:
        if not line.strip():
            break
        out.append([c.strip() for c in line.split("|")])
    return out


def _ms(text: str) -> int:
    for fmt in ("%Y-%m-%d %H:%M:%S.%f%z", "%Y-%m-%d %H:%M:%S%z"):
        try:
            return int(datetime.strptime(text, fmt).timestamp() * 1000)
        except ValueError:
            continue
    raise ValueError(f"unreadable cqlsh timestamp {text!r}")


def _days(ms_values: set[int]) -> set[str]:
    return {datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d") for ms in ms_values} or \
        {datetime.now(UTC).strftime("%Y-%m-%d")}


def stored(host: lab.LabHost, tier: str, table: str, sensor: str, days: set[str],
           site: str = SITE) -> dict[tuple[int, str], int]:
    """(event ms, is_last or '') -> write latency ms, of one sensor of `site` in `tier`'s Cassandra."""
    last = ", is_last" if table == "temperature_threshold_events" else ""
    found: dict[tuple[int, str], int] = {}
    for day in days:
        query = (f"SELECT event_time, write_latency_ms{last} FROM iot.{table} "
                 f"WHERE site='{site}' AND sensor_id='{sensor}' AND day='{day}';")
        for row in cql_rows(host, tier, query):
            if row and row[0][:1].isdigit():
                found[(_ms(row[0]), row[2] if last else "")] = int(row[1]) if row[1].lstrip("-").isdigit() else 0
    return found


def _client(bootstrap: str, **config: object) -> dict:
    """Settings of a client of a site's EXTERNAL listener: SASL_SSL as the operator (tooling.lab.lab)."""
    return lab.kafka_client(bootstrap, **config)


def _read_since(bootstrap: str, topic: str, since_ms: int, want: Callable[[Message], bool] = lambda _m: True,
                *, to_end: bool = False, quiet_s: float = math.inf, limit_s: float = math.inf,
                committed: bool = True, group: str = "chaos", batch: int = 500) -> Iterator[Message]:
    """The wanted records of `topic` from the first at or after `since_ms` on (error-free ones only).

    Reads until every partition's end as it was when reading began (to_end), until no wanted
    record came for quiet_s, or for limit_s at most, whichever comes first."""
    from confluent_kafka import Consumer, TopicPartition
    config = _client(bootstrap, **{"group.id": f"{group}-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    if committed:
        config["isolation.level"] = "read_committed"
    consumer = Consumer(config)
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        # Ends before times: a record appended in between lies past its partition's end, so none is skipped.
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        wanted = consumer.offsets_for_times([TopicPartition(topic, p, since_ms) for p in partitions], timeout=30)
        starts = {tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition] for tp in wanted}
        todo = {p for p, offset in starts.items() if offset < ends[p]}
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in (todo if to_end else starts)])
        deadline = time.monotonic() + limit_s
        quiet_until = time.monotonic() + quiet_s
        while (todo or not to_end) and time.monotonic() < min(deadline, quiet_until):
            for msg in consumer.consume(batch, timeout=1.0):
                if msg.error():
                    continue
                if msg.offset() >= ends[msg.partition()] - 1:
                    todo.discard(msg.partition())
                if want(msg):
                    quiet_until = time.monotonic() + quiet_s
                    yield msg
            if to_end and todo:
                # Transaction markers take offsets too: a partition whose position passed its end is done.
                for tp in consumer.position([TopicPartition(topic, p) for p in list(todo)]):
                    if tp.offset >= ends[tp.partition]:
                        todo.discard(tp.partition)
    finally:
        consumer.close()


def kafka_records(bootstrap: str, topic: str, keys: set[str], since_ms: int) -> dict[str, list[dict]]:
    """Values (JSON) of the records with these keys on `topic` since `since_ms`, committed ones only."""
    out: dict[str, list[dict]] = {k: [] for k in keys}
    for msg in _read_since(bootstrap, topic, since_ms, lambda m: _key(m) in out, to_end=True, limit_s=120,
                           group="chaos-count", batch=1000):
        try:
            out[_key(msg)].append(json.loads(msg.value()))
        except ValueError:
            pass
    return out


def _key(msg: Message) -> str:
    return (msg.key() or b"").decode(errors="replace")


def dead_letters(bootstrap: str, since_ms: int) -> dict[str, int]:
    """Dead-letter records since `since_ms`, counted by their source (the dlq_source header)."""
    from services.common import names
    counts: dict[str, int] = {}
    for msg in _read_since(bootstrap, names.DEAD_LETTER, since_ms, quiet_s=5, committed=False, group="chaos-dlq"):
        source = dict(msg.headers() or []).get(names.HEADER_DLQ_SOURCE, b"?").decode(errors="replace")
        counts[source] = counts.get(source, 0) + 1
    return counts


# ---------------------------------------------------------------- the relay's backlog

@dataclass(frozen=True)
class Drain:
    """How a backlog on a relayed topic, written while the datacenter was cut off, reached it."""
    backlog: int                  # records written (and acknowledged by the site's Kafka) during the cut
    arrived: int                  # of those, how many reached the datacenter
    early: int                    # of those, how many arrived before the cut was lifted: it did not hold
    cut_s: float                  # how long the records were written for
    ingest_per_s: float
    drain_s: float | None         # from lifting the cut to the last arrival; None if none arrived
    drain_per_s: float | None
    ratio: float | None           # drain_per_s / ingest_per_s; None unless the whole backlog arrived

    @property
    def lost(self) -> int:
        return self.backlog - self.arrived


def drain_figures(backlog: int, cut_s: float, lifted: float, arrivals: Iterable[float]) -> Drain:
    """The drain of `backlog` records written over `cut_s` seconds, given when the cut was `lifted`
    and when (same clock) each record that arrived was first seen at the datacenter.

    The drain rate is what arrived over the time to the last arrival; a ratio only for a
    backlog that arrived whole (a partial one never drained)."""
    times = list(arrivals)
    ingest = backlog / cut_s if cut_s > 0 else 0.0
    early = sum(t < lifted for t in times)
    if not times:
        return Drain(backlog, 0, 0, cut_s, ingest, None, None, None)
    drain_s = max(0.0, max(times) - lifted)
    drain = len(times) / drain_s if drain_s > 0 else math.inf     # all there at once: the cut did not hold
    whole = len(times) == backlog and ingest > 0
    return Drain(backlog, len(times), early, cut_s, ingest, drain_s, drain, drain / ingest if whole else None)


def rollup(sensor: str, window_start: int) -> dict:
    """A contract-valid one-minute rollup (services/common/contracts.py ROLLUP) of a steady 20 C sensor."""
    return {"sensor_id": sensor, "site": SITE, "window_start": window_start, "window_end": window_start + 60_000,
            "count": 60, "avg": NORMAL_C, "min": NORMAL_C, "max": NORMAL_C}


def write_rollups(bootstrap: str, sensor: str, rate: float, seconds: float) -> tuple[set[int], float, float]:
    """Rollups of `sensor` on site-a's relayed rollups topic at `rate`/s for `seconds`, each for its own minute
    (counting back from now, so every record is a row of its own); keyed and headed like the Spark job's
    (spark/iot_jobs/records.py). Returns the window starts the site's Kafka acknowledged, when writing
    began and when it ended (epoch s)."""
    from confluent_kafka import Producer

    from services.common import names
    acked: set[int] = set()
    failed = 0

    def delivered(err, msg) -> None:
        nonlocal failed
        if err is None:
            acked.add(json.loads(msg.value())["window_start"])
        else:
            failed += 1

    producer = Producer(_client(bootstrap, **{"enable.idempotence": True, "linger.ms": 5}))
    minute = int(time.time() // 60 * 60_000)
    began, started, step, n = time.time(), time.monotonic(), 1.0 / rate, 0
    while time.monotonic() - started < seconds:
        record = rollup(sensor, minute - (n + 1) * 60_000)
        producer.produce(names.ROLLUPS_1M, json.dumps(record).encode(), key=sensor.encode(),
                         headers=[(names.HEADER_SITE, SITE.encode())], on_delivery=delivered)
        producer.poll(0)
        n += 1
        time.sleep(max(0.0, started + n * step - time.monotonic()))
    left = producer.flush(30)
    ended = time.time()
    log("chaos", f"relay load: {len(acked)} of {n} rollups of {sensor} acknowledged in {ended - began:.1f}s"
        + (f" ({failed} failed, {left} undelivered)" if failed or left else ""))
    return acked, began, ended


def relay_arrivals(bootstrap: str, sensor: str, expected: set[int], since_ms: int,
                   limit_s: float = DRAIN_LIMIT_S) -> list[float]:
    """When (epoch s) each expected rollup of `sensor` was first seen on the datacenter's mirrored topic.

    Seen, not stamped: MirrorMaker keeps the site's record timestamps, so only a reader
    polling as they come can tell when they arrived (to within a poll, about 1 s)."""
    from services.common import names
    if not expected:
        return []
    seen: dict[int, float] = {}
    key = sensor.encode()
    records = _read_since(bootstrap, f"{SITE}.{names.ROLLUPS_1M}", since_ms, lambda m: m.key() == key,
                          limit_s=limit_s, group="chaos-drain", batch=1000)
    with contextlib.closing(records):
        for msg in records:
            try:
                start = json.loads(msg.value()).get("window_start")
            except ValueError:
                continue
            if start in expected:
                seen.setdefault(start, time.time())
                if len(seen) == len(expected):
                    break
    return list(seen.values())


@dataclass
class Relay:
    """Load for the relay while the datacenter is cut off: rollups of one sensor, at the case's rate."""
    sensor: str
    rate: float
    written: set[int] = field(default_factory=set)     # window starts the site's Kafka acknowledged
    began: float = 0.0                                 # writing them, epoch s
    ended: float = 0.0
    drain: Drain | None = None             # once the backlog arrived or DRAIN_LIMIT_S passed

    def write(self, lb: Lab, seconds: float) -> None:
        self.written, self.began, self.ended = write_rollups(lb.bootstrap(SITE), self.sensor, self.rate, seconds)

    def time_drain(self, lb: Lab, lifted: float) -> None:
        arrivals = relay_arrivals(lb.bootstrap(DC), self.sensor, self.written, int(self.began * 1000) - 1000)
        self.drain = drain_figures(len(self.written), self.ended - self.began, lifted, arrivals)


# ---------------------------------------------------------------- faults

def service_filter(site: str, service: str) -> list[str]:
    """`docker ps` options for the containers of exactly the Swarm service <site>_<service>. Not a name
    filter: it matches a substring as a regular expression, so "site-a_mosquitto." also matched
    site-a_mosquitto-agent's containers, and the Mosquitto cases killed the agent (found 2026-11-27:
    MosquittoRestarted did not fire while Mosquitto's uptime ran on)."""
    return ["-f", f"label=com.docker.swarm.service.name={site}_{service}"]


@dataclass
class Lab:
    hosts: list[lab.LabHost]
    relay: Relay | None = None             # a relay case's load, written while the datacenter is cut off
    upgrade: upgrade.Upgrade | None = None    # what the rolling-upgrade case did
    killed_ms: tuple[int, int] | None = None  # the last SIGKILL: epoch ms before and after `docker kill`
    back_s: float | None = None               # a power cut: from `docker start` to the node Ready

    def host(self, site: str) -> lab.LabHost:
        return lab.site_managers(self.hosts)[site]

    def address(self, site: str) -> str:
        return lab.host_ip(self.host(site))

    def bootstrap(self, site: str) -> str:
        return f"{self.address(site)}:9094"

    def mqtt_addresses(self, site: str) -> list[str]:
        return lab.mqtt_addresses(self.hosts, site)

    def mosquitto_address(self, site: str) -> str:
        """Where Mosquitto's port is published now: for a client that takes one address."""
        return lab.host_ip(lab.mosquitto_host(self.hosts, site))

    def container(self, site: str, service: str) -> tuple[lab.LabHost, str]:
        for host in (h for h in self.hosts if h.site == site):
            out = lab.host_exec(host, "docker", "ps", "-q", *service_filter(site, service), check=False).stdout
            if out.split():
                return host, out.split()[0]
        raise RuntimeError(f"no running container of {site}_{service}")

    def kill(self, site: str, service: str) -> None:
        host, container = self.container(site, service)
        log("chaos", f"SIGKILL {site}_{service} ({container[:12]} on {host.name})")
        before = int(time.time() * 1000)
        lab.host_exec(host, "docker", "kill", "-s", "KILL", container)
        after = int(time.time() * 1000)
        # When it died, by its engine (the same clock): `docker exec` itself can take seconds in a loaded lab.
        finished = lab.host_exec(host, "docker", "inspect", "-f", "{{.State.FinishedAt}}", container,
                                 check=False).stdout.strip()
        died = _rfc3339_ms(finished)
        self.killed_ms = (died, died) if died and before - 1000 <= died <= after + 1000 else (before, after)

    def scale(self, site: str, service: str, replicas: int) -> None:
        log("chaos", f"scaling {site}_{service} to {replicas}")
        lab.host_exec(self.host(site), "docker", "service", "scale", "-d", f"{site}_{service}={replicas}")

    def restart(self, site: str, service: str) -> None:
        log("chaos", f"restarting {site}_{service} (docker service update --force)")
        lab.host_exec(self.host(site), "docker", "service", "update", "-d", "--force", f"{site}_{service}")

    def restarts(self, site: str, service: str) -> int:
        """Tasks the service has had (its history): grows by one on every crash or restart."""
        out = lab.host_exec(self.host(site), "docker", "service", "ps", "-q", f"{site}_{service}", check=False)
        return len(out.stdout.split())

    def power_cut(self, host: lab.LabHost, seconds: float) -> None:
        """Kill a lab host's container (every process of the node at once, as a power cut), start it again
        after `seconds`, and wait until the site's manager sees the node Ready."""
        log("chaos", f"power cut of {host.name} ({host.site}) for {seconds:.0f}s")
        lab.run("docker", "kill", host.container)
        time.sleep(seconds)
        started = time.monotonic()
        lab.run("docker", "start", host.container)
        lab.wait_for_engine(host)
        manager = self.host(host.site)

        def ready() -> bool:
            out = lab.host_exec(manager, "docker", "node", "inspect", host.name, "--format", "{{.Status.State}}",
                                check=False).stdout.strip()
            return out == "ready"

        deadline = time.monotonic() + 300
        while not (is_ready := ready()) and time.monotonic() < deadline:
            time.sleep(2)
        if not is_ready:      # the case goes on and counts what it can; the note must not claim a figure
            raise RuntimeError(f"{host.name} was not Ready at its manager 300 s after it was started")
        self.back_s = round(time.monotonic() - started, 1)
        log("chaos", f"{host.name} started; Ready at its manager after {self.back_s:.0f}s")

    def cut(self, on: bool) -> None:
        """Drop (or allow again) all traffic between the datacenter's host and every site's hosts."""
        dc = self.host(DC)
        flag = "-I" if on else "-D"
        log("chaos", f"{'cutting' if on else 'restoring'} the datacenter's links to every site")
        for host in (h for h in self.hosts if h.site != DC):
            ip = lab.host_ip(host)
            for chain, side in (("INPUT", "-s"), ("OUTPUT", "-d"), ("FORWARD", "-s"), ("FORWARD", "-d")):
                lab.host_exec(dc, "iptables", flag, chain, side, ip, "-j", "DROP", check=on)

    def poison(self) -> list[str]:
        """One unreadable record on every topic a site consumer reads; returns the topics."""
        from confluent_kafka import Producer

        from services.common import names
        topics = [names.TEMPERATURE_DATA, names.THRESHOLD_EVENTS, names.DEVICE_REGISTRATION,
                  names.SENSOR_REGISTRATION, names.SENSOR_TYPE_REGISTRATION, names.DEVICE_COMMANDS]
        bad = [b'{"timestamp": 1e999, "temperature": 20, "unit": "C", "sensor_id": "p"}',
               b"[" * 100000, b"\xff\xfe not json", b'{"timestamp": 99999999999999999999999, "temperature": 1}']
        producer = Producer(_client(self.bootstrap(SITE)))
        for topic in topics:
            for value in bad:
                producer.produce(topic, value, key=b"poison")
        assert producer.flush(30) == 0, "poison records not delivered"
        log("chaos", f"{len(bad)} poison records on each of {', '.join(topics)}")
        return topics


# ---------------------------------------------------------------- cases

@dataclass
class Case:
    name: str
    fault: str                                   # what is done, for the table
    inject: Callable[[Lab], None]
    at_s: float = 10.0                           # when, after publishing started
    seconds: float = 60.0                        # how long the device publishes
    datacenter: bool = False                     # count threshold events at the datacenter too
    watch: tuple[tuple[str, str], ...] = ()      # (site, service)s that must not restart (poison)
    allowed_loss: int = 0                        # documented bound (Mosquitto's window)
    stable_s: float = 90.0                       # settling gives up after this long without new rows
    relay: bool = False                          # load the relay during the cut (_cut_for), time its drain
    until_done: bool = False                     # publish until the fault is over (seconds: at most), then 10 s
    variant: str = "v5"                          # the device (VARIANTS)
    in_flight_s: float | None = None             # lost readings allowed: only those published this long before
                                                 # the kill (in flight at the instant of the crash)
    alert: str | None = None                     # the alert (monitoring/rules) the fault must fire, at the
                                                 # site or the datacenter: Name or Name{label=value} (matches);
                                                 # None: no alert may fire (the healthy case)
    site: str = SITE                             # the site the device publishes to and the case counts at
    max_rate: float | None = None                # the device publishes at most this (of the suite's rate)
    check: Callable[[Lab], None] | None = None   # before the device starts: raises when the lab cannot run it
    reorders: bool = False                       # the device's readings may reach Kafka out of order (it moves
                                                 # to another broker): events are expected of Kafka's order

    def rate(self, suite_rate: float) -> float:
        """The rate the case's device publishes at: the suite's, or the case's lower bound."""
        return min(suite_rate, self.max_rate) if self.max_rate else suite_rate


@dataclass
class Outcome:
    case: str
    acknowledged: int
    stored: int
    lost: int
    duplicated: int
    recovery_s: float
    not_routed: int = 0                         # distinct readings answered PUBACK 0x10
    window_s: float = 0.0                       # first to last PUBACK 0x10: how long nothing routed
    events_expected: int = 0                    # transitions the acknowledged hot readings imply
    events_site: int = 0
    events_dc: int = 0
    events_lost: int = 0
    events_duplicated: int = 0
    announced_twice: int = 0
    restarted: dict[str, int] = field(default_factory=dict)        # watched service -> restarts
    dead_lettered: dict[str, int] = field(default_factory=dict)    # source topic -> dead-letter records
    relay_backlog: int = 0                      # relay load written while the datacenter was cut off
    relay_lost: int = 0                         # of it, records that never reached the datacenter
    drain_ratio: float | None = None            # backlog drain rate / ingest rate (target DRAIN_TARGET)
    upgrade: upgrade.Upgrade | None = None      # the rolling-upgrade case's run and downtimes
    variant: str = "v5"                         # the device (VARIANTS)
    lost_in_flight: int | None = None           # of lost, readings published within the case's in_flight_s
                                                # before the kill (None: the case allows no loss window)
    alerted: dict[str, float] = field(default_factory=dict)        # alerts after the fault -> delay s
    notes: list[str] = field(default_factory=list)


def _rfc3339_ms(text: str) -> int | None:
    """Epoch ms of Docker's `2026-11-26T17:58:01.123456789Z`; None for anything else."""
    head, _, frac = text.rstrip("Z").partition(".")
    try:
        seconds = datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
    return int(seconds * 1000) + int((frac + "000")[:3]) if frac.isdigit() or not frac else None


def _sleep_then(seconds: float, action: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        time.sleep(seconds)
        action()
    return run


def _down_for(seconds: float, site: str, service: str) -> Callable[[Lab], None]:
    def inject(lb: Lab) -> None:
        lb.scale(site, service, 0)
        _sleep_then(seconds, lambda: lb.scale(site, service, 1))()
    return inject


def _power_cut(seconds: float, name: str) -> Callable[[Lab], None]:
    def inject(lb: Lab) -> None:
        hosts = {h.name: h for h in lb.hosts}
        if name not in hosts:
            raise RuntimeError(f"the lab has no host {name}; hosts: {', '.join(sorted(hosts))}")
        lb.power_cut(hosts[name], seconds)
    return inject


def _mosquitto_on(name: str, runs: bool) -> Callable[[Lab], None]:
    """A check: Mosquitto runs (or does not run) on host `name`, so that a power cut of it tests what it says."""
    def check(lb: Lab) -> None:
        where = lab.mosquitto_host(lb.hosts, SITE).name
        if (where == name) != runs:
            hint = ("node-power-cut-mqtt moves it off" if runs is False
                    else "a restart starts it on the mqtt_node with fewer tasks, site-a-2: "
                         "`scripts/lab chaos --case mosquitto-kill`")
            raise RuntimeError(f"Mosquitto runs on {where}, so a power cut of {name} would not test what this case "
                               f"says ({hint})")
    return check


def _cut_for(seconds: float) -> Callable[[Lab], None]:
    """Cut the datacenter off for `seconds`; with lb.relay, write its load meanwhile, then time the drain."""
    def inject(lb: Lab) -> None:
        lb.cut(True)
        try:
            if lb.relay:
                lb.relay.write(lb, seconds)
            else:
                time.sleep(seconds)
        finally:
            lifted = time.time()         # before the first rule goes: the drain time errs long, not short
            lb.cut(False)
        if lb.relay:
            lb.relay.time_drain(lb, lifted)
    return inject


CASES: dict[str, Case] = {c.name: c for c in (
    # First, while nothing else has happened: a run without a fault fires no alert at all.
    Case("healthy", "none: a device publishes, nothing else happens", lambda lb: None,
         stable_s=300.0),    # right after `scripts/lab up` the detector's first micro-batches took 73-215 s
    Case("bridge-kill", "SIGKILL site-a's bridge", lambda lb: lb.kill(SITE, "bridge"),
         alert="ServiceRestarted{job=bridge}"),
    Case("mosquitto-kill", "SIGKILL site-a's Mosquitto", lambda lb: lb.kill(SITE, "mosquitto"),
         allowed_loss=-1, alert="MosquittoRestarted"),     # bounded by the documented window, reported as a figure
    # The same crash for devices that do not resend on PUBACK 0x10 (issue 26): nothing acknowledged may be lost
    # beyond what was in flight at the instant of the crash.
    Case("mosquitto-kill-v3.1.1", "SIGKILL site-a's Mosquitto; an MQTT 3.1.1 device",
         lambda lb: lb.kill(SITE, "mosquitto"), variant="v3.1.1", in_flight_s=IN_FLIGHT_S, alert="MosquittoRestarted"),
    Case("mosquitto-kill-v5-ignore-codes", "SIGKILL site-a's Mosquitto; a v5 device that ignores reason codes",
         lambda lb: lb.kill(SITE, "mosquitto"), variant="v5-ignore-codes", in_flight_s=IN_FLIGHT_S,
         alert="MosquittoRestarted"),
    # Back within a minute, under KafkaBrokerDown's `for: 2m`: the broker's new start is what is seen.
    Case("kafka-broker-down", "site-a's kafka-2 stopped for 60 s", _down_for(60, SITE, "kafka-2"), seconds=90,
         alert="ServiceRestarted{job=kafka}"),
    Case("cassandra-restart", "site-a's Cassandra restarted", lambda lb: lb.restart(SITE, "cassandra-1"),
         alert="ServiceRestarted{job=cassandra}"),
    Case("adapter-kill", "SIGKILL site-a's adapter", lambda lb: lb.kill(SITE, "cassandra-adapter"),
         alert=f"ServiceRestarted{{job=adapter,site={SITE}}}"),
    # A power cut of the mqtt_node that runs Mosquitto (site-a-2, a worker: the site's one manager, site-a-1,
    # must live to start it elsewhere). Swarm starts Mosquitto on site-a-1 and the device, given both
    # addresses, moves there; what Mosquitto had taken and not yet handed to the bridge is lost with it (its
    # window when its node dies: docs/operations.md, "When a node dies"), so the loss is measured, not bounded.
    Case("node-power-cut-mqtt", "site-a-2 (Mosquitto, kafka-2, a bridge, an adapter) powered off for 3 min",
         _power_cut(180, "site-a-2"), seconds=240.0, until_done=True, stable_s=300.0, allowed_loss=-1,
         alert=f"NodeDown{{nodename=site-a-2,site={SITE}}}", check=_mosquitto_on("site-a-2", True), reorders=True),
    # A power cut of the node with a broker and a share of the stateless services (site-a-2, once Mosquitto
    # runs on site-a-1): Swarm starts its bridge and adapter on site-a-1, the other broker leads every
    # partition. Publishing goes on until it is back.
    Case("node-power-cut-stateless", "site-a-2 (kafka-2, a bridge, an adapter) powered off for 3 min",
         _power_cut(180, "site-a-2"), seconds=240.0, until_done=True, stable_s=300.0,
         alert=f"NodeDown{{nodename=site-a-2,site={SITE}}}", check=_mosquitto_on("site-a-2", False)),
    # A single-node site loses everything at once: the device cannot connect until Mosquitto is back and keeps
    # its readings meanwhile (paho's queue); what Mosquitto had acknowledged and not yet saved is its window.
    # The site's own Prometheus is down too: the datacenter's FleetSiteCutOff names the site. At 100/s the device
    # comes back with ~30,000 readings, six bursts of its login, and catches up within its rate (250/s) before the
    # case ends (docs/faults.md, "A device whose backlog outgrows its burst"); at the suite's 200/s it would gain
    # only 50/s on its backlog (not run: about 20 minutes).
    Case("node-power-cut-single", "site-b's only node powered off for 3 min", _power_cut(180, "site-b-1"),
         site="site-b", seconds=480.0, stable_s=300.0, allowed_loss=-1, alert="FleetSiteCutOff{site=site-b}",
         max_rate=100.0),
    Case("dc-adapter-down", "datacenter's adapter down for 3 min", _down_for(180, DC, "cassandra-adapter"),
         seconds=200, datacenter=True, alert=f"ServiceNotRunning{{job=adapter,site={DC}}}"),
    Case("mirrormaker-kill", "SIGKILL the datacenter's MirrorMaker", lambda lb: lb.kill(DC, "mirrormaker"),
         datacenter=True, alert="ServiceRestarted{job=mirrormaker}",
         # In the loaded lab the new MirrorMaker started its tasks 152 s after the kill (JVM start, then the
         # group join once the killed member's session ended): the 90 s default gave up with 58 of 60 events
         # still on their way, and all were at the datacenter minutes later (2026-11-27).
         stable_s=300.0),
    Case("dc-cut-off", "datacenter cut off from every site for 5 min", _cut_for(300), seconds=320,
         datacenter=True, relay=True, alert=f"FleetSiteCutOff{{site={SITE}}}"),
    Case("detector-kill", "SIGKILL site-a's threshold detector mid-episode",
         lambda lb: lb.kill(SITE, "threshold-detector"), at_s=21.0, datacenter=True,
         stable_s=300.0,     # a restarted Spark job's first micro-batch took 82 s in the loaded lab
         alert="ServiceRestarted{spark_job=threshold-detector}"),
    Case("rolling-upgrade", "every image rebuilt, site.yml rerun for site-a (tooling/lab/upgrade.py)",
         lambda lb: setattr(lb, "upgrade", upgrade.run(lb.hosts, SITE)), seconds=1800.0, until_done=True,
         datacenter=True, stable_s=300.0, alert=f"ServiceRestarted{{job=bridge,site={SITE}}}"),
    Case("poison", "unreadable records on every consumed topic", lambda lb: lb.poison(),
         watch=((SITE, "cassandra-adapter"), (SITE, "bridge"), (SITE, "threshold-detector")),
         alert="RecordsDeadLettered{topic=temperature-data}"),
)}


def _settle(probe: Callable[[], dict], done: Callable[[dict], bool], limit_s: float, stable_s: float) -> dict:
    """Probe every 5 s until done(found), or nothing changed for stable_s, or limit_s passed."""
    deadline = time.monotonic() + limit_s
    found = probe()
    changed = time.monotonic()
    while not done(found) and time.monotonic() < deadline and time.monotonic() - changed < stable_s:
        time.sleep(5)
        again = probe()
        if len(again) != len(found):
            changed = time.monotonic()
        found = again
    return found


def run_case(hosts: list[lab.LabHost], case: Case, rate: float = 200.0, settle_s: float = 600.0,
             receiver: AlertLog | None = None) -> Outcome:
    """One case; with the lab's alert receiver listening, also whether its alert reached it (a note)."""
    rate = case.rate(rate)
    run = uuid.uuid4().hex[:6]
    sensor = f"chaos-{case.name}-{run}"
    lb = Lab(hosts, Relay(f"{sensor}-relay", rate) if case.relay else None)
    if case.check:
        case.check(lb)
    restarts_before = {w: lb.restarts(*w) for w in case.watch}
    log("chaos", f"case {case.name}: {case.fault} at {case.at_s:.0f}s of {case.seconds:.0f}s at {rate:g}/s "
                 f"({case.variant} device)")
    device = Device(lb.address(case.site), case.site, sensor, variant=case.variant,
                    mqtt_hosts=lb.mqtt_addresses(case.site))
    started_ms = int(time.time() * 1000)
    fault_ms: list[int] = []
    fault_over = threading.Event()
    watch = AlertWatch(hosts, (case.site, DC))

    def fault() -> None:
        watch.start()
        fault_ms.append(int(time.time() * 1000))
        try:
            case.inject(lb)
        finally:
            fault_over.set()

    done = threading.Event()
    if case.until_done:          # then 10 s more, so readings after the fault are counted too
        threading.Thread(target=lambda: (fault_over.wait(), time.sleep(10), done.set()), daemon=True).start()
    try:
        device.run(case.seconds, rate, {case.at_s: fault}, stop=done)
        device.finish()
    finally:
        device.client.loop_stop()
    fault_over.wait(DRAIN_LIMIT_S + 120)      # a cut's drain outlasts the publishing
    acked = device.acked[sensor]
    days = _days(acked)
    site = lb.host(case.site)
    # Settle: until every acknowledged reading is stored, or nothing new arrived for STABLE_S.
    rows = _settle(lambda: stored(site, case.site, "temperature_readings", sensor, days, case.site),
                   lambda found: acked <= {ms for ms, _ in found}, settle_s, case.stable_s)
    stored_ms = {ms for ms, _ in rows}
    after = fault_ms[0] if fault_ms else started_ms
    latencies = [lat for (ms, _), lat in rows.items() if ms >= after]
    records = kafka_records(lb.bootstrap(case.site), "temperature-data", {sensor}, started_ms - 1000)[sensor]
    outcome = Outcome(case.name, len(acked), len(acked & stored_ms), len(acked - stored_ms),
                      max(0, len(records) - len({r.get("timestamp") for r in records})),
                      round(max(latencies, default=0) / 1000, 1), not_routed=len(device.not_routed),
                      window_s=round(max(device.not_routed_times, default=0) - min(device.not_routed_times,
                                                                                    default=0), 1),
                      variant=case.variant)
    if case.in_flight_s is not None:
        before, after_kill = lb.killed_ms or (after, after)
        window = range(before - int(case.in_flight_s * 1000), after_kill + 1)
        outcome.lost_in_flight = sum(ms in window for ms in acked - stored_ms)
        outcome.notes.append(f"in flight: published from {case.in_flight_s:g}s before the kill "
                             f"({after_kill - before} ms of uncertainty on when it died)")
    if device.refused:
        outcome.notes.append(f"{device.refused} PUBACKs refused")
    if lb.back_s is not None:
        outcome.notes.append(f"the node was Ready at its manager {lb.back_s:g}s after it was started")
    _count_events(lb, case, device, started_ms, after, settle_s, outcome)
    if lb.relay:
        _report_drain(lb.relay.drain, outcome)
    if lb.upgrade:
        outcome.upgrade = lb.upgrade
        outcome.notes.append(lb.upgrade.summary())
    if case.alert:               # the alert may still be on its way (scrape, evaluation)
        deadline = watch.fault_at + ALERT_WAIT_S
        while time.time() < deadline and watch.first(case.alert) is None:
            time.sleep(5)
    outcome.alerted = watch.stop()
    if watch.errors:
        outcome.notes.append(f"{watch.errors} polls of the alerts got no answer (last: {watch.last_error})")
    if case.alert and watch.first(case.alert) is None:
        outcome.notes.append(f"{case.alert} did not fire")
    if not case.alert and outcome.alerted:
        outcome.notes.append("alerts fired without a fault")
    if receiver and case.alert and watch.first(case.alert) is not None:
        outcome.notes.append(_notified(receiver, case.alert, watch.fault_at))
    for watched, before in restarts_before.items():
        outcome.restarted[watched[1]] = lb.restarts(*watched) - before
        if outcome.restarted[watched[1]]:
            outcome.notes.append(f"{watched[1]} restarted {outcome.restarted[watched[1]]} times")
    if case.watch:
        outcome.dead_lettered = dead_letters(lb.bootstrap(SITE), started_ms)
        outcome.notes.append("dead-lettered by source: " + ", ".join(
            f"{k}={v}" for k, v in sorted(outcome.dead_lettered.items())))
    log("chaos", f"case {case.name}: {outcome}")
    return outcome


@contextlib.contextmanager
def notifications(hosts: list[lab.LabHost]) -> Iterator[AlertLog]:
    """What the lab's receiver (lab.start_alert_receiver) gets from now on, so each case notes whether its
    alert reached it; first the suite waits out failed notifications of a time the receiver was not there."""
    lab.start_alert_receiver()
    _age_out_failed_notifications(hosts)
    yield lab.alert_log()


# What notifications that failed while no receiver listened raise: the site's own alert and the datacenter's copy.
FAILED_NOTIFICATION_ALERTS = ("AlertNotificationsFailing", "FleetSiteCannotNotify")


def _age_out_failed_notifications(hosts: list[lab.LabHost], limit_s: float = 900.0) -> None:
    """Notifications the lab's Alertmanagers sent while no receiver listened failed, and AlertNotificationsFailing
    and FleetSiteCannotNotify (rightly) say so for 10 min after the last failure: wait that out, so the
    healthy case starts quiet."""
    watch = AlertWatch(hosts, (SITE, DC))
    for alert in FAILED_NOTIFICATION_ALERTS:
        if not any(matches(k, alert) for k in watch.firing_now()):
            continue
        log("chaos", f"{alert} fires (notifications failed before the receiver listened); "
                     f"waiting up to {limit_s:.0f}s for it to resolve")
        waited = watch.resolved(alert, limit_s)
        log("chaos", f"{alert} resolved after {waited:.0f}s" if waited is not None
            else f"{alert} still fires: the healthy case will say so")


def _notified(receiver: AlertLog, wanted: str, since: float, wait_s: float = 120.0) -> str:
    """Whether the lab's webhook (what a person's pager gets) received the alert: Alertmanager's group wait
    (30 s) after it fired, or a group interval (5 min) when its group was already open."""
    deadline = time.time() + wait_s
    while True:
        got = [at for at, note in receiver.received() if at >= since
               and any(matches(key(a["labels"]), wanted) for a in note.get("alerts", []))]
        if got:
            return f"notified +{min(got) - since:.0f}s"
        if time.time() > deadline:
            return f"{wanted} not notified within {wait_s:.0f}s of firing (its group may have been open)"
        time.sleep(5)


def _report_drain(drain: Drain | None, outcome: Outcome) -> None:
    if drain is None:
        outcome.notes.append("relay drain not measured (see the log)")
        return
    outcome.relay_backlog, outcome.relay_lost = drain.backlog, drain.lost
    outcome.drain_ratio = None if drain.ratio is None else round(drain.ratio, 1)
    note = (f"relay: {drain.backlog} rollups in {drain.cut_s:.0f}s cut off ({drain.ingest_per_s:.0f}/s), "
            f"{drain.arrived} arrived")
    if drain.drain_s is not None:
        note += f", the last {drain.drain_s:.1f}s after the cut was lifted ({drain.drain_per_s:.0f}/s)"
    if drain.ratio is not None:
        note += f": {drain.ratio:.1f}x the ingest rate (target {DRAIN_TARGET:g}x)"
    outcome.notes.append(note)
    if drain.early:
        outcome.notes.append(f"{drain.early} relayed rollups reached the datacenter during the cut")


def _count_events(lb: Lab, case: Case, device: Device, started_ms: int, after_ms: int, settle_s: float,
                  outcome: Outcome) -> None:
    """Threshold events of the hot sensors: at the site always, at the datacenter for relay cases."""
    site, dc = lb.host(case.site), lb.host(DC)
    expected = device.transitions()
    days = _days({ms for s in device.hot for ms in device.acked[s]})
    if case.reorders:        # the detector's input is Kafka's order, which lost readings are not in either
        arrived = kafka_records(lb.bootstrap(case.site), "temperature-data", set(device.hot), started_ms - 1000)
        in_order = transitions({s: [(r.get("timestamp", 0), r.get("temperature", 0.0)) for r in records]
                                for s, records in arrived.items()})
        if in_order < expected:
            outcome.notes.append(f"{expected - in_order} threshold events implied by readings lost or reaching "
                                 "Kafka after newer ones (the detector ignores those)")
            expected = in_order
    elif case.allowed_loss < 0 or case.in_flight_s is not None:
        kept = {s: {ms for ms, _ in stored(site, case.site, "temperature_readings", s, days, case.site)}
                for s in device.hot}
        if (of_kept := device.transitions(kept)) < expected:
            outcome.notes.append(f"{expected - of_kept} threshold events implied only by readings Mosquitto lost")
            expected = of_kept

    def events(host: lab.LabHost, tier: str) -> dict[tuple[str, int, str], int]:
        return {(s, ms, last): lat for s in device.hot
                for (ms, last), lat in stored(host, tier, "temperature_threshold_events", s, days, case.site).items()}

    at_site = _settle(lambda: events(site, case.site), lambda found: len(found) >= expected, settle_s, case.stable_s)
    outcome.events_expected, outcome.events_site = expected, len(at_site)
    if len(at_site) < expected:
        outcome.notes.append(f"site has {len(at_site)} of {expected} threshold events")
    if not case.datacenter:
        return
    at_dc = _settle(lambda: events(dc, DC), lambda found: set(at_site) <= set(found), settle_s,
                   case.stable_s)
    outcome.events_dc = len(at_dc)
    outcome.events_lost = len(set(at_site) - set(at_dc))
    relayed = kafka_records(lb.bootstrap(DC), f"{case.site}.temperature-threshold-events", set(device.hot),
                            started_ms - 1000)
    keys = [(s, r.get("timestamp"), r.get("is_last")) for s, recs in relayed.items() for r in recs]
    outcome.events_duplicated = len(keys) - len(set(keys))
    latencies = [lat for (_s, ms, _l), lat in at_dc.items() if ms >= after_ms]
    outcome.recovery_s = max(outcome.recovery_s, round(max(latencies, default=0) / 1000, 1))
    outcome.announced_twice = _announced_twice(lb, device, started_ms)


def _announced_twice(lb: Lab, device: Device, since_ms: int) -> int:
    """Notifications at the datacenter that repeat one already made for the same event."""
    from services.common import names

    def text(msg: Message) -> str:
        return msg.value().decode(errors="replace") if msg.value() else ""

    seen = [text(msg) for msg in _read_since(lb.bootstrap(DC), names.NOTIFICATIONS, since_ms,
                                             lambda m: any(s in text(m) for s in device.hot), quiet_s=10,
                                             group="chaos-n")]
    return len(seen) - len(set(seen))


# ---------------------------------------------------------------- table

COLUMNS = ("case", "variant", "acknowledged", "stored", "lost", "lost_in_flight", "duplicated", "recovery_s",
           "not_routed", "window_s", "events_site", "events_dc", "events_lost", "events_duplicated",
           "announced_twice", "relay_lost", "drain_ratio", "alerted")


def table(outcomes: list[Outcome]) -> str:
    rows = [[_cell(getattr(o, c)) for c in COLUMNS] + ["; ".join(o.notes)] for o in outcomes]
    header = [*COLUMNS, "notes"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, dict):          # alerted: each alert and its delay after the fault
        return ", ".join(f"{k} +{d:.0f}s" for k, d in sorted(value.items(), key=lambda i: i[1])) or "none"
    return "-" if value is None else str(value)


def kept_all(outcome: Outcome) -> bool:
    """Nothing acknowledged was lost (beyond a documented window), every threshold transition reached the
    site (and the datacenter, announced once), a relay case's load all arrived, and the case's alert fired
    (the healthy case: no alert fired)."""
    case = CASES[outcome.case]
    readings = (outcome.lost == 0 or case.allowed_loss < 0
                or (case.in_flight_s is not None and outcome.lost == outcome.lost_in_flight))
    events = (outcome.events_site >= outcome.events_expected and outcome.events_lost == 0
              and outcome.announced_twice == 0)
    relay = not case.relay or (outcome.relay_backlog > 0 and outcome.relay_lost == 0)
    alerted = (any(matches(k, case.alert) for k in outcome.alerted) if case.alert
               else not outcome.alerted)
    return readings and events and relay and alerted
