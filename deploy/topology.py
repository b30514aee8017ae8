"""A site's topology from its inventory group: where every per-node service runs, validated as it goes.

Per-host variables (all optional except swarm_role): swarm_role (manager | worker); zookeeper_id, kafka_id,
cassandra_id (1..n, unique in the site: the node runs <role>-<id>); apps_node (one host per site: the apps that
keep state on a node's volume, Spark and monitoring, and a share of the stateless ones); stateless_node (any
number of hosts: a share of the stateless services, which survive the loss of any one of these nodes);
mqtt_node (one or more hosts per edge site: Mosquitto runs on one of them and Swarm starts it on another when
that node dies; devices are given every one's address); kafka_retire (a broker whose replicas move to the
others before its host leaves the inventory: the highest kafka_ids only); cassandra_retire (the same for a
Cassandra node, which leaves its ring); ansible_host (the address others use).
docs/operations.md ("Inventory", host variables) explains each; a bad value raises DeployError naming the host,
the variable and the fix.
"""
from __future__ import annotations

import ipaddress
import re

from deploy.errors import fail

ALIAS_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$")
ROLES = ("zookeeper", "kafka", "cassandra")
CASSANDRA_SEEDS = 3           # the usual count: one lost seed or two do not stop a node from starting
CASSANDRA_REPLICAS = 3        # replicas of the keyspaces, capped at the nodes (stack role, stack-services.j2)


def _ids(hostvars: dict, hosts: list[str], role: str) -> list[dict]:
    var = f"{role}_id"
    placed: dict[int, str] = {}
    for host in hosts:
        raw = hostvars[host].get(var)
        if raw is None or raw == "":
            continue
        try:
            ident = int(raw)
        except (TypeError, ValueError):
            fail(f"{host}: {var}={raw!r} must be a whole number (1, 2, 3 ...)")
        if ident < 1:
            fail(f"{host}: {var}={ident} must be 1 or more")
        if ident in placed:
            fail(f"{host}: {var}={ident} is already used by {placed[ident]}; each {role} node needs its own id")
        placed[ident] = host
    if placed and sorted(placed) != list(range(1, len(placed) + 1)):
        fail(f"{var} values {sorted(placed)} must run 1..{len(placed)} without gaps")
    return [{"id": i, "node": placed[i], "address": _address(hostvars, placed[i])} for i in sorted(placed)]


def _retiring(hostvars: dict, hosts: list[str], nodes: list[dict], site: str, role: str = "kafka") -> list[int]:
    """Ids of the `role` nodes (kafka, cassandra) with <role>_retire=true: the highest ones (ids still run 1..n
    once they leave), and never all of them."""
    flag, what = f"{role}_retire", {"kafka": "broker", "cassandra": "Cassandra node"}[role]
    for host in hosts:
        if _flagged(hostvars[host], flag) and not any(n["node"] == host for n in nodes):
            fail(f"{host}: {flag}=true without a {role}_id; retire the host that runs the {what}")
    retiring = sorted(n["id"] for n in nodes if _flagged(hostvars[n["node"]], flag))
    if retiring and len(retiring) == len(nodes):
        fail(f"site {site}: every {what} has {flag}=true; at least one must stay")
    highest = list(range(len(nodes) - len(retiring) + 1, len(nodes) + 1))
    if retiring != highest:
        fail(f"site {site}: {flag}=true on {role}_id {retiring}; only the highest ids can leave ({highest} "
             f"for as many {what}s), as ids run 1..n")
    return retiring


def _address(hostvars: dict, host: str) -> str:
    return str(hostvars[host].get("ansible_host") or host)


def _flagged(hostvars_of_host: dict, var: str) -> bool:
    return str(hostvars_of_host.get(var, False)).lower() in ("true", "yes", "1")


def _flag(hostvars: dict, hosts: list[str], var: str, what: str, site: str) -> str:
    chosen = [h for h in hosts if _flagged(hostvars[h], var)]
    if len(chosen) != 1:
        fail(f"site {site}: exactly one host needs {var}=true ({what}); found {chosen or 'none'}")
    return chosen[0]


