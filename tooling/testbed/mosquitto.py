"""A Mosquitto from the image, configured as a site's: the configuration the stack role renders
(ansible/roles/stack/templates/mosquitto.conf.j2), the services' accounts the role writes, a device table
as mosquitto-agent would leave it on the volume, and a TLS certificate from a test CA."""
from __future__ import annotations

import time
from pathlib import Path

import jinja2
import paho.mqtt.client as mqtt
import yaml
from ansible.plugins.filter.core import FilterModule as CoreFilters
from ansible.plugins.filter.mathstuff import FilterModule as MathFilters
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from services.commands.devices import hash_password
from tooling.testbed.docker_lab import Lab, free_port, wait_until
from tooling.testbed.kafka_cluster import make_pki

REPO = Path(__file__).resolve().parents[2]
BRIDGE_USER, AGENT_USER = "bridge", "mosquitto-agent"


def site_config(site: str, **overrides: object) -> str:
    """mosquitto.conf.j2 with the stack role's defaults for `site`; `overrides` replace role variables
    (e.g. stack_mqtt_device_max_rate=0)."""
    defaults = yaml.safe_load((REPO / "ansible/roles/stack/defaults/main.yml").read_text())
    variables = {k: jinja2.Template(v).render(iot_site_alias=site) if isinstance(v, str) else v
                 for k, v in defaults.items() if k.startswith(("stack_mqtt_", "stack_resources"))}
    variables.update(overrides)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "ansible/roles/stack/templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    for module in (CoreFilters(), MathFilters()):
        env.filters.update(module.filters())
        env.filters.update({f"ansible.builtin.{name}": f for name, f in module.filters().items()})
    # The role's own derived value (vars/main.yml), rendered from its expression there.
    role_vars = yaml.safe_load((REPO / "ansible/roles/stack/vars/main.yml").read_text())
    if "__stack_mqtt_memory_limit" not in overrides:
        expression = role_vars["__stack_mqtt_memory_limit"]
        variables["__stack_mqtt_memory_limit"] = env.from_string(expression).render(variables)
    return env.get_template("mosquitto.conf.j2").render(ansible_managed="test", iot_site_alias=site, **variables)


def services_accounts(bridge_password: str, agent_password: str) -> str:
    """The secret mqtt_services as the stack role writes it: the bridge and mosquitto-agent, each bound
    to its client-id prefix."""
    return (f"{BRIDGE_USER} bridge bridge- {hash_password(bridge_password, iterations=10)}\n"
            f"{AGENT_USER} agent mosquitto-agent- {hash_password(agent_password, iterations=10)}\n")


def device_table(devices: dict[str, str | None]) -> str:
    """The plugin's device table (what mosquitto-agent leaves on the volume): device id -> password, or
    None for a device that logs in with a client certificate."""
    lines = [f"{device} 1 password {hash_password(password, iterations=10)}" if password is not None
             else f"{device} 1 certificate -" for device, password in devices.items()]
    return "# iot-gate devices v1\n" + "\n".join(lines) + "\n"


TLS_ENV: dict[str, str] = {}      # the configuration names its TLS files: nothing to set


def tls_files(secrets: Path, name: str) -> Path:
    """A test CA and Mosquitto's certificate (naming 127.0.0.1 and `name`) in `secrets`, as the pki role
    hands them over: mosquitto_tls_cert (certificate, CA) and mosquitto_tls_key. Returns the CA file."""
    import re
    ca = make_pki(secrets, name)
    blocks = re.findall(r"-----BEGIN [^-]+-----.+?-----END [^-]+-----\n", (secrets / "keystore.pem").read_text(),
                        re.DOTALL)
    (secrets / "mosquitto_tls_key").write_text(blocks[0])
    (secrets / "mosquitto_tls_cert").write_text("".join(blocks[1:]))
    for path in (secrets / "mosquitto_tls_key", secrets / "mosquitto_tls_cert"):
        path.chmod(0o644)                # the container's uid 1000 reads them (test secrets only)
    return ca


