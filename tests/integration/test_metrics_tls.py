"""A service's /metrics over TLS (services/common/observability.py, `serve_http(..., tls=metrics_tls(...))`), as the
stack runs the bridge, the adapter and the mosquitto-agent: real sockets and real TLS handshakes on loopback, with
certificates shaped as the pki role makes them (the metrics CA issues the endpoints' certificate, the scrapers CA
the site's Prometheus'). Only a client with a certificate of the scrapers CA reads /metrics; in clear, from
loopback, the container's healthcheck reads /healthz and nothing else; from any other address, clear text gets no
answer at all."""
from __future__ import annotations

import socket
import ssl

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from services.common.observability import metrics_tls, serve_http
from tooling.testbed import certs
from tooling.testbed.docker_lab import free_port

NAME = "metrics-exporter"
BODY = b"iot_test_metric 1\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """The site's metrics PKI as the stack mounts it (certs.metrics_pki), and a scraper's keystore of another CA."""
    root = tmp_path_factory.mktemp("metrics-pki")
    made = certs.metrics_pki(root)
    other_ca = certs.ca("another CA")
    key, cert = certs.issue(other_ca, "scraper-prometheus", ExtendedKeyUsageOID.CLIENT_AUTH)
    (root / "stranger.pem").write_bytes(b"".join([certs.key_pem(key), *(c.public_bytes(serialization.Encoding.PEM)
                                                                      for c in (cert, other_ca[1]))]))
    exporter, prometheus = made["exporter"], made["prometheus"]
    # The endpoints' own keystore (serverAuth and clientAuth, as the pki role's) and the stranger's may not scrape.
    return {"server": f"{exporter}/metrics_keystore.pem", "exporter_as_client": f"{exporter}/metrics_keystore.pem",
            "scraper": f"{prometheus}/scraper.pem", "stranger": str(root / "stranger.pem"),
            "metrics_ca": f"{prometheus}/metrics_ca.pem", "scrapers_ca": f"{exporter}/scrapers_ca.pem"}


def _lan_address() -> str | None:
    """An address of this machine other than loopback (the network's view of the server), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") else address


@pytest.fixture(scope="module")
def server(pki):
    port = free_port()
    served = serve_http(port, lambda: (True, "ok"), lambda: (BODY, "text/plain"),
                        tls=metrics_tls(pki["server"], pki["scrapers_ca"]))
    yield port
    served.shutdown()
    served.server_close()


def _client(pki, keystore: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki["metrics_ca"])
    if keystore:
        context.load_cert_chain(keystore)
    return context


def _answer(conn, path: str) -> tuple[int, bytes]:
    conn.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _https_get(port: int, path: str, context: ssl.SSLContext) -> tuple[int, bytes]:
    """GET over TLS to 127.0.0.1, checking the certificate against metrics-exporter (Prometheus' server_name)."""
    with context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname=NAME) as conn:
        return _answer(conn, path)


def _http_get(address: str, port: int, path: str) -> tuple[int, bytes]:
    with socket.create_connection((address, port), timeout=10) as conn:
        return _answer(conn, path)


def test_the_scraper_reads_metrics_over_tls_and_checks_the_endpoints_name(pki, server):
    assert _https_get(server, "/metrics", _client(pki, pki["scraper"])) == (200, BODY)


@pytest.mark.parametrize("who", [None, "exporter_as_client", "stranger"])
def test_a_client_without_a_certificate_of_the_scrapers_ca_is_refused(pki, server, who):
    # TLS 1.3: the server checks the client's certificate after the client's handshake is done, so the refusal
    # arrives as an alert on the first read, or as a closed connection.
    with pytest.raises((ssl.SSLError, ConnectionError, IndexError)):
        _https_get(server, "/metrics", _client(pki, pki[who] if who else None))


def test_in_clear_from_loopback_only_healthz_answers(server):
    assert _http_get("127.0.0.1", server, "/healthz") == (200, b"ok\n")
    status, body = _http_get("127.0.0.1", server, "/metrics")
    assert status == 403 and b"TLS" in body and BODY not in body


def test_in_clear_from_the_network_nothing_answers(server):
    address = _lan_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    with socket.create_connection((address, server), timeout=10) as conn:
        conn.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert conn.recv(1024) == b"", "the server answered a clear-text request from a non-loopback address"


def test_a_keystore_that_is_not_one_is_named(pki, tmp_path):
    bad = tmp_path / "keystore.pem"
    bad.write_text("not a PEM file\n")
    with pytest.raises(ValueError, match=f"metrics keystore .*{bad}"):
        metrics_tls(str(bad), pki["scrapers_ca"])
    assert metrics_tls("", "") is None