def _flags(hostvars: dict, hosts: list[str], var: str, what: str, site: str) -> list[str]:
    chosen = [h for h in hosts if _flagged(hostvars[h], var)]
    if not chosen:
        fail(f"site {site}: no host has {var}=true ({what}); set it on at least one host, on two or more "
             "so that it survives the loss of one")
    return chosen


def site_topology(hostvars: dict, hosts: list[str], site_alias: str, tier: str = "edge") -> dict:
    """Where every per-node service of one site runs, from the inventory."""
    if not isinstance(site_alias, str) or not ALIAS_RE.match(site_alias):
        fail(f"site_alias={site_alias!r} must be lowercase letters, digits and dashes (e.g. site-a)")
    if tier not in ("edge", "datacenter"):
        fail(f"tier={tier!r} must be edge or datacenter")
    if not hosts:
        fail(f"site {site_alias}: the inventory group has no hosts")
    managers = []
    for host in hosts:
        role = hostvars[host].get("swarm_role")
        if role not in ("manager", "worker"):
            fail(f"{host}: swarm_role={role!r} must be manager or worker")
        if role == "manager":
            managers.append(host)
    if not managers:
        fail(f"site {site_alias}: no host has swarm_role=manager; make one host the manager")
    if len(managers) % 2 == 0:
        fail(f"site {site_alias}: {len(managers)} managers; use an odd number so the Raft quorum survives a loss")
    topology = {role: _ids(hostvars, hosts, role) for role in ROLES}
    for role in ROLES:
        if not topology[role]:
            fail(f"site {site_alias}: no host has {role}_id; give at least one host {role}_id=1")
    if len(topology["zookeeper"]) % 2 == 0:
        fail(f"site {site_alias}: {len(topology['zookeeper'])} ZooKeeper nodes; use an odd number (1, 3, 5)")
    topology.update({
        "alias": site_alias,
        "tier": tier,
        "manager": managers[0],
        "managers": managers,
        "nodes": list(hosts),
        "apps_node": (apps_node := _flag(hostvars, hosts, "apps_node", "Spark, Prometheus, Alertmanager",
                                         site_alias)),
        # Where the stateless services (bridge, adapter, mosquitto-agent, MirrorMaker) may run: by default
        # one replica of the bridge and of the adapter per node, so a node adds capacity and any one may die.
        "stateless_nodes": [h for h in hosts if h == apps_node or _flagged(hostvars[h], "stateless_node")],
        # Operators open the site's Prometheus here (HTTPS); its certificate names this address.
        "apps_address": _address(hostvars, apps_node),
        # Mosquitto runs on one of these (one replica, its port published in host mode where it runs); when
        # that node dies Swarm starts it on another. Devices are given every address, in this order, and try
        # them in turn; its certificate names them all.
        "mqtt_nodes": (mqtt_nodes := _flags(hostvars, hosts, "mqtt_node", "Mosquitto", site_alias)
                       if tier == "edge" else []),
        "mqtt_addresses": [_address(hostvars, h) for h in mqtt_nodes],
        # INTERNAL (9092, SCRAM in clear): the deployment's tools; SERVICES (9095, SCRAM inside TLS, the
        # brokers CA): the site's services, so readings cross the site's LAN in TLS only.
        "kafka_bootstrap_internal": ",".join(f"kafka-{k['id']}:9092" for k in topology["kafka"]),
        "kafka_bootstrap_services": ",".join(f"kafka-{k['id']}:9095" for k in topology["kafka"]),
        # Brokers whose replicas move to the others (the topics role); they run until their host leaves.
        "kafka_retiring": (retiring := _retiring(hostvars, hosts, topology["kafka"], site_alias)),
        "kafka_serving": [k["id"] for k in topology["kafka"] if k["id"] not in retiring],
        # Cassandra nodes that leave their ring (`nodetool decommission`, the health role) while they still
        # run; a later run without their cassandra_id stops them.
        "cassandra_retiring": (leaving := _retiring(hostvars, hosts, topology["cassandra"], site_alias,
                                                    "cassandra")),
        "cassandra_serving": [c["id"] for c in topology["cassandra"] if c["id"] not in leaving],
        "zookeeper_connect": ",".join(f"zookeeper-{z['id']}:2182" for z in topology["zookeeper"]),
        # Ids run 1..n, so the first three nodes are always these names, whether or not the site has
        # them yet: adding a node changes no node's seed list (Cassandra skips a seed it cannot resolve,
        # and a new node takes itself off the list to bootstrap; images/cassandra/bin/cassandra-entrypoint).
        "cassandra_seeds": ",".join(f"cassandra-{i}" for i in range(1, CASSANDRA_SEEDS + 1)),
    })
    return topology


