"""MirrorMaker 2 from the kafka image copies a site's topic to the datacenter under the site prefix."""
from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from tooling.testbed.docker_lab import wait_until
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster

TOPIC = "temperature-threshold-events"
RECORDS = 200


@pytest.fixture(scope="module")
def clusters(lab, tmp_path_factory):
    site = start_kafka_cluster(lab, prefix="site-a-")
    datacenter = start_kafka_cluster(lab, prefix="dc-")
    create_topics(site, TOPIC, "not-selected")
    config_dir = tmp_path_factory.mktemp("mm2")
    config_dir.chmod(0o755)
    (config_dir / "mm2.properties").write_text(f"""
clusters = site-a, datacenter
site-a.bootstrap.servers = {site.internal}
datacenter.bootstrap.servers = {datacenter.internal}
site-a->datacenter.enabled = true
site-a->datacenter.topics = {TOPIC}
datacenter->site-a.enabled = false
# single-broker test clusters
replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset-syncs.topic.replication.factor = 1
offset.storage.replication.factor = 1
status.storage.replication.factor = 1
config.storage.replication.factor = 1
sync.topic.acls.enabled = false
refresh.topics.interval.seconds = 5
# as the relay renders it: nothing written into the site, exactly-once into the datacenter
offset-syncs.topic.location = target
datacenter.exactly.once.source.support = enabled
dedicated.mode.enable.internal.rest = true
""")
    (config_dir / "mm2.properties").chmod(0o644)
    lab.run("kafka", "mirrormaker", "mirrormaker", memory="1g", env={"MM2_CLUSTERS": "datacenter"},
            volumes={str(config_dir): "/etc/mirrormaker:ro"})
    return site, datacenter


def test_records_on_site_topic_appear_prefixed_at_datacenter(lab, clusters):
    site, datacenter = clusters
    producer = Producer({"bootstrap.servers": site.external, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(TOPIC, key=f"sensor-{i % 5}", value=f"event-{i}")
        producer.produce("not-selected", key="x", value=f"private-{i}")
    assert producer.flush(30) == 0

    consumer = Consumer({"bootstrap.servers": datacenter.external, "group.id": "mm2-smoke",
                         "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 2000})
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

    topics = AdminClient({"bootstrap.servers": datacenter.external}).list_topics(timeout=10).topics
    assert "site-a.not-selected" not in topics, "a topic outside the selection was mirrored"
    assert TOPIC not in topics, "the mirrored topic must arrive prefixed, never under its own name"
    site_topics = AdminClient({"bootstrap.servers": site.external}).list_topics(timeout=10).topics
    assert not [t for t in site_topics if "mm2" in t or "heartbeats" in t or t.startswith("datacenter.")], \
        f"MirrorMaker wrote into the site: {sorted(site_topics)}"
