"""Sensor ownership without Kafka (issue 26): the router's check on an injected sensor -> device map, and
services.bridge.owners keeping that map from the `sensor-registration` records a fake consumer hands out."""
from __future__ import annotations

import json
import logging

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError

from services.bridge import owners as owners_module
from services.bridge.owners import SensorOwners
from services.bridge.routing import Router
from services.bridge.rules import DEFAULT_RULES, Mapping
from services.common import names
from tests.unit.fake_kafka import FakeMessage

GOOD = json.dumps({"timestamp": 1700000000000, "temperature": 21.5, "unit": "C"}).encode()


def _topic(device: str, sensor: str) -> str:
    return names.MQTT_READINGS.format(site="site-a", device_id=device, sensor_id=sensor)


def _reason(record) -> str:
    return dict(record.headers)[names.HEADER_DLQ_REASON].decode()


@pytest.fixture
def owners() -> dict[str, str]:
    return {"s-1": "d1"}


@pytest.fixture
def router(owners):
    return Router(Mapping.from_dicts(DEFAULT_RULES), "dead-letter", 65536, "site-a", owners=owners)


def test_a_reading_of_a_sensor_registered_to_its_device_goes_to_temperature_data(router):
    record = router.route(_topic("d1", "s-1"), GOOD, None, 1)
    assert (record.topic, record.reason, record.key) == ("temperature-data", None, b"s-1")


def test_a_reading_of_an_unregistered_sensor_is_dead_lettered_naming_the_fix(router):
    record = router.route(_topic("d1", "s-9"), GOOD, None, 1)
    assert (record.topic, record.reason, record.key, record.value) == ("dead-letter", "unregistered_sensor", b"s-9",
                                                                        GOOD)
    assert _reason(record) == ("unregistered_sensor: sensor s-9 is not registered; register it with iot-registrar "
                               "(sensor-registration) before its device publishes")


def test_a_reading_of_another_devices_sensor_is_dead_lettered_naming_both_devices(router):
    record = router.route(_topic("d2", "s-1"), GOOD, None, 1)
    assert (record.topic, record.reason) == ("dead-letter", "foreign_sensor")
    assert _reason(record) == "foreign_sensor: sensor s-1 belongs to device d1, not d2"


def test_the_map_is_read_live_so_a_registration_counts_for_the_next_reading_of_a_cached_topic(router, owners):
    topic = _topic("d2", "s-2")
    assert router.route(topic, GOOD, None, 1).reason == "unregistered_sensor"
    owners["s-2"] = "d2"
    assert router.route(topic, GOOD, None, 1).reason is None
    owners["s-2"] = "d3"                        # moved to another device
    assert router.route(topic, GOOD, None, 1).reason == "foreign_sensor"
    del owners["s-2"]                           # removed (a tombstone)
    assert router.route(topic, GOOD, None, 1).reason == "unregistered_sensor"


def test_without_a_map_nothing_is_checked():
    router = Router(Mapping.from_dicts(DEFAULT_RULES), "dead-letter", 65536, "site-a")
    assert router.route(_topic("d2", "s-9"), GOOD, None, 1).reason is None


@pytest.mark.parametrize("rule", [
    {"mqtt": "plant/{sensor_id}/t", "kafka_topic": "temperature-data", "key": "{sensor_id}",
     "contract": "temperature-reading"},                                       # no {device_id} segment
    {"mqtt": "plant/{device_id}/{sensor_id}/t", "kafka_topic": "temperature-data", "key": "{device_id}-{sensor_id}",
     "contract": "temperature-reading"},                                       # not keyed by the sensor alone
])
def test_only_rules_with_a_device_segment_and_a_sensor_key_are_checked(rule):
    router = Router(Mapping.from_dicts([rule]), "dead-letter", 65536, "site-a", owners={})
    topic = rule["mqtt"].format(device_id="d1", sensor_id="s-1")
    assert router.route(topic, GOOD, None, 1).reason is None


def test_a_bad_payload_is_named_for_what_it_is_before_ownership(router):
    assert router.route(_topic("d1", "s-9"), b"{nope", None, 1).reason == "invalid_json"


# ------------------------------------------------------------------ the table from the topic

def _Msg(partition: int, offset: int, key: bytes | None, value: bytes | None, error=None) -> FakeMessage:
    return FakeMessage(partition=partition, offset=offset, key=key, value=value, error=error)


class _TP:
    def __init__(self, partition: int, offset: int):
        self.partition, self.offset = partition, offset


class _Metadata:
    def __init__(self, partitions):
        self.error, self.partitions = None, {p: None for p in partitions}


class _Consumer:
    """A topic of partitions held in lists; `consume` hands out what lies past each partition's position."""

    def __init__(self, config):
        self.config = config
        self.log: dict[int, list[_Msg]] = {0: [], 1: []}
        self.position_of: dict[int, int] = {}
        self.assigned: list = []
        self.closed = False

    def list_topics(self, topic, timeout):
        return type("M", (), {"topics": {topic: _Metadata(self.log)}})()

    def get_watermark_offsets(self, tp, timeout):
        return 0, len(self.log[tp.partition])

    def assign(self, tps):
        self.assigned = [(tp.topic, tp.partition, tp.offset) for tp in tps]
        self.position_of = {tp.partition: 0 for tp in tps}

    def consume(self, num_messages, timeout):
        out = []
        for p, records in self.log.items():
            start = self.position_of.get(p, 0)
            out += records[start:start + num_messages]
            self.position_of[p] = start + len(records[start:start + num_messages])
        return out[:num_messages]

    def position(self, tps):
        return [_TP(tp.partition, self.position_of.get(tp.partition, -1001)) for tp in tps]

    def close(self):
        self.closed = True

    def add(self, partition: int, key: str | None, value: dict | bytes | None) -> None:
        raw = json.dumps(value).encode() if isinstance(value, dict) else value
        self.log[partition].append(_Msg(partition, len(self.log[partition]), key and key.encode(), raw))


