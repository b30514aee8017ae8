"""`ansible-playbook -i INVENTORY ansible/status.yml` against the running lab: one row per site with the
figures of a deployment that takes readings (docs/operations.md, "Status of a deployment"), and a run that
changes nothing. By now test_2_end_to_end has published readings and a hot sensor's events at every site,
and the lab's simulated devices publish 20 readings/s per site."""
from __future__ import annotations

import re

import pytest

from deploy.status import status_table
from tooling.lab import status as lab_status

# Not in the smoke: the playbook took about five minutes on CI's loaded lab; without a lab,
# tests/unit/roles/test_status_playbook.py runs the same playbook against a fake docker.

CONVERGED = re.compile(r"^(\d+)/(\d+)$")


@pytest.fixture(scope="module")
def run(inventory):
    return lab_status.run_report(inventory)


@pytest.fixture(scope="module")
def rows(run) -> dict[str, dict]:
    result, report = run
    assert report is not None, "the status run wrote no JSON report:\n" + (result.stdout + result.stderr)[-5000:]
    print(status_table(report))
    return lab_status.rows_by_site(report)


def test_the_status_run_succeeds_and_changes_nothing(run, lab_hosts):
    result, _ = run
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    recap = lab_status.recap(result.stdout)
    assert set(recap) >= {h.name for h in lab_hosts}, output[-3000:]
    assert {host: counts for host, counts in recap.items()
            if counts.get("changed") or counts.get("failed") or counts.get("unreachable")} == {}, recap


def test_one_row_per_site_in_the_lab(rows, lab_hosts):
    assert set(rows) == {h.site for h in lab_hosts}, rows
    assert list(rows)[-1] == "datacenter", rows
    # The JSON's rows have every column (to_nice_json sorts their keys: the table takes its order from `columns`).
    assert all(set(row) == set(lab_status.COLUMNS) for row in rows.values()), rows


def test_every_edge_site_takes_readings_stores_them_and_relays_its_events(rows):
    edge = {site: row for site, row in rows.items() if site != "datacenter"}
    assert edge, rows
    for site, row in edge.items():
        assert float(row["readings/s"]) > 0, (site, row)             # the simulator publishes 20/s
        assert int(row["readings in kafka"]) > 0, (site, row)
        assert int(row["adapter lag"]) >= 0, (site, row)
        assert int(row["events"]) > 0, (site, row)                   # test_2_end_to_end's hot sensor, the fleet's
        assert int(row["relay lag"]) >= 0, (site, row)
        assert int(row["cassandra readings"]) > 0, (site, row)
        assert int(row["cassandra events"]) >= 0, (site, row)
    assert int(rows["datacenter"]["cassandra events"]) > 0, rows["datacenter"]


def test_every_sites_services_are_converged(rows):
    for site, row in rows.items():
        match = CONVERGED.match(row["services converged"])
        assert match and match.group(1) == match.group(2) and int(match.group(2)) > 0, (site, row)
