"""MirrorMaker 2 from the kafka image copies a site's topic to the datacenter under the site prefix, reading
the site as the stacks do: over its EXTERNAL listener (SASL_SSL, SCRAM, the relay's client certificate) as
the relay principal, which has only the ACLs the relay_acls filter renders from the inventory. At the
datacenter it logs in as its own
principal, with only the ACLs the stack role renders for it (kafka-services.yml.j2, service_acls), and
delivers exactly once there (transactions) under them."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from deploy.kafka_acls import relay_acls, scram_jaas_config, service_acls
from tooling.testbed.docker_lab import docker, free_port, image, wait_until
from tooling.testbed.kafka_cluster import MM2_SINGLE_BROKER, create_topics, ensure_access, start_kafka_cluster
from tooling.testbed.stack_render import REPO, load_inventory, render_role_template

TOPIC = "temperature-threshold-events"
RECORDS = 200
OPERATOR = ("operator", "operator-password-3c9e51")
MIRRORMAKER = ("mirrormaker", "mirrormaker-password-9a41c7")
RELAY = ("relay", 'relay-"password"-\\-5d2a')   # a quote and a backslash: the JAAS line's escaping counts


@pytest.fixture(scope="module")
def clusters(lab, tmp_path_factory):
    site = start_kafka_cluster(lab, prefix="site-a-", operator=OPERATOR)
    datacenter = start_kafka_cluster(lab, prefix="dc-", operator=OPERATOR)
    create_topics(site, TOPIC, "not-selected")
    ensure_access(lab, site, dict([OPERATOR, RELAY]),
                  relay_acls(RELAY[0], [TOPIC], ["site-a-cassandra-adapter"]))
    ensure_access(lab, datacenter, dict([MIRRORMAKER]), mirrormaker_acls())
    config_dir = tmp_path_factory.mktemp("mm2")
    config_dir.chmod(0o755)
    (config_dir / "ca.pem").write_bytes(open(site.ca_file, "rb").read())
    (config_dir / "dc-ca.pem").write_bytes(open(datacenter.ca_file, "rb").read())
    # The relay's client certificate (mutual TLS on EXTERNAL, pki role's clients CA); at the datacenter, which
    # the test reaches on EXTERNAL too, a certificate of that cluster's clients CA.
    (config_dir / "relay-keystore.pem").write_bytes((Path(site.pki) / "relay-keystore.pem").read_bytes())
    (config_dir / "dc-keystore.pem").write_bytes((Path(datacenter.pki) / "relay-keystore.pem").read_bytes())
    # The site's EXTERNAL listener, as mm2.properties.j2 renders it. Its broker advertises the host's
    # 127.0.0.1:<port> (the name its certificate carries), so MirrorMaker runs in the host's network
    # and reaches the datacenter's broker on its host port too.
    (config_dir / "mm2.properties").write_text(f"""
clusters = site-a, datacenter
listeners = http://127.0.0.1:{free_port()}
site-a.bootstrap.servers = {site.external}
site-a.security.protocol = SASL_SSL
site-a.sasl.mechanism = SCRAM-SHA-512
site-a.sasl.jaas.config = {scram_jaas_config(*RELAY)}
site-a.ssl.truststore.type = PEM
site-a.ssl.truststore.location = /etc/mirrormaker/ca.pem
site-a.ssl.keystore.type = PEM
site-a.ssl.keystore.location = /etc/mirrormaker/relay-keystore.pem
datacenter.bootstrap.servers = {datacenter.external}
datacenter.security.protocol = SASL_SSL
datacenter.sasl.mechanism = SCRAM-SHA-512
datacenter.sasl.jaas.config = {scram_jaas_config(*MIRRORMAKER)}
datacenter.ssl.truststore.type = PEM
datacenter.ssl.truststore.location = /etc/mirrormaker/dc-ca.pem
datacenter.ssl.keystore.type = PEM
datacenter.ssl.keystore.location = /etc/mirrormaker/dc-keystore.pem
site-a->datacenter.enabled = true
site-a->datacenter.topics = {TOPIC}
datacenter->site-a.enabled = false
# single-broker test clusters
{MM2_SINGLE_BROKER}
sync.topic.acls.enabled = false
refresh.topics.interval.seconds = 5
# as the relay renders it: nothing written into the site, exactly-once into the datacenter
offset-syncs.topic.location = target
datacenter.exactly.once.source.support = enabled
dedicated.mode.enable.internal.rest = true
""")
    for name in ("mm2.properties", "ca.pem", "dc-ca.pem", "relay-keystore.pem", "dc-keystore.pem"):
        (config_dir / name).chmod(0o644)
    name = f"{lab.network}-mirrormaker"
    docker("run", "-d", "--name", name, "--network", "host", "--memory", "1g", "-e", "MM2_CLUSTERS=datacenter",
           "-v", f"{config_dir}:/etc/mirrormaker:ro", image("kafka"), "mirrormaker")
    lab.containers.append(name)     # removed with the lab
    return site, datacenter


def mirrormaker_acls() -> list[dict]:
    """MirrorMaker's ACLs at the datacenter as the stack role renders them, for one edge site, site-a."""
    hostvars, groups = load_inventory(REPO / "inventory.example")
    services = yaml.safe_load(render_role_template("kafka-services.yml.j2", hostvars, groups, "datacenter",
                                                   "datacenter", __stack_relay_sites=["site-a"]))
    return service_acls([s for s in services if s["user"] == MIRRORMAKER[0]], ["site-a"])


def test_records_on_site_topic_appear_prefixed_at_datacenter(lab, clusters):
    site, datacenter = clusters
    producer = Producer(site.client(acks="all"))
    for i in range(RECORDS):
        producer.produce(TOPIC, key=f"sensor-{i % 5}", value=f"event-{i}")
        producer.produce("not-selected", key="x", value=f"private-{i}")
    assert producer.flush(30) == 0

    consumer = Consumer(datacenter.client(**{"group.id": "mm2-smoke", "auto.offset.reset": "earliest",
                                             "topic.metadata.refresh.interval.ms": 2000}))
    consumer.subscribe([f"site-a.{TOPIC}"])
    seen = {}
    try:
        def mirrored_all() -> bool:
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                if msg.error() is None:
                    seen[msg.value().decode()] = msg.key().decode()
            return len(seen) >= RECORDS

        wait_until("mirrored records at the datacenter", mirrored_all, timeout=240, interval=0.1,
                   on_timeout=lambda: f"{len(seen)} of {RECORDS} arrived\n" + lab.logs("mirrormaker"))
    finally:
        consumer.close()
    assert seen == {f"event-{i}": f"sensor-{i % 5}" for i in range(RECORDS)}

    topics = AdminClient(datacenter.client()).list_topics(timeout=10).topics
    assert "site-a.not-selected" not in topics, "a topic outside the selection was mirrored"
    assert TOPIC not in topics, "the mirrored topic must arrive prefixed, never under its own name"
    site_topics = AdminClient(site.client()).list_topics(timeout=10).topics
    assert not [t for t in site_topics if "mm2" in t or "heartbeats" in t or t.startswith("datacenter.")], \
        f"MirrorMaker wrote into the site: {sorted(site_topics)}"
