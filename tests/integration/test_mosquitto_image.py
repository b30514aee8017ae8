"""The mosquitto image with the iot_gate plugin, configured as a site runs it
(ansible/roles/stack/templates/mosquitto.conf.j2), tried from the attacker's side: every login is bound
to its listener, its client id and its topics; what one device can cost is bounded; devices wait after a
start until the bridge has subscribed. docs/security.md ("What a device login can do") names these tests."""
from __future__ import annotations

import ssl
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from services.commands.devices import hash_password
from services.common import names
from tooling.testbed.docker_lab import docker, wait_until
from tooling.testbed.mosquitto import AGENT_USER, BRIDGE_USER, bridge_login, open_device_gate, start_site_mosquitto
from tooling.testbed.windowed_client import WindowedClient

SITE = "site-a"
DEVICE, OTHER_DEVICE, FLOODER = "site-a-press-1", "site-a-press-2", "site-a-flood-1"
BACKLOGGED = "site-a-backlog-1"
PASSWORDS = {DEVICE: "press-1-secret-for-tests", OTHER_DEVICE: "press-2-secret-tests",
             FLOODER: "flood-secret-for-tests", BACKLOGGED: "backlog-secret-for-tests"}
BRIDGE_PASSWORD, AGENT_PASSWORD = "bridge-secret-for-tests", "agent-secret-for-tests"
RATE, BURST = 50, 100            # readings/s per device in this broker, to flood it quickly


@pytest.fixture(scope="module")
def broker(lab, tmp_path_factory):
    return start_site_mosquitto(lab, tmp_path_factory.mktemp("mosquitto"), PASSWORDS, SITE, BRIDGE_PASSWORD,
                                AGENT_PASSWORD, stack_mqtt_device_max_rate=RATE, stack_mqtt_device_burst=BURST)


def _client(client_id: str, username: str | None, password: str | None, ca: Path | None,
            protocol=MQTTProtocolVersion.MQTTv5) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    if username:
        client.username_pw_set(username, password)
    if ca:
        client.tls_set(ca_certs=str(ca))
    return client


class Session:
    """A client that records its CONNACK, SUBACKs, PUBACKs, messages and disconnection."""

    def __init__(self, broker: dict, username: str | None, password: str | None = None, port_kind: str = "tls",
                 client_id: str | None = None, clean_start: bool = True,
                 protocol=MQTTProtocolVersion.MQTTv5, host: str = "127.0.0.1", will: tuple | None = None):
        self.connack: tuple[int, bool] | None = None
        self.received: list[tuple[str, bytes]] = []
        self.acks: dict[int, int] = {}
        self.subacks: list[int] = []
        self.disconnected = False
        self.changed = threading.Condition()
        password = password if password is not None else PASSWORDS.get(username or "")
        # A device's client id is its device id (the plugin refuses another); services pick theirs.
        self.client = _client(client_id or username or "anonymous", username, password,
                              broker["ca"], protocol)          # both listeners are TLS
        if will:
            self.client.will_set(*will)
        self.client.on_connect = lambda _c, _u, flags, rc, _p: self._set(
            "connack", (getattr(rc, "value", rc), bool(getattr(flags, "session_present", False))))
        self.client.on_disconnect = lambda *_: self._set("disconnected", True)
        self.client.on_message = lambda _c, _u, m: self._update(lambda: self.received.append((m.topic, m.payload)))
        self.client.on_publish = lambda _c, _u, mid, rc, _p: self._update(
            lambda: self.acks.__setitem__(mid, getattr(rc, "value", rc)))
        self.client.on_subscribe = lambda _c, _u, _m, rcs, _p: self._update(
            lambda: self.subacks.extend(getattr(r, "value", r) for r in rcs))
        self.client.reconnect_delay_set(60, 60)          # one connection: a test sees what happened to it
        kwargs = {"clean_start": clean_start} if protocol == MQTTProtocolVersion.MQTTv5 else {}
        if protocol != MQTTProtocolVersion.MQTTv5:
            self.client._clean_session = clean_start
        self.client.connect(host, broker[port_kind], keepalive=10, **kwargs)
        self.client.loop_start()

    def _update(self, change) -> None:
        with self.changed:
            change()
            self.changed.notify_all()

    def _set(self, name: str, value) -> None:
        self._update(lambda: setattr(self, name, value))

    def wait(self, what, timeout: float = 10) -> bool:
        with self.changed:
            return self.changed.wait_for(what, timeout)

    def connected(self, timeout: float = 10) -> tuple[int, bool] | None:
        """The CONNACK (reason, session present), or None when the broker closed without one."""
        self.wait(lambda: self.connack is not None or self.disconnected, timeout)
        return self.connack

    def subscribe(self, topic: str) -> int:
        before = len(self.subacks)
        self.client.subscribe(topic, qos=1)
        assert self.wait(lambda: len(self.subacks) > before), f"no SUBACK for {topic}"
        return self.subacks[-1]

    def publish(self, topic: str, payload: bytes, **kwargs) -> int | None:
        """QoS 1; the PUBACK's reason code, or None when the connection closed without one."""
        info = self.client.publish(topic, payload, qos=1, **kwargs)
        self.wait(lambda: info.mid in self.acks or self.disconnected)
        return self.acks.get(info.mid)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def bridge(broker):
    """A bridge replica as the stack runs it: its login on the services listener, its shared subscription."""
    session = Session(broker, BRIDGE_USER, BRIDGE_PASSWORD, "services", client_id="bridge-1")
    assert session.connected() == (0, False)
    assert session.subscribe("$share/bridge/" + names.MQTT_READINGS.format(site="+", device_id="+",
                                                                          sensor_id="+")) == 1
    yield session
    session.close()


