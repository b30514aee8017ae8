"""The alert rules of monitoring/rules/: which metric names they use, and which component exports each.

The unit tests check the rules with promtool and the names against the services' own registries;
the integration tests scrape the real JVMs (JMX exporter) for the names of their component.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from tooling.build import pins

RULES_DIR = pins.REPO_ROOT / "monitoring" / "rules"

# PromQL words that look like metric names: aggregations, functions, keywords.
_PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    "rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets", "floor", "ceil", "round", "abs",
    "absent", "absent_over_time", "clamp_min", "clamp_max", "vector", "scalar", "time", "histogram_quantile",
    "max_over_time", "min_over_time", "avg_over_time", "sum_over_time", "count_over_time", "label_replace",
    "predict_linear", "inf", "nan",
}

# Which component exports a metric, by name prefix (longest first). `up` is Prometheus' own;
# process_start_time_seconds every JVM (the JMX exporter) and Python service (prometheus_client).
OWNERS = (
    ("kafka_connect_mirror_", "mirrormaker"),
    ("kafka_", "kafka"),
    ("zookeeper_", "zookeeper"),
    ("cassandra_", "cassandra"),
    ("iot_adapter_", "adapter"),
    ("bridge_", "bridge"),
    ("mosquitto_", "mosquitto-agent"),
    ("spark_streaming_", "spark"),
    ("node_", "node-exporter"),
    ("alertmanager_", "alertmanager"),
    ("process_", "every process"),
    ("up", "prometheus"),
    ("ALERTS", "prometheus"),
    ("site:", "recording rules"),     # monitoring/rules/fleet.yml, which reads its own last value
    ("iot_certificate_", "rendered rules"),  # the stack role's prometheus_certificates (deploy/certificates.py)
)


def rule_files() -> list[Path]:
    return sorted(RULES_DIR.glob("*.yml"))


def rules() -> list[dict]:
    """Every rule (alert or record) of monitoring/rules/."""
    found = []
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            found += group["rules"]
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)        # strings (label values, regexes)
    text = re.sub(r"\{[^}]*\}", " ", text)                    # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                   # ranges
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text):
        word = match.group(1)
        if word.lower() not in _PROMQL_WORDS and not re.fullmatch(r"\d+[smhdwy]", word):
            names.add(word)
    return names


def owner(name: str) -> str | None:
    for prefix, component in OWNERS:
        if name == prefix or (prefix.endswith(("_", ":")) and name.startswith(prefix)):
            return component
    return None


def names_by_owner() -> dict[str, set[str]]:
    """{component: metric names the rules use from it}."""
    found: dict[str, set[str]] = {}
    for rule in rules():
        for name in metric_names(rule["expr"]):
            found.setdefault(owner(name) or "unknown", set()).add(name)
    return found
