"""A broker secured as at a site (EXTERNAL: SASL_SSL, SCRAM-SHA-512, client certificates of the clients CA, the
ACL authorizer; INTERNAL on the test network; ZooKeeper's znodes locked to the brokers' ZooKeeper login) and
iot-kafka-access from the services image, as the stack role runs it, over INTERNAL. Clients from the host
reach EXTERNAL as a machine on a factory network would; a client on the test network without the brokers'
login stands for a compromised service container on a site's overlay."""
from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from deploy.kafka_acls import service_acls
from services.common import kafka_auth
from tooling.testbed.docker_lab import image, wait_until
from tooling.testbed.kafka_cluster import (
    create_topics,
    ensure_access,
    make_pki,
    metadata_errors,
    probe_internal,
    secure_zookeeper,
    start_kafka_cluster,
)

OPERATOR = ("operator", "operator-password-8f2c1d")
RELAY, RELAY_PASSWORD = "relay", "relay-password-4b7e9a"
RELAYED, NOT_RELAYED, GROUP = "relayed", "not-relayed", "site-a-cassandra-adapter"
RELAY_ACLS = [{"principal": f"User:{RELAY}", "resource": "topic", "name": RELAYED, "pattern": "literal",
               "operation": op} for op in ("READ", "DESCRIBE", "DESCRIBE_CONFIGS")] + \
             [{"principal": f"User:{RELAY}", "resource": "group", "name": GROUP, "pattern": "literal",
               "operation": "DESCRIBE"}]
RECORDS = 25


def access(lab, cluster, users: dict, acls: list, *extra: str) -> dict:
    return ensure_access(lab, cluster, users, acls, *extra)


@pytest.fixture(scope="module")
def cluster(lab):
    cluster = start_kafka_cluster(lab, prefix="secure-", operator=OPERATOR, broker_env={"JMX_EXPORTER_PORT": "9404"})
    create_topics(cluster, RELAYED, NOT_RELAYED, partitions=1)
    producer = Producer(cluster.client(acks="all"))
    for topic in (RELAYED, NOT_RELAYED):
        for i in range(RECORDS):
            producer.produce(topic, f"record-{i}".encode())
    assert producer.flush(30) == 0
    return cluster


@pytest.fixture(scope="module")
def relay(lab, cluster):
    first = access(lab, cluster, {RELAY: RELAY_PASSWORD, OPERATOR[0]: OPERATOR[1]}, RELAY_ACLS)
    assert first["users_created"] == [RELAY]          # the operator exists already (the testbed made it)
    assert len(first["acls_created"]) == 4 and first["acls_deleted"] == []
    return cluster.login(RELAY, RELAY_PASSWORD, cert="relay")


