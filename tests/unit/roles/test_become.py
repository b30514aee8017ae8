"""A non-root SSH user with passwordless sudo deploys as root does: every step that changes a node becomes root.

Read statically from ansible/: each play that reaches the nodes sets `become: true`; a task turns become off
only on the controller (delegate_to: localhost); the image stream, an SSH connection of its own that
Ansible's become does not reach, runs `docker load` through `sudo -n` for a user other than root.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from tests.unit.roles.role_tasks import flat

REPO = Path(__file__).resolve().parents[3]
# Plays that only assert and set facts on the controller: they never connect to a node.
CONTROLLER_ONLY = {"Preflight", "Check the site to remove before anything changes"}


def _plays() -> list[tuple[str, dict]]:
    plays = []
    for path in sorted((REPO / "ansible").glob("*.yml")):
        plays += [(path.name, p) for p in yaml.safe_load(path.read_text()) or [] if "hosts" in p]
    return plays


def _role_tasks() -> list[tuple[str, dict]]:
    roles = REPO / "ansible/roles"
    files = sorted(roles.glob("*/tasks/*.yml")) + sorted(roles.glob("*/handlers/*.yml"))
    return [(str(f.relative_to(REPO)), t) for f in files for t in flat(yaml.safe_load(f.read_text()))]


@pytest.mark.parametrize("playbook, play", _plays(), ids=lambda v: v if isinstance(v, str) else v["name"])
def test_every_play_that_reaches_the_nodes_becomes_root(playbook, play):
    if play["name"] in CONTROLLER_ONLY:
        assert "become" not in play and not play.get("gather_facts", True), f"{playbook}: {play['name']}"
        return
    assert play.get("become") is True, f"{playbook}: play {play['name']!r} changes nodes without become: true"


def test_only_tasks_on_the_controller_turn_become_off():
    offenders = [f"{path}: {task.get('name')}" for path, task in _role_tasks()
                 if task.get("become") is False and task.get("delegate_to") != "localhost"]
    assert not offenders, "tasks that run on a node without root:\n" + "\n".join(offenders)


def _stream_command(**host) -> str:
    (task,) = [t for path, t in _role_tasks() if path.endswith("images/tasks/load.yml") and "ssh" in
               str(t.get("ansible.builtin.shell", ""))]
    variables = {"images_prefix": "iot-stack", "images_tag": "1", "item": {"item": "kafka"},
                 "inventory_hostname": "n1", **host}
    templar = Templar(loader=DataLoader(), variables=variables)
    return " ".join(templar.template(trust_as_template(task["ansible.builtin.shell"])).split())


@pytest.mark.parametrize("user, load", [(None, "n1 docker load -q"), ("root", "@n1 docker load -q"),
                                        ("deploy", "deploy@n1 sudo -n docker load -q")])
def test_the_image_stream_loads_through_sudo_for_a_non_root_user(user, load):
    command = _stream_command(**({"ansible_user": user} if user else {}))
    assert command.endswith(load), command
