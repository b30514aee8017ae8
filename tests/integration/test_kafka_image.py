"""The kafka image runs real ZooKeeper and a real Kafka broker."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer

from tooling.testbed.docker_lab import docker, wait_until
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster

RECORDS = 1000


@pytest.fixture(scope="module")
def cluster(lab):
    return start_kafka_cluster(lab)


def test_zookeeper_answers_ruok(lab, cluster):
    # The probe gives ZooKeeper 2 s (nc -w 2); on a loaded 2-core machine one answer can take longer
    # (one CI run failed so), so it is asked again for up to 30 s, as Swarm's health check would.
    wait_until("ZooKeeper answers ruok with imok",
               lambda: lab.exec(cluster.zookeeper, "zookeeper-health").returncode == 0, timeout=30,
               on_timeout=lambda: lab.logs(cluster.zookeeper))


def test_kafka_topics_tool_creates_and_describes_topic(lab, cluster):
    created = lab.exec(cluster.broker, "kafka-topics", "--bootstrap-server", cluster.internal, "--create",
                       "--topic", "tool-made", "--partitions", "2", "--replication-factor", "1",
                       "--config", "cleanup.policy=compact")
    assert created.returncode == 0, created.stderr
    described = lab.exec(cluster.broker, "kafka-topics", "--bootstrap-server", cluster.internal,
                         "--describe", "--topic", "tool-made")
    assert "PartitionCount: 2" in described.stdout
    assert "cleanup.policy=compact" in described.stdout


def test_kafka_produces_and_consumes_1000_records(cluster):
    topic = f"smoke-{uuid.uuid4().hex[:6]}"
    create_topics(cluster, topic)
    producer = Producer({"bootstrap.servers": cluster.external, "acks": "all", "enable.idempotence": True})
    failures = []
    for i in range(RECORDS):
        producer.produce(topic, key=str(i % 17), value=f"reading-{i}",
                         on_delivery=lambda err, _msg: err and failures.append(err))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert failures == []

    consumer = Consumer({"bootstrap.servers": cluster.external, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen = set()
    try:
        for _ in range(300):
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                assert msg.error() is None, msg.error()
                seen.add(msg.value().decode())
            if len(seen) == RECORDS:
                break
    finally:
        consumer.close()
    assert seen == {f"reading-{i}" for i in range(RECORDS)}


def test_kafka_refuses_to_start_without_broker_id(lab):
    name = lab.run("kafka", "kafka-misconfigured", "kafka")
    wait_until("misconfigured broker to exit",
               lambda: docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "false", timeout=30)
    assert docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip() == "64"
    assert "KAFKA_BROKER_ID is required" in lab.logs("kafka-misconfigured")
