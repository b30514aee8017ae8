"""The cassandra image runs real Cassandra (the version pinned in images/versions.toml): CQL from the host, nodetool,
cqlsh and the healthcheck inside the container, a clean stop on SIGTERM, and
password authentication set up from files: the superuser's password, system_auth
replicated per data center, and the adapter's own role (bin/cassandra-auth-setup).

Tests share one node and run in file order (the stop test stops it); the
authentication test starts its own node afterwards."""

from __future__ import annotations

import datetime as dt

import pytest
from cassandra import AuthenticationFailed, Unauthorized
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.policies import DCAwareRoundRobinPolicy

from tooling.build import pins
from tooling.testbed.cassandra_node import login_secrets
from tooling.testbed.docker_lab import docker, free_port, wait_until

CASSANDRA_VERSION = pins.load().versions["cassandra"]

NODE = "cassandra-1"
DC = "site-a"


@pytest.fixture(scope="module")
def cql_port(lab) -> int:
    port = free_port()
    # CASSANDRA_FAST_START only skips waits a lone node does not need.
    lab.run(
        "cassandra",
        NODE,
        env={
            "CASSANDRA_DC": DC,
            "CASSANDRA_RACK": "rack-1",
            "CASSANDRA_CLUSTER_NAME": "smoke",
            "CASSANDRA_FAST_START": "1",
        },
        ports={port: 9042},
        memory="2g",
    )

    def cql_answers() -> bool:
        with Cluster(["127.0.0.1"], port=port, protocol_version=5, connect_timeout=5) as cluster:
            return cluster.connect().execute("SELECT release_version FROM system.local").one() is not None

    wait_until("cassandra CQL", cql_answers, timeout=240, interval=2, on_timeout=lambda: lab.logs(NODE))
    return port


@pytest.fixture(scope="module")
def session(cql_port):
    profile = ExecutionProfile(load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=DC))
    cluster = Cluster(
        ["127.0.0.1"], port=cql_port, protocol_version=5, execution_profiles={EXEC_PROFILE_DEFAULT: profile}
    )
    yield cluster.connect()
    cluster.shutdown()


def test_cassandra_writes_and_reads_rows_over_cql(session):
    session.execute(f"CREATE KEYSPACE smoke WITH replication = {{'class': 'NetworkTopologyStrategy', '{DC}': 1}}")
    session.execute("""CREATE TABLE smoke.readings (
        site text, sensor_id text, day date, ts timestamp, temperature double,
        PRIMARY KEY ((site, sensor_id, day), ts))""")
    insert = session.prepare(
        "INSERT INTO smoke.readings (site, sensor_id, day, ts, temperature) VALUES (?, ?, ?, ?, ?)"
    )
    day = dt.date(2026, 1, 2)
    start = dt.datetime(2026, 1, 2, 8, 0, tzinfo=dt.UTC)
    written = {(f"s{i % 4}", start + dt.timedelta(seconds=i)): 20.0 + i / 10 for i in range(100)}
    for (sensor, ts), temperature in written.items():
        session.execute(insert, ("site-a", sensor, day, ts, temperature))

    select = session.prepare("SELECT ts, temperature FROM smoke.readings WHERE site = ? AND sensor_id = ? AND day = ?")
    read = {}
    for sensor in ("s0", "s1", "s2", "s3"):
        for row in session.execute(select, ("site-a", sensor, day)):
            read[(sensor, row.ts.replace(tzinfo=dt.UTC))] = row.temperature
    assert read == written
    assert session.execute("SELECT count(*) FROM smoke.readings").one()[0] == 100
    replication = session.execute("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = 'smoke'").one()
    assert replication.replication[DC] == "1"


def test_nodetool_status_shows_the_node_up_normal_in_its_dc(lab, cql_port):
    result = lab.exec(NODE, "nodetool", "status")
    assert result.returncode == 0, result.stderr
    assert f"Datacenter: {DC}" in result.stdout
    assert any(line.startswith("UN ") for line in result.stdout.splitlines()), result.stdout


