"""The local lab: a real multi-site deployment on one machine (docs/development.md, "The local lab").

Each lab "host" is a container running sshd and its own dockerd (one Swarm node each). `up` creates them, writes
an inventory, runs the same `ansible-playbook site.yml` an operator runs, registers the simulated fleet, starts
simulated devices at every site and prints a status table. Its random secrets live until `down` (secret(name)).

  scripts/lab up | down | status    hosts, site.yml, devices, status | remove everything | the status table again
  scripts/lab add-site site-c       one more edge site: a host, an inventory group, site.yml on it and the datacenter
  scripts/lab add-broker site-b     one more node with a Kafka broker at a site; replicas move onto it
  scripts/lab add-cassandra site-b  one more node with a Cassandra node at a site; it bootstraps and repairs
  scripts/lab retire-broker site-a  the highest broker (retire-cassandra: Cassandra node) hands its data over, then goes
  scripts/lab remove-site site-b [--purge]   the site out of the inventory, ansible/remove_site.yml, hosts removed
  scripts/lab playbook [ARGS]       rerun site.yml against the lab (ARGS go to ansible-playbook)
  scripts/lab diagnose              services per site; tasks and logs of those not fully running
  scripts/lab chaos [--case C]      the fault suite (tooling/lab/chaos.py; run as `python -m tooling.lab.fault_suite`)
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import shutil
import string
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tooling.build import artifacts, images, pins
from tooling.build.progress import log
from tooling.testbed.alert_receiver import AlertLog

LABEL = "iot-stack.lab"
NETWORK = "iot-stack-lab"
HOST_IMAGE = "lab-host"
DEPLOY_USER = "deployer"        # Ansible's SSH user on the lab hosts: not root, becomes root through sudo
# Host container options that work without --privileged (docs/operations.md, the lab).
HOST_RUN_OPTIONS = [
    "--cap-add=ALL", "--cap-drop=SYS_RESOURCE",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--security-opt", "systempaths=unconfined", "--cgroupns=host",
    "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
]
# Each edge site's device logins (stack_mqtt_devices): the simulated fleet's devices, and one device
# the tests and the fault suite publish as. Passwords derive from the lab's random "device" secret.
FLEET_DEVICES = 3
KAFKA_OPERATOR_USER = "operator"    # stack_kafka_operator_user's default
# The lab's secrets by name: the Cassandra superuser's and adapter's passwords, the MQTT services' (bridge,
# mosquitto-agent), the key the devices' passwords derive from, the Kafka operator's and relay's.
SECRET_NAMES = ("cassandra", "cassandra_adapter", "bridge", "mosquitto_agent", "device", "kafka_operator",
                "kafka_relay")
SECRETS_FILE = "secrets.json"
SECRET_LENGTH = 32                  # letters and digits: about 190 bits, and safe in YAML, shells and CQL
SECRET_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class LabHost:
    name: str
    group: str
    variables: dict[str, object] = field(default_factory=dict)

    @property
    def container(self) -> str:
        return f"iot-lab-{self.name}"

    @property
    def site(self) -> str:
        return self.group.replace("_", "-")


def _all_roles(**extra: object) -> dict[str, object]:
    return {"swarm_role": "manager", "zookeeper_id": 1, "kafka_id": 1, "cassandra_id": 1, "apps_node": True,
            **extra}


# site-a has two nodes (a second broker, a share of the stateless services: a second bridge and adapter, and a
# second mqtt_node: Mosquitto runs on one of the two, where Swarm puts it, the one with fewer tasks at first),
# site-b and the datacenter one each.
DEFAULT_HOSTS = (
    LabHost("dc-1", "datacenter", _all_roles()),
    LabHost("site-a-1", "site_a", _all_roles(mqtt_node=True)),
    LabHost("site-a-2", "site_a", {"swarm_role": "worker", "kafka_id": 2, "stateless_node": True,
                                   "mqtt_node": True}),
    LabHost("site-b-1", "site_b", _all_roles(mqtt_node=True)),
)


def new_site_host(site: str) -> LabHost:
    group = site.replace("-", "_")
    return LabHost(f"{site}-1", group, _all_roles(mqtt_node=True))


def role_ids(hosts: list[LabHost], site: str, role: str) -> list[int]:
    """The <role>_id values (zookeeper, kafka, cassandra) of `site`'s hosts, in order."""
    return sorted(int(h.variables[f"{role}_id"]) for h in hosts if h.site == site and f"{role}_id" in h.variables)


def new_node_host(site: str, hosts: list[LabHost], role: str) -> LabHost:
    """One more node for `site` that runs only `role`: kafka or cassandra (with the site's next <role>_id), or
    stateless (a share of the bridge, the adapter and mosquitto-agent: stateless_node=true)."""
    mine = [h for h in hosts if h.site == site]
    if not mine:
        raise SystemExit(f"lab: no site {site}; sites: {', '.join(sorted({h.site for h in hosts}))}")
    if role == "stateless":
        runs: dict[str, object] = {"stateless_node": True}
    else:
        runs = {f"{role}_id": max(role_ids(hosts, site, role), default=0) + 1}
    return LabHost(f"{site}-{len(mine) + 1}", mine[0].group, {"swarm_role": "worker", **runs})


# ---------------------------------------------------------------- plumbing

def run(*cmd: str, check: bool = True, capture: bool = True, timeout: float | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(list(cmd), capture_output=capture, text=True, timeout=timeout, env=env)
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout or "").strip()[-2000:] if capture else ""
        raise SystemExit(f"lab: `{' '.join(cmd[:6])} ...` failed ({result.returncode}): {detail}")
    return result


def lab_dir() -> Path:
    path = artifacts.cache_dir() / "lab"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ---------------------------------------------------------------- secrets

def secrets_path() -> Path:
    return lab_dir() / SECRETS_FILE


