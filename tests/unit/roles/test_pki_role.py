"""The pki role, run by ansible-playbook on this machine as the controller: a CA, one certificate per
broker naming its EXTERNAL address, keystores Kafka's PEM loader reads, Mosquitto's certificate naming
every address devices may use, and a second run that changes nothing (a new CA or certificate would restart
every broker)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
TOPOLOGY = {"kafka": [{"id": 1, "address": "10.20.0.11"}, {"id": 2, "address": "kafka-b.factory.example"}],
            "cassandra": [{"id": 1}, {"id": 2}, {"id": 3}], "zookeeper": [{"id": 1}, {"id": 2}, {"id": 3}],
            "mqtt_addresses": ["10.20.0.11", "10.20.0.12"], "apps_address": "10.20.0.13"}

PLAY = """
- hosts: localhost
  gather_facts: false
  vars:
    iot_site_alias: site-a
    iot_topology: {topology}
  roles: [pki]
  post_tasks:
    - name: Hand over what the stack role gets
      ansible.builtin.copy:
        content: "{{{{ pki_secrets | to_json }}}}"
        dest: "{out}"
        mode: "0600"
"""


def _run(tmp_path: Path, **extra_vars) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(REPO / "ansible/roles"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOG_PATH="", PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}",
                           "-e", json.dumps({"iot_pki_dir": str(tmp_path / "pki"), **extra_vars}),
                           str(tmp_path / "play.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("pki")
    (tmp_path / "play.yml").write_text(PLAY.format(topology=json.dumps(TOPOLOGY), out=tmp_path / "secrets.json"))
    first = _run(tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    ca_before = (tmp_path / "pki/ca.crt").read_bytes()
    second = _run(tmp_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    return tmp_path, first, second, ca_before


def test_keys_stay_on_the_controller_with_tight_modes(runs):
    tmp_path, *_ = runs
    pki = tmp_path / "pki"
    assert oct(pki.stat().st_mode & 0o777) == "0o700"
    for name in ("ca.key", "clients-ca.key", "clients/relay.key", "clients/operator.key", "site-a/kafka-1.key",
                 "site-a/kafka-2.key", "site-a/mosquitto.key", "password-salt.key", "site-a/brokers-ca.key",
                 "site-a/brokers/kafka-1.key", "site-a/brokers/kafka-2.key", "site-a/cassandra-ca.key",
                 "site-a/cassandra/cassandra-1.key", "site-a/cassandra/cassandra-3.key",
                 "site-a/spark-auth.secret"):
        key = pki / name
        assert oct(key.stat().st_mode & 0o777) == "0o600", key


def test_each_keystore_is_key_certificate_and_ca_naming_the_brokers_address(runs):
    tmp_path, *_ = runs
    secrets = json.loads((tmp_path / "secrets.json").read_text())
    assert set(secrets) == {"kafka_ca", "kafka_clients_ca", "kafka_1_keystore", "kafka_2_keystore",
                            "mosquitto_tls_cert", "mosquitto_tls_key", "prometheus_tls_cert", "prometheus_tls_key",
                            "spark_auth_secret", "kafka_brokers_ca", "kafka_1_broker_keystore",
                            "kafka_2_broker_keystore", "cassandra_ca", "cassandra_1_keystore",
                            "cassandra_2_keystore", "cassandra_3_keystore", "zookeeper_ca", "zookeeper_1_keystore",
                            "zookeeper_2_keystore", "zookeeper_3_keystore", "metrics_ca", "metrics_exporter_keystore",
                            "scrapers_ca", "scraper_prometheus_keystore"}
    assert len(secrets["spark_auth_secret"].strip()) == 48
    ca = x509.load_pem_x509_certificate(secrets["kafka_ca"].encode())
    for kafka in TOPOLOGY["kafka"]:
        pem = secrets[f"kafka_{kafka['id']}_keystore"]
        # Kafka's PEM keystore wants a PKCS#8 key, then the chain, each block on its own lines.
        assert pem.startswith("-----BEGIN PRIVATE KEY-----\n") and "\\n" not in pem
        serialization.load_pem_private_key(pem.encode(), password=None)
        cert, chain_ca = x509.load_pem_x509_certificates(pem.encode())
        assert chain_ca == ca
        cert.verify_directly_issued_by(ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        address = kafka["address"]
        found = [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] + \
            names.get_values_for_type(x509.DNSName)
        assert address in found and f"kafka-{kafka['id']}" in found, found


@pytest.mark.parametrize("server, addresses", [("mosquitto", TOPOLOGY["mqtt_addresses"]),
                                               ("prometheus", [TOPOLOGY["apps_address"]])])
def test_server_gets_a_chain_naming_the_address_clients_use_and_its_key_alone(runs, server, addresses):
    """Mosquitto (devices reach whichever mqtt_node runs it: every one is named) and Prometheus (operators
    reach the apps_node)."""
    tmp_path, *_ = runs
    secrets = json.loads((tmp_path / "secrets.json").read_text())
    ca = x509.load_pem_x509_certificate(secrets["kafka_ca"].encode())
    cert, chain_ca = x509.load_pem_x509_certificates(secrets[f"{server}_tls_cert"].encode())
    assert chain_ca == ca
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == addresses
    # Prometheus' certificate is Alertmanager's too (the same apps node, stack-services.j2).
    assert names.get_values_for_type(x509.DNSName) == [server] + (["alertmanager"] if server == "prometheus" else [])
    key = serialization.load_pem_private_key(secrets[f"{server}_tls_key"].encode(), password=None)
    assert key.public_key() == cert.public_key()
    assert "CERTIFICATE" not in secrets[f"{server}_tls_key"]


def test_the_relay_and_the_operator_get_client_certificates_of_the_clients_ca_only(runs):
    """EXTERNAL's mutual TLS (issue 30): the brokers trust kafka_clients_ca for clients, a CA apart from the
    servers' one, so no server certificate (kafka_ca's) opens EXTERNAL; the relay's keystore goes to the
    datacenter only (this play is an edge site's)."""
    tmp_path, *_ = runs
    secrets = json.loads((tmp_path / "secrets.json").read_text())
    clients_ca = x509.load_pem_x509_certificate(secrets["kafka_clients_ca"].encode())
    assert clients_ca != x509.load_pem_x509_certificate(secrets["kafka_ca"].encode())
    assert clients_ca.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    for name in ("relay", "operator"):
        cert = x509.load_pem_x509_certificate((tmp_path / f"pki/clients/{name}.crt").read_bytes())
        cert.verify_directly_issued_by(clients_ca)
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usage) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
        key = serialization.load_pem_private_key((tmp_path / f"pki/clients/{name}.key").read_bytes(), password=None)
        assert key.public_key() == cert.public_key()
    assert "kafka_relay_keystore" not in secrets


