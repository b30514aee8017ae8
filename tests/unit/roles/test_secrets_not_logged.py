"""What must never reach Ansible's output, even with -v, read statically from the roles: the Swarm's join
tokens (a key to the site's Swarm) are only handled by tasks with `no_log: true`; the task that reports a
failed join masks them. And the Spark UIs, which only the overlay reaches, cannot kill a job (issue 30)."""
from __future__ import annotations

from pathlib import Path

import yaml

from tests.unit.roles.role_tasks import flat

REPO = Path(__file__).resolve().parents[3]
SWARM_TASKS = REPO / "ansible/roles/swarm/tasks"


def _tasks() -> list[tuple[str, dict]]:
    return [(f"{path.name}: {task.get('name')}", task) for path in sorted(SWARM_TASKS.glob("*.yml"))
            for task in flat(yaml.safe_load(path.read_text()))]


def test_every_task_that_holds_the_join_tokens_logs_nothing():
    holders = [(name, task) for name, task in _tasks() if "community.docker.docker_swarm" in task
               or "__swarm_tokens" in task.get("ansible.builtin.set_fact", {})]
    assert len(holders) >= 3, [name for name, _ in holders]        # init, share, join
    assert [name for name, task in holders if task.get("no_log") is not True] == []


def test_a_failed_join_is_reported_without_the_tokens():
    (report,) = [task for name, task in _tasks() if "ansible.builtin.fail" in task and "join" in name]
    message = report["ansible.builtin.fail"]["msg"]
    assert "replace(__swarm_tokens.Manager" in message and "replace(__swarm_tokens.Worker" in message


def test_the_spark_uis_cannot_kill_jobs():
    conf = (REPO / "images/spark/conf/spark-defaults.conf").read_text().splitlines()
    settings = dict(line.split(None, 1) for line in conf if line.strip() and not line.startswith("#"))
    assert settings["spark.ui.killEnabled"].strip() == "false"
