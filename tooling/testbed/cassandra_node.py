"""Start one Cassandra node from the project's cassandra image and wait for CQL.

Reusable by any integration test or benchmark that needs a real node:
`node = start_cassandra(lab)` then `node.session()` from the host, or
`node.internal` as the contact point for containers on the lab network.
"""
from __future__ import annotations

from dataclasses import dataclass

from tooling.testbed.docker_lab import Lab, docker, free_port, wait_until


@dataclass(frozen=True)
class CassandraNode:
    name: str          # container name inside the lab (also its DNS name)
    container: str     # full docker container name
    internal: str      # host name for containers on the lab network (CQL port 9042)
    host_port: int     # CQL published on 127.0.0.1:<host_port>

    def session(self, keyspace: str | None = None, timeout: float = 30):
        """A driver session from the host; the caller shuts down `session.cluster`."""
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import RoundRobinPolicy

        # One node: round robin avoids the DC-aware policy's warning about the local DC.
        profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=timeout)
        cluster = Cluster(["127.0.0.1"], port=self.host_port, protocol_version=5, connect_timeout=10,
                          execution_profiles={EXEC_PROFILE_DEFAULT: profile})
        return cluster.connect(keyspace)


def start_cassandra(lab: Lab, name: str = "cassandra", dc: str = "dc1", heap: str = "512M",
                    memory: str = "1536m", timeout: float = 300, env: dict[str, str] | None = None
                    ) -> CassandraNode:
    """One fast-starting single node named `name`; returns once it answers CQL."""
    port = free_port()
    container = lab.run("cassandra", name, memory=memory, ports={port: 9042}, env={
        "CASSANDRA_DC": dc,
        "CASSANDRA_HEAP": heap,
        "CASSANDRA_FAST_START": "1",
        **(env or {}),
    })
    node = CassandraNode(name, container, name, port)
    wait_for_cql(lab, node, timeout)
    return node


def wait_for_cql(lab: Lab, node: CassandraNode, timeout: float = 300) -> None:
    """Wait until cqlsh inside the container answers (also after `docker start`)."""
    def answers() -> bool:
        result = lab.exec(node.name, "cqlsh", "--request-timeout=10", "-e",
                          "SELECT release_version FROM system.local", timeout=30)
        return result.returncode == 0

    wait_until(f"cassandra node {node.name}", answers, timeout=timeout, interval=3,
               on_timeout=lambda: lab.logs(node.name))


def restart(lab: Lab, node: CassandraNode, timeout: float = 300) -> None:
    """`docker start` the stopped container again (same data volume) and wait for CQL."""
    docker("start", node.container)
    wait_for_cql(lab, node, timeout)
