"""`scripts/iot-logs` against the running lab (docs/operations.md, "Logs"): an error line in a bridge's log is
found from the controller with the lab's inventory, and still after Swarm replaced the container that wrote it.

The line is written into the bridge container's own stdout (PID 1's, the stream Docker logs), in the bridge's
key=value form: no lab fault is needed to make the bridge log at error level."""
from __future__ import annotations

import subprocess
import time
import uuid

import pytest

from tooling.lab import chaos, lab

REPO = lab.pins.REPO_ROOT
# site-a (two nodes: the line is found on whichever runs the bridge) in the smoke; site-b, the same again on one
# node, only in the whole lab suite: each case is an ansible-playbook run, 112 s on a loaded lab (CI, 2026-11-29).
EDGE_SITES = ["site-a", pytest.param("site-b", marks=pytest.mark.slow)]


def write_error_line(site: str, hosts) -> tuple[chaos.Lab, str, str]:
    """An error line in one running bridge container's log -> (the lab, that container, the line's marker)."""
    lb = chaos.Lab(hosts)
    host, container = lb.container(site, "bridge")
    marker = f"iot-logs-lab-{uuid.uuid4().hex[:8]}-{site}"      # one per line: each test finds its own
    line = f'level=error service=bridge msg="lab marker for iot-logs" marker={marker}'
    # As the image's user, PID 1's own: root in the container may not open another user's /proc/1/fd.
    lab.host_exec(host, "docker", "exec", container, "sh", "-c", f"echo '{line}' > /proc/1/fd/1")
    return lb, container, marker


def iot_logs(inventory, site: str, *args: str, service: str = "bridge") -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "scripts" / "iot-logs"), "-i", str(inventory), "--site", site,
                           "--service", service, *args], cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.smoke
@pytest.mark.parametrize("site", EDGE_SITES)
def test_iot_logs_finds_a_bridge_error_line(lab_hosts, inventory, site):
    _, _, marker = write_error_line(site, lab_hosts)
    result = iot_logs(inventory, site, "--since", "10m", "--grep", f"ERROR.*marker={marker}")
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and "level=error" in lines[0] and f"{site}_bridge." in lines[0], result.stdout


def test_iot_logs_names_the_known_services_for_an_unknown_one(lab_hosts, inventory):
    result = iot_logs(inventory, "site-a", service="brige")
    assert result.returncode == 2 and "unknown service 'brige' at site-a" in result.stderr, result.stderr
    assert "bridge" in result.stderr.split("services:", 1)[1], result.stderr


@pytest.mark.smoke
@pytest.mark.slow       # kills a bridge replica: Swarm restarts it after its restart delay
def test_a_bridge_error_line_survives_the_container_being_killed_and_replaced(lab_hosts, inventory):
    lb, container, marker = write_error_line("site-a", lab_hosts)
    tasks_before = lb.restarts("site-a", "bridge")
    lb.kill("site-a", "bridge")
    deadline = time.monotonic() + 180
    while lb.restarts("site-a", "bridge") <= tasks_before or not _running(lb, "site-a", "bridge"):
        assert time.monotonic() < deadline, "Swarm did not start a new bridge task within 180 s"
        time.sleep(3)
    result = iot_logs(inventory, "site-a", "--since", "15m", "--grep", f"marker={marker}")
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    (line,) = result.stdout.splitlines()
    # The line comes from the killed container's task, which Swarm keeps (swarm_task_history_limit).
    running = lab.host_exec(lb.host("site-a"), "docker", "service", "ps", "-q", "--filter", "desired-state=running",
                            "site-a_bridge").stdout.split()
    task = line.split(" ", 2)[1].split("@")[0].rsplit(".", 1)[1]
    assert task not in running, (line, running, container)


def _running(lb: chaos.Lab, site: str, service: str) -> bool:
    try:
        lb.container(site, service)
    except RuntimeError:
        return False
    return True
