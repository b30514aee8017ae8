"""Growing a site's Cassandra: one more node joins site-b with one inventory line and one playbook run
(`scripts/lab add-cassandra site-b`) while a device publishes. The running Cassandra node, ZooKeeper,
Kafka and Mosquitto keep their tasks; the new node bootstraps, raises system_auth and the adapter's
keyspace to min(nodes, 3) replicas and repairs them; nothing is lost. The proof that the rows written
before the join are on the new node: with the first node out of gossip and CQL for a moment, the new
node alone counts every batch (while replicas = nodes, every node holds every row). Then the node
retires (`scripts/lab retire-cassandra site-b`): decommissioned, its host gone, every batch still counted.
Not in the smoke: a new host, its images and the deploy take several minutes here."""
from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.lab.conftest import run_lab
from tests.lab.test_2_end_to_end import rows, wait_for
from tests.lab.test_7_grow import BATCH, assert_counted, batch_day, publishing_while, running_tasks
from tooling.lab import lab

SITE = "site-b"
STATEFUL = ("zookeeper-1", "kafka-1", "mosquitto")     # and every Cassandra node already there


def _service(node: int) -> str:
    """A `docker ps` filter for exactly cassandra-<node>'s containers (a name filter also matches cassandra-<node>0)."""
    return f"label=com.docker.swarm.service.name={SITE}_cassandra-{node}"


def _run_in_container(host: lab.LabHost, node: int, *command: str) -> subprocess.CompletedProcess:
    script = f"docker exec $(docker ps -q -f {_service(node)} | head -1) " + " ".join(command)
    return lab.host_exec(host, "bash", "-c", script, check=False, timeout=120)


def _in_container(host: lab.LabHost, node: int, *command: str) -> str:
    return _run_in_container(host, node, *command).stdout


def _replication(manager: lab.LabHost) -> dict[str, int]:
    out = {}
    for keyspace, replication in rows(manager, SITE, "SELECT keyspace_name, replication FROM "
                                      "system_schema.keyspaces WHERE keyspace_name IN ('system_auth', 'iot');"):
        match = re.search(rf"'{SITE}': '(\d+)'", replication)
        out[keyspace] = int(match[1]) if match else 0
    return out


def _counts(host: lab.LabHost, node: int, sensors: list[tuple[str, int]]) -> list[int]:
    """Every batch's row count read through cassandra-<node> at consistency ONE, in one cqlsh run, logged
    in as the adapter's role: Cassandra reads the default superuser `cassandra` at QUORUM, which a
    two-node site without one node lacks; other roles at LOCAL_ONE (auth_read_consistency_level)."""
    credentials = f"[PlainTextAuthProvider]\nusername = iot_adapter\npassword = {lab.secret('cassandra_adapter')}\n"
    container = f"$(docker ps -q -f {_service(node)} | head -1)"
    written = subprocess.run(["docker", "exec", "-i", host.container, "bash", "-c",
                              f"docker exec -i {container} bash -c 'umask 077; cat > /tmp/adapter.credentials'"],
                             input=credentials, text=True, capture_output=True, timeout=60)
    assert written.returncode == 0, written.stderr
    statements = ["CONSISTENCY ONE"]
    for sensor, start_ms in sensors:
        day = batch_day(start_ms)
        statements.append(f"SELECT count(*) FROM iot.temperature_readings "
                          f"WHERE site='{SITE}' AND sensor_id='{sensor}' AND day='{day}'")
    result = _run_in_container(host, node, "cqlsh", "--credentials", "/tmp/adapter.credentials", "-e",
                               f'"{"; ".join(statements)};"')
    assert result.returncode == 0, f"cqlsh through cassandra-{node}: {result.stderr[-500:]}"
    lines = result.stdout.splitlines()
    return [int(lines[i + 1].strip()) for i, line in enumerate(lines[:-1])
            if line.strip() and set(line.strip()) <= set("-+") and lines[i + 1].strip().isdigit()]


