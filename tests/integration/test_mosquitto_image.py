"""The mosquitto image runs a real Mosquitto as a site runs it: devices on 8883 with TLS, each logged
in as itself and held to its own topics by the ACL the stack role renders; the plain 1883 (the bridge's,
on the overlay) refuses anonymous clients too."""
from __future__ import annotations

import ssl
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from services.common import names
from tooling.testbed.mosquitto import start_site_mosquitto

SITE = "site-a"
DEVICE, OTHER_DEVICE, BRIDGE = "site-a-press-1", "site-a-press-2", "bridge"
USERS = {BRIDGE: "bridge-secret-for-tests", DEVICE: "press-1-secret-for-tests", OTHER_DEVICE: "press-2-secret-tests"}


@pytest.fixture(scope="module")
def broker(lab, tmp_path_factory):
    broker = start_site_mosquitto(lab, tmp_path_factory.mktemp("mosquitto-secrets"), USERS, SITE)
    assert _connack(broker["tls"], broker["ca"], DEVICE, USERS[DEVICE]).value == 0
    return broker


def _client(client_id: str, ca: Path | None, username: str | None = None) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5)
    if username:
        client.username_pw_set(username, USERS.get(username))
    if ca:
        client.tls_set(ca_certs=str(ca))
    return client


def _connack(port: int, ca: Path | None, username: str | None, password: str | None, host: str = "127.0.0.1"):
    """Connect and return the CONNACK reason code; raises when the connection itself fails (TLS)."""
    client = _client(f"c-{username}", ca)
    if username:
        client.username_pw_set(username, password)
    answered, result = threading.Event(), {}

    def on_connect(_client, _userdata, _flags, reason_code, _props):
        result["reason"] = reason_code
        answered.set()

    client.on_connect = on_connect
    client.connect(host, port, keepalive=5)
    client.loop_start()
    try:
        assert answered.wait(10), "no CONNACK within 10 s"
    finally:
        client.loop_stop()
        client.disconnect()
    return result["reason"]


class Session:
    """A connected client that records what it receives and the reason codes of its acks."""

    def __init__(self, broker: dict, username: str, port_kind: str = "tls"):
        self.received: list[tuple[str, bytes]] = []
        self.acks: dict[int, int] = {}
        self.subacks: list[int] = []
        self.lock, self.changed = threading.Lock(), threading.Condition()
        self.client = _client(f"s-{username}-{port_kind}", broker["ca"] if port_kind == "tls" else None, username)
        self.client.on_message = self._on_message
        self.client.on_publish = self._on_publish
        self.client.on_subscribe = self._on_subscribe
        connected = threading.Event()
        self.client.on_connect = lambda *_: connected.set()
        self.client.connect("127.0.0.1", broker[port_kind], keepalive=10)
        self.client.loop_start()
        assert connected.wait(10), f"{username}: no CONNACK"

    def _notify(self, update) -> None:
        with self.changed:
            update()
            self.changed.notify_all()

    def _on_message(self, _c, _u, msg) -> None:
        self._notify(lambda: self.received.append((msg.topic, msg.payload)))

    def _on_publish(self, _c, _u, mid, reason_code, _p) -> None:
        self._notify(lambda: self.acks.__setitem__(mid, getattr(reason_code, "value", reason_code)))

    def _on_subscribe(self, _c, _u, _mid, reason_codes, _p) -> None:
        self._notify(lambda: self.subacks.extend(getattr(r, "value", r) for r in reason_codes))

    def wait(self, what, timeout: float = 10):
        with self.changed:
            return self.changed.wait_for(what, timeout)

    def subscribe(self, topic: str) -> int:
        before = len(self.subacks)
        self.client.subscribe(topic, qos=1)
        assert self.wait(lambda: len(self.subacks) > before), f"no SUBACK for {topic}"
        return self.subacks[-1]

    def publish(self, topic: str, payload: bytes) -> int:
        """QoS 1; returns the PUBACK's reason code."""
        info = self.client.publish(topic, payload, qos=1)
        assert self.wait(lambda: info.mid in self.acks), f"no PUBACK for {topic}"
        return self.acks[info.mid]

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def bridge(broker):
    """The bridge's login on the plain listener, as on the overlay: it reads every reading."""
    session = Session(broker, BRIDGE, "plain")
    assert session.subscribe(names.MQTT_READINGS.format(site="+", device_id="+", sensor_id="+")) == 1
    yield session
    session.close()


def _reading(site: str, device: str, sensor: str) -> str:
    return names.MQTT_READINGS.format(site=site, device_id=device, sensor_id=sensor)


@pytest.mark.parametrize("username, password", [(None, None), (DEVICE, "wrong-password"), ("nobody", "whatever")],
                         ids=["anonymous", "wrong-password", "unknown-user"])
@pytest.mark.parametrize("port_kind", ["tls", "plain"])
def test_a_client_without_a_valid_login_is_refused(broker, port_kind, username, password):
    reason = _connack(broker[port_kind], broker["ca"] if port_kind == "tls" else None, username, password)
    assert reason.is_failure and reason.getName() == "Not authorized", reason


def test_the_tls_listener_refuses_plain_mqtt(broker):
    client = _client("plain-to-tls", None)
    client.username_pw_set(DEVICE, USERS[DEVICE])
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
    with pytest.raises(ssl.SSLCertVerificationError):
        _connack(broker["tls"], broker["ca"], DEVICE, USERS[DEVICE], host="localhost")


def test_a_device_writes_its_own_readings_over_tls(broker, bridge):
    device = Session(broker, DEVICE)
    try:
        topic = _reading(SITE, DEVICE, "t1")
        assert device.publish(topic, b'{"temperature": 21.5}') == 0
        assert bridge.wait(lambda: (topic, b'{"temperature": 21.5}') in bridge.received)
    finally:
        device.close()


@pytest.mark.parametrize("topic", [_reading(SITE, OTHER_DEVICE, "t1"), _reading("site-b", DEVICE, "t1"),
                                   "sites/site-a/devices/site-a-press-1/commands", "anything/else"],
                         ids=["another-device", "another-site", "its-own-commands", "other-topic"])
def test_a_device_cannot_write_anywhere_else(broker, bridge, topic):
    device = Session(broker, DEVICE)
    try:
        assert device.publish(topic, b'{"temperature": 99}') == 0x87         # Not authorized
        own = _reading(SITE, DEVICE, "marker")
        assert device.publish(own, b"{}") == 0
        assert bridge.wait(lambda: (own, b"{}") in bridge.received)            # what came after it arrived...
        assert (topic, b'{"temperature": 99}') not in bridge.received         # ...and it did not
    finally:
        device.close()


def test_a_device_reads_only_its_own_commands(broker):
    device, bridge = Session(broker, DEVICE), Session(broker, BRIDGE, "plain")
    try:
        own = names.MQTT_COMMANDS.format(site=SITE, device_id=DEVICE)
        other = names.MQTT_COMMANDS.format(site=SITE, device_id=OTHER_DEVICE)
        assert device.subscribe(own) == 1
        # Mosquitto 2.0 may grant these subscriptions; its read check then delivers the device only its own.
        device.subscribe(other)
        device.subscribe("sites/site-a/devices/+/commands")
        device.subscribe("#")
        for topic in (other, own):
            assert bridge.publish(topic, topic.encode()) == 0
        assert device.wait(lambda: any(t == own for t, _ in device.received))
        assert [t for t, _ in device.received if t != own] == []
    finally:
        device.close()
        bridge.close()
