"""scripts/iot-logs end to end without Docker: deploy.logs.main runs the real ansible/logs.yml against a
throwaway inventory of local hosts (a datacenter and site-a with two nodes) with a fake `docker` on PATH that
prints what Docker 20.10 printed for a restarted service. So the playbook, its names and the printing are
checked here; `docker service logs` itself in the lab (tests/lab/test_2_logs.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from deploy import logs

REPO = Path(__file__).resolve().parents[3]
LOCAL = "ansible_connection=local"
ONE_NODE = "zookeeper_id=1 kafka_id=1 cassandra_id=1 apps_node=true"
INVENTORY = f"""
[datacenter]
dc-1 {LOCAL} swarm_role=manager {ONE_NODE}

[site_a]
site-a-1 {LOCAL} swarm_role=manager {ONE_NODE} mqtt_node=true
site-a-2 {LOCAL} swarm_role=worker kafka_id=2

[edge:children]
site_a
"""
SECRETS = """---
stack_cassandra_password: logs-test-superuser-Kx42
stack_cassandra_adapter_password: logs-test-adapter-Pw93
stack_kafka_operator_password: logs-test-operator-Zq81
stack_kafka_relay_password: logs-test-relay-Hv27
stack_mqtt_users: {bridge: logs-test-bridge-Lm55, mosquitto-agent: logs-test-agent-Lm55}
stack_alert_receivers: [{name: operations, email_configs: [{to: operations@example.com}]}]
"""
# Two tasks of one slot (the first failed, Swarm started the second); a stderr line of the new one.
FAKE_DOCKER = r'''#!/bin/sh
echo "$*" >> "$FAKE_DOCKER_LOG"
case "$1 $2" in
  "service ls") printf 'site-a_bridge\nsite-a_kafka-1\n' ;;
  "service logs")
    echo '2026-11-27T06:57:48.347305130Z site-a_bridge.1.pdwdi48tyjex@site-a-1    | level=info msg="bridge starting"'
    echo '2026-11-27T06:57:32.828888776Z site-a_bridge.1.wqhuo14phqpc@site-a-1    | level=error msg="refused"'
    echo '2026-11-27T06:57:49.000000000Z site-a_bridge.1.pdwdi48tyjex@site-a-1    | Traceback: error on stderr' >&2 ;;
  *) exit 1 ;;
esac
'''


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("logs")
    inventory, fake = root / "inventory", root / "bin"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    fake.mkdir()
    (inventory / "hosts.ini").write_text(INVENTORY)
    (inventory / "group_vars" / "all" / "secrets.yml").write_text(SECRETS)
    (fake / "docker").write_text(FAKE_DOCKER)
    (fake / "docker").chmod(0o755)
    return inventory, fake, root / "docker.log"


def iot_logs(setup, monkeypatch, capsys, *argv: str) -> tuple[int, str, str, list[str]]:
    inventory, fake, log = setup
    log.unlink(missing_ok=True)
    monkeypatch.setenv("PATH", f"{fake}:{Path(sys.executable).parent}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_DOCKER_LOG", str(log))
    monkeypatch.setenv("ANSIBLE_NOCOLOR", "1")
    code = logs.main(["-i", str(inventory), *argv, "--", "-e", "ansible_become=false",
                      "-e", "ansible_python_interpreter=" + sys.executable])
    out, err = capsys.readouterr()
    return code, out, err, log.read_text().splitlines() if log.exists() else []


def test_iot_logs_finds_the_error_lines_of_every_task_oldest_first(setup, monkeypatch, capsys):
    code, out, err, calls = iot_logs(setup, monkeypatch, capsys, "--site", "site-a", "--service", "bridge",
                                     "--since", "10m", "--grep", "ERROR")
    assert code == 0, err
    assert out.splitlines() == [
        '2026-11-27T06:57:32.828888776Z site-a_bridge.1.wqhuo14phqpc@site-a-1 level=error msg="refused"',
        "2026-11-27T06:57:49.000000000Z site-a_bridge.1.pdwdi48tyjex@site-a-1 Traceback: error on stderr"]
    # On the site's manager only, every task's logs since the time asked.
    assert calls == ["service ls --filter label=com.docker.stack.namespace=site-a --format {{.Name}}",
                     "service logs --timestamps --since 10m site-a_bridge"]


def test_json_and_tail_give_the_last_matching_line(setup, monkeypatch, capsys):
    code, out, _, _ = iot_logs(setup, monkeypatch, capsys, "--site", "site-a", "--service", "bridge", "--tail", "1",
                               "--json")
    assert code == 0 and [line["message"] for line in json.loads(out)] == ["Traceback: error on stderr"]


def test_no_matching_line_exits_1(setup, monkeypatch, capsys):
    code, out, _, _ = iot_logs(setup, monkeypatch, capsys, "--site", "site-a", "--service", "bridge",
                               "--grep", "nothing like this")
    assert (code, out) == (1, "")


def test_an_unknown_service_is_named_with_the_sites_services_and_its_logs_are_not_read(setup, monkeypatch, capsys):
    code, _, err, calls = iot_logs(setup, monkeypatch, capsys, "--site", "site-a", "--service", "brige")
    assert code == 2 and "unknown service 'brige' at site-a (services: bridge, kafka-1)" in err
    assert not any(call.startswith("service logs") for call in calls)


def test_an_unknown_site_is_named_with_the_inventorys_sites_and_no_host_is_asked(setup, monkeypatch, capsys):
    code, _, err, calls = iot_logs(setup, monkeypatch, capsys, "--site", "site-z", "--service", "bridge")
    assert code == 2 and "unknown site 'site-z' in this inventory (sites: datacenter, site-a)" in err
    assert calls == []
