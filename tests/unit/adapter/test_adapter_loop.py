"""The adapter's loop without Kafka or Cassandra: dead-letter records, and draining on revoke and on stop.

Fakes stand in for the consumer, producer and writer (unit level only; the
integration tests run the real programs).
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from services.adapter import app
from services.adapter.app import Adapter
from services.adapter.mappings import DEFAULT_MAPPINGS
from services.common import names
from tests.unit.fake_kafka import FakeMessage

TOPIC = names.TEMPERATURE_DATA


def _Msg(value, offset, partition=0, key=b"s-1", headers=None, topic=TOPIC) -> FakeMessage:
    return FakeMessage(topic=topic, partition=partition, offset=offset, key=key, value=value, headers=headers)


class _Producer:
    def __init__(self):
        self.produced: list[dict] = []

    def produce(self, topic, key, value, headers, on_delivery):
        self.produced.append({"topic": topic, "key": key, "value": value, "headers": headers,
                              "on_delivery": on_delivery})

    def poll(self, _timeout):
        return 0

    def flush(self, _timeout):
        return 0


class _Writer:
    """Finishes what it is told to, one collect at a time."""

    def __init__(self):
        self.in_flight = 0
        self.finishing: list = []
        self.retries_total = 0
        self.retry_calls = 0

    def collect(self, _wait_s):
        written, self.finishing = self.finishing, []
        self.in_flight -= len(written)
        return written, [], []

    def send_due_retries(self):
        self.retry_calls += 1


class _Consumer:
    def __init__(self):
        self.commits: list = []
        self.closed = False

    def commit(self, offsets, asynchronous):
        self.commits.append(([(tp.topic, tp.partition, tp.offset) for tp in offsets], asynchronous))

    def assignment(self):
        return []

    def pause(self, _partitions):
        pass

    def close(self):
        self.closed = True


@pytest.fixture
def adapter():
    settings = SimpleNamespace(dead_letter_topic=names.DEAD_LETTER, default_site="site-x", window=100)
    adapter = Adapter(settings, DEFAULT_MAPPINGS, SimpleNamespace(is_set=lambda: False))
    adapter.producer, adapter.writer, adapter.consumer = _Producer(), _Writer(), _Consumer()
    adapter.session = SimpleNamespace(cluster=SimpleNamespace(shutdown=lambda: None))
    return adapter


def test_dead_letter_has_the_original_key_bytes_and_headers_plus_exactly_the_contract_headers(adapter):
    msg = _Msg(b"{not json", 41, partition=2, headers=[("site", b"site-a"), (names.HEADER_DLQ_REASON, b"old")])
    adapter._accept([msg])
    (produced,) = adapter.producer.produced
    assert (produced["topic"], produced["key"], produced["value"]) == (names.DEAD_LETTER, b"s-1", b"{not json")
    headers = produced["headers"]
    assert [k for k, _ in headers] == [names.HEADER_SITE, names.HEADER_DLQ_SOURCE, names.HEADER_DLQ_REASON,
                                       names.HEADER_DLQ_TIME_MS, names.HEADER_DLQ_OFFSET]
    values = dict(headers)
    assert values[names.HEADER_DLQ_SOURCE] == TOPIC.encode() and values[names.HEADER_DLQ_OFFSET] == b"2:41"
    assert values[names.HEADER_DLQ_REASON].startswith(b"invalid_json: invalid JSON for temperature-reading")
    assert int(values[names.HEADER_DLQ_TIME_MS]) > 0
    assert adapter.tracker.take_commits() == {} and adapter.dlq_pending == 1
    produced["on_delivery"](None, None)               # Kafka has the dead-letter record: the offset may go
    assert adapter.tracker.take_commits() == {(TOPIC, 2): 42} and adapter.dlq_pending == 0


@pytest.mark.parametrize(("value", "reason"), [
    (b'{"sensor_id": "s", "timestamp": 1, "temperature": 1.0, "unit": "X"}', b"contract_violation: "),
    (b"[1]", b"contract_violation: "),
])
def test_a_record_breaking_its_contract_is_dead_lettered_as_a_contract_violation(adapter, value, reason):
    adapter._accept([_Msg(value, 0)])
    assert dict(adapter.producer.produced[0]["headers"])[names.HEADER_DLQ_REASON].startswith(reason)


def test_a_topic_without_mapping_is_dead_lettered_as_unmapped(adapter):
    adapter._accept([_Msg(b"{}", 0, topic="elsewhere", key=None)])
    (produced,) = adapter.producer.produced
    assert produced["key"] == b"elsewhere"               # no key: the source names it
    assert dict(produced["headers"])[names.HEADER_DLQ_REASON].startswith(b"unmapped: no table mapping")


def test_failed_dead_letter_is_produced_again_by_the_next_round_of_outcomes(adapter):
    adapter._accept([_Msg(b"{not json", 0)])
    first = adapter.producer.produced[0]
    first["on_delivery"]("broker down", None)
    adapter._serve_outcomes(wait_s=0.0)
    second = adapter.producer.produced[1]
    assert (second["key"], second["value"], second["headers"]) == (first["key"], first["value"], first["headers"])
    assert adapter.writer.retry_calls == 1


def test_revoke_waits_for_the_lost_partitions_then_commits_and_forgets_them(adapter, monkeypatch):
    tp = (TOPIC, 0)
    for offset in (5, 6):
        adapter.tracker.consumed(tp, offset)
    adapter.writer.in_flight = 2
    adapter.writer.finishing = [SimpleNamespace(tp=tp, offset=o, mapping=DEFAULT_MAPPINGS[0]) for o in (5, 6)]
    adapter._on_revoke(adapter.consumer, [SimpleNamespace(topic=TOPIC, partition=0)])
    assert adapter.consumer.commits == [([(TOPIC, 0, 7)], False)]
    assert adapter.tracker.outstanding() == 0 and adapter.written == 2


def test_revoke_gives_up_after_its_grace_period(adapter, monkeypatch):
    monkeypatch.setattr(app, "REVOKE_GRACE_S", 0.2)
    adapter.tracker.consumed((TOPIC, 0), 5)          # never finishes
    started = time.monotonic()
    adapter._on_revoke(adapter.consumer, [SimpleNamespace(topic=TOPIC, partition=0)])
    assert 0.2 <= time.monotonic() - started < 2 and adapter.consumer.commits == []
    assert adapter.tracker.outstanding() == 0        # forgotten: the next owner replays it


def test_shutdown_drains_in_flight_writes_commits_and_closes(adapter):
    tp = (TOPIC, 1)
    adapter.tracker.consumed(tp, 0)
    adapter.writer.in_flight = 1
    adapter.writer.finishing = [SimpleNamespace(tp=tp, offset=0, mapping=DEFAULT_MAPPINGS[0])]
    producer = adapter.producer
    adapter._shutdown()
    assert adapter.consumer.commits == [([(TOPIC, 1, 1)], False)] and adapter.consumer.closed
    assert adapter.producer is None and producer.produced == []


# ------------------------------------------------------------------ consumer errors

def _ErrorMsg(error) -> FakeMessage:
    return FakeMessage(topic=TOPIC, error=error)


def test_a_passing_consumer_error_is_logged_and_skipped(adapter, caplog):
    from confluent_kafka import KafkaError
    adapter._accept([_ErrorMsg(KafkaError(KafkaError._TRANSPORT, "broker down")), _Msg(None, 3)])
    assert "consumer error" in caplog.text
    assert adapter.tracker.take_commits() == {(TOPIC, 0): 4}       # the tombstone after it was handled


def test_a_fatal_consumer_error_stops_the_adapter_with_status_1(adapter, monkeypatch, caplog):
    # e.g. a static member fenced by another one with its group.instance.id: librdkafka's consumer is dead for
    # good and says so as a record with code _FATAL (KafkaError.fatal() is false on it).
    from confluent_kafka import KafkaError
    fenced = KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced by other consumer with "
                                           "same group.instance.id")
    adapter.settings.group_instance_id, adapter.settings.commit_interval = "site-a-cassandra-adapter-1", 1.0
    monkeypatch.setattr(adapter, "start", lambda: True)
    monkeypatch.setattr(adapter, "_tick", lambda: adapter._accept([_Msg(None, 3), _ErrorMsg(fenced)]))
    assert adapter.run() == 1
    (record,) = [r for r in caplog.records if "the Kafka consumer failed for good" in r.getMessage()]
    assert "fenced" in record.kv["error"] and record.kv["instance"] == "site-a-cassandra-adapter-1"
    assert adapter.consumer.closed and adapter.consumer.commits == [([(TOPIC, 0, 4)], False)]


# ------------------------------------------------------------------ Cassandra at a new address (issue 12, lab)

class _Host:
    def __init__(self, address):
        self.address = address


class _Cluster:
    def __init__(self, addresses):
        self.metadata = type("M", (), {"all_hosts": lambda _self: [_Host(a) for a in addresses]})()


@pytest.mark.parametrize(("failing_for", "resolved", "moved"), [
    (60.0, {"10.0.1.9"}, True),          # writes failing, the name now points elsewhere: restart
    (60.0, {"10.0.1.4"}, False),         # same address: just an outage, keep waiting
    (10.0, {"10.0.1.9"}, False),         # not failing long enough yet
    (60.0, set(), False),                # unresolvable (task not healthy yet): keep waiting
])
def test_adapter_notices_cassandra_answering_at_an_address_the_driver_never_tries(monkeypatch, failing_for,
                                                                                   resolved, moved):
    from services.adapter import app
    adapter = app.Adapter.__new__(app.Adapter)
    adapter.settings = type("S", (), {"cassandra_hosts": ("cassandra-1",)})()
    adapter.session = type("Sess", (), {"cluster": _Cluster(["10.0.1.4"])})()
    adapter.writer = type("W", (), {"failing_since": 1000.0})()
    monkeypatch.setattr(app.time, "monotonic", lambda: 1000.0 + failing_for)
    monkeypatch.setattr(app, "resolve_all", lambda hosts: resolved)
    assert bool(adapter._cassandra_moved()) is moved