def create_secrets() -> dict[str, str]:
    """The lab's secrets, made by `up` when the lab has none yet: random, kept with mode 0600 in the
    lab's directory and reused by every later command until `down` removes them."""
    path = secrets_path()
    values = json.loads(path.read_text()) if path.exists() else {}
    missing = [name for name in SECRET_NAMES if not values.get(name)]
    if not missing:
        return values
    # A lab made by an older version lacks the newer secrets: add them, keep the others.
    values.update({name: "".join(secrets.choice(SECRET_ALPHABET) for _ in range(SECRET_LENGTH)) for name in missing})
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(values, fh, indent=1)
        fh.write("\n")
    tmp.replace(path)
    log("lab", f"created the lab's random secrets ({', '.join(missing)}) in {path}")
    return values


def load_secrets() -> dict[str, str]:
    """The running lab's secrets; a clear error (not a traceback) when there is no lab."""
    path = secrets_path()
    try:
        values = json.loads(path.read_text())
    except FileNotFoundError:
        raise SystemExit(f"lab: the lab has no secrets ({path} is missing): `scripts/lab up` creates them with "
                         "the lab; a lab made before per-lab secrets needs `scripts/lab down` first") from None
    except (OSError, ValueError) as err:
        raise SystemExit(f"lab: cannot read the lab's secrets {path} ({err}); `scripts/lab down` and "
                         "`scripts/lab up` make a new lab") from None
    missing = [n for n in SECRET_NAMES if not isinstance(values, dict) or not isinstance(values.get(n), str)
               or not values[n]]
    if missing:
        raise SystemExit(f"lab: the lab's secrets {path} lack {', '.join(missing)}; `scripts/lab down` and "
                         "`scripts/lab up` make a new lab")
    return values


def secret(name: str) -> str:
    """One secret of the running lab, e.g. secret("kafka_operator"); secret("device") is the key the devices'
    MQTT passwords derive from (device_password)."""
    if name not in SECRET_NAMES:
        raise KeyError(f"lab: no secret {name!r}; the lab's secrets are {', '.join(SECRET_NAMES)}")
    return load_secrets()[name]


def remove_secrets() -> None:
    """Part of `down`: the secrets and the devices' copy of theirs go with the lab."""
    secrets_path().unlink(missing_ok=True)
    shutil.rmtree(lab_dir() / "device-secrets", ignore_errors=True)
    shutil.rmtree(lab_dir() / "operator-secrets", ignore_errors=True)
    shutil.rmtree(pki_dir(), ignore_errors=True)


class _LabSecrets(Mapping[str, str]):
    """LAB_SECRETS["device"]: secret(name), read from the lab's directory when asked."""

    def __getitem__(self, name: str) -> str:
        return secret(name)

    def __iter__(self) -> Iterator[str]:
        return iter(SECRET_NAMES)

    def __len__(self) -> int:
        return len(SECRET_NAMES)


LAB_SECRETS: Mapping[str, str] = _LabSecrets()


def device_ids(site: str) -> list[str]:
    """The device logins of one edge site: the simulator's fleet (services/commands/fleet.py ids), test_device, then
    the probe devices and the abuser of tooling/lab/abuse.py."""
    return ([f"{site}-dev-{n}" for n in range(1, FLEET_DEVICES + 1)] + [test_device(site)]
            + probe_devices(site) + [abuser_device(site)])


def test_device(site: str) -> str:
    """The device the lab tests and the fault suite publish as at `site`."""
    return f"{site}-lab"


# ---------------------------------------------------------------- probe and abuser devices (tooling/lab/abuse.py)
# Every concurrent MQTT connection needs a login of its own (the broker binds a client id to its login), so the
# abusive-device cases and load probes get devices of their own besides test_device.
PROBE_DEVICES = 12


def probe_devices(site: str) -> list[str]:
    """Devices that publish as honest devices beside an abuser, or as load (tooling/lab/abuse.py): `{site}-probe-N`."""
    return [f"{site}-probe-{n}" for n in range(1, PROBE_DEVICES + 1)]


def abuser_device(site: str) -> str:
    """The device whose valid login the abusive-device cases misuse (tooling/lab/abuse.py)."""
    return f"{site}-abuser"


def register_sensors(site: str, device: str, sensor_ids: Iterable[str], wait_s: float = 3.0,
                     bootstrap: str | None = None) -> None:
    """Register `device` and its sensors at `site` (device-registration, sensor-registration and the
    temperature-c sensor type, services/common/contracts.py) through the operator's login on the site's
    EXTERNAL listener, then wait `wait_s` for the bridge to read them: a reading of a sensor that is not
    registered to its device goes to dead-letter. `bootstrap` (host:9094) saves looking the site up."""
    from services.commands import fleet, registrar
    from services.common import contracts, names
    if bootstrap is None:
        managers = site_managers(existing_hosts())
        if site not in managers:
            raise SystemExit(f"lab: no site {site}; sites: {', '.join(sorted(managers))}")
        bootstrap = f"{host_ip(managers[site])}:9094"
    type_id = fleet.sensor_type_id("C")
    records = {
        # The same record as the fleet's registration (services/commands/fleet.py), so neither overwrites the other.
        names.SENSOR_TYPE_REGISTRATION: fleet.registrations([], "C")[names.SENSOR_TYPE_REGISTRATION],
        names.DEVICE_REGISTRATION: [contracts.DEVICE.validate({
            "device_id": device, "name": f"Lab device {device}", "location": f"{site} lab"})],
        names.SENSOR_REGISTRATION: [contracts.SENSOR.validate({
            "sensor_id": sensor, "name": f"Lab sensor {sensor}", "device_id": device, "sensor_type_id": type_id})
            for sensor in sensor_ids],
    }
    security = operator_login()
    try:
        registrar.produce(bootstrap, records, security=security)
    except registrar.RegistryError as err:
        raise SystemExit(f"lab: cannot register {device}'s sensors at {site}: {err}") from None
    time.sleep(wait_s)


def device_password(device_id: str) -> str:
    """A device's MQTT password: its own, random per lab (an HMAC of the lab's device secret)."""
    digest = hmac.new(secret("device").encode(), device_id.encode(), hashlib.sha256).digest()
    return "".join(SECRET_ALPHABET[b % len(SECRET_ALPHABET)] for b in digest[:SECRET_LENGTH])


