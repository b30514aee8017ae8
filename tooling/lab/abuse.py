"""One device's valid login against its own site: the abusive-device cases (issue 26, docs/security.md).

Each case runs against the lab (`scripts/lab up`) from outside, at site-a. Honest devices, each with a login
of its own (lab.probe_devices), publish readings at QoS 1 over TLS to site-a's 8883 while the abuser
(lab.abuser_device, or a service's login where the case says so) tries one thing it must not be able to do.
Then the case reads site-a's temperature-data from outside (the operator's login over 9094) and counts the
honest devices' readings: acknowledged (a PUBACK below 0x80, 0x10 included, since an MQTT v5 device may take
it as delivered and a 3.1.1 device never hears of it: tooling.lab.chaos variant v5-ignore-codes), stored (of
those, found in temperature-data) and lost (acknowledged and not stored). The promise: 0 lost, whatever the
abuser does. Each case also records what the abuser saw (Outcome.saw), the restarts of site-a's Mosquitto
and bridge during the case, and whether a fresh reading still reaches temperature-data afterwards
(ingesting_s). `violations(outcome)` lists what breaks the promise. tests/lab/test_2_abusive_device.py
asserts each case; the fault suite runs the same functions (`scripts/lab chaos --case abuse-<name>`). The
cases and their figures: docs/faults.md, "One device against its site".
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.common import names
from tooling.build.progress import log
from tooling.lab import chaos, lab
from tooling.lab.alerts_seen import AlertWatch

SITE = "site-a"
RATE = 100.0                     # readings/s of each honest device
REGISTRATION_WAIT_S = 3.0        # the bridge reads sensor-registration before it takes their readings
QUIET_S = 30.0                   # counting stops when no honest reading came for this long
COUNT_LIMIT_S = 600.0            # and after this long at most (a flood's backlog takes a while)
ALIVE_LIMIT_S = 60.0             # a fresh reading must reach temperature-data within this after a case
LATENCY_LIMIT_S = 10.0           # the poison and flood cases: every honest reading reaches Kafka within this
BRIDGE_CLIENT_ID = "bridge-1"    # the lab's one bridge replica (stack-edge.yml.j2: bridge-<task slot>)
READING = '{{"timestamp": {ms}, "temperature": 21.5, "unit": "C"}}'


# ---------------------------------------------------------------- outcome

@dataclass
class Outcome:
    case: str
    devices: int = 0                 # honest devices
    published: int = 0               # honest readings published
    acknowledged: int = 0            # of those, PUBACK below 0x80
    stored: int = 0                  # of those, in temperature-data
    lost: int = 0                    # acknowledged and not stored
    not_routed: int = 0              # of acknowledged, PUBACK 0x10 "no matching subscribers"
    refused: int = 0                 # honest PUBACKs of 0x80 or more (not acknowledged)
    latency_max_s: float | None = None      # slowest stored honest reading, publish to Kafka
    ingesting_s: float | None = None        # a fresh reading after the case reached Kafka in this long (None: not
                                            # within ALIVE_LIMIT_S)
    restarts: dict[str, int] = field(default_factory=dict)   # site-a service -> tasks it started during the case
    exits: list[str] = field(default_factory=list)           # errors of site-a's Mosquitto/bridge tasks that ended
    saw: dict[str, object] = field(default_factory=dict)     # what the abuser saw, per case (see its function)
    alerted: dict[str, float] = field(default_factory=dict)  # alerts site-a fired after the abuse began -> delay s
    seconds: float = 0.0                                     # the case's wall time
    notes: list[str] = field(default_factory=list)


def violations(outcome: Outcome) -> list[str]:
    """What in `outcome` breaks the promise that one device cannot hurt its site; empty when it holds."""
    out = []
    if outcome.acknowledged == 0:
        out.append("the honest devices got nothing acknowledged")
    if outcome.lost:
        out.append(f"{outcome.lost} of {outcome.acknowledged} acknowledged honest readings never reached "
                   f"{names.TEMPERATURE_DATA}")
    if outcome.ingesting_s is None:
        out.append(f"no fresh reading reached {names.TEMPERATURE_DATA} within {ALIVE_LIMIT_S:.0f}s after the case")
    out += [f"{service} restarted {n} times" for service, n in outcome.restarts.items() if n]
    out += CHECKS.get(outcome.case, lambda _o: [])(outcome)
    expected = EXPECTED_OFFENCES.get(outcome.case)
    if expected and not any(_offence(name) in expected for name in outcome.alerted):
        out.append(f"no MqttLoginMisused alert for {' or '.join(sorted(expected))} (alerted: "
                   f"{', '.join(outcome.alerted) or 'none'})")
    return out


# The iot_gate offence each case's abuser commits, which MqttLoginMisused must name (monitoring/rules). The
# poison case's packet is over max_packet_size: Mosquitto closes the connection before any plugin sees it,
# so only a device that keeps resending it is seen (reconnecting); the retained readings likewise.
EXPECTED_OFFENCES: dict[str, set[str]] = {
    "subscribe-thief": {"subscribe_denied"},
    "session-takeover": {"client_id_not_device_id"},
    "poison-user-properties": {"reconnecting"},
    "retained-flood": {"reconnecting", "publish_denied"},
    "flood": {"rate_limited"},
    "bridge-login-on-device-port": {"service_login_on_device_listener"},
    "device-login-on-overlay": {"device_login_on_services_listener"},
}
ALERT_WAIT_S = 120.0             # the agent asks for stats every 10 s, Prometheus scrapes and evaluates


def _offence(alert_key: str) -> str | None:
    """The offence of a MqttLoginMisused alert's key (tooling.lab.alerts_seen.key), None for other alerts."""
    if not alert_key.startswith("MqttLoginMisused{"):
        return None
    labels = dict(part.split("=", 1) for part in alert_key[len("MqttLoginMisused{"):-1].split(","))
    return labels.get("offence")


