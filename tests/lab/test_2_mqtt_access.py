"""A site's Mosquitto from the lab network, as a device on a factory network reaches it: the
deployed stack publishes only the TLS listener (8883), which refuses anonymous and wrong logins,
and a device logged in as itself cannot write another site's or another device's readings
(docs/security.md). That the right device works end to end is test_2_end_to_end (it publishes
as the site's test device over 8883). tests/integration/test_mosquitto_image.py covers each
ACL case on one broker."""
from __future__ import annotations

import socket
import threading

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from services.common import names
from tooling.lab import lab

pytestmark = pytest.mark.smoke     # seconds on a running lab: part of the lab smoke

SITE = "site-a"


@pytest.fixture(scope="module")
def address(lab_hosts) -> str:
    return lab.host_ip(lab.mosquitto_host(lab_hosts, SITE))     # the mqtt_node where Mosquitto runs now


def _client(name: str, username: str | None, password: str | None) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=username or "anonymous",      # a device's id
                         protocol=MQTTProtocolVersion.MQTTv5)
    if username:
        client.username_pw_set(username, password)
    client.tls_set(ca_certs=str(lab.pki_dir() / "ca.crt"))
    return client


def _connack(address: str, username: str | None, password: str | None):
    client = _client(username or "anonymous", username, password)
    answered, result = threading.Event(), {}

    def on_connect(_c, _u, _f, reason_code, _p):
        result["reason"] = reason_code
        answered.set()

    client.on_connect = on_connect
    client.connect(address, 8883, keepalive=10)
    client.loop_start()
    try:
        assert answered.wait(15), "no CONNACK within 15 s"
    finally:
        client.loop_stop()
        client.disconnect()
    return result["reason"]


def test_plain_mqtt_is_not_published(address):
    with pytest.raises(OSError), socket.create_connection((address, 1883), timeout=5):
        pass


@pytest.mark.parametrize("who", ["anonymous", "wrong-password", "another-sites-device"])
def test_a_login_that_is_not_this_sites_device_is_refused(address, who):
    device = lab.test_device(SITE)
    username, password = {"anonymous": (None, None), "wrong-password": (device, "not-its-password"),
                          # site-b's device exists only in site-b's password file
                          "another-sites-device": (lab.test_device("site-b"),
                                                   lab.device_password(lab.test_device("site-b")))}[who]
    reason = _connack(address, username, password)
    assert reason.is_failure and reason.getName() == "Not authorized", reason


def test_a_device_cannot_write_another_devices_or_another_sites_readings(address):
    device = lab.test_device(SITE)
    client = _client(device, device, lab.device_password(device))
    acks, changed = {}, threading.Condition()

    def on_publish(_c, _u, mid, reason_code, _p):
        with changed:
            acks[mid] = getattr(reason_code, "value", reason_code)
            changed.notify_all()

    client.on_publish = on_publish
    client.connect(address, 8883, keepalive=10)
    client.loop_start()
    try:
        codes = {}
        for name, topic in {
            "another device": names.MQTT_READINGS.format(site=SITE, device_id=f"{SITE}-dev-1", sensor_id="x"),
            "another site": names.MQTT_READINGS.format(site="site-b", device_id=device, sensor_id="x"),
        }.items():
            mid = client.publish(topic, b'{"timestamp": 1, "temperature": 99.0, "unit": "C"}', qos=1).mid
            with changed:
                assert changed.wait_for(lambda mid=mid: mid in acks, 15), f"no PUBACK for {topic}"
            codes[name] = acks[mid]
        assert codes == {"another device": 0x87, "another site": 0x87}      # Not authorized
    finally:
        client.loop_stop()
        client.disconnect()