def device_credentials(site: str) -> dict[str, str]:
    """device id -> password for `site`: its stack_mqtt_devices, and the simulator's credentials file."""
    return {device: device_password(device) for device in device_ids(site)}


def secret_group_vars(values: Mapping[str, str]) -> str:
    """The inventory's group_vars/all/secrets.yml for the lab's secrets (and where its CA lives)."""
    quoted = {name: json.dumps(values[name]) for name in SECRET_NAMES}
    return (f"---\n# Written by scripts/lab from {secrets_path()} (random per lab).\n"
            f"stack_cassandra_password: {quoted['cassandra']}\n"
            f"stack_cassandra_adapter_password: {quoted['cassandra_adapter']}\n"
            f"stack_kafka_operator_password: {quoted['kafka_operator']}\n"
            f"stack_kafka_relay_password: {quoted['kafka_relay']}\n"
            f"stack_mqtt_users:\n  bridge: {quoted['bridge']}\n  mosquitto-agent: {quoted['mosquitto_agent']}\n"
            f"# The lab's CA outlives the inventory, which every run writes anew; `down` removes it.\n"
            f"iot_pki_dir: {json.dumps(str(pki_dir()))}\n")


def pki_dir() -> Path:
    """The lab's CA and brokers' certificates (the pki role makes them on the first run)."""
    return lab_dir() / "pki"


def client_cert(name: str = "operator") -> tuple[str, str]:
    """(certificate, key) of a client of EXTERNAL (the pki role's clients CA issues them: operator, relay)."""
    return str(pki_dir() / "clients" / f"{name}.crt"), str(pki_dir() / "clients" / f"{name}.key")


def operator_login() -> dict[str, str]:
    """confluent-kafka settings of the operator's login to a site's EXTERNAL listener: SCRAM over SASL_SSL,
    the brokers checked against the lab's CA, the operator's client certificate shown (mutual TLS)."""
    from services.common import kafka_auth
    return kafka_auth.sasl_ssl_config(KAFKA_OPERATOR_USER, secret("kafka_operator"), str(pki_dir() / "ca.crt"),
                                      *client_cert())


def kafka_client(bootstrap: str, **config: object) -> dict:
    """confluent-kafka settings for a site's EXTERNAL listener as the operator's principal (SASL_SSL,
    the lab's CA, the operator's client certificate), as an operator's tool on the factory network reaches it."""
    return {"bootstrap.servers": bootstrap, **config, **operator_login()}


def ssh_key() -> Path:
    key = lab_dir() / "id_ed25519"
    if not key.exists():
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "iot-stack-lab", "-f", str(key))
    return key


def known_hosts(hosts: list[LabHost]) -> Path:
    """<lab>/known_hosts: each host's SSH host key, read from the host itself (not trusted on first use),
    so Ansible checks host keys in the lab as in production (ansible.cfg host_key_checking)."""
    lines = []
    for host in hosts:
        deadline = time.monotonic() + 60          # the host's init makes its keys when it starts
        while True:
            key = host_exec(host, "cat", "/etc/ssh/ssh_host_ed25519_key.pub", check=False, timeout=30)
            if key.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        if key.returncode != 0:
            raise SystemExit(f"lab: {host.name} has no SSH host key: {key.stderr.strip()}")
        kind, value = key.stdout.split()[:2]
        lines.append(f"{host_ip(host)} {kind} {value}")
    path = lab_dir() / "known_hosts"
    path.write_text("\n".join(lines) + "\n")
    return path


def ssh_options(hosts: list[LabHost]) -> str:
    """ssh options of the lab's Ansible and tests: its key file of known hosts, checked strictly."""
    return f"-o UserKnownHostsFile={known_hosts(hosts)} -o StrictHostKeyChecking=yes"


def host_ip(host: LabHost) -> str:
    fmt = "{{ (index .NetworkSettings.Networks \"" + NETWORK + "\").IPAddress }}"
    return run("docker", "inspect", "-f", fmt, host.container).stdout.strip()


def host_exec(host: LabHost, *cmd: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    return run("docker", "exec", host.container, *cmd, check=check, timeout=timeout)


def existing_hosts() -> list[LabHost]:
    """Lab hosts that exist now, from their container labels."""
    out = run("docker", "ps", "-a", "--filter", f"label={LABEL}.host", "--format", "{{.Names}}").stdout.split()
    hosts = []
    for container in sorted(out):
        raw = run("docker", "inspect", "-f", "{{ json .Config.Labels }}", container).stdout
        labels = json.loads(raw)
        hosts.append(LabHost(labels[f"{LABEL}.host"], labels[f"{LABEL}.group"],
                             json.loads(labels[f"{LABEL}.vars"])))
    return hosts


# ---------------------------------------------------------------- hosts

def prepare() -> None:
    """Engine, base image, artifacts and images: everything the lab builds from."""
    root = pins.REPO_ROOT
    for step, cmd in (("engine", ["scripts/engine"]), ("base image", ["scripts/base-image"]),
                      ("artifacts", ["scripts/artifacts", "fetch"]), ("images", ["scripts/images", "build"])):
        log("lab", f"preparing: {step}")
        subprocess.run(cmd, cwd=root, check=True)


def create_hosts(hosts: list[LabHost]) -> None:
    if run("docker", "network", "inspect", NETWORK, check=False).returncode != 0:
        run("docker", "network", "create", "--label", LABEL, NETWORK)
    start_alert_receiver()
    public_key = ssh_key().with_suffix(".pub").read_text().strip()
    image = images.tag(HOST_IMAGE, pins.load())
    for host in hosts:
        if run("docker", "inspect", host.container, check=False).returncode == 0:
            run("docker", "start", host.container)
            continue
        log("lab", f"creating host {host.name} ({host.group})")
        run("docker", "run", "-d", "--name", host.container, "--hostname", host.name, "--network", NETWORK,
            "--label", LABEL, "--label", f"{LABEL}.host={host.name}", "--label", f"{LABEL}.group={host.group}",
            "--label", f"{LABEL}.vars={json.dumps(host.variables)}",
            "-v", f"{host.container}-docker:/var/lib/docker", "--label", f"{LABEL}.volume={host.container}-docker",
            "-e", f"LAB_AUTHORIZED_KEY={public_key}", *HOST_RUN_OPTIONS, image)
    for host in hosts:
        wait_for_engine(host)


def wait_for_engine(host: LabHost, limit_s: float = 90) -> None:
    """Until the Docker engine inside the lab host answers."""
    deadline = time.monotonic() + limit_s
    while host_exec(host, "docker", "info", check=False, timeout=30).returncode != 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"lab: dockerd in {host.name} did not start; see `docker exec {host.container} "
                             "cat /var/log/dockerd.log`")
        time.sleep(1)


