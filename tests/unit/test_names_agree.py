"""The YAML that deploys the stack names the same topics as services/common/names.py.

YAML cannot import Python, so the Ansible role defaults and the example inventory spell topic names and MQTT
topic templates again. Each topic they name is its own test case here, and a failure names the file and the
variable:

- every topic named in YAML is a names.py topic; the datacenter adapter's regexes match the relay's
  `<site>.<topic>` form of a names.py topic;
- the topics role creates every topic each tier needs (EDGE_NEEDS, DATACENTER_NEEDS);
- the bridge rules map names.MQTT_READINGS to names.TEMPERATURE_DATA, and devices' MQTT ACL grants exactly
  the names.py MQTT templates;
- the adapter reads topics that exist: created topics at the edge, relayed ones at the datacenter.

Effective values follow Ansible's precedence: the example inventory's group_vars over the role defaults
(loaded as tests/unit/deploy/test_topology_and_stacks.py does).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

from services.common import names
from tooling.testbed.stack_render import REPO, load_inventory

TOPICS = {value: key for key, value in vars(names).items()
          if key.isupper() and isinstance(value, str) and not key.startswith(("HEADER_", "MQTT_"))}
MQTT_TEMPLATES = {value: key for key, value in vars(names).items() if key.startswith("MQTT_")}

# Which tier's Kafka carries each topic (docs/architecture.md): the edge has everything
# but the datacenter notifier's output; the datacenter gets the rest mirrored as <site>.<topic>.
DATACENTER_NEEDS = {names.NOTIFICATIONS, names.DEAD_LETTER}
EDGE_NEEDS = set(TOPICS) - {names.NOTIFICATIONS}
SAMPLE_SITE = "site-a"   # a site alias, to try the datacenter's <site>.<topic> patterns on

ROLE_DEFAULTS = [REPO / "ansible/roles/topics/defaults/main.yml", REPO / "ansible/roles/stack/defaults/main.yml"]
INVENTORY = REPO / "inventory.example"
YAML_FILES = [*ROLE_DEFAULTS, *sorted((INVENTORY / "group_vars").rglob("*.yml"))]

# Variables that name topics or MQTT topics, each read by `_entries` below.
TOPIC_VARIABLES = {"topics_edge", "topics_datacenter", "stack_relay_topics", "stack_bridge_rules",
                   "stack_adapter_tables", "stack_mqtt_device_publish", "stack_mqtt_device_subscribe"}
# Variables whose name mentions topics or MQTT but which hold no topic name (numbers are never suspect).
NOT_TOPIC_NAMES = {"topics_network", "topics_image", "topics_kafka_image", "topics_kafka_login", "stack_mqtt_users",
                   "stack_mqtt_devices", "stack_bridge_mqtt_user", "stack_mqtt_agent_user", "stack_mqtt_device_auth",
                   "stack_mqtt_device_burst", "stack_mqtt_device_max_rate",
                   "stack_alert_inhibit_rules"}  # Alertmanager matchers of alert names


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@cache
def variables(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


@dataclass(frozen=True)
class Entry:
    file: str
    variable: str    # where in the variable, e.g. stack_adapter_tables.edge[0].topics
    kind: str        # topic | pattern | mqtt-template | mqtt-device
    value: str
    tier: str = ""   # edge | datacenter when the variable is per tier
    relayed: str = ""  # a datacenter pattern's edge topic, rendered only while it is relayed

    def __str__(self) -> str:
        return f"{self.file}: {self.variable} = {self.value!r}"


def _entries(file: str, name: str, value) -> Iterator[Entry]:
    if name in ("topics_edge", "topics_datacenter"):
        tier = name.removeprefix("topics_")
        for i, topic in enumerate(value):
            yield Entry(file, f"{name}[{i}].name", "topic", topic["name"], tier)
    elif name == "stack_relay_topics":
        for i, topic in enumerate(value):
            yield Entry(file, f"{name}[{i}]", "topic", topic, "edge")
    elif name == "stack_bridge_rules":
        for i, rule in enumerate(value):
            yield Entry(file, f"{name}[{i}].kafka_topic", "topic", rule["kafka_topic"], "edge")
            yield Entry(file, f"{name}[{i}].mqtt", "mqtt-template", rule["mqtt"], "edge")
    elif name == "stack_adapter_tables":
        for tier, mappings in value.items():
            for i, mapping in enumerate(mappings):
                for j, topic in enumerate(mapping.get("topics", [])):
                    yield Entry(file, f"{name}.{tier}[{i}].topics[{j}]", "topic", topic, tier)
                if "topic_pattern" in mapping:
                    yield Entry(file, f"{name}.{tier}[{i}].topic_pattern", "pattern", mapping["topic_pattern"], tier,
                                mapping.get("relayed", ""))
    elif name in ("stack_mqtt_device_publish", "stack_mqtt_device_subscribe"):
        yield Entry(file, name, "mqtt-device", value)


def all_entries(*kinds: str) -> list[Entry]:
    return [e for path in YAML_FILES for name, value in variables(path).items()
            for e in _entries(rel(path), name, value) if e.kind in kinds]


def _ids(entries: list[Entry]) -> list[str]:
    return [f"{e.file.replace('/defaults/main.yml', '')}:{e.variable}={e.value}" for e in entries]


def _defaults() -> dict:
    merged: dict = {}
    for path in ROLE_DEFAULTS:
        merged.update(variables(path))
    return merged


@cache
def _inventory():
    return load_inventory(INVENTORY)


def effective(variable: str, group: str) -> list:
    """The variable's value on each host of the group: the inventory's if it sets one, else the role default."""
    hostvars, groups = _inventory()
    return [hostvars[host].get(variable, _defaults()[variable]) for host in groups[group]]


def created(tier: str) -> set[str]:
    """Topics the topics role creates on every site of the tier."""
    per_host = [{t["name"] for t in value} for value in effective(f"topics_{tier}", tier)]
    return set.intersection(*per_host)


def relayed() -> set[str]:
    """Edge topics the datacenter's MirrorMaker copies (on every datacenter host)."""
    return set.intersection(*(set(value) for value in effective("stack_relay_topics", "datacenter")))


