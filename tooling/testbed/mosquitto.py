"""A Mosquitto from the image, configured as a site's: the TLS listener for devices (8883) with a
certificate from a test CA, the plain one (1883) the bridge uses on the overlay, the password file
the stack role's filter writes and the ACL its template renders for the site."""
from __future__ import annotations

import importlib.util
import re
import secrets as random_secrets
from pathlib import Path

import jinja2
import yaml

from tooling.testbed.docker_lab import Lab, free_port, wait_until
from tooling.testbed.kafka_cluster import make_pki

REPO = Path(__file__).resolve().parents[2]


def site_acl(site: str) -> str:
    """ansible/roles/stack/templates/mosquitto-acl.j2 with the stack role's defaults, for `site`."""
    defaults = yaml.safe_load((REPO / "ansible/roles/stack/defaults/main.yml").read_text())
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "ansible/roles/stack/templates"),
                             undefined=jinja2.StrictUndefined, trim_blocks=True)
    env.filters["comment"] = lambda text: f"# {text}"
    device_acl = [jinja2.Template(rule).render(iot_site_alias=site) for rule in defaults["stack_mqtt_device_acl"]]
    return env.get_template("mosquitto-acl.j2").render(
        ansible_managed="test", stack_mqtt_device_acl=device_acl, stack_mqtt_acl=defaults["stack_mqtt_acl"])


TLS_ENV = {"MOSQUITTO_TLS_CERT_FILE": "/run/secrets/mosquitto_tls_cert",
           "MOSQUITTO_TLS_KEY_FILE": "/run/secrets/mosquitto_tls_key"}


def tls_files(secrets: Path, name: str) -> Path:
    """A test CA and Mosquitto's certificate (naming 127.0.0.1 and `name`) in `secrets`, as the pki role
    hands them over: mosquitto_tls_cert (certificate, CA) and mosquitto_tls_key; with TLS_ENV the image
    opens 8883. Returns the CA file (ca.crt, in `secrets` too)."""
    ca = make_pki(secrets, name)
    blocks = re.findall(r"-----BEGIN [^-]+-----.+?-----END [^-]+-----\n", (secrets / "keystore.pem").read_text(),
                        re.DOTALL)
    (secrets / "mosquitto_tls_key").write_text(blocks[0])
    (secrets / "mosquitto_tls_cert").write_text("".join(blocks[1:]))
    for path in (secrets / "mosquitto_tls_key", secrets / "mosquitto_tls_cert"):
        path.chmod(0o644)                # the container's uid 1000 reads them (test secrets only)
    return ca


def start_site_mosquitto(lab: Lab, secrets: Path, users: dict[str, str], site: str,
                         name: str = "mosquitto") -> dict:
    """Start it; returns {"tls": host port of 8883, "plain": host port of 1883, "ca": the CA file}.
    Its certificate names 127.0.0.1 and `name` (its DNS name on the lab's network)."""
    # The stack role's filter writes the password file as the role deploys it.
    spec = importlib.util.spec_from_file_location("iot_stack_filters", REPO / "ansible/filter_plugins/iot_stack.py")
    iot_stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(iot_stack)
    ca = tls_files(secrets, name)
    (secrets / "mosquitto_passwd").write_text(iot_stack.mosquitto_passwd(users, site, random_secrets.token_urlsafe(32)))
    (secrets / "acl").write_text(site_acl(site))
    for path in secrets.iterdir():
        path.chmod(0o644)                # the container's uid 1000 reads them (test secrets only)
    tls, plain = free_port(), free_port()
    lab.run("mosquitto", name, ports={tls: 8883, plain: 1883}, volumes={str(secrets): "/run/secrets:ro"},
            env={"MOSQUITTO_PASSWORD_FILE": "/run/secrets/mosquitto_passwd", "MOSQUITTO_ACL_FILE": "/run/secrets/acl",
                 **TLS_ENV}, memory="256m")
    user, password = next(iter(users.items()))
    wait_until("mosquitto's TLS listener",
               lambda: lab.exec(name, "mosquitto_sub", "-p", "8883", "--cafile", "/run/secrets/ca.crt",
                                "-h", name, "-u", user, "-P", password, "-t", "x", "-W", "1").returncode in (0, 27),
               timeout=60, on_timeout=lambda: lab.logs(name))
    return {"tls": tls, "plain": plain, "ca": ca}
