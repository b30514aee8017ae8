"""Rolling upgrades of a site's stateful services, one node at a time (docs/operations.md, Upgrades).

A site's ZooKeeper, Kafka and Cassandra nodes are separate Swarm services, so one `docker stack deploy` of a
changed file would restart them all at once. The stack role deploys it in stages computed here:

  stage 0     the new file, every changed stateful service on its deployed definition;
  opening     a node gaining a TLS listener that others will need serves both ways, one per stage: a broker
              opens BROKER and SERVICES, keeping INTERNAL; a Cassandra node or ZooKeeper server takes TLS and
              clear from clients and peers, sending clear (_serving_both); clients gaining TLS wait for these;
  sending     then each Cassandra node or ZooKeeper server gaining TLS between nodes sends it, taking clear;
  stage 1..n  one more stateful service on its new definition: ZooKeeper (leader last), Kafka, Cassandra; a
              ZooKeeper server that opened TLS for clients closes clear after every broker moved onto TLS.

Between stages the role waits for its health gates. A kept definition whose configs or secrets changed since
points at the deployed Swarm objects, declared `external` under `<key>__deployed`.
"""
from __future__ import annotations

import copy
import re

import yaml

from deploy.errors import fail

STATEFUL = re.compile(r"^(zookeeper|kafka|cassandra)-(\d+)$")
KIND_ORDER = ("zookeeper", "kafka", "cassandra")
DEPLOYED_SUFFIX = "__deployed"
TLS_KEYSTORE = "CASSANDRA_TLS_KEYSTORE_FILE"        # a Cassandra node with CQL over TLS
INTERNODE_TLS = "CASSANDRA_INTERNODE_TLS"           # and between nodes: required, sending or accepting
QUORUM_TLS = "ZOO_QUORUM_TLS"                       # ZooKeeper servers between them: the same four values
CQL_CA = "ADAPTER_CASSANDRA_CA_FILE"                # a CQL client checking nodes against the Cassandra CA
BROKERS_CA = "kafka_brokers_ca"                     # the secret of a Kafka client on SERVICES (TLS)
ZOOKEEPER_TLS = "ZOO_TLS_KEYSTORE_FILE"             # a ZooKeeper server taking clients over TLS
CQL_OPENED, ZOOKEEPER_OPENED = "CQL over TLS opened", "clients over TLS opened"
INTERNODE_OPENED, INTERNODE_SENT = "inter-node TLS accepted", "inter-node TLS sent"


def _load(text: object, what: str) -> dict:
    try:
        doc = yaml.safe_load(str(text or "")) or {}
    except yaml.YAMLError as err:
        fail(f"{what} is not valid YAML: {err}")
    if not isinstance(doc, dict):
        fail(f"{what} is not a stack file (a mapping)")
    return doc


def changed_stateful(deployed: dict, new: dict, zookeeper_leader: int | None = None) -> list[str]:
    """Stateful services in both files whose definitions differ, in the order they roll."""
    old_services, new_services = deployed.get("services") or {}, new.get("services") or {}
    changed = []
    for name, definition in new_services.items():
        match = STATEFUL.match(name)
        if match and name in old_services and _resolved(deployed, old_services[name]) != _resolved(new, definition):
            kind, ident = match.group(1), int(match.group(2))
            leader_last = kind == "zookeeper" and ident == zookeeper_leader
            changed.append((KIND_ORDER.index(kind), leader_last, ident, name))
    return [name for *_, name in sorted(changed)]


def _resolved(doc: dict, service: dict) -> dict:
    """A service's definition with each config/secret reference replaced by the Swarm object it names, so
    that a changed file (a new object name) counts as a change of the service."""
    resolved = copy.deepcopy(service)
    for kind in ("configs", "secrets"):
        objects = doc.get(kind) or {}
        refs = []
        for ref in resolved.get(kind) or []:
            ref = dict(ref) if isinstance(ref, dict) else {"source": ref}
            ref["source"] = (objects.get(ref["source"]) or {}).get("name", ref["source"])
            refs.append(ref)
        if refs:
            resolved[kind] = refs
    return resolved


