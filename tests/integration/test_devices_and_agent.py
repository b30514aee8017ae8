"""iot-devices and mosquitto-agent between a real Kafka and the real Mosquitto with the iot_gate plugin: a
device written to `device-credentials` logs in over TLS within seconds; rotate, disable and remove shut it
out and kick its session; 2,000 imported devices all get in; the inventory sync is idempotent; one broken
record shuts out its own device only; an agent started late sends the whole table.

The agent runs as a program of this checkout (python -m services.mosquitto_agent.app) on the host,
against Mosquitto's services listener and Kafka's EXTERNAL listener (plain on this test cluster), as the
stack runs it on the overlay. Timings are printed (pytest -s) and kept in the test's properties.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from confluent_kafka import Producer
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from services.common import names
from tooling.testbed.docker_lab import docker, wait_until
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster
from tooling.testbed.mosquitto import BRIDGE_USER, start_site_mosquitto
from tooling.testbed.mosquitto_agent import AgentProcess

REPO = Path(__file__).resolve().parents[2]
SITE = "site-a"
BRIDGE_PASSWORD, AGENT_PASSWORD = "bridge-secret-for-tests", "agent-secret-for-tests"
NOT_AUTHORIZED = 0x87
SYNC_S = 10          # how long a change may take from the CLI's exit to the plugin
MEMORY_LIMIT = int(256 * 2**20 * 0.85)
# The agent's default (stats answers every 10 s).
STATS_S = 10


# ------------------------------------------------------------------ the site

@pytest.fixture(scope="module")
def site(request, lab, tmp_path_factory):
    work = tmp_path_factory.mktemp("devices-and-agent")
    # The role's vars/main.yml derives memory_limit from the container's memory (256m here: 85 %).
    broker = start_site_mosquitto(lab, work / "mosquitto", {}, SITE, BRIDGE_PASSWORD, AGENT_PASSWORD,
                                  **{"__stack_mqtt_memory_limit": MEMORY_LIMIT})
    cluster = start_kafka_cluster(lab)
    create_topics(cluster, names.DEVICE_CREDENTIALS, partitions=3, config={"cleanup.policy": "compact"})
    agent = AgentProcess(work, broker, cluster.external, AGENT_PASSWORD, stats_s=STATS_S, memory_limit=MEMORY_LIMIT)
    agent.start()
    salt_key = work / "password-salt.key"
    salt_key.write_text("s" * 48 + "\n")
    yield {"broker": broker, "bootstrap": cluster.external, "agent": agent, "lab": lab, "salt_key": salt_key,
           "work": work}
    agent.stop()
    if getattr(request.node, "_failed", False):        # set by tests/integration/conftest.py
        print("----- mosquitto-agent -----\n" + agent.tail())
        state = docker("inspect", "-f", "{{.State.Status}} exit={{.State.ExitCode}} oom={{.State.OOMKilled}}",
                       f"{lab.network}-mosquitto", check=False)
        cpu = docker("stats", "--no-stream", "--format", "{{.CPUPerc}}", f"{lab.network}-mosquitto", check=False)
        print(f"----- mosquitto's container: {state.stdout.strip()} cpu={cpu.stdout.strip()} -----")
        where = lab.exec("mosquitto", "sh", "-c", "for p in /proc/[0-9]*; do echo $p $(cat $p/comm) "
                         "wchan=$(cat $p/wchan) syscall=$(cat $p/syscall) fds=$(ls $p/fd | wc -l); done; "
                         "grep -E '^ *[0-9]+: [0-9A-F]+:(075B|22B3) 00000000:0000 0A' /proc/net/tcp")
        print(where.stdout + where.stderr)
        lab.stop("mosquitto")            # Mosquitto writes its log to a pipe in blocks: stopped, it has all of it
        gate = [line for line in lab.logs("mosquitto", 5000).splitlines()
                if "iot_gate" in line or "memory" in line or "administrative" in line or "agent" in line]
        print("----- mosquitto: the plugin's and the agent's lines -----\n" + "\n".join(gate[-80:]))


def iot_devices(site: dict, *args: str, stdin: str | None = None, check: bool = True) -> list[dict]:
    """iot-devices as an operator runs it; its JSON lines (stdout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "DEVICES_"))}
    result = subprocess.run([sys.executable, "-m", "services.commands.devices", "--bootstrap", site["bootstrap"],
                             "--site", SITE, *args], input=stdin, capture_output=True, text=True, cwd=REPO,
                            env={**env, "PYTHONPATH": str(REPO)}, timeout=300)
    if check:
        assert result.returncode == 0, f"iot-devices {' '.join(args)}: {result.returncode}\n{result.stderr}"
    return [json.loads(line) for line in result.stdout.splitlines()] if result.returncode == 0 else \
        [{"returncode": result.returncode, "stderr": result.stderr}]


