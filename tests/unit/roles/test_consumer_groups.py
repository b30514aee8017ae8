"""No tool can move a Kafka consumer group that a datacenter service owns.

MirrorMaker 2 keeps a group's name across clusters and, with `sync.group.offsets.enabled`, writes a site group's
translated offsets into the same-named group at the datacenter whenever it has no active member (Kafka 3.9
MirrorCheckpointTask.syncGroupOffset). What that did when both tiers shared `cassandra-adapter`: docs/architecture.md
("Delivery guarantees", limits); the rules: docs/operations.md ("Consumer groups and MirrorMaker"). So:

- every consumer group a stack sets is "<owner>-<service>" (services/common/names.py CONSUMER_GROUPS), the
  owner being the site or datacenter whose Kafka it reads, and the stack role spells the same names as names.py;
- MirrorMaker's group filter, evaluated here with Kafka 3.9's DefaultGroupFilter rules, replicates per flow
  only that site's own groups, never a datacenter-owned one, and keeps MM2's default exclusions;
- the Spark jobs commit no group (their Kafka source keeps offsets in checkpoints);
- every member of a service's group is static, one group.instance.id per Swarm task slot, so a restarted
  replica gets its partitions back without waiting out session.timeout.ms.
"""
from __future__ import annotations

import re

import pytest

from deploy.topology import site_topology
from services.adapter import settings as adapter_settings
from services.bridge import settings as bridge_settings
from services.common import names, settings
from tooling.testbed.stack_render import (
    REPO,
    load_inventory,
    properties,
    render,
    render_mm2,
    stack_defaults,
    stack_vars,
)

# Kafka 3.9, connect/mirror DefaultGroupFilter: GROUPS_INCLUDE_DEFAULT and GROUPS_EXCLUDE_DEFAULT.
MM2_GROUPS_DEFAULT = ".*"
MM2_GROUPS_EXCLUDE_DEFAULT = "console-consumer-.*, connect-.*, __.*"
# The Kafka consumers among the services: program -> (variable naming its group, the program's default group).
# (BRIDGE_SHARE_GROUP is an MQTT shared-subscription name, not a Kafka group.)
CONSUMERS = {
    "iot-cassandra-adapter": ("ADAPTER_GROUP_ID", {o.name: o.default for o in adapter_settings.OPTIONS}["group_id"]),
    "iot-bridge": ("BRIDGE_COMMANDS_GROUP", bridge_settings.BridgeSettings().commands_group),
}
# The variable naming each consumer's group.instance.id (static membership).
INSTANCE_IDS = {"iot-cassandra-adapter": "ADAPTER_GROUP_INSTANCE_ID", "iot-bridge": "BRIDGE_COMMANDS_GROUP_INSTANCE_ID"}
SLOT = "{{.Task.Slot}}"     # Swarm's template, expanded per task in a service's environment


@pytest.fixture(scope="module")
def example():
    return load_inventory(REPO / "inventory.example")


_STACKS: dict[str, dict] = {}


def _stack(example, group: str) -> dict:
    """The rendered stack of an example inventory group (rendered once per module run)."""
    if group not in _STACKS:
        _STACKS[group] = _render(example, group)
    return _STACKS[group]


def _render(example, group: str) -> dict:
    hostvars, groups = example
    tier = "datacenter" if group == "datacenter" else "edge"
    alias = group.replace("_", "-")
    return render(tier, site_topology(hostvars, groups[group], alias, tier))


def _groups_of(stack: dict) -> dict[str, str]:
    """"<service>.<variable>" -> the consumer group that service runs in: the variable the stack sets, else the
    program's default."""
    groups = {}
    for name, service in stack["services"].items():
        program = (service.get("command") or [""])[0]
        if program in CONSUMERS:
            variable, default = CONSUMERS[program]
            groups[f"{name}.{variable}"] = (service.get("environment") or {}).get(variable, default)
    return groups


def _pattern(value: str) -> re.Pattern:
    """MirrorUtils.compilePatternList: the comma-separated list joined with '|', matched against the whole name."""
    return re.compile("|".join(p.strip() for p in value.split(",") if p.strip()))


