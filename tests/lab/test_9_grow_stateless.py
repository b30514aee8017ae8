"""Adding processing capacity: one more node with stateless_node=true joins site-b with one inventory line and
one playbook run (`scripts/lab add-stateless-node site-b`) while a device publishes. The bridge and the adapter
get one more replica each (stack_*_replicas 0: one per node that may run them), started on the new node; no
running task of the stateful services, the bridge or the adapter restarts; nothing is lost.
This shows where the work goes, not a higher throughput: every lab host shares this machine's two cores.
Not in the smoke: a new host, its images and the deploy take several minutes here."""
from __future__ import annotations

import time

import pytest

from tests.lab.conftest import run_lab
from tests.lab.test_7_grow import assert_counted, publishing_while, running_tasks
from tooling.lab import lab

SITE = "site-b"
STATEFUL = ("zookeeper-1", "kafka-1", "cassandra-1", "mosquitto")
STATELESS = ("bridge", "cassandra-adapter")


def _nodes(manager: lab.LabHost, service: str) -> list[str]:
    out = lab.host_exec(manager, "docker", "service", "ps", f"{SITE}_{service}", "--filter",
                        "desired-state=running", "--format", "{{.Node}}").stdout
    return sorted(out.split())


@pytest.mark.timeout(2700)
def test_a_stateless_node_takes_a_replica_of_the_bridge_and_the_adapter_and_restarts_nothing(lab_hosts, capsys):
    manager = lab.site_managers(lab_hosts)[SITE]
    before = running_tasks(manager, STATEFUL + STATELESS, SITE)
    replicas_before = {s: len(before[s].split(",")) for s in STATELESS}

    started = time.monotonic()
    sensors = publishing_while(manager, SITE, "grow-stateless", lambda: run_lab("add-stateless-node", SITE))
    hosts = lab.existing_hosts()
    new = max((h for h in hosts if h.site == SITE and h.variables.get("stateless_node")), key=lambda h: h.name)
    with capsys.disabled():
        print(f"\nadding {new.name} (stateless_node) to {SITE} took {time.monotonic() - started:.0f}s; "
              f"{len(sensors)} batches published meanwhile")

    manager = lab.site_managers(hosts)[SITE]
    after = running_tasks(manager, STATEFUL + STATELESS, SITE)
    assert {s: after[s] for s in STATEFUL} == {s: before[s] for s in STATEFUL}, "a stateful service restarted"
    for service in STATELESS:
        kept = set(before[service].split(",")) <= set(after[service].split(","))
        assert kept, f"{service}: a running replica was replaced ({before[service]} -> {after[service]})"
        assert len(after[service].split(",")) == replicas_before[service] + 1, after[service]
        assert new.name in _nodes(manager, service), f"{service} has no task on {new.name}"
    assert_counted(manager, SITE, sensors)