# ------------------------------------------------------------------ device side

class Device:
    """One device connection over TLS (MQTT v5): its CONNACK, PUBACKs and whether it was disconnected."""

    def __init__(self, site: dict, device: str, password: str | None, client_id: str | None = None):
        self.connack: int | None = None
        self.acks: dict[int, int] = {}
        self.disconnected = threading.Event()
        self.changed = threading.Condition()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id or device,
                                  protocol=MQTTProtocolVersion.MQTTv5)
        self.client.username_pw_set(device, password)
        self.client.tls_set(ca_certs=str(site["broker"]["ca"]))
        self.client.reconnect_delay_set(60, 60)       # one connection: the test sees what happened to it
        self.client.on_connect = lambda _c, _u, _f, rc, _p: self._set(lambda: setattr(self, "connack", rc.value))
        self.client.on_disconnect = lambda *_: self._set(self.disconnected.set)
        self.client.on_publish = lambda _c, _u, mid, rc, _p: self._set(
            lambda: self.acks.__setitem__(mid, getattr(rc, "value", rc)))
        self.client.connect("127.0.0.1", site["broker"]["tls"], keepalive=10)
        self.client.loop_start()

    def _set(self, change) -> None:
        with self.changed:
            change()
            self.changed.notify_all()

    def answer(self, timeout: float = 10) -> int | None:
        """The CONNACK's reason code; None when the broker closed the connection without one."""
        with self.changed:
            self.changed.wait_for(lambda: self.connack is not None or self.disconnected.is_set(), timeout)
        return self.connack

    def publish(self, topic: str, payload: bytes) -> int | None:
        info = self.client.publish(topic, payload, qos=1)
        with self.changed:
            self.changed.wait_for(lambda: info.mid in self.acks or self.disconnected.is_set(), 10)
        return self.acks.get(info.mid)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def login(site: dict, device: str, password: str | None) -> int | None:
    """CONNACK reason code of one login (0: in), None when the connection closed without one. A TLS
    handshake cut short (seen on a loaded test host) is no answer about the login: tried again."""
    for attempt in range(3):
        try:
            session = Device(site, device, password)
        except OSError:                  # ssl.SSLError included
            if attempt == 2:
                raise
            time.sleep(0.5)
            continue
        try:
            return session.answer()
        finally:
            session.close()
    return None


def wait_login(site: dict, device: str, password: str, expected: int, timeout: float = SYNC_S) -> float:
    """Seconds until a login gets `expected` (0: accepted, NOT_AUTHORIZED: refused)."""
    started = time.monotonic()
    wait_until(f"{device} login answered {expected}", lambda: login(site, device, password) == expected,
               timeout=timeout, interval=0.2, on_timeout=site["agent"].tail)
    return time.monotonic() - started


def readings(device: str) -> str:
    return names.MQTT_READINGS.format(site=SITE, device_id=device, sensor_id="t1")