def _kept(deployed: dict, service: dict, stage: dict) -> dict:
    """The deployed definition of a service, its config/secret references pointed at the deployed objects."""
    kept = copy.deepcopy(service)
    for kind in ("configs", "secrets"):
        old_objects, stage_objects = deployed.get(kind) or {}, stage.setdefault(kind, {})
        refs = []
        for ref in kept.get(kind) or []:
            ref = dict(ref) if isinstance(ref, dict) else {"source": ref}
            key = ref["source"]
            old_name = (old_objects.get(key) or {}).get("name")
            current = stage_objects.get(key) or {}
            if old_name and current.get("name") != old_name:
                # The short form's target: the key, under /run/secrets for a secret, at / for a config.
                ref.setdefault("target", key if kind == "secrets" else f"/{key}")
                ref["source"] = key + DEPLOYED_SUFFIX
                stage_objects[key + DEPLOYED_SUFFIX] = {"external": True, "name": old_name}
            refs.append(ref)
        if refs:
            kept[kind] = refs
    return kept


def _environment(service: dict) -> dict:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return env


def _env(service: dict, key: str) -> str:
    return str(_environment(service).get(key, ""))


def _gains_cql_tls(deployed_service: dict, new_service: dict) -> bool:
    return not _env(deployed_service, TLS_KEYSTORE) and bool(_env(new_service, TLS_KEYSTORE))


def _gains_zookeeper_tls(deployed_service: dict, new_service: dict) -> bool:
    return not _env(deployed_service, ZOOKEEPER_TLS) and bool(_env(new_service, ZOOKEEPER_TLS))


def _internode_tls(name: str, service: dict) -> str:
    """A Cassandra node's TLS between nodes, or a ZooKeeper server's between servers. The stack names a Cassandra
    node's with the keystore; a definition with the keystore and without the setting was deployed before
    inter-node TLS existed, and its image sends and takes clear."""
    if name.startswith("zookeeper-"):
        return _env(service, QUORUM_TLS) or "off"
    return (_env(service, INTERNODE_TLS) or "off") if _env(service, TLS_KEYSTORE) else "off"


def _gains_internode_tls(name: str, deployed: dict, new: dict) -> bool:
    """A Cassandra node or ZooKeeper server that will refuse clear from its peers, and has peers: they must all
    take TLS, then all send it, before the first refuses clear (a node alone restarts once)."""
    kind = name.split("-")[0] + "-"
    old_services = deployed.get("services") or {}
    peers = [other for other in old_services if other != name and other.startswith(kind) and STATEFUL.match(other)]
    return (kind in ("cassandra-", "zookeeper-") and bool(peers)
            and _internode_tls(name, old_services[name]) != "required"
            and _internode_tls(name, new["services"][name]) == "required")


def _gained_listeners(name: str, deployed: dict, new: dict) -> list[str]:
    """The TLS listeners a broker advertises in `new` and not in `deployed`: BROKER, SERVICES or both."""
    if not name.startswith("kafka-"):
        return []
    before = _env(deployed["services"][name], "KAFKA_ADVERTISED_LISTENERS")
    after = _env(new["services"][name], "KAFKA_ADVERTISED_LISTENERS")
    return [listener for listener in ("BROKER", "SERVICES")
            if f"{listener}://" not in before and f"{listener}://" in after]


def _opens(name: str, deployed: dict, new: dict) -> bool:
    """A node gaining a TLS listener its peers or clients will need: a broker's BROKER or SERVICES, a Cassandra
    node's CQL over TLS or its TLS between nodes, a ZooKeeper server's client port over TLS."""
    if name.startswith("kafka-"):
        return bool(_gained_listeners(name, deployed, new))
    if name.startswith("zookeeper-"):
        return (_gains_zookeeper_tls(deployed["services"][name], new["services"][name])
                or _gains_internode_tls(name, deployed, new))
    if name.startswith("cassandra-"):
        return (_gains_cql_tls(deployed["services"][name], new["services"][name])
                or _gains_internode_tls(name, deployed, new))
    return False


