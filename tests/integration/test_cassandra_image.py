"""The cassandra image runs real Cassandra (the version pinned in images/versions.toml): CQL from the host, nodetool,
cqlsh and the healthcheck inside the container, a clean stop on SIGTERM, and
password authentication with the password read from a file.

Tests share one node and run in file order (the stop test stops it); the
authentication test starts its own node afterwards."""

from __future__ import annotations

import datetime as dt

import pytest
from cassandra import AuthenticationFailed
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
from cassandra.policies import DCAwareRoundRobinPolicy

from tooling import pins
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


def test_password_authenticator_replaces_default_password_from_file(lab, tmp_path):
    password_file = tmp_path / "cassandra_password"
    password_file.write_text("not-the-default-7f3a\n")
    password_file.chmod(0o644)  # readable by the container's uid 1000
    port = free_port()
    lab.run(
        "cassandra",
        "cassandra-auth",
        env={
            "CASSANDRA_AUTHENTICATOR": "PasswordAuthenticator",
            "CASSANDRA_PASSWORD_FILE": "/run/secrets/cassandra_password",
            "CASSANDRA_CLUSTER_NAME": "smoke-auth",
            "CASSANDRA_FAST_START": "1",
        },
        ports={port: 9042},
        volumes={str(password_file): "/run/secrets/cassandra_password:ro"},
        memory="2g",
    )

    def login(password: str) -> None:
        auth = PlainTextAuthProvider("cassandra", password)
        with Cluster(["127.0.0.1"], port=port, protocol_version=5, auth_provider=auth, connect_timeout=5) as cluster:
            cluster.connect().execute("SELECT release_version FROM system.local")

    wait_until(
        "login with the password from the file",
        lambda: login("not-the-default-7f3a") is None,
        timeout=240,
        interval=2,
        on_timeout=lambda: lab.logs("cassandra-auth"),
    )
    with pytest.raises(NoHostAvailable) as refused:
        login("cassandra")
    assert any(isinstance(err, AuthenticationFailed) for err in refused.value.errors.values())
    # cqlsh in the container logs in through the credentials file the entrypoint wrote.
    result = lab.exec("cassandra-auth", "cqlsh", "-e", "SELECT release_version FROM system.local")
    assert result.returncode == 0, result.stderr
    assert CASSANDRA_VERSION in result.stdout.split()
