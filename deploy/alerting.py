"""Alertmanager's configuration from the inventory, and preflight's check of it.

Each site and the datacenter run their own Alertmanager; each alert is evaluated at exactly one place
(the rules at the site whose series they read), so no alert is sent twice and a cut-off site still
notifies. The inventory sets the receivers (Alertmanager's own syntax) and may refine the route.
"""
from __future__ import annotations

# Causes that make other alerts of the same site mere symptoms: while the cause fires, they stay quiet.
DEFAULT_INHIBIT_RULES = [
    {"source_matchers": ["alertname = ZooKeeperQuorumLost"],
     "target_matchers": ['alertname =~ "ZooKeeperServerDown|KafkaNoActiveController"'], "equal": ["site"]},
    {"source_matchers": ["alertname = KafkaBrokerDown"],
     "target_matchers": ['alertname =~ "KafkaUnderReplicatedPartitions|KafkaIsrShrinking"'], "equal": ["site"]},
    {"source_matchers": ['alertname = "MosquittoDown"'],
     "target_matchers": ['alertname =~ "BridgeDisconnectedFromMqtt|BridgeStalled|MosquittoRestarted"'],
     "equal": ["site"]},
    {"source_matchers": ["alertname = DiskSpaceCritical"],
     "target_matchers": ["alertname = DiskSpaceLow"], "equal": ["site", "nodename"]},
    {"source_matchers": ["alertname = CassandraNodeDown"],
     "target_matchers": ["alertname = CassandraPeersDown"], "equal": ["site"]},
]
DEFAULT_ROUTE = {"group_by": ["alertname", "site"], "group_wait": "30s", "group_interval": "5m",
                 "repeat_interval": "4h"}
RECEIVER_KINDS = ("webhook_configs", "email_configs", "slack_configs", "pagerduty_configs", "opsgenie_configs",
                  "msteams_configs", "telegram_configs", "pushover_configs", "victorops_configs", "wechat_configs",
                  "sns_configs", "discord_configs", "webex_configs")


def alert_receiver_refusals(receivers: object, route: object = None) -> list[str]:
    """Preflight's check of stack_alert_receivers and stack_alert_route: at least one receiver, each with
    a unique name and at least one way to reach a person, and a route that names a known receiver."""
    fix = "(docs/operations.md, Alerts)"
    if not isinstance(receivers, list) or not receivers:
        return [f"stack_alert_receivers is empty: alerts would reach nobody; list at least one receiver, e.g. "
                f"{{name: ops, email_configs: [{{to: ops@example.com}}]}} {fix}"]
    refusals, names = [], []
    for i, receiver in enumerate(receivers):
        name = receiver.get("name") if isinstance(receiver, dict) else None
        if not isinstance(name, str) or not name:
            refusals.append(f"stack_alert_receivers[{i}] has no `name` {fix}")
            continue
        if name in names:
            refusals.append(f"stack_alert_receivers[{i}]: the name {name!r} is used twice; names must be unique")
        names.append(name)
        if not any(receiver.get(kind) for kind in RECEIVER_KINDS):
            refusals.append(f"stack_alert_receivers[{i}] ({name}) reaches nobody: give it one of "
                            f"{', '.join(RECEIVER_KINDS[:3])}, ... {fix}")
    if route is not None and not isinstance(route, dict):
        refusals.append("stack_alert_route must be a mapping (Alertmanager's route: receiver, group_by, routes, ...)")
    elif route:
        for where, target in _route_receivers(route, "stack_alert_route"):
            if target not in names:
                refusals.append(f"{where}.receiver {target!r} is not in stack_alert_receivers "
                                f"(known: {', '.join(names)})")
    return refusals


def _route_receivers(route: dict, where: str):
    if "receiver" in route:
        yield where, route["receiver"]
    for i, child in enumerate(route.get("routes") or []):
        if isinstance(child, dict):
            yield from _route_receivers(child, f"{where}.routes[{i}]")


def alertmanager_config(receivers: list, route: dict | None = None, inhibit_rules: list | None = None,
                        global_settings: dict | None = None) -> dict:
    """alertmanager.yml as a mapping: the receivers as given, the route (DEFAULT_ROUTE, then the
    inventory's keys; the first receiver unless the route names one), and the inhibit rules
    (DEFAULT_INHIBIT_RULES, then the inventory's). Preflight
    refuses an inventory without receivers; rendered anyway (a test, a skipped preflight), the alerts
    go to a receiver named `nobody` that Alertmanager's page shows."""
    receivers = list(receivers or []) or [{"name": "nobody"}]
    config: dict = {}
    if global_settings:
        config["global"] = dict(global_settings)
    config["route"] = {"receiver": receivers[0]["name"], **DEFAULT_ROUTE, **(route or {})}
    config["receivers"] = list(receivers)
    config["inhibit_rules"] = DEFAULT_INHIBIT_RULES + list(inhibit_rules or [])
    return config


FILTERS = {f.__name__: f for f in (alert_receiver_refusals, alertmanager_config)}
