"""Throwaway containers of the project's images for integration tests and benchmarks:
a docker network (docker_lab), a Kafka cluster (kafka_cluster), a Cassandra node (cassandra_node)."""
