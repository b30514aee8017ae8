"""Render the compose/ stack templates outside Ansible, for tests, benchmarks and operators.

Uses Ansible's own core filters plus the deploy package's (what ansible/filter_plugins registers), so
what renders here renders the same way in the stack role.
"""
from __future__ import annotations

import hashlib

import jinja2
import yaml
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.filter.core import FilterModule as CoreFilters
from ansible.plugins.filter.mathstuff import FilterModule as MathFilters
from ansible.vars.manager import VariableManager

import deploy
from deploy.swarm import stack_files
from deploy.topology import edge_sites, site_topology
from tooling.build import pins

REPO = pins.REPO_ROOT
filters_math = MathFilters().filters()


def group_vars() -> dict:
    """ansible/group_vars/all: the project-wide variables the roles' defaults derive from."""
    return yaml.safe_load((REPO / "ansible/group_vars/all/main.yml").read_text())


def stack_defaults() -> dict:
    """ansible/roles/stack/defaults/main.yml, as written (Jinja expressions stay text)."""
    return yaml.safe_load((REPO / "ansible/roles/stack/defaults/main.yml").read_text())


def stack_vars() -> dict:
    """ansible/roles/stack/vars/main.yml, as written (Jinja expressions stay text)."""
    return yaml.safe_load((REPO / "ansible/roles/stack/vars/main.yml").read_text())


def stack_settings() -> dict:
    """The stack role's defaults, shaped as the template's `s`."""
    d = stack_defaults()
    return {
        "network": jinja2.Template(d["stack_network"]).render(group_vars()),
        "kafka_external_port": d["stack_kafka_external_port"],
        "kafka_operator_user": d["stack_kafka_operator_user"],
        "mqtt": {"tls_port": d["stack_mqtt_tls_port"],
                 "max_queued_messages": d["stack_mqtt_max_queued_messages"],
                 "memory_limit": int(filters_math["human_to_bytes"](
                     d["stack_resources"]["mosquitto"]["memory"]) * 0.85),
                 "device_auth": d["stack_mqtt_device_auth"], "agent_user": d["stack_mqtt_agent_user"]},
        "bridge_mqtt_user": d["stack_bridge_mqtt_user"], "bridge_replicas": d["stack_bridge_replicas"],
        "bridge_window": d["stack_bridge_window"], "adapter_replicas": d["stack_adapter_replicas"],
        "consumer_groups": stack_vars()["__stack_consumer_groups"],
        "kafka_users": stack_vars()["__stack_kafka_users_by_service"],
        "cassandra_adapter_user": d["stack_cassandra_adapter_user"],
        "cassandra_keyspace": d["stack_cassandra_keyspace"],
        "cassandra_cluster_name": "test", "cassandra_dc": "test", "cassandra_fast_start": False,
        "cassandra_backup": {"interval_minutes": d["stack_cassandra_backup_interval_minutes"],
                             "keep": d["stack_cassandra_backup_keep"]},
        "heap": d["stack_heap"], "resources": d["stack_resources"], "spark": d["stack_spark"],
        "monitoring": {"port": d["stack_prometheus_port"], "retention": d["stack_prometheus_retention"],
                       "exporter_port": d["stack_jmx_exporter_port"]},
    }


# The images the stacks run (the stack role's vars/main.yml __stack_images).
STACK_IMAGES = ("kafka", "cassandra", "spark", "services", "mosquitto", "prometheus", "node-exporter")


def image_ids(**rebuilt: str) -> dict[str, str]:
    """Stand-in ids of the shipped images (the images role's images_ids); `rebuilt`: name -> another build."""
    return {n: "sha256:" + hashlib.sha256(f"{n}{rebuilt.get(n, '')}".encode()).hexdigest()
            for n in STACK_IMAGES}


