"""The mosquitto image runs a real Mosquitto that refuses anonymous clients."""
from __future__ import annotations

import threading

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tooling.testbed.docker_lab import free_port, mosquitto_password_file, wait_until

USER, PASSWORD = "device-7", "s3cret-for-tests"


@pytest.fixture(scope="module")
def broker(lab, tmp_path_factory):
    secrets = tmp_path_factory.mktemp("mosquitto-secrets")
    mosquitto_password_file(secrets, {USER: PASSWORD})
    port = free_port()
    lab.run("mosquitto", "mosquitto", ports={port: 1883}, volumes={str(secrets): "/run/secrets:ro"},
            env={"MOSQUITTO_PASSWORD_FILE": "/run/secrets/passwd"}, memory="256m")

    def accepts_tcp() -> bool:
        client = _client("probe")
        client.connect("127.0.0.1", port, keepalive=5)
        client.disconnect()
        return True

    wait_until("mosquitto", accepts_tcp, timeout=60, on_timeout=lambda: lab.logs("mosquitto"))
    return port


def _client(client_id: str) -> mqtt.Client:
    return mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5)


def _connect_result(port: int, username: str | None, password: str | None):
    """Connect and return the CONNACK reason code."""
    client = _client(f"c-{username}")
    if username:
        client.username_pw_set(username, password)
    answered = threading.Event()
    result = {}

    def on_connect(_client, _userdata, _flags, reason_code, _props):
        result["reason"] = reason_code
        answered.set()

    client.on_connect = on_connect
    client.connect("127.0.0.1", port, keepalive=5)
    client.loop_start()
    try:
        assert answered.wait(10), "no CONNACK within 10 s"
    finally:
        client.loop_stop()
        client.disconnect()
    return result["reason"]


def test_anonymous_client_is_refused(broker):
    reason = _connect_result(broker, None, None)
    assert reason.is_failure
    assert reason.getName() == "Not authorized"


def test_wrong_password_is_refused(broker):
    reason = _connect_result(broker, USER, "wrong")
    assert reason.is_failure


def test_authenticated_publish_reaches_subscriber(broker):
    topic = "sites/site-a/sensors/7/temperature"
    received, subscribed = [], threading.Event()
    done = threading.Event()

    subscriber = _client("subscriber")
    subscriber.username_pw_set(USER, PASSWORD)
    subscriber.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
    subscriber.on_subscribe = lambda *_: subscribed.set()

    def on_message(_client, _userdata, msg):
        received.append(msg.payload.decode())
        if len(received) == 10:
            done.set()

    subscriber.on_message = on_message
    subscriber.connect("127.0.0.1", broker)
    subscriber.loop_start()
    publisher = _client("publisher")
    publisher.username_pw_set(USER, PASSWORD)
    publisher.connect("127.0.0.1", broker)
    publisher.loop_start()
    try:
        assert subscribed.wait(10), "subscription not acknowledged"
        for i in range(10):
            publisher.publish(topic, f'{{"sensor_id": "7", "temperature": {20 + i}}}', qos=1).wait_for_publish(10)
        assert done.wait(10), f"only {len(received)} of 10 messages arrived"
    finally:
        for client in (publisher, subscriber):
            client.loop_stop()
            client.disconnect()
    assert received == [f'{{"sensor_id": "7", "temperature": {20 + i}}}' for i in range(10)]
