"""mosquitto-agent's loop logic without a broker or Kafka: when the snapshot goes, what follows it, how answers
are taken. The MQTT side is the real client on one end of a socketpair (what it sends is decoded on the
other end); the consumer is a list of records."""
from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from services.common import names
from services.common.device_credentials import Credential
from services.mosquitto_agent import app
from services.mosquitto_agent.metrics import Figures
from services.mosquitto_agent.settings import AgentSettings
from services.mqtt import codec
from services.mqtt.session import MqttSession
from tests.unit.fake_kafka import FakeMessage

HASH = "$7$1000$AAAAAAAAAAAAAAAA$" + "A" * 86 + "=="


def Msg(key, value, partition=0, error=None) -> FakeMessage:
    return FakeMessage(partition=partition, key=key, value=value, error=error)


class Eof:
    def code(self):
        return app.KafkaError._PARTITION_EOF

    def str(self):
        return "end of partition"


class Records:
    """A consumer that hands out what the test queued, then nothing."""

    def __init__(self):
        self.queued: list[Msg] = []

    def add(self, device: str, credential: Credential | None) -> None:
        self.queued.append(Msg(device.encode(), credential.to_json() if credential else None))

    def add_raw(self, device: str, value: bytes) -> None:
        self.queued.append(Msg(device.encode(), value))

    def end(self) -> None:
        self.queued.append(Msg(None, None, 0, Eof()))

    def consume(self, n, timeout=0):
        batch, self.queued = self.queued[:n], self.queued[n:]
        return batch

    def close(self):
        pass


class Stop:
    def is_set(self):
        return False


def _pw(enabled: bool = True) -> Credential:
    return Credential(enabled, "password", HASH, "cli", 1)


@pytest.fixture
def agent():
    records = Records()
    a = app.Agent(AgentSettings(snapshot_chunk=2), Stop(), consumer=records, figures=Figures(registry=None))
    a.partitions = [0]
    a.records = records
    a.sockets = []
    yield a
    for sock in a.sockets:
        sock.close()


def _connect(agent) -> None:
    """As if Mosquitto had answered CONNECT: a fresh client of the agent's on a socketpair, connected."""
    ours, broker = socket.socketpair()
    agent.sockets += [ours, broker]
    agent.broker = broker
    client = MqttSession("mosquitto", 1883, "mosquitto-agent-1")
    client.on_connect, client.on_disconnect = agent._on_connect, agent._on_disconnect
    client.on_message, client.on_puback = agent._on_message, agent._on_puback
    client.sock, client.connected = ours, True
    agent.client = client
    agent._on_connect(False, 0, {})


def _sent(agent) -> list[tuple[str, bytes]]:
    """(topic, payload) of each PUBLISH the agent wrote since the last call (SUBSCRIBEs etc. skipped)."""
    agent.client.write()
    data = b""
    agent.broker.setblocking(False)
    try:
        while True:
            chunk = agent.broker.recv(1 << 20)
            if not chunk:
                break
            data += chunk
    except BlockingIOError:
        pass
    out, pos = [], 0
    while pos < len(data):
        first = data[pos]
        length, body = codec.decode_varint(data, pos + 1, len(data))
        end = body + length
        if first >> 4 == codec.PUBLISH:
            topic, payload, _mid, _qos, _user, _props = codec.decode_publish(first, data, body, end)
            out.append((topic, payload))
        pos = end
    return out


def _answer(agent, command: str, ok: bool = True, error: str = "", devices: int = 0) -> None:
    agent.on_answer(json.dumps({"ok": ok, "command": command, "error": error, "devices": devices,
                                "gate_open": True, "uptime_s": 1, "kicked": 0, "counters": {},
                                "offences": {}}).encode())


def _logged(caplog) -> str:
    """Every captured line with its key=value fields."""
    return "\n".join(f"{r.levelname} {r.getMessage()} " + " ".join(f"{k}={v}" for k, v in getattr(r, "kv", {}).items())
                     for r in caplog.records)


def _turn(agent) -> None:
    agent._read()
    agent._due()


def test_no_snapshot_goes_before_the_topic_was_read_to_its_end(agent):
    agent.records.add("d1", _pw())
    _connect(agent)
    _turn(agent)
    assert [t for t, _ in _sent(agent)] == [names.MQTT_GATE_CONTROL]          # stats only
    agent.records.end()
    _turn(agent)
    sent = _sent(agent)
    assert sent == [(names.MQTT_GATE_CONTROL, f"snapshot {sent[0][1].split()[1].decode()} 1 1\nd1 1 password "
                                              f"{HASH}".encode())]


def test_the_snapshot_holds_the_table_the_records_add_up_to_in_chunks(agent):
    for device in ("d3", "d1", "d2", "gone"):
        agent.records.add(device, _pw())
    agent.records.add("gone", None)
    agent.records.add("d2", _pw(enabled=False))
    agent.records.add_raw("bad", b"{not json")
    agent.records.end()
    _connect(agent)
    _turn(agent)
    parts = [p for _, p in _sent(agent) if p.startswith(b"snapshot")]
    assert len(parts) == 2
    lines = [line for p in parts for line in p.decode().split("\n")[1:]]
    assert lines == [f"d1 1 password {HASH}", f"d2 0 password {HASH}", f"d3 1 password {HASH}"]
    assert all(p.split(b"\n")[0].endswith(b" 2") for p in parts)


