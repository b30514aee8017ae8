"""A site's Kafka from the lab network, as any machine on a factory network reaches it: its EXTERNAL
listener (host port 9094) takes only SCRAM logins over mutual TLS (a client certificate of the clients CA,
which only the relay and the operator have), and the datacenter relay's principal
may only read the relayed topics (docs/security.md). On the site's overlay, SERVICES takes only the
site's principals inside TLS, each held to its service's ACLs, INTERNAL (9092, in clear) is closed, and
ZooKeeper keeps the credentials and ACLs to the brokers' login. MirrorMaker still delivering every relayed
record over it is shown by test_2_end_to_end (events at the datacenter) and the fault suite's
dc-cut-off case (relay counted record by record)."""
from __future__ import annotations

import shlex
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from services.common import kafka_auth, names
from tooling.lab import lab
from tooling.testbed.docker_lab import image
from tooling.testbed.kafka_cluster import PORT_PROBE, metadata_errors, port_states, probe_internal, zookeeper_tls_client

pytestmark = pytest.mark.smoke     # seconds on a running lab: part of the lab smoke

SITE = "site-a"
RELAY_USER = "relay"               # stack_kafka_relay_user's default


@pytest.fixture(scope="module")
def bootstrap(lab_hosts) -> str:
    return f"{lab.host_ip(lab.site_managers(lab_hosts)[SITE])}:9094"


def _relay(bootstrap: str, **config: object) -> dict:
    return {"bootstrap.servers": bootstrap, **config,
            **kafka_auth.sasl_ssl_config(RELAY_USER, lab.secret("kafka_relay"), str(lab.pki_dir() / "ca.crt"),
                                         *lab.client_cert("relay"))}


def test_a_plaintext_client_is_refused(bootstrap):
    errors = metadata_errors({"bootstrap.servers": bootstrap})
    assert errors, "a plaintext client got the site's metadata"


def test_a_wrong_password_and_an_unknown_user_are_refused(bootstrap):
    ca = str(lab.pki_dir() / "ca.crt")
    for user, password in (("operator", "not-the-operators-password"), ("nobody", lab.secret("kafka_operator"))):
        errors = metadata_errors({"bootstrap.servers": bootstrap,
                                  **kafka_auth.sasl_ssl_config(user, password, ca, *lab.client_cert())})
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), (user, errors)


def test_no_sites_principal_logs_in_on_external_without_a_client_certificate(bootstrap):
    """Issue 30: the right passwords of the site's principals (admin, a super user; bridge; threshold-detector; ...)
    and the operator's, read off a node, opened 9094 from the factory network. EXTERNAL now asks for a client
    certificate of the clients CA first."""
    ca = str(lab.pki_dir() / "ca.crt")
    logins = {path.name.removeprefix("kafka-").removesuffix(".password"): path.read_text().strip()
              for path in (lab.pki_dir() / SITE).glob("kafka-*.password")}
    assert {"admin", "bridge", "threshold-detector"} <= set(logins), sorted(logins)
    logins["operator"] = lab.secret("kafka_operator")
    for user, password in sorted(logins.items()):
        login = kafka_auth.sasl_ssl_config(user, password, ca, *lab.client_cert())
        del login["ssl.certificate.location"], login["ssl.key.location"]
        errors = metadata_errors({"bootstrap.servers": bootstrap, **login})
        assert errors, f"{user}'s login without a client certificate got the site's metadata"


def test_a_servers_certificate_is_no_client_certificate(bootstrap):
    """Mosquitto's key and certificate sit on the site's mqtt node; the deployment's CA signed them. They open
    nothing on EXTERNAL: its clients must show a certificate of the clients CA."""
    site = lab.pki_dir() / SITE
    login = kafka_auth.sasl_ssl_config("operator", lab.secret("kafka_operator"), str(lab.pki_dir() / "ca.crt"),
                                       str(site / "mosquitto.crt"), str(site / "mosquitto.key"))
    assert metadata_errors({"bootstrap.servers": bootstrap, **login}), "a server's certificate opened EXTERNAL"