def replicated(props: dict[str, str], flow: str, group: str) -> bool:
    """Whether MirrorMaker's checkpoint connector of `flow` would checkpoint and sync `group`
    (DefaultGroupFilter.shouldReplicateGroup; a flow's `<source>-><target>.` keys override the top level)."""
    include = props.get(f"{flow}.groups", props.get("groups", MM2_GROUPS_DEFAULT))
    exclude = props.get(f"{flow}.groups.exclude", props.get("groups.exclude", MM2_GROUPS_EXCLUDE_DEFAULT))
    return bool(_pattern(include).fullmatch(group)) and not _pattern(exclude).fullmatch(group)


# ------------------------------------------------------------------ one place for the names

def test_stack_role_spells_the_names_py_consumer_groups():
    assert stack_vars()["__stack_consumer_groups"] == names.CONSUMER_GROUPS, \
        "ansible/roles/stack/vars/main.yml __stack_consumer_groups must equal services/common/names.py CONSUMER_GROUPS"


def test_services_default_to_the_names_py_groups():
    defaults = {o.name: o.default for o in adapter_settings.OPTIONS}
    assert defaults["group_id"] == names.CONSUMER_GROUPS["adapter"]
    assert bridge_settings.BridgeSettings().commands_group == names.CONSUMER_GROUPS["bridge_commands"]


# ------------------------------------------------------------------ every stack sets groups owned by its site

@pytest.mark.parametrize("group, services", [
    ("site_a", {"cassandra-adapter.ADAPTER_GROUP_ID": "site-a-cassandra-adapter",
                "bridge.BRIDGE_COMMANDS_GROUP": "site-a-bridge-commands"}),
    ("site_b", {"cassandra-adapter.ADAPTER_GROUP_ID": "site-b-cassandra-adapter",
                "bridge.BRIDGE_COMMANDS_GROUP": "site-b-bridge-commands"}),
    ("datacenter", {"cassandra-adapter.ADAPTER_GROUP_ID": "datacenter-cassandra-adapter"}),
])
def test_every_kafka_consumer_gets_a_group_owned_by_its_site(example, group, services):
    assert _groups_of(_stack(example, group)) == services


def test_no_two_tiers_share_a_consumer_group(example):
    seen: dict[str, str] = {}
    for group in ("site_a", "site_b", "datacenter"):
        for where, name in _groups_of(_stack(example, group)).items():
            assert name not in seen, f"{group} {where} and {seen[name]} share the consumer group {name!r}"
            seen[name] = f"{group} {where}"


@pytest.mark.parametrize("group", ["site_a", "site_b", "datacenter"])
def test_every_kafka_consumer_is_a_static_member_per_task_slot(example, group):
    """A replica that Swarm restarts rejoins under its slot's id and takes its partitions back at once instead of
    after session.timeout.ms (docs/operations.md). The id is the group's name plus the slot: unique in the group,
    across tiers too, and stable across restarts; with a slot number it is a name Kafka and the settings accept."""
    stack = _stack(example, group)
    groups = _groups_of(stack)
    static = {}
    for name, service in stack["services"].items():
        program = (service.get("command") or [""])[0]
        if program in INSTANCE_IDS:
            instance_id = service["environment"][INSTANCE_IDS[program]]
            static[name] = instance_id
            assert instance_id == f"{groups[f'{name}.{CONSUMERS[program][0]}']}-{SLOT}"
            assert settings.group_instance_id(instance_id.replace(SLOT, "3")) == instance_id.replace(SLOT, "3")
    assert set(static) == ({"cassandra-adapter"} if group == "datacenter" else {"cassandra-adapter", "bridge"})