def _site_ca(secrets: dict, secret: str, purpose: str, others: tuple[str, ...]):
    """A site CA of the pki role's tasks/site_ca.yml: its own, named for its purpose and site, no sub-CAs."""
    ca = x509.load_pem_x509_certificate(secrets[secret].encode())
    assert ca not in {x509.load_pem_x509_certificate(secrets[name].encode()) for name in others}
    assert ca.subject.rfc4514_string() == f"CN=iot-stack {purpose} CA site-a"
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    return ca


def _keystore_cert(pem: str, ca):
    """The certificate of a PEM keystore as Kafka's and Cassandra's PEM loaders read it (PKCS#8 key, the
    certificate issued by `ca`, then `ca`), the key matching it."""
    assert pem.startswith("-----BEGIN PRIVATE KEY-----\n") and "\\n" not in pem
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    cert, chain_ca = x509.load_pem_x509_certificates(pem.encode())
    assert chain_ca == ca and key.public_key() == cert.public_key()
    cert.verify_directly_issued_by(ca)
    return cert


def test_each_broker_gets_a_broker_certificate_of_the_sites_brokers_ca_only(runs):
    """Kafka's BROKER listener (issue 30): mutual TLS with a CA per site that issues the brokers' BROKER
    certificates and nothing else (not the servers' CA, whose certificates Mosquitto and Prometheus hold, nor
    the clients CA); one subject for every broker (the super user), the name each is reached by as its SAN."""
    tmp_path, *_ = runs
    secrets = json.loads((tmp_path / "secrets.json").read_text())
    brokers_ca = _site_ca(secrets, "kafka_brokers_ca", "brokers", others=("kafka_ca", "kafka_clients_ca"))
    for kafka in TOPOLOGY["kafka"]:
        cert = _keystore_cert(secrets[f"kafka_{kafka['id']}_broker_keystore"], brokers_ca)
        assert cert.subject.rfc4514_string() == "CN=kafka-broker"     # the entrypoint's super user
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == [f"kafka-{kafka['id']}"]
        assert names.get_values_for_type(x509.IPAddress) == []        # no address Kafka's clients or devices use
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(usage) == {x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH}