def refuses(code: object) -> bool:
    """A CONNACK or SUBACK that refuses: a reason code of 0x80 or more, or the connection closed without one."""
    return code is None or (isinstance(code, int) and code >= 0x80)


CHECKS: dict[str, Callable[[Outcome], list[str]]] = {
    "subscribe-thief": lambda o: [f"SUBACK {hexed(codes)} for {f}" for f, codes in o.saw.get("suback", {}).items()
                                  if not all(isinstance(c, int) and c >= 0x80 for c in codes)],
    "session-takeover": lambda o: [f"took over {BRIDGE_CLIENT_ID}'s session {o.saw['session_present']} times"]
    if o.saw.get("session_present") else [],
    "poison-user-properties": lambda o: _slow(o),
    # The flood's cost is the site's capacity: its honest devices' latency is reported (docs/faults.md), not
    # bounded; what one device may add is stack_mqtt_device_max_rate and its burst.
    "bridge-login-on-device-port": lambda o: [] if refuses(o.saw.get("connack")) else
    [f"the bridge's login was accepted on 8883 (CONNACK {hexed(o.saw.get('connack'))})"],
    "device-login-on-overlay": lambda o: [] if refuses(o.saw.get("connack")) else
    [f"a device login was accepted on the overlay's 1883 (CONNACK {hexed(o.saw.get('connack'))})"],
}


def _slow(outcome: Outcome) -> list[str]:
    if outcome.latency_max_s is not None and outcome.latency_max_s <= LATENCY_LIMIT_S:
        return []
    return [f"the slowest honest reading took {outcome.latency_max_s}s to reach Kafka (bound {LATENCY_LIMIT_S:g}s)"]


def hexed(value: object) -> str:
    if isinstance(value, int):
        return f"0x{value:02x}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(hexed(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {hexed(v)}" for k, v in value.items()) + "}"
    return str(value)


# ---------------------------------------------------------------- one MQTT connection

class Session:
    """One MQTT connection that never reconnects. The constructor waits for the CONNACK (`connack`, None when
    the connection closed or failed without one); subscribe() and publish() wait for their answer (None
    when the connection closed first); counts the messages it receives; `closed` says why the broker
    closed it (reason code, or the error)."""

    def __init__(self, host: str, username: str, password: str, client_id: str, *, port: int = 8883,
                 tls: bool = True, protocol: str = "5", clean_start: bool = True, timeout: float = 15.0):
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion
        self.connack: int | None = None
        self.session_present = False
        self.received = 0
        self.closed: int | str | None = None
        self._closing = False
        self._answers: dict[int, object] = {}
        self._cond = threading.Condition()
        v5 = protocol == "5"
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                                  protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311, reconnect_on_failure=False,
                                  **({} if v5 else {"clean_session": clean_start}))
        self.client.username_pw_set(username, password)
        if tls:
            self.client.tls_set(ca_certs=str(lab.pki_dir() / "ca.crt"))
        self.client.max_inflight_messages_set(1000)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        try:
            self.client.connect(host, port, keepalive=30, **({"clean_start": clean_start} if v5 else {}))
        except OSError as err:
            self.closed = f"{type(err).__name__}: {err}"
            return
        self.client.loop_start()
        with self._cond:
            self._cond.wait_for(lambda: self.connack is not None or self.closed is not None, timeout)

    def _on_connect(self, _c, _u, flags, reason_code, _p) -> None:
        with self._cond:
            self.connack = reason_code.value
            self.session_present = bool(flags.session_present)
            self._cond.notify_all()

    def _on_disconnect(self, _c, _u, _f, reason_code, _p) -> None:
        with self._cond:
            if not self._closing:
                self.closed = reason_code.value if reason_code.value else "connection lost"
            self._cond.notify_all()

    def _on_subscribe(self, _c, _u, mid, reason_codes, _p) -> None:
        with self._cond:
            self._answers[mid] = [rc.value for rc in reason_codes]
            self._cond.notify_all()

    def _on_publish(self, _c, _u, mid, reason_code, _p) -> None:
        with self._cond:
            self._answers[mid] = reason_code.value
            self._cond.notify_all()

    def _on_message(self, _c, _u, _m) -> None:
        with self._cond:
            self.received += 1

    @property
    def up(self) -> bool:
        return self.connack == 0 and self.closed is None

    def _answer(self, mid: int, timeout: float) -> object:
        with self._cond:
            self._cond.wait_for(lambda: mid in self._answers or self.closed is not None, timeout)
            return self._answers.get(mid)

    def subscribe(self, topic_filter: str, qos: int = 1, timeout: float = 15.0) -> int | None:
        """The SUBACK's reason code (granted QoS, or 0x80 and more: refused)."""
        if not self.up:
            return None
        rc, mid = self.client.subscribe(topic_filter, qos)
        codes = self._answer(mid, timeout) if rc == 0 else None
        return codes[0] if isinstance(codes, list) and codes else None

    def publish(self, topic: str, payload: bytes | str, qos: int = 1, retain: bool = False, properties=None,
                timeout: float = 30.0) -> int | None:
        """The PUBACK's reason code (0 for an MQTT 3.1.1 PUBACK)."""
        if not self.up:
            return None
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        code = self._answer(info.mid, timeout) if info.rc == 0 else None
        return code if isinstance(code, int) else None

    def answer(self, code: int | None) -> str:
        """A PUBACK code or what came instead, for people."""
        if code is not None:
            return f"PUBACK {hexed(code)}"
        return f"closed ({hexed(self.closed)})" if self.closed is not None else "no answer"

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(Exception):
            self.client.disconnect()
        self.client.loop_stop()