def acl_filter(template: str) -> str:
    """MQTT subscription/ACL filter of a template: every {name} segment becomes '+'."""
    return re.sub(r"\{[^}/]+\}", "+", template)


def device_acl_filter(template: str) -> str:
    """A device's ACL pattern of a template: its own site's broker, its own login (%u) as the device."""
    own = {"{site}": "{{ iot_site_alias }}", "{device_id}": "%u"}
    return "/".join(own.get(seg, acl_filter(seg)) for seg in template.split("/"))


# ------------------------------------------------------------------ every topic named is a names.py topic

TOPIC_ENTRIES = all_entries("topic")


@pytest.mark.parametrize("entry", TOPIC_ENTRIES, ids=_ids(TOPIC_ENTRIES))
def test_topic_in_yaml_is_a_names_topic(entry):
    assert entry.value in TOPICS, (f"{entry}: not a topic of services/common/names.py "
                                   f"({', '.join(sorted(TOPICS))}); add it there or fix the spelling")


PATTERN_ENTRIES = all_entries("pattern")


@pytest.mark.parametrize("entry", PATTERN_ENTRIES, ids=_ids(PATTERN_ENTRIES))
def test_datacenter_topic_pattern_matches_a_relayed_names_topic(entry):
    matched = {t for t in TOPICS if re.fullmatch(entry.value, f"{SAMPLE_SITE}.{t}")}
    assert matched, (f"{entry}: matches no '<site>.<topic>' of a services/common/names.py topic "
                     f"(tried {SAMPLE_SITE}.<topic>)")
    assert not any(re.fullmatch(entry.value, t) for t in TOPICS), \
        f"{entry}: also matches an unprefixed topic; the datacenter reads only mirrored <site>.<topic> topics"
    if entry.relayed:
        # adapter-mappings.toml.j2 renders it only while that topic is in stack_relay_topics.
        assert matched == {entry.relayed}, f"{entry}: names relayed={entry.relayed!r} but matches {sorted(matched)}"
        return
    missing = matched - relayed()
    assert not missing, (f"{entry}: reads {sorted(missing)}, which the datacenter's stack_relay_topics "
                         f"({sorted(relayed())}) does not mirror")


# ------------------------------------------------------------------ the topics role creates what each tier needs

@pytest.mark.parametrize("topic", sorted(EDGE_NEEDS))
def test_edge_needs_topic_created_by_topics_role(topic):
    assert topic in created("edge"), (f"names.{TOPICS[topic]} = {topic!r} is needed at the edge but "
                                      "topics_edge (ansible/roles/topics/defaults/main.yml or the inventory's "
                                      "group_vars) does not create it")