@pytest.mark.timeout(2700)
def test_a_new_cassandra_node_bootstraps_takes_every_row_and_restarts_no_other(lab_hosts, capsys):
    manager = lab.site_managers(lab_hosts)[SITE]
    nodes_before = lab.role_ids(lab_hosts, SITE, "cassandra")
    stateful = STATEFUL + tuple(f"cassandra-{n}" for n in nodes_before)
    tasks_before = running_tasks(manager, stateful, SITE)

    started = time.monotonic()
    sensors = publishing_while(manager, SITE, "grow-cassandra", lambda: run_lab("add-cassandra", SITE))
    new = nodes_before[-1] + 1
    with capsys.disabled():
        print(f"\nadding cassandra-{new} to {SITE} (new host, site.yml --limit datacenter,site_b) took "
              f"{time.monotonic() - started:.0f}s; {len(sensors)} batches of {BATCH} published meanwhile")

    hosts = lab.existing_hosts()
    manager = lab.site_managers(hosts)[SITE]
    new_host = next(h for h in hosts if h.site == SITE and h.variables.get("cassandra_id") == new)
    first_host = next(h for h in hosts if h.site == SITE and h.variables.get("cassandra_id") == 1)
    assert running_tasks(manager, stateful, SITE) == tasks_before, "a running stateful service was restarted"
    assert running_tasks(manager, (f"cassandra-{new}",), SITE)[f"cassandra-{new}"], "the new node runs"

    replicas = min(len(nodes_before) + 1, 3)
    assert _replication(manager) == {"system_auth": replicas, "iot": replicas}
    repaired = wait_for(f"cassandra-{new}'s repair of iot", lambda: _in_container(
        new_host, new, "cat", "/var/lib/cassandra/iot.repaired").strip(), timeout=600)
    assert repaired == f"{SITE}:{replicas}"
    logs = lab.host_exec(new_host, "bash", "-c",
                         f"docker logs $(docker ps -q -f {_service(new)} | head -1) 2>&1",
                         check=False).stdout
    assert "joining the running cluster through it, not as a seed" in logs
    assert "JOINING: Starting to bootstrap" in logs

    assert_counted(manager, SITE, sensors)

    if replicas < len(nodes_before) + 1:
        return      # beyond three nodes no node holds every row; the rest was checked above
    # cassandra-1 out of gossip and CQL for a moment (well inside its healthcheck's 150 s of grace):
    # the new node then coordinates alone and must hold every batch itself.
    for command in ("disablebinary", "disablegossip"):
        _in_container(first_host, 1, "nodetool", command)
    try:
        wait_for("the new node to see cassandra-1 down",
                 lambda: "DN " in _in_container(new_host, new, "nodetool", "status"), timeout=60, interval=2)
        counts = _counts(new_host, new, sensors)
    finally:
        for command in ("enablegossip", "enablebinary"):
            _in_container(first_host, 1, "nodetool", command)
    assert counts == [BATCH] * len(sensors)


@pytest.mark.timeout(2700)
def test_the_highest_cassandra_node_retires_with_its_rows_handed_over_and_restarts_no_other(lab_hosts, capsys):
    """After the test above (or on a lab where `scripts/lab add-cassandra site-b` ran): `scripts/lab
    retire-cassandra site-b` sets cassandra_retire=true on the highest node and runs site.yml (the health role
    decommissions it), then runs site.yml without it and lets its host go, while a device publishes. The other
    stateful services keep their tasks, both keyspaces have min(nodes that stay, 3) replicas, the ring has only
    the nodes that stay, all up, and every batch is counted (docs/operations.md, "Removing a Cassandra node
    from a site")."""
    manager = lab.site_managers(lab_hosts)[SITE]
    nodes_before = lab.role_ids(lab_hosts, SITE, "cassandra")
    if len(nodes_before) < 2:
        pytest.skip(f"{SITE} has one Cassandra node; run the test above (add-cassandra) first")
    leaving = nodes_before[-1]
    staying = tuple(f"cassandra-{n}" for n in nodes_before[:-1])
    tasks_before = running_tasks(manager, STATEFUL + staying, SITE)

    started = time.monotonic()
    sensors = publishing_while(manager, SITE, "retire-cassandra", lambda: run_lab("retire-cassandra", SITE))
    with capsys.disabled():
        print(f"\nretiring cassandra-{leaving} from {SITE} (two site.yml runs, its host out) took "
              f"{time.monotonic() - started:.0f}s; {len(sensors)} batches of {BATCH} published meanwhile")

    hosts = lab.existing_hosts()
    manager = lab.site_managers(hosts)[SITE]
    first_host = next(h for h in hosts if h.site == SITE and h.variables.get("cassandra_id") == 1)
    assert lab.role_ids(hosts, SITE, "cassandra") == nodes_before[:-1]
    assert running_tasks(manager, STATEFUL + staying, SITE) == tasks_before, "a running stateful service restarted"
    services = lab.host_exec(manager, "docker", "service", "ls", "--format", "{{.Name}}", check=False).stdout
    assert f"{SITE}_cassandra-{leaving}" not in services.split()
    replicas = min(len(nodes_before) - 1, 3)
    assert _replication(manager) == {"system_auth": replicas, "iot": replicas}
    ring = [line for line in _in_container(first_host, 1, "nodetool", "status").splitlines()
            if line[:3] in ("UN ", "DN ", "UJ ", "UL ", "DL ", "UM ")]
    assert len(ring) == len(nodes_before) - 1 and all(line.startswith("UN ") for line in ring), ring
    assert_counted(manager, SITE, sensors)