def test_cqlsh_in_the_container_reports_the_pinned_release(lab, cql_port):
    result = lab.exec(NODE, "cqlsh", "-e", "SELECT release_version FROM system.local")
    assert result.returncode == 0, result.stderr
    assert CASSANDRA_VERSION in result.stdout.split()


def test_cassandra_health_passes_on_a_running_node(lab, cql_port):
    result = lab.exec(NODE, "cassandra-health")
    assert result.returncode == 0, result.stdout + result.stderr
    ring = lab.exec(NODE, "cassandra-health", "--ring")     # + nodetool UN and cqlsh
    assert ring.returncode == 0, ring.stdout + ring.stderr


def test_cassandra_health_fails_while_cql_is_disabled(lab, cql_port):
    assert lab.exec(NODE, "nodetool", "disablebinary").returncode == 0
    try:
        result = lab.exec(NODE, "cassandra-health")
        assert result.returncode == 1, result.stdout + result.stderr
        assert "does not answer CQL" in result.stdout
    finally:
        assert lab.exec(NODE, "nodetool", "enablebinary").returncode == 0
    wait_until(
        "cassandra-health after enablebinary", lambda: lab.exec(NODE, "cassandra-health").returncode == 0, timeout=60
    )


def test_sigterm_drains_and_stops_cassandra_cleanly(lab, cql_port):
    lab.stop(NODE)  # docker stop: SIGTERM via tini, SIGKILL after 20 s
    logs = lab.logs(NODE, tail=20)
    assert "Cassandra shutdown complete" in logs, logs
    exit_code = docker("inspect", "-f", "{{.State.ExitCode}}", f"{lab.network}-{NODE}").stdout.strip()
    assert exit_code == "143", f"expected the JVM's SIGTERM exit (143), got {exit_code}"


AUTH_NODE = "cassandra-auth"
AUTH_DC = "site-b"
SUPERUSER_PASSWORD = "not-the-default-7f3a"
ADAPTER_ROLE, ADAPTER_PASSWORD = "iot_adapter", "adapter-secret-51c2"


@pytest.fixture(scope="module")
def auth_port(lab, tmp_path_factory) -> int:
    """A node with PasswordAuthenticator, set up as the stacks do: superuser password, system_auth
    replication and the adapter's role (bin/cassandra-auth-setup)."""
    secrets = login_secrets(tmp_path_factory.mktemp("secrets"), SUPERUSER_PASSWORD, ADAPTER_PASSWORD)
    port = free_port()
    lab.run(
        "cassandra",
        AUTH_NODE,
        env={
            "CASSANDRA_AUTHENTICATOR": "PasswordAuthenticator",
            "CASSANDRA_PASSWORD_FILE": "/run/secrets/cassandra_password",
            "CASSANDRA_REPLICATION": f"{AUTH_DC}:3",   # capped at its one node
            "CASSANDRA_ADAPTER_ROLE": ADAPTER_ROLE,
            "CASSANDRA_ADAPTER_PASSWORD_FILE": "/run/secrets/cassandra_adapter_password",
            "CASSANDRA_DC": AUTH_DC,
            "CASSANDRA_CLUSTER_NAME": "smoke-auth",
            "CASSANDRA_FAST_START": "1",
        },
        ports={port: 9042},
        volumes={str(secrets): "/run/secrets:ro"},
        memory="2g",
    )
    # The set-up changes the superuser's password before it creates the adapter's role, but a login
    # right after the change may still meet the old password in the node's credentials cache
    # (credentials_validity, 2 s), so the fixture waits for both logins (CI once failed all three tests).
    for what, user, password in (("the adapter's role", ADAPTER_ROLE, ADAPTER_PASSWORD),
                                 ("the superuser with its new password", "cassandra", SUPERUSER_PASSWORD)):
        wait_until(
            f"{what} logs in",
            lambda user=user, password=password: _login(port, user, password) is None,
            timeout=240,
            interval=2,
            on_timeout=lambda: lab.logs(AUTH_NODE),
        )
    return port