def read_all(config: dict, topic: str, seconds: float = 20) -> tuple[list, list[KafkaError]]:
    consumer = Consumer({**config, "group.id": f"probe-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
    records, errors = [], []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + seconds
        while len(records) < RECORDS and not errors and time.monotonic() < deadline:
            for msg in consumer.consume(50, timeout=1):
                if msg.error() is None:
                    records.append(msg.value())
                elif msg.error().code() != KafkaError.GROUP_AUTHORIZATION_FAILED:
                    errors.append(msg.error())
                # librdkafka looks up its group's coordinator even for assigned partitions, and the relay may
                # not use groups; MirrorMaker's Java consumers have no group.id and never ask.
    finally:
        consumer.close()
    return records, errors


def topic_error(config: dict, topic: str):
    """The error code the broker gives this client for `topic`'s metadata (None: it may see it)."""
    metadata = AdminClient(config).list_topics(topic, timeout=10).topics[topic]
    return metadata.error.code() if metadata.error else None


def test_plaintext_client_is_refused(cluster):
    assert metadata_errors({"bootstrap.servers": cluster.external}), "a plaintext client got metadata"


def test_unknown_user_and_wrong_password_are_refused(cluster, relay):
    for user, password in (("nobody", OPERATOR[1]), (OPERATOR[0], "a-wrong-password-123"), (RELAY, "wrong-relay-pw")):
        errors = metadata_errors({"bootstrap.servers": cluster.external,
                                  **cluster.login(user, password)})
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), (user, errors)


def test_a_client_that_does_not_trust_the_ca_is_refused(cluster, tmp_path):
    other_ca = make_pki(tmp_path, "elsewhere")
    errors = metadata_errors({"bootstrap.servers": cluster.external,
                              **kafka_auth.sasl_ssl_config(*OPERATOR, str(other_ca), *cluster.client_cert())})
    assert any(e.code() == KafkaError._SSL for e in errors), errors


# Mutual TLS on EXTERNAL (issue 30): a SCRAM login, a super user's included, needs a client certificate of the
# clients CA, which the pki role issues to the relay and the operator only. Before it, these logins were accepted.
def test_a_right_login_without_a_client_certificate_is_refused(cluster):
    login = cluster.login(*OPERATOR)
    del login["ssl.certificate.location"], login["ssl.key.location"]
    errors = metadata_errors({"bootstrap.servers": cluster.external, **login})
    assert errors and all(e.code() != KafkaError._AUTHENTICATION for e in errors), errors   # refused before SCRAM


def test_a_client_certificate_of_another_ca_is_refused(cluster):
    """`other` is a clientAuth certificate of the brokers' own CA: a server's key on a site node could sign
    nothing that EXTERNAL accepts."""
    errors = metadata_errors({"bootstrap.servers": cluster.external, **cluster.login(*OPERATOR, cert="other")})
    assert errors, "a certificate of the brokers' CA opened EXTERNAL"


def test_a_java_client_logs_in_with_a_pem_keystore_as_mirrormaker_does(lab, cluster, relay):
    """The relay's settings of mm2.properties.j2 (PEM keystore: key then certificate; PEM truststore), by
    Kafka's own Java client from the kafka image, on the host's network where EXTERNAL is advertised."""
    config = "\n".join([
        "security.protocol=SASL_SSL", "sasl.mechanism=SCRAM-SHA-512",
        "sasl.jaas.config=" + kafka_auth.properties_value(kafka_auth.jaas_config(RELAY, RELAY_PASSWORD)),
        "ssl.truststore.type=PEM", "ssl.truststore.location=/etc/kafka-pki/ca.crt",
        "ssl.keystore.type=PEM", "ssl.keystore.location=/etc/kafka-pki/relay-keystore.pem", ""])
    (Path(cluster.pki) / "relay.properties").write_text(config)
    (Path(cluster.pki) / "relay.properties").chmod(0o644)
    command = ["docker", "run", "--rm", "--network", "host", "-v", f"{cluster.pki}:/etc/kafka-pki:ro",
               image("kafka"), "kafka-topics", "--bootstrap-server", cluster.external,
               "--command-config", "/etc/kafka-pki/relay.properties", "--list"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and result.stdout.split() == [RELAYED], result.stdout + result.stderr


def test_relay_reads_the_relayed_topic_only_and_writes_nothing(cluster, relay):
    records, errors = read_all({"bootstrap.servers": cluster.external, **relay}, RELAYED)
    assert errors == [] and len(records) == RECORDS
    assert topic_error({"bootstrap.servers": cluster.external, **relay}, NOT_RELAYED) == \
        KafkaError.TOPIC_AUTHORIZATION_FAILED
    records, errors = read_all({"bootstrap.servers": cluster.external, **relay}, NOT_RELAYED, seconds=10)
    assert records == [], f"the relay read {len(records)} records of {NOT_RELAYED}"
    outcome: list = []
    producer = Producer({"bootstrap.servers": cluster.external, **relay, "message.timeout.ms": 10000})
    producer.produce(RELAYED, b"from the relay", on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(20)
    assert outcome and outcome[0] is not None and outcome[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, outcome


def test_operator_is_a_super_user(cluster):
    topic = f"made-by-operator-{uuid.uuid4().hex[:6]}"
    create_topics(cluster, topic, partitions=1)
    producer = Producer(cluster.client(acks="all"))
    producer.produce(topic, b"x")
    assert producer.flush(20) == 0


def test_second_run_changes_nothing_and_a_dropped_acl_is_revoked(lab, cluster, relay):
    users = {RELAY: RELAY_PASSWORD, OPERATOR[0]: OPERATOR[1]}
    assert access(lab, cluster, users, RELAY_ACLS) == \
        {"users_created": [], "users_updated": [], "acls_created": [], "acls_deleted": []}
    without_read = [a for a in RELAY_ACLS if not (a["resource"] == "topic" and a["operation"] == "READ")]
    dry = access(lab, cluster, users, without_read, "--dry-run")
    assert dry["acls_deleted"] == [f"User:{RELAY} READ topic:{RELAYED}"]
    assert read_all({"bootstrap.servers": cluster.external, **relay}, RELAYED)[0], "--dry-run changed an ACL"
    assert access(lab, cluster, users, without_read)["acls_deleted"] == [f"User:{RELAY} READ topic:{RELAYED}"]
    records, _ = read_all({"bootstrap.servers": cluster.external, **relay}, RELAYED, seconds=10)
    assert records == [], "the relay still reads a topic whose READ was revoked"
    assert access(lab, cluster, users, RELAY_ACLS)["acls_created"] == [f"User:{RELAY} READ topic:{RELAYED}"]


def test_rotate_sets_the_password_again(lab, cluster, relay):
    new = "relay-password-rotated-77"
    result = access(lab, cluster, {RELAY: new}, RELAY_ACLS, "--rotate")
    assert result["users_updated"] == [RELAY] and result["users_created"] == []
    old_login = {"bootstrap.servers": cluster.external, **relay}
    assert any(e.code() == KafkaError._AUTHENTICATION for e in metadata_errors(old_login))
    new_login = {"bootstrap.servers": cluster.external, **cluster.login(RELAY, new, cert="relay")}
    assert metadata_errors(new_login) == []


def test_bad_input_exits_2_naming_the_problem(lab, cluster):
    cmd = ["docker", "run", "-i", "--rm", "--network", lab.network, image("services"), "iot-kafka-access", "ensure",
           "--bootstrap", cluster.internal, "--acls", json.dumps([{**RELAY_ACLS[0], "operation": "READ_ALL"}])]
    result = subprocess.run(cmd, input="{}", capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "operation 'READ_ALL' must be one of" in result.stderr, result.stderr


# ------------------------------------------------------------------ INTERNAL: each service as its own principal

def internal_probe(lab, cluster, user: str = "", password: str = "", write: tuple[str, ...] = ()) -> dict:
    return probe_internal(lab.network, cluster.internal, user, password, write)


def test_internal_refuses_anonymous_clients_and_wrong_passwords(lab, cluster):
    anonymous = internal_probe(lab, cluster)
    assert anonymous["topics"] is None, f"an anonymous client on INTERNAL got metadata: {anonymous}"
    wrong = internal_probe(lab, cluster, cluster.admin[0], "not-the-admins-password-1")
    assert wrong["topics"] is None and "_AUTHENTICATION" in wrong["errors"], wrong


def test_a_service_principal_writes_only_what_its_acls_name(lab, cluster, relay):

    user, password = "bridge", f"bridge-{uuid.uuid4().hex}"
    acls = service_acls([{"user": user, "writes": [RELAYED]}])
    access(lab, cluster, {user: password}, acls)
    probe = internal_probe(lab, cluster, user, password, write=(RELAYED, NOT_RELAYED))
    assert probe["write " + RELAYED] == "ok", probe
    assert probe["write " + NOT_RELAYED] == "TOPIC_AUTHORIZATION_FAILED", probe
    assert probe["topics"] == [RELAYED], f"the service sees topics it may not use: {probe}"


# SERVICES (9095): the site's services log in there as on INTERNAL, with SCRAM, but inside TLS with the broker's
# BROKER certificate, which they check against the site's brokers CA and the name they dial (kafka_auth's
# internal_config with KAFKA_CA_FILE, the services image's own librdkafka).
def services_probe(lab, cluster, user: str, password: str, ca: str = "brokers-ca.crt", bootstrap: str = "",
                   write: tuple[str, ...] = ()) -> dict:
    tls = {"security.protocol": "SASL_SSL", "ssl.ca.location": f"/pki/{ca}",
           "ssl.endpoint.identification.algorithm": "https"}
    return probe_internal(lab.network, bootstrap or cluster.services, user, password, write, conf=tls,
                          volumes={cluster.pki: "/pki"})


def test_services_takes_a_services_login_inside_tls_under_the_same_acls(lab, cluster, relay):
    user, password = "adapter", f"adapter-{uuid.uuid4().hex}"
    access(lab, cluster, {user: password}, service_acls([{"user": user, "writes": [RELAYED]}]))
    probe = services_probe(lab, cluster, user, password, write=(RELAYED, NOT_RELAYED))
    assert probe["topics"] == [RELAYED], f"the service sees other topics or none over TLS: {probe}"
    assert probe["write " + RELAYED] == "ok", probe
    assert probe["write " + NOT_RELAYED] == "TOPIC_AUTHORIZATION_FAILED", probe


def test_services_refuses_clear_another_ca_another_name_and_a_wrong_password(lab, cluster):
    address = lab.exec(cluster.broker, "hostname", "-i").stdout.split()[0]
    refused = {
        "the admin's SCRAM login in clear": probe_internal(lab.network, cluster.services, *cluster.admin),
        "a client trusting the deployment's CA (EXTERNAL's), not the brokers CA":
            services_probe(lab, cluster, *cluster.admin, ca="ca.crt"),
        "the broker dialled by an address its certificate does not name":
            services_probe(lab, cluster, *cluster.admin, bootstrap=f"{address}:9095"),
        "a wrong password": services_probe(lab, cluster, cluster.admin[0], "not-the-admins-password-3"),
    }
    opened = {what: out for what, out in refused.items() if out["topics"] is not None}
    assert not opened, f"SERVICES answered: {opened}"
    assert "_AUTHENTICATION" in refused["a wrong password"]["errors"], refused["a wrong password"]
    assert services_probe(lab, cluster, *cluster.admin)["topics"], "the right login over TLS got no metadata"


def test_a_java_client_on_services_takes_the_brokers_ca_inline_as_the_spark_jobs_do(lab, cluster, tmp_path):
    """kafka_auth.java_internal_options with KAFKA_CA_FILE: the CA's PEM inline (ssl.truststore.certificates), so
    Spark's executors need no file; here Kafka's own Java client from the kafka image, on the test network."""
    (tmp_path / "admin.password").write_text(cluster.admin[1])
    environ = {"KAFKA_USERNAME": cluster.admin[0], "KAFKA_PASSWORD_FILE": str(tmp_path / "admin.password"),
               "KAFKA_CA_FILE": f"{cluster.pki}/brokers-ca.crt"}
    options = kafka_auth.java_internal_options(environ)
    assert "ssl.truststore.location" not in options
    # java.util.Properties reads \n in a value as a line break: the PEM's lines, on one properties line.
    lines = [f"{key}=" + kafka_auth.properties_value(value).replace("\n", "\\n") for key, value in options.items()]
    (Path(cluster.pki) / "services.properties").write_text("\n".join(lines) + "\n")
    (Path(cluster.pki) / "services.properties").chmod(0o644)
    command = ["docker", "run", "--rm", "--network", lab.network, "-v", f"{cluster.pki}:/etc/kafka-pki:ro",
               image("kafka"), "kafka-topics", "--bootstrap-server", cluster.services,
               "--command-config", "/etc/kafka-pki/services.properties", "--list"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and RELAYED in result.stdout.split(), result.stdout + result.stderr[-2000:]


def _zookeeper_shell(lab, cluster, *command: str) -> str:
    """zookeeper-shell from the ZooKeeper's own container: a client on the site's network without the brokers'
    ZooKeeper login, as a compromised service container would be."""
    result = lab.exec(cluster.zookeeper, "zookeeper-shell", "-server", "localhost:2181", *command)
    return result.stdout + result.stderr


def _refused(output: str) -> bool:
    return "Insufficient permission" in output or "NoAuth" in output


def test_zookeeper_keeps_credentials_and_acls_from_a_client_without_the_brokers_login(lab, cluster, relay):
    # The admin's credential, written by the broker as it started (logged in: zookeeper.set.acl), and the
    # operator's, written before the broker by a tool without the login (open, then locked by secure-zookeeper).
    for user in (cluster.admin[0], OPERATOR[0]):
        path = f"/config/users/{user}"
        assert _refused(_zookeeper_shell(lab, cluster, "get", path)), path        # SCRAM salt and keys unreadable
        assert _refused(_zookeeper_shell(lab, cluster, "getAcl", path)), path     # not even who may read them
        assert _refused(_zookeeper_shell(lab, cluster, "delete", path)), path
    # The relay's ACLs: readable (no secret in them), not changeable, and no new one can be written.
    relayed = f"/kafka-acl/Topic/{RELAYED}"
    assert f"User:{RELAY}" in _zookeeper_shell(lab, cluster, "get", relayed)
    grant = json.dumps({"version": 1, "acls": [{"principal": "User:intruder", "permissionType": "Allow",
                                                "operation": "All", "host": "*"}]})
    assert _refused(_zookeeper_shell(lab, cluster, "set", relayed, grant))
    assert _refused(_zookeeper_shell(lab, cluster, "create", f"/kafka-acl/Topic/{NOT_RELAYED}", grant))
    assert _refused(_zookeeper_shell(lab, cluster, "setAcl", relayed, "world:anyone:cdrwa"))
    # The broker, logged in, still writes: a new topic is created and its ACL entries added.
    topic = f"after-lock-{uuid.uuid4().hex[:6]}"
    create_topics(cluster, topic, partitions=1)
    assert topic in AdminClient(cluster.client()).list_topics(timeout=10).topics
    acl = _zookeeper_shell(lab, cluster, "getAcl", f"/brokers/topics/{topic}")      # readable, writable by the login
    assert "'sasl,'kafka\n: cdrwa" in acl and "'world,'anyone\n: r\n" in acl, acl


def test_secure_zookeeper_runs_again_without_harm(lab, cluster):
    # What the stack role runs on a site that was secured already (a marker keeps it from running each time).
    output = secure_zookeeper(lab, cluster)
    assert "Exception" not in output, output
    assert AdminClient(cluster.client()).list_topics(timeout=10).topics


# BROKER (issue 30): the brokers replicate to each other and the controller reaches them over mutual TLS with
# certificates of the site's brokers CA, which issues nothing else; before it, replication ran on INTERNAL in
# clear. The cluster's own traffic uses it (inter.broker.listener.name), so the fixture's topics show it works.
def broker_probe(lab, cluster, conf: dict, user: str = "", password: str = "") -> dict:
    bootstrap = f"{cluster.broker}:9093"
    return probe_internal(lab.network, bootstrap, user, password, conf=conf, volumes={cluster.pki: "/pki"})


def test_broker_listener_takes_a_brokers_certificate_and_nothing_else(lab, cluster):
    tls = {"security.protocol": "SSL", "ssl.ca.location": "/pki/brokers-ca.crt"}
    broker = broker_probe(lab, cluster, tls | {"ssl.certificate.location": "/pki/broker-keystore.pem",
                                               "ssl.key.location": "/pki/broker-keystore.pem"})
    assert broker["topics"] is not None and RELAYED in broker["topics"], broker
    refused = {
        "no client certificate": broker_probe(lab, cluster, tls),
        "a certificate of the servers' CA": broker_probe(lab, cluster, tls | {
            "ssl.certificate.location": "/pki/other.crt", "ssl.key.location": "/pki/other.key"}),
        "the relay's certificate": broker_probe(lab, cluster, tls | {
            "ssl.certificate.location": "/pki/relay.crt", "ssl.key.location": "/pki/relay.key"}),
        "the admin's SCRAM login in clear": broker_probe(lab, cluster, {}, *cluster.admin),
    }
    opened = {what: out for what, out in refused.items() if out["topics"] is not None}
    assert not opened, f"BROKER answered: {opened}"


def test_the_brokers_talk_to_each_other_on_broker(lab, cluster):
    settings = lab.exec(cluster.broker, "grep", "-E", "^(inter.broker.listener.name|listener.security.protocol.map)=",
                        "/opt/kafka/run/server.properties").stdout.split()
    assert sorted(settings) == ["inter.broker.listener.name=BROKER",
                                "listener.security.protocol.map=INTERNAL:SASL_PLAINTEXT,EXTERNAL:SASL_SSL,BROKER:SSL,"
                                "SERVICES:SASL_SSL"]


# What the alerts KafkaLoginsRefusedInsideSite and KafkaExternalLoginsRefused read: the broker's exporter counts
# the logins each listener refused, a TLS handshake without the right certificate as much as a wrong password.
def refused_logins(lab, cluster) -> dict[str, float]:
    """{listener: logins refused} from the broker's JMX exporter, read inside its container as Prometheus would."""
    page = lab.exec(cluster.broker, "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9404; "
                    "printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3").stdout
    counts: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith("kafka_server_socket_server_failed_authentication_total{"):
            listener = line.split('listener="', 1)[1].split('"', 1)[0]
            counts[listener] = counts.get(listener, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def test_the_exporter_counts_the_logins_each_listener_refused(lab, cluster):
    before = refused_logins(lab, cluster)
    assert set(before) == {"INTERNAL", "BROKER", "EXTERNAL", "SERVICES"}, before
    internal_probe(lab, cluster, cluster.admin[0], "not-the-admins-password-2")
    services_probe(lab, cluster, cluster.admin[0], "not-the-admins-password-4")
    broker_probe(lab, cluster, {"security.protocol": "SSL", "ssl.ca.location": "/pki/brokers-ca.crt",
                                "ssl.certificate.location": "/pki/relay.crt", "ssl.key.location": "/pki/relay.key"})
    errors = metadata_errors({"bootstrap.servers": cluster.external, **cluster.login(RELAY, "not-the-relays-pw")})
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors

    def counted() -> bool:
        after = refused_logins(lab, cluster)
        return all(after.get(listener, 0) > before[listener] for listener in before)
    wait_until("the refused logins counted on each listener", counted, timeout=60, interval=2,
               on_timeout=lambda: f"before {before}, now {refused_logins(lab, cluster)}")
    # Where the alerts send the operator: the broker's log names each refused address.
    refusals = [line for line in lab.logs(cluster.broker).splitlines() if "Failed authentication with /" in line]
    assert any("SSL handshake failed" in line for line in refusals), refusals
    assert any("invalid credentials" in line for line in refusals), refusals