def _reading(device: str, sensor: str = "t1", site: str = SITE) -> str:
    return names.MQTT_READINGS.format(site=site, device_id=device, sensor_id=sensor)


def _commands(device: str) -> str:
    return names.MQTT_COMMANDS.format(site=SITE, device_id=device)


# ------------------------------------------------------------------ who may log in where

@pytest.mark.parametrize("username, password", [(None, None), (DEVICE, "wrong-password"), ("nobody", "whatever")],
                         ids=["anonymous", "wrong-password", "unknown-user"])
@pytest.mark.parametrize("port_kind", ["tls", "services"])
def test_a_client_without_a_valid_login_is_refused(broker, port_kind, username, password):
    session = Session(broker, username, password, port_kind, client_id="bridge-9" if port_kind == "services" else None)
    try:
        assert session.connected() == (0x87, False)          # Not authorized
    finally:
        session.close()


def test_the_services_listener_takes_tls_only(broker):
    """The bridge's and the agent's logins and every reading they take cross the overlay inside TLS (issue
    30): the services listener (1883) answers no client in clear, and one over TLS gets in."""
    assert bridge_login(broker["services"], BRIDGE_PASSWORD) is None           # in clear: no CONNACK
    assert bridge_login(broker["services"], BRIDGE_PASSWORD, ca=broker["ca"]) == 0


def _offences(broker: dict, login: str) -> dict[str, int]:
    agent = Agent(broker)
    try:
        return agent.send("stats")["offences"].get(login, {})
    finally:
        agent.close()


def test_a_device_login_is_refused_on_the_services_listener(broker):
    session = Session(broker, DEVICE, port_kind="services", client_id="bridge-7")
    try:
        assert session.connected() == (0x87, False)
    finally:
        session.close()
    assert _offences(broker, DEVICE).get("device_login_on_services_listener", 0) >= 1


def test_the_bridges_login_is_refused_on_the_device_listener(broker):
    """A leaked bridge password tried from the factory network: refused, and named."""
    session = Session(broker, BRIDGE_USER, BRIDGE_PASSWORD, "tls", client_id="bridge-7")
    try:
        assert session.connected() == (0x87, False)
    finally:
        session.close()
    assert _offences(broker, BRIDGE_USER).get("service_login_on_device_listener", 0) >= 1


@pytest.mark.parametrize("user, password, client_id", [(BRIDGE_USER, BRIDGE_PASSWORD, "site-a-press-1"),
                                                       (AGENT_USER, AGENT_PASSWORD, "bridge-1")],
                         ids=["bridge-as-a-device", "agent-as-the-bridge"])
def test_a_service_login_works_only_under_its_own_client_ids(broker, user, password, client_id):
    session = Session(broker, user, password, "services", client_id=client_id)
    try:
        assert session.connected() == (0x87, False)
    finally:
        session.close()


