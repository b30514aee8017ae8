"""A broker with the listeners a stack opens (ansible/roles/stack/templates/stack-services.j2): BROKER, EXTERNAL
and SERVICES, INTERNAL (9092, SCRAM in clear) closed. It starts and its healthcheck passes on SERVICES; nothing
answers on 9092; and the deployment's tools work inside TLS to SERVICES as the roles run them, the site's
brokers CA mounted: iot-topics (Python, KAFKA_CA_FILE: the topics role) and kafka-topics (Java, a
--command-config from kafka_client_properties naming the CA's file: the health role's Kafka gate)."""
from __future__ import annotations

import json
import uuid

import pytest

from deploy.kafka_acls import kafka_client_properties
from tooling.testbed.docker_lab import docker, image
from tooling.testbed.kafka_cluster import PORT_PROBE, port_states, start_kafka_cluster

TOPIC = "temperature-data"
CA = "/run/kafka_brokers_ca.pem"       # iot_kafka_tool_ca (ansible/group_vars/all/main.yml)


@pytest.fixture(scope="module")
def cluster(lab):
    return start_kafka_cluster(lab, prefix="noint-", operator=("operator", f"op-{uuid.uuid4().hex}"),
                               internal=False)


def tool_args(cluster) -> list[str]:
    """iot_kafka_tool_args: the brokers CA mounted read-only, named by KAFKA_CA_FILE."""
    return ["--mount", f"type=bind,source={cluster.pki}/brokers-ca.crt,target={CA},readonly",
            "--env", f"KAFKA_CA_FILE={CA}"]


def test_the_broker_is_healthy_on_services_and_refuses_internal(lab, cluster):
    assert cluster.internal == ""
    health = lab.exec(cluster.broker, "kafka-health")
    assert health.returncode == 0, f"kafka-health (KAFKA_HEALTH_PORT=9095) failed: {health.stdout}{health.stderr}"
    result = docker("run", "--rm", "--network", lab.network, image("services"), "python", "-c", PORT_PROBE,
                    "9095,9092", cluster.broker, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    seen = port_states(result.stdout)
    assert seen == {(cluster.broker, 9095): "open", (cluster.broker, 9092): "ConnectionRefusedError"}, seen


def test_the_topics_tool_and_the_kafka_gate_work_inside_tls_on_services(lab, cluster):
    user, password = cluster.admin
    bootstrap = f"{cluster.broker}:9095"
    spec = json.dumps([{"name": TOPIC, "partitions": 3, "cleanup": "delete"}])
    made = docker("run", "--rm", "-i", "--network", lab.network, *tool_args(cluster),
                  "--env", f"KAFKA_USERNAME={user}", "--env", "KAFKA_PASSWORD_FILE=/dev/stdin", image("services"),
                  "iot-topics", "ensure", "--bootstrap", bootstrap, "--spec", spec, "--replication", "1",
                  "--min-insync", "1", "--wait-seconds", "120", input=password, check=False, timeout=300)
    assert made.returncode == 0, made.stdout + made.stderr
    assert json.loads(made.stdout.splitlines()[-1])["created"] == [TOPIC], made.stdout

    def kafka_topics(*args: str):
        return docker("run", "--rm", "-i", "--network", lab.network, *tool_args(cluster), image("kafka"),
                      "kafka-topics", "--bootstrap-server", bootstrap, "--command-config", "/dev/stdin", *args,
                      input=kafka_client_properties({"user": user, "password": password}, CA), check=False,
                      timeout=300)

    gate = kafka_topics("--describe", "--under-replicated-partitions")
    assert gate.returncode == 0 and gate.stdout.strip() == "", gate.stdout + gate.stderr[-2000:]
    listed = kafka_topics("--list")
    assert TOPIC in listed.stdout.split(), listed.stdout + listed.stderr[-2000:]