# ---------------------------------------------------------------- the honest devices and the count

def _topic(device: str, sensor: str) -> str:
    return names.MQTT_READINGS.format(site=SITE, device_id=device, sensor_id=sensor)


class Honest:
    """`count` honest devices (lab.probe_devices, one login each), each publishing its own sensor at `rate`
    readings/s at QoS 1 over TLS (tooling.lab.chaos.Device, variant v5-ignore-codes), sensors registered first."""

    def __init__(self, lb: chaos.Lab, case: str, run: str, count: int, rate: float):
        if count > len(lab.probe_devices(SITE)) - 1:
            raise ValueError(f"at most {len(lab.probe_devices(SITE)) - 1} honest devices (lab.PROBE_DEVICES, "
                             "one kept for the alive probe)")
        self.rate = rate
        self.stop = threading.Event()
        devices = lab.probe_devices(SITE)[:count]
        sensors = {device: f"{device}-{case}-{run}" for device in devices}
        for device, sensor in sensors.items():
            lab.register_sensors(SITE, device, [sensor], wait_s=0, bootstrap=lb.bootstrap(SITE))
        time.sleep(REGISTRATION_WAIT_S)
        self.devices = [chaos.Device(lb.address(SITE), SITE, sensor, hot_sensors=0, device=device,
                                     mqtt_hosts=lb.mqtt_addresses(SITE), variant="v5-ignore-codes", register=False)
                        for device, sensor in sensors.items()]
        self.threads: list[threading.Thread] = []

    def start(self, limit_s: float) -> None:
        """Publish until stop() (or limit_s)."""
        self.threads = [threading.Thread(target=d.run, args=(limit_s, self.rate), kwargs={"stop": self.stop},
                                         daemon=True) for d in self.devices]
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        """Stop publishing, wait for the PUBACKs still due, disconnect."""
        self.stop.set()
        for thread in self.threads:
            thread.join()
        finishing = [threading.Thread(target=d.finish, daemon=True) for d in self.devices]
        for thread in finishing:
            thread.start()
        for thread in finishing:
            thread.join()

    def acked(self) -> dict[str, set[int]]:
        return {d.sensor: set(d.acked[d.sensor]) for d in self.devices}


def count(lb: chaos.Lab, acked: dict[str, set[int]], since_ms: int, extra: set[str] = frozenset(),
          quiet_s: float = QUIET_S, limit_s: float = COUNT_LIMIT_S) -> tuple[dict[str, dict[int, int]], Counter]:
    """The acknowledged readings found in temperature-data since `since_ms` (sensor -> event ms -> publish-to-Kafka
    ms), reading until all are there, or none came for quiet_s, or limit_s passed; and how many records of
    the `extra` sensors came by then."""
    found: dict[str, dict[int, int]] = {sensor: {} for sensor in acked}
    others: Counter = Counter()
    keys = {k.encode() for k in set(acked) | set(extra)}
    missing = sum(len(v) for v in acked.values())
    records = chaos._read_since(lb.bootstrap(SITE), names.TEMPERATURE_DATA, since_ms, lambda m: m.key() in keys,
                               quiet_s=quiet_s, limit_s=limit_s, group="abuse-count", batch=1000)
    with contextlib.closing(records):
        for msg in records:
            sensor = msg.key().decode()
            if sensor not in acked:
                others[sensor] += 1
                continue
            try:
                event_ms = json.loads(msg.value()).get("timestamp")
            except ValueError:
                continue
            if event_ms in acked[sensor] and event_ms not in found[sensor]:
                found[sensor][event_ms] = msg.timestamp()[1] - event_ms
                missing -= 1
                if missing == 0:
                    break
    return found, others


