"""The adapter's per-row fast paths give exactly what the generic paths (and the driver) give.

Each fast path (row builder, generated row serializer, batch assembly, JSON
decoding) exists only to save CPU per record; these tests pin them to the
plain code they replace, so a new layout, contract field or driver version that
breaks the equivalence fails here rather than in a table.
"""
from __future__ import annotations

import json

import pytest
from cassandra.query import BatchStatement, BatchType, BoundStatement, PreparedStatement

from services.adapter.mappings import DEFAULT_MAPPINGS, parse_mappings
from services.adapter.schema import LAYOUTS, insert_cql, layout, row_builder, utc_day
from services.adapter.writer import _SERIALIZE, Item, Writer, row_serializer
from services.common import contracts
from services.common.contracts import decode_json as _json
from tests.unit.adapter.reference import build_row

EVENT = 1_778_300_000_123

RECORDS = {
    contracts.READING.name: [
        {"sensor_id": "s-1", "timestamp": EVENT, "temperature": 21.5, "unit": "C"},
        {"sensor_id": "s-ü", "timestamp": -5, "temperature": -0.25, "unit": "K"},
    ],
    contracts.THRESHOLD_EVENT.name: [
        {"site": "site-b", "sensor_id": "s-1", "timestamp": EVENT, "is_last": True, "is_first": False,
         "temperature_threshold": 30.0, "average_transgression": 1.5, "max_transgression": 2.5, "exceeded_for_ms": 6000,
         "first_transgression": EVENT - 6000, "last_transgression": EVENT},
    ],
    contracts.ROLLUP.name: [
        {"sensor_id": "s-1", "window_start": EVENT - 60_000, "window_end": EVENT, "count": 60, "avg": 21.0,
         "min": 20.0, "max": 22.0},
    ],
    contracts.DEVICE.name: [{"device_id": "d-1", "name": "n", "description": "d", "location": "hall"},
                            {"device_id": "d-2", "name": "n"}],
    contracts.SENSOR.name: [{"sensor_id": "s", "name": "n", "device_id": "d", "sensor_type_id": "t"}],
    contracts.SENSOR_TYPE.name: [{"sensor_type_id": "t", "name": "n", "unit": "C"}],
}


def _valid(contract_name: str) -> list[dict]:
    contract = contracts.contract(contract_name)
    return [contract.validate(r) for r in RECORDS[contract_name]]


def test_every_layout_has_sample_records():
    assert set(RECORDS) == set(LAYOUTS)


@pytest.mark.parametrize("contract_name", sorted(LAYOUTS))
@pytest.mark.parametrize("ingest_ms", [None, EVENT + 7])
def test_row_builder_builds_the_same_row_as_build_row(contract_name, ingest_ms):
    lay, build = layout(contract_name), row_builder(layout(contract_name))
    for record in _valid(contract_name):
        fast, plain = build(record, "site-a", ingest_ms), build_row(lay, record, "site-a", ingest_ms)
        assert fast == plain and fast.partition == plain.partition and fast.event_ms == plain.event_ms


@pytest.mark.parametrize("contract_name", sorted(LAYOUTS))
@pytest.mark.parametrize("ingest_ms", [None, EVENT + 7])
def test_generated_serializer_equals_serializing_each_bound_value(contract_name, ingest_ms):
    lay = layout(contract_name)
    serialize, types = row_serializer(lay), [cql for _, cql, _ in lay.all_columns()]
    write_ms = EVENT + 40
    for record in _valid(contract_name):
        row = build_row(lay, record, "site-a", ingest_ms)
        expected = [None if v is None else _SERIALIZE[cql](v)
                    for cql, v in zip(types, row.bind(write_ms, lay.latency), strict=True)]
        assert serialize(row.values, row.event_ms, write_ms, _SERIALIZE["bigint"](write_ms)) == expected


class _Column:
    def __init__(self, name: str):
        self.keyspace_name, self.table_name, self.name, self.type = "ks", "t", name, None


class _Future:
    def add_callbacks(self, callback, errback):
        callback(None)


class _Session:
    """Prepares real PreparedStatements (no server) and keeps what execute_async was given."""

    def __init__(self):
        self.sent: list = []
        self.prepared: dict[str, PreparedStatement] = {}

    def prepare(self, query: str) -> PreparedStatement:
        names = query.split("(", 1)[1].split(")", 1)[0].split(", ")
        pk = [names.index(c) for c in ("site", "sensor_id", "day") if c in names]
        stmt = PreparedStatement([_Column(n) for n in names], f"id-{len(self.prepared)}".encode(), pk, query,
                                 "ks", 5, None, None)
        self.prepared[query] = stmt
        return stmt

    def execute_async(self, statement, timeout=None):
        self.sent.append(statement)
        return _Future()