def _registration(sensor: str, device: str) -> dict:
    return {"sensor_id": sensor, "name": sensor, "device_id": device, "sensor_type_id": "t"}


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(owners_module, "Consumer", _Consumer)
    monkeypatch.setattr(owners_module, "POLL_EVERY_S", 0.0)
    return SensorOwners("kafka:9092", names.SENSOR_REGISTRATION, "bridge-1")


def test_the_consumer_joins_no_group_commits_nothing_and_reads_every_partition_from_the_beginning(table):
    config = table.consumer.config
    assert config["enable.auto.commit"] is False and config["enable.auto.offset.store"] is False
    table.load(lambda: False)
    assert table.consumer.assigned == [(names.SENSOR_REGISTRATION, 0, OFFSET_BEGINNING),
                                       (names.SENSOR_REGISTRATION, 1, OFFSET_BEGINNING)]


def test_load_reads_to_the_end_then_poll_follows_registrations_tombstones_and_moves(table, caplog):
    c = table.consumer
    c.add(0, "s-1", _registration("s-1", "d1"))
    c.add(1, "s-2", _registration("s-2", "d2"))
    c.add(0, "s-3", _registration("s-3", "d1"))
    c.add(0, "s-3", None)                                             # removed again
    caplog.set_level(logging.INFO)
    assert table.load(lambda: False) is True
    assert table.owners == {"s-1": "d1", "s-2": "d2"}
    [loaded] = [r for r in caplog.records if "sensor owners read to the end" in r.getMessage()]
    assert loaded.kv["sensors"] == 2                                  # the log says how many it knows
    c.add(1, "s-4", _registration("s-4", "d4"))
    c.add(0, "s-1", _registration("s-1", "d9"))                      # moved to another device
    table.poll()
    assert table.owners == {"s-1": "d9", "s-2": "d2", "s-4": "d4"}


def test_load_with_an_empty_topic_finishes_at_once(table):
    assert table.load(lambda: False) is True and table.owners == {}


def test_load_stops_when_the_bridge_stops(table):
    table.consumer.add(0, "s-1", _registration("s-1", "d1"))
    table.consumer.consume = lambda num_messages, timeout: []        # Kafka hands out nothing
    assert table.load(lambda: True) is False


@pytest.mark.parametrize("value", [b"{nope", json.dumps({"sensor_id": "s-1", "name": "n"}).encode(),
                                   json.dumps(_registration("s-other", "d1")).encode()])
def test_a_registration_that_is_not_valid_for_its_key_unregisters_the_sensor_as_compaction_would(table, value, caplog):
    table.apply(b"s-1", json.dumps(_registration("s-1", "d1")).encode())
    table.apply(b"s-1", value)
    assert "s-1" not in table.owners and "invalid sensor registration" in caplog.text


def test_a_record_without_a_key_changes_nothing(table):
    table.apply(None, json.dumps(_registration("s-1", "d1")).encode())
    assert table.owners == {}


def test_a_fatal_consumer_error_is_kept_for_the_bridge_to_stop_on(table):
    table.consumer.log[0].append(_Msg(0, 0, None, None, error=KafkaError(KafkaError._FATAL, "fenced", fatal=True)))
    table.poll()
    assert "fenced" in table.fatal


def test_a_bridge_with_ownership_on_routes_through_the_live_table(monkeypatch):
    from services.bridge import app
    from services.bridge import settings as bridge_settings
    from services.common.observability import StopFlag
    monkeypatch.setattr(owners_module, "Consumer", _Consumer)
    s = bridge_settings.BridgeSettings(commands_topic=None, metrics_port=0, site="site-a",
                                       sensor_owners_topic=names.SENSOR_REGISTRATION)
    bridge = app.Bridge(s, Mapping.from_dicts(DEFAULT_RULES), StopFlag(), producer=object())
    assert bridge.router.owners is bridge.owners.owners
    ok, detail = bridge.health()
    assert not ok and "reading_sensor_owners=sensor-registration" in detail
    bridge.owners.apply(b"s-1", json.dumps(_registration("s-1", "d1")).encode())
    assert bridge.router.route(_topic("d1", "s-1"), GOOD, None, 1).reason is None


def test_no_rights_on_the_unused_group_is_no_error_worth_a_log_line(table, caplog):
    """librdkafka asks for the coordinator of the group it must be given; the bridge has no rights on it."""
    table.consumer.log[0].append(_Msg(0, 0, None, None, error=KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)))
    table.consumer.log[1].append(_Msg(1, 0, None, None, error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    table.poll()
    assert table.fatal is None
    assert [r.kv["error"] for r in caplog.records] == [KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED).str()]
