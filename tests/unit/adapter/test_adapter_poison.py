"""One bad record never stops the adapter (issue 12, case 2): whatever its bytes, it is written or dead-lettered.

The adapter's per-record path runs for real here: mapping, contract, site, row
building and the writer's binding (a real Writer over a session that prepares
real driver statements but has no server). Only Kafka is faked.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.adapter.app import Adapter
from services.adapter.mappings import DEFAULT_MAPPINGS
from services.adapter.writer import Writer
from services.common import names
from services.common.dead_letter import CONTRACT_VIOLATION, INVALID_JSON, UNPROCESSABLE
from tests.unit.adapter.test_adapter_loop import _Msg, _Producer
from tests.unit.adapter.test_writer import _Session
from tests.unit.poison import DEEP, POISON_SETTINGS, any_document

REASONS = (INVALID_JSON, CONTRACT_VIOLATION, UNPROCESSABLE, "unwritable")
GOOD = b'{"sensor_id": "s-1", "timestamp": 1700000000000, "temperature": 21.5, "unit": "C"}'
EVENT = 1_700_000_000_000


@pytest.fixture
def adapter():
    return _adapter()


def _adapter() -> Adapter:
    settings = SimpleNamespace(dead_letter_topic=names.DEAD_LETTER, default_site="site-x", window=100)
    adapter = Adapter(settings, DEFAULT_MAPPINGS, SimpleNamespace(is_set=lambda: False))
    adapter.session = _Session()
    adapter.writer = Writer(adapter.session, "iot", DEFAULT_MAPPINGS)
    adapter.producer = _Producer()
    return adapter


def _reason(produced: dict) -> str:
    return dict(produced["headers"])[names.HEADER_DLQ_REASON].decode()


def _outcomes(adapter: Adapter) -> tuple[int, list[str]]:
    """(rows handed to Cassandra, dead-letter reasons)."""
    return adapter.writer.in_flight, [_reason(p) for p in adapter.producer.produced]


@pytest.mark.parametrize(("value", "reason"), [
    (b'{"sensor_id": "s-1", "timestamp": 1e999, "temperature": 21.5, "unit": "C"}', CONTRACT_VIOLATION),
    (b'{"sensor_id": "s-1", "timestamp": NaN, "temperature": 21.5, "unit": "C"}', CONTRACT_VIOLATION),
    (b'{"sensor_id": "s-1", "timestamp": 1700000000000, "temperature": 1' + b"0" * 400 + b', "unit": "C"}',
     CONTRACT_VIOLATION),
    (b'{"sensor_id": "s-1", "timestamp": 1' + b"0" * 5000 + b', "temperature": 21.5, "unit": "C"}', INVALID_JSON),
    (DEEP, INVALID_JSON),
    (b'{"sensor_id": ' + DEEP + b', "timestamp": 1, "temperature": 1, "unit": "C"}', INVALID_JSON),
    (b'{"sensor_id": "s-\\ud800", "timestamp": 1700000000000, "temperature": 21.5, "unit": "C"}',
     CONTRACT_VIOLATION),
    # Parses, but Cassandra cannot hold it: a bigint beyond 64 bits, a day beyond the `date` type.
    (b'{"sensor_id": "s-1", "timestamp": 9223372036854775808, "temperature": 21.5, "unit": "C"}',
     CONTRACT_VIOLATION),
    (b'{"sensor_id": "s-1", "timestamp": 9000000000000000000, "temperature": 21.5, "unit": "C"}',
     CONTRACT_VIOLATION),
])
def test_a_poison_reading_is_dead_lettered_and_the_next_reading_is_still_written(adapter, value, reason):
    adapter._accept([_Msg(value, 0), _Msg(GOOD, 1)])
    in_flight, reasons = _outcomes(adapter)
    assert in_flight == 1 and len(reasons) == 1 and reasons[0].startswith(f"{reason}: "), reasons


def test_a_broken_ingest_header_costs_the_latency_not_the_reading(adapter):
    for i, ingest in enumerate([b"9" * 30, b"-" + b"9" * 30, b"1" * 5000, b"\xff", b"nan"]):
        adapter._accept([_Msg(GOOD, i, headers=[(names.HEADER_INGEST_MS, ingest)])])
    in_flight, reasons = _outcomes(adapter)
    assert (in_flight, reasons) == (5, [])


def test_an_unexpected_error_while_building_one_row_dead_letters_that_record_as_unprocessable(adapter):
    route = adapter._route(names.TEMPERATURE_DATA)

    def broken(record, site, ingest_ms):
        raise KeyError("a bug in a row builder")
    route.build = broken
    adapter._accept([_Msg(GOOD, 0)])
    (reason,) = _outcomes(adapter)[1]
    assert reason.startswith(f"{UNPROCESSABLE}: KeyError")


def test_a_dead_letter_reason_is_short_and_utf8_whatever_the_record(adapter):
    adapter._accept([_Msg(b'{"sensor_id": "s-1", "timestamp": [' + b'"x",' * 50_000 + b'"x"], '
                          b'"temperature": 1, "unit": "C"}', 0)])
    (reason,) = _outcomes(adapter)[1]
    assert reason.startswith(CONTRACT_VIOLATION) and len(reason) <= 1100


_MAPPED = [(m.topics[0], m.contract) for m in DEFAULT_MAPPINGS]
_HEADERS = st.lists(st.tuples(st.sampled_from([names.HEADER_SITE, names.HEADER_INGEST_MS, "x"]),
                              st.none() | st.binary(max_size=24) | st.sampled_from([b"9" * 25, b"site-\xff"])),
                    max_size=3)


@POISON_SETTINGS
@given(data=st.data())
def test_any_record_on_any_mapped_topic_is_either_written_or_dead_lettered_with_a_reason(data):
    topic, contract = data.draw(st.sampled_from(_MAPPED))
    value = data.draw(any_document(contract))
    headers = data.draw(_HEADERS)
    adapter = _adapter()
    adapter._accept([_Msg(value, 0, topic=topic, headers=headers), _Msg(GOOD, 1)])   # and it goes on
    in_flight, reasons = _outcomes(adapter)
    assert in_flight + len(reasons) == 2, (in_flight, reasons)
    assert all(r.split(":", 1)[0] in REASONS and len(r) <= 1100 for r in reasons), reasons
    # Whatever was handed to Cassandra was bound (serialized) without error.
    assert all(getattr(s, "values", None) or getattr(s, "_statements_and_parameters", None)
               for s in adapter.session.sent)