def start_site_mosquitto(lab: Lab, work: Path, devices: dict[str, str | None], site: str, bridge_password: str,
                         agent_password: str = "agent-password-for-tests", name: str = "mosquitto",
                         open_gate: bool = True, memory: str = "256m", device_ca: str | None = None,
                         extra_config: str = "", **config: object) -> dict:
    """Start it; returns {"tls": host port of 8883, "services": host port of 1883 (also TLS), "ca": the CA
    file, "data": its volume's folder}. Its certificate names 127.0.0.1 and `name`. With `open_gate`, a
    bridge login subscribes once so devices are let in, as the bridge does after every start."""
    secrets, data = work / "secrets", work / "data"
    secrets.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    ca = tls_files(secrets, name)
    (secrets / "mqtt_services").write_text(services_accounts(bridge_password, agent_password))
    # memory_limit as the role derives it (85 % of the container's memory), from this container's `memory`.
    config.setdefault("__stack_mqtt_memory_limit", int(_bytes(memory) * 0.85))
    (secrets / "mosquitto.conf").write_text(site_config(site, **config) + extra_config)    # extra: benches only
    (data / "iot-devices").write_text(device_table(devices))
    if device_ca:                        # stack_mqtt_device_auth: certificate
        (secrets / "mqtt_device_ca").write_text(device_ca)
    for path in secrets.iterdir():
        path.chmod(0o644)                # the container's uid 1000 reads them (test secrets only)
    data.chmod(0o777)
    (data / "iot-devices").chmod(0o666)
    tls, services = free_port(), free_port()
    lab.run("mosquitto", name, ports={tls: 8883, services: 1883},
            volumes={str(secrets): "/run/secrets:ro", str(data): "/var/lib/mosquitto"},
            env={"MOSQUITTO_CONFIG": "/run/secrets/mosquitto.conf"}, memory=memory)
    broker = {"tls": tls, "services": services, "ca": ca, "data": data, "bridge_password": bridge_password,
              "agent_password": agent_password}
    wait_until("mosquitto's services listener", lambda: bridge_login(services, bridge_password, ca=ca) == 0,
               timeout=60, on_timeout=lambda: lab.logs(name))
    if open_gate:
        open_device_gate(services, bridge_password, ca)
    return broker


def _bytes(size: str) -> int:
    """Docker's memory sizes ("256m", "1g") in bytes."""
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    return int(size[:-1]) * units[size[-1].lower()] if size[-1].lower() in units else int(size)


def bridge_login(port: int, password: str, subscribe: str | None = None, host: str = "127.0.0.1",
                 ca: Path | str | None = None) -> int | None:
    """Log in as the bridge (client id bridge-probe, clean start) over TLS checked against `ca` (in clear
    without it) and optionally subscribe; returns the CONNACK reason code, None when nothing answered."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="bridge-probe", protocol=MQTTProtocolVersion.MQTTv5)
    client.username_pw_set(BRIDGE_USER, password)
    if ca:
        client.tls_set(ca_certs=str(ca))
    result: dict[str, int] = {}
    client.on_connect = lambda _c, _u, _f, rc, _p: result.setdefault("connack", rc.value)
    client.on_subscribe = lambda _c, _u, _m, rcs, _p: result.setdefault("suback", rcs[0].value)
    try:
        client.connect(host, port, keepalive=5, clean_start=True)
    except OSError:
        return None
    client.loop_start()
    try:
        deadline = time.monotonic() + 5
        while "connack" not in result and time.monotonic() < deadline:
            time.sleep(0.05)
        if subscribe and result.get("connack") == 0:
            client.subscribe(subscribe, qos=1)
            while "suback" not in result and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        client.disconnect()
        client.loop_stop()
    return result.get("connack")


def open_device_gate(port: int, bridge_password: str, ca: Path | str) -> None:
    """What the bridge's first SUBSCRIBE after a Mosquitto start does: devices are let in from then on.
    A clean-start session with a topic no device writes, so nothing queues for it."""
    assert bridge_login(port, bridge_password, subscribe="testbed/gate", ca=ca) == 0