def test_the_operator_with_the_right_password_gets_in(bootstrap):
    # 30 s: a loaded lab's CI run (2026-11-29) took over the default 10 s to answer; a refusal comes at once.
    assert metadata_errors(lab.kafka_client(bootstrap), seconds=30) == []


def test_the_relay_reads_a_relayed_topic_but_cannot_write_it(bootstrap):
    topic = names.DEVICE_REGISTRATION           # relayed (stack_relay_topics), with records from the registrar
    consumer = Consumer(_relay(bootstrap, **{"group.id": f"relay-probe-{uuid.uuid4().hex[:6]}",
                                             "auto.offset.reset": "earliest", "enable.auto.commit": False}))
    try:
        # Reading needs no group (MirrorMaker assigns partitions itself).
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            # Errors are skipped: librdkafka looks up its group's coordinator even for assigned
            # partitions, which the relay may not use (MirrorMaker's consumers have no group.id).
            got = [m for m in consumer.consume(10, timeout=2) if m.error() is None]
        assert got, f"the relay read nothing from {topic}"
    finally:
        consumer.close()

    failures: list[KafkaError] = []
    producer = Producer(_relay(bootstrap, **{"message.timeout.ms": 15000}))
    producer.produce(topic, b"{}", key=b"relay-probe", on_delivery=lambda err, _msg: failures.append(err))
    producer.flush(30)
    assert failures and failures[0] is not None, "the relay wrote into a site's topic"
    assert failures[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, failures


def test_the_relay_cannot_see_or_read_a_topic_that_is_not_relayed(bootstrap):
    topic = names.TEMPERATURE_DATA
    metadata = AdminClient(_relay(bootstrap)).list_topics(topic, timeout=15).topics[topic]
    assert metadata.error is not None and metadata.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, \
        metadata.error
    consumer = Consumer(_relay(bootstrap, **{"group.id": f"relay-probe-{uuid.uuid4().hex[:6]}",
                                             "enable.auto.commit": False}))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        records = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            records += [m for m in consumer.consume(10, timeout=1) if m.error() is None]
        assert not records, f"the relay read {len(records)} readings of {topic}"
    finally:
        consumer.close()


@pytest.mark.slow      # waits for MirrorMaker's checkpoints (up to 5 minutes): outside the smoke
def test_mirrormaker_syncs_the_sites_adapter_offsets_to_the_datacenter_through_the_relays_acls(lab_hosts):
    """The relay may only DESCRIBE <site>-cassandra-adapter at the site; with that, MirrorMaker's
    checkpoint connector lists the group's offsets and writes them, translated, into the same-named
    group at the datacenter (sync.group.offsets). Records arriving do not show this: a denied group
    would only be logged by MirrorMaker. The site's adapter has committed offsets on the threshold
    events by now (test_2_end_to_end published a hot sensor's)."""
    group = f"{SITE}-{names.CONSUMER_GROUPS['adapter']}"
    relayed = f"{SITE}.{names.THRESHOLD_EVENTS}"
    admin = AdminClient(lab.kafka_client(f"{lab.host_ip(lab.site_managers(lab_hosts)['datacenter'])}:9094"))

    def synced() -> list:
        offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=15)
        return [tp for tp in offsets.topic_partitions if tp.topic == relayed and tp.offset > 0]

    deadline = time.monotonic() + 300          # checkpoints are emitted once a minute (MM2's default)
    found = synced()
    while not found and time.monotonic() < deadline:
        time.sleep(10)
        found = synced()
    assert found, f"no offsets of {group} on {relayed} reached the datacenter"


# ------------------------------------------------------------------ SERVICES and INTERNAL, from the site's overlay

