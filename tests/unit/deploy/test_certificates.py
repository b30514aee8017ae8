"""The site's certificates as Prometheus series (deploy/certificates.py): each certificate the pki role hands a
site once, with its end date, whatever secret (certificate, chain, keystore with its key) holds it; the rule
file promtool accepts, and the stack role mounts it where Prometheus loads its rules."""
from __future__ import annotations

import datetime
import shutil
import subprocess

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from deploy.certificates import METRIC, certificate_expiries, certificate_rules
from deploy.errors import DeployError
from deploy.topology import site_topology
from tooling.testbed.stack_render import REPO, load_inventory, render, render_role_template

START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _certificate(name: str, days: int, issuer=None, ca: bool = False):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_name, signer_key = issuer if issuer else (subject, key)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(signer_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(START)
            .not_valid_after(START + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .sign(signer_key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return pem, key_pem, (subject, key)


@pytest.fixture(scope="module")
def secrets() -> dict:
    ca_pem, _, ca = _certificate("iot-stack CA pki", 3650, ca=True)
    broker_pem, broker_key, _ = _certificate("kafka-1.site-a", 825, issuer=ca)
    mqtt_pem, mqtt_key, _ = _certificate("mosquitto.site-a", 400, issuer=ca)
    return {"kafka_ca": ca_pem + "\n",
            "kafka_1_keystore": broker_key + broker_pem + ca_pem,         # key, certificate, CA: Kafka's PEM keystore
            "mosquitto_tls_cert": mqtt_pem + ca_pem,                     # the chain
            "mosquitto_tls_key": mqtt_key,
            "spark_auth_secret": "x" * 48 + "\n"}


def test_each_certificate_once_with_its_end_soonest_first(secrets):
    def entry(name: str, kind: str, secret: str, days: int) -> dict:
        return {"certificate": name, "kind": kind, "secret": secret,
                "not_after": int(START.timestamp()) + days * 86400}
    assert certificate_expiries(secrets) == [
        entry("mosquitto.site-a", "leaf", "mosquitto_tls_cert", 400),
        entry("kafka-1.site-a", "leaf", "kafka_1_keystore", 825),
        entry("iot-stack CA pki", "ca", "kafka_1_keystore", 3650),    # in three secrets: named by the first
    ]


def test_the_rule_file_has_one_series_per_certificate_and_promtool_accepts_it(secrets, tmp_path):
    text = certificate_rules(secrets, "site-a")
    (group,) = yaml.safe_load(text)["groups"]
    assert [(r["record"], r["labels"]["certificate"], r["labels"]["site"]) for r in group["rules"]] == [
        (METRIC, "mosquitto.site-a", "site-a"), (METRIC, "kafka-1.site-a", "site-a"),
        (METRIC, "iot-stack CA pki", "site-a")]
    assert group["rules"][0]["expr"] == f"vector({int(START.timestamp()) + 400 * 86400})"
    assert "PRIVATE KEY" not in text and "BEGIN" not in text
    assert certificate_rules(dict(reversed(list(secrets.items()))), "site-a") == text    # the same on every run
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: apt-get install prometheus (scripts/test installs it)"
    (tmp_path / "certificates.yml").write_text(text)
    checked = subprocess.run([tool, "check", "rules", str(tmp_path / "certificates.yml")], capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


class _Tagged(str):
    """What Ansible 2.19 hands a filter for a string variable: a str subclass yaml.safe_dump refuses
    (a lab run failed on it: "cannot represent an object")."""


def test_ansibles_tagged_strings_are_written_as_plain_strings(secrets):
    tagged = {_Tagged(name): _Tagged(value) for name, value in secrets.items()}
    assert certificate_rules(tagged, _Tagged("site-a")) == certificate_rules(secrets, "site-a")


def test_a_certificate_that_does_not_parse_names_its_secret(secrets):
    broken = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
    with pytest.raises(DeployError, match="secret mqtt_device_ca holds a certificate that does not parse"):
        certificate_expiries({**secrets, "mqtt_device_ca": broken})


@pytest.mark.parametrize("tier", ["edge", "datacenter"])
def test_prometheus_loads_the_rule_file_with_its_rules(tier):
    hostvars, groups = load_inventory(REPO / "inventory.example")
    group = "site_a" if tier == "edge" else "datacenter"
    alias = group.replace("_", "-")
    prometheus = render(tier, site_topology(hostvars, groups[group], alias, tier))["services"]["prometheus"]
    assert {"source": "prometheus_certificates", "target": "/etc/prometheus/rules/certificates.yml",
            "mode": 292} in prometheus["configs"]
    config = yaml.safe_load(render_role_template("prometheus.yml.j2", hostvars, groups, group, tier,
                                                 iot_site_alias=alias))
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