def test_each_cassandra_node_gets_a_certificate_of_the_sites_cassandra_ca_only(runs):
    """CQL over TLS (issue 30): clients check a node's certificate against a CA of the site that issues
    only its Cassandra nodes' certificates, so no broker's, Mosquitto's or Prometheus' certificate, nor
    another site's node, passes for one; each keystore as Cassandra's PEM factory reads it."""
    tmp_path, *_ = runs
    secrets = json.loads((tmp_path / "secrets.json").read_text())
    cassandra_ca = _site_ca(secrets, "cassandra_ca", "cassandra",
                            others=("kafka_ca", "kafka_clients_ca", "kafka_brokers_ca"))
    for node in TOPOLOGY["cassandra"]:
        cert = _keystore_cert(secrets[f"cassandra_{node['id']}_keystore"], cassandra_ca)
        assert cert.subject.rfc4514_string() == f"CN=cassandra-{node['id']}"
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == [f"cassandra-{node['id']}"]
    for other in ("kafka_1_broker_keystore", "mosquitto_tls_cert", "prometheus_tls_cert"):
        cert = x509.load_pem_x509_certificates(secrets[other].encode())[0]    # the server's, before its CA
        with pytest.raises(ValueError, match="does not match certificate issuer"):
            cert.verify_directly_issued_by(cassandra_ca)


def test_each_zookeeper_server_gets_a_certificate_of_the_sites_zookeeper_ca_only(runs):
    """ZooKeeper's clients over TLS (issue 30): the brokers check a server's certificate and name against a CA
    of the site that issues only its ZooKeeper servers' certificates, so no broker's, Cassandra node's,
    Mosquitto's or Prometheus' certificate passes for one."""
    tmp_path, *_ = runs
    secrets = json.loads((tmp_path / "secrets.json").read_text())
    zookeeper_ca = _site_ca(secrets, "zookeeper_ca", "zookeeper",
                            others=("kafka_ca", "kafka_clients_ca", "kafka_brokers_ca", "cassandra_ca"))
    for server in TOPOLOGY["zookeeper"]:
        cert = _keystore_cert(secrets[f"zookeeper_{server['id']}_keystore"], zookeeper_ca)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == [f"zookeeper-{server['id']}"]
    for other in ("kafka_1_broker_keystore", "cassandra_1_keystore", "mosquitto_tls_cert", "prometheus_tls_cert"):
        cert = x509.load_pem_x509_certificates(secrets[other].encode())[0]
        with pytest.raises(ValueError, match="does not match certificate issuer"):
            cert.verify_directly_issued_by(zookeeper_ca)


def test_metrics_endpoints_and_their_scraper_get_certificates_of_two_cas_that_issue_nothing_else(runs):
    """The services' /metrics over mutual TLS (issue 30): Prometheus checks the endpoints' certificate against
    the metrics CA, the endpoints let read only certificates of the scrapers CA. Neither the endpoints'
    certificate nor any other service's passes for the scraper, and no other certificate for an endpoint."""
    tmp_path, *_ = runs
    secrets = json.loads((tmp_path / "secrets.json").read_text())
    others = ("kafka_ca", "kafka_clients_ca", "kafka_brokers_ca", "cassandra_ca", "zookeeper_ca")
    metrics_ca = _site_ca(secrets, "metrics_ca", "metrics", others=others)
    scrapers_ca = _site_ca(secrets, "scrapers_ca", "scrapers", others=(*others, "metrics_ca"))
    exporter = _keystore_cert(secrets["metrics_exporter_keystore"], metrics_ca)
    names = exporter.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["metrics-exporter"]
    scraper = _keystore_cert(secrets["scraper_prometheus_keystore"], scrapers_ca)
    assert scraper.subject.rfc4514_string() == "CN=scraper-prometheus"
    for other in ("metrics_exporter_keystore", "kafka_1_broker_keystore", "cassandra_1_keystore",
                  "zookeeper_1_keystore", "mosquitto_tls_cert", "prometheus_tls_cert"):
        cert = x509.load_pem_x509_certificates(secrets[other].encode())[0]
        with pytest.raises(ValueError, match="does not match certificate issuer"):
            cert.verify_directly_issued_by(scrapers_ca)
    for other in ("scraper_prometheus_keystore", "kafka_1_broker_keystore", "prometheus_tls_cert"):
        cert = x509.load_pem_x509_certificates(secrets[other].encode())[0]
        with pytest.raises(ValueError, match="does not match certificate issuer"):
            cert.verify_directly_issued_by(metrics_ca)


