"""A second Cassandra node joins a running one and holds every row: the cassandra image's
part of adding a node to a site (docs/operations.md, "Adding a Cassandra node").

Both nodes get the settings the stacks give them whatever the node count: the seeds
cassandra-1,cassandra-2,cassandra-3 (only some exist) and CASSANDRA_REPLICATION site-a:3.
cassandra-2 starts without data while cassandra-1 runs, so its entrypoint takes it off
its seed list and it bootstraps; its cassandra-auth-setup then raises system_auth and the
adapter's keyspace from 1 to 2 replicas (the nodes it sees) and repairs both. The proof
that the rows written before the join are on the new node: with cassandra-1 out of
gossip and CQL, every row and the adapter's login are served by cassandra-2 alone.

Both nodes run as at a site, with CQL over TLS and mutual TLS between them (issue 30), each with a
certificate of one Cassandra CA: the join, the repair and the reads below all cross that link, and every
link either node opened is encrypted; a peer in clear, or one without a certificate, is cut off. Last,
cassandra-2 dies with its disk and a fresh one replaces it, which then retires (decommission) for good.
"""
from __future__ import annotations

import re

import pytest
from cassandra import ConsistencyLevel
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import WhiteListRoundRobinPolicy
from cassandra.query import BatchStatement

from services.common.cql_tls import cql_tls_context
from tooling.testbed import certs
from tooling.testbed.cassandra_node import TLS_DIR, login_secrets, make_tls_dir
from tooling.testbed.docker_lab import docker, free_port, wait_until

DC = "site-a"
SUPERUSER_PASSWORD = "join-superuser-secret"
ADAPTER_ROLE = "iot_adapter"
ADAPTER_PASSWORD = "join-adapter-secret"
ROWS = 2000
CA = certs.ca("iot-stack test cassandra CA of the join")
TLS = {name: make_tls_dir(name, CA) for name in ("cassandra-1", "cassandra-2")}
CA_FILE = str(TLS["cassandra-1"] / "ca.pem")


def _start(lab, secrets, name: str, fast: bool) -> int:
    port = free_port()
    lab.run("cassandra", name, env={
        "CASSANDRA_CLUSTER_NAME": "join",
        "CASSANDRA_SEEDS": "cassandra-1,cassandra-2,cassandra-3",      # as the stacks render it
        "CASSANDRA_DC": DC,
        "CASSANDRA_RACK": f"rack-{name[-1]}",
        "CASSANDRA_HEAP": "512M",
        "CASSANDRA_AUTHENTICATOR": "PasswordAuthenticator",
        "CASSANDRA_PASSWORD_FILE": "/run/secrets/cassandra_password",
        "CASSANDRA_REPLICATION": f"{DC}:3",
        "CASSANDRA_ADAPTER_ROLE": ADAPTER_ROLE,
        "CASSANDRA_ADAPTER_PASSWORD_FILE": "/run/secrets/cassandra_adapter_password",
        "CASSANDRA_FAST_START": "1" if fast else "0",
        "CASSANDRA_TLS_KEYSTORE_FILE": f"{TLS_DIR}/keystore.pem",
        "CASSANDRA_TLS_CA_FILE": f"{TLS_DIR}/ca.pem",
        "CASSANDRA_INTERNODE_TLS": "required",
    }, ports={port: 9042}, volumes={str(secrets): "/run/secrets:ro", str(TLS[name]): f"{TLS_DIR}:ro"},
        memory="1536m")
    return port


def _session(port: int, user: str, password: str, consistency=ConsistencyLevel.LOCAL_ONE):
    """A session that only ever talks to the node published on `port` as its coordinator."""
    profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy(["127.0.0.1"]),
                               consistency_level=consistency, request_timeout=30)
    cluster = Cluster(["127.0.0.1"], port=port, protocol_version=5, connect_timeout=10,
                      auth_provider=PlainTextAuthProvider(user, password),
                      execution_profiles={EXEC_PROFILE_DEFAULT: profile}, ssl_context=cql_tls_context(CA_FILE))
    return cluster, cluster.connect()