def alive(lb: chaos.Lab, limit_s: float = ALIVE_LIMIT_S) -> float | None:
    """Seconds a fresh reading (of the last probe device) took to reach temperature-data; None if none did within
    limit_s. Publishes again every few seconds while Mosquitto refuses or routes nowhere (PUBACK 0x10)."""
    device = lab.probe_devices(SITE)[-1]
    sensor = f"{device}-alive"
    lab.register_sensors(SITE, device, [sensor], bootstrap=lb.bootstrap(SITE))
    started = time.time()
    done = threading.Event()

    def publish() -> None:
        while not done.is_set() and time.time() - started < limit_s:
            session = Session(lb.mosquitto_address(SITE), device, lab.device_password(device), device, timeout=5)
            code = session.publish(_topic(device, sensor), READING.format(ms=int(time.time() * 1000)), timeout=5)
            session.close()
            if code == 0:
                return
            done.wait(3)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        records = chaos._read_since(lb.bootstrap(SITE), names.TEMPERATURE_DATA, int(started * 1000) - 1000,
                                   lambda m: m.key() == sensor.encode(), limit_s=limit_s, group="abuse-alive")
        with contextlib.closing(records):
            for msg in records:
                with contextlib.suppress(ValueError, TypeError):
                    if json.loads(msg.value()).get("timestamp") >= started * 1000:   # this call's reading
                        return round(time.time() - started, 1)
        return None
    finally:
        done.set()
        publisher.join()


# ---------------------------------------------------------------- running a case

class _Tasks:
    """site-a's Mosquitto and bridge tasks: which started and which ended with an error during a case."""
    SERVICES = ("mosquitto", "bridge")

    def __init__(self, lb: chaos.Lab):
        self.lb = lb
        self.before = {s: self._read(s) for s in self.SERVICES}

    def _read(self, service: str) -> dict[str, str]:
        out = lab.host_exec(self.lb.host(SITE), "docker", "service", "ps", "--no-trunc", "--format",
                            "{{.ID}}\t{{.Error}}", f"{SITE}_{service}", check=False, timeout=60).stdout
        return dict((line.split("\t") + [""])[:2] for line in out.splitlines() if line.strip())

    def changes(self) -> tuple[dict[str, int], list[str]]:
        restarts, exits = {}, []
        for service in self.SERVICES:
            after = self._read(service)
            restarts[service] = len(set(after) - set(self.before[service]))
            exits += [f"{service}: {error}" for task, error in after.items()
                      if error and self.before[service].get(task) != error]
        return restarts, exits


def _run(hosts: list[lab.LabHost], case: str, abuse: Callable[[chaos.Lab, str, dict], None], *, honest: int,
         rate: float, lead_s: float, tail_s: float, extra: Callable[[str], set[str]] = lambda _run: set(),
         quiet_s: float = QUIET_S) -> Outcome:
    """Honest devices publish; after lead_s, abuse(lb, run, saw) runs (it returns when its abuse is over); the
    devices go on for tail_s; then count."""
    started = time.monotonic()
    lb, run, saw = chaos.Lab(hosts), uuid.uuid4().hex[:6], {}
    log("abuse", f"case {case}: {honest} honest devices at {rate:g} readings/s each")
    fleet = Honest(lb, case, run, honest, rate)
    tasks = _Tasks(lb)
    since_ms = int(time.time() * 1000) - 1000
    fleet.start(limit_s=3600)
    notes = []
    watch = None
    try:
        time.sleep(lead_s)
        watch = AlertWatch(hosts, (SITE,)).start()
        abuse(lb, run, saw)
        time.sleep(tail_s)
    except Exception as err:  # noqa: BLE001 - still count what the honest devices kept, and say what failed
        notes.append(f"the abuse failed: {type(err).__name__}: {err}")
    finally:
        fleet.finish()
    acked = fleet.acked()
    found, others = count(lb, acked, since_ms, extra(run), quiet_s=quiet_s)
    devices = fleet.devices
    outcome = Outcome(case, devices=len(devices), published=sum(d.published for d in devices),
                      acknowledged=sum(len(v) for v in acked.values()),
                      stored=sum(len(v) for v in found.values()),
                      not_routed=sum(len(d.not_routed) for d in devices), refused=sum(d.refused for d in devices),
                      saw=saw, notes=notes)
    outcome.lost = outcome.acknowledged - outcome.stored
    latencies = [ms for per_sensor in found.values() for ms in per_sensor.values()]
    outcome.latency_max_s = round(max(latencies) / 1000, 1) if latencies else None
    if others:
        saw["abuser_stored"] = sum(others.values())
    outcome.ingesting_s = alive(lb)
    outcome.restarts, outcome.exits = tasks.changes()
    if watch is not None:
        expected = EXPECTED_OFFENCES.get(case, set())
        deadline = watch.fault_at + ALERT_WAIT_S
        while time.time() < deadline and not any(_offence(k) in expected for k in watch.seen):
            time.sleep(5)
        outcome.alerted = watch.stop()
    outcome.seconds = round(time.monotonic() - started)
    log("abuse", f"case {case}: {outcome}")
    return outcome


