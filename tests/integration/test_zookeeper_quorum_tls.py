"""ZooKeeper's servers among themselves (quorum 2888, election 3888) over mutual TLS with certificates of the
site's ZooKeeper CA (ZOO_QUORUM_TLS in images/kafka/bin/entrypoint), reached from an ensemble in clear the way
deploy/rollout.py rolls a site: every server restarted to `accepting`, then each to `sending`, then each to
`required`, one at a time, the ensemble serving (one leader, the others following) after every restart and
a znode written before still there. Then a server that speaks clear, and one whose certificate another CA
issued, cannot join the ensemble while the others keep serving."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tooling.testbed import certs
from tooling.testbed.docker_lab import wait_until

SERVERS = (1, 2, 3)
# As deployed before ZooKeeper's TLS (each server's client port in clear on every address), and as the stack
# writes it since (the client ports from ZOO_CLIENT_TLS).
ENSEMBLE_CLEAR = " ".join(f"server.{i}=zq{i}:2888:3888;2181" for i in SERVERS)
ENSEMBLE = " ".join(f"server.{i}=zq{i}:2888:3888" for i in SERVERS)


@pytest.fixture(scope="module")
def pki() -> Path:
    """A ZooKeeper CA and one keystore per server (zq<i>-keystore.pem, ca.crt), and other-keystore.pem for
    server 3 from another CA, as the pki role's tasks/zookeeper.yml and site_ca.yml write them."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    directory = Path(tempfile.mkdtemp(prefix="zk-quorum-pki-"))
    directory.chmod(0o755)
    pem = serialization.Encoding.PEM
    usage = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
    zookeeper_ca, other_ca = certs.ca("iot-stack test zookeeper CA"), certs.ca("another CA")
    files = {"ca.crt": zookeeper_ca[1].public_bytes(pem)}
    for name, issuer, server in [(f"zq{i}", zookeeper_ca, i) for i in SERVERS] + [("other", other_ca, 3)]:
        key, cert = certs.issue(issuer, f"zookeeper-{server}", usage, (x509.DNSName(f"zq{server}"),))
        files[f"{name}-keystore.pem"] = certs.key_pem(key) + cert.public_bytes(pem) + issuer[1].public_bytes(pem)
    for name, content in files.items():
        (directory / name).write_bytes(content)
        (directory / name).chmod(0o644)      # the container's uid 1000 reads them
    return directory


def start(lab, pki: Path, server: int, quorum_tls: str, keystore: str = "") -> None:
    lab.rm(f"zq{server}")
    """Server `server` (re)started as deploy/rollout.py's stages define it: `off` as deployed before; with quorum
    TLS `accepting` or `sending` also taking clients over TLS and in clear (ZOO_CLIENT_TLS=optional), and
    `required` as the stack's final definition (clients over TLS, clear on the loopback only)."""
    env = {"ZOO_MY_ID": str(server), "ZOO_SERVERS": ENSEMBLE_CLEAR if quorum_tls == "off" else ENSEMBLE,
           "ZOO_QUORUM_TLS": quorum_tls}
    if quorum_tls != "off":
        env |= {"ZOO_TLS_KEYSTORE_FILE": f"/etc/zk-pki/{keystore or f'zq{server}-keystore.pem'}",
                "ZOO_TLS_CA_FILE": "/etc/zk-pki/ca.crt",
                "ZOO_CLIENT_TLS": "required" if quorum_tls == "required" else "optional"}
    lab.run("kafka", f"zq{server}", "zookeeper", env=env, memory="384m", volumes={str(pki): "/etc/zk-pki:ro"})


def mode(lab, server: int) -> str:
    answer = lab.exec(f"zq{server}", "bash", "-c", "echo srvr | nc -w 3 127.0.0.1 2181").stdout
    return next((line.split(": ", 1)[1] for line in answer.splitlines() if line.startswith("Mode: ")), "")


def serving(lab, servers=SERVERS) -> bool:
    modes = sorted(mode(lab, server) for server in servers)
    return modes == sorted(["leader"] + ["follower"] * (len(servers) - 1))


def wait_serving(lab, what: str, servers=SERVERS) -> None:
    wait_until(f"the ensemble serving {what}", lambda: serving(lab, servers), timeout=180, interval=3,
               on_timeout=lambda: "\n".join(f"zq{s}: {mode(lab, s)!r}" for s in SERVERS) + lab.all_logs(40))


def shell(lab, *command: str) -> str:
    result = lab.exec("zq1", "zookeeper-shell", "-server", "127.0.0.1:2181", *command, timeout=120)
    return result.stdout + result.stderr


def test_an_ensemble_in_clear_rolls_onto_quorum_tls_one_server_at_a_time(lab, pki):
    for server in SERVERS:
        start(lab, pki, server, "off")
    wait_serving(lab, "in clear")
    assert "Created /rolled" in shell(lab, "create", "/rolled", "before"), shell(lab, "ls", "/")
    for phase in ("accepting", "sending", "required"):
        for server in SERVERS:
            start(lab, pki, server, phase)
            wait_serving(lab, f"after zq{server} restarted {phase}")
    logs = lab.logs("zq1", tail=400)
    assert "sslQuorum" in lab.exec("zq1", "cat", "/opt/kafka/run/zoo.cfg").stdout, logs
    assert "before" in shell(lab, "get", "/rolled")


@pytest.mark.parametrize("intruder", ["clear", "another CA"])
def test_a_server_in_clear_or_of_another_ca_cannot_join(lab, pki, intruder):
    if not serving(lab):                  # run alone: bring the ensemble up on quorum TLS first
        for server in SERVERS:
            start(lab, pki, server, "required")
        wait_serving(lab, "on quorum TLS")
    if intruder == "clear":
        start(lab, pki, 3, "off")
    else:
        start(lab, pki, 3, "required", keystore="other-keystore.pem")
    wait_serving(lab, "without zq3", servers=(1, 2))
    # Long enough for several election rounds (its connection attempts are refused each time).
    with pytest.raises(TimeoutError):
        wait_until("zq3 joining", lambda: mode(lab, 3) in ("leader", "follower"), timeout=45, interval=3)
    assert serving(lab, (1, 2)), {s: mode(lab, s) for s in SERVERS}
    start(lab, pki, 3, "required")        # its own certificate again: it joins
    wait_serving(lab, "with zq3 back")