def render(tier: str, topology: dict, settings: dict | None = None, ids: dict[str, str] | None = None) -> dict:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "compose"), undefined=jinja2.StrictUndefined,
                             trim_blocks=True)
    env.filters.update(CoreFilters().filters())
    env.filters.update(deploy.filters())
    tag = pins.load().image_tag
    images = {n: f"iot-stack/{n}:{tag}" for n in STACK_IMAGES}
    # The tier's config and secret names as the stack role writes them (vars/main.yml __stack_files).
    # plus the pki role's (vars/main.yml __stack_site_files): each broker's keystore, the CA, Mosquitto's.
    declared = stack_vars()["__stack_files"][tier]
    monitoring = stack_vars()["__stack_monitoring_files"]
    pki = [f"kafka_{k['id']}_keystore" for k in topology["kafka"]] + ["kafka_ca"]
    pki += ["prometheus_tls_cert", "prometheus_tls_key"]
    pki += ["mosquitto_tls_cert", "mosquitto_tls_key"] if topology.get("mqtt_address") else []
    pki += ["spark_auth_secret"]
    settings = settings or stack_settings()
    pki += ["mqtt_device_ca"] if tier == "edge" and settings["mqtt"]["device_auth"] == "certificate" else []
    kafka = [f"kafka_password_{user}" for user in kafka_internal_users(tier, settings)]
    files = stack_files({"configs": dict.fromkeys([*declared["configs"], *monitoring["configs"]], "c"),
                                 "secrets": dict.fromkeys([*declared["secrets"], *monitoring["secrets"], *pki,
                                                           *kafka], "s")},
                                "/opt/iot-stack/x")
    text = env.get_template(f"{tier}.yml.j2").render(
        t=topology, s=settings, img=images, img_ids=ids or image_ids(), files=files, ansible_managed="test")
    return yaml.safe_load(text)


def kafka_internal_users(tier: str, settings: dict) -> list[str]:
    """The site's Kafka principals on INTERNAL, as vars/main.yml __stack_kafka_internal_users lists them."""
    users = settings["kafka_users"]
    services = ["bridge", "adapter", "mosquitto_agent"] if tier == "edge" else ["adapter", "mirrormaker"]
    return [users["broker"], users["admin"], *(users[s] for s in services),
            *(job["name"] for job in settings["spark"]["jobs"][tier])]


def render_mm2(hostvars: dict, groups: dict, datacenter_group: str = "datacenter", **overrides) -> str:
    """ansible/roles/stack/templates/mm2.properties.j2 as the stack role renders it on the datacenter's manager:
    the role's defaults and vars under the datacenter host's inventory variables, then `overrides`."""
    return render_role_template("mm2.properties.j2", hostvars, groups, datacenter_group, "datacenter", **overrides)


def render_role_template(name: str, hostvars: dict, groups: dict, group: str, tier: str, **overrides) -> str:
    """One of ansible/roles/stack/templates as the stack role renders it on `group`'s manager: the role's
    defaults and vars under the first host's inventory variables, then `overrides`."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "ansible/roles/stack/templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True)
    env.filters.update(CoreFilters().filters())
    env.filters.update(deploy.filters())
    host = groups[group][0]
    alias = hostvars[host].get("site_alias") or group.replace("_", "-")
    users = stack_vars()["__stack_kafka_users_by_service"]
    context = {**stack_defaults(), "__stack_consumer_groups": stack_vars()["__stack_consumer_groups"],
               "__stack_kafka_users_by_service": users,
               "__stack_kafka_passwords": {u: f"{u}-password-0123456789" for u in users.values()},
               **group_vars(), **hostvars[host], "hostvars": hostvars, "groups": groups,
               "iot_site_alias": alias, "iot_tier": tier, "ansible_managed": "test",
               "iot_topology": site_topology(hostvars, groups[group], alias, tier),
               **overrides}
    if tier == "datacenter" and "__stack_relay_sites" not in context:
        context["__stack_relay_sites"] = [site["alias"] for site in edge_sites(
            hostvars, groups, context["stack_relay_edge_group"], context.get("iot_ignored_groups", []),
            context["stack_kafka_external_port"])]
    return env.get_template(name).render(context)


def properties(text: str) -> dict[str, str]:
    """A Java .properties text (key = value lines, # comments) as a dict."""
    result = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip()
    return result


def load_inventory(path) -> tuple[dict, dict]:
    """An inventory file as Ansible reads it: hostvars (with group_names) and groups."""
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=inventory)
    hostvars = {h.name: {**variables.get_vars(host=h), "group_names": sorted(g.name for g in h.get_groups()
                                                                             if g.name != "all")}
                for h in inventory.get_hosts()}
    groups = {g: [h.name for h in inventory.get_hosts(pattern=g)] for g in inventory.groups}
    return hostvars, groups
