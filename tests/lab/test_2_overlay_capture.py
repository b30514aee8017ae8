"""What a site's nodes send each other across the LAN, captured there (issue 30): the Swarm overlay's VXLAN
packets (udp 4789) in the network namespace of site-a's second node, while a device's readings flow, each
reading carrying a marker. The brokers' replication (Kafka's BROKER listener, 9093), the services' Kafka
traffic (SERVICES, 9095: the bridge's writes, the adapter's and the jobs' reads), the adapter's writes to
Cassandra (CQL over TLS, 9042) and the bridge's reads from Mosquitto (MQTT over TLS, 1883) must carry none of
them in clear, and nothing may cross on Kafka's INTERNAL port (9092, closed). kafka-2 keeps its ZooKeeper
session (its login, the SCRAM credentials and ACLs it reads) with zookeeper-1 on the other node over TLS (2182),
nothing on ZooKeeper's port in clear (2181, on each server's loopback only). Prometheus' scrapes of kafka-2's
JMX exporter and of the node's exporter (and of the services' /metrics where a replica runs there) must show
no scrape in clear (its request line; the answer is gzipped). So that a clean capture is the
encryption's doing, not a blind capture's, the test sends the marker in clear itself, a UDP datagram from a
container on another node to kafka-2 (no listener needed: it crosses the LAN whatever waits for it), and the
capture must find it there."""
from __future__ import annotations

import uuid

import pytest

from tests.lab.test_2_end_to_end import publish
from tooling.lab import chaos, lab
from tooling.lab.overlay_capture import OverlayCapture

pytestmark = pytest.mark.smoke     # scripts/test runs this module in its lab smoke

SITE = "site-a"
READINGS = 2_000
CAPTURE_S = 75.0            # the registration and the publishing take 20-60 s on a loaded lab
BROKER, INTERNAL, SERVICES, MQTT_OVERLAY, CQL = 9093, 9092, 9095, 1883, 9042
ZOOKEEPER_TLS, ZOOKEEPER_CLEAR = 2182, 2181
JMX_EXPORTER, NODE_EXPORTER, SERVICES_METRICS = 9404, 9100, (9102, 9103)
METRICS_REQUEST = "GET /metrics"    # the scrape's request line (the answer is gzipped, the request never)
CONTROL_PORT = 9999         # UDP; no service of the stack uses it


# Run in a container on another node: the marker in clear to kafka-2, across the LAN, a few times (UDP may drop).
CONTROL = f"""
import socket, sys, time
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    for _ in range(5):
        s.sendto(sys.argv[1].encode() * 4, ("kafka-2", {CONTROL_PORT}))
        time.sleep(0.2)
"""


def _python_container_off(hosts: list, captured) -> tuple:
    """(host, container) of a service container with Python on a node of the site other than `captured`."""
    for host in (h for h in hosts if h.name != captured.name):
        for service in ("bridge", "cassandra-adapter", "mosquitto-agent"):
            found = lab.host_exec(host, "docker", "ps", "-q", *chaos.service_filter(SITE, service),
                                  check=False).stdout.split()
            if found:
                return host, found[0]
    raise AssertionError(f"no service container with Python on a node of {SITE} other than {captured.name}")


def test_replication_cql_and_the_bridges_mqtt_cross_the_lan_encrypted(lab_hosts):
    hosts = [h for h in lab_hosts if h.site == SITE]
    second = next(h for h in hosts if h.variables.get("kafka_id") == 2)
    manager = lab.site_managers(lab_hosts)[SITE]
    sender, container = _python_container_off(hosts, second)
    sensor = f"capture{uuid.uuid4().hex[:12]}"          # in every reading's topic, key and record
    capture = OverlayCapture(second, [sensor, METRICS_REQUEST], CAPTURE_S).start()
    publish(manager, SITE, sensor, [21.0 + (i % 5) * 0.1 for i in range(READINGS)])
    control = lab.host_exec(sender, "docker", "exec", container, "python", "-c", CONTROL, sensor, check=False,
                            timeout=60)
    assert control.returncode == 0, f"the control marker was not sent: {control.stderr[-500:]}"
    seen = capture.result()

    summary = f"capture on {second.name}: {seen.vxlan} VXLAN packets, per inner port {seen.ports}"
    print(summary)
    assert seen.packets(BROKER) > 0, f"no replication traffic crossed the LAN on BROKER: {summary}"
    assert seen.in_clear(BROKER) == 0, f"readings crossed the LAN in clear on BROKER: {summary}"
    assert seen.packets(SERVICES) > 0, f"no services' Kafka traffic crossed the LAN on SERVICES: {summary}"
    assert seen.in_clear(SERVICES) == 0, f"readings crossed the LAN in clear on SERVICES: {summary}"
    assert seen.packets(CQL) > 0, f"no CQL traffic crossed the LAN: {summary}"
    assert seen.in_clear(CQL) == 0, f"readings crossed the LAN in clear on CQL: {summary}"
    assert seen.packets(MQTT_OVERLAY) > 0, f"no MQTT traffic crossed the LAN to the bridge: {summary}"
    assert seen.in_clear(MQTT_OVERLAY) == 0, f"readings crossed the LAN in clear on MQTT 1883: {summary}"
    assert seen.packets(INTERNAL) == 0, f"something crossed the LAN on Kafka's INTERNAL port 9092: {summary}"
    assert seen.packets(ZOOKEEPER_TLS) > 0, f"kafka-2's ZooKeeper session did not cross the LAN on 2182: {summary}"
    assert seen.packets(ZOOKEEPER_CLEAR) == 0, f"something crossed the LAN on ZooKeeper's port 2181: {summary}"
    for port in (JMX_EXPORTER, NODE_EXPORTER):
        assert seen.packets(port) > 0, f"no scrape of site-a-2 crossed the LAN on {port}: {summary}"
    for port in (JMX_EXPORTER, NODE_EXPORTER, *SERVICES_METRICS):
        assert seen.in_clear(port) == 0, f"a scrape crossed the LAN in clear on {port}: {summary}"
    assert seen.in_clear(CONTROL_PORT) > 0, \
        f"the capture missed the marker sent in clear to kafka-2 (udp {CONTROL_PORT}), so it proves nothing: {summary}"
