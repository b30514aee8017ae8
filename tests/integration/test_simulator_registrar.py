"""Simulator and registrar from the services image against real Mosquitto and Kafka."""
from __future__ import annotations

import json
import shutil
import threading

import paho.mqtt.client as mqtt
import pytest
from confluent_kafka import Consumer
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from services.common import contracts, names
from tooling.testbed.docker_lab import docker, image, wait_until
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster
from tooling.testbed.mosquitto import start_site_mosquitto

SITE = "site-a"
BRIDGE = ("bridge", "bridge-secret-for-tests")
FLEET = {f"{SITE}-dev-{n}": f"device-{n}-secret-for-tests" for n in range(1, 4)}
REGISTRATION_TOPICS = (names.SENSOR_TYPE_REGISTRATION, names.DEVICE_REGISTRATION,
                       names.SENSOR_REGISTRATION)


@pytest.fixture(scope="module")
def mosquitto(lab, tmp_path_factory):
    """A site's Mosquitto, and the simulator's secrets: its devices' logins and the CA."""
    broker = start_site_mosquitto(lab, tmp_path_factory.mktemp("mosquitto"), FLEET, SITE, BRIDGE[1])
    secrets = tmp_path_factory.mktemp("simulator-secrets")
    (secrets / "mqtt_credentials").write_text(json.dumps(FLEET))
    shutil.copyfile(broker["ca"], secrets / "mqtt_ca.pem")
    for path in (secrets / "mqtt_credentials", secrets / "mqtt_ca.pem"):
        path.chmod(0o644)
    secrets.chmod(0o755)
    return broker, secrets


def run_tool(lab, *args, volumes: dict[str, str] | None = None):
    cmd = ["run", "--rm", "--network", lab.network]
    for src, dst in (volumes or {}).items():
        cmd += ["-v", f"{src}:{dst}"]
    return docker(*cmd, image("services"), *args, check=False, timeout=180)


def test_simulator_publishes_count_readings_all_acked_and_received(lab, mosquitto):
    broker, secrets = mosquitto
    received = []
    subscribed = threading.Event()
    sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bridge-counter", protocol=MQTTProtocolVersion.MQTTv5)
    sub.username_pw_set(*BRIDGE)            # the bridge's login, on the services listener as on the overlay
    sub.on_connect = lambda c, *_: c.subscribe(
        names.MQTT_READINGS.format(site=SITE, device_id="+", sensor_id="+"), qos=1)
    sub.on_subscribe = lambda *_: subscribed.set()
    sub.on_message = lambda _c, _u, msg: received.append((msg.topic, json.loads(msg.payload)))
    sub.tls_set(ca_certs=str(broker["ca"]))
    sub.connect("127.0.0.1", broker["services"])
    sub.loop_start()
    try:
        assert subscribed.wait(10)
        # Each device logs in as itself over TLS (8883), checking the certificate names 'mosquitto'.
        result = run_tool(lab, "iot-simulator", "--host", "mosquitto", "--site", SITE,
                          "--devices", "3", "--sensors-per-device", "2", "--rate", "500", "--count", "1000",
                          "--unit", "F", "--seed", "4", "--json", volumes={str(secrets): "/run/secrets:ro"})
        assert result.returncode == 0, result.stdout + result.stderr
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["sent"] == summary["acked"] == 1000 and summary["failed"] == 0
        wait_until("all readings at the subscriber", lambda: len(received) >= 1000, timeout=30)
    finally:
        sub.loop_stop()
        sub.disconnect()
    assert len(received) == 1000
    assert len({topic for topic, _ in received}) == 6
    for topic, payload in received:
        assert contracts.READING.validate(payload)["unit"] == "F"
        device = payload["sensor_id"].rsplit("-s", 1)[0]          # fleet ids: <device>-s<n>
        assert topic == names.MQTT_READINGS.format(site=SITE, device_id=device, sensor_id=payload["sensor_id"])


def test_registrar_fills_compacted_topics_keyed_by_id(lab):
    cluster = start_kafka_cluster(lab)
    create_topics(cluster, *REGISTRATION_TOPICS, partitions=1, config={"cleanup.policy": "compact"})
    result = run_tool(lab, "iot-registrar", "--bootstrap-servers", cluster.internal,
                      "fleet", "--site", "site-b", "--devices", "2", "--sensors-per-device", "2")
    assert result.returncode == 0, result.stderr
    assert "registered 7 records" in result.stdout

    consumer = Consumer({"bootstrap.servers": cluster.external, "group.id": "reg-check",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(list(REGISTRATION_TOPICS))
    seen: dict[str, dict[str, dict]] = {t: {} for t in REGISTRATION_TOPICS}

    def all_seen() -> bool:
        for msg in consumer.consume(100, timeout=1.0):
            if msg.error() is None:
                seen[msg.topic()][msg.key().decode()] = json.loads(msg.value())
        return sum(len(v) for v in seen.values()) == 7

    try:
        wait_until("registrations", all_seen, timeout=60)
    finally:
        consumer.close()
    assert set(seen[names.DEVICE_REGISTRATION]) == {"site-b-dev-1", "site-b-dev-2"}
    assert seen[names.SENSOR_REGISTRATION]["site-b-dev-2-s1"]["device_id"] == "site-b-dev-2"
    assert seen[names.SENSOR_TYPE_REGISTRATION]["temperature-c"]["unit"] == "C"


def test_registrar_rejects_invalid_file_and_produces_nothing(lab, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"devices": [{"device_id": "d1"}]}')
    bad.chmod(0o644)
    tmp_path.chmod(0o755)
    result = run_tool(lab, "iot-registrar", "--bootstrap-servers", "nowhere:9092", "file", "/in/bad.json",
                      volumes={str(tmp_path): "/in:ro"})
    assert result.returncode == 1
    assert "devices[1]: device-registration: missing field 'name'" in result.stderr