# ---------------------------------------------------------------- the cases

def _abuser() -> tuple[str, str]:
    device = lab.abuser_device(SITE)
    return device, lab.device_password(device)


def subscribe_thief(hosts: list[lab.LabHost], seconds: float = 40.0, sessions: int = 3, honest: int = 2,
                    rate: float = RATE) -> Outcome:
    """The abuser's login subscribes, in `sessions` sessions for `seconds`, to the bridge's shared subscription
    ($share/bridge/<readings filter>), and in the first also to `#`, `$SYS/#` and another device's commands
    (the first session uses its device id as client id, the others other client ids).
    saw: connack (per session), suback (filter -> reason codes), received, closed (sessions the broker closed)."""
    stolen = "$share/bridge/" + names.MQTT_READINGS.format(site="+", device_id="+", sensor_id="+")
    others = ["#", "$SYS/#", names.MQTT_COMMANDS.format(site=SITE, device_id=f"{SITE}-dev-1")]

    def abuse(lb: chaos.Lab, _run: str, saw: dict) -> None:
        device, password = _abuser()
        opened: list[Session] = []
        suback: dict[str, list[int | None]] = {}
        try:
            for k in range(sessions):
                # The first under its own client id; the others under client ids of their own, which the
                # broker refuses at CONNECT since it binds a login to its device id.
                session = Session(lb.mosquitto_address(SITE), device, password,
                                  device if k == 0 else f"{device}-thief-{k + 1}")
                opened.append(session)
                if refuses(session.connack):
                    continue
                for topic_filter in [stolen] + (others if k == 0 else []):
                    suback.setdefault(topic_filter, []).append(session.subscribe(topic_filter))
            saw.update(connack=[s.connack for s in opened], suback=suback)
            time.sleep(seconds)
        finally:
            saw.update(received=sum(s.received for s in opened),
                       closed=sum(s.closed is not None for s in opened))
            for session in opened:
                session.close()

    return _run(hosts, "subscribe-thief", abuse, honest=honest, rate=rate, lead_s=10, tail_s=10)


def session_takeover(hosts: list[lab.LabHost], seconds: float = 40.0, hold_s: float = 1.0, honest: int = 2,
                     rate: float = RATE) -> Outcome:
    """The abuser's login connects again and again for `seconds` as client id bridge-1 with clean start 0 (MQTT v5),
    each connection held for hold_s. saw: connects, session_present (CONNACKs with Session Present 1),
    refused (connections refused or closed without CONNACK), connacks (CONNACK code -> count), received."""
    def abuse(lb: chaos.Lab, _run: str, saw: dict) -> None:
        device, password = _abuser()
        codes: Counter = Counter()
        connects = present = refused = received = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            session = Session(lb.mosquitto_address(SITE), device, password, BRIDGE_CLIENT_ID, clean_start=False,
                              timeout=5)
            connects += 1
            codes[hexed(session.connack)] += 1
            if refuses(session.connack):
                refused += 1
            elif session.session_present:
                present += 1
            time.sleep(hold_s)
            received += session.received
            session.close()
        saw.update(connects=connects, session_present=present, refused=refused, connacks=dict(codes),
                   received=received)

    return _run(hosts, "session-takeover", abuse, honest=honest, rate=rate, lead_s=10, tail_s=10)


