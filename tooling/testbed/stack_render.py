"""Render the stack role's templates outside a play, through Ansible's own Templar, for tests and tools.

The variables are the role's as a play resolves them: defaults/main.yml under ansible/group_vars/all and
the host's inventory variables, under vars/main.yml, then the facts earlier roles set (iot_site_alias,
iot_tier, iot_topology) and the caller's overrides; Jinja in any of them is resolved lazily, with the
deploy package's filters (ansible/filter_plugins). Only what needs a run stands in: the Kafka passwords
(lookups that write files), the site's config and secret files, and the images' ids.
"""
from __future__ import annotations

import functools
import hashlib

import yaml
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import filter_loader, init_plugin_loader
from ansible.template import Templar, trust_as_template
from ansible.vars.manager import VariableManager

from tooling.build import pins

REPO = pins.REPO_ROOT
ROLE = REPO / "ansible/roles/stack"
init_plugin_loader()  # the ansible.builtin collection, as ansible-playbook sets it up
filter_loader.add_directory(str(REPO / "ansible/filter_plugins"))


def group_vars() -> dict:
    """ansible/group_vars/all: the project-wide variables the roles' defaults derive from."""
    return yaml.safe_load((REPO / "ansible/group_vars/all/main.yml").read_text())


def stack_defaults() -> dict:
    """ansible/roles/stack/defaults/main.yml, as written (Jinja expressions stay text)."""
    return yaml.safe_load((ROLE / "defaults/main.yml").read_text())


def stack_vars() -> dict:
    """ansible/roles/stack/vars/main.yml, as written (Jinja expressions stay text)."""
    return yaml.safe_load((ROLE / "vars/main.yml").read_text())


@functools.cache
def _loader() -> DataLoader:
    return DataLoader()


def _role_file(path) -> dict:
    """A variables file as Ansible loads it: its strings trusted as templates, resolved when read."""
    return _loader().load_from_file(str(path), trusted_as_template=True)


# The images the stacks run (the stack role's vars/main.yml __stack_images).
STACK_IMAGES = ("kafka", "cassandra", "spark", "services", "mosquitto", "prometheus", "node-exporter")


def image_ids(**rebuilt: str) -> dict[str, str]:
    """Stand-in ids of the shipped images (the images role's images_ids); `rebuilt`: name -> another build."""
    return {n: "sha256:" + hashlib.sha256(f"{n}{rebuilt.get(n, '')}".encode()).hexdigest()
            for n in STACK_IMAGES}


def role_variables(tier: str, topology: dict, host_vars: dict | None = None, **overrides) -> dict:
    """The stack role's variables on a site's manager, by Ansible's precedence (lowest first)."""
    return {**_role_file(ROLE / "defaults/main.yml"), **_role_file(REPO / "ansible/group_vars/all/main.yml"),
            **(host_vars or {}), **_role_file(ROLE / "vars/main.yml"),
            "playbook_dir": str(REPO / "ansible"), "ansible_managed": "test",
            "iot_site_alias": topology["alias"], "iot_tier": tier, "iot_topology": topology,
            # Stand-ins for the password lookups, which write files beside the site's certificates.
            "pki_password_salt_key": "salt-key-0123456789",
            "__stack_kafka_passwords": trust_as_template(
                "{{ dict(__stack_kafka_internal_users | zip(__stack_kafka_internal_users"
                " | map('regex_replace', '$', '-password-0123456789'))) }}"),
            **overrides}


def resolve(variables: dict, expression: str):
    """An expression over `variables`, resolved as Ansible does (e.g. a role variable by its name)."""
    return Templar(loader=_loader(), variables=variables).evaluate_expression(trust_as_template(expression))


def render_template(name: str, variables: dict) -> str:
    """ansible/roles/stack/templates/`name` as the template module renders it (trim_blocks, the role's
    templates/ on the search path for imports)."""
    templar = Templar(loader=_loader(), variables=variables).copy_with_new_env(searchpath=[str(ROLE / "templates")])
    text = trust_as_template((ROLE / "templates" / name).read_text())
    return templar.template(text, escape_backslashes=False, overrides={"trim_blocks": True})


def site_files(tier: str, topology: dict, variables: dict) -> dict:
    """Stand-ins (content "c" or "s") for the site's files, named as vars/main.yml __stack_site_files names
    them: the tier's and monitoring's, the pki role's, and one Kafka password per principal."""
    declared, monitoring = stack_vars()["__stack_files"][tier], stack_vars()["__stack_monitoring_files"]
    pki = [f"kafka_{k['id']}_keystore" for k in topology["kafka"]] + ["kafka_ca", "kafka_clients_ca"]
    pki += ["kafka_relay_keystore"] if tier == "datacenter" else []
    pki += ["prometheus_tls_cert", "prometheus_tls_key"]
    pki += ["mosquitto_tls_cert", "mosquitto_tls_key"] if topology.get("mqtt_addresses") else []
    pki += ["spark_auth_secret"]
    certificates = tier == "edge" and resolve(variables, "stack_mqtt_device_auth") == "certificate"
    pki += ["mqtt_device_ca"] if certificates else []
    kafka = [f"kafka_password_{user}" for user in resolve(variables, "__stack_kafka_internal_users")]
    kafka += ["kafka_internal_jaas", "zookeeper_password"]
    return {"configs": dict.fromkeys([*declared["configs"], *monitoring["configs"]], "c"),
            "secrets": dict.fromkeys([*declared["secrets"], *monitoring["secrets"], *pki, *kafka], "s")}


def render(tier: str, topology: dict, ids: dict[str, str] | None = None, host_vars: dict | None = None,
           **overrides) -> dict:
    """The tier's stack file (templates/stack-<tier>.yml.j2) for `topology`, parsed: the role's defaults, or
    `host_vars` (a host's inventory variables) over them, then `overrides` (role variables by name)."""
    variables = role_variables(tier, topology, host_vars, __stack_image_ids=ids or image_ids(), **overrides)
    if "__stack_site_files" not in overrides:
        variables["__stack_site_files"] = site_files(tier, topology, variables)
    return yaml.safe_load(render_template(f"stack-{tier}.yml.j2", variables))


def render_mm2(hostvars: dict, groups: dict, datacenter_group: str = "datacenter", **overrides) -> str:
    """ansible/roles/stack/templates/mm2.properties.j2 as the stack role renders it on the datacenter's manager:
    the role's defaults and vars under the datacenter host's inventory variables, then `overrides`."""
    return render_role_template("mm2.properties.j2", hostvars, groups, datacenter_group, "datacenter", **overrides)


def render_role_template(name: str, hostvars: dict, groups: dict, group: str, tier: str, **overrides) -> str:
    """One of ansible/roles/stack/templates as the stack role renders it on `group`'s manager: the role's
    defaults and vars under the first host's inventory variables, then `overrides`."""
    from deploy.topology import site_topology
    host = groups[group][0]
    alias = overrides.get("iot_site_alias") or hostvars[host].get("site_alias") or group.replace("_", "-")
    topology = site_topology(hostvars, groups[group], alias, tier)
    variables = role_variables(tier, topology, hostvars[host], hostvars=hostvars, groups=groups, **overrides)
    return render_template(name, variables)


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