def test_the_tls_listener_refuses_plain_mqtt(broker):
    client = _client("plain-to-tls", DEVICE, PASSWORDS[DEVICE], None)
    answered = threading.Event()
    client.on_connect = lambda *_: answered.set()
    try:
        client.connect("127.0.0.1", broker["tls"], keepalive=5)
        client.loop_start()
        assert not answered.wait(5), "a plain MQTT client got a CONNACK from the TLS listener"
    except OSError:
        pass                    # the broker closed the connection: refused as well
    finally:
        client.loop_stop()


def test_a_device_checks_the_brokers_name(broker):
    # The certificate names 127.0.0.1 and mosquitto; 'localhost' resolves to the broker but is not named.
    client = _client("c", DEVICE, PASSWORDS[DEVICE], broker["ca"])
    with pytest.raises(ssl.SSLCertVerificationError):
        client.connect("localhost", broker["tls"], keepalive=5)


# ------------------------------------------------------------------ sessions

def test_a_device_cannot_take_the_bridges_session(broker, bridge):
    """Its own valid login under client id bridge-1, clean start 0, again and again: refused every time, so
    the bridge's session is never resumed or kicked; each try is counted against the device."""
    for _ in range(5):
        thief = Session(broker, DEVICE, client_id="bridge-1", clean_start=False)
        try:
            assert thief.connected() == (0x87, False)
        finally:
            thief.close()
    assert not bridge.disconnected
    own = _reading(DEVICE, "after-takeover")
    device = Session(broker, DEVICE)
    try:
        assert device.publish(own, b"{}") == 0
        assert bridge.wait(lambda: (own, b"{}") in bridge.received)
    finally:
        device.close()
    agent = Agent(broker)
    try:
        assert agent.send("stats")["offences"][DEVICE]["client_id_not_device_id"] >= 5
    finally:
        agent.close()


def test_a_device_cannot_take_another_devices_session(broker):
    victim = Session(broker, OTHER_DEVICE, clean_start=False)
    try:
        assert victim.connected()[0] == 0
        thief = Session(broker, DEVICE, client_id=OTHER_DEVICE, clean_start=False)
        try:
            assert thief.connected() == (0x87, False)
            time.sleep(1)
            assert not victim.disconnected
        finally:
            thief.close()
    finally:
        victim.close()


def test_a_second_connection_with_one_login_is_counted_against_the_device(broker):
    """Two clients with one device's login take each other's session over; the plugin names it."""
    first = Session(broker, OTHER_DEVICE)
    try:
        assert first.connected()[0] == 0
        second = Session(broker, OTHER_DEVICE)
        try:
            assert second.connected()[0] == 0
            assert first.wait(lambda: first.disconnected)           # taken over
        finally:
            second.close()
    finally:
        first.close()
    agent = Agent(broker)
    try:
        assert agent.send("stats")["offences"][OTHER_DEVICE]["duplicate_login"] >= 1
    finally:
        agent.close()


# ------------------------------------------------------------------ topics

def test_a_device_writes_its_own_readings_over_tls(broker, bridge):
    device = Session(broker, DEVICE)
    try:
        topic = _reading(DEVICE)
        assert device.publish(topic, b'{"temperature": 21.5}') == 0
        assert bridge.wait(lambda: (topic, b'{"temperature": 21.5}') in bridge.received)
    finally:
        device.close()


@pytest.mark.parametrize("topic", [_reading(OTHER_DEVICE), _reading(DEVICE, site="site-b"), _commands(DEVICE),
                                   "anything/else", "$CONTROL/iot-gate/v1"],
                         ids=["another-device", "another-site", "its-own-commands", "other-topic", "control"])
def test_a_device_cannot_write_anywhere_else(broker, bridge, topic):
    device = Session(broker, DEVICE)
    try:
        assert device.publish(topic, b'{"temperature": 99}') == 0x87         # Not authorized
        own = _reading(DEVICE, "marker")
        assert device.publish(own, b"{}") == 0
        assert bridge.wait(lambda: (own, b"{}") in bridge.received)            # what came after it arrived...
        assert (topic, b'{"temperature": 99}') not in bridge.received         # ...and it did not
    finally:
        device.close()