def _probe_on_the_overlay(lab_hosts, user: str = "", password: str = "", write: tuple[str, ...] = ()) -> dict:
    """A client in a container on site-a's overlay (as any service there), started on its manager, inside TLS
    to SERVICES with the site's brokers CA (the file the stack role writes for the deployment's tools)."""
    manager = lab.site_managers(lab_hosts)[SITE]
    conf = {"security.protocol": "SASL_SSL" if user else "SSL", "ssl.ca.location": "/run/ca.pem"}
    return probe_internal("iot", "kafka-1:9095", user, password, write, conf=conf,
                          volumes={f"/opt/iot-stack/{SITE}/kafka_brokers_ca.pem": "/run/ca.pem"},
                          via=("docker", "exec", "-i", manager.container))


def test_services_refuses_anonymous_clients_on_the_overlay(lab_hosts):
    probe = _probe_on_the_overlay(lab_hosts)
    assert probe["topics"] is None, f"an anonymous client on site-a's overlay got Kafka's metadata: {probe}"


def test_no_broker_listens_on_internal(lab_hosts):
    """INTERNAL (9092, SCRAM in clear) is closed on every broker of the site: nothing can send a login there."""
    manager = lab.site_managers(lab_hosts)[SITE]
    brokers = [f"kafka-{h.variables['kafka_id']}" for h in lab_hosts
               if h.site == SITE and h.variables.get("kafka_id")]
    assert brokers, f"no broker of {SITE} in the lab's inventory"
    result = subprocess.run(["docker", "exec", manager.container, "docker", "run", "--rm", "--network", "iot",
                             image("services"), "python", "-c", PORT_PROBE, "9095,9092", *brokers],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = port_states(result.stdout)
    assert all(seen[(b, 9095)] == "open" for b in brokers), f"SERVICES not reached, so this proves nothing: {seen}"
    assert all(seen[(b, 9092)] == "ConnectionRefusedError" for b in brokers), f"INTERNAL answered: {seen}"


def test_a_service_principal_on_the_overlay_sees_and_writes_only_what_its_acls_name(lab_hosts):
    password = (lab.pki_dir() / SITE / "kafka-bridge.password").read_text().strip()
    # Writing device-commands would command devices: the bridge only reads it, so the write is refused.
    probe = _probe_on_the_overlay(lab_hosts, "bridge", password, write=(names.DEVICE_COMMANDS,))
    assert probe["write " + names.DEVICE_COMMANDS] == "TOPIC_AUTHORIZATION_FAILED", probe
    # It reads sensor-registration whole to check a reading's sensor belongs to the device that sent it.
    assert probe["topics"] == sorted([names.TEMPERATURE_DATA, names.DEAD_LETTER, names.DEVICE_COMMANDS,
                                      names.SENSOR_REGISTRATION]), probe


def test_zookeeper_refuses_a_client_on_the_overlay_without_the_brokers_login(lab_hosts):
    """A client on site-a's overlay without the brokers' ZooKeeper login, as any service container there: nothing
    answers in clear (2181 is on each server's loopback only), and over TLS (2182, the server's certificate and
    name checked against the site's ZooKeeper CA, the file the stack role writes for its tools) its session is
    refused before it reads a znode: no SCRAM credential, no ACL (issue 30)."""
    manager = lab.site_managers(lab_hosts)[SITE]
    ca = "/run/zookeeper_ca.pem"
    shell = shlex.join(["java", *zookeeper_tls_client(ca), "-server", "zookeeper-1:2182",
                        "get", f"/kafka-acl/Topic/{names.TEMPERATURE_DATA}"])
    script = f"nc -z -w 5 zookeeper-1 2181 && echo 'clear: open' || echo 'clear: refused'; {shell} 2>&1"
    result = subprocess.run(["docker", "exec", manager.container, "docker", "run", "--rm", "--network", "iot",
                             "--mount", f"type=bind,source=/opt/iot-stack/{SITE}/zookeeper_ca.pem,target={ca},readonly",
                             image("kafka"), "bash", "-c", script], capture_output=True, text=True, timeout=240)
    output = result.stdout + result.stderr
    assert "clear: refused" in output, output[-3000:]
    assert "SyncConnected" in output, output[-3000:]          # the TLS handshake passed: CA and name
    assert "client failed to authenticate" in output, output[-3000:]
    assert "User:bridge" not in output, output[-3000:]         # the ACLs were not read
