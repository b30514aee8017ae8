"""Start one Cassandra node from the project's cassandra image and wait for CQL.

Reusable by any integration test or benchmark that needs a real node:
`node = start_cassandra(lab)` then `node.session()` from the host, or
`node.internal` as the contact point for containers on the lab network.
With `tls=True` CQL takes TLS only, as at a site: `node.tls_dir` holds the CA (ca.pem) to mount into
clients, at TLS_DIR as the node has it.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from tooling.testbed import certs
from tooling.testbed.docker_lab import Lab, docker, free_port, wait_until

TLS_DIR = "/etc/cassandra-tls"       # where the node (and a client container) finds ca.pem


@dataclass(frozen=True)
class CassandraNode:
    name: str          # container name inside the lab (also its DNS name)
    container: str     # full docker container name
    internal: str      # host name for containers on the lab network (CQL port 9042)
    host_port: int     # CQL published on 127.0.0.1:<host_port>
    tls_dir: str = ""  # with CQL over TLS: the host directory holding ca.pem (and the node's keystore.pem)

    @property
    def ca_file(self) -> str:
        return f"{self.tls_dir}/ca.pem" if self.tls_dir else ""

    def session(self, keyspace: str | None = None, timeout: float = 30):
        """A driver session from the host; the caller shuts down `session.cluster`."""
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import RoundRobinPolicy

        from services.common.cql_tls import cql_tls_context

        # One node: round robin avoids the DC-aware policy's warning about the local DC.
        profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=timeout)
        cluster = Cluster(["127.0.0.1"], port=self.host_port, protocol_version=5, connect_timeout=10,
                          execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                          ssl_context=cql_tls_context(self.ca_file))
        return cluster.connect(keyspace)


def login_secrets(directory: Path, superuser_password: str, adapter_password: str) -> Path:
    """`directory` holding the two password files a node reads as the stacks hand them over
    (cassandra_password, cassandra_adapter_password), readable by the container's uid 1000; to mount at
    /run/secrets."""
    directory.chmod(0o755)
    for name, value in (("cassandra_password", superuser_password), ("cassandra_adapter_password", adapter_password)):
        (directory / name).write_text(value + "\n")
        (directory / name).chmod(0o644)
    return directory


def make_tls_dir(name: str, ca: tuple | None = None) -> Path:
    """A directory as the pki role's Cassandra CA makes them for node `name`: ca.pem, and keystore.pem (the
    node's PKCS#8 key, its certificate with SAN DNS:<name>, the CA). `ca` (certs.ca()) for nodes of one ring;
    a CA of its own by default."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding
    from cryptography.x509.oid import ExtendedKeyUsageOID

    directory = Path(tempfile.mkdtemp(prefix="cassandra-tls-"))
    ca = ca or certs.ca("iot-stack test cassandra CA")
    key, cert = certs.issue(ca, name, (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
                            (x509.DNSName(name),))
    ca_pem = ca[1].public_bytes(Encoding.PEM)
    files = {"ca.pem": ca_pem, "keystore.pem": certs.key_pem(key) + cert.public_bytes(Encoding.PEM) + ca_pem}
    directory.chmod(0o755)
    for file, content in files.items():
        (directory / file).write_bytes(content)
        (directory / file).chmod(0o644)    # the container's uid 1000 reads them
    return directory


def start_cassandra(lab: Lab, name: str = "cassandra", dc: str = "dc1", heap: str = "512M",
                    memory: str = "1536m", timeout: float = 300, env: dict[str, str] | None = None,
                    tls: bool = False, volumes: dict[str, str] | None = None) -> CassandraNode:
    """One fast-starting single node named `name`; returns once it answers CQL (over TLS only with `tls`)."""
    port = free_port()
    tls_dir = str(make_tls_dir(name)) if tls else ""
    tls_env = {"CASSANDRA_TLS_KEYSTORE_FILE": f"{TLS_DIR}/keystore.pem",
               "CASSANDRA_TLS_CA_FILE": f"{TLS_DIR}/ca.pem"} if tls else {}
    container = lab.run("cassandra", name, memory=memory, ports={port: 9042}, env={
        "CASSANDRA_DC": dc,
        "CASSANDRA_HEAP": heap,
        "CASSANDRA_FAST_START": "1",
        **tls_env,
        **(env or {}),
    }, volumes={**({tls_dir: f"{TLS_DIR}:ro"} if tls else {}), **(volumes or {})})
    node = CassandraNode(name, container, name, port, tls_dir)
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
