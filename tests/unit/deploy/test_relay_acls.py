"""The relay principal's ACLs and MirrorMaker's login line, as deploy/kafka_acls.py renders them from the
inventory (deploy/kafka_acls.py: relay_acls, scram_jaas_config)."""
from __future__ import annotations

import io
from pathlib import Path

from deploy.kafka_acls import relay_acls, scram_jaas_config
from tooling.testbed.stack_render import REPO, load_inventory, properties, render_mm2


def test_relay_may_read_and_describe_relayed_topics_and_describe_its_group_only():
    acls = relay_acls("relay", ["temperature-rollups-1m", "device-registration"], ["site-a-cassandra-adapter"])
    assert {a["principal"] for a in acls} == {"User:relay"}
    assert {a["pattern"] for a in acls} == {"literal"}       # never a prefix: no topic beyond the list
    granted = {(a["resource"], a["name"], a["operation"]) for a in acls}
    assert granted == {
        ("topic", "temperature-rollups-1m", "READ"), ("topic", "temperature-rollups-1m", "DESCRIBE"),
        ("topic", "temperature-rollups-1m", "DESCRIBE_CONFIGS"),
        ("topic", "device-registration", "READ"), ("topic", "device-registration", "DESCRIBE"),
        ("topic", "device-registration", "DESCRIBE_CONFIGS"),
        ("group", "site-a-cassandra-adapter", "DESCRIBE"),
    }
    assert not any(a["operation"] in ("WRITE", "ALL", "ALTER", "DELETE", "CREATE") for a in acls)


def _java_properties_value(line: str) -> str:
    """What java.util.Properties.load makes of one `key = value` line's value (its escapes)."""
    value = line.split("=", 1)[1].strip()
    out, chars = io.StringIO(), iter(value)
    for ch in chars:
        out.write(next(chars, "") if ch == "\\" else ch)
    return out.getvalue()


def test_jaas_line_survives_properties_and_jaas_escaping():
    password = 'p"a\\ss w0rd-with-quote'
    line = "x.sasl.jaas.config = " + scram_jaas_config("relay", password)
    jaas = _java_properties_value(line)
    assert jaas.startswith("org.apache.kafka.common.security.scram.ScramLoginModule required ")
    # The JAAS parser reads quoted values with backslash escapes.
    quoted = jaas.split("password=", 1)[1].rstrip(";")
    assert quoted[0] == quoted[-1] == '"'
    assert quoted[1:-1].replace('\\"', '"').replace("\\\\", "\\") == password


def test_mirrormaker_reads_every_site_over_sasl_ssl_as_the_relay():
    hostvars, groups = load_inventory(REPO / "inventory.example")
    props = properties(render_mm2(hostvars, groups, stack_kafka_relay_password="relay-password-for-test"))
    for site in ("site-a", "site-b"):
        assert props[f"{site}.security.protocol"] == "SASL_SSL"
        assert props[f"{site}.sasl.mechanism"] == "SCRAM-SHA-512"
        assert 'username="relay"' in props[f"{site}.sasl.jaas.config"]
        assert props[f"{site}.ssl.truststore.type"] == "PEM"
        assert Path(props[f"{site}.ssl.truststore.location"]).name == "kafka_ca.pem"
        # The relay's client certificate, which the sites' EXTERNAL listeners ask for (mutual TLS).
        assert props[f"{site}.ssl.keystore.type"] == "PEM"
        assert props[f"{site}.ssl.keystore.location"] == "/run/secrets/kafka_relay_keystore.pem"
    # The datacenter's own cluster is reached on its overlay (SERVICES: SCRAM inside TLS, the brokers' certificates
    # checked against the datacenter's brokers CA), as MirrorMaker's own principal.
    assert props["datacenter.bootstrap.servers"].split(",")[0] == "kafka-1:9095"
    assert props["datacenter.security.protocol"] == "SASL_SSL"
    assert props["datacenter.ssl.truststore.type"] == "PEM"
    assert props["datacenter.ssl.truststore.location"] == "/run/secrets/kafka_brokers_ca.pem"
    assert props["datacenter.sasl.mechanism"] == "SCRAM-SHA-512"
    assert 'username="mirrormaker" password="mirrormaker-password-0123456789"' in \
        _java_properties_value("x = " + props["datacenter.sasl.jaas.config"])