@pytest.mark.parametrize("topic", ["#", "$SYS/#", "$share/bridge/" + _reading("+", "+", "+"), _reading("+", "+"),
                                   _commands(OTHER_DEVICE), "sites/site-a/devices/+/commands",
                                   "$CONTROL/iot-gate/v1/response"],
                         ids=["everything", "sys", "the-bridges-shared-subscription", "every-reading",
                              "another-devices-commands", "every-devices-commands", "control-responses"])
def test_a_device_is_refused_any_subscription_but_its_own_commands(broker, topic):
    device = Session(broker, DEVICE)
    try:
        assert device.subscribe(topic) == 0x87
        assert device.subscribe(_commands(DEVICE)) == 1
    finally:
        device.close()
    agent = Agent(broker)
    try:
        assert agent.send("stats")["offences"][DEVICE]["subscribe_denied"] >= 1
    finally:
        agent.close()


def test_a_device_reads_only_its_own_commands(broker):
    device, bridge = Session(broker, DEVICE), Session(broker, BRIDGE_USER, BRIDGE_PASSWORD, "services",
                                                        client_id="bridge-2")
    try:
        own, other = _commands(DEVICE), _commands(OTHER_DEVICE)
        assert device.subscribe(own) == 1
        assert bridge.publish(other, other.encode()) == 0x10      # no subscriber: the device was refused it
        assert bridge.publish(own, own.encode()) == 0
        assert device.wait(lambda: any(t == own for t, _ in device.received))
        assert [t for t, _ in device.received if t != own] == []
    finally:
        device.close()
        bridge.close()


# ------------------------------------------------------------------ what one device can cost

def test_a_retained_message_closes_the_connection_unacknowledged(broker, bridge):
    device = Session(broker, DEVICE)
    try:
        assert device.publish(_reading(DEVICE, "retained"), b"x" * 1000, retain=True) is None
        assert device.wait(lambda: device.disconnected)
    finally:
        device.close()
    assert not bridge.disconnected                        # the broker is still there for everyone else


def test_a_retained_will_is_refused_at_connect(broker):
    session = Session(broker, DEVICE, will=(_reading(DEVICE, "will"), b"gone", 1, True))
    try:
        assert session.connected() == (0x9A, False)       # Retain not supported
    finally:
        session.close()


def test_a_packet_over_the_size_limit_closes_the_connection_unacknowledged(broker, bridge):
    """1 MB of MQTT v5 user properties (the issue's poison reading) never reaches the bridge or Kafka."""
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [(f"p{i}", "v" * 60_000) for i in range(17)]
    device = Session(broker, DEVICE)
    try:
        assert device.publish(_reading(DEVICE, "poison"), b"{}", properties=props) is None
        assert device.wait(lambda: device.disconnected)
    finally:
        device.close()
    after = Session(broker, OTHER_DEVICE)
    try:
        assert after.publish(_reading(OTHER_DEVICE, "after-poison"), b"{}") == 0
        assert bridge.wait(lambda: (_reading(OTHER_DEVICE, "after-poison"), b"{}") in bridge.received)
    finally:
        after.close()
    assert all(topic != _reading(DEVICE, "poison") for topic, _ in bridge.received)


@pytest.mark.parametrize("protocol", [MQTTProtocolVersion.MQTTv5, MQTTProtocolVersion.MQTTv311], ids=["v5", "3.1.1"])
def test_a_device_over_its_rate_is_disconnected_and_loses_nothing_acknowledged(broker, bridge, protocol):
    """Over `RATE`/s (burst `BURST`, then at most one more on credit for a second) the connection closes
    without PUBACK: every reading the broker did acknowledge reaches the bridge, for an MQTT 3.1.1 device too
    (a denial would be PUBACKed to it)."""
    # The bucket is the login's, not the connection's: the previous case left it a burst in debt; full again.
    time.sleep(2 * BURST / RATE + 0.5)
    device = Session(broker, FLOODER, protocol=protocol)
    try:
        assert device.connected()[0] == 0
        sent = {}
        for n in range(BURST * 3):
            payload = f'{{"n": {n}, "p": "{protocol}"}}'.encode()
            sent[device.client.publish(_reading(FLOODER, "flood"), payload, qos=1).mid] = payload
        assert device.wait(lambda: device.disconnected, 20), "the flooding device was never disconnected"
        acked = [payload for mid, payload in sent.items() if device.acks.get(mid) == 0]
        assert BURST // 2 <= len(acked) < len(sent)
        assert bridge.wait(lambda: all((_reading(FLOODER, "flood"), p) in bridge.received for p in acked), 20)
    finally:
        device.close()
    agent = Agent(broker)
    try:
        assert agent.send("stats")["offences"][FLOODER]["rate_limited"] >= 1
    finally:
        agent.close()