# ---------------------------------------------------------------- inventory

def write_inventory(hosts: list[LabHost]) -> Path:
    """The lab's inventory: same shape as inventory.example, lab-sized, with the lab's secrets."""
    values = load_secrets()
    inventory = lab_dir() / "inventory"
    shutil.rmtree(inventory, ignore_errors=True)
    (inventory / "group_vars" / "all").mkdir(parents=True)
    groups: dict[str, list[str]] = {}
    for host in hosts:
        variables = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in host.variables.items())
        groups.setdefault(host.group, []).append(f"{host.name} ansible_host={host_ip(host)} {variables}")
    lines = ["# Written by scripts/lab; regenerated on every run.", ""]
    for group, entries in groups.items():
        lines += [f"[{group}]", *entries, ""]
    lines += ["[edge:children]", *[g for g in groups if g != "datacenter"], "",
              "[all:vars]", f"ansible_user={DEPLOY_USER}", f"ansible_ssh_private_key_file={ssh_key()}",
              f"ansible_ssh_common_args='{ssh_options(hosts)}'", ""]
    (inventory / "hosts.ini").write_text("\n".join(lines))
    (inventory / "group_vars" / "all" / "lab.yml").write_text(LAB_GROUP_VARS + lab_alert_receivers())
    _write_private(inventory / "group_vars" / "all" / "secrets.yml", secret_group_vars(values))
    # Each site's own devices, in its group: a device logs in only at its own site.
    for group in groups:
        if group != "datacenter":
            (inventory / "group_vars" / group).mkdir(parents=True, exist_ok=True)
            devices = json.dumps(device_credentials(group.replace("_", "-")), indent=2)
            _write_private(inventory / "group_vars" / group / "devices.yml",
                           f"---\n# Written by scripts/lab (random per lab).\nstack_mqtt_devices: {devices}\n")
    return inventory


# The lab's alerts go to a webhook on the lab network's gateway (this machine), where the lab's receiver
# (start_alert_receiver) listens for the lab's whole life and logs each notification; the tests read the log.
LAB_ALERT_RECEIVER_PORT = 19093
ALERT_RECEIVER = "iot-stack-lab-alerts"       # its container
APP_UID = 1000                                # the images' user (images/runtime/Dockerfile)


def start_alert_receiver() -> None:
    """The lab's stand-in for a person's pager: tooling/testbed/alert_receiver.py run from the services image
    on this machine's side of the lab network (host networking, the gateway's address), appending every
    notification to <lab dir>/alerts/notifications.jsonl (alert_log reads it). Without it, what the
    Alertmanagers sent while no test listened failed, and AlertNotificationsFailing and FleetSiteCannotNotify
    fired in an idle lab. Removed with the lab (its label)."""
    if run("docker", "inspect", ALERT_RECEIVER, check=False).returncode == 0:
        run("docker", "start", ALERT_RECEIVER)
        return
    directory = lab_dir() / "alerts"
    directory.mkdir(exist_ok=True)
    user: list[str] = []
    if os.getuid() == 0:
        os.chown(directory, APP_UID, APP_UID)     # the image's user writes the log
    else:
        user = ["--user", f"{os.getuid()}:{os.getgid()}"]
    host, port = lab_alert_receiver_address()
    run("docker", "run", "-d", "--name", ALERT_RECEIVER, "--label", LABEL, "--network", "host",
        "--restart", "unless-stopped", *user, "-v", f"{directory}:/alerts",
        "-v", f"{pins.REPO_ROOT / 'tooling/testbed/alert_receiver.py'}:/opt/alert_receiver.py:ro",
        images.tag("services", pins.load()), "python", "/opt/alert_receiver.py",
        "--host", host, "--port", str(port), "--log", "/alerts/notifications.jsonl")
    log("lab", f"alert receiver listening at http://{host}:{port}/alerts (log: {directory}/notifications.jsonl)")


def alert_log(since: float | None = None) -> AlertLog:
    """The notifications the lab's receiver got from `since` (epoch seconds; default: now) on."""
    return AlertLog(lab_dir() / "alerts" / "notifications.jsonl", time.time() if since is None else since)


def lab_alert_receiver_address() -> tuple[str, int]:
    gateway = run("docker", "network", "inspect", "-f", "{{range .IPAM.Config}}{{.Gateway}}{{end}}",
                  NETWORK).stdout.strip()
    return gateway, LAB_ALERT_RECEIVER_PORT


def lab_alert_receivers() -> str:
    host, port = lab_alert_receiver_address()
    receivers = [{"name": "lab-webhook", "webhook_configs": [{"url": f"http://{host}:{port}/alerts",
                                                               "send_resolved": True}]}]
    return f"stack_alert_receivers: {json.dumps(receivers)}\n"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


# Spark jobs in the lab. Every site and the datacenter share two cores with
# four Cassandras and five Kafkas, so the lab runs the jobs the end-to-end path
# needs (threshold detector at the edge, notifier at the datacenter), each with
# one state partition and a 15-second trigger (the detector's dead-letter query one a minute); rollups run in
# production (ansible/roles/stack/defaults) and in the integration tests, not here. A micro-batch costs about
# the same CPU whatever it holds, and the saturated lab ran each back to back: on 2026-11-30 the detectors took
# 0.16-0.17 core each and the notifier 0.12 with 5 s, 0.13 and 0.09 with these (docs/development.md).
LAB_JOB_SETTINGS = {"cores": 1, "executor_memory": "512m", "env": {"TRIGGER_INTERVAL": "15 seconds"},
                    "conf": {"spark.sql.shuffle.partitions": "1"}}
