"""Filters that turn an inventory group into a site topology, validating as they go.

`site_topology(hostvars, hosts, site_alias)` returns the per-node service layout
the stack templates render from, or raises AnsibleFilterError naming the host,
the variable and what it should be. Kept as plain Python so unit tests can call
it without Ansible (see tests/unit/test_topology.py).

Per-host variables (all optional except swarm_role):
  swarm_role       manager | worker
  zookeeper_id     1..n, unique in the site: this node runs zookeeper-<id>
  kafka_id         1..n, unique in the site: this node runs kafka-<id>
  cassandra_id     1..n, unique in the site: this node runs cassandra-<id>
  apps_node        true: the stateless services run here: Spark master, worker and
                   jobs, bridge, Cassandra adapter, MirrorMaker, Prometheus (one node per
                   site; Spark checkpoints and Prometheus' data live on this node's volumes)
  mqtt_node        true: Mosquitto runs here (devices connect to this address; edge only)
  ansible_host     address other sites and devices use to reach this node
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import re
import tomllib

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # unit tests without Ansible
    class AnsibleFilterError(Exception):  # type: ignore[no-redef]
        pass

ALIAS_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$")
ROLES = ("zookeeper", "kafka", "cassandra")
CASSANDRA_SEEDS = 3           # the usual count: one lost seed or two do not stop a node from starting
CASSANDRA_REPLICAS = 3        # replicas of the keyspaces, capped at the nodes (compose/_common.j2)


def _fail(message: str) -> None:
    raise AnsibleFilterError(message)


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
            _fail(f"{host}: {var}={raw!r} must be a whole number (1, 2, 3 ...)")
        if ident < 1:
            _fail(f"{host}: {var}={ident} must be 1 or more")
        if ident in placed:
            _fail(f"{host}: {var}={ident} is already used by {placed[ident]}; each {role} node needs its own id")
        placed[ident] = host
    if placed and sorted(placed) != list(range(1, len(placed) + 1)):
        _fail(f"{var} values {sorted(placed)} must run 1..{len(placed)} without gaps")
    return [{"id": i, "node": placed[i], "address": _address(hostvars, placed[i])} for i in sorted(placed)]


def _address(hostvars: dict, host: str) -> str:
    return str(hostvars[host].get("ansible_host") or host)


def _flag(hostvars: dict, hosts: list[str], var: str, what: str, site: str) -> str:
    chosen = [h for h in hosts if str(hostvars[h].get(var, False)).lower() in ("true", "yes", "1")]
    if len(chosen) != 1:
        _fail(f"site {site}: exactly one host needs {var}=true ({what}); found {chosen or 'none'}")
    return chosen[0]


def site_topology(hostvars: dict, hosts: list[str], site_alias: str, tier: str = "edge") -> dict:
    """Where every per-node service of one site runs, from the inventory."""
    if not isinstance(site_alias, str) or not ALIAS_RE.match(site_alias):
        _fail(f"site_alias={site_alias!r} must be lowercase letters, digits and dashes (e.g. site-a)")
    if tier not in ("edge", "datacenter"):
        _fail(f"tier={tier!r} must be edge or datacenter")
    if not hosts:
        _fail(f"site {site_alias}: the inventory group has no hosts")
    managers = []
    for host in hosts:
        role = hostvars[host].get("swarm_role")
        if role not in ("manager", "worker"):
            _fail(f"{host}: swarm_role={role!r} must be manager or worker")
        if role == "manager":
            managers.append(host)
    if not managers:
        _fail(f"site {site_alias}: no host has swarm_role=manager; make one host the manager")
    if len(managers) % 2 == 0:
        _fail(f"site {site_alias}: {len(managers)} managers; use an odd number so the Raft quorum survives a loss")
    topology = {role: _ids(hostvars, hosts, role) for role in ROLES}
    for role in ROLES:
        if not topology[role]:
            _fail(f"site {site_alias}: no host has {role}_id; give at least one host {role}_id=1")
    if len(topology["zookeeper"]) % 2 == 0:
        _fail(f"site {site_alias}: {len(topology['zookeeper'])} ZooKeeper nodes; use an odd number (1, 3, 5)")
    topology.update({
        "alias": site_alias,
        "tier": tier,
        "manager": managers[0],
        "managers": managers,
        "nodes": list(hosts),
        "apps_node": (apps_node := _flag(hostvars, hosts, "apps_node", "Spark, bridge, adapter, MirrorMaker",
                                         site_alias)),
        # Operators open the site's Prometheus here (HTTPS); its certificate names this address.
        "apps_address": _address(hostvars, apps_node),
        "mqtt_node": (mqtt_node := _flag(hostvars, hosts, "mqtt_node", "Mosquitto", site_alias)
                      if tier == "edge" else None),
        # Devices reach Mosquitto's TLS listener here; its certificate names this address.
        "mqtt_address": _address(hostvars, mqtt_node) if mqtt_node else None,
        "kafka_bootstrap_internal": ",".join(f"kafka-{k['id']}:9092" for k in topology["kafka"]),
        "zookeeper_connect": ",".join(f"zookeeper-{z['id']}:2181" for z in topology["zookeeper"]),
        # Ids run 1..n, so the first three nodes are always these names, whether or not the site has
        # them yet: adding a node changes no node's seed list (Cassandra skips a seed it cannot resolve,
        # and a new node takes itself off the list to bootstrap; images/cassandra/bin/cassandra-entrypoint).
        "cassandra_seeds": ",".join(f"cassandra-{i}" for i in range(1, CASSANDRA_SEEDS + 1)),
    })
    return topology


def pki_servers(topology: dict) -> list[dict]:
    """The servers of one site that get a certificate, with the names clients check: each Kafka broker
    (its EXTERNAL address and kafka-<id>), Prometheus (the apps_node's address and prometheus) and, at
    an edge site, Mosquitto (the mqtt_node's address and mosquitto). Used by the pki role."""
    def san(address: str) -> str:
        try:
            ipaddress.ip_address(address)
            return f"IP:{address}"
        except ValueError:
            return f"DNS:{address}"
    servers = [{"name": f"kafka-{k['id']}", "sans": [san(str(k["address"])), f"DNS:kafka-{k['id']}"]}
               for k in topology["kafka"]]
    servers.append({"name": "prometheus", "sans": [san(str(topology["apps_address"])), "DNS:prometheus"]})
    if topology.get("mqtt_address"):
        servers.append({"name": "mosquitto", "sans": [san(str(topology["mqtt_address"])), "DNS:mosquitto"]})
    return servers


def node_labels(hostvars_of_host: dict) -> dict:
    """Swarm node labels for one host, from its per-host variables."""
    labels = {}
    for role in ROLES:
        value = hostvars_of_host.get(f"{role}_id")
        if value not in (None, ""):
            labels[f"iot.{role}"] = str(value)
    for flag in ("apps_node", "mqtt_node"):
        if str(hostvars_of_host.get(flag, False)).lower() in ("true", "yes", "1"):
            labels[f"iot.{flag.removesuffix('_node')}"] = "true"
    return labels


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
        needed.update({"spark", "services", "prometheus"} | ({"kafka"} if tier == "datacenter" else set()))
    if "iot.mqtt" in labels:
        needed.add("mosquitto")
    return sorted(needed)


def site_images(hostvars: dict, hosts: list[str], tier: str) -> list[str]:
    """Project images any node of a site needs (what its registry host receives)."""
    needed: set[str] = set()
    for host in hosts:
        needed.update(node_images(hostvars[host], tier, hostvars[host].get("swarm_role") == "manager"))
    return sorted(needed)


def external_bootstrap(topology: dict, port: int) -> str:
    """Bootstrap servers another site (the datacenter's MirrorMaker) uses: node address + host port."""
    return ",".join(f"{k['address']}:{port}" for k in topology["kafka"])


def edge_sites(hostvars: dict, groups: dict, edge_group: str, ignored: list[str], port: int) -> list[dict]:
    """Every edge site in the inventory with its external Kafka bootstrap, for the relay.

    Works from the inventory alone, so a run limited to the datacenter and one new
    site still renders flows for all sites."""
    site_groups: dict[str, list[str]] = {}
    for host in groups.get(edge_group, []):
        names = [g for g in hostvars[host].get("group_names", []) if g not in ignored]
        if len(names) != 1:
            _fail(f"{host}: belongs to site groups {names}; an edge host needs exactly one")
        site_groups.setdefault(names[0], []).append(host)
    sites = []
    for group, hosts in sorted(site_groups.items()):
        alias = hostvars[hosts[0]].get("site_alias") or group.replace("_", "-")
        topology = site_topology(hostvars, hosts, alias, "edge")
        sites.append({"alias": alias, "group": group, "bootstrap": external_bootstrap(topology, port)})
    aliases = [s["alias"] for s in sites]
    if len(set(aliases)) != len(aliases):
        _fail(f"edge site aliases {aliases} are not unique; set site_alias per site group")
    return sites


MQTT_DEVICE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# The services' MQTT client ids (bridge-<slot>, mosquitto-agent-<slot>): no device id may start like them.
RESERVED_CLIENT_ID_PREFIXES = ("bridge-", "mosquitto-agent-")


def _mqtt_hash(site_alias: str, user: str, password: str, salt_key: str, iterations: int) -> str:
    """Mosquitto's $7$ hash (PBKDF2-SHA512), stable so reruns change nothing.

    The salt is an HMAC, keyed by `salt_key` (random per deployment, kept on the controller by the pki
    role), of site, user and password: unique per entry and unpredictable without the key, as a random
    salt is, yet the same on every run (a new salt would renew the secret and restart Mosquitto)."""
    if len(str(salt_key)) < 32:
        _fail("mqtt logins: the salt key must be at least 32 characters (the pki role's password-salt.key)")
    entry = f"{site_alias}:{user}:{password}".encode()
    salt = hmac.new(str(salt_key).encode(), entry, hashlib.sha256).digest()[:12]
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def mqtt_service_accounts(users: dict, kinds: list, site_alias: str, salt_key: str, iterations: int = 1000) -> str:
    """The secret mqtt_services that Mosquitto's iot_gate plugin reads: one line per service login on the
    overlay listener, `<user> <bridge|agent> <client id prefix> <$7$ hash>`. `kinds` lists each service
    login ({user, kind, prefix}); each must have a password in `users` (stack_mqtt_users)."""
    lines = ["# MQTT logins of the site's services (iot_gate plugin): user, kind, client-id prefix, hash"]
    for entry in kinds:
        user = str(entry["user"])
        if not user or " " in user or user not in users or not str(users[user]):
            _fail(f"stack_mqtt_users: the {entry['kind']} login {user!r} needs a password "
                  "(add it to stack_mqtt_users, kept in ansible-vault)")
        lines.append(f"{user} {entry['kind']} {entry['prefix']} "
                     f"{_mqtt_hash(site_alias, user, str(users[user]), salt_key, iterations)}")
    return "\n".join(lines) + "\n"


def mqtt_device_hashes(devices: dict, site_alias: str, salt_key: str, iterations: int = 1000) -> dict:
    """The inventory's devices (id -> password) as id -> $7$ hash, hashed here on the controller with
    stable salts, so the devices role writes nothing on a rerun and no password leaves the controller."""
    return {str(device): _mqtt_hash(site_alias, str(device), str(password), salt_key, iterations)
            for device, password in sorted((devices or {}).items(), key=lambda item: str(item[0]))}


_BCRYPT_B64 = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
                            "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def bcrypt_hash(password: str, user: str, salt_key: str) -> str:
    """A bcrypt hash of `user`'s password, stable so reruns change nothing: the salt is an HMAC of user
    and password keyed by `salt_key`, as in mosquitto_passwd. The site registry's htpasswd and
    Prometheus' web configuration (basic_auth_users) take it."""
    import bcrypt  # the controller's venv (pyproject, deploy); imported here, only when used
    if len(str(salt_key)) < 32:
        _fail("bcrypt_hash: the salt key must be at least 32 characters")
    raw = hmac.new(str(salt_key).encode(), f"{user}:{password}".encode(), hashlib.sha256).digest()[:16]
    salt = base64.b64encode(raw).decode()[:22].translate(_BCRYPT_B64)
    return bcrypt.hashpw(str(password).encode(), f"$2b$10${salt}".encode()).decode()


def registry_htpasswd(user: str, password: str, salt_key: str) -> str:
    """One line of the site registry's htpasswd file (bcrypt, which Distribution requires)."""
    return f"{user}:{bcrypt_hash(password, user, salt_key)}\n"


# ---------------------------------------------------------------- kafka access

def scram_jaas_config(user: str, password: str) -> str:
    """sasl.jaas.config of a Java client (MirrorMaker) logging in with SCRAM, as the value of a
    .properties line: the JAAS parser reads quoted values with backslash escapes, and
    java.util.Properties unescapes backslashes once more before it."""
    def quoted(value: object) -> str:
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    jaas = (f"org.apache.kafka.common.security.scram.ScramLoginModule required username={quoted(user)} "
            f"password={quoted(password)};")
    return jaas.replace("\\", "\\\\")


def relay_acls(user: str, topics: list, groups: list) -> list[dict]:
    """The relay principal's ACLs on an edge site (iot-kafka-access --acls): MirrorMaker may list,
    read and copy the configuration of the relayed topics, and read the committed offsets of the
    groups it checkpoints; nothing else, so it can neither write nor see another topic."""
    principal = f"User:{user}"
    acls = [{"principal": principal, "resource": "topic", "name": topic, "pattern": "literal", "operation": op}
            for topic in topics for op in ("READ", "DESCRIBE", "DESCRIBE_CONFIGS")]
    acls += [{"principal": principal, "resource": "group", "name": group, "pattern": "literal",
              "operation": "DESCRIBE"} for group in groups]
    return acls


def service_acls(services: list, relayed_from: list | None = None) -> list[dict]:
    """The ACLs of a site's own Kafka clients on INTERNAL (iot-kafka-access --acls), one principal per
    service. Each entry of `services` (templates/kafka-services.yml.j2) names its `user` and what it
    does: `reads` and `writes` (topics), `groups` (consumer groups it commits in) and `group_prefixes`
    (the Spark jobs' generated groups); MirrorMaker's also `owns` (topics, groups and transactional
    ids it creates and runs under, by prefix) and `cluster` (operations on the cluster). At the
    datacenter (`relayed_from`: the edge sites' aliases) every topic in `reads` is a relayed one,
    read as "<site>.<topic>" for each site. READ, WRITE and ALL imply DESCRIBE (Kafka's rule)."""
    acls = []

    def allow(user: str, resource: str, name: str, pattern: str, operation: str) -> None:
        acl = {"principal": f"User:{user}", "resource": resource, "name": name, "pattern": pattern,
               "operation": operation}
        if acl not in acls:
            acls.append(acl)

    for service in services:
        user = service["user"]
        reads = service.get("reads", [])
        if relayed_from is not None:
            reads = [f"{site}.{topic}" for topic in reads for site in relayed_from]
        for topic in reads:
            allow(user, "topic", topic, "literal", "READ")
        for topic in service.get("writes", []):
            allow(user, "topic", topic, "literal", "WRITE")
        for group in service.get("groups", []):
            allow(user, "group", group, "literal", "READ")
        for prefix in service.get("group_prefixes", []):
            allow(user, "group", prefix, "prefixed", "READ")
        for owned in service.get("owns", []):
            allow(user, owned["resource"], owned["name"], owned.get("pattern", "prefixed"), "ALL")
        for operation in service.get("cluster", []):
            allow(user, "cluster", "kafka-cluster", "literal", operation)
    return acls


# Kafka principals of the site's own services (ansible/roles/stack/vars/main.yml): no job may take one.
SERVICE_PRINCIPALS = ("broker", "admin", "bridge", "adapter", "mirrormaker", "mosquitto-agent")
JOB_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,40}[a-z0-9]$")


def spark_job_refusals(jobs: object) -> list[str]:
    """Preflight's check of stack_spark.jobs ({tier: [job]}): each job's name is a Swarm service and
    its own Kafka principal, so it must be short lower-case letters, digits and dashes and no other
    service's; `reads` and `writes` must list the topics it reads and writes, as its principal may
    use no other. One message per problem, naming the variable and the fix."""
    refusals = []
    if not isinstance(jobs, dict):
        return ["stack_spark.jobs must map each tier (edge, datacenter) to a list of jobs"]
    for tier, entries in sorted(jobs.items()):
        for i, job in enumerate(entries or []):
            where = f"stack_spark.jobs.{tier}[{i}]"
            name = job.get("name") if isinstance(job, dict) else None
            if not isinstance(name, str) or not JOB_NAME_RE.match(name):
                refusals.append(f"{where}: name {name!r} must be 2-42 lower-case letters, digits or dashes "
                                "(it names the job's service and its Kafka principal)")
            elif name in SERVICE_PRINCIPALS:
                refusals.append(f"{where}: name {name!r} is another service's Kafka principal; rename the job")
            for key in ("reads", "writes"):
                topics = job.get(key) if isinstance(job, dict) else None
                if not isinstance(topics, list) or not topics or not all(isinstance(t, str) and t for t in topics):
                    refusals.append(f"{where} ({name}): `{key}` must list the Kafka topics the job {key[:-1]}s, "
                                    f"e.g. {key}: [temperature-data]; its Kafka principal may use no other")
    return refusals


# ---------------------------------------------------------------- secrets

SECRET_MIN_LENGTH = 16
# Passwords that ship with software or examples. A value is refused when its letters and
# digits (lower case) are nothing but these words, or the user name, repeated and mixed,
# optionally followed by digits: "password", "Cassandra-Secret-2024", "admin_admin_admin1".
WELL_KNOWN_SECRETS = ("administrator", "cassandra", "changeit", "changeme", "default", "letmein", "mosquitto",
                      "passw0rd", "password", "qwerty", "secret", "adapter", "bridge", "device", "admin", "guest",
                      "kafka", "root", "test", "pass", "user", "iot", "operator", "relay")
PLACEHOLDER = "change-me"
# What each refusal suggests to encrypt: a random password, or the webhook's URL.
RANDOM_SECRET = '"$(openssl rand -base64 24)"'
WEBHOOK_EXAMPLE = "'https://api.telegram.org/bot<token>/sendMessage'"
# Spark job environment variables that would put a secret into the stack file in plain text.
PLAIN_ENV_SECRET_RE = re.compile(r"^(?!.*_FILE$)(WEBHOOK_URL$|(.*_)?(PASSWORD|PASSWD|SECRET|TOKEN)(_|$))")


def _letters_digits(value: str) -> str:
    return re.sub(r"[^a-z0-9]", "", value.lower())


def _made_of(plain: str, words: list[str]) -> bool:
    return bool(re.fullmatch("(?:" + "|".join(map(re.escape, words)) + r")*\d*", plain))


def weak_secret(value: object, user: str | None = None) -> str | None:
    """Why `value` is not fit to deploy as a secret, or None when it is: it must be set, be no
    placeholder (change-me...), have 16 characters or more, not be the user name, use at least 5
    different characters and be no well-known default password. The reason never repeats the value."""
    text = "" if value is None else str(value)
    plain = _letters_digits(text)
    if not text.strip():
        return "must be set"
    if plain.startswith(_letters_digits(PLACEHOLDER)):
        return f"is a placeholder (it starts with {PLACEHOLDER})"
    if len(text) < SECRET_MIN_LENGTH:
        return f"is shorter than {SECRET_MIN_LENGTH} characters"
    if user and _letters_digits(user) in plain and _made_of(plain, [_letters_digits(user)]):
        return "is the user name itself"
    if len(set(text)) < 5:
        return "uses fewer than 5 different characters"
    if _made_of(plain, [*WELL_KNOWN_SECRETS, *([_letters_digits(user)] if user else [])]):
        return "is a well-known default password"
    return None


def _refusal(label: str, why: str, variable: str, vault: str, example: str = RANDOM_SECRET) -> str:
    return (f"{label} {why}. Create a vaulted value with `ansible-vault encrypt_string {example} --name {vault}`,"
            f" add its output to the inventory (e.g. group_vars/all/vault.yml) and set {variable} to {vault}"
            " (see inventory.example/group_vars/all/secrets.yml).")


def mqtt_device_refusals(devices: object, service_users: object) -> list[str]:
    """Preflight's check of stack_mqtt_devices: one message per unfit device id, none when all fit.

    A device id is its MQTT user name and a segment of its topics (Mosquitto's ACL puts the login
    where the pattern says %u), so it must be a plain topic segment and no service's login."""
    if not isinstance(devices, dict):
        return [f"stack_mqtt_devices must map device ids to passwords, got {type(devices).__name__}"]
    refusals = []
    for device in sorted(devices, key=str):
        text = str(device)
        if not MQTT_DEVICE_RE.match(text):
            refusals.append(f"stack_mqtt_devices: device id {text!r} must be 1-64 letters, digits, '.', '_' or '-', "
                            "starting with a letter or digit "
                            "(it is the MQTT user name and a topic segment: no '/', '+', '#', ':' or spaces)")
        elif text.startswith(RESERVED_CLIENT_ID_PREFIXES):
            refusals.append(f"stack_mqtt_devices: device id {text!r} starts like a service's MQTT client id "
                            f"({', '.join(RESERVED_CLIENT_ID_PREFIXES)}); rename the device")
        elif text in (service_users or {}):
            refusals.append(f"stack_mqtt_devices: device id {text!r} is also in stack_mqtt_users; a device "
                            "needs its own login (rename the device)")
    return refusals


def secret_refusals(passwords: dict, users: dict | None = None, mqtt_users: dict | None = None,
                    webhook_url: object = "", spark_jobs: dict | None = None,
                    mqtt_devices: dict | None = None) -> list[str]:
    """Preflight's check of the secret variables: one message per refused value, none when all are fit.

    passwords    {variable name: value}, e.g. stack_cassandra_password (see weak_secret)
    users        {variable name: the user name that logs in with it}, for the user-name check
    mqtt_users   stack_mqtt_users, {MQTT user: password}: each password, named with its user
    mqtt_devices stack_mqtt_devices, {device id: password}: the same, per device
    webhook_url  stack_notifier_webhook_url: empty (no webhook) or an http(s) URL, no placeholder
    spark_jobs   stack_spark.jobs, {tier: [job]}: no job may carry a secret in its plain env

    Each message names the variable (and the MQTT user), says why, and how to create a vaulted
    value; none repeats a secret."""
    users = users or {}
    refusals = []
    for name, value in (passwords or {}).items():
        why = weak_secret(value, users.get(name))
        if why:
            refusals.append(_refusal(name, why, name, "vault_" + name.removeprefix("stack_")))
    for variable, who, logins in (("stack_mqtt_users", "user", mqtt_users), ("stack_mqtt_devices", "device",
                                                                              mqtt_devices)):
        for user, value in sorted((logins or {}).items(), key=lambda item: str(item[0])):
            why = weak_secret(value, str(user))
            if why:
                vault = f"vault_mqtt_{re.sub(r'[^A-Za-z0-9_]', '_', str(user))}_password"
                refusals.append(_refusal(f"{variable}: the password of {who} {user}",
                                         why.replace("the user name", "its user name"),
                                         f"{variable}.{user}", vault))
    url = "" if webhook_url is None else str(webhook_url).strip()
    why = None
    if _letters_digits(PLACEHOLDER) in _letters_digits(url) or "<" in url or ">" in url:
        why = "is a placeholder"
    elif url and not re.match(r"https?://[^/\s]+", url):
        why = "must be an http:// or https:// URL (or empty: no webhook)"
    if why:
        refusals.append(_refusal("stack_notifier_webhook_url", why, "stack_notifier_webhook_url",
                                 "vault_notifier_webhook_url", WEBHOOK_EXAMPLE))
    for tier, jobs in sorted((spark_jobs or {}).items()):
        for job in jobs or []:
            for key in sorted(job.get("env") or {}):
                if PLAIN_ENV_SECRET_RE.match(str(key)):
                    instead = ("set stack_notifier_webhook_url (vaulted) instead, which the notifier gets as the"
                               " Swarm secret notifier_webhook_url" if key == "WEBHOOK_URL"
                               else "pass secrets as Swarm secrets")
                    refusals.append(f"stack_spark.jobs.{tier} ({job.get('name')}): env {key} would put a secret"
                                    f" into the stack file in plain text; {instead}.")
    return refusals


def stack_files(spec: dict, home: str) -> dict:
    """{configs|secrets: {name: content}} -> {configs|secrets: {name: {path, hash}}} for the stack template."""
    return {kind: {name: {"path": f"{home}/{kind}/{name}",
                          "hash": hashlib.sha256(str(content).encode()).hexdigest()}
                   for name, content in spec.get(kind, {}).items()}
            for kind in ("configs", "secrets")}


def unconverged(lines: list[str]) -> list[str]:
    """Services of `docker stack services --format '{{.Name}} {{.Replicas}}'` not running all replicas."""
    pending = []
    for line in lines:
        parts = line.split()
        if len(parts) < 2:
            continue
        running, _, wanted = parts[1].partition("/")
        if running != wanted:
            pending.append(parts[0])
    return pending


def replication_short(lines: list[str], dc: str, nodes: int, keyspaces: list[str]) -> list[str]:
    """Keyspaces of `keyspaces` with fewer than min(nodes, 3) replicas in `dc`, from cqlsh's output of
    `SELECT JSON keyspace_name, replication FROM system_schema.keyspaces` (one JSON row per line).
    A keyspace not in the output does not exist yet and is not short; more replicas are not short
    either (replication is only ever raised; cassandra-auth-setup)."""
    wanted = min(nodes, CASSANDRA_REPLICAS)
    found: dict[str, int] = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        found[row["keyspace_name"]] = int(row["replication"].get(dc, 0))
    return [k for k in keyspaces if k in found and found[k] < wanted]


def updating(lines: list[str]) -> list[str]:
    """Services whose rolling update (or rollback) is not finished, from
    `docker service inspect --format '{{.Spec.Name}} {{.UpdateStatus.State}}'` lines."""
    busy = ("updating", "paused", "rollback_started", "rollback_paused")
    return [parts[0] for parts in (line.split() for line in lines) if len(parts) > 1 and parts[1] in busy]


def rolled_back(lines: list[str]) -> list[str]:
    """Services whose last update Swarm rolled back (its new tasks failed their health within the update's
    monitor window): they run their previous spec, not the stack file's. Same lines as `updating`."""
    return [parts[0] for parts in (line.split() for line in lines)
            if len(parts) > 1 and parts[1] == "rollback_completed"]


def from_toml(text: str) -> dict:
    """Parse TOML text (e.g. images/versions.toml read with the file lookup)."""
    try:
        return tomllib.loads(str(text))
    except tomllib.TOMLDecodeError as err:
        _fail(f"not valid TOML: {err}")


# ---------------------------------------------------------------- status (ansible/status.yml)
# The status playbook's probes print what Kafka's and Cassandra's own tools say, on each site's manager;
# these filters turn that into the table's figures on the controller. tooling/lab_status.py imports the
# relay-lag ones from here too: the logic lives in this one place.

STATUS_COLUMNS = ("site", "readings/s", "readings in kafka", "adapter lag", "events", "relay lag",
                  "cassandra readings", "cassandra events", "services converged")


def mm2_offsets_topic(site: str) -> str:
    """Where MirrorMaker 2 (dedicated mode) keeps its connectors' source offsets for one flow: in the
    target cluster, one topic per source (Kafka 3.9 MirrorMakerConfig: mm2-offsets.<source>.internal)."""
    return f"mm2-offsets.{site}.internal"


def copied_offsets(records, site: str, topic: str) -> dict[int, int]:
    """partition -> the next offset of `topic` at `site` that MirrorMaker has not copied yet, from the
    records (key, value) of its offsets topic, oldest first: the source connector stores, per source
    partition, the last upstream offset it copied ({"offset": N}); a later record replaces an earlier
    one and a null value deletes it. Records of other connectors, sites or topics, and bytes that are
    not the expected JSON, are ignored."""
    copied: dict[int, int] = {}
    for key, value in records:
        try:
            connector, partition = json.loads(key or b"null")
        except (TypeError, ValueError):
            continue
        if connector != "MirrorSourceConnector" or not isinstance(partition, dict) \
                or partition.get("cluster") != site or partition.get("topic") != topic \
                or not isinstance(partition.get("partition"), int):
            continue
        if value is None:
            copied.pop(partition["partition"], None)
            continue
        try:
            offset = json.loads(value)["offset"]
        except (TypeError, ValueError, KeyError):
            continue
        if isinstance(offset, int):
            copied[partition["partition"]] = offset + 1
    return copied


def relay_lag(site_ends: dict, copied: dict) -> int:
    """Records of a site's topic that MirrorMaker has not copied: per partition, from the next offset
    to copy (or the oldest offset there, if it has copied nothing yet) to the end. Offsets, not
    end-offset differences between the tiers: under exactly-once MirrorMaker's transaction markers
    take offsets at the datacenter too, which made the old difference go negative.
    `site_ends`: partition -> (low, high) watermark offsets at the site."""
    return sum(max(0, high - max(low, copied.get(partition, low))) for partition, (low, high) in site_ends.items())


def probe_sections(text: object) -> dict[str, list[str]]:
    """A probe's stdout, one `<section> <rest>` per line (the status role's scripts prefix each tool's
    lines with its section) -> {section: [rest, ...]}."""
    sections: dict[str, list[str]] = {}
    for line in str(text or "").splitlines():
        section, _, rest = line.partition(" ")
        if section:
            sections.setdefault(section, []).append(rest)
    return sections


def kafka_offsets(lines: list) -> dict[str, dict[int, int]]:
    """GetOffsetShell's `topic:partition:offset` lines -> {topic: {partition: offset}}; other lines are ignored."""
    offsets: dict[str, dict[int, int]] = {}
    for line in lines or []:
        parts = str(line).strip().rsplit(":", 2)
        if len(parts) == 3 and parts[0] and parts[1].isdigit() and parts[2].lstrip("-").isdigit():
            offsets.setdefault(parts[0], {})[int(parts[1])] = int(parts[2])
    return offsets


def group_offsets(lines: list, topic: str) -> dict[int, int]:
    """`kafka-consumer-groups --describe` output -> partition -> the group's committed offset on `topic`
    (partitions without one, shown as '-', are left out)."""
    header: list[str] = []
    committed: dict[int, int] = {}
    for line in lines or []:
        tokens = str(line).split()
        if "CURRENT-OFFSET" in tokens and "PARTITION" in tokens and "TOPIC" in tokens:
            header = tokens
            continue
        if not header or len(tokens) < len(header) - 3:
            continue
        row = dict(zip(header, tokens, strict=False))  # CONSUMER-ID and the rest may be missing
        if row.get("TOPIC") == topic and row.get("PARTITION", "").isdigit() and row.get("CURRENT-OFFSET", "").isdigit():
            committed[int(row["PARTITION"])] = int(row["CURRENT-OFFSET"])
    return committed


def mm2_records(lines: list) -> list[tuple[bytes, bytes | None]]:
    """The MirrorMaker offsets probe's `key<TAB>value` lines (files/mm2_offsets.py) -> (key, value) records,
    oldest first; the value `null` (a tombstone) becomes None. Lines without a tab are the tool's own messages."""
    records: list[tuple[bytes, bytes | None]] = []
    for line in lines or []:
        key, tab, value = str(line).partition("\t")
        if tab:
            records.append((key.encode(), None if value.strip() == "null" else value.encode()))
    return records


def cql_counts(lines: list) -> dict[str, int]:
    """cqlsh output of the status probe: a `<table>` line (its section) before each `SELECT count(*)`'s
    output -> {table: count}; a table whose query failed is left out."""
    counts: dict[str, int] = {}
    table = None
    for line in lines or []:
        text = str(line)
        if text.startswith("table "):
            table = text.split()[1] if len(text.split()) > 1 else None
        elif table and table not in counts and re.fullmatch(r"\s*\d+\s*", text):
            counts[table] = int(text)
    return counts


def services_converged(lines: list, stack: str = "") -> str:
    """`docker stack services --format '{{.Name}} {{.Replicas}}'` -> `converged/all`, followed by the services
    that do not run all their replicas with their running/desired counts: `11/12 (bridge 0/2)`."""
    services = [line.split() for line in lines or [] if len(str(line).split()) >= 2]
    if not services:
        return "none"
    pending = set(unconverged([" ".join(parts) for parts in services]))
    text = f"{len(services) - len(pending)}/{len(services)}"
    if pending:
        prefix = f"{stack}_" if stack else ""
        text += " (" + ", ".join(f"{name.removeprefix(prefix)} {replicas}"
                                 for name, replicas, *_ in services if name in pending) + ")"
    return text


def _number(value: object, digits: int = 0) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _edge_row(probe: dict, topics: dict, records: list | None, relayed: list | None) -> dict:
    sections = probe_sections(probe.get("kafka"))
    first, last = kafka_offsets(sections.get("first")), kafka_offsets(sections.get("last"))
    earliest = kafka_offsets(sections.get("earliest"))
    times = {}
    for line in sections.get("time", []):
        name, _, stamp = line.partition(" ")
        try:
            times[name] = float(stamp)
        except ValueError:
            pass
    readings, events = topics["readings"], topics["events"]
    now = sum(last[readings].values()) if readings in last else None
    rate = None
    if now is not None and readings in first and times.get("last", 0) > times.get("first", 0) > 0:
        rate = (now - sum(first[readings].values())) / (times["last"] - times["first"])
    lag = None
    if readings in last and "group" in sections:
        committed = group_offsets(sections["group"], readings)
        # The group is described after the offsets were sampled: a partition committed past its sampled end
        # had caught up by then (not a negative lag; the lab showed -232 before this max).
        lag = sum(max(0, high - committed.get(partition, 0)) for partition, high in last[readings].items())
    relay: object = None
    if relayed is not None and events not in relayed:
        relay = "not relayed"
    elif records is not None and events in last:
        ends = {p: (earliest.get(events, {}).get(p, 0), high) for p, high in last[events].items()}
        relay = relay_lag(ends, copied_offsets(records, probe["site"], events))
    counts = cql_counts(str(probe.get("cassandra") or "").splitlines())
    return {"site": probe["site"], "readings/s": _number(rate), "readings in kafka": _number(now),
            "adapter lag": _number(lag),
            "events": _number(sum(last[events].values()) if events in last else None),
            "relay lag": _number(relay),
            "cassandra readings": _number(counts.get(topics["readings_table"])),
            "cassandra events": _number(counts.get(topics["events_table"])),
            "services converged": services_converged(probe.get("services"), probe["site"])}


def status_rows(probes: list, sites: dict, topics: dict) -> list[dict]:
    """One row per site: each edge site's, then the datacenter's. `probes`: what each site's manager
    measured ({site, tier, kafka, cassandra, services; the datacenter's mm2 and relayed}); `sites`:
    alias -> tier of every site in the run (a site without a probe did not answer); `topics`: the names
    of the readings and threshold-events topics and tables."""
    by_site = {probe["site"]: probe for probe in probes or []}
    datacenter = next((p for p in by_site.values() if p.get("tier") == "datacenter"), None)
    records = mm2_records(str(datacenter.get("mm2") or "").splitlines()) if datacenter and datacenter.get("mm2") \
        else None
    relayed = list(datacenter.get("relayed") or []) if datacenter else None
    rows = []
    order = sorted(sites, key=lambda s: (sites[s] == "datacenter", s))
    for site in order:
        probe = by_site.get(site)
        if probe is None:
            rows.append({"site": site, **{c: "no answer" if c == "services converged" else "-"
                                          for c in STATUS_COLUMNS[1:]}})
        elif sites[site] == "datacenter":
            counts = cql_counts(str(probe.get("cassandra") or "").splitlines())
            readings = _number(counts.get(topics["readings_table"])) if topics["readings"] in (relayed or []) else "-"
            rows.append({"site": site, "readings/s": "-", "readings in kafka": "-", "adapter lag": "-", "events": "-",
                         "relay lag": "-", "cassandra readings": readings,
                         "cassandra events": _number(counts.get(topics["events_table"])),
                         "services converged": services_converged(probe.get("services"), site)})
        else:
            rows.append(_edge_row(probe, topics, records, relayed))
    return rows


def format_table(rows: list) -> str:
    """Rows (dicts with the same keys) as left-aligned columns, two spaces apart, no trailing blanks."""
    if not rows:
        return ""
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(str(r[c]).ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)


def parse_table(text: str) -> list[dict]:
    """format_table's text back into rows: columns start where their header starts; the table ends at the
    first blank line (notes follow it)."""
    lines = str(text).strip("\n").split("\n\n")[0].splitlines()
    if not lines:
        return []
    starts = [m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", lines[0])]
    names = [lines[0][a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    spans = list(zip(names, starts, [*starts[1:], None], strict=True))
    return [{name: line[a:b].strip() for name, a, b in spans} for line in lines[1:]]


def status_table(probes: list, sites: dict, topics: dict) -> str:
    """The status playbook's table: status_rows, formatted, then a note for each probe that failed (its
    figures show n/a) with the last line it wrote on stderr."""
    notes = [f"{probe['site']}: the {name} probe failed: {message}"
             for probe in sorted(probes or [], key=lambda p: p["site"])
             for name, message in sorted((probe.get("errors") or {}).items())]
    return "\n".join([format_table(status_rows(probes, sites, topics)), *([""] + notes if notes else [])])


class FilterModule:
    def filters(self):
        return {"site_topology": site_topology, "node_labels": node_labels, "node_images": node_images,
                "site_images": site_images,
                "external_bootstrap": external_bootstrap, "edge_sites": edge_sites,
                "mqtt_service_accounts": mqtt_service_accounts, "mqtt_device_hashes": mqtt_device_hashes,
                "pki_servers": pki_servers,
                "registry_htpasswd": registry_htpasswd, "bcrypt_hash": bcrypt_hash,
                "mqtt_device_refusals": mqtt_device_refusals, "stack_files": stack_files, "unconverged": unconverged,
                "updating": updating, "replication_short": replication_short, "rolled_back": rolled_back,
                "from_toml": from_toml,
                "secret_refusals": secret_refusals,
                "scram_jaas_config": scram_jaas_config, "relay_acls": relay_acls,
                "service_acls": service_acls, "spark_job_refusals": spark_job_refusals,
                "mm2_offsets_topic": mm2_offsets_topic, "status_table": status_table}