@pytest.fixture
def bridge(site):
    """The bridge's login on the services listener, reading every device's readings."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bridge-test", protocol=MQTTProtocolVersion.MQTTv5)
    client.username_pw_set(BRIDGE_USER, BRIDGE_PASSWORD)
    received: list[tuple[str, bytes]] = []
    subscribed = threading.Event()
    client.on_connect = lambda c, *_: c.subscribe(readings("+").replace("/t1/", "/+/"), qos=1)
    client.on_subscribe = lambda *_: subscribed.set()
    client.on_message = lambda _c, _u, msg: received.append((msg.topic, msg.payload))
    client.tls_set(ca_certs=str(site["broker"]["ca"]))
    client.connect("127.0.0.1", site["broker"]["services"], keepalive=10, clean_start=True)
    client.loop_start()
    assert subscribed.wait(10), "the bridge login did not get its SUBACK"
    yield received
    client.disconnect()
    client.loop_stop()


# ------------------------------------------------------------------ tests

def test_an_added_device_logs_in_over_tls_within_seconds_and_publishes_its_readings(site, bridge, record_property):
    started = time.monotonic()
    [credential] = iot_devices(site, "add", "site-a-press-1")
    cli_s = time.monotonic() - started
    assert credential["username"] == "site-a-press-1" and credential["site"] == SITE
    waited = wait_login(site, "site-a-press-1", credential["password"], 0)
    device = Device(site, "site-a-press-1", credential["password"])
    try:
        assert device.answer() == 0
        assert device.publish(readings("site-a-press-1"), b'{"temperature": 21.5}') == 0
        wait_until("the reading at the bridge", lambda: (readings("site-a-press-1"), b'{"temperature": 21.5}')
                   in bridge, timeout=10)
        assert device.publish(readings("site-a-press-2"), b'{"temperature": 99}') == NOT_AUTHORIZED
    finally:
        device.close()
    print(f"\nadd: iot-devices took {cli_s:.2f} s, the device was let in {waited:.2f} s after it returned")
    record_property("add_cli_s", round(cli_s, 2))
    record_property("add_to_login_s", round(waited, 2))


def test_an_existing_device_cannot_be_added_again(site):
    iot_devices(site, "add", "site-a-twice-1")
    [failure] = iot_devices(site, "add", "site-a-twice-1", check=False)
    assert failure["returncode"] == 1 and "rotate" in failure["stderr"]


def test_rotate_refuses_the_old_password_and_kicks_the_connected_session(site):
    [old] = iot_devices(site, "add", "site-a-rotor-1")
    wait_login(site, "site-a-rotor-1", old["password"], 0)
    session = Device(site, "site-a-rotor-1", old["password"])
    try:
        assert session.answer() == 0
        [new] = iot_devices(site, "rotate", "site-a-rotor-1")
        assert new["password"] != old["password"]
        assert session.disconnected.wait(SYNC_S), "the session of the old password was not kicked"
    finally:
        session.close()
    assert login(site, "site-a-rotor-1", old["password"]) == NOT_AUTHORIZED
    assert login(site, "site-a-rotor-1", new["password"]) == 0


def test_disable_refuses_and_kicks_and_enable_lets_it_in_again(site):
    [credential] = iot_devices(site, "add", "site-a-sleeper-1")
    wait_login(site, "site-a-sleeper-1", credential["password"], 0)
    session = Device(site, "site-a-sleeper-1", credential["password"])
    try:
        assert session.answer() == 0
        assert iot_devices(site, "disable", "site-a-sleeper-1") == \
            [{"device": "site-a-sleeper-1", "enabled": False, "changed": True}]
        assert session.disconnected.wait(SYNC_S), "the disabled device's session was not kicked"
    finally:
        session.close()
    assert login(site, "site-a-sleeper-1", credential["password"]) == NOT_AUTHORIZED
    listed = {d["device"]: d for d in iot_devices(site, "list", "--all")}
    assert listed["site-a-sleeper-1"]["enabled"] is False
    assert "site-a-sleeper-1" not in {d["device"] for d in iot_devices(site, "list")}
    iot_devices(site, "enable", "site-a-sleeper-1")
    wait_login(site, "site-a-sleeper-1", credential["password"], 0)


def test_remove_refuses_the_device_and_unknown_ids_are_refused(site):
    [credential] = iot_devices(site, "add", "site-a-leaver-1")
    wait_login(site, "site-a-leaver-1", credential["password"], 0)
    session = Device(site, "site-a-leaver-1", credential["password"])
    try:
        assert session.answer() == 0
        assert iot_devices(site, "remove", "site-a-leaver-1") == [{"device": "site-a-leaver-1", "removed": True}]
        assert session.disconnected.wait(SYNC_S), "the removed device's session was not kicked"
    finally:
        session.close()
    assert login(site, "site-a-leaver-1", credential["password"]) == NOT_AUTHORIZED
    for command in ("disable", "enable", "rotate", "remove"):
        [failure] = iot_devices(site, command, "site-a-leaver-1", check=False)
        assert failure["returncode"] == 1 and "not in the table" in failure["stderr"], (command, failure)


def test_an_import_of_2000_devices_lets_every_one_in(site, record_property):
    count = 2000
    ids = [f"site-a-bulk-{i:05d}" for i in range(count)]
    csv_text = "device_id,auth\n" + "\n".join(ids) + "\n"
    started = time.monotonic()
    credentials = iot_devices(site, "import", "-", stdin=csv_text)
    cli_s = time.monotonic() - started
    assert [c["device"] for c in credentials] == ids
    assert len({c["password"] for c in credentials}) == count
    # The agent sends the upserts in the order it read them: the last device in is the last one written.
    wait_login(site, ids[-1], credentials[-1]["password"], 0, timeout=120)
    plugin_s = time.monotonic() - started
    wait_until("the plugin acknowledging every change", lambda: site["agent"].metrics().get(
        "mosquitto_agent_sync_age_seconds") == 0, timeout=30, on_timeout=site["agent"].tail)
    for credential in [credentials[0], *random.sample(credentials[1:-1], 6)]:
        assert login(site, credential["device"], credential["password"]) == 0, credential["device"]
    wait_until(f"stats counting {count} more devices", lambda: site["agent"].metrics().get(
        "mosquitto_devices", 0) >= count, timeout=3 * STATS_S, on_timeout=site["agent"].tail)
    print(f"\nimport of {count}: iot-devices took {cli_s:.2f} s; the last device got in {plugin_s:.2f} s after "
          "the import started")
    record_property("import_cli_s", round(cli_s, 2))
    record_property("import_to_plugin_s", round(plugin_s, 2))


def test_inventory_sync_is_idempotent_and_leaves_cli_devices_alone(site):
    key = ["--salt-key-file", str(site["salt_key"])]
    [cli] = iot_devices(site, "add", "site-a-by-hand-1")
    inventory = {"site-a-inv-1": "inventory-password-one", "site-a-inv-2": "inventory-password-two",
                 "site-a-by-hand-1": "the-inventory-must-not-take-this"}
    first = iot_devices(site, "sync-inventory", *key, stdin=json.dumps(inventory))
    assert first == [{"added": ["site-a-inv-1", "site-a-inv-2"], "changed": [], "removed": [], "unchanged": 0}]
    second = iot_devices(site, "sync-inventory", *key, stdin=json.dumps(inventory))
    assert second == [{"added": [], "changed": [], "removed": [], "unchanged": 2}]
    wait_login(site, "site-a-inv-1", "inventory-password-one", 0)
    [refused] = iot_devices(site, "rotate", "site-a-inv-1", check=False)
    assert refused["returncode"] == 1 and "managed by the inventory" in refused["stderr"]
    changed = {"site-a-inv-2": "inventory-password-new"}
    assert iot_devices(site, "sync-inventory", *key, stdin=json.dumps(changed)) == \
        [{"added": [], "changed": ["site-a-inv-2"], "removed": ["site-a-inv-1"], "unchanged": 0}]
    wait_login(site, "site-a-inv-1", "inventory-password-one", NOT_AUTHORIZED)
    wait_login(site, "site-a-inv-2", "inventory-password-new", 0)
    assert login(site, "site-a-inv-2", "inventory-password-two") == NOT_AUTHORIZED
    assert login(site, "site-a-by-hand-1", cli["password"]) == 0


def test_one_broken_record_shuts_out_its_own_device_only(site):
    [victim] = iot_devices(site, "add", "site-a-broken-1")
    wait_login(site, "site-a-broken-1", victim["password"], 0)
    errors_before = site["agent"].metrics().get('mosquitto_agent_plugin_errors_total{command="upsert"}', 0)
    producer = Producer({"bootstrap.servers": site["bootstrap"]})
    producer.produce(names.DEVICE_CREDENTIALS, b'{"enabled": true, "auth": "password", "hash": "$7$1$x y"}',
                     b"site-a-broken-1")
    assert producer.flush(30) == 0
    wait_login(site, "site-a-broken-1", victim["password"], NOT_AUTHORIZED)        # fail closed
    [after] = iot_devices(site, "add", "site-a-after-broken-1")
    wait_login(site, "site-a-after-broken-1", after["password"], 0)
    assert site["agent"].metrics().get('mosquitto_agent_plugin_errors_total{command="upsert"}', 0) == errors_before
    assert "unreadable device record" in site["agent"].tail()


def _device_ca(directory: Path) -> tuple[str, str]:
    """A device CA's certificate and key files (PEM), as the pki role keeps them on the controller."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "site-a device CA")])
    now = dt.datetime.now(dt.UTC)
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    (directory / "device-ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "device-ca.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                                serialization.PrivateFormat.PKCS8,
                                                                serialization.NoEncryption()))
    return str(directory / "device-ca.crt"), str(directory / "device-ca.key")