@pytest.mark.parametrize("protocol", [MQTTProtocolVersion.MQTTv5, MQTTProtocolVersion.MQTTv311], ids=["v5", "3.1.1"])
def test_a_device_whose_backlog_outgrows_its_burst_catches_up(broker, bridge, protocol):
    """A device back with ten bursts of readings, sending them 20 unacknowledged at a time: the gate takes
    what it may, lets the connection live on credit long enough for the PUBACKs due to arrive, then lets
    the login rest; the device gets every reading acknowledged at about its rate, sending few twice. Before
    (closed at the first reading over), it got none acknowledged and resent the first ones for ever."""
    backlog, window = 10 * BURST, 2 * BURST
    time.sleep(2 * BURST / RATE + 0.5)           # a full bucket: the previous case may have left it in debt
    received_before = len(bridge.received)
    device = WindowedClient(CallbackAPIVersion.VERSION2, client_id=BACKLOGGED, protocol=protocol)
    device.username_pw_set(BACKLOGGED, PASSWORDS[BACKLOGGED])
    device.tls_set(ca_certs=str(broker["ca"]))
    device.reconnect_delay_set(0.2, 2)
    device.max_inflight_messages_set(window)
    device.max_queued_messages_set(0)
    acked, done, connections = set(), threading.Condition(), []
    device.on_connect = lambda *_: connections.append(time.monotonic())

    def on_publish(_c, _u, mid, reason, _p):
        with done:
            if getattr(reason, "value", reason) < 0x80:
                acked.add(mid)
            done.notify_all()
    device.on_publish = on_publish
    topic = _reading(BACKLOGGED, "backlog")
    # Queued while offline, as after an outage; paho numbers them 1..backlog.
    mids = [device.publish(topic, f'{{"n": {n}}}'.encode(), qos=1).mid for n in range(backlog)]
    started = time.monotonic()
    device.connect_async("127.0.0.1", broker["tls"], keepalive=10)
    device.loop_start()
    try:
        # The first burst at once, then RATE/s: about (backlog - BURST) / RATE = 18 s; allowed three times that.
        limit = 3 * (backlog - BURST) / RATE
        with done:
            caught_up = done.wait_for(lambda: acked >= set(mids), limit)
        took = time.monotonic() - started
        assert caught_up, f"{len(acked & set(mids))} of {backlog} readings acknowledged in {limit:.0f} s"
        assert bridge.wait(lambda: {p for t, p in bridge.received[received_before:] if t == topic}
                           >= {f'{{"n": {n}}}'.encode() for n in range(backlog)}, 20)
        delivered = sum(1 for t, _ in bridge.received[received_before:] if t == topic)
        print(f"caught up in {took:.1f} s over {len(connections)} connections, {delivered - backlog} sent twice")
        # A connection per burst or so, each closed for the rate losing at most its window's PUBACKs.
        assert len(connections) <= 2 * backlog // BURST, f"{len(connections)} connections"
        assert delivered - backlog <= backlog, f"{delivered - backlog} readings delivered twice"
        assert took >= (backlog - 2 * BURST) / RATE * 0.8, f"caught up in {took:.1f} s: faster than its rate"
    finally:
        device.loop_stop()
        device.disconnect()
    agent = Agent(broker)
    try:
        stats = agent.send("stats")
        assert stats["offences"][BACKLOGGED]["rate_limited"] >= 1 and stats["counters"]["rested"] >= 1
    finally:
        agent.close()


# ------------------------------------------------------------------ the start gate

