"""Cassandra backups on the running lab (docs/operations.md, Backups): each node took a scheduled backup by itself,
`ansible/backup.yml` takes one on demand, and `ansible/restore.yml` brings a table back to exactly the rows it
held at the backup, after rows were added and the table emptied. A missing backup stops the restore before it
changes anything. Runs on site-a (cassandra-1 on site-a-1) with a table of its own."""
from __future__ import annotations

import re
import time

import pytest

from tooling.build import pins
from tooling.lab import lab
from tooling.lab import status as lab_status

# Not in the smoke: about ten minutes on CI's loaded lab (it waits for each node's scheduled backup); the
# backup and restore scripts are covered by tests/integration/test_cassandra_backup.py.

SITE, GROUP = "site-a", "site_a"
TABLE = "iot.backup_probe"
ROWS = 200


def run(inventory, name: str, *extra: str):
    result = lab_status.run_playbook(inventory, "--limit", GROUP, *extra,
                                     playbook=pins.REPO_ROOT / "ansible" / name)
    print(result.stdout[-4000:])
    return result


def count(host) -> int:
    output = lab.cql(host, SITE, f"CONSISTENCY QUORUM; SELECT count(*) FROM {TABLE};")
    match = re.search(r"^\s*(\d+)\s*$", output, re.MULTILINE)
    assert match, output
    return int(match.group(1))


def insert(host, ids: range) -> None:
    statements = " ".join(f"INSERT INTO {TABLE} (id, v) VALUES ({i}, 'row {i}');" for i in ids)
    output = lab.cql(host, SITE, statements)
    assert "rror" not in output, output


@pytest.fixture(scope="module")
def node(lab_hosts):
    host = next(h for h in lab_hosts if h.site == SITE and h.variables.get("cassandra_id") == 1)
    output = lab.cql(host, SITE, f"DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} (id int PRIMARY KEY, v text);")
    assert "rror" not in output, output
    insert(host, range(ROWS))
    assert count(host) == ROWS
    return host


@pytest.fixture(scope="module")
def tag(inventory, node) -> str:
    tag = f"labtest-{time.strftime('%Y%m%dT%H%M%S')}"
    result = run(inventory, "backup.yml", "-e", f"backup_tag={tag}")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert re.search(rf"^\s*- [\"']?{tag}\s", result.stdout, re.MULTILINE), result.stdout[-3000:]
    return tag


def test_every_node_took_a_scheduled_backup_by_itself(inventory, tag):
    listed = run(inventory, "backup.yml", "-e", f"backup_tag={tag}-2").stdout
    assert re.search(r"^\s*- [\"']?auto-\d{8}T\d{6}Z\s", listed, re.MULTILINE), listed[-3000:]


def test_a_missing_backup_stops_the_restore_before_any_change(inventory, node, tag):
    result = run(inventory, "restore.yml", "-e", "backup_restore_tag=nosuch", "-e", "backup_restore_table=backup_probe",
                 "-e", "backup_restore_truncate=true")
    assert result.returncode != 0
    assert "has no complete backup nosuch of iot.backup_probe" in result.stdout, result.stdout[-3000:]
    assert count(node) == ROWS                           # not truncated


def test_restore_gives_back_exactly_the_backed_up_rows(inventory, node, tag):
    insert(node, range(ROWS, ROWS + 50))                 # written after the backup: gone after the restore
    assert count(node) == ROWS + 50
    result = run(inventory, "restore.yml", "-e", f"backup_restore_tag={tag}", "-e", "backup_restore_table=backup_probe",
                 "-e", "backup_restore_truncate=true")
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert count(node) == ROWS
