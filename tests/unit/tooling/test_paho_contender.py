"""The paho-mqtt contender of `scripts/bench bridge` (tooling.bench.paho_bridge) hands every event paho
queued to the bridge, in order, however many arrive at once: a lost one would read as a lost
message in the benchmark and be blamed on paho."""
from __future__ import annotations

from services.bridge import settings as bridge_settings
from services.bridge.app import READ_BATCH
from services.bridge.rules import DEFAULT_RULES, Mapping
from services.common import names
from services.common.observability import StopFlag
from tooling.bench.paho_bridge import PahoBridge


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