def _session(port: int, user: str, password: str):
    auth = PlainTextAuthProvider(user, password)
    profile = ExecutionProfile(load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=AUTH_DC))
    cluster = Cluster(["127.0.0.1"], port=port, protocol_version=5, auth_provider=auth, connect_timeout=5,
                      execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    return cluster, cluster.connect()


def _login(port: int, user: str, password: str) -> None:
    cluster, session = _session(port, user, password)
    try:
        session.execute("SELECT release_version FROM system.local")
    finally:
        cluster.shutdown()


def test_password_authenticator_replaces_default_password_from_file(lab, auth_port):
    _login(auth_port, "cassandra", SUPERUSER_PASSWORD)
    with pytest.raises(NoHostAvailable) as refused:
        _login(auth_port, "cassandra", "cassandra")
    assert any(isinstance(err, AuthenticationFailed) for err in refused.value.errors.values())
    # cqlsh in the container logs in through the credentials file the entrypoint wrote.
    result = lab.exec(AUTH_NODE, "cqlsh", "-e", "SELECT release_version FROM system.local")
    assert result.returncode == 0, result.stderr
    assert CASSANDRA_VERSION in result.stdout.split()


def test_system_auth_is_replicated_per_datacenter(auth_port):
    cluster, session = _session(auth_port, "cassandra", SUPERUSER_PASSWORD)
    try:
        row = session.execute("SELECT replication FROM system_schema.keyspaces "
                              "WHERE keyspace_name = 'system_auth'").one()
    finally:
        cluster.shutdown()
    assert dict(row.replication) == {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy", AUTH_DC: "1"}


def test_adapter_role_creates_its_keyspace_and_writes_but_is_no_superuser(auth_port):
    cluster, admin = _session(auth_port, "cassandra", SUPERUSER_PASSWORD)
    admin.execute(f"CREATE KEYSPACE IF NOT EXISTS other WITH replication = {{'class': 'NetworkTopologyStrategy', "
                  f"'{AUTH_DC}': 1}}")
    cluster.shutdown()
    cluster, session = _session(auth_port, ADAPTER_ROLE, ADAPTER_PASSWORD)
    try:
        # What the adapter does at start (services/adapter/cassandra.py schema_statements), then a write and a read.
        session.execute(f"CREATE KEYSPACE IF NOT EXISTS iot WITH replication = {{'class': 'NetworkTopologyStrategy', "
                        f"'{AUTH_DC}': 1}}")
        session.execute("CREATE TABLE IF NOT EXISTS iot.t (k text PRIMARY KEY, v int)")
        session.execute("INSERT INTO iot.t (k, v) VALUES ('a', 1)")
        assert session.execute("SELECT v FROM iot.t WHERE k = 'a'").one().v == 1
        for statement in ("CREATE ROLE intruder WITH PASSWORD = 'x' AND LOGIN = true", "DROP KEYSPACE other",
                          "SELECT * FROM system_auth.roles"):
            with pytest.raises(Unauthorized):
                session.execute(statement)
    finally:
        cluster.shutdown()


def test_restart_changes_nothing(lab, auth_port):
    docker("restart", "-t", "30", f"{lab.network}-{AUTH_NODE}")
    wait_until(
        "the set-up after the restart",
        lambda: "nothing changed" in lab.logs(AUTH_NODE, tail=400).split("Starting listening for CQL clients")[-1],
        timeout=300,
        interval=3,
        on_timeout=lambda: lab.logs(AUTH_NODE, tail=200),
    )
    _login(auth_port, ADAPTER_ROLE, ADAPTER_PASSWORD)
