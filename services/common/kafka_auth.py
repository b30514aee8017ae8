"""How a client logs in to a site's Kafka. One place for every client of either listener.

- EXTERNAL (host port 9094): SASL_SSL with a SCRAM-SHA-512 login and a client certificate (mutual TLS). The
  broker's certificate is checked against the deployment's CA and its name against the address dialled; the
  broker asks for a certificate from the deployment's clients CA, which the pki role issues only to the
  principals that belong outside a site (the datacenter's relay, the operator), so a service's password read
  off a node opens nothing from the factory network (docs/security.md): sasl_ssl_config.
- SERVICES (the site's overlay, 9095; the services and the deployment's tools) and INTERNAL (9092, in clear;
  a stack does not open it, the integration tests do): SCRAM-SHA-512, each principal's ACLs allowing only what
  it does (docs/security.md). overlay_config: with KAFKA_CA_FILE (the site's brokers CA) the login goes inside TLS
  (SASL_SSL, SERVICES), checking the broker's name; without, in clear (INTERNAL). internal_config reads a
  service's login from KAFKA_USERNAME and the secret kafka_password (KAFKA_PASSWORD_FILE). Java clients get
  the same as jaas_config, the CA inline (Spark: no file on executors) or as a file (client_properties).

Standard library only: the Spark jobs use this module too."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from services.common import settings

MECHANISM = "SCRAM-SHA-512"
# The login on the overlay (SERVICES), as Options (the Spark jobs list them among their settings, spark/README.md).
USERNAME = settings.Option("kafka_username", "KAFKA_USERNAME", "",
                           "this program's Kafka user on its site's overlay (SCRAM-SHA-512, inside TLS with "
                           "KAFKA_CA_FILE; empty: no login)")
PASSWORD = settings.Option("kafka_password", secret=True, required=True, help="password of KAFKA_USERNAME")
CA_FILE = settings.Option("kafka_ca_file", "KAFKA_CA_FILE", "",
                          "the site's brokers CA (PEM): the login goes over TLS (SERVICES listener); empty: in clear")
USERNAME_ENV = USERNAME.env
PASSWORD_SECRET = PASSWORD.name


def sasl_ssl_config(username: str, password: str, ca_file: str, cert_file: str, key_file: str) -> dict[str, str]:
    """librdkafka settings for a login to a site's EXTERNAL listener: the SCRAM login, the CA that signed the
    brokers' certificates, and this client's certificate (PEM, from the clients CA) and its key."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "sasl.username": username,
        "sasl.password": password,
        "ssl.ca.location": ca_file,
        # Also librdkafka's default since 2.0; stated, as it is what makes the certificate's name count.
        "ssl.endpoint.identification.algorithm": "https",
        "ssl.certificate.location": cert_file,
        "ssl.key.location": key_file,
    }


def missing_file(files) -> str | None:
    """For (flag, path, what) triples, the message naming the first whose file is missing, e.g.
    "--cert-file /x.crt not found (the operator's client certificate)"; None when every file is there."""
    for flag, path, what in files:
        if not Path(path).is_file():
            return f"{flag} {path} not found ({what})"
    return None


def sasl_plaintext_config(username: str, password: str) -> dict[str, str]:
    """librdkafka settings for a SCRAM login to a site's INTERNAL listener."""
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": MECHANISM,
            "sasl.username": username, "sasl.password": password}


def internal_login(environ: Mapping[str, str] | None = None,
                   secrets_dir: Path | str | None = None) -> tuple[str, str] | None:
    """(user, password) of this service on INTERNAL; None without KAFKA_USERNAME (a test cluster whose
    INTERNAL is plaintext). Raises settings.SettingsError when the user is set and its password is not."""
    environ = os.environ if environ is None else environ
    user = settings.value(USERNAME, None, environ)
    if not user:
        return None
    password = settings.value(PASSWORD, None, environ, secrets_dir)
    if not password:
        raise settings.SettingsError(f"secret {PASSWORD_SECRET} of Kafka user {user} is empty; "
                                     f"fix the file or {PASSWORD_SECRET.upper()}_FILE")
    return user, password


