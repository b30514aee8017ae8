"""Alerts reach a person: a broker that stops answering raises KafkaBrokerDown in the real prometheus
image (the rules of monitoring/), the image's Alertmanager, configured by deploy.alerting as the stack
role configures it, sends exactly one notification to a local webhook receiver, and one resolution once
the broker is back; a second webhook that nobody answers is counted as failing
(alertmanager_notifications_failed_total, which AlertNotificationsFailing reads).

The broker is a stand-in that answers scrapes (the node exporter, named kafka-1 in a `kafka` job):
what the rule reads is only whether the scrape answers. Alertmanager's timers are shortened (group
wait 5 s, group interval 15 s); the rule keeps its own `for: 2m`. About 4 minutes.
"""
from __future__ import annotations

import json
import time
import urllib.request

import pytest
import yaml

from deploy.alerting import alertmanager_config
from tests.integration.test_metrics import prometheus_query
from tooling.testbed.alert_receiver import AlertReceiver
from tooling.testbed.docker_lab import docker, free_port, wait_until

SITE = "site-a"


def _gateway(network: str) -> str:
    return docker("network", "inspect", "-f", "{{range .IPAM.Config}}{{.Gateway}}{{end}}", network).stdout.strip()


@pytest.fixture(scope="module")
def monitoring(lab, tmp_path_factory):
    receiver = AlertReceiver(_gateway(lab.network), free_port())
    config_dir = tmp_path_factory.mktemp("monitoring")
    config_dir.chmod(0o755)
    # A second webhook nobody answers (a closed port): its failures are counted for AlertNotificationsFailing,
    # and they do not hold the first one back.
    unanswered = f"http://{_gateway(lab.network)}:{free_port()}/"
    receivers = [{"name": "operations", "webhook_configs": [{"url": receiver.url, "send_resolved": True},
                                                             {"url": unanswered, "send_resolved": True}]}]
    am_config = alertmanager_config(receivers, {"group_wait": "5s", "group_interval": "15s"})
    (config_dir / "alertmanager.yml").write_text(yaml.safe_dump(am_config))
    prometheus = {
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s", "external_labels": {"site": SITE}},
        "rule_files": ["/etc/prometheus/rules/*.yml"],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": ["alertmanager:9093"]}]}]},
        "scrape_configs": [
            {"job_name": "kafka", "static_configs": [{"targets": ["kafka-1:9100"], "labels": {"site": SITE}}]},
            {"job_name": "alertmanager", "static_configs": [
                {"targets": ["alertmanager:9093"], "labels": {"site": SITE}}]}],
    }
    (config_dir / "prometheus.yml").write_text(yaml.safe_dump(prometheus))
    for path in config_dir.iterdir():
        path.chmod(0o644)
    ports = {"prometheus": free_port(), "alertmanager": free_port()}
    try:
        lab.run("node-exporter", "kafka-1", memory="64m")
        lab.run("prometheus", "alertmanager", "prometheus-alertmanager",
                "--config.file=/etc/iot-test/alertmanager.yml", "--storage.path=/var/lib/alertmanager",
                "--cluster.listen-address=", memory="128m", ports={ports["alertmanager"]: 9093},
                volumes={str(config_dir): "/etc/iot-test:ro"})
        lab.run("prometheus", "prometheus", memory="512m", ports={ports["prometheus"]: 9090},
                env={"PROMETHEUS_CONFIG": "/etc/iot-test/prometheus.yml"},
                volumes={str(config_dir): "/etc/iot-test:ro"})
        yield receiver, ports
    finally:
        receiver.close()


def _alertmanager_status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/status", timeout=10) as resp:
        return json.load(resp)


def test_the_role_config_loads_with_its_inhibit_rules(lab, monitoring):
    _, ports = monitoring
    status: dict = {}

    def answered() -> bool:
        status.update(_alertmanager_status(ports["alertmanager"]))
        return True

    wait_until("Alertmanager's API", answered, timeout=120, interval=2, on_timeout=lambda: lab.logs("alertmanager"))
    loaded = yaml.safe_load(status["config"]["original"])
    assert [r["name"] for r in loaded["receivers"]] == ["operations"]
    assert loaded["route"]["group_by"] == ["alertname", "site"]
    assert any(rule["source_matchers"] == ["alertname=\"KafkaBrokerDown\""] for rule in loaded["inhibit_rules"])


def test_a_stopped_broker_gives_one_notification_and_one_resolution(lab, monitoring):
    receiver, ports = monitoring
    wait_until("the stand-in broker scraped", lambda: prometheus_query(ports["prometheus"], 'up{job="kafka"} == 1'),
               timeout=120, interval=3, on_timeout=lambda: lab.logs("prometheus"))
    assert receiver.notifications == [], "a healthy site notified something"
    lab.stop("kafka-1")
    stopped = time.monotonic()
    wait_until("a KafkaBrokerDown notification", lambda: receiver.about("KafkaBrokerDown", "firing"),
               timeout=300, interval=3,
               on_timeout=lambda: f"{receiver.notifications}\n{lab.logs('prometheus')}\n{lab.logs('alertmanager')}")
    fired_after = time.monotonic() - stopped
    (firing,) = receiver.about("KafkaBrokerDown", "firing")
    (alert,) = firing["alerts"]
    assert alert["labels"]["site"] == SITE and alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["summary"] == f"Kafka broker kafka-1:9100 of {SITE} does not answer scrapes"
    # Two more group intervals: still one notification, no repeat.
    time.sleep(35)
    assert len(receiver.about("KafkaBrokerDown")) == 1, receiver.notifications

    docker("start", f"{lab.network}-kafka-1")
    wait_until("the KafkaBrokerDown resolution", lambda: receiver.about("KafkaBrokerDown", "resolved"),
               timeout=180, interval=3, on_timeout=lambda: f"{receiver.notifications}\n{lab.logs('alertmanager')}")
    assert len(receiver.about("KafkaBrokerDown", "firing")) == 1
    assert len(receiver.about("KafkaBrokerDown", "resolved")) == 1
    assert [n["status"] for n in receiver.notifications] == ["firing", "resolved"], receiver.notifications
    # What AlertNotificationsFailing reads, as Prometheus scraped it from the real Alertmanager.
    wait_until("the unanswered webhook's failures counted",
               lambda: prometheus_query(ports["prometheus"],
                                        'alertmanager_notifications_failed_total{integration="webhook"} > 0'),
               timeout=120, interval=3, on_timeout=lambda: lab.logs("alertmanager"))
    print(f"KafkaBrokerDown notified {fired_after:.0f}s after the broker stopped (rule: for 2m)")