def test_certificate_devices_are_registered_without_a_password(site, tmp_path):
    [registered] = iot_devices(site, "add", "site-a-cam-1", "--certificate")
    assert registered == {"device": "site-a-cam-1", "username": "site-a-cam-1", "site": SITE}
    ca_cert, ca_key = _device_ca(tmp_path)
    [issued] = iot_devices(site, "add", "site-a-cam-2", "--certificate", "--ca-cert", ca_cert, "--ca-key", ca_key,
                           "--days", "30")
    assert "BEGIN CERTIFICATE" in issued["certificate"] and "PRIVATE KEY" in issued["key"]
    assert "password" not in issued
    listed = {d["device"]: d for d in iot_devices(site, "list")}
    assert listed["site-a-cam-1"]["auth"] == listed["site-a-cam-2"]["auth"] == "certificate"
    wait_until("the plugin acknowledging the certificate devices", lambda: site["agent"].metrics().get(
        "mosquitto_agent_sync_age_seconds") == 0, timeout=SYNC_S)
    assert login(site, "site-a-cam-1", "no-password-makes-a-certificate-device") == NOT_AUTHORIZED
    [refused] = iot_devices(site, "rotate", "site-a-cam-1", check=False)
    assert refused["returncode"] == 1 and "certificate" in refused["stderr"]


