"""One invalid host stops the whole site.yml run before any host is changed.

Runs the real `ansible/site.yml` with `ansible-playbook` against a throwaway
inventory: a datacenter and two edge sites, where one host of site-b has a bad
`swarm_role`. Every host points at 127.0.0.1 port 9 over SSH, which refuses the
connection at once: preflight needs no connection (it only sets facts and asserts
on the controller), so the only way a host could be reached is by a later play,
and that attempt can change nothing. Without `any_errors_fatal` on the preflight
play, site-a and the datacenter go on to the engine play (and show up as
unreachable); with it, the run ends after preflight.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent

NOWHERE = "ansible_host=127.0.0.1 ansible_port=9 ansible_user=nobody"
ONE_NODE = "zookeeper_id=1 kafka_id=1 cassandra_id=1 apps_node=true"
INVENTORY = f"""
[datacenter]
dc-1 {NOWHERE} swarm_role=manager {ONE_NODE}

[site_a]
site-a-1 {NOWHERE} swarm_role=manager {ONE_NODE} mqtt_node=true

[site_b]
site-b-1 {NOWHERE} swarm_role=manager {ONE_NODE} mqtt_node=true
site-b-2 {NOWHERE} swarm_role=wroker kafka_id=2

[edge:children]
site_a
site_b
"""
SECRETS = """---
stack_cassandra_password: preflight-test-superuser
stack_cassandra_adapter_password: preflight-test-adapter
stack_kafka_operator_password: preflight-test-operator
stack_kafka_relay_password: preflight-test-relay-7
stack_mqtt_users: {bridge: preflight-test-bridge, mosquitto-agent: preflight-test-agent}
stack_alert_receivers: [{name: operations, email_configs: [{to: operations@example.com}]}]
"""


def _playbook(inventory: Path, *extra: str, playbook: str = "site.yml") -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_TIMEOUT="5", ANSIBLE_LOG_PATH="", ANSIBLE_RETRY_FILES_ENABLED="0",
               PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    command = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "ansible" / playbook), *extra]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> subprocess.CompletedProcess:
    inventory = tmp_path_factory.mktemp("inventory")
    (inventory / "hosts.ini").write_text(INVENTORY)
    (inventory / "group_vars" / "all").mkdir(parents=True)
    (inventory / "group_vars" / "all" / "secrets.yml").write_text(SECRETS)
    return _playbook(inventory)


def _recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines -> {host: {ok: n, changed: n, unreachable: n, failed: n, ...}}."""
    recap = output.split("PLAY RECAP", 1)[1] if "PLAY RECAP" in output else ""
    hosts = {}
    for host, counts in re.findall(r"^(\S+)\s+:\s+(.*)$", recap, re.MULTILINE):
        hosts[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
    return hosts


def test_bad_swarm_role_is_named_with_its_host(run):
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-3000:]
    assert "site-b-2: swarm_role='wroker' must be manager or worker" in output, output[-3000:]


def test_no_play_after_preflight_starts(run):
    output = run.stdout + run.stderr
    plays = re.findall(r"^PLAY \[(.*)\]", output, re.MULTILINE)
    assert plays == ["Preflight"], f"plays that started: {plays}\n{output[-3000:]}"


@pytest.mark.parametrize("host", ["site-a-1", "dc-1"])
def test_hosts_of_valid_sites_are_never_contacted_or_changed(run, host):
    recap = _recap(run.stdout)
    assert host in recap, run.stdout[-3000:]
    assert recap[host].get("changed") == 0 and recap[host].get("unreachable") == 0, \
        f"{host}: {recap[host]} (a later play reached for it)\n{run.stdout[-3000:]}"


@pytest.mark.parametrize("secrets, message", [
    (SECRETS.replace("stack_cassandra_adapter_password: preflight-test-adapter\n", ""),
     "stack_cassandra_adapter_password must be set"),
    (SECRETS.replace("preflight-test-adapter", "preflight-test-superuser"),
     "not the superuser's\n    stack_cassandra_password"),
], ids=["missing", "same-as-superuser"])
def test_adapter_password_is_checked_before_any_host_changes(tmp_path, secrets, message):
    (tmp_path / "hosts.ini").write_text(INVENTORY.replace("swarm_role=wroker", "swarm_role=worker"))
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "secrets.yml").write_text(secrets)
    result = _playbook(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "stack_cassandra_adapter_password" in output, output[-3000:]
    assert re.sub(r"\s+", " ", message) in re.sub(r"\s+", " ", output), output[-3000:]
    assert re.findall(r"^PLAY \[(.*)\]", output, re.MULTILINE) == ["Preflight"]


EXAMPLE_SECRETS = (REPO / "inventory.example/group_vars/all/secrets.yml").read_text()


@pytest.mark.parametrize("secrets, messages", [
    (EXAMPLE_SECRETS,
     ["stack_cassandra_password is a placeholder (it starts with change-me).",
      "stack_cassandra_adapter_password is a placeholder (it starts with change-me).",
      "stack_mqtt_users: the password of user bridge is a placeholder (it starts with change-me).",
      "ansible-vault encrypt_string", "--name vault_cassandra_password", "--name vault_mqtt_bridge_password"]),
    (SECRETS.replace("preflight-test-superuser", "cassandra"),
     ["stack_cassandra_password is shorter than 16 characters."]),
    (SECRETS + "stack_notifier_webhook_url: https://api.telegram.org/bot<token>/sendMessage\n",
     ["stack_notifier_webhook_url is a placeholder.", "--name vault_notifier_webhook_url"]),
], ids=["example-placeholders", "default-password", "webhook-placeholder"])
def test_weak_secrets_are_refused_before_any_host_changes(tmp_path, secrets, messages):
    """Placeholders (inventory.example's as they are), defaults and short secrets end the run in preflight,
    naming the variable and how to create a vaulted value."""
    (tmp_path / "hosts.ini").write_text(INVENTORY.replace("swarm_role=wroker", "swarm_role=worker"))
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "secrets.yml").write_text(secrets)
    result = _playbook(tmp_path)
    output = re.sub(r"\s+", " ", result.stdout + result.stderr)
    assert result.returncode != 0
    for message in messages:
        assert message in output, f"{message!r} not in:\n{(result.stdout + result.stderr)[-3000:]}"
    assert re.findall(r"PLAY \[(.*?)\]", output) == ["Preflight"]


