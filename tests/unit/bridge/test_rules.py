"""MQTT -> Kafka mapping rules: matching, keys, topic-filled fields, and named errors.

Messages are mapped with the reference mapping (tests/unit/bridge/reference.py), which
test_bridge.py pins the bridge's fast path to."""
from __future__ import annotations

import pytest

from services.bridge.rules import DEFAULT_RULES, Mapping, MappingError, Rule
from services.common.contracts import ContractError
from tests.unit.bridge.reference import apply

READING = {"timestamp": 1700000000000, "temperature": 21.5, "unit": "C"}


@pytest.fixture
def mapping():
    return Mapping.from_dicts(DEFAULT_RULES)


def test_subscription_replaces_named_segments_with_plus(mapping):
    assert mapping.subscriptions() == ["sites/+/devices/+/sensors/+/temperature"]


def test_reading_maps_to_topic_key_and_fills_sensor_and_device_id_from_topic(mapping):
    mapped = apply(mapping, "sites/site-a/devices/d1/sensors/7/temperature", READING)
    assert mapped.kafka_topic == "temperature-data"
    assert mapped.key == "7"
    assert mapped.value == {**READING, "sensor_id": "7", "device_id": "d1"}
    assert mapped.segments == {"site": "site-a", "device_id": "d1", "sensor_id": "7"}


def test_payload_contradicting_topic_is_a_contract_error(mapping):
    with pytest.raises(ContractError, match="'sensor_id' is '8' but the topic says '7'"):
        apply(mapping, "sites/site-a/devices/d1/sensors/7/temperature", {**READING, "sensor_id": "8"})


def test_payload_naming_another_device_than_its_topic_is_a_contract_error(mapping):
    with pytest.raises(ContractError, match="'device_id' is 'd2' but the topic says 'd1'"):
        apply(mapping, "sites/site-a/devices/d1/sensors/7/temperature", {**READING, "device_id": "d2"})
    assert apply(mapping, "sites/site-a/devices/d1/sensors/7/temperature",
                 {**READING, "device_id": "d1"}).value["device_id"] == "d1"


@pytest.mark.parametrize("topic", [
    "sites/site-a/devices/d1/sensors/7/humidity", "sites/site-a/devices/d1/sensors/7",
    "sites//devices/d1/sensors/7/temperature", "sites/site-a/sensors/7/temperature", "other",
])
def test_unmapped_topic_is_named(mapping, topic):
    with pytest.raises(MappingError, match=f"no mapping rule matches MQTT topic '{topic}'"):
        apply(mapping, topic, READING)


def test_rule_with_partial_named_segment_is_rejected():
    with pytest.raises(MappingError, match="segment 'sensor-{id}' must be a whole"):
        Rule("sites/{site}/sensor-{id}", "t", "{site}", "temperature-reading")


def test_rule_key_must_use_named_segments():
    with pytest.raises(MappingError, match=r"key '\{device_id\}' uses \['device_id'\]"):
        Rule("sites/{site}/sensors/{sensor_id}/temperature", "t", "{device_id}", "temperature-reading")


def test_rule_with_unknown_contract_is_rejected():
    with pytest.raises(ContractError, match="unknown contract 'reading'"):
        Rule("a/{b}", "t", "{b}", "reading")


def test_mapping_file_is_read_from_toml(tmp_path):
    path = tmp_path / "mapping.toml"
    path.write_text('[[rule]]\nmqtt = "plant/{sensor_id}/t"\nkafka_topic = "temperature-data"\n'
                    'key = "{sensor_id}"\ncontract = "temperature-reading"\n')
    assert apply(Mapping.from_file(path), "plant/9/t", READING).key == "9"


def test_mapping_file_with_typo_names_the_key(tmp_path):
    path = tmp_path / "mapping.toml"
    path.write_text('[[rule]]\nmqtt = "a/{b}"\nkafka_topc = "x"\nkey = "{b}"\ncontract = "temperature-reading"\n')
    with pytest.raises(MappingError, match=r"rule 1 has unknown keys \['kafka_topc'\]"):
        Mapping.from_file(path)


def test_missing_mapping_file_says_which_variable(tmp_path):
    with pytest.raises(MappingError, match="set BRIDGE_MAPPING_FILE"):
        Mapping.from_file(tmp_path / "absent.toml")