def _serving_both(name: str, deployed: dict, new: dict, internode: str) -> dict:
    """The new definition of an opening or sending node: a broker with its new listeners open, replication
    still on INTERNAL when BROKER is one of them; a Cassandra node taking CQL over TLS and in clear (when it
    gains CQL over TLS), and between nodes `internode` (when it gains TLS there); a ZooKeeper server taking
    clients over TLS and, on every address, in clear (when it gains that), and between servers `internode`."""
    service = new["services"][name]
    opened = copy.deepcopy(service)
    if name.startswith("kafka-"):
        gains_broker = "BROKER" in _gained_listeners(name, deployed, new)
        both = {"KAFKA_INTER_BROKER_LISTENER_NAME": "INTERNAL"} if gains_broker else {}
        both |= _keeping_internal(deployed["services"][name], _environment(service))
    elif name.startswith("zookeeper-"):
        both = {"ZOO_CLIENT_TLS": "optional"} if _gains_zookeeper_tls(deployed["services"][name], service) else {}
        if _gains_internode_tls(name, deployed, new):
            both[QUORUM_TLS] = internode
    else:
        both = {"CASSANDRA_CLIENT_TLS": "optional"} if _gains_cql_tls(deployed["services"][name], service) else {}
        if _gains_internode_tls(name, deployed, new):
            both[INTERNODE_TLS] = internode
    opened["environment"] = {**_environment(service), **both}
    return opened


def _keeping_internal(deployed_service: dict, env: dict) -> dict:
    """A broker's listener settings with INTERNAL kept open as deployed, when its new definition closes it: the
    clients and the replication still on INTERNAL move off it only after every broker has opened the rest."""
    advertised = str(env.get("KAFKA_ADVERTISED_LISTENERS", ""))
    internal = [entry for entry in _env(deployed_service, "KAFKA_ADVERTISED_LISTENERS").split(",")
                if entry.startswith("INTERNAL://")]
    if not internal or "INTERNAL://" in advertised:
        return {}
    kept = {"KAFKA_ADVERTISED_LISTENERS": f"{internal[0]},{advertised}"}
    if env.get("KAFKA_LISTENERS"):
        port = internal[0].rsplit(":", 1)[1]
        kept["KAFKA_LISTENERS"] = f"INTERNAL://0.0.0.0:{port},{env['KAFKA_LISTENERS']}"
    return kept


def _secrets(service: dict) -> set[str]:
    return {ref["source"] if isinstance(ref, dict) else ref for ref in service.get("secrets") or []}


def _clients_gaining_tls(deployed: dict, new: dict, uses_tls) -> list[str]:
    """Stateless services in both files for whose new definition `uses_tls` holds and for whose deployed one
    not: CQL over TLS names the Cassandra CA in the environment; Kafka on SERVICES mounts the brokers CA (so
    MirrorMaker counts, whose settings are in its properties file)."""
    old_services = deployed.get("services") or {}
    return [name for name, service in (new.get("services") or {}).items()
            if name in old_services and not STATEFUL.match(name)
            and uses_tls(service) and not uses_tls(old_services[name])]


