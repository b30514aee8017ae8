"""CQL over TLS (issue 30) on the real cassandra image, set up as the stacks do (password logins, the
adapter's role): a node takes TLS only, its certificate checked against the site's Cassandra CA; a client in
clear, or one trusting another CA, gets nothing; cqlsh from another container (the health and status
probes) and the tools inside the node (cassandra-health, cassandra-auth-setup) go over TLS; and a node in
an upgrade's first roll (CASSANDRA_CLIENT_TLS=optional) takes both. The adapter's whole suite runs over TLS
too (tests/integration/test_cassandra_adapter.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster, NoHostAvailable
from cryptography.hazmat.primitives.serialization import Encoding

from services.common.cql_tls import cql_tls_context
from tooling.testbed import certs
from tooling.testbed.cassandra_node import TLS_DIR, login_secrets, start_cassandra
from tooling.testbed.docker_lab import docker, image, wait_until

ADAPTER_ROLE, ADAPTER_PASSWORD = "iot_adapter", "adapter-secret-9d1e"
SUPERUSER_PASSWORD = "superuser-secret-42aa"


@pytest.fixture(scope="module")
def node(lab, tmp_path_factory):
    secrets = login_secrets(tmp_path_factory.mktemp("secrets"), SUPERUSER_PASSWORD, ADAPTER_PASSWORD)
    node = start_cassandra(lab, name="cassandra-tls", memory="2g", tls=True, volumes={str(secrets): "/run/secrets:ro"},
                           env={"CASSANDRA_AUTHENTICATOR": "PasswordAuthenticator",
                                "CASSANDRA_PASSWORD_FILE": "/run/secrets/cassandra_password",
                                "CASSANDRA_ADAPTER_ROLE": ADAPTER_ROLE,
                                "CASSANDRA_ADAPTER_PASSWORD_FILE": "/run/secrets/cassandra_adapter_password"})
    # cassandra-auth-setup (over TLS, inside the node) makes the adapter's role once CQL answers.
    wait_until("the adapter's role logs in over TLS",
               lambda: _query(node.host_port, cql_tls_context(node.ca_file), ADAPTER_ROLE, ADAPTER_PASSWORD),
               timeout=240, interval=3, on_timeout=lambda: lab.logs(node.name))
    return node


def _query(port: int, tls, user: str = "", password: str = "", statement: str = "SELECT release_version FROM "
           "system.local") -> list:
    auth = PlainTextAuthProvider(user, password) if user else None
    with Cluster(["127.0.0.1"], port=port, protocol_version=5, connect_timeout=10, auth_provider=auth,
                 ssl_context=tls) as cluster:
        return list(cluster.connect().execute(statement))


def _other_ca_file(tmp_path: Path) -> str:
    _key, cert = certs.ca("some other CA")
    (tmp_path / "other-ca.pem").write_bytes(cert.public_bytes(Encoding.PEM))
    return str(tmp_path / "other-ca.pem")


def test_a_login_over_tls_is_one_the_node_sees_as_tls(node):
    rows = _query(node.host_port, cql_tls_context(node.ca_file), "cassandra", SUPERUSER_PASSWORD,
                  "SELECT username, ssl_enabled, ssl_protocol FROM system_views.clients")
    mine = [row for row in rows if row.username == "cassandra"]
    assert mine and all(row.ssl_enabled and row.ssl_protocol.startswith("TLSv1.") for row in mine), rows


def test_a_client_in_clear_is_refused_before_any_login(node):
    with pytest.raises(NoHostAvailable):
        _query(node.host_port, None, ADAPTER_ROLE, ADAPTER_PASSWORD)


def test_a_client_trusting_another_ca_does_not_send_its_password(node, tmp_path):
    with pytest.raises(NoHostAvailable) as refused:
        _query(node.host_port, cql_tls_context(_other_ca_file(tmp_path)), ADAPTER_ROLE, ADAPTER_PASSWORD)
    assert "certificate verify failed" in str(refused.value)


def test_cqlsh_from_another_container_as_the_health_and_status_probes_run_it(lab, node):
    """ansible/roles/health/tasks/cassandra.yml and roles/status: `cqlsh --ssl` with SSL_CERTFILE, by name."""
    command = ("umask 077; printf '[PlainTextAuthProvider]\\nusername = cassandra\\npassword = %s\\n' "
               f"'{SUPERUSER_PASSWORD}' > /tmp/credentials; "
               f"cqlsh --ssl --credentials /tmp/credentials {node.internal} -e 'SELECT count(*) FROM system.peers_v2'")
    base = ["run", "--rm", "--network", lab.network, "-v", f"{node.tls_dir}:{TLS_DIR}:ro", "--entrypoint", "bash"]
    probe = docker(*base, "-e", f"SSL_CERTFILE={TLS_DIR}/ca.pem", image("cassandra"), "-c", command,
                   check=False, timeout=120)
    assert probe.returncode == 0 and "(1 rows)" in probe.stdout, probe.stdout + probe.stderr
    in_clear = docker(*base, image("cassandra"), "-c", command.replace("cqlsh --ssl", "cqlsh"), check=False,
                      timeout=120)
    assert in_clear.returncode != 0, in_clear.stdout


def test_the_tools_inside_the_node_use_tls(lab, node):
    """cassandra-health (the container's healthcheck and --ring with cqlsh) over the node's own TLS; the
    adapter's role, made by cassandra-auth-setup over TLS, logged in above."""
    health = lab.exec(node.name, "cassandra-health", "--ring")
    assert health.returncode == 0 and "cassandra-health: ok" in health.stdout, health.stdout + health.stderr
    assert "cql_tls=required" in lab.logs(node.name, tail=400)


def test_a_node_in_an_upgrades_first_roll_takes_tls_and_clear(lab):
    """CASSANDRA_CLIENT_TLS=optional (deploy/rollout.py's opening stage): clients still in clear keep writing
    while those on TLS already can."""
    node = start_cassandra(lab, name="cassandra-both", tls=True, env={"CASSANDRA_CLIENT_TLS": "optional"})
    assert _query(node.host_port, None)
    assert _query(node.host_port, cql_tls_context(node.ca_file))
    health = lab.exec(node.name, "cassandra-health")
    assert health.returncode == 0, health.stdout + health.stderr