def pki_servers(topology: dict) -> list[dict]:
    """The servers of one site that get a certificate, with the names clients check: each Kafka broker
    (its EXTERNAL address and kafka-<id>), Prometheus and Alertmanager (the apps_node's address, prometheus
    and alertmanager) and, at an edge site, Mosquitto (every mqtt_node's address and mosquitto). Used by
    the pki role."""
    def san(address: str) -> str:
        try:
            ipaddress.ip_address(address)
            return f"IP:{address}"
        except ValueError:
            return f"DNS:{address}"
    servers = [{"name": f"kafka-{k['id']}", "sans": [san(str(k["address"])), f"DNS:kafka-{k['id']}"]}
               for k in topology["kafka"]]
    servers.append({"name": "prometheus",  # Prometheus' and Alertmanager's: the monitoring certificate
                    "sans": [san(str(topology["apps_address"])), "DNS:prometheus", "DNS:alertmanager"]})
    if topology.get("mqtt_addresses"):
        servers.append({"name": "mosquitto",
                        "sans": [*(san(str(a)) for a in topology["mqtt_addresses"]), "DNS:mosquitto"]})
    return servers


NODE_LABELS = tuple(f"iot.{name}" for name in (*ROLES, "apps", "mqtt", "stateless"))   # every label node_labels sets


def node_labels(hostvars_of_host: dict) -> dict:
    """Swarm node labels for one host, from its per-host variables."""
    labels = {}
    for role in ROLES:
        value = hostvars_of_host.get(f"{role}_id")
        if value not in (None, ""):
            labels[f"iot.{role}"] = str(value)
    for flag in ("apps_node", "mqtt_node", "stateless_node"):
        if _flagged(hostvars_of_host, flag):
            labels[f"iot.{flag.removesuffix('_node')}"] = "true"
    if _flagged(hostvars_of_host, "apps_node"):
        labels["iot.stateless"] = "true"     # the apps node takes its share of the stateless services too
    return labels


def stale_node_labels(hostvars_of_host: dict) -> list[str]:
    """The project's labels a host no longer gets (a flag or id taken out of the inventory): the swarm role
    removes them, so the services they pinned there leave the node."""
    return sorted(set(NODE_LABELS) - set(node_labels(hostvars_of_host)))


def external_bootstrap(topology: dict, port: int) -> str:
    """Bootstrap servers another site (the datacenter's MirrorMaker) uses: node address + host port."""
    return ",".join(f"{k['address']}:{port}" for k in topology["kafka"])


def edge_sites(hostvars: dict, groups: dict, edge_group: str, ignored: list[str], port: int) -> list[dict]:
    """Every edge site in the inventory with its external Kafka bootstrap (the relay) and the address its
    Prometheus is published on (the datacenter's federation).

    Works from the inventory alone, so a run limited to the datacenter and one new
    site still renders flows for all sites."""
    site_groups: dict[str, list[str]] = {}
    for host in groups.get(edge_group, []):
        names = [g for g in hostvars[host].get("group_names", []) if g not in ignored]
        if len(names) != 1:
            fail(f"{host}: belongs to site groups {names}; an edge host needs exactly one")
        site_groups.setdefault(names[0], []).append(host)
    sites = []
    for group, hosts in sorted(site_groups.items()):
        alias = hostvars[hosts[0]].get("site_alias") or group.replace("_", "-")
        topology = site_topology(hostvars, hosts, alias, "edge")
        sites.append({"alias": alias, "group": group, "bootstrap": external_bootstrap(topology, port),
                      "apps_address": topology["apps_address"]})
    aliases = [s["alias"] for s in sites]
    if len(set(aliases)) != len(aliases):
        fail(f"edge site aliases {aliases} are not unique; set site_alias per site group")
    return sites


# What ansible/filter_plugins/deploy_filters.py registers, by function name.
FILTERS = {f.__name__: f for f in (site_topology, node_labels, stale_node_labels, external_bootstrap, edge_sites,
                                   pki_servers)}
