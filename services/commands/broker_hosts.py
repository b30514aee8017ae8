"""A device's way to the broker at a site with more than one mqtt_node.

Mosquitto runs on one of the site's mqtt_nodes at a time, its port published only there; when that node dies
Swarm starts it on another. A device is given every mqtt_node's address (the devices role hands them out as
`mqtt_hosts`) and, whenever a connection cannot be opened (refused, unreachable, timed out), tries the next
(docs/operations.md, "Secrets", Devices). These helpers do that for a paho-mqtt client; the simulator and the lab's
test devices use them. Tests: tests/unit/commands/test_broker_hosts.py.
"""
from __future__ import annotations

import paho.mqtt.client as mqtt


def parse_hosts(text: str) -> list[str]:
    """"a,b , c" -> ["a", "b", "c"]; ValueError naming the problem when none is left or one is repeated."""
    hosts = [h.strip() for h in str(text).split(",") if h.strip()]
    if not hosts:
        raise ValueError(f"no broker host in {text!r}: give one address, or every mqtt_node's separated by commas")
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"broker hosts {hosts} repeat an address; give each mqtt_node's once")
    return hosts


def next_host(hosts: list[str], current: str) -> str:
    """The address after `current`, round the list (the first when `current` is not in it)."""
    return hosts[(hosts.index(current) + 1) % len(hosts)] if current in hosts else hosts[0]


def follow_hosts(client: mqtt.Client, hosts: list[str]) -> None:
    """From now on, each time paho's loop cannot open a connection it retries with the next address."""
    def on_connect_fail(c: mqtt.Client, _userdata: object) -> None:
        # Not the `host` setter: paho 2.2 refuses it here, its state still "connecting" with no socket open.
        c._host = next_host(hosts, c.host)  # noqa: SLF001
    client.on_connect_fail = on_connect_fail


def connect_first(client: mqtt.Client, hosts: list[str], port: int, keepalive: int) -> str:
    """Connect (blocking) to the first of `hosts` that accepts a connection; returns it. Raises the last
    OSError (ssl.SSLError, a certificate that does not verify, is one) when none does."""
    error: OSError | None = None
    for host in hosts:
        try:
            client.connect(host, port, keepalive=keepalive)
            return host
        except OSError as err:
            error = err
    assert error is not None
    raise error
