"""The disk alerts fire for real: the node-exporter image watches an almost full volume and the
prometheus image, with the scrape job the stack role renders and the rules of monitoring/, raises
DiskSpaceCritical naming the node.

The volume is a 16 MB tmpfs standing in for the filesystem that holds a node's Docker volumes; the
node exporter sees it as the stacks mount it (read-only at /node/volumes) and serves it as the stacks run it:
over mutual TLS (the image's web-tls.yml, the site's metrics PKI), scraped by the stack's `node` job. Empty,
nothing fires; filled to 98 %, DiskSpaceCritical fires after its 2 minutes and DiskSpaceLow is pending.
"""
from __future__ import annotations

import json
import re
import socket
import ssl
import urllib.request

import pytest

from tests.integration.test_metrics import prometheus_query, scrape_config
from tooling.testbed import certs
from tooling.testbed.docker_lab import docker, free_port, image, wait_until

SIZE = 16 * 1024 * 1024
FILL = SIZE - 300 * 1024           # 300 KB free: 1.8 % (tmpfs counts whole pages)
RATIO = ('node_filesystem_avail_bytes{job="node", mountpoint="/node/volumes"} '
         '/ node_filesystem_size_bytes{job="node", mountpoint="/node/volumes"} '
         '* on (instance) group_left (nodename) node_uname_info')


@pytest.fixture(scope="module")
def prometheus(lab, tmp_path_factory):
    volume = f"{lab.network}-disk"
    docker("volume", "create", "--driver", "local", "--opt", "type=tmpfs", "--opt", "device=tmpfs",
           "--opt", f"o=size={SIZE}", volume)
    port, exporter_port = free_port(), free_port()
    pki = certs.metrics_pki(tmp_path_factory.mktemp("metrics-pki"))
    try:
        lab.run("node-exporter", "node-exporter", "--web.config.file=/etc/node-exporter/web-tls.yml", memory="64m",
                ports={exporter_port: 9100}, volumes={volume: "/node/volumes:ro", pki["exporter"]: "/run/secrets:ro"})
        lab.run("prometheus", "prometheus", memory="512m", ports={port: 9090},
                env={"PROMETHEUS_CONFIG": "/etc/iot-test/prometheus.yml"},
                volumes={scrape_config(tmp_path_factory.mktemp("prometheus")): "/etc/iot-test:ro",
                         pki["prometheus"]: "/run/secrets:ro"})
        yield port, volume, exporter_port, pki
    finally:
        lab.close()
        docker("volume", "rm", "-f", volume, check=False)


def _alerts(port: int) -> list[dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=10) as resp:
        return [a for a in json.load(resp)["data"]["alerts"] if a["labels"]["alertname"].startswith("Disk")]


def test_an_empty_volume_is_seen_with_the_nodes_name_and_raises_nothing(lab, prometheus):
    port, *_ = prometheus
    seen: list = []

    def scraped() -> bool:
        seen[:] = prometheus_query(port, RATIO)
        return bool(seen)

    wait_until("the node exporter's volume in Prometheus", scraped, timeout=120, interval=3,
               on_timeout=lambda: lab.all_logs())
    (series,) = seen
    assert series["metric"]["nodename"] == "node-exporter" and series["metric"]["site"] == "test"
    assert float(series["value"][1]) > 0.95
    assert _alerts(port) == []


def _scrape(port: int, context: ssl.SSLContext | None) -> bytes:
    """GET /metrics from the node exporter, over TLS with `context` (checking the name metrics-exporter, as the
    stack's scrape job does) or in clear; the first bytes of the answer, b"" when it hangs up."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        conn = context.wrap_socket(raw, server_hostname="metrics-exporter") if context else raw
        conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        return conn.recv(4096)


def test_the_node_exporter_answers_only_over_tls_with_the_scrapers_certificate(prometheus):
    _, _, exporter_port, pki = prometheus
    scraper = ssl.create_default_context(cafile=f"{pki['prometheus']}/metrics_ca.pem")
    scraper.load_cert_chain(f"{pki['prometheus']}/scraper.pem")
    assert _scrape(exporter_port, scraper).startswith(b"HTTP/1.0 200")
    anonymous = ssl.create_default_context(cafile=f"{pki['prometheus']}/metrics_ca.pem")
    try:    # TLS 1.3: the refusal of a client without a certificate comes after the client's handshake
        refused = _scrape(exporter_port, anonymous)
    except (ssl.SSLError, ConnectionError):
        refused = b""
    assert refused == b"", refused[:200]
    assert b"node_" not in _scrape(exporter_port, None)     # Go answers clear text with a 400


def test_a_nearly_full_volume_raises_disk_space_critical(lab, prometheus):
    port, volume, *_ = prometheus
    docker("run", "--rm", "-v", f"{volume}:/fill", "--entrypoint", "sh", image("node-exporter"), "-c",
           f"head -c {FILL} /dev/zero > /fill/data")
    alerts: list = []

    def firing() -> bool:
        alerts[:] = _alerts(port)
        return any(a["labels"]["alertname"] == "DiskSpaceCritical" and a["state"] == "firing" for a in alerts)

    wait_until("DiskSpaceCritical firing", firing, timeout=240, interval=5,
               on_timeout=lambda: f"{alerts}\n{lab.logs('prometheus')}")
    by_name = {a["labels"]["alertname"]: a for a in alerts}
    critical = by_name["DiskSpaceCritical"]
    assert critical["labels"]["nodename"] == "node-exporter" and critical["labels"]["severity"] == "critical"
    assert re.fullmatch(r"node-exporter of test: only 1\.[0-9]+% of the volumes' disk is free",
                        critical["annotations"]["summary"]), critical["annotations"]
    assert by_name["DiskSpaceLow"]["state"] == "pending"        # its 10 minutes have not passed