@pytest.mark.parametrize("group", ["site_a", "datacenter"])
def test_spark_jobs_commit_no_consumer_group(example, group):
    """Spark's Kafka source keeps its offsets in the checkpoint and, unless kafka.group.id is set, reads in a
    fresh "<groupIdPrefix>-<uuid>" group that commits nothing: nothing for MirrorMaker to sync. The prefix is
    "<owner>-<job>" (the groups the job's principal may use), the naming every service's group follows."""
    owner = "datacenter" if group == "datacenter" else "site-a"
    jobs = stack_defaults()["stack_spark"]["jobs"]["datacenter" if group == "datacenter" else "edge"]
    services = _stack(example, group)["services"]
    for job in jobs:
        service = services[job["name"]]
        assert service["environment"]["KAFKA_GROUP_ID_PREFIX"] == f"{owner}-{job['name']}"
        text = " ".join(service["command"]) + " " + " ".join(f"{k}={v}" for k, v in service["environment"].items()
                                                             if k != "KAFKA_GROUP_ID_PREFIX")
        assert not re.search(r"group\.id|groupIdPrefix|GROUP_ID", text), f"{job['name']}: {text}"


# ------------------------------------------------------------------ MirrorMaker syncs only the sites' own groups

@pytest.fixture(scope="module")
def mm2(example) -> dict[str, str]:
    hostvars, groups = example
    return properties(render_mm2(hostvars, groups))


FLOWS = ["site-a->datacenter", "site-b->datacenter"]


def test_group_offsets_are_synced(mm2):
    assert mm2["sync.group.offsets.enabled"] == "true" and mm2["emit.checkpoints.enabled"] == "true"


def test_a_sites_adapter_group_made_after_mirrormaker_started_is_found_within_a_minute(mm2):
    # MM2 looks for new groups every 600 s by default: on a first deploy the adapter's group does not
    # exist yet when MirrorMaker starts, and the lab saw its offsets reach the datacenter 10 min late.
    assert int(mm2["refresh.groups.interval.seconds"]) <= 60


@pytest.mark.parametrize("flow", FLOWS)
def test_no_datacenter_group_is_ever_synced(mm2, example, flow):
    # The groups the datacenter's services run in today, and any future "<datacenter>-<service>" group.
    candidates = set(_groups_of(_stack(example, "datacenter")).values()) | \
        {"datacenter-notifier", "datacenter-cassandra-adapter", "datacenter-bridge-commands"}
    synced = sorted(g for g in candidates if replicated(mm2, flow, g))
    assert not synced, f"{flow}: MirrorMaker would write offsets into the datacenter's groups {synced}"


@pytest.mark.parametrize("flow", FLOWS)
def test_each_flow_syncs_exactly_its_sites_adapter_group(mm2, example, flow):
    site = flow.split("->")[0]
    all_site_groups = {g for group in ("site_a", "site_b") for g in _groups_of(_stack(example, group)).values()}
    synced = {g for g in all_site_groups if replicated(mm2, flow, g)}
    assert synced == {f"{site}-{names.CONSUMER_GROUPS['adapter']}"}


def test_groups_exclude_keeps_mm2_default_exclusions(mm2):
    kept = [p.strip() for p in mm2["groups.exclude"].split(",")]
    missing = [p for p in MM2_GROUPS_EXCLUDE_DEFAULT.split(", ") if p not in kept]
    assert not missing, f"groups.exclude replaces MM2's default and drops {missing}"
    for group in ("console-consumer-42", "connect-mirrormaker", "__consumer_offsets"):
        assert not any(replicated(mm2, flow, group) for flow in FLOWS), group


def test_a_new_site_gets_a_flow_that_syncs_only_its_own_group(example):
    hostvars, groups = example
    hostvars = {**hostvars, "c-1": {"ansible_host": "10.40.0.11", "swarm_role": "manager", "zookeeper_id": 1,
                                    "kafka_id": 1, "cassandra_id": 1, "apps_node": True, "mqtt_node": True,
                                    "group_names": ["edge", "site_c"]}}
    groups = {**groups, "site_c": ["c-1"], "edge": [*groups["edge"], "c-1"]}
    props = properties(render_mm2(hostvars, groups))
    assert props["site-c->datacenter.groups"] == "site-c-cassandra-adapter"
    assert not replicated(props, "site-c->datacenter", "datacenter-cassandra-adapter")
    assert not replicated(props, "site-c->datacenter", "site-a-cassandra-adapter")
