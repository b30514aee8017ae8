"""The paho-mqtt contenders of `scripts/bench bridge` (tooling.bench.paho_bridge) hand every message paho
received to the bridge, in order, however many arrive at once: a lost one would read as a lost
message in the benchmark and be blamed on paho."""
from __future__ import annotations

import socket

from services.bridge import settings as bridge_settings
from services.bridge.app import READ_BATCH
from services.bridge.rules import DEFAULT_RULES, Mapping
from services.common import names
from services.common.observability import StopFlag
from tooling.bench.paho_bridge import PahoBridge, PahoLoopBridge


class _Producer:
    def __init__(self):
        self.records = []

    def produce(self, topic, value, key=None, headers=None, on_delivery=None):
        self.records.append(value)

    def poll(self, _timeout=0):
        return 0

    def flush(self, _timeout=0):
        return 0


def test_every_queued_message_reaches_the_bridge_in_order_across_batches():
    s = bridge_settings.BridgeSettings(commands_topic=None, metrics_port=0, window=10 * READ_BATCH, site="a")
    producer = _Producer()
    bridge = PahoBridge(s, Mapping.from_dicts(DEFAULT_RULES), StopFlag(), producer=producer)
    bridge.client.started = True                # as after connect(); nothing here talks to a broker
    topic = names.MQTT_READINGS.format(site="a", device_id="d", sensor_id="s")
    count = 2 * READ_BATCH + 7                  # more than one batch, and not a multiple of it
    bridge.events.put(("connect", True, 0))
    for mid in range(1, count + 1):
        payload = f'{{"timestamp": {1_700_000_000_000 + mid}, "temperature": 21.5, "unit": "C"}}'.encode()
        bridge.events.put(("message", topic, payload, mid, 1, None))
    for _ in range(5):
        bridge._io(read=True, timeout=0)
    assert bridge.window.added == count
    assert [e.mid for e in bridge.window._order] == list(range(1, count + 1))
    assert len(producer.records) == count
    assert bridge.connected


def test_a_full_window_leaves_the_rest_queued_for_later():
    s = bridge_settings.BridgeSettings(commands_topic=None, metrics_port=0, window=5, site="a")
    bridge = PahoBridge(s, Mapping.from_dicts(DEFAULT_RULES), StopFlag(), producer=_Producer())
    bridge.client.started = True
    topic = names.MQTT_READINGS.format(site="a", device_id="d", sensor_id="s")
    for mid in range(1, 9):
        bridge.events.put(("message", topic, b'{"timestamp": 1700000000000, "temperature": 1, "unit": "C"}',
                           mid, 1, None))
    bridge._io(read=True, timeout=0)
    assert bridge.window.added == 5 and bridge.events.qsize() == 3


def _publish_packet(topic: str, payload: bytes, mid: int) -> bytes:
    """An MQTT v5 QoS 1 PUBLISH, as Mosquitto sends it (no properties)."""
    body = len(topic).to_bytes(2, "big") + topic.encode() + mid.to_bytes(2, "big") + b"\x00" + payload
    assert len(body) < 128                      # one-byte remaining length
    return bytes([0x32, len(body)]) + body


def _loop_bridge(window: int, producer) -> tuple[PahoLoopBridge, socket.socket]:
    """A PahoLoopBridge whose paho client reads one end of a socket pair; the test writes the broker's side."""
    s = bridge_settings.BridgeSettings(commands_topic=None, metrics_port=0, window=window, site="a")
    bridge = PahoLoopBridge(s, Mapping.from_dicts(DEFAULT_RULES), StopFlag(), producer=producer)
    ours, broker = socket.socketpair()
    ours.setblocking(False)
    bridge.client.paho._sock = ours             # as after connect(); nothing here talks to a broker
    return bridge, broker


def test_the_external_loop_reads_every_message_in_order_up_to_the_window_and_acks_in_one_write():
    producer = _Producer()
    bridge, broker = _loop_bridge(window=5, producer=producer)
    topic = names.MQTT_READINGS.format(site="a", device_id="d", sensor_id="s")
    payload = b'{"timestamp": 1700000000000, "temperature": 1, "unit": "C"}'
    broker.sendall(b"".join(_publish_packet(topic, payload, mid) for mid in range(1, 9)))
    bridge._io(read=True, timeout=1)
    assert [e.mid for e in bridge.window._order] == [1, 2, 3, 4, 5]      # the window, not more
    assert len(producer.records) == 5
    bridge._io(read=True, timeout=0)
    assert bridge.window.added == 5                                      # full: the rest waits in the socket
    for entry in bridge.window._order:
        entry.delivered = True
    bridge._ack()
    broker.settimeout(1)
    acks = broker.recv(4096)
    assert acks == b"".join(bytes([0x40, 2]) + mid.to_bytes(2, "big") for mid in range(1, 6))
    bridge._io(read=True, timeout=1)
    assert bridge.window.added == 8 and [e.mid for e in bridge.window._order] == [6, 7, 8]