def test_the_datacenter_gets_the_relays_keystore_as_kafkas_pem_loader_reads_it(tmp_path):
    (tmp_path / "play.yml").write_text(PLAY.replace("iot_site_alias: site-a", "iot_site_alias: datacenter\n"
                                                    "    iot_tier: datacenter").format(
        topology=json.dumps(TOPOLOGY), out=tmp_path / "secrets.json"))
    result = _run(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    pem = json.loads((tmp_path / "secrets.json").read_text())["kafka_relay_keystore"]
    assert pem.startswith("-----BEGIN PRIVATE KEY-----\n") and pem.endswith("-----END CERTIFICATE-----\n")
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    (cert,) = x509.load_pem_x509_certificates(pem.encode())
    assert key.public_key() == cert.public_key()
    assert cert.subject.rfc4514_string() == "CN=relay"


def test_second_run_changes_nothing(runs):
    tmp_path, first, second, ca_before = runs
    assert "changed=0" not in first.stdout.split("PLAY RECAP")[1]
    assert "changed=0 " in second.stdout.split("PLAY RECAP")[1], second.stdout[-2000:]
    assert (tmp_path / "pki/ca.crt").read_bytes() == ca_before
    assert len((tmp_path / "pki/password-salt.key").read_text().strip()) == 43    # made once, random


# ---------------------------------------------------------------- the CA key under a passphrase

PASSPHRASE = "correct horse battery staple 42"


def _play(tmp_path: Path) -> Path:
    (tmp_path / "play.yml").write_text(PLAY.format(topology=json.dumps(TOPOLOGY), out=tmp_path / "secrets.json"))
    return tmp_path


def _failure(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result.stdout[-2000:]
    return result.stdout + result.stderr


def test_with_a_passphrase_the_ca_key_is_made_encrypted_and_still_issues(tmp_path):
    """A copy of the PKI directory alone cannot issue a certificate: the key needs the vaulted passphrase,
    and a run without it, or with a wrong one, stops naming iot_pki_ca_passphrase before issuing anything."""
    _play(tmp_path)
    first = _run(tmp_path, iot_pki_ca_passphrase=PASSPHRASE)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    key = (tmp_path / "pki/ca.key").read_bytes()
    assert key.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    for other in ("clients-ca.key", "site-a/brokers-ca.key", "site-a/cassandra-ca.key"):
        assert (tmp_path / "pki" / other).read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----"), other
    with pytest.raises(TypeError):
        serialization.load_pem_private_key(key, password=None)
    ca_key = serialization.load_pem_private_key(key, password=PASSPHRASE.encode())
    ca = x509.load_pem_x509_certificate((tmp_path / "pki/ca.crt").read_bytes())
    broker = x509.load_pem_x509_certificate((tmp_path / "pki/site-a/kafka-1.crt").read_bytes())
    assert ca.public_key().public_numbers() == ca_key.public_key().public_numbers()
    broker.verify_directly_issued_by(ca)
    brokers_ca = x509.load_pem_x509_certificate((tmp_path / "pki/site-a/brokers-ca.crt").read_bytes())
    x509.load_pem_x509_certificate((tmp_path / "pki/site-a/brokers/kafka-1.crt").read_bytes()) \
        .verify_directly_issued_by(brokers_ca)
    assert PASSPHRASE not in first.stdout + first.stderr
    again = _run(tmp_path, iot_pki_ca_passphrase=PASSPHRASE)
    assert "changed=0 " in again.stdout.split("PLAY RECAP")[1], again.stdout[-2000:]

    (tmp_path / "pki/site-a/kafka-2.crt").unlink()       # something to issue: nothing may be
    missing = _failure(_run(tmp_path))
    assert "ca.key is encrypted: set iot_pki_ca_passphrase" in missing
    wrong = _failure(_run(tmp_path, iot_pki_ca_passphrase="not the passphrase"))
    assert "iot_pki_ca_passphrase does not open" in wrong and "not the passphrase" not in wrong
    assert not (tmp_path / "pki/site-a/kafka-2.crt").exists()


def test_a_passphrase_for_an_unencrypted_ca_key_says_how_to_encrypt_it(runs, tmp_path):
    made, *_ = runs            # a copy of the directory the module's runs made without a passphrase
    shutil.copytree(made / "pki", tmp_path / "pki")
    _play(tmp_path)
    refused = _failure(_run(tmp_path, iot_pki_ca_passphrase=PASSPHRASE))
    assert "iot_pki_ca_passphrase is set but" in refused and "openssl pkey -in ca.key -aes256" in refused
