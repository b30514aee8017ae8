"""deploy.alerting: the Alertmanager configuration the stack role renders, and preflight's refusals."""
from __future__ import annotations

import re

from deploy.alerting import DEFAULT_INHIBIT_RULES, alert_receiver_refusals, alertmanager_config
from tooling.testbed import alert_rules

OPS = {"name": "operations", "email_configs": [{"to": "ops@example.com"}]}
PAGER = {"name": "pager", "webhook_configs": [{"url": "https://pager.example.com/hook"}]}


def test_no_receiver_is_refused_naming_the_variable():
    (refusal,) = alert_receiver_refusals([])
    assert refusal.startswith("stack_alert_receivers is empty: alerts would reach nobody")
    assert alert_receiver_refusals(None) == [refusal]


def test_a_receiver_without_a_name_or_a_way_to_reach_someone_is_refused():
    refusals = alert_receiver_refusals([{"email_configs": [{"to": "a@b.c"}]}, {"name": "mute"}, OPS, OPS])
    assert refusals[0] == "stack_alert_receivers[0] has no `name` (docs/operations.md, Alerts)"
    assert refusals[1].startswith("stack_alert_receivers[1] (mute) reaches nobody")
    assert refusals[2] == "stack_alert_receivers[3]: the name 'operations' is used twice; names must be unique"
    assert len(refusals) == 3


def test_a_route_to_an_unknown_receiver_is_refused_at_any_depth():
    route = {"receiver": "operations", "routes": [{"matchers": ["severity = critical"], "receiver": "oncall"}]}
    assert alert_receiver_refusals([OPS, PAGER], route) == [
        "stack_alert_route.routes[0].receiver 'oncall' is not in stack_alert_receivers (known: operations, pager)"]
    assert alert_receiver_refusals([OPS], "ops") == [
        "stack_alert_route must be a mapping (Alertmanager's route: receiver, group_by, routes, ...)"]
    assert alert_receiver_refusals([OPS, PAGER], {"routes": [{"receiver": "pager"}]}) == []


def test_the_config_routes_to_the_first_receiver_grouped_by_alert_and_site():
    config = alertmanager_config([OPS, PAGER])
    assert config["route"] == {"receiver": "operations", "group_by": ["alertname", "site"], "group_wait": "30s",
                               "group_interval": "5m", "repeat_interval": "4h"}
    assert config["receivers"] == [OPS, PAGER]
    assert config["inhibit_rules"] == DEFAULT_INHIBIT_RULES
    assert "global" not in config


def test_the_inventory_refines_the_route_and_adds_inhibit_rules():
    route = {"receiver": "pager", "repeat_interval": "1h",
             "routes": [{"matchers": ["site = a"], "receiver": "operations"}]}
    extra = {"source_matchers": ["alertname = FleetSiteCutOff"], "target_matchers": ["severity = warning"]}
    config = alertmanager_config([OPS, PAGER], route, [extra], {"smtp_smarthost": "mail:587"})
    assert config["route"]["receiver"] == "pager" and config["route"]["repeat_interval"] == "1h"
    assert config["route"]["group_by"] == ["alertname", "site"] and config["route"]["routes"] == route["routes"]
    assert config["inhibit_rules"] == DEFAULT_INHIBIT_RULES + [extra]
    assert config["global"] == {"smtp_smarthost": "mail:587"}


def test_without_receivers_the_alerts_go_to_a_visible_nobody():
    config = alertmanager_config([])
    assert config["receivers"] == [{"name": "nobody"}] and config["route"]["receiver"] == "nobody"


def test_every_inhibit_rule_names_alerts_that_exist():
    names = {rule["alert"] for rule in alert_rules.rules() if "alert" in rule}
    for rule in DEFAULT_INHIBIT_RULES:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            listed = re.fullmatch(r'alertname\s*=~?\s*"?([\w|]+)"?', matcher)[1].split("|")
            assert set(listed) <= names, f"{matcher} names an alert monitoring/rules does not have"
