"""A device given every mqtt_node's address reaches the one that answers (services/commands/broker_hosts.py).

The connections are real TCP on loopback: 127.0.0.1 refuses (nothing listens on the port there) and
127.0.0.2 accepts, as a site's node without Mosquitto and the node that runs it do."""
from __future__ import annotations

import socket

import paho.mqtt.client as mqtt
import pytest

from services.commands import broker_hosts


@pytest.fixture
def listener():
    """A socket listening on 127.0.0.2 only; the same port on 127.0.0.1 refuses."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", 0))
        sock.listen(4)
        sock.settimeout(10)
        yield sock


def _client() -> mqtt.Client:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="device-1")
    client.reconnect_delay_set(0.1, 0.2)
    return client


@pytest.mark.parametrize("text, hosts", [("10.20.0.11", ["10.20.0.11"]),
                                         (" 10.20.0.11, 10.20.0.12 ,", ["10.20.0.11", "10.20.0.12"])])
def test_parse_hosts(text, hosts):
    assert broker_hosts.parse_hosts(text) == hosts


@pytest.mark.parametrize("text, message", [(" , ", "no broker host"), ("a,b,a", "repeat an address")])
def test_parse_hosts_names_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        broker_hosts.parse_hosts(text)


def test_next_host_goes_round_the_list():
    hosts = ["a", "b", "c"]
    assert [broker_hosts.next_host(hosts, h) for h in ("a", "b", "c", "elsewhere")] == ["b", "c", "a", "a"]


def test_connect_first_skips_a_host_that_refuses(listener):
    port = listener.getsockname()[1]
    client = _client()
    assert broker_hosts.connect_first(client, ["127.0.0.1", "127.0.0.2"], port, keepalive=10) == "127.0.0.2"
    conn, _ = listener.accept()
    assert conn.recv(1)[0] >> 4 == 1    # MQTT CONNECT
    conn.close()
    client.disconnect()


def test_connect_first_raises_when_no_host_answers(listener):
    port = listener.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        broker_hosts.connect_first(_client(), ["127.0.0.1", "127.0.0.3"], port, keepalive=10)


def test_a_client_that_follows_the_hosts_reaches_the_one_that_answers(listener):
    """paho's own loop: the first address refuses, the next connection is opened to the second."""
    port = listener.getsockname()[1]
    client = _client()
    broker_hosts.follow_hosts(client, ["127.0.0.1", "127.0.0.2"])
    client.connect_async("127.0.0.1", port, keepalive=10)
    client.loop_start()
    try:
        conn, _ = listener.accept()
        assert conn.recv(1)[0] >> 4 == 1
        assert client.host == "127.0.0.2"
        conn.close()
    finally:
        client.loop_stop()