def test_the_agent_exports_mosquittos_figures(site):
    [counted] = iot_devices(site, "add", "site-a-counted-1")
    # A sync age of 0 read before the agent has even seen the add is stale (a CI run on a slow machine got
    # the new device refused, 135, after it): the device's own login shows the change arrived.
    wait_login(site, "site-a-counted-1", counted["password"], 0)
    wait_until("stats after the change", lambda: site["agent"].metrics().get("mosquitto_agent_sync_age_seconds")
               == 0, timeout=SYNC_S)
    figures = site["agent"].metrics()
    assert figures["mosquitto_up"] == 1 and figures["mosquitto_gate_open"] == 1
    assert figures["mosquitto_devices"] >= 1
    assert figures["mosquitto_agent_devices_synced"] == 0       # the snapshot at start: the table was empty
    assert figures["mosquitto_memory_limit_bytes"] == MEMORY_LIMIT
    assert figures["mosquitto_max_queued_messages"] == 300000
    assert figures["mosquitto_gate_auth_refused_total"] >= 1          # the refused logins of the tests before
    # Mosquitto publishes a $SYS value when it changed at a tick (sys_interval, 10 s) and, with retain_available
    # false, keeps none for a new subscriber: a device held connected over a tick changes clients/connected.
    session = Device(site, "site-a-counted-1", counted["password"])
    try:
        assert session.answer() == 0
        wait_until("$SYS figures", lambda: "mosquitto_clients_connected" in site["agent"].metrics(), timeout=30,
                   on_timeout=lambda: f"{sorted(site['agent'].metrics())}\n{site['agent'].tail()}")
    finally:
        session.close()
    figures = site["agent"].metrics()
    for name in ("mosquitto_uptime_seconds", "mosquitto_clients_connected", "mosquitto_messages_received_total",
                 "mosquitto_messages_sent_total", "mosquitto_heap_bytes"):
        assert name in figures, f"{name} not exported: {sorted(figures)}"
    print(f"\nMosquitto's heap: {figures['mosquitto_heap_bytes']:.0f} bytes of its memory_limit {MEMORY_LIMIT}")
    # The old password tried after the rotation (test_rotate_...) is named as that device's offence.
    offence = 'mosquitto_gate_offences_total{login="site-a-rotor-1",offence="wrong_password"}'
    assert figures.get(offence, 0) >= 1, sorted(k for k in figures if "offences" in k)