@pytest.mark.parametrize("variables, named", [
    ("stack_cassandra_backup_interval_minutes: daily\n", "stack_cassandra_backup_interval_minutes (daily)"),
    ("stack_cassandra_backup_keep: 0\n", "stack_cassandra_backup_keep (0)"),
    ("stack_alert_receivers: []\n", "stack_alert_receivers is empty: alerts would reach nobody"),
    ("stack_alert_route: {receiver: pager}\n",
     "stack_alert_route.receiver 'pager' is not in stack_alert_receivers (known: operations)"),
], ids=["interval", "keep", "no-alert-receiver", "unknown-alert-receiver"])
def test_a_bad_backup_schedule_or_alert_route_is_named_before_any_host_changes(tmp_path, variables, named):
    (tmp_path / "hosts.ini").write_text(INVENTORY.replace("swarm_role=wroker", "swarm_role=worker"))
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "secrets.yml").write_text(SECRETS + variables)
    result = _playbook(tmp_path)
    output = re.sub(r"\s+", " ", result.stdout + result.stderr)
    assert result.returncode != 0 and named in output, output[-3000:]
    assert re.findall(r"PLAY \[(.*?)\]", output) == ["Preflight"]


def test_restore_without_a_tag_names_the_variables_before_any_host_changes(tmp_path):
    """ansible/restore.yml asserts on the controller: the hosts (nowhere) are never contacted."""
    (tmp_path / "hosts.ini").write_text(INVENTORY.replace("swarm_role=wroker", "swarm_role=worker"))
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "secrets.yml").write_text(SECRETS)
    result = _playbook(tmp_path, "-e", "backup_restore_table=temperature_readings", playbook="restore.yml")
    output = re.sub(r"\s+", " ", result.stdout + result.stderr)
    assert result.returncode != 0 and "-e backup_restore_tag=<tag" in output, output[-3000:]
    assert "got backup_restore_tag= backup_restore_table=temperature_readings" in output, output[-3000:]
    assert "UNREACHABLE" not in output, output[-3000:]


EXAMPLE_SIZES = (REPO / "inventory.example/group_vars/all/sizes.yml").read_text()


@pytest.mark.parametrize("sizes, messages", [
    ("stack_heap: {zookeeper: '-Xmx256m', kafka: '-Xmx1g', cassandra: 4G, mirrormaker: '-Xmx512m'}\n",
     ["stack_heap.cassandra = 4G (4G of heap) does not fit stack_resources.cassandra.memory = 3G",
      "Lower stack_heap.cassandra to 1536M or less, or raise stack_resources.cassandra.memory to 8G or more."]),
    (EXAMPLE_SIZES.replace("---\n", ""), []),
], ids=["cassandra-4G-in-3G", "example-sizes-pass"])
def test_a_heap_too_big_for_its_container_is_refused_before_any_host_changes(tmp_path, sizes, messages):
    """The heaps are checked against the stack role's limits in preflight; inventory.example's sizes pass, so
    the run goes on past preflight (to hosts that cannot be reached here)."""
    (tmp_path / "hosts.ini").write_text(INVENTORY.replace("swarm_role=wroker", "swarm_role=worker"))
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "secrets.yml").write_text(SECRETS + sizes)
    result = _playbook(tmp_path)
    output = re.sub(r"\s+", " ", result.stdout + result.stderr)
    assert result.returncode != 0
    for message in messages:
        assert message in output, f"{message!r} not in:\n{(result.stdout + result.stderr)[-3000:]}"
    plays = re.findall(r"PLAY \[(.*?)\]", output)
    if messages:
        assert plays == ["Preflight"], output[-3000:]
    else:   # past preflight, on to hosts that refuse the connection
        assert plays[:2] == ["Preflight", "Docker engine"], output[-3000:]