def poison_user_properties(hosts: list[lab.LabHost], seconds: float = 60.0, properties: int = 17,
                           size: int = 60_000, resends: int = 15, honest: int = 2, rate: float = RATE) -> Outcome:
    """The abuser publishes one QoS 1 reading (of a sensor registered to it) with `properties` MQTT v5 user
    properties of `size` characters each (about 1 MB), in a new connection each time, `resends` times a second
    apart (as a device resends what was not acknowledged); the honest devices go on for `seconds`. If the site no
    longer ingests afterwards, the bridge's session is cleared and the bridge restarted (reset_bridge_session),
    so the lab is usable again (noted). saw: connacks and answers (PUBACK code, or how the connection closed),
    each -> count."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    def abuse(lb: chaos.Lab, run: str, saw: dict) -> None:
        device, password = _abuser()
        sensor = f"{device}-poison-{run}"
        lab.register_sensors(SITE, device, [sensor], bootstrap=lb.bootstrap(SITE))
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = [(f"p{k}", "x" * size) for k in range(properties)]
        reading = READING.format(ms=int(time.time() * 1000))
        answers: Counter = Counter()
        connacks: Counter = Counter()
        # As a device firmware would: the reading is not acknowledged, so it connects again and resends it.
        for _ in range(resends):
            session = Session(lb.mosquitto_address(SITE), device, password, device)
            connacks[hexed(session.connack)] += 1
            answers[session.answer(session.publish(_topic(device, sensor), reading, properties=props,
                                                   timeout=15))] += 1
            session.close()
            time.sleep(1)
        saw.update(connacks=dict(connacks), answers=dict(answers), bytes=properties * size)

    outcome = _run(hosts, "poison-user-properties", abuse, honest=honest, rate=rate, lead_s=5, tail_s=seconds)
    if outcome.ingesting_s is None:
        reset_bridge_session(hosts)
        outcome.notes.append(f"site-a no longer ingested: the bridge's session was cleared and the bridge restarted "
                             f"(a fresh reading then took {alive(chaos.Lab(hosts))}s)")
    return outcome


def retained_flood(hosts: list[lab.LabHost], messages: int = 300, size: int = 1_000_000, watch_s: float = 30.0,
                   limit_s: float = 240.0, honest: int = 2, rate: float = RATE) -> Outcome:
    """The abuser publishes `messages` retained QoS 1 readings of `size` bytes, each under its own sensor of its own
    topic (reconnecting whenever the connection drops, for limit_s at most), then the honest devices go on for
    watch_s. Afterwards every retained message Mosquitto accepted is cleared again (an empty retained
    message), so the lab does not keep them. saw: sent, answers (PUBACK code or what came instead -> count),
    accepted, connects; Outcome.restarts and exits tell whether Mosquitto died."""
    state: dict[str, object] = {}

    def abuse(lb: chaos.Lab, run: str, saw: dict) -> None:
        device, password = _abuser()
        padding = "x" * (size - len(READING.format(ms=0)) - 12)
        answers: Counter = Counter()
        accepted: list[str] = []
        state["accepted"] = accepted
        session: Session | None = None
        connects = sent = 0
        deadline = time.monotonic() + limit_s
        try:
            for n in range(messages):
                topic = _topic(device, f"{device}-retained-{run}-{n}")
                while time.monotonic() < deadline and (session is None or not session.up):
                    if session is not None:
                        session.close()
                        time.sleep(1)
                    session = Session(lb.mosquitto_address(SITE), device, password, device, timeout=10)
                    connects += 1
                if session is None or not session.up or time.monotonic() >= deadline:
                    break
                payload = json.dumps({"timestamp": int(time.time() * 1000), "temperature": 21.5, "unit": "C",
                                      "padding": padding})
                code = session.publish(topic, payload, retain=True, timeout=30)
                sent += 1
                answers[session.answer(code)] += 1
                if code is not None and code < 0x80:
                    accepted.append(topic)
        finally:
            if session is not None:
                session.close()
            saw.update(sent=sent, answers=dict(answers), accepted=len(accepted), connects=connects)
        time.sleep(watch_s)

    try:
        return _run(hosts, "retained-flood", abuse, honest=honest, rate=rate, lead_s=10, tail_s=0)
    finally:
        _clear_retained(chaos.Lab(hosts), list(state.get("accepted") or []))


def _clear_retained(lb: chaos.Lab, topics: list[str], limit_s: float = 300.0) -> None:
    """An empty retained message on each topic: Mosquitto forgets what it retained there."""
    if not topics:
        return
    device, password = _abuser()
    todo = list(topics)
    deadline = time.monotonic() + limit_s
    while todo and time.monotonic() < deadline:
        session = Session(lb.mosquitto_address(SITE), device, password, device, timeout=10)
        while todo and session.up:
            if session.publish(todo[0], b"", retain=True, timeout=15) is None:
                break
            todo.pop(0)
        session.close()
        if todo:
            time.sleep(5)
    log("abuse", f"cleared {len(topics) - len(todo)} of {len(topics)} retained messages"
        + (f"; {len(todo)} left (Mosquitto did not take them)" if todo else ""))


def bridge_login_on_device_port(hosts: list[lab.LabHost], read_s: float = 8.0, honest: int = 2,
                                rate: float = 50.0) -> Outcome:
    """The bridge's MQTT login (user bridge, lab.secret("bridge")) on the device port 8883, with a client id of its
    own (not the bridge's: that would kick the bridge); if accepted, it subscribes to every site's readings
    for read_s. saw: connack, suback, read (readings it received)."""
    def abuse(lb: chaos.Lab, _run: str, saw: dict) -> None:
        session = Session(lb.mosquitto_address(SITE), "bridge", lab.secret("bridge"), "abuse-bridge-login")
        saw.update(connack=session.connack if session.connack is not None else session.closed)
        if session.up:
            saw["suback"] = session.subscribe(names.MQTT_READINGS.format(site="+", device_id="+", sensor_id="+"))
            time.sleep(read_s)
            saw["read"] = session.received
        session.close()

    return _run(hosts, "bridge-login-on-device-port", abuse, honest=honest, rate=rate, lead_s=3, tail_s=3)


# Run inside the bridge's container on site-a's overlay: a device login on Mosquitto's services listener.
OVERLAY_PROBE = """
import json, os, threading, time
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
out, answered = {"connack": None, "suback": None, "received": 0}, threading.Event()
c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="abuse-overlay-probe", protocol=mqtt.MQTTv5,
                reconnect_on_failure=False)