def rollout_stages(deployed_text: object, new_text: object, zookeeper_leader: object = None) -> list[dict]:
    """Stages of a rolling deploy of `new_text` over `deployed_text`: [{service, node, text, cassandra_tls,
    kafka_tls}, ...].

    The first stage's service is '' (only stateless changes); each further stage rolls `node` (a service of
    the stack file; `service` names it for people, "cassandra-1 (CQL over TLS opened)", "cassandra-1 (inter-node
    TLS sent)");
    `cassandra_tls` is false while a Cassandra node of the stage may still take CQL in clear only (the health
    role's probes then use CQL in clear); `kafka_tls` is false while a broker of the stage may lack SERVICES
    (the Kafka gate then goes to INTERNAL). Empty when nothing stateful changed, or nothing was deployed before
    (a first deploy has nothing to roll)."""
    if not str(deployed_text or "").strip():
        return []
    deployed, new = _load(deployed_text, "the deployed stack file"), _load(new_text, "the new stack file")
    leader = int(zookeeper_leader) if str(zookeeper_leader or "").isdigit() else None
    order = changed_stateful(deployed, new, leader)
    if not order:
        return []
    opening = [name for name in order if _opens(name, deployed, new)]
    order = _brokers_before_closing_zookeeper(order, deployed, new)
    sending = [name for name in opening if _gains_internode_tls(name, deployed, new)]
    gaining_cql = [name for name in opening if name.startswith("cassandra-")
                   and _gains_cql_tls(deployed["services"][name], new["services"][name])]
    gaining_services = [name for name in opening if "SERVICES" in _gained_listeners(name, deployed, new)]
    waiting = set(_clients_gaining_tls(deployed, new, lambda s: bool(_environment(s).get(CQL_CA)))
                  if gaining_cql else [])
    waiting |= set(_clients_gaining_tls(deployed, new, lambda s: BROKERS_CA in _secrets(s))
                   if gaining_services else [])

    def stage_text(rolled: list[str], opened: list[str], sent: list[str], clients_new: bool) -> str:
        stage = copy.deepcopy(new)
        for name in order:
            if name in rolled:
                continue
            if name in sent:
                stage["services"][name] = _serving_both(name, deployed, new, "sending")
            elif name in opened:
                stage["services"][name] = _serving_both(name, deployed, new, "accepting")
            else:
                stage["services"][name] = _kept(deployed, deployed["services"][name], stage)
        if not clients_new:
            for name in sorted(waiting):
                stage["services"][name] = _kept(deployed, deployed["services"][name], stage)
        for kind in ("volumes", "networks"):            # a kept definition may use what the new file dropped
            for key, value in (deployed.get(kind) or {}).items():
                stage.setdefault(kind, {}).setdefault(key, value)
        return yaml.safe_dump(stage, sort_keys=False, default_flow_style=False)

    def opened_label(name: str) -> str:
        if name.startswith("kafka-"):
            return " and ".join(_gained_listeners(name, deployed, new)) + " opened"
        if name.startswith("zookeeper-") and _gains_zookeeper_tls(deployed["services"][name], new["services"][name]):
            return ZOOKEEPER_OPENED + (", " + INTERNODE_OPENED if name in sending else "")
        return CQL_OPENED if name in gaining_cql else INTERNODE_OPENED

    before = {"cassandra_tls": not gaining_cql, "kafka_tls": not gaining_services}   # until all have opened
    opened = {"cassandra_tls": not gaining_cql, "kafka_tls": True}
    stages = [{"service": "", "node": "", "text": stage_text([], [], [], False), **before}]
    stages += [{"service": f"{name} ({opened_label(name)})", "node": name,
                "text": stage_text([], opening[:i + 1], [], False), **before}
               for i, name in enumerate(opening)]
    stages += [{"service": f"{name} ({INTERNODE_SENT})", "node": name,
                "text": stage_text([], opening, sending[:i + 1], False), **opened}
               for i, name in enumerate(sending)]
    stages += [{"service": name, "node": name, "text": stage_text(order[:i + 1], opening, sending, True),
                "cassandra_tls": True, "kafka_tls": True} for i, name in enumerate(order)]
    return stages


def _brokers_before_closing_zookeeper(order: list[str], deployed: dict, new: dict) -> list[str]:
    """The roll order with each ZooKeeper server that opened TLS for clients moved after the brokers: its new
    definition takes clear on its loopback only, and a broker not rolled yet still reaches it in clear."""
    closing = [name for name in order if name.startswith("zookeeper-")
               and _gains_zookeeper_tls(deployed["services"][name], new["services"][name])]
    if not closing:
        return order
    rest = [name for name in order if name not in closing]
    kafka = [i for i, name in enumerate(rest) if name.startswith("kafka-")]
    at = kafka[-1] + 1 if kafka else sum(name.startswith("zookeeper-") for name in rest)
    return rest[:at] + closing + rest[at:]


def zookeeper_leader(lines: list) -> str:
    """The id of the node whose `srvr` says `Mode: leader`, from '<id> <mode>' lines; '' when none does."""
    leaders = [parts[0] for parts in (str(line).split() for line in lines or []) if parts[1:] == ["leader"]]
    return leaders[0] if len(leaders) == 1 else ""


def zookeeper_quorum(lines: list, nodes: int) -> bool:
    """'<id> <mode>' lines for every node: all serve, and with more than one node exactly one leads."""
    modes = [parts[1] if len(parts) > 1 else "" for parts in (str(line).split() for line in lines or [])]
    if len(modes) != nodes or any(mode not in ("leader", "follower", "standalone") for mode in modes):
        return False
    return modes == ["standalone"] if nodes == 1 else modes.count("leader") == 1


# What ansible/filter_plugins/deploy_filters.py registers, by function name.
FILTERS = {f.__name__: f for f in (rollout_stages, zookeeper_leader, zookeeper_quorum)}
