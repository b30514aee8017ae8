"""Every port a stack publishes on a host (reachable from the factory network or the WAN) is
authenticated and encrypted: the stacks rendered for inventory.example, service by service.

What each check reads in the stack file is what the images turn into their listeners; the
integration tests show the images do: tests/integration/test_kafka_security.py (Kafka's EXTERNAL
listener refuses plaintext, unknown users and wrong passwords) and test_mosquitto_image.py
(no anonymous MQTT; 8883 refuses clients without TLS, anonymous ones, wrong passwords and the services'
logins).
docs/security.md lists the same listeners."""
from __future__ import annotations

import pytest

from deploy.topology import site_topology
from tooling.testbed.mosquitto import site_config
from tooling.testbed.stack_render import REPO, load_inventory, render

SITES = {"site_a": "edge", "site_b": "edge", "datacenter": "datacenter"}


def _published() -> list[tuple[str, str, dict, int]]:
    hostvars, groups = load_inventory(REPO / "inventory.example")
    found = []
    for group, tier in SITES.items():
        alias = group.replace("_", "-")
        stack = render(tier, site_topology(hostvars, groups[group], alias, tier))
        for name, service in stack["services"].items():
            for port in service.get("ports", []):
                found.append((alias, name, service, port["target"]))
    return found


PUBLISHED = _published()


def _kafka_external(service: dict) -> tuple[str, str]:
    env = service["environment"]
    keystore = env.get("KAFKA_EXTERNAL_KEYSTORE_FILE", "")
    secret_targets = {s["target"]: s["source"] for s in service.get("secrets", []) if isinstance(s, dict)}
    plaintext = env.get("KAFKA_EXTERNAL_PLAINTEXT") == "1" or \
        "EXTERNAL:PLAINTEXT" in env.get("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "")
    # The entrypoint makes EXTERNAL SASL_SSL (SCRAM-SHA-512) with the ACL authorizer from the keystore, and
    # asks clients for a certificate of the clients CA (mutual TLS; the entrypoint refuses to start without it).
    tls = keystore == "/run/secrets/kafka_keystore.pem" and "kafka_keystore.pem" in secret_targets \
        and not plaintext
    mutual = env.get("KAFKA_EXTERNAL_CLIENT_CA_FILE") == "/run/secrets/kafka_clients_ca.pem" \
        and secret_targets.get("kafka_clients_ca.pem") == "kafka_clients_ca"
    return ("a client certificate of the clients CA, then SCRAM over SASL_SSL" if tls and mutual else ""), \
        ("TLS, the broker's own certificate" if tls else "")


def _listener(config: str, port: int) -> list[str]:
    """The lines of one `listener <port>` section of a Mosquitto configuration."""
    lines, inside = [], False
    for line in config.splitlines():
        if line.startswith("listener "):
            inside = line.split()[1] == str(port)
        elif inside and line and not line.startswith("#"):
            lines.append(line)
    return lines


def _mosquitto_tls(service: dict) -> tuple[str, str]:
    # The service runs the configuration the stack role renders (mosquitto.conf.j2, a Swarm config): on
    # 8883 anonymous clients are refused and the iot_gate plugin takes the device logins; TLS with the
    # site's certificate (Swarm secrets). test_mosquitto_image.py shows the image does what it says.
    mounted = {"source": "mosquitto_config", "target": "/etc/mosquitto/mosquitto.conf", "mode": 292} \
        in service["configs"] and service["environment"]["MOSQUITTO_CONFIG"] == "/etc/mosquitto/mosquitto.conf"
    section = _listener(site_config("site-a"), 8883) if mounted else []
    auth = "allow_anonymous false" in section and "plugin_opt_role devices" in section
    tls = {"certfile /run/secrets/mosquitto_tls_cert", "keyfile /run/secrets/mosquitto_tls_key"} <= set(section) \
        and {"mosquitto_tls_cert", "mosquitto_tls_key"} <= set(service["secrets"])
    return ("device logins (iot_gate plugin)" if auth else ""), ("TLS, the site's Mosquitto certificate" if tls else "")


def _prometheus(service: dict) -> tuple[str, str]:
    # Prometheus reads its web configuration (prometheus-web.yml.j2: a bcrypt login and the TLS
    # certificate) from the Swarm secret the command names; test_monitoring_stack.py renders that file
    # and tests/lab/test_2_monitoring.py shows the port refuses plain HTTP and anonymous requests.
    web = "--web.config.file=/run/secrets/prometheus_web.yml" in service["command"] and \
        {"source": "prometheus_web", "target": "prometheus_web.yml"} in service["secrets"]
    tls = web and {"prometheus_tls_cert", "prometheus_tls_key"} <= {
        s["source"] for s in service["secrets"] if isinstance(s, dict)}
    return ("basic auth (bcrypt)" if web else ""), ("TLS, the site's Prometheus certificate" if tls else "")


CHECKS = {("kafka", 9094): _kafka_external, ("mosquitto", 8883): _mosquitto_tls, ("prometheus", 9090): _prometheus,
          # Alertmanager reads Prometheus' web configuration (the same login and certificate);
          # tests/integration/test_alert_delivery.py runs the image's Alertmanager.
          ("alertmanager", 9093): _prometheus}


def _check(service_name: str, target: int):
    kind = service_name.split("-")[0]
    return CHECKS.get((kind, target))


def test_every_stack_publishes_something():
    assert {(site, target) for site, _, _, target in PUBLISHED} >= {("site-a", 9094), ("site-a", 8883),
                                                                     ("datacenter", 9094), ("site-a", 9090),
                                                                     ("datacenter", 9090), ("site-a", 9093)}


@pytest.mark.parametrize("site, name, service, target", PUBLISHED,
                         ids=[f"{s}-{n}-{t}" for s, n, _, t in PUBLISHED])
def test_published_port_requires_authentication(site, name, service, target):
    check = _check(name, target)
    assert check, f"{site}: {name} publishes port {target}, which no check here (and no row in docs/security.md) covers"
    auth, _ = check(service)
    assert auth, f"{site}: {name} publishes port {target} without authentication"


@pytest.mark.parametrize("site, name, service, target", PUBLISHED,
                         ids=[f"{s}-{n}-{t}" for s, n, _, t in PUBLISHED])
def test_published_port_is_encrypted(site, name, service, target):
    check = _check(name, target)
    assert check, f"{site}: {name} publishes port {target}, which no check here covers"
    _, tls = check(service)
    assert tls, f"{site}: {name} publishes port {target} without TLS"


def test_the_services_mqtt_listener_is_never_published():
    """1883 takes the bridge's and mosquitto-agent's logins on the overlay network only."""
    hostvars, groups = load_inventory(REPO / "inventory.example")
    topology = site_topology(hostvars, groups["site_a"], "site-a", "edge")
    published = {p["target"] for p in render("edge", topology)["services"]["mosquitto"]["ports"]}
    assert published == {8883}
