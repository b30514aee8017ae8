"""Which project images each node and each site needs, and the image versions file."""
from __future__ import annotations

import tomllib

from deploy.errors import fail
from deploy.topology import node_labels


def node_images(hostvars_of_host: dict, tier: str, is_manager: bool) -> list[str]:
    """Project images a node needs, from the services its labels pin to it."""
    labels = node_labels(hostvars_of_host)
    needed = {"node-exporter"}  # a global service: one task on every node
    if is_manager or "iot.zookeeper" in labels or "iot.kafka" in labels:
        needed.add("kafka")  # the manager runs the health role's Kafka probes
    if is_manager:
        needed.add("services")  # ... and the topics role's iot-topics
    if "iot.cassandra" in labels:
        needed.add("cassandra")
    if "iot.apps" in labels:
        needed.update({"spark", "services", "prometheus"})
    if "iot.stateless" in labels:   # bridge, adapter, mosquitto-agent; MirrorMaker at the datacenter
        needed.update({"services"} | ({"kafka"} if tier == "datacenter" else set()))
    if "iot.mqtt" in labels:
        needed.add("mosquitto")
    return sorted(needed)


def site_images(hostvars: dict, hosts: list[str], tier: str) -> list[str]:
    """Project images any node of a site needs (what its registry host receives)."""
    needed: set[str] = set()
    for host in hosts:
        needed.update(node_images(hostvars[host], tier, hostvars[host].get("swarm_role") == "manager"))
    return sorted(needed)


def from_toml(text: str) -> dict:
    """Parse TOML text (e.g. images/versions.toml read with the file lookup)."""
    try:
        return tomllib.loads(str(text))
    except tomllib.TOMLDecodeError as err:
        fail(f"not valid TOML: {err}")


# What ansible/filter_plugins/deploy_filters.py registers, by function name.
FILTERS = {f.__name__: f for f in (node_images, site_images, from_toml)}
