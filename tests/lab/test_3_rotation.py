"""Rotating a broker's certificate as docs/operations.md says (delete it on the controller, rerun
site.yml): the broker serves a new certificate from the same CA, and the site keeps taking readings
while Swarm restarts that broker. Not in the smoke: it restarts a broker and reruns a site's playbook.
"""
from __future__ import annotations

import socket
import ssl
import threading
import time
from datetime import UTC, datetime

from cryptography import x509

from tests.lab.conftest import run_lab
from tests.lab.test_2_end_to_end import publish, rows, wait_for
from tooling.lab import lab
from tooling.testbed.kafka_cluster import metadata_errors

SITE, BROKER_HOST, BROKER_ID = "site-a", "site-a-2", 2     # the broker on site-a's second node
BATCH, EVERY_S = 50, 3.0


def served_certificate(address: str) -> x509.Certificate:
    """The certificate the broker's EXTERNAL listener presents, verified against the lab's CA and for
    its address, as the operator's client on the factory network checks it."""
    context = ssl.create_default_context(cafile=str(lab.pki_dir() / "ca.crt"))
    context.load_cert_chain(*lab.client_cert())    # EXTERNAL asks for one (mutual TLS)
    with socket.create_connection((address, 9094), timeout=15) as sock, \
            context.wrap_socket(sock, server_hostname=address) as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def test_a_deleted_broker_certificate_is_reissued_served_and_the_site_loses_no_reading(lab_hosts):
    hosts = {h.name: h for h in lab_hosts}
    manager, address = lab.site_managers(lab_hosts)[SITE], lab.host_ip(hosts[BROKER_HOST])
    crt = lab.pki_dir() / SITE / f"kafka-{BROKER_ID}.crt"
    before = served_certificate(address)
    assert before == x509.load_pem_x509_certificate(crt.read_bytes())
    crt.unlink()

    # A device publishes a batch every few seconds for as long as the rerun takes (the broker restarts in it).
    sensor = f"rotation-{int(time.time())}"
    published: list[int] = []          # start_ms of each batch; mosquitto_pub returned 0: every reading PUBACKed
    done = threading.Event()
    failures: list[BaseException] = []

    def device() -> None:
        try:
            while not done.is_set():
                published.append(publish(manager, SITE, sensor, [21.0] * BATCH))
                done.wait(EVERY_S)
        except BaseException as err:  # noqa: BLE001 - reported by the test below
            failures.append(err)

    publisher = threading.Thread(target=device, daemon=True)
    publisher.start()
    try:
        run_lab("playbook", "--limit", "site_a")
    finally:
        done.set()
        publisher.join(timeout=360)
    assert not failures, failures

    after = served_certificate(address)
    assert after == x509.load_pem_x509_certificate(crt.read_bytes()), "the broker serves another certificate"
    assert after.serial_number != before.serial_number
    assert after.issuer == before.issuer
    assert metadata_errors(lab.kafka_client(f"{address}:9094")) == []

    expected = BATCH * len(published)
    days = sorted({datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d") for ms in published})

    def stored():
        total = 0
        for day in days:
            out = rows(manager, SITE, "SELECT count(*) FROM iot.temperature_readings "
                                      f"WHERE site='{SITE}' AND sensor_id='{sensor}' AND day='{day}';")
            total += int(out[0][0]) if out and out[0][0].isdigit() else 0
        return total if total >= expected else None

    assert len(published) >= 10, f"only {len(published)} batches while the site's playbook ran"
    assert wait_for(f"{expected} readings in {SITE}'s Cassandra", stored, timeout=600) == expected
