"""Preflight's checks of the inventory: one refusal per unfit value, naming the variable and the fix.

Secrets (weak_secret: set, no placeholder, 16+ characters, not the user name, 5+ different characters,
no well-known default), device ids, the Spark jobs' names, topics and environment, and JVM heaps
(heap_refusals: every heap fits its container's memory limit by HEAP_SHARE).
"""
from __future__ import annotations

import re

MQTT_DEVICE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# The services' MQTT client ids (bridge-<slot>, mosquitto-agent-<slot>): no device id may start like them.
RESERVED_CLIENT_ID_PREFIXES = ("bridge-", "mosquitto-agent-")


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
    webhook_url  stack_notifier_webhook_url: empty (no webhook) or an https URL, no placeholder
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
    elif url and not re.match(r"https://[^/\s]+", url):
        # The URL carries the bot's token, and the messages name the site's faults: never in clear.
        why = "must be an https:// URL (or empty: no webhook)"
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


# ---------------------------------------------------------------- heaps

# The share of its container's memory limit (stack_resources.<service>.memory) the JVM heaps in a container may
# take; the rest is the JVM's own memory (metaspace, threads, direct buffers) and, for Spark, the Python
# processes. Cassandra also keeps memtables, bloom filters, caches and compression metadata off the heap
# (jemalloc), so its heap gets half (docs/operations.md, "Before you deploy").
HEAP_SHARE = {"cassandra": 0.5}
DEFAULT_HEAP_SHARE = 0.75
# What the rest of the container holds, for the refusal.
HEAP_REST = {None: "the JVM's own memory", "cassandra": "Cassandra's off-heap memory: memtables and caches",
             "spark_worker": "the JVMs' own memory and the executors' Python workers",
             "spark_job": "the JVM's own memory and the job's Python driver"}
MIB = 1024 ** 2
_UNITS = {"": 1, "b": 1, "k": 1024, "m": MIB, "g": 1024 ** 3, "t": 1024 ** 4, "p": 1024 ** 5}
JVM_SIZE_RE = re.compile(r"^(\d+)([kKmMgGtT]?)$")
# What Docker takes for a memory limit (docker/go-units RAMInBytes): 3G, 1536M, 1.5g, 512MiB, bytes.
DOCKER_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?) ?([kKmMgGtTpP]?)[iI]?[bB]?$")
# (stack_heap key, service of stack_resources, what the stack passes it as)
JVM_OPTS_HEAPS = (("zookeeper", "zookeeper", "ZOO_HEAP_OPTS"), ("kafka", "kafka", "KAFKA_HEAP_OPTS"),
                  ("mirrormaker", "mirrormaker", "MM2_HEAP_OPTS"))


def jvm_size(text: object) -> int | None:
    """Bytes of a JVM size (-Xmx's argument, Cassandra's CASSANDRA_HEAP): 4G, 1536m, 512k; None if unfit."""
    match = JVM_SIZE_RE.match(str(text).strip())
    return int(match[1]) * _UNITS[match[2].lower()] if match else None


def memory_limit(text: object) -> int | None:
    """Bytes of a Docker memory limit (3G, 1536M, 1.5g, a plain number of bytes); None if unfit."""
    match = DOCKER_SIZE_RE.match(str(text).strip())
    return int(float(match[1]) * _UNITS[match[2].lower()]) if match else None


def opts_heap(opts: object) -> int | None:
    """The largest heap JVM options allow: the last -Xmx, else the last -Xms (the JVM raises its maximum to
    it); 0 when neither is set (the JVM then takes a quarter of the container). None if a size is unfit."""
    words = str(opts or "").split()
    for flag in ("-Xmx", "-Xms"):
        sizes = [w[len(flag):] for w in words if w.startswith(flag)]
        if sizes:
            return jvm_size(sizes[-1])
    return 0


