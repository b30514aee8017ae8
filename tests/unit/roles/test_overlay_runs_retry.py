"""A tool run on a site's overlay (`docker run --network ...`) survives a busy Swarm manager: docker's attach
can time out for minutes while a small site's services all start (a CI run's site.yml failed on it), and
every such task either retries that timeout alone or is itself a wait loop that tries again."""
from __future__ import annotations

from pathlib import Path

import yaml

from deploy.swarm import overlay_attach_timed_out
from tests.unit.roles.role_tasks import flat

ROLES = Path(__file__).resolve().parents[3] / "ansible/roles"

# What docker 26 printed in the failed CI run (two sites, the same minute), and what it prints otherwise.
TIMED_OUT = [
    "docker: Error response from daemon: attaching to network failed, make sure your network options are "
    "correct and check manager logs: context deadline exceeded.",
    "docker: Error response from daemon: Could not attach to network iot: context deadline exceeded.",
    "docker: Error response from daemon: Could not attach to network iot: rpc error: code = DeadlineExceeded "
    "desc = context deadline exceeded.",
]
NOT_TRANSIENT = [
    "docker: Error response from daemon: Could not attach to network iot: rpc error: code = PermissionDenied "
    "desc = network iot not manually attachable.",
    "docker: Error response from daemon: network iot not found.",
    "Unable to find image 'iot-stack/services:latest' locally",
    "context deadline exceeded",      # a tool's own timeout, not the attach
]


def test_only_a_timed_out_overlay_attach_counts_as_transient():
    assert all(overlay_attach_timed_out({"rc": 125, "stderr": text}) for text in TIMED_OUT)
    assert not any(overlay_attach_timed_out({"rc": 125, "stderr": text}) for text in NOT_TRANSIENT)
    # The same words from the tool itself (its exit code, not docker's 125) are the tool's failure.
    assert not overlay_attach_timed_out({"rc": 1, "stderr": TIMED_OUT[0]})
    assert not overlay_attach_timed_out({"rc": 0, "stdout": "{}"})
    assert not overlay_attach_timed_out({"skipped": True})     # a task skipped by `when` has no rc


def _overlay_runs() -> list[tuple[str, dict]]:
    """(file: task name, task) of every task whose command runs a container on an overlay: directly, through a
    command list in its own vars, or through one from its role's vars (__topics_tool, __devices_tool)."""
    found = []
    for role in sorted(ROLES.iterdir()):
        role_vars = yaml.safe_load((role / "vars/main.yml").read_text()) if (role / "vars/main.yml").exists() else {}
        # A list, or an expression building one ("{{ ['docker', 'run', ...] + iot_kafka_tool_args + [...] }}").
        runners = [name for name, value in (role_vars or {}).items()
                   if "docker" in str(value) and "'run'" in str(value).replace('"run"', "'run'")
                   and "--network" in str(value)]
        for path in sorted((role / "tasks").glob("*.yml")):
            for task in flat(yaml.safe_load(path.read_text())):
                command = task.get("ansible.builtin.command")
                if command is None:
                    continue
                text = yaml.safe_dump([command, task.get("vars")])   # a command list may sit in the task's vars
                direct = "docker" in text and "run" in text and "--network" in text
                if direct or any(name in text for name in runners):
                    found.append((f"{role.name}/{path.name}: {task['name']}", task))
    return found


def test_every_tool_run_on_the_overlay_tries_again_after_an_attach_timeout():
    runs = _overlay_runs()
    assert len(runs) >= 16, [name for name, _ in runs]
    for name, task in runs:
        until = str(task.get("until", ""))
        assert until and task.get("retries") and task.get("delay"), name
        if "overlay_attach_timed_out" in until:
            register = task["register"]
            assert until == f"not ({register} | overlay_attach_timed_out)", name
            # After the last try the task counts as failed whatever failed_when says; the next task names why.
            assert task.get("ignore_errors") is True and task.get("failed_when") is False, name
        else:
            # A wait loop: an attach timeout is one more failed try, never the loop's success.
            assert name.split(": ", 1)[1].startswith("Wait until"), name
