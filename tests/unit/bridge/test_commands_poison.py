"""The bridge's command path takes any `device-commands` record: published to a topic Mosquitto
accepts, or dead-lettered with a reason; it never raises (issue 12, case 2).

A topic Mosquitto refuses is as bad as an exception: the broker closes the
bridge's connection on it, and the bridge would send it again after every
reconnect, so readings would stop too. `mqtt_topic_ok` is Mosquitto's own rule
(mosquitto_validate_utf8, lib/utf8_mosq.c, plus the 65535-byte string limit).
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.bridge import commands
from services.bridge.commands import CommandForwarder, command_topic
from services.common import contracts, names
from services.common.contracts import ContractError
from services.common.dead_letter import CONTRACT_VIOLATION, INVALID_JSON, UNPROCESSABLE
from services.mqtt.codec import encode_publish
from tests.unit.bridge.test_bridge import _Consumer, _Message
from tests.unit.poison import DEEP, POISON_SETTINGS, any_document

REASONS = (INVALID_JSON, CONTRACT_VIOLATION, UNPROCESSABLE)


def mqtt_topic_ok(topic: str) -> bool:
    """What Mosquitto accepts as a PUBLISH topic (mosquitto_validate_utf8 and MQTT's string length)."""
    try:
        raw = topic.encode("utf-8")
    except UnicodeEncodeError:
        return False
    if not raw or len(raw) > 65535 or any(c in topic for c in "+#"):
        return False
    for char in topic:
        code = ord(char)
        if code <= 0x1F or 0x7F <= code <= 0x9F or 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE:
            return False
    return True


class _Client:
    """Encodes each PUBLISH as the session would, so a topic that cannot be sent raises here."""

    def __init__(self):
        self.published: list[str] = []

    def publish(self, topic, value, qos):
        encode_publish(topic, value, qos, 1)
        self.published.append(topic)
        return len(self.published)


@pytest.fixture
def forwarder(monkeypatch):
    return _forwarder(monkeypatch)


def _forwarder(monkeypatch):
    monkeypatch.setattr(commands, "Consumer", _Consumer)
    dead: list = []
    fwd = CommandForwarder("kafka:9092", names.DEVICE_COMMANDS, "g", "bridge-1", "dead-letter", "site-a",
                           lambda record, done: (dead.append(record), done()))
    return fwd, dead


@pytest.mark.parametrize(("device_id", "why"), [
    ("d-\ud800", "Unicode text"),
    ("d\x00", "control character"),
    ("d\x1b[2J", "control character"),
    ("d\u0085", "control character"),
    ("d\ufdd0", "not a character"),
    ("d\uffff", "not a character"),
    ("d" * 70_000, "longer than"),
])
def test_a_device_id_mosquitto_would_refuse_is_a_contract_error(device_id, why):
    value = json.dumps({"device_id": device_id, "command": "reboot"}).encode()
    with pytest.raises(ContractError, match=why):
        command_topic(value, None, "site-a")


@pytest.mark.parametrize(("value", "reason"), [
    (b'{"device_id": "d1", "command": 1e999}', CONTRACT_VIOLATION),
    (b'{"device_id": "d1", "command": "x", "site": ' + DEEP + b"}", INVALID_JSON),
    (b'{"device_id": "d1", "command": ' + b"1" * 5000 + b"}", INVALID_JSON),
    (b'{"device_id": "d-\\ud800", "command": "x"}', CONTRACT_VIOLATION),
    (b'{"device_id": "d\\u0000", "command": "x"}', CONTRACT_VIOLATION),
    (b"\xff\xfe\x00", INVALID_JSON),
])
def test_a_poison_command_is_dead_lettered_and_the_next_is_published(forwarder, value, reason):
    fwd, dead = forwarder
    fwd.consumer.queued = [_Message(0, value), _Message(1, {"device_id": "d1", "command": "reboot"})]
    client = _Client()
    fwd.pump(client)
    assert [r.reason for r in dead] == [reason]
    assert client.published == ["sites/site-a/devices/d1/commands"]


@POISON_SETTINGS
@given(data=st.data())
def test_any_command_record_is_published_to_a_valid_topic_or_dead_lettered(data):
    value = data.draw(any_document(contracts.DEVICE_COMMAND))
    with pytest.MonkeyPatch.context() as monkeypatch:
        fwd, dead = _forwarder(monkeypatch)
    fwd.consumer.queued = [_Message(0, value), _Message(1, {"device_id": "d1", "command": "reboot"})]
    client = _Client()
    fwd.pump(client)                                   # never raises
    assert len(client.published) + len(dead) == 2
    assert all(mqtt_topic_ok(t) for t in client.published), client.published
    for record in dead:
        reason = dict(record.headers)[names.HEADER_DLQ_REASON].decode()
        assert record.reason in REASONS and reason.startswith(record.reason) and len(reason) <= 1100