def test_an_agent_started_after_changes_sends_the_whole_table(site):
    agent = site["agent"]
    agent.stop()
    try:
        [late] = iot_devices(site, "add", "site-a-while-away-1")
        assert login(site, "site-a-while-away-1", late["password"]) == NOT_AUTHORIZED
    finally:
        agent.start()
    wait_login(site, "site-a-while-away-1", late["password"], 0)
    assert agent.health()[0] == 200


def test_devices_connected_is_known_right_after_the_agent_restarts(site):
    """The plugin counts the device connections it let in: a refused login of the same device does not lower
    the count, and an agent restarted while nothing changes knows it at its first stats answer ($SYS's
    clients/connected would reach it only at the next connect or disconnect)."""
    agent = site["agent"]
    connected = "mosquitto_devices_connected"

    def figure() -> float | None:
        return agent.metrics().get(connected)

    wait_until(connected, lambda: figure() is not None, timeout=3 * STATS_S, on_timeout=agent.tail)
    before = figure()
    [held] = iot_devices(site, "add", "site-a-held-1")
    wait_login(site, "site-a-held-1", held["password"], 0)
    session = Device(site, "site-a-held-1", held["password"])
    try:
        assert session.answer() == 0
        wait_until(f"{connected} = {before + 1}", lambda: figure() == before + 1, timeout=3 * STATS_S,
                   on_timeout=lambda: f"{connected}={figure()}\n{agent.tail()}")
        refused = agent.metrics()["mosquitto_gate_auth_refused_total"]
        assert login(site, "site-a-held-1", "not-its-password") == NOT_AUTHORIZED
        wait_until("the refusal in a stats answer",
                   lambda: agent.metrics()["mosquitto_gate_auth_refused_total"] > refused, timeout=3 * STATS_S)
        assert figure() == before + 1, "a refused login of a connected device lowered the count"
        agent.stop()
        agent.start()
        started = time.monotonic()
        wait_until(f"{connected} after the restart", lambda: figure() is not None, timeout=3 * STATS_S,
                   on_timeout=agent.tail)
        print(f"\n{connected} known {time.monotonic() - started:.1f} s after the agent started: {figure():.0f}")
        assert figure() == before + 1
    finally:
        session.close()
    wait_until(f"{connected} = {before}", lambda: figure() == before, timeout=3 * STATS_S,
               on_timeout=lambda: f"{connected}={figure()}\n{agent.tail()}")
