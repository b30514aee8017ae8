"""Every site's and the datacenter's Alertmanager, as the lab deploys it: its published port answers
only the operator's login over TLS (the monitoring certificate), its Prometheus sends to it over the
overlay (HTTPS and the login), the lab's webhook receiver listens and logs what it gets, and (slow) a broker
stopped at site-a gives exactly one notification at that receiver (tooling/lab/lab.py start_alert_receiver)
and one resolution once it is back.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
import yaml

from tests.lab.test_2_monitoring import _apps_nodes, _get, _query
from tooling.lab import lab
from tooling.testbed.docker_lab import wait_until

SITES = ["site-a", "site-b", "datacenter"]


@pytest.fixture(scope="module")
def apps(lab_hosts):
    return {site: lab.host_ip(host) for site, host in _apps_nodes(lab_hosts).items()}


@pytest.mark.smoke
@pytest.mark.parametrize("site", SITES)
def test_alertmanager_answers_only_the_operator_over_tls(apps, site):
    port = 9093          # stack_alertmanager_port's default
    assert _get(site, apps[site], "/-/ready", login=False, port=port)[0] == 401
    with pytest.raises(urllib.error.URLError):      # plain HTTP is refused: the port speaks only TLS
        urllib.request.urlopen(f"http://{apps[site]}:{port}/-/ready", timeout=10).read()
    status, body = _get(site, apps[site], "/api/v2/status", port=port)
    assert status == 200
    config = yaml.safe_load(json.loads(body)["config"]["original"])
    assert [r["name"] for r in config["receivers"]] == ["lab-webhook"], config["receivers"]


@pytest.mark.smoke
@pytest.mark.parametrize("site", SITES)
def test_prometheus_sends_its_alerts_to_its_alertmanager_over_tls(apps, site):
    active: list = []

    def found() -> bool:
        status, body = _get(site, apps[site], "/api/v1/alertmanagers")
        active[:] = json.loads(body)["data"]["activeAlertmanagers"] if status == 200 else []
        return bool(active)

    wait_until(f"{site}: an active Alertmanager in Prometheus", found, timeout=120, interval=5)
    assert [a["url"] for a in active] and all(a["url"].startswith("https://") for a in active), active


@pytest.mark.smoke
@pytest.mark.slow       # about 10 minutes: the rule's 2 minutes, the group wait, the broker's restart
def test_a_stopped_broker_notifies_once_and_resolves(apps, lab_hosts):
    receiver = lab.alert_log()
    manager = lab.site_managers(lab_hosts)["site-a"]
    try:
        lab.host_exec(manager, "docker", "service", "scale", "-d", "site-a_kafka-2=0")
        stopped = time.monotonic()
        wait_until("a KafkaBrokerDown notification from site-a",
                   lambda: [n for n in receiver.about("KafkaBrokerDown", "firing")
                            if n["commonLabels"].get("site") == "site-a"],
                   timeout=480, interval=5, on_timeout=lambda: json.dumps(receiver.notifications)[-3000:])
        print(f"KafkaBrokerDown notified {time.monotonic() - stopped:.0f}s after the broker stopped")
    finally:
        lab.host_exec(manager, "docker", "service", "scale", "-d", "site-a_kafka-2=1")
    try:
        wait_until("the KafkaBrokerDown resolution from site-a",
                   lambda: receiver.about("KafkaBrokerDown", "resolved"), timeout=600, interval=5,
                   on_timeout=lambda: json.dumps(receiver.notifications)[-3000:])
        firing = receiver.about("KafkaBrokerDown", "firing")
        assert len(firing) == 1, f"{len(firing)} notifications of one stopped broker: {firing}"
        assert len(receiver.about("KafkaBrokerDown", "resolved")) == 1
        assert _query("site-a", apps["site-a"], 'up{job="kafka"} == 0') == []
    finally:
        receiver.close()


@pytest.mark.smoke
def test_the_labs_receiver_listens_and_logs_each_notification():
    """The lab's stand-in for a person's pager (lab.start_alert_receiver) runs for the lab's whole life, so an
    idle lab's notifications do not fail; what it gets, the tests read from its log."""
    host, port = lab.lab_alert_receiver_address()
    log = lab.alert_log()
    marker = f"LabReceiverCheck-{time.time_ns()}"
    note = {"status": "firing", "alerts": [{"labels": {"alertname": marker}}]}
    request = urllib.request.Request(f"http://{host}:{port}/alerts", data=json.dumps(note).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200
    assert [n["alerts"][0]["labels"]["alertname"] for n in log.about(marker)] == [marker]
