"""bin/cassandra-backup on a real node: a backup is a complete copy that survives TRUNCATE and DROP TABLE and
restores the exact rows; the schedule takes `auto-` backups by itself and keeps the newest N, never the
manual ones. Tests share one node and run in file order."""
from __future__ import annotations

import re
import time

import pytest

from tooling.testbed.cassandra_node import start_cassandra
from tooling.testbed.docker_lab import wait_until

ROWS = 300


@pytest.fixture(scope="module")
def node(lab):
    # CQL over TLS, as at a site: the backups' cqlsh in the container goes through it.
    node = start_cassandra(lab, tls=True, env={
        "CASSANDRA_ADAPTER_KEYSPACE": "iot", "CASSANDRA_BACKUP_INTERVAL_MINUTES": "1", "CASSANDRA_BACKUP_KEEP": "1",
        "CASSANDRA_BACKUP_CHECK_SECONDS": "5"})
    session = node.session()
    session.execute("CREATE KEYSPACE iot WITH replication = {'class': 'NetworkTopologyStrategy', 'dc1': 1}")
    session.execute("CREATE TABLE iot.probe (id int PRIMARY KEY, v text)")
    insert = session.prepare("INSERT INTO iot.probe (id, v) VALUES (?, ?)")
    for i in range(ROWS):
        session.execute(insert, (i, f"row {i}"))
    session.cluster.shutdown()
    return node


def backup(lab, node, *args: str):
    result = lab.exec(node.name, "cassandra-backup", *args, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def count(node) -> int:
    session = node.session()
    try:
        return session.execute("SELECT count(*) FROM iot.probe").one()[0]
    finally:
        session.cluster.shutdown()


def listed(lab, node) -> dict[str, str]:
    """tag -> its line in `cassandra-backup list`."""
    return {line.split()[0]: line for line in backup(lab, node, "list").stdout.splitlines()}


def test_take_copies_the_keyspace_and_clears_its_snapshot(lab, node):
    assert backup(lab, node, "take", "before").stdout.strip() == "before"
    line = listed(lab, node)["before"]
    assert "  1 tables  " in line, line
    files = lab.exec(node.name, "ls", "/var/lib/cassandra-backups/before/iot/probe").stdout.split()
    assert "schema.cql" in files and "manifest.json" in files and any(f.endswith("-Data.db") for f in files), files
    snapshots = lab.exec(node.name, "nodetool", "listsnapshots", timeout=120).stdout
    assert "before" not in snapshots, snapshots             # the copy stays, the hard links in the data dir go


def test_a_tag_is_never_overwritten_and_a_bad_one_is_refused(lab, node):
    again = lab.exec(node.name, "cassandra-backup", "take", "before")
    assert again.returncode == 2 and "exists already" in again.stderr, again.stderr
    bad = lab.exec(node.name, "cassandra-backup", "take", "../etc")
    assert bad.returncode == 2 and "letters, digits" in bad.stderr, bad.stderr


def test_restore_after_truncate_gives_back_exactly_the_backed_up_rows(lab, node):
    session = node.session()
    session.execute("INSERT INTO iot.probe (id, v) VALUES (100000, 'after the backup')")
    session.cluster.shutdown()
    backup(lab, node, "truncate", "iot", "probe")
    assert count(node) == 0
    backup(lab, node, "restore", "before", "iot", "probe")
    assert count(node) == ROWS


def test_restore_recreates_a_dropped_table_from_the_backups_schema(lab, node):
    session = node.session()
    session.execute("DROP TABLE iot.probe")
    session.cluster.shutdown()
    backup(lab, node, "schema", "before", "iot", "probe")
    backup(lab, node, "restore", "before", "iot", "probe")
    assert count(node) == ROWS
    backup(lab, node, "restore", "before", "iot", "probe")     # the copy is kept: it restores again
    assert count(node) == ROWS


def test_a_missing_backup_or_table_is_named(lab, node):
    missing = lab.exec(node.name, "cassandra-backup", "restore", "nosuch", "iot", "probe")
    assert missing.returncode == 2 and "no complete backup 'nosuch'" in missing.stderr, missing.stderr
    table = lab.exec(node.name, "cassandra-backup", "schema", "before", "iot", "nosuch")
    assert table.returncode == 2 and "has no table iot.nosuch" in table.stderr, table.stderr


def test_the_schedule_takes_auto_backups_and_keeps_the_newest_only(lab, node):
    auto = re.compile(r"^auto-\d{8}T\d{6}Z$")
    seen: set[str] = set()

    def pruned_once() -> bool:
        tags = listed(lab, node)
        seen.update(t for t in tags if auto.match(t))
        return len(seen) >= 2 and sum(1 for t in tags if auto.match(t)) == 1

    started = time.monotonic()
    wait_until("a second auto backup replacing the first", pruned_once, timeout=200, interval=5,
               on_timeout=lambda: lab.logs(node.name))
    assert "before" in listed(lab, node)                      # manual backups are never pruned
    print(f"two auto backups seen after {time.monotonic() - started:.0f} s: {sorted(seen)}")
