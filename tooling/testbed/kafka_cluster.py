"""Start a single-node ZooKeeper + Kafka cluster from the project's kafka image."""
from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, NewTopic

from tooling.testbed.docker_lab import Lab, free_port, wait_until


@dataclass(frozen=True)
class KafkaCluster:
    zookeeper: str   # container name of the ZooKeeper node
    broker: str      # container name of the broker
    internal: str    # bootstrap for containers on the lab network
    external: str    # bootstrap for the host (127.0.0.1:<port>)


def start_kafka_cluster(lab: Lab, prefix: str = "") -> KafkaCluster:
    """One ZooKeeper and one broker named '<prefix>zookeeper' and '<prefix>kafka'."""
    zk, broker = f"{prefix}zookeeper", f"{prefix}kafka"
    port = free_port()
    lab.run("kafka", zk, "zookeeper", memory="512m")
    lab.run("kafka", broker, "kafka", memory="1g", ports={port: 9094}, env={
        "KAFKA_BROKER_ID": "1",
        "KAFKA_ZOOKEEPER_CONNECT": f"{zk}:2181",
        "KAFKA_ADVERTISED_LISTENERS": f"INTERNAL://{broker}:9092,EXTERNAL://127.0.0.1:{port}",
        # A single broker cannot hold three replicas of the internal topics.
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    })
    cluster = KafkaCluster(zk, broker, f"{broker}:9092", f"127.0.0.1:{port}")

    def broker_registered() -> bool:
        metadata = AdminClient({"bootstrap.servers": cluster.external}).list_topics(timeout=5)
        return len(metadata.brokers) == 1

    wait_until(f"kafka broker {broker}", broker_registered, timeout=180,
               on_timeout=lambda: lab.logs(zk) + lab.logs(broker))
    return cluster


def create_topics(cluster: KafkaCluster, *names: str, partitions: int = 3, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.external})
    futures = admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1, config=config or {})
                                   for n in names])
    for future in futures.values():
        future.result(timeout=60)