c.username_pw_set(os.environ["ABUSE_USER"], os.environ["ABUSE_PASSWORD"])
def on_connect(cl, u, f, rc, p):
    out["connack"] = rc.value
    if rc.value == 0:
        cl.subscribe("#", qos=1)
    else:
        answered.set()
def on_subscribe(cl, u, mid, rcs, p):
    out["suback"] = [r.value for r in rcs]
    answered.set()
def on_message(cl, u, m):
    out["received"] += 1
def on_disconnect(cl, u, f, rc, p):
    if not out.get("leaving"):
        out["closed"] = rc.value
    answered.set()
c.on_connect, c.on_subscribe, c.on_message, c.on_disconnect = on_connect, on_subscribe, on_message, on_disconnect
if os.environ.get("BRIDGE_MQTT_CA_FILE"):       # the services listener takes TLS only, as the bridge uses it
    c.tls_set(ca_certs=os.environ["BRIDGE_MQTT_CA_FILE"])
try:
    c.connect(os.environ.get("BRIDGE_MQTT_HOST", "mosquitto"), 1883, 10)
except OSError as err:
    out["closed"] = f"{type(err).__name__}: {err}"
else:
    c.loop_start()
    answered.wait(10)
    if out["suback"]:
        time.sleep(float(os.environ["ABUSE_READ_S"]))
    out["leaving"] = True
    c.disconnect()
    c.loop_stop()
    out.pop("leaving")