def _mib(size: int, upper: bool = False) -> str:
    """A size in whole MiB (rounded down, or up with `upper`), as G when it is whole gibibytes."""
    mib = -(-size // MIB) if upper else size // MIB
    return f"{mib // 1024}G" if mib and mib % 1024 == 0 else f"{mib}M"


def heap_refusals(heap: object, resources: object, spark: object = None) -> list[str]:
    """Preflight's check that the JVM heaps of each container fit its memory limit: at most HEAP_SHARE
    (Cassandra) or DEFAULT_HEAP_SHARE of stack_resources.<service>.memory.

    heap       stack_heap: JVM options for zookeeper, kafka, mirrormaker; Cassandra's heap as a size (4G)
    resources  stack_resources: {service: {memory: limit, ...}}
    spark      stack_spark: daemon_memory (master, worker), worker_memory (the worker's executors) and
               driver_memory (each job's container); the master and worker only in cluster mode

    One message per unfit or unreadable value, naming both variables and the fix."""
    heap = heap if isinstance(heap, dict) else {}
    resources = resources if isinstance(resources, dict) else {}
    spark = spark if isinstance(spark, dict) else {}
    refusals = []
    # (service, [(variable, value, bytes)]): the heaps that share the service's container.
    checks = []
    for key, service, env in JVM_OPTS_HEAPS:
        size = opts_heap(heap.get(key))
        if key not in heap or size is None:
            refusals.append(f"stack_heap.{key} = {heap.get(key)!r} must be JVM heap options with sizes the JVM"
                            f" reads, e.g. \"-Xms512m -Xmx1g\" (the stack passes it as {env})")
        elif size:
            checks.append((service, [(f"stack_heap.{key}", heap[key], size)]))
    size = jvm_size(heap.get("cassandra"))
    if size is None:
        refusals.append(f"stack_heap.cassandra = {heap.get('cassandra')!r} must be a size such as 4G or 1536M"
                        " (Cassandra's -Xms and -Xmx, CASSANDRA_HEAP)")
    else:
        checks.append(("cassandra", [("stack_heap.cassandra", heap["cassandra"], size)]))
    wanted = [("spark_job", ["driver_memory"])]
    if spark.get("mode", "cluster") == "cluster":
        wanted += [("spark_master", ["daemon_memory"]), ("spark_worker", ["daemon_memory", "worker_memory"])]
    for service, keys in wanted:
        sizes = [(f"stack_spark.{key}", spark.get(key), jvm_size(spark.get(key))) for key in keys]
        unfit = [f"{variable} = {value!r}" for variable, value, size in sizes if size is None]
        if unfit:
            refusals.append(f"{', '.join(unfit)} must be a size such as 512m or 2g (Spark's memory settings)")
        else:
            checks.append((service, sizes))
    for service, sizes in checks:
        limit_variable = f"stack_resources.{service}.memory"
        entry = resources.get(service)
        limit_value = entry.get("memory") if isinstance(entry, dict) else None
        limit = memory_limit(limit_value)
        if not limit:
            refusals.append(f"{limit_variable} = {limit_value!r} must be a memory limit such as 3G or 1536M")
            continue
        share = HEAP_SHARE.get(service, DEFAULT_HEAP_SHARE)
        total = sum(size for _, _, size in sizes)
        if total <= limit * share:
            continue
        last, room = sizes[-1][0], int(limit * share) - (total - sizes[-1][2])
        lower = f"the -Xmx of {last}" if last.startswith("stack_heap.") and last != "stack_heap.cassandra" else last
        refusals.append(
            f"{' + '.join(v for v, _, _ in sizes)} = {' + '.join(str(x) for _, x, _ in sizes)}"
            f" ({_mib(total, upper=True)} of heap) does not fit {limit_variable} = {limit_value}: the heap may take"
            f" at most {share:.0%} of the container's memory limit ({_mib(int(limit * share))}; the rest is"
            f" {HEAP_REST.get(service, HEAP_REST[None])}), or the container is killed for memory. "
            + (f"Lower {lower} to {_mib(room)} or less, or raise" if room >= MIB else "Raise")
            + f" {limit_variable} to {_mib(int(total / share), upper=True)} or more.")
    return refusals


# What ansible/filter_plugins/deploy_filters.py registers, by function name.
FILTERS = {f.__name__: f for f in (heap_refusals, mqtt_device_refusals, secret_refusals,
                                   spark_job_refusals)}