@pytest.mark.parametrize("topic", sorted(DATACENTER_NEEDS))
def test_datacenter_needs_topic_created_by_topics_role(topic):
    assert topic in created("datacenter"), (f"names.{TOPICS[topic]} = {topic!r} is needed at the datacenter but "
                                            "topics_datacenter (ansible/roles/topics/defaults/main.yml or the "
                                            "inventory's group_vars) does not create it")


def test_every_names_topic_has_a_tier():
    assert set(TOPICS) <= EDGE_NEEDS | DATACENTER_NEEDS, "add the new names.py topic to EDGE_NEEDS or DATACENTER_NEEDS"


@pytest.mark.parametrize("topic", sorted({e.value for e in TOPIC_ENTRIES if e.variable.startswith("stack_relay")}))
def test_relayed_topic_is_created_at_the_edge(topic):
    relay_files = sorted({e.file for e in TOPIC_ENTRIES if e.variable.startswith("stack_relay") and e.value == topic})
    assert topic in created("edge"), f"{', '.join(relay_files)}: stack_relay_topics mirrors {topic!r}, " \
                                     "which topics_edge does not create"


# ------------------------------------------------------------------ the bridge rules and the MQTT ACL

BRIDGE_FILES = [p for p in YAML_FILES if "stack_bridge_rules" in variables(p)]


@pytest.mark.parametrize("path", BRIDGE_FILES, ids=rel)
def test_bridge_rules_map_mqtt_readings_to_temperature_data(path):
    rules = variables(path)["stack_bridge_rules"]
    where = f"{rel(path)}: stack_bridge_rules"
    assert {"mqtt": names.MQTT_READINGS, "kafka_topic": names.TEMPERATURE_DATA} in \
        [{"mqtt": r["mqtt"], "kafka_topic": r["kafka_topic"]} for r in rules], \
        f"{where} has no rule mqtt={names.MQTT_READINGS!r} -> kafka_topic={names.TEMPERATURE_DATA!r}"
    for i, rule in enumerate(rules):
        assert rule["mqtt"] in MQTT_TEMPLATES, \
            f"{where}[{i}].mqtt = {rule['mqtt']!r} is not a names.py MQTT template ({sorted(MQTT_TEMPLATES)})"
        assert rule["kafka_topic"] in created("edge"), \
            f"{where}[{i}].kafka_topic = {rule['kafka_topic']!r} is not created by topics_edge"


DEVICE_TEMPLATES = {"stack_mqtt_device_publish": names.MQTT_READINGS,
                    "stack_mqtt_device_subscribe": names.MQTT_COMMANDS}
DEVICE_ENTRIES = all_entries("mqtt-device")


@pytest.mark.parametrize("entry", DEVICE_ENTRIES, ids=_ids(DEVICE_ENTRIES))
def test_device_topics_are_names_templates(entry):
    """What a device may publish and subscribe (Mosquitto's iot_gate plugin) is the names.py template,
    under its own site, with its own login as the device."""
    assert entry.value == device_acl_filter(DEVICE_TEMPLATES[entry.variable]), \
        f"{entry}: expected {device_acl_filter(DEVICE_TEMPLATES[entry.variable])!r}"


# ------------------------------------------------------------------ the adapter reads topics that exist

ADAPTER_TOPICS = [e for e in TOPIC_ENTRIES if e.variable.startswith("stack_adapter_tables")]


@pytest.mark.parametrize("entry", ADAPTER_TOPICS, ids=_ids(ADAPTER_TOPICS))
def test_adapter_mapping_topic_is_created(entry):
    assert entry.value in created(entry.tier), \
        f"{entry}: the {entry.tier} adapter reads a topic that topics_{entry.tier} does not create"


# ------------------------------------------------------------------ nothing escapes these checks

@pytest.mark.parametrize("path", YAML_FILES, ids=rel)
def test_every_topic_variable_is_checked(path):
    """A new variable that may name a topic (or MQTT topic) fails here until this module checks it."""
    suspicious = sorted(name for name, value in variables(path).items()
                        if re.search(r"topic|mqtt|rules|tables", name) and not isinstance(value, int | float)
                        and name not in TOPIC_VARIABLES | NOT_TOPIC_NAMES)
    assert not suspicious, (f"{rel(path)}: {suspicious} may name topics; teach tests/unit/test_names_agree.py "
                            "(TOPIC_VARIABLES and _entries) to check them, or list them in NOT_TOPIC_NAMES")