def test_after_a_restart_devices_wait_until_the_bridge_has_subscribed(lab, broker):
    """Mosquitto 2.0 restores sessions without their shared subscriptions: a device let in before the
    bridge subscribed again would get its readings acknowledged and routed nowhere. So devices, MQTT 3.1.1
    ones too, get no CONNACK until a bridge login subscribed."""
    docker("restart", f"{lab.network}-mosquitto")
    wait_until("mosquitto after restart", lambda: Session(broker, DEVICE).connected(5) is None, timeout=60)
    for protocol in (MQTTProtocolVersion.MQTTv5, MQTTProtocolVersion.MQTTv311):
        early = Session(broker, DEVICE, protocol=protocol)
        try:
            assert early.connected() is None and early.disconnected
        finally:
            early.close()
    open_device_gate(broker["services"], BRIDGE_PASSWORD, broker["ca"])
    late = Session(broker, DEVICE)
    try:
        assert late.connected()[0] == 0
    finally:
        late.close()


# ------------------------------------------------------------------ the device table at run time

class Agent:
    """mosquitto-agent's side of the control topic: send a command, read the plugin's JSON answer."""

    def __init__(self, broker: dict):
        self.session = Session(broker, AGENT_USER, AGENT_PASSWORD, "services", client_id="mosquitto-agent-1")
        assert self.session.connected() == (0, False)
        assert self.session.subscribe("$CONTROL/iot-gate/v1/response") == 1

    def send(self, text: str) -> dict:
        import json
        before = len(self.session.received)
        self.session.client.publish("$CONTROL/iot-gate/v1", text.encode(), qos=1)
        assert self.session.wait(lambda: len(self.session.received) > before), f"no answer to {text[:40]!r}"
        return json.loads(self.session.received[before][1])

    def close(self) -> None:
        self.session.close()


def _line(device: str, password: str, enabled: bool = True) -> str:
    return f"{device} {int(enabled)} password {hash_password(password, iterations=10)}"


def test_devices_are_added_rotated_disabled_and_removed_without_a_restart(broker):
    agent, new = Agent(broker), "site-a-new-1"
    try:
        assert agent.send(f"upsert\n{_line(new, 'first-password-123')}")["ok"]
        first = Session(broker, new, "first-password-123")
        assert first.connected()[0] == 0
        assert agent.send(f"upsert\n{_line(new, 'second-password-456')}")["ok"]      # rotate
        assert first.wait(lambda: first.disconnected)                                  # kicked at once
        assert Session(broker, new, "first-password-123").connected()[0] == 0x87
        second = Session(broker, new, "second-password-456")
        assert second.connected()[0] == 0
        assert agent.send(f"upsert\n{_line(new, 'second-password-456', enabled=False)}")["ok"]
        assert second.wait(lambda: second.disconnected)
        assert Session(broker, new, "second-password-456").connected()[0] == 0x87
        answer = agent.send(f"remove\n{new}")
        assert answer["ok"] and answer["gate_open"]
        assert Session(broker, new, "second-password-456").connected()[0] == 0x87
    finally:
        agent.close()


def test_a_snapshot_replaces_the_table_and_survives_a_restart(lab, broker):
    agent, kept = Agent(broker), "site-a-kept-1"
    try:
        table = [_line(d, p) for d, p in PASSWORDS.items()] + [_line(kept, "kept-password-789")]
        half = len(table) // 2
        assert agent.send("snapshot t1 1 2\n" + "\n".join(table[:half]))["ok"]
        answer = agent.send("snapshot t1 2 2\n" + "\n".join(table[half:]))
        assert answer["ok"] and answer["devices"] == len(table)
        assert agent.send("upsert\nbridge-9 1 password " + hash_password("x", iterations=10))["ok"] is False
    finally:
        agent.close()
    docker("restart", f"{lab.network}-mosquitto")
    wait_until("mosquitto after restart", lambda: Session(broker, DEVICE).connected(5) is None, timeout=60)
    open_device_gate(broker["services"], BRIDGE_PASSWORD, broker["ca"])
    session = Session(broker, kept, "kept-password-789")
    try:
        assert session.connected()[0] == 0
    finally:
        session.close()