LAB_JOBS = {
    "edge": [{"name": "threshold-detector", "file": "threshold_detector.py", **LAB_JOB_SETTINGS,
              "env": {**LAB_JOB_SETTINGS["env"], "DEAD_LETTER_TRIGGER_INTERVAL": "60 seconds"},
              "reads": ["temperature-data", "sensor-registration"],
              "writes": ["temperature-threshold-events", "dead-letter"]}],
    "datacenter": [{"name": "notifier", "file": "notifier.py", **LAB_JOB_SETTINGS,
                    "reads": ["temperature-threshold-events", "sensor-registration", "device-registration"],
                    "writes": ["notifications", "dead-letter"]}],
}

LAB_GROUP_VARS = f"""---
# Lab sizes: every site on one 2-core machine, so heaps are small, Cassandra
# skips its multi-node waits and Spark jobs run in local mode. The secrets are in
# secrets.yml next to this file.
stack_cassandra_fast_start: true
# C1 only: the lab's 14 JVMs start at once on two cores, and C2 compilation was most of their start-up CPU
# (docs/development.md, "The lab's JVMs"); at the lab's 20 readings/s the slower code costs little.
stack_jvm_extra_opts: "-XX:TieredStopAtLevel=1"
stack_heap:
  zookeeper: "-Xms32m -Xmx128m"
  kafka: "-Xms192m -Xmx384m"
  cassandra: "512M"
  mirrormaker: "-Xms128m -Xmx320m"
stack_resources:
  zookeeper: {{cpus: "0.5", memory: 320M, reserve: 64M}}
  kafka: {{cpus: "1.0", memory: 768M, reserve: 256M}}
  cassandra: {{cpus: "1.0", memory: 1400M, reserve: 512M}}
  mosquitto: {{cpus: "0.5", memory: 128M, reserve: 32M}}
  mosquitto_agent: {{cpus: "0.25", memory: 96M, reserve: 32M}}
  bridge: {{cpus: "0.5", memory: 256M, reserve: 64M}}
  adapter: {{cpus: "0.5", memory: 256M, reserve: 64M}}
  mirrormaker: {{cpus: "0.5", memory: 640M, reserve: 128M}}
  spark_master: {{cpus: "0.5", memory: 512M, reserve: 128M}}
  spark_worker: {{cpus: "1.0", memory: 1G, reserve: 256M}}
  spark_job: {{cpus: "1.0", memory: 1200M, reserve: 256M}}
  prometheus: {{cpus: "0.25", memory: 256M, reserve: 64M}}
stack_spark:
  mode: local
  driver_memory: 640m
  daemon_memory: 256m
  worker_cores: 1
  worker_memory: 512m
  jobs: {json.dumps(LAB_JOBS)}
stack_relay_refresh_topics_seconds: 15
stack_relay_refresh_groups_seconds: 15
# Mosquitto's 128M: queue bounds that fit it (tests/unit/roles/test_mosquitto_limits.py).
stack_mqtt_max_queued_messages: 150000
stack_mqtt_max_queued_bytes: 33554432
health_converge_timeout: 1500
# Each gate's wait (10 s apart): four lab hosts on two cores take longer than a site's own machines.
health_retries: 90
topics_retention_ms: 86400000
"""


def failed_tasks(lines: list[str]) -> list[str]:
    """From ansible-playbook's output, each failure that stopped a host: its task's line, the "fatal:" line and
    the message indented under it. With several hosts a failure scrolls out of the last lines long before the
    run ends (a CI run showed only the datacenter's retries). Failures ansible ignored are left out."""
    found: list[str] = []
    task = ""
    inside = False
    start = 0                       # where the last failure's lines begin in `found`
    for line in lines:
        if inside and line.startswith(" "):
            found.append(line)
            continue
        inside = False
        if line.startswith(("TASK [", "RUNNING HANDLER")):
            task = line.strip().rstrip("*").strip()
        elif line.startswith(("fatal:", "failed:")):
            start = len(found)
            found += [task, line]
            inside = True
        elif line.strip() == "...ignoring":          # ansible's line after a failure it ignores
            del found[start:]
    return found