def _counted_through(port: int) -> int:
    """Every row, read at ONE through the node published on `port` as the adapter's role."""
    cluster, session = _session(port, ADAPTER_ROLE, ADAPTER_PASSWORD, ConsistencyLevel.ONE)
    try:
        return sum(session.execute("SELECT COUNT(*) FROM iot.readings WHERE sensor = %s",
                                   (f"sensor-{sensor}",)).one()[0] for sensor in range(ROWS // 100))
    finally:
        cluster.shutdown()


def _counted_by_cassandra_2_alone(lab, port: int) -> int:
    """_counted_through cassandra-2 while cassandra-1 is out of gossip and CQL: to cassandra-2 it is down, so
    cassandra-2 coordinates and answers alone."""
    for command in ("disablebinary", "disablegossip"):
        result = lab.exec("cassandra-1", "nodetool", command)
        assert result.returncode == 0, result.stderr
    try:
        wait_until("cassandra-2 sees cassandra-1 down",
                   lambda: "DN " in lab.exec("cassandra-2", "nodetool", "status").stdout, timeout=120, interval=3)
        return _counted_through(port)
    finally:
        for command in ("enablegossip", "enablebinary"):
            lab.exec("cassandra-1", "nodetool", command)


def _ring(lab, name: str) -> list[str]:
    """The node lines of `nodetool status` on `name` (state and address first: UN, DN, UJ, ...)."""
    status = lab.exec(name, "nodetool", "status").stdout
    return [line for line in status.splitlines() if line[:3] in ("UN ", "DN ", "UJ ", "UL ", "DL ", "UM ")]


def _logs_say(lab, name: str, text: str) -> bool:
    return text in lab.logs(name, tail=2000)


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    return login_secrets(tmp_path_factory.mktemp("secrets"), SUPERUSER_PASSWORD, ADAPTER_PASSWORD)


@pytest.fixture(scope="module")
def joined(lab, secrets):
    first = _start(lab, secrets, "cassandra-1", fast=True)
    wait_until("cassandra-1's adapter role", lambda: _logs_say(lab, "cassandra-1", "changed: GRANT CREATE"),
               timeout=300, interval=3, on_timeout=lambda: lab.logs("cassandra-1"))

    def adapter_writes() -> bool:
        cluster, session = _session(first, ADAPTER_ROLE, ADAPTER_PASSWORD)
        try:
            # What the adapter does at start: its keyspace with the replication of a one-node site.
            session.execute(f"CREATE KEYSPACE IF NOT EXISTS iot WITH replication = "
                            f"{{'class': 'NetworkTopologyStrategy', '{DC}': 1}}")
            session.execute("CREATE TABLE IF NOT EXISTS iot.readings (sensor text, seq int, value double, "
                            "PRIMARY KEY (sensor, seq))")
            insert = session.prepare("INSERT INTO iot.readings (sensor, seq, value) VALUES (?, ?, ?)")
            for sensor in range(ROWS // 100):
                batch = BatchStatement()
                for seq in range(100):
                    batch.add(insert, (f"sensor-{sensor}", seq, float(seq)))
                session.execute(batch)
        finally:
            cluster.shutdown()
        return True

    wait_until("the adapter's role writes", adapter_writes, timeout=120, interval=3)
    second = _start(lab, secrets, "cassandra-2", fast=False)
    wait_until("cassandra-2 joins and repairs", lambda: _logs_say(lab, "cassandra-2", "repaired iot on this node"),
               timeout=600, interval=5, on_timeout=lambda: lab.all_logs(tail=120))
    return first, second


def test_the_new_node_bootstraps_instead_of_joining_as_a_seed(lab, joined):
    assert _logs_say(lab, "cassandra-2", "cassandra-1 answers: joining the running cluster through it, not as a seed")
    assert _logs_say(lab, "cassandra-2", "JOINING: Starting to bootstrap")        # Cassandra's own word for it
    assert not _logs_say(lab, "cassandra-1", "joining the running cluster"), "the first node formed the cluster"
    assert not _logs_say(lab, "cassandra-1", "Starting to bootstrap")
    status = lab.exec("cassandra-2", "nodetool", "status")
    assert status.returncode == 0, status.stderr
    assert sum(line.startswith("UN ") for line in status.stdout.splitlines()) == 2, status.stdout


def test_every_link_between_the_nodes_is_mutual_tls(lab, joined):
    """Cassandra logs each link it opens to a peer with its encryption (OutboundConnection: "... successfully
    connected, ..., encryption = encrypted(...)" or "unencrypted")."""
    for name in ("cassandra-1", "cassandra-2"):
        logs = lab.logs(name, tail=5000)
        assert "internode_tls=required" in logs
        links = [line for line in logs.splitlines() if "successfully connected" in line]
        assert links, f"{name} logged no link to its peer"
        assert all("encryption = encrypted(" in line for line in links), links


# Run inside cassandra-2 (python3 is in the image for cqlsh): what cassandra-1's port 7000 does with a peer in
# clear (the first five bytes of a handshake: Cassandra's magic number; a node taking clear waits for the
# rest) and with a TLS client that has no certificate. Prints one word per case.
PROBE = r"""
import socket, ssl, sys
ca = sys.argv[1]
plain = socket.create_connection(("cassandra-1", 7000), timeout=10)
plain.sendall(bytes.fromhex("ca552dfa00"))
try:
    print("clear:", "cut-off" if plain.recv(1024) == b"" else "answered")
except socket.timeout:
    print("clear: waited")
except ConnectionError:
    print("clear: cut-off")
context = ssl.create_default_context(cafile=ca)
context.check_hostname = False
try:
    with context.wrap_socket(socket.create_connection(("cassandra-1", 7000), timeout=10)) as tls:
        tls.sendall(bytes.fromhex("ca552dfa00000000"))
        print("no-certificate:", "cut-off" if tls.recv(1024) == b"" else "answered")
except (ssl.SSLError, ConnectionError) as err:
    print("no-certificate: refused", type(err).__name__)
except socket.timeout:
    print("no-certificate: waited")
"""


def test_a_peer_in_clear_or_without_a_certificate_is_cut_off(lab, joined):
    result = lab.exec("cassandra-2", "python3", "-c", PROBE, f"{TLS_DIR}/ca.pem", timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert "clear: cut-off" in lines, result.stdout
    assert any(line.startswith("no-certificate: refused") or line == "no-certificate: cut-off"
               for line in lines), result.stdout


def test_both_keyspaces_are_raised_to_the_nodes_there_are(joined):
    _, second = joined
    cluster, session = _session(second, "cassandra", SUPERUSER_PASSWORD)
    try:
        rows = {r.keyspace_name: dict(r.replication) for r in session.execute(
            "SELECT keyspace_name, replication FROM system_schema.keyspaces "
            "WHERE keyspace_name IN ('system_auth', 'iot')")}
    finally:
        cluster.shutdown()
    nts = "org.apache.cassandra.locator.NetworkTopologyStrategy"
    assert rows == {"system_auth": {"class": nts, DC: "2"}, "iot": {"class": nts, DC: "2"}}


def test_the_new_node_alone_serves_every_row_and_the_adapters_login(lab, joined):
    _, second = joined
    assert _counted_by_cassandra_2_alone(lab, second) == ROWS


def test_a_dead_node_on_new_hardware_takes_its_place_and_every_row(lab, secrets, joined):
    """Last in the module: cassandra-2 dies with its disk (container and volume gone), and a fresh cassandra-2
    starts with the same settings, as the stack starts `cassandra-<id>` on the host that replaces the dead one.
    Its entrypoint finds its rack in cassandra-1's peers and replaces the dead node (replace_address_first_boot)
    instead of bootstrapping as a third node; the ring then has two nodes, both up, and the new node alone
    serves every row (docs/operations.md, "Replacing a dead node")."""
    dead = lab.exec("cassandra-1", "getent", "hosts", "cassandra-2").stdout.split()[0]
    lab.rm("cassandra-2")
    wait_until("cassandra-1 sees cassandra-2 down",
               lambda: re.search(rf"^DN\s+{re.escape(dead)}\s", lab.exec("cassandra-1", "nodetool", "status").stdout,
                                 re.MULTILINE), timeout=120, interval=3)
    second = _start(lab, secrets, "cassandra-2", fast=False)
    wait_until("the new cassandra-2 replaces the dead one", lambda: "UN " in _own_line(lab), timeout=600,
               interval=5, on_timeout=lambda: lab.all_logs(tail=120))
    assert _logs_say(lab, "cassandra-2", f"lists {dead} in {DC}/rack-2, this node's place, and this node has no data")
    nodes = _ring(lab, "cassandra-1")
    assert len(nodes) == 2 and all(line.startswith("UN ") for line in nodes), nodes
    assert _counted_by_cassandra_2_alone(lab, second) == ROWS


def _own_line(lab) -> str:
    """cassandra-2's own line in its `nodetool status` (the ring as the new node sees itself)."""
    address = lab.exec("cassandra-2", "hostname", "-i").stdout.split()[0]
    status = lab.exec("cassandra-2", "nodetool", "status").stdout
    return next((line for line in status.splitlines() if f" {address} " in line), "")


def test_a_retiring_node_hands_its_rows_over_then_idles_healthy(lab, joined):
    """After the replacement above: cassandra-2 leaves the ring as the health role retires a node with
    cassandra_retire=true (`cassandra-decommission 1`, the replicas that stay). Both keyspaces go down to one
    replica first, the node streams its ranges to cassandra-1, which then alone holds every row; the node's
    container, restarted, idles and counts as healthy instead of failing to start for good
    (docs/operations.md, "Removing a Cassandra node from a site")."""
    first, _ = joined
    result = lab.exec("cassandra-2", "cassandra-decommission", "1", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"system_auth from 2 to 1 replicas in {DC}" in result.stdout, result.stdout
    assert f"iot from 2 to 1 replicas in {DC}" in result.stdout, result.stdout
    nodes = _ring(lab, "cassandra-1")
    assert len(nodes) == 1 and nodes[0].startswith("UN "), nodes
    assert _counted_through(first) == ROWS
    again = lab.exec("cassandra-2", "cassandra-decommission", "1")
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
    docker("restart", "-t", "30", f"{lab.network}-cassandra-2", timeout=180)
    wait_until("the decommissioned node idles after a restart",
               lambda: _logs_say(lab, "cassandra-2", "(cassandra-decommission); idle until the stack"), timeout=120)
    health = lab.exec("cassandra-2", "cassandra-health")
    assert health.returncode == 0 and "decommissioned at" in health.stdout, health.stdout
    assert lab.exec("cassandra-2", "cassandra-health", "--ring").returncode == 1