def test_records_after_the_snapshot_go_as_upserts_and_removes(agent):
    agent.records.add("d1", _pw())
    agent.records.end()
    _connect(agent)
    _turn(agent)
    _sent(agent)
    agent.records.add("d2", _pw())
    agent.records.add("d1", None)
    agent.records.add("d2", _pw())        # the same line again: nothing more to send for it
    agent.records.add("never-seen", None)
    _turn(agent)
    assert [p for _, p in _sent(agent)] == [b"remove\nd1", f"upsert\nd2 1 password {HASH}".encode()]
    _turn(agent)
    assert _sent(agent) == []


def test_an_unreadable_record_shuts_its_device_out(agent, caplog):
    agent.records.add("d1", _pw())
    agent.records.end()
    _connect(agent)
    _turn(agent)
    _sent(agent)
    agent.records.add_raw("d1", b'{"enabled": true, "auth": "password", "hash": "plain"}')
    with caplog.at_level(logging.ERROR):
        _turn(agent)
    assert [p for _, p in _sent(agent)] == [b"remove\nd1"]
    assert "ERROR unreadable device record: the device is shut out until a valid record comes device=d1" \
        in _logged(caplog)


def test_health_needs_the_acknowledged_snapshot_and_kafka(agent):
    agent.records.add("d1", _pw())
    agent.records.end()
    _connect(agent)
    _turn(agent)
    assert agent.health()[0] is False
    _answer(agent, "snapshot", devices=1)         # answers come in the order of the requests
    _answer(agent, "stats")
    assert agent.snapshot_acked and agent.figures.devices_synced == 1
    agent.kafka_ok_at = time.monotonic()
    ok, detail = agent.health()
    assert ok, detail
    assert agent.sync_age() == 0.0 and agent.mosquitto_up()
    agent.kafka_ok_at = time.monotonic() - app.KAFKA_HEALTHY_WITHIN_S - 1
    assert agent.health()[0] is False


def test_a_refusal_is_logged_with_the_plugins_text_and_a_snapshot_follows(agent, caplog):
    agent.records.add("d1", _pw())
    agent.records.end()
    _connect(agent)
    _turn(agent)
    _answer(agent, "snapshot", devices=1)         # answers come in the order of the requests
    _answer(agent, "stats")
    _sent(agent)
    agent.records.add("d2", _pw())
    _turn(agent)
    assert agent.sync_age() >= 0 and agent.out_of_sync_since is not None
    with caplog.at_level(logging.ERROR):
        _answer(agent, "upsert", ok=False, error="could not save the device table (see Mosquitto's log)")
    assert "ERROR the iot_gate plugin refused a request command=upsert error=could not save the device table " \
        "(see Mosquitto's log)" in _logged(caplog)
    assert agent.resync_at is not None and agent.out_of_sync_since is not None
    agent.resync_at = time.monotonic()
    _turn(agent)
    parts = [p for _, p in _sent(agent) if p.startswith(b"snapshot")]
    assert len(parts) == 1 and parts[0].count(b"\n") == 2
    _answer(agent, "snapshot", devices=2)
    assert agent.out_of_sync_since is None and agent.figures.devices_synced == 2


def test_a_reconnect_sends_the_whole_table_again_not_the_changes(agent):
    agent.records.add("d1", _pw())
    agent.records.end()
    _connect(agent)
    _turn(agent)
    _sent(agent)
    agent.records.add("d2", _pw())
    agent._read()                         # read, not sent yet...
    agent.client.close("test")            # ...when the connection drops
    assert not agent.connected and agent.changes == {} and agent.pending == type(agent.pending)()
    _connect(agent)
    _turn(agent)
    snapshot = [p for _, p in _sent(agent) if p.startswith(b"snapshot")]
    assert len(snapshot) == 1 and b"\nd1 " in snapshot[0] and b"\nd2 " in snapshot[0]


def test_an_answer_to_a_request_of_another_connection_is_ignored(agent, caplog):
    agent.records.end()
    _connect(agent)
    with caplog.at_level(logging.WARNING):
        _answer(agent, "upsert")
    assert "answer to no request of this connection" in _logged(caplog)


def test_a_stopping_agent_waits_for_the_answers_it_is_owed(agent, monkeypatch):
    agent.records.end()
    _connect(agent)
    _turn(agent)                          # the snapshot and a stats request are in flight
    assert [r.command for r in agent.pending] == ["snapshot", "stats"]
    answers = b"".join(codec.encode_publish(names.MQTT_GATE_RESPONSE, json.dumps(
        {"ok": True, "command": command}).encode(), 0) for command in ("snapshot", "stats"))
    agent.broker.sendall(answers)
    started = time.monotonic()
    agent._drain()
    assert not agent.pending and time.monotonic() - started < app.DRAIN_S
    monkeypatch.setattr(app, "DRAIN_S", 0.2)
    agent.pending.append(app.Request("stats", 0))       # never answered: the wait is bounded
    started = time.monotonic()
    agent._drain()
    assert 0.2 <= time.monotonic() - started < 1.0