print(json.dumps(out))
"""


def device_login_on_overlay(hosts: list[lab.LabHost], read_s: float = 5.0, honest: int = 2,
                            rate: float = 50.0) -> Outcome:
    """The abuser's device login on Mosquitto's overlay listener (1883, TLS), from a container on site-a's overlay
    (the bridge's: docker exec on its host); if accepted, it subscribes to `#` for read_s.
    saw: connack (or closed), suback, received."""
    def abuse(lb: chaos.Lab, _run: str, saw: dict) -> None:
        device, password = _abuser()
        host, container = lb.container(SITE, "bridge")
        result = lab.host_exec(host, "docker", "exec", "-e", f"ABUSE_USER={device}", "-e",
                               f"ABUSE_PASSWORD={password}", "-e", f"ABUSE_READ_S={read_s}", container,
                               "python", "-c", OVERLAY_PROBE, check=False, timeout=60)
        lines = result.stdout.strip().splitlines()
        if result.returncode != 0 or not lines:
            raise RuntimeError(f"the overlay probe in {container[:12]} failed ({result.returncode}): "
                               f"{result.stderr.strip()[-500:]}")
        found = json.loads(lines[-1])
        saw.update(found if found.get("connack") is not None else {**found, "connack": None})

    return _run(hosts, "device-login-on-overlay", abuse, honest=honest, rate=rate, lead_s=3, tail_s=3)


def flood(hosts: list[lab.LabHost], seconds: float = 60.0, processes: int = 1, qos: int = 0, burst: int = 20_000,
          honest: int = 10, rate: float = RATE) -> Outcome:
    """The abuser publishes as fast as it can for `seconds`: `processes` mosquitto_pub processes (C, MQTT v5, at
    `qos`, 1000 in flight at QoS 1) each sending bursts of `burst` readings of a sensor registered to it, started
    again as soon as one ends (or the broker closes it); meanwhile `honest` devices publish at `rate` each. QoS 0
    by default: it reached more than QoS 1 in the lab (Mosquitto's CPU is the bound). The honest readings must
    all arrive, within LATENCY_LIMIT_S each.
    saw: bursts (completed), failed (bursts whose connection ended early), offered (readings handed to
    mosquitto_pub), completed_per_s, abuser_stored (its readings in temperature-data by the end of the count)."""
    state: dict[str, str] = {}

    def abuse(lb: chaos.Lab, run: str, saw: dict) -> None:
        device, password = _abuser()
        sensor = state["sensor"] = f"{device}-flood-{run}"
        lab.register_sensors(SITE, device, [sensor], bootstrap=lb.bootstrap(SITE))
        ms = int(time.time() * 1000)
        lines = "".join(READING.format(ms=ms + i) + "\n" for i in range(burst))
        cmd = ["mosquitto_pub", "-h", lb.mosquitto_address(SITE), "-p", "8883",
               "--cafile", str(lab.pki_dir() / "ca.crt"),
               "-u", device, "-P", password, "-i", device, "-V", "mqttv5", "-q", str(qos), "-M", "1000", "-l",
               "-t", _topic(device, sensor)]
        results: Counter = Counter()
        errors: Counter = Counter()
        deadline = time.monotonic() + seconds
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "burst"
            source.write_text(lines)

            def publisher() -> None:
                while time.monotonic() < deadline:
                    with source.open() as stdin:
                        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                                text=True)
                        try:
                            _out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
                        except subprocess.TimeoutExpired:
                            proc.kill()
                            proc.communicate()
                            results["cut at the end"] += 1
                            return
                    results["completed" if proc.returncode == 0 else "failed"] += 1
                    if proc.returncode:
                        errors[(err.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:80]] += 1
                        time.sleep(0.2)

            threads = [threading.Thread(target=publisher, daemon=True) for _ in range(processes)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        saw.update(bursts=results["completed"], failed=results["failed"],
                   offered=burst * sum(results.values()), completed_per_s=round(results["completed"] * burst / seconds),
                   errors=dict(errors.most_common(3)))

    return _run(hosts, "flood", abuse, honest=honest, rate=rate, lead_s=10, tail_s=10,
                extra=lambda run: {f"{lab.abuser_device(SITE)}-flood-{run}"})


# ---------------------------------------------------------------- repair

# Run inside the bridge's container: the bridge's own login takes its client id with clean start, which
# discards the session Mosquitto keeps for it (and what it holds), then leaves.
RESET_SESSION = """
import os, threading
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
done = threading.Event()
c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=os.environ["BRIDGE_CLIENT_ID"], protocol=mqtt.MQTTv5,
                reconnect_on_failure=False)
password = open(os.environ.get("MQTT_PASSWORD_FILE", "/run/secrets/mqtt_password")).read().strip()
c.username_pw_set(os.environ.get("BRIDGE_MQTT_USERNAME", "bridge"), password)
c.on_connect = lambda cl, u, f, rc, p: (print("CONNACK", rc.value, "session present", f.session_present),
                                        done.set())
if os.environ.get("BRIDGE_MQTT_CA_FILE"):       # the services listener takes TLS only, as the bridge uses it
    c.tls_set(ca_certs=os.environ["BRIDGE_MQTT_CA_FILE"])
c.connect(os.environ.get("BRIDGE_MQTT_HOST", "mosquitto"), 1883, 10, clean_start=True)
c.loop_start()
done.wait(10)
c.disconnect()
c.loop_stop()
"""


def reset_bridge_session(hosts: list[lab.LabHost]) -> None:
    """Lab repair after a case that stalled the bridge for good (the poison case before issue 26's fix): clear the
    bridge's session in Mosquitto (what it held is lost), then restart the bridge."""
    lb = chaos.Lab(hosts)
    host, container = lb.container(SITE, "bridge")
    result = lab.host_exec(host, "docker", "exec", container, "python", "-c", RESET_SESSION, check=False, timeout=60)
    log("abuse", f"cleared the bridge's session: {(result.stdout + result.stderr).strip()[-300:]}")
    lb.restart(SITE, "bridge")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not _another_bridge(lb, container):
        time.sleep(5)


def _another_bridge(lb: chaos.Lab, old_container: str) -> bool:
    """A bridge container other than `old_container` runs."""
    try:
        _host, container = lb.container(SITE, "bridge")
    except RuntimeError:
        return False
    return container != old_container


# ---------------------------------------------------------------- the suite

CASES: dict[str, Callable[[list[lab.LabHost]], Outcome]] = {
    "subscribe-thief": subscribe_thief,
    "session-takeover": session_takeover,
    "poison-user-properties": poison_user_properties,
    "retained-flood": retained_flood,
    "bridge-login-on-device-port": bridge_login_on_device_port,
    "device-login-on-overlay": device_login_on_overlay,
    "flood": flood,
}

COLUMNS = ("case", "devices", "acknowledged", "stored", "lost", "not_routed", "latency_max_s", "ingesting_s",
           "restarts", "alerted", "seconds")


def table(outcomes: list[Outcome]) -> str:
    """The outcomes for people: one line each, what the abuser saw and the notes last."""
    def cell(o: Outcome, column: str) -> str:
        value = getattr(o, column)
        if column == "restarts":
            return ",".join(f"{k}={v}" for k, v in value.items()) or "-"
        if column == "alerted":
            return ", ".join(f"{k.split('{', 1)[0]}:{_offence(k)} +{d:.0f}s" if _offence(k) else f"{k} +{d:.0f}s"
                             for k, d in sorted(value.items(), key=lambda i: i[1])) or "none"
        return "-" if value is None else str(value)

    def saw(o: Outcome) -> str:
        parts = [f"{k}={hexed(v) if k in ('connack', 'suback') else v}" for k, v in o.saw.items()]
        return "; ".join(parts + o.exits + o.notes)

    rows = [[cell(o, c) for c in COLUMNS] + [saw(o)] for o in outcomes]
    header = [*COLUMNS, "abuser saw; notes"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)