def _items(mapping, records: list[dict], site: str = "site-a") -> list[Item]:
    return [Item(None, ("t", 0), i, mapping, build_row(mapping.layout, r, site, r.get("timestamp")))
            for i, r in enumerate(records)]


def test_writer_batch_is_what_batchstatement_add_builds_from_bound_statements():
    mapping = next(m for m in DEFAULT_MAPPINGS if m.contract is contracts.READING)
    session = _Session()
    writer = Writer(session, "ks", [mapping], max_batch_rows=40)
    records = [contracts.READING.validate({"sensor_id": "s-1", "timestamp": EVENT + i, "temperature": 20.0 + i,
                                           "unit": "C"}) for i in range(3)]
    assert writer.send(_items(mapping, records)) == []
    (batch,) = session.sent
    assert isinstance(batch, BatchStatement) and batch.batch_type == BatchType.UNLOGGED

    prepared = session.prepared[insert_cql("ks", mapping.table, mapping.layout, mapping.ttl_seconds)]
    expected = BatchStatement(batch_type=BatchType.UNLOGGED)
    for _, _query_id, values in batch._statements_and_parameters:
        bound = BoundStatement(prepared)
        bound.values = values
        expected.add(bound)
    assert batch._statements_and_parameters == expected._statements_and_parameters
    assert (batch.routing_key, batch.keyspace) == (expected.routing_key, expected.keyspace) != (None, None)
    assert batch.consistency_level == expected.consistency_level
    # And the values are the rows' own, write time included.
    first = batch._statements_and_parameters[0][2]
    assert first[:4] == [b"site-a", _SERIALIZE["date"](utc_day(EVENT)), b"s-1", _SERIALIZE["timestamp"](EVENT)]
    assert writer.collect()[0] and writer.in_flight == 0


def test_writer_sends_a_lone_row_as_a_bound_statement_and_rejects_an_unbindable_one():
    mapping = next(m for m in DEFAULT_MAPPINGS if m.contract is contracts.READING)
    session = _Session()
    writer = Writer(session, "ks", [mapping])
    good = contracts.READING.validate({"sensor_id": "s-1", "timestamp": EVENT, "temperature": 1.0, "unit": "C"})
    bad = dict(good, timestamp=EVENT + 1)
    items = _items(mapping, [good, bad])
    items[1].row = items[1].row._replace(values=items[1].row.values[:6] + (2 ** 70, 1))   # bigint overflow
    rejected = writer.send(items)
    assert [(i.offset, reason.startswith("cannot bind row for table temperature_readings")) for i, reason in rejected
            ] == [(1, True)]
    (stmt,) = session.sent
    assert isinstance(stmt, BoundStatement) and stmt.routing_key and writer.in_flight == 1
    written, _, _ = writer.collect()
    assert [i.offset for i in written] == [0] and writer.in_flight == 0


def test_rows_of_two_tables_never_share_a_batch():
    mappings = parse_mappings('[[table]]\ntopics = ["a"]\ntable = "r1"\ncontract = "temperature-reading"\n'
                              '[[table]]\ntopics = ["b"]\ntable = "r2"\ncontract = "temperature-reading"\n')
    session = _Session()
    writer = Writer(session, "ks", mappings)
    record = contracts.READING.validate({"sensor_id": "s", "timestamp": EVENT, "temperature": 1.0, "unit": "C"})
    writer.send(_items(mappings[0], [record]) + _items(mappings[1], [record]))
    assert sorted(s.prepared_statement.query_string.split()[2] for s in session.sent) == ["ks.r1", "ks.r2"]


@pytest.mark.parametrize("value", [
    b'{"a": 1, "b": "\xc3\xbc"}', b'{"a": "\\ud800"}', b"{not json", b'{"a": 1} x', b"[1, 2]", b"17", b"",
    b"\xef\xbb\xbf{\"a\": 1}", '{"a": 1}'.encode("utf-16"), '{"a": 1}'.encode("utf-16-le"),
    '{"a": 1}'.encode("utf-32"), b"{\xff}", b"{", b"{\x00",
])
def test_json_decoding_behaves_exactly_like_json_loads(value):
    try:
        expected = ("ok", json.loads(value))
    except ValueError as err:
        expected = (type(err), str(err))
    try:
        got = ("ok", _json(value))
    except ValueError as err:
        got = (type(err), str(err))
    assert got == expected
