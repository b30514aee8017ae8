"""The alert rules of monitoring/: promtool accepts them, each alert fires on the synthetic series of
its fault and stays silent on a healthy site (tests/unit/monitoring/alerts.test.yml), the fleet's
recording rules give one series per figure and site (fleet.test.yml), and every
metric they use is exported by a component (the services' names here, from their own registries;
the JVMs' names by tests/integration/test_metrics.py, which scrapes them)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tooling.build import pins
from tooling.testbed import alert_rules

REPO = pins.REPO_ROOT
RULE_TESTS = Path(__file__).parent / "alerts.test.yml"


def promtool(*args: str) -> subprocess.CompletedProcess:
    # Not skipped when missing: scripts/test installs Debian's prometheus package, which has promtool.
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: apt-get install prometheus (scripts/test installs it)"
    return subprocess.run([tool, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_promtool_accepts_the_rules():
    result = promtool("check", "rules", *map(str, alert_rules.rule_files()))
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_fires_on_its_fault_and_not_on_a_healthy_site():
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_fleet_rules_record_one_series_per_figure_and_site():
    result = promtool("test", "rules", str(RULE_TESTS.with_name("fleet.test.yml")))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_images_default_config(tmp_path):
    config = yaml.safe_load((REPO / "monitoring" / "prometheus.yml").read_text())
    # The image keeps the rules under /etc/prometheus/rules; here they are in the checkout.
    config["rule_files"] = [str(alert_rules.RULES_DIR / "*.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def _rule_tests() -> list[dict]:
    return yaml.safe_load(RULE_TESTS.read_text())["tests"]


def test_every_alert_is_tested_firing_and_silent_when_healthy():
    alerts = {rule["alert"] for rule in alert_rules.rules() if "alert" in rule}
    fired = {case["alertname"] for test in _rule_tests() for case in test.get("alert_rule_test", [])
             if case.get("exp_alerts")}
    healthy = [test for test in _rule_tests() if test["name"].startswith("a healthy site")]
    assert len(healthy) == 1
    silent = {case["alertname"] for case in healthy[0]["alert_rule_test"] if not case.get("exp_alerts")}
    assert alerts - fired == set(), f"alerts no rule test shows firing: {sorted(alerts - fired)}"
    assert alerts - silent == set(), f"alerts the healthy test does not check: {sorted(alerts - silent)}"


@pytest.mark.parametrize("expr, names", [
    ('sum by (site) (rate(kafka_x_total{topic=~"a|b"}[5m])) > 1.2 * sum by (site) (iot_y) + 1',
     {"kafka_x_total", "iot_y"}),
    ('(sum by (site) (zk_s) or (count by (site) (up{job="zookeeper"}) * 0)) < (floor(count(up) / 2) + 1)',
     {"zk_s", "up"}),
    ("changes(process_start_time_seconds[30m]) >= 3", {"process_start_time_seconds"}),
])
def test_metric_names_are_read_from_expressions(expr, names):
    assert alert_rules.metric_names(expr) == names


def test_every_metric_of_the_rules_has_a_known_exporter():
    unknown = alert_rules.names_by_owner().get("unknown", set())
    assert not unknown, f"metrics no component is known to export (tooling/testbed/alert_rules.py OWNERS): {unknown}"


EXPOSITION = """
import sys
from prometheus_client import REGISTRY, generate_latest
import {module}
{state}
sys.stdout.write(generate_latest(REGISTRY).decode())
"""

# The mosquitto-agent exports Mosquitto's figures only while it knows them: connected, $SYS read, the
# plugin's stats answered (the spec's answer, every field), Mosquitto's limits set by the stack.
AGENT_KNOWS_MOSQUITTO = """
from services.mosquitto_agent import metrics, protocol
for topic in metrics.SYS_METRICS:
    metrics.FIGURES.set_sys(topic, b"1")
metrics.FIGURES.set_answer(protocol.parse_answer(
    b'{"ok": true, "command": "stats", "error": "", "devices": 3, "connected": 2, "gate_open": true, "uptime_s": 60,'
    b' "kicked": 0,'
    b' "counters": {"auth_ok": 5, "auth_refused": 1, "gate_refused": 0, "acl_denied_publish": 0,'
    b' "acl_denied_subscribe": 0, "rate_limited": 1, "control": 2, "offences": 1},'
    b' "offences": {"press-7": {"rate_limited": 1}}}'))
metrics.FIGURES.up = lambda: True
metrics.FIGURES.memory_limit, metrics.FIGURES.max_queued_messages = 268435456, 300000
"""


@pytest.mark.parametrize("component, module, state", [
    ("adapter", "services.adapter.metrics", ""),
    ("bridge", "services.bridge.metrics", ""),
    ("mosquitto-agent", "services.mosquitto_agent.metrics", AGENT_KNOWS_MOSQUITTO),
])
def test_the_services_export_every_metric_the_rules_use(component, module, state):
    """The service's real registry, as its /metrics serves it (a fresh interpreter: nothing else registered)."""
    text = subprocess.run([sys.executable, "-c", EXPOSITION.format(module=module, state=state)], cwd=REPO,
                          check=True, capture_output=True, text=True, timeout=60).stdout
    # Families with labels have no sample before their first use, so the names come from # TYPE lines.
    exported = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            exported |= {name, f"{name}_total"} if kind == "counter" else {name}
    used = alert_rules.names_by_owner().get(component, set()) | {"process_start_time_seconds"}
    assert used - exported == set(), f"{component} does not export {sorted(used - exported)}"