def test_the_plugins_answers_leave_mosquittos_memory_count_alone(broker):
    """Each answer once lowered Mosquitto's count of its heap (Mosquitto 2.0.11's publish_copy allocates
    uncounted and frees counted), until the count wrapped past memory_limit and Mosquitto closed every
    connection at once: in the lab about six minutes after the agent started asking every 10 s."""
    agent = Agent(broker)
    try:
        for _ in range(400):                 # far more than the heap a fresh broker counts (tens of kB)
            assert agent.send("stats")["ok"]
    finally:
        agent.close()
    device = Session(broker, DEVICE)
    try:
        assert device.connected()[0] == 0
    finally:
        device.close()


def test_the_control_topic_is_the_agents_only(broker):
    bridge = Session(broker, BRIDGE_USER, BRIDGE_PASSWORD, "services", client_id="bridge-3")
    try:
        sneak = f"upsert\n{_line('site-a-sneak', 'sneaky-password-1')}".encode()
        assert bridge.publish("$CONTROL/iot-gate/v1", sneak) \
            == 0x87
        assert bridge.subscribe("$CONTROL/iot-gate/v1/response") == 0x87
    finally:
        bridge.close()
    assert Session(broker, "site-a-sneak", "sneaky-password-1").connected()[0] == 0x87


# ------------------------------------------------------------------ devices with client certificates

def _certificate(ca_key, ca_cert, common_name: str, directory: Path) -> tuple[Path, Path]:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .sign(ca_key, hashes.SHA256()))
    key_file, cert_file = directory / f"{common_name}.key", directory / f"{common_name}.crt"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_file, cert_file


@pytest.fixture(scope="module")
def device_pki(tmp_path_factory):
    """A site's device CA, and the certificates of DEVICE and OTHER_DEVICE it signed."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    directory = tmp_path_factory.mktemp("device-pki")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "site-a device CA")])
    now = dt.datetime.now(dt.UTC)
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    return {"ca": ca.public_bytes(serialization.Encoding.PEM).decode(),
            DEVICE: _certificate(key, ca, DEVICE, directory),
            OTHER_DEVICE: _certificate(key, ca, OTHER_DEVICE, directory)}


@pytest.fixture(scope="module")
def cert_broker(lab, tmp_path_factory, device_pki):
    return start_site_mosquitto(lab, tmp_path_factory.mktemp("mosquitto-certs"), {DEVICE: None, OTHER_DEVICE: None},
                                SITE, BRIDGE_PASSWORD, AGENT_PASSWORD, name="mosquitto-certs",
                                device_ca=device_pki["ca"], stack_mqtt_device_auth="certificate")


def _cert_connack(broker: dict, device_pki: dict, username: str, certificate_of: str | None):
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=username, protocol=MQTTProtocolVersion.MQTTv5)
    client.username_pw_set(username)
    if certificate_of:
        key, cert = device_pki[certificate_of]
        client.tls_set(ca_certs=str(broker["ca"]), certfile=str(cert), keyfile=str(key))
    else:
        client.tls_set(ca_certs=str(broker["ca"]))
    answered, result = threading.Event(), {}
    client.on_connect = lambda _c, _u, _f, rc, _p: (result.setdefault("rc", rc.value), answered.set())
    try:
        client.connect("127.0.0.1", broker["tls"], keepalive=5)
    except (OSError, ssl.SSLError):
        return None                          # refused in the TLS handshake
    client.loop_start()
    try:
        answered.wait(10)
    finally:
        client.loop_stop()
        client.disconnect()
    return result.get("rc")


def test_a_certificate_device_logs_in_with_its_own_certificate(cert_broker, device_pki):
    assert _cert_connack(cert_broker, device_pki, DEVICE, DEVICE) == 0


@pytest.mark.parametrize("certificate_of", [OTHER_DEVICE, None], ids=["another-devices-certificate", "none"])
def test_a_certificate_site_refuses_a_device_without_its_own_certificate(cert_broker, device_pki, certificate_of):
    assert _cert_connack(cert_broker, device_pki, DEVICE, certificate_of) in (None, 0x87)


def test_a_removed_certificate_device_is_refused_at_once(cert_broker, device_pki):
    """Revocation is the device table's: removing the device refuses its (still valid) certificate."""
    agent = Agent(cert_broker)
    try:
        assert agent.send(f"remove\n{OTHER_DEVICE}")["ok"]
    finally:
        agent.close()
    assert _cert_connack(cert_broker, device_pki, OTHER_DEVICE, OTHER_DEVICE) == 0x87
