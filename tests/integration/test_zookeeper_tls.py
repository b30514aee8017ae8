"""ZooKeeper as a stack runs it (ansible/roles/stack/templates/stack-services.j2): clients over TLS only, on 2182
with the server's certificate of the site's ZooKeeper CA, and only with the brokers' login (SASL). The broker
starts on it (its SCRAM bootstrap and its session over TLS, logged in), `secure-zookeeper` locks the znodes over
TLS as the stack role runs it, nothing answers in clear from the network (2181 is on the server's loopback
only, for its healthcheck), a client over TLS without the login is refused, and the health role's `srvr`
probe reads the server's mode over TLS, checking the certificate and the name it dialled."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from tooling.testbed.docker_lab import docker, image
from tooling.testbed.kafka_cluster import (
    PORT_PROBE,
    port_states,
    secure_zookeeper,
    start_kafka_cluster,
    zookeeper_tls_client,
)

REPO = Path(__file__).resolve().parents[2]
CA = "/run/zookeeper_ca.pem"       # iot_zookeeper_tool_ca (ansible/group_vars/all/main.yml)


@pytest.fixture(scope="module")
def cluster(lab):
    return start_kafka_cluster(lab, prefix="zktls-", operator=("operator", f"op-{uuid.uuid4().hex}"),
                               internal=False, zookeeper_tls=True)


def tool_args(cluster) -> list[str]:
    """iot_zookeeper_tool_args: the ZooKeeper CA mounted read-only, named by KAFKA_ZOOKEEPER_CA_FILE."""
    return ["--mount", f"type=bind,source={cluster.pki}/zookeeper-ca.crt,target={CA},readonly",
            "--env", f"KAFKA_ZOOKEEPER_CA_FILE={CA}"]


def test_zookeeper_answers_over_tls_only_and_the_broker_runs_on_it(lab, cluster):
    result = docker("run", "--rm", "--network", lab.network, image("services"), "python", "-c", PORT_PROBE,
                    "2182,2181", cluster.zookeeper, check=False, timeout=120)
    assert result.returncode == 0, result.stderr
    assert port_states(result.stdout) == {(cluster.zookeeper, 2182): "open",
                                          (cluster.zookeeper, 2181): "ConnectionRefusedError"}, result.stdout
    health = lab.exec(cluster.zookeeper, "zookeeper-health")          # the loopback's port, in clear
    assert health.returncode == 0, lab.logs(cluster.zookeeper)
    # The broker registered (start_kafka_cluster waited for it): it reached ZooKeeper over TLS, logged in.
    properties = lab.exec(cluster.broker, "cat", "/opt/kafka/run/server.properties").stdout
    assert "zookeeper.ssl.client.enable=true" in properties.splitlines()
    assert f"zookeeper.connect={cluster.zookeeper}:2182" in properties.splitlines()


def test_a_client_over_tls_without_the_login_is_refused(lab, cluster):
    """Before: a client without the login read every znode but the credentials and could create its own."""
    shell = docker("run", "--rm", "--network", lab.network, *tool_args(cluster), image("kafka"),
                   "java", *zookeeper_tls_client(CA), "-server", f"{cluster.zookeeper}:2182", "ls", "/brokers/ids",
                   check=False, timeout=180)
    output = shell.stdout + shell.stderr
    assert "SyncConnected" in output, output[-3000:]                 # the TLS handshake passed (CA and name)
    assert "client failed to authenticate" in output, output[-3000:]
    assert "[1]" not in shell.stdout, output[-3000:]


def test_secure_zookeeper_runs_over_tls_as_the_stack_role_runs_it(lab, cluster):
    output = secure_zookeeper(lab, cluster)          # the broker's environment: 2182 and the ZooKeeper CA
    assert "Exception" not in output, output[-3000:]


def test_the_health_roles_srvr_probe_reads_the_mode_over_tls(lab, cluster):
    """The probe as ansible/roles/health/vars/main.yml writes it, for a site of one server (zookeeper-1, here the
    test's server by that name too: its certificate names both)."""
    from jinja2 import Environment

    script = yaml.safe_load((REPO / "ansible/roles/health/vars/main.yml").read_text())["__health_zookeeper_srvr"]
    rendered = Environment().from_string(script).render(iot_topology={"zookeeper": [{"id": 1}]})
    address = docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                     f"{lab.network}-{cluster.zookeeper}").stdout.strip()

    def probe(*ca: str) -> str:
        return docker("run", "--rm", "--network", lab.network, "--add-host", f"zookeeper-1:{address}", *ca,
                      image("kafka"), "bash", "-c", rendered, check=False, timeout=120).stdout.strip()

    assert probe(*tool_args(cluster)) == "1 standalone"
    # Another CA's server (here: the brokers CA, which the server was not issued from) gets no answer read.
    other = ["--mount", f"type=bind,source={cluster.pki}/brokers-ca.crt,target={CA},readonly",
             "--env", f"KAFKA_ZOOKEEPER_CA_FILE={CA}"]
    assert probe(*other) == "1", "srvr was read from a server whose certificate the probe's CA did not issue"