def internal_ca_file(environ: Mapping[str, str] | None = None) -> str:
    """KAFKA_CA_FILE, checked: '' when unset; raises settings.SettingsError when it names no readable file."""
    path = settings.value(CA_FILE, None, os.environ if environ is None else environ)
    if path and not Path(path).is_file():
        raise settings.SettingsError(f"KAFKA_CA_FILE={path} not found (the site's brokers CA, PEM; the Swarm "
                                     f"secret kafka_brokers_ca), or unset it to log in to INTERNAL in clear")
    return path


def overlay_config(user: str, password: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """librdkafka settings for a SCRAM login on a site's overlay: inside TLS with KAFKA_CA_FILE (SERVICES,
    the broker's name checked), else in clear (INTERNAL). The one place a service or a deployment tool
    (iot-topics, iot-kafka-access, iot-devices, iot-site-data) chooses between the two."""
    config = sasl_plaintext_config(user, password)
    ca_file = internal_ca_file(environ)
    if ca_file:
        config |= {"security.protocol": "SASL_SSL", "ssl.ca.location": ca_file,
                   "ssl.endpoint.identification.algorithm": "https"}
    return config


def internal_config(environ: Mapping[str, str] | None = None,
                    secrets_dir: Path | str | None = None) -> dict[str, str]:
    """librdkafka settings for this service's login on its site's overlay ({} without one): inside TLS
    with KAFKA_CA_FILE, else in clear."""
    login = internal_login(environ, secrets_dir)
    return {} if login is None else overlay_config(*login, environ)


def jaas_config(user: str, password: str) -> str:
    """sasl.jaas.config of a Java client logging in with SCRAM (quoted values, backslash escapes): the one
    builder of this line, for the services, the Ansible roles (deploy/kafka_acls.py) and the tests."""
    def quoted(value: object) -> str:
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"org.apache.kafka.common.security.scram.ScramLoginModule required username={quoted(user)} " \
           f"password={quoted(password)};"


def properties_value(value: str) -> str:
    """A value as the right-hand side of a .properties line: java.util.Properties unescapes backslashes once."""
    return value.replace("\\", "\\\\")


def client_properties(user: str, password: str, ca_file: str = "") -> str:
    """A Java tool's --command-config for a login on a site's overlay (kafka-topics, kafka-consumer-groups ...):
    with `ca_file` (the brokers CA, PEM, as the tool's container sees it) inside TLS to SERVICES, checking the
    broker's name; without, in clear to INTERNAL."""
    lines = [f"security.protocol={'SASL_SSL' if ca_file else 'SASL_PLAINTEXT'}", f"sasl.mechanism={MECHANISM}",
             f"sasl.jaas.config={properties_value(jaas_config(user, password))}"]
    if ca_file:
        lines += ["ssl.truststore.type=PEM", f"ssl.truststore.location={properties_value(ca_file)}",
                  "ssl.endpoint.identification.algorithm=https"]
    return "\n".join(lines)


def java_internal_options(environ: Mapping[str, str] | None = None,
                          secrets_dir: Path | str | None = None) -> dict[str, str]:
    """Java client properties for this service's login on its site's overlay ({} without one). With
    KAFKA_CA_FILE the CA's certificates go inline (ssl.truststore.certificates, KIP-651), so that Spark's
    executors, which run in other containers, need no file."""
    login = internal_login(environ, secrets_dir)
    if login is None:
        return {}
    options = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": MECHANISM,
               "sasl.jaas.config": jaas_config(*login)}
    ca_file = internal_ca_file(environ)
    if ca_file:
        options |= {"security.protocol": "SASL_SSL", "ssl.truststore.type": "PEM",
                    "ssl.truststore.certificates": Path(ca_file).read_text().strip(),
                    "ssl.endpoint.identification.algorithm": "https"}
    return options