def playbook(inventory: Path, *extra: str, name: str = "site.yml") -> float:
    """Run a playbook (site.yml unless `name` says otherwise) against the lab, showing each task as it
    starts; returns seconds taken."""
    logfile = lab_dir() / "ansible.log"
    env = dict(os.environ, ANSIBLE_CONFIG=str(pins.REPO_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOG_PATH=str(logfile), PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    cmd = ["ansible-playbook", "-i", str(inventory), str(pins.REPO_ROOT / "ansible" / name), *extra]
    log("lab", f"running {' '.join(cmd[:4])} {' '.join(extra)} (full log: {logfile})")
    started = time.monotonic()
    last = started
    lines: list[str] = []
    proc = subprocess.Popen(cmd, cwd=pins.REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line.rstrip())
        if line.startswith(("TASK [", "PLAY [", "RUNNING HANDLER")):
            now = time.monotonic()
            log("ansible", f"{line.strip().rstrip('*').strip()}  (previous {now - last:.0f}s)")
            last = now
        elif line.startswith(("fatal:", "failed:")) or "PLAY RECAP" in line or " ok=" in line:
            print(line.rstrip(), file=sys.stderr, flush=True)
    code = proc.wait()
    elapsed = time.monotonic() - started
    if code != 0:
        # The failed tasks come last: a CI report keeps only an output's tail.
        raise SystemExit("lab: {} failed after {:.0f}s; last lines:\n{}\nfailed tasks:\n{}".format(
            name, elapsed, "\n".join(lines[-60:]), "\n".join(failed_tasks(lines)) or "(none reported)"))
    log("lab", f"{name} finished in {elapsed:.0f}s")
    return elapsed


# ---------------------------------------------------------------- fleet and devices

def services_run(*args: str, detach_name: str | None = None, volumes: dict[str, str] | None = None) -> str:
    """Run the services image on the lab network (outside every site, like a device)."""
    cmd = ["docker", "run", "--network", NETWORK, "--label", LABEL]
    cmd += ["-d", "--name", detach_name, "--restart", "unless-stopped"] if detach_name else ["--rm"]
    for src, dst in (volumes or {}).items():
        cmd += ["-v", f"{src}:{dst}"]
    return run(*cmd, images.tag("services", pins.load()), *args, timeout=180).stdout


def site_managers(hosts: list[LabHost]) -> dict[str, LabHost]:
    """site alias -> the host that runs its Kafka broker 1 (and the site's Swarm manager)."""
    return {h.site: h for h in hosts if h.variables.get("kafka_id") == 1}


def mqtt_addresses(hosts: list[LabHost], site: str) -> list[str]:
    """Every mqtt_node's address of `site`, in inventory order: what a device is given (it tries them in turn)."""
    return [host_ip(h) for h in hosts if h.site == site and h.variables.get("mqtt_node")]


def mosquitto_host(hosts: list[LabHost], site: str) -> LabHost:
    """The mqtt_node of `site` whose engine runs Mosquitto now (its port 8883 is published there only)."""
    for host in (h for h in hosts if h.site == site and h.variables.get("mqtt_node")):
        out = host_exec(host, "docker", "ps", "-q", "-f", f"label=com.docker.swarm.service.name={site}_mosquitto",
                        check=False, timeout=60).stdout
        if out.split():
            return host
    raise RuntimeError(f"no mqtt_node of {site} runs a Mosquitto container now")


def device_secrets(site: str) -> Path:
    """The simulated devices' secrets of `site` (mounted as /run/secrets): their logins and the CA."""
    secret_dir = lab_dir() / "device-secrets" / site
    secret_dir.mkdir(parents=True, exist_ok=True)
    (secret_dir / "mqtt_credentials").write_text(json.dumps(device_credentials(site)))
    shutil.copyfile(pki_dir() / "ca.crt", secret_dir / "mqtt_ca.pem")
    for path in (secret_dir.parent, secret_dir):
        os.chmod(path, 0o755)
    for name in ("mqtt_credentials", "mqtt_ca.pem"):
        os.chmod(secret_dir / name, 0o644)  # the container's uid 1000 reads them
    return secret_dir


def register_and_start_devices(hosts: list[LabHost], rate: float, sites: list[str] | None = None) -> None:
    # The registrar reaches a site's EXTERNAL listener as the operator, with the lab's CA.
    kafka_dir = lab_dir() / "operator-secrets"
    kafka_dir.mkdir(exist_ok=True)
    (kafka_dir / "kafka_password").write_text(secret("kafka_operator"))
    shutil.copyfile(pki_dir() / "ca.crt", kafka_dir / "kafka_ca.pem")
    cert, key = client_cert()
    shutil.copyfile(cert, kafka_dir / "kafka_client.crt")
    shutil.copyfile(key, kafka_dir / "kafka_client.key")
    os.chmod(kafka_dir, 0o755)
    for name in ("kafka_password", "kafka_ca.pem", "kafka_client.crt", "kafka_client.key"):
        os.chmod(kafka_dir / name, 0o644)  # the container's uid 1000 reads them
    for site, host in site_managers(hosts).items():
        if site == "datacenter" or (sites and site not in sites):
            continue
        address = host_ip(host)
        log("lab", f"registering the fleet of {site}")
        services_run("iot-registrar", "--bootstrap-servers", f"{address}:9094", "--kafka-user", KAFKA_OPERATOR_USER,
                     "fleet", "--site", site, "--devices", str(FLEET_DEVICES), "--sensors-per-device", "2",
                     volumes={str(kafka_dir): "/run/secrets:ro"})
        name = f"iot-lab-devices-{site}"
        run("docker", "rm", "-f", name, check=False)
        log("lab", f"starting simulated devices for {site} at {rate:g} readings/s")
        services_run("iot-simulator", "--host", ",".join(mqtt_addresses(hosts, site)), "--site", site,
                     "--devices", str(FLEET_DEVICES), "--sensors-per-device", "2", "--hot-sensors", "1",
                     "--rate", str(rate), "--tau", "20", detach_name=name,
                     volumes={str(device_secrets(site)): "/run/secrets:ro"})


# ---------------------------------------------------------------- status

def cql(host: LabHost, site: str, query: str, node: int = 1) -> str:
    """Run CQL with cqlsh inside the site's cassandra-<node> container, which runs on `host`; returns
    its output."""
    service = f"label=com.docker.swarm.service.name={site}_cassandra-{node}"
    script = (f"c=$(docker ps -q -f {service} | head -1); [ -n \"$c\" ] || exit 3; "
              f"docker exec $c cqlsh -e \"{query}\"")
    return host_exec(host, "bash", "-c", script, check=False, timeout=60).stdout


def diagnose(hosts: list[LabHost], log_lines: int = 40) -> str:
    """What an operator looks at first when the lab misbehaves: every site's services with their
    replicas, and for each service not fully running its task states and the tail of its logs."""
    out: list[str] = []
    for site, host in site_managers(hosts).items():
        listing = host_exec(host, "docker", "service", "ls", "--format", "{{.Name}} {{.Replicas}}",
                            check=False, timeout=60)
        out.append(f"== {site} ({host.name}): docker service ls")
        out.append(listing.stdout.strip() or listing.stderr.strip())
        for line in listing.stdout.splitlines():
            name, _, replicas = line.partition(" ")
            running, _, wanted = replicas.partition(" ")[0].partition("/")
            if running == wanted:
                continue
            out += [f"-- {name}: {replicas} running", service_report(host, name, log_lines)]
    return "\n".join(out)


def service_report(host: LabHost, service: str, log_lines: int = 60) -> str:
    """One service's tasks (restarts show there) and the tail of its logs, from its site's manager."""
    tasks = host_exec(host, "docker", "service", "ps", "--no-trunc", "--format",
                      "{{.Name}} {{.Node}} {{.CurrentState}} {{.Error}}", service, check=False, timeout=60)
    logs = host_exec(host, "docker", "service", "logs", "--tail", str(log_lines), "--no-task-ids", service,
                     check=False, timeout=60)
    return "\n".join([f"-- {service}: tasks", tasks.stdout.strip() or tasks.stderr.strip(),
                      f"-- {service}: last {log_lines} log lines", (logs.stdout + logs.stderr).strip()])


def remove_site(hosts: list[LabHost], site: str, purge: bool) -> None:
    """What an operator does to remove a site: its group out of the inventory, ansible/remove_site.yml on
    the datacenter; then its hosts go (in the lab: their containers, volumes and devices). Run again with
    `purge` once the hosts are gone to delete what the datacenter kept."""
    if site == "datacenter":
        raise SystemExit("lab: the datacenter is not an edge site")
    gone = [h for h in hosts if h.site == site]
    if not gone and not purge:
        raise SystemExit(f"lab: no site {site}; sites: {', '.join(sorted({h.site for h in hosts}))}")
    started = time.monotonic()
    remaining = [h for h in hosts if h.site != site]
    playbook(write_inventory(remaining), "--limit", "datacenter", "-e", f"remove_site={site}",
             "-e", f"remove_site_data={'purge' if purge else 'keep'}", name="remove_site.yml")
    run("docker", "rm", "-f", f"iot-lab-devices-{site}", check=False)
    for host in gone:
        log("lab", f"removing host {host.name}")
        run("docker", "rm", "-f", host.container)
        run("docker", "volume", "rm", "-f", f"{host.container}-docker", check=False)
    log("lab", f"site {site} removed ({'data purged' if purge else 'data kept'} at the datacenter) "
               f"in {time.monotonic() - started:.0f}s")


RETIRE_ROLES = {"retire-broker": ("kafka", "broker", "add-broker", "Removing a Kafka broker from a site"),
                "retire-cassandra": ("cassandra", "Cassandra node", "add-cassandra",
                                     "Removing a Cassandra node from a site")}


def retire_node(hosts: list[LabHost], site: str, command: str = "retire-broker") -> None:
    """What an operator does to take a broker or a Cassandra node away (docs/operations.md, the section in
    RETIRE_ROLES): <role>_retire=true on the highest <role>_id and site.yml, which moves the broker's replicas
    to the others or takes the Cassandra node out of its ring; then its host out of the inventory and site.yml
    again; then the machine leaves the Swarm and goes. Only a node that runs nothing else (one `add-broker` or
    `add-cassandra` made): lab hosts keep their variables in labels."""
    role, what, grow, section = RETIRE_ROLES[command]
    nodes = [h for h in hosts if h.site == site and f"{role}_id" in h.variables]
    if len(nodes) < 2:
        raise SystemExit(f"lab: {site} has {len(nodes)} {what}(s); `scripts/lab {grow} {site}` first")
    host = max(nodes, key=lambda h: int(h.variables[f"{role}_id"]))
    if set(host.variables) - {"swarm_role", f"{role}_id"}:
        raise SystemExit(f"lab: {host.name} runs more than its {what} ({host.variables}); the lab retires only "
                         f"a node `scripts/lab {grow} {site}` made")
    started = time.monotonic()
    service = f"{role}-{host.variables[f'{role}_id']}"
    log("lab", f"retiring {service} of {site}: {role}_retire=true on {host.name}, then site.yml ({section})")
    retiring = [LabHost(h.name, h.group, {**h.variables, f"{role}_retire": True}) if h == host else h
                for h in hosts]
    playbook(write_inventory(retiring), "--limit", f"datacenter,{host.group}")
    moved = time.monotonic()
    log("lab", f"{service} handed its data over in {moved - started:.0f}s; {host.name} leaves the inventory")
    remaining = [h for h in hosts if h != host]
    playbook(write_inventory(remaining), "--limit", f"datacenter,{host.group}")
    host_exec(host, "docker", "swarm", "leave", "--force", check=False)
    manager = site_managers(remaining)[site]
    wait_s = 120
    deadline = time.monotonic() + wait_s
    while host_exec(manager, "docker", "node", "rm", "--force", host.name, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"lab: {host.name} is still a node of {site}'s Swarm after {wait_s}s")
        time.sleep(5)
    run("docker", "rm", "-f", host.container)
    run("docker", "volume", "rm", "-f", f"{host.container}-docker", check=False)
    log("lab", f"{service} retired from {site} in {time.monotonic() - started:.0f}s "
               f"(data handed over {moved - started:.0f}s, host out {time.monotonic() - moved:.0f}s)")


def down() -> None:
    containers = run("docker", "ps", "-aq", "--filter", f"label={LABEL}").stdout.split()
    volumes = [v for c in existing_hosts() for v in [f"{c.container}-docker"]]
    if containers:
        log("lab", f"removing {len(containers)} containers")
        run("docker", "rm", "-f", *containers)
    for volume in volumes:
        run("docker", "volume", "rm", "-f", volume, check=False)
    run("docker", "network", "rm", NETWORK, check=False)
    shutil.rmtree(lab_dir() / "inventory", ignore_errors=True)
    remove_secrets()
    log("lab", "lab removed")


# scripts/lab's commands that add a node to a site, and what the node runs (new_node_host).
GROW_ROLES = {"add-broker": "kafka", "add-cassandra": "cassandra", "add-stateless-node": "stateless"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/lab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up_p = sub.add_parser("up", help="create the lab, deploy with site.yml, start devices, print status")
    up_p.add_argument("--rate", type=float, default=20.0, help="readings/s per site from the simulated devices")
    up_p.add_argument("--no-build", action="store_true", help="skip engine/artifact/image preparation")
    up_p.add_argument("--no-status", action="store_true",
                      help="skip the status table at the end (the status playbook takes minutes on a loaded machine)")
    add_p = sub.add_parser("add-site", help="add an edge site and deploy it (plus the datacenter's relay)")
    add_p.add_argument("site", help="site alias, e.g. site-c")
    add_p.add_argument("--rate", type=float, default=20.0)
    for command, what in (("add-broker", "Kafka broker"), ("add-cassandra", "Cassandra node"),
                          ("add-stateless-node", "share of the bridge, the adapter and mosquitto-agent")):
        grow_p = sub.add_parser(command, help=f"add a node with one more {what} to a site and deploy it")
        grow_p.add_argument("site", help="site alias, e.g. site-b")
    remove_p = sub.add_parser("remove-site", help="remove an edge site: its hosts, and at the datacenter its relay "
                                                  "flow; its relayed data kept unless --purge")
    remove_p.add_argument("site", help="site alias, e.g. site-b")
    remove_p.add_argument("--purge", action="store_true", help="delete the site's topics and rows at the datacenter")
    for command, what in (("retire-broker", "broker hands its replicas to the others"),
                          ("retire-cassandra", "Cassandra node leaves its ring, its rows handed to the others")):
        retire_p = sub.add_parser(command, help=f"the site's highest {what}, then its node leaves (two site.yml "
                                                "runs)")
        retire_p.add_argument("site", help="site alias, e.g. site-a")
    sub.add_parser("status", help="print the status table")
    cpu_p = sub.add_parser("cpu", help="each service's cores over a window, from cgroup counters (busiest first)")
    cpu_p.add_argument("--window", type=float, default=60.0, help="seconds to measure over (default 60)")
    sub.add_parser("diagnose", help="every site's services; tasks and last log lines of those not running")
    sub.add_parser("playbook", help="run site.yml against the lab again; further arguments go to ansible-playbook")
    sub.add_parser("down", help="remove every container, volume and network the lab made")
    sub.add_parser("inventory", help="print the lab inventory's path")
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "playbook":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")

    if args.command == "down":
        down()
        return 0
    if args.command == "up":
        started = time.monotonic()
        if not args.no_build:
            prepare()
        hosts = existing_hosts()
        if hosts and not secrets_path().exists():
            raise SystemExit(f"lab: lab hosts exist but the lab's secrets ({secrets_path()}) do not, so their "
                             "passwords are unknown; `scripts/lab down` first")
        hosts = hosts or list(DEFAULT_HOSTS)
        create_secrets()
        create_hosts(hosts)
        playbook(write_inventory(hosts))
        register_and_start_devices(hosts, args.rate)
        log("lab", f"lab up in {time.monotonic() - started:.0f}s")
        if not args.no_status:
            print_status(hosts, check=False)
        return 0
    hosts = existing_hosts()
    if not hosts:
        raise SystemExit("lab: no lab hosts exist; run `scripts/lab up` first")
    if args.command == "add-site":
        host = new_site_host(args.site)
        if host.name in {h.name for h in hosts}:
            raise SystemExit(f"lab: site {args.site} exists already")
        started = time.monotonic()
        create_hosts([host])
        hosts = existing_hosts()
        playbook(write_inventory(hosts), "--limit", f"datacenter,{host.group}")
        register_and_start_devices(hosts, args.rate, sites=[args.site])
        log("lab", f"site {args.site} added in {time.monotonic() - started:.0f}s")
        print_status(hosts, check=False)
    elif args.command in GROW_ROLES:
        role = GROW_ROLES[args.command]
        host = new_node_host(args.site, hosts, role)
        started = time.monotonic()
        create_hosts([host])
        hosts = existing_hosts()
        # The datacenter too: its relay's bootstrap list names every broker of the site.
        playbook(write_inventory(hosts), "--limit", f"datacenter,{host.group}")
        what = f"{role}-{host.variables[f'{role}_id']}" if f"{role}_id" in host.variables else f"a {role} node"
        log("lab", f"{what} added to {args.site} on {host.name} in {time.monotonic() - started:.0f}s")
        print_status(hosts, check=False)
    elif args.command == "remove-site":
        remove_site(hosts, args.site, args.purge)
    elif args.command in RETIRE_ROLES:
        retire_node(hosts, args.site, args.command)
    elif args.command == "playbook":
        playbook(write_inventory(hosts), *extra)
    elif args.command == "status":
        print_status(hosts)
    elif args.command == "cpu":
        from tooling.lab import cpu
        if args.window <= 0:
            parser.error("--window must be a positive number of seconds")
        print(cpu.measure(hosts, args.window))
    elif args.command == "diagnose":
        print(diagnose(hosts))
    elif args.command == "inventory":
        print(lab_dir() / "inventory")
    return 0


def print_status(hosts: list[LabHost], check: bool = True) -> None:
    """Print the status playbook's table. Without `check` (after up and add-site) a failed run is only
    reported: the lab is up either way."""
    from deploy.status import status_table
    from tooling.lab import status as lab_status
    log("lab", "running ansible/status.yml against the lab")
    try:
        result, report = lab_status.run_report(write_inventory(hosts), timeout=900 if check else 300)
    except subprocess.TimeoutExpired as err:
        message = f"lab: ansible/status.yml did not finish in {err.timeout:.0f}s"
        if check:
            raise SystemExit(message) from None
        log("lab", message)
        return
    if result.returncode != 0 or report is None:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
        message = f"lab: ansible/status.yml failed (exit {result.returncode}); last lines:\n{tail}"
        if check:
            raise SystemExit(message)
        log("lab", message)
    if report is not None:
        print(status_table(report))
    print(monitoring_pages(hosts))


def monitoring_pages(hosts: list[LabHost]) -> str:
    """Where each site's status page is (its Prometheus on the apps node), with the login and the CA."""
    lines = ["status pages (HTTPS; trust the lab's CA, " + str(pki_dir() / "ca.crt") + "):"]
    for host in sorted((h for h in hosts if h.variables.get("apps_node")), key=lambda h: h.site):
        password = pki_dir() / host.site / "prometheus-operator.password"
        lines.append(f"  {host.site:<11} https://{host_ip(host)}:9090/consoles/iot-stack.html"
                     f"  user operator, password in {password}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
