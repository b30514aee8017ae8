"""Asynchronous Cassandra writes for the adapter: grouping, retries, outcomes.

Rows bound for the same partition are sent as one UNLOGGED batch. Each request is an `execute_async`; the
driver's callback threads only put the outcome on a queue, and the adapter's main thread collects it, so all
bookkeeping stays single-threaded.

Outcomes: written; rejected (Cassandra answered InvalidRequest: the record can never be written, a batch is
split to find which row); or retried after a backoff (node down, timeouts, overload: anything else).
Nothing is dropped.

Per table, a serializer is generated once from the layout's column types, and a batch is built from one
BoundStatement plus the other rows' serialized values: byte for byte what BatchStatement.add builds
(tests/unit/adapter/test_writer.py, against the pinned driver). Why single-partition batches and why this
serializer: docs/architecture.md, "Inside the adapter"."""
from __future__ import annotations

import queue
import random
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cassandra import InvalidRequest
from cassandra.query import BatchStatement, BatchType, BoundStatement

from services.adapter.mappings import Mapping
from services.adapter.schema import Layout, Row, insert_cql
from services.common.backoff import Backoff

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.25, 10.0
_RETRY_BACKOFF = Backoff(BACKOFF_MIN_S, BACKOFF_MAX_S)     # per request: the delay follows its attempt count
_DATE_EPOCH = 2 ** 31       # CQL `date`: unsigned days with 1970-01-01 in the middle of the range

# Serializers for the few CQL types our layouts use. The driver's generic
# PreparedStatement.bind costs ~5x more per row (type probing through
# exceptions), which is most of the adapter's CPU; values are already typed by
# the contract, so plain packing is exact.
_PACK_LONG = struct.Struct(">q").pack
_PACK_DOUBLE = struct.Struct(">d").pack
_PACK_UINT = struct.Struct(">I").pack
_SERIALIZE = {
    "text": lambda v: v.encode("utf-8"),
    "bigint": _PACK_LONG,
    "timestamp": _PACK_LONG,
    "double": _PACK_DOUBLE,
    "date": lambda v: _PACK_UINT(v.days_from_epoch + _DATE_EPOCH),
    "boolean": lambda v: b"\x01" if v else b"\x00",
}
# The same, as expressions for the generated row serializers (`{}` is the value).
_INLINE = {
    "text": "{}.encode('utf-8')",
    "bigint": "_PACK_LONG({})",
    "timestamp": "_PACK_LONG({})",
    "double": "_PACK_DOUBLE({})",
    "date": "_PACK_UINT({}.days_from_epoch + _DATE_EPOCH)",
    "boolean": "(b'\\x01' if {} else b'\\x00')",
}

RowSerializer = Callable[[tuple, "int | None", int, bytes], list]


def row_serializer(lay: Layout) -> RowSerializer:
    """serialize(row.values, row.event_ms, write_ms, packed write_ms) -> the row's bound values, as bytes.

    Equal to [None if v is None else _SERIALIZE[cql](v) for each column of
    row.bind(write_ms)], generated as one flat function from the layout's
    column types (our own fixed table, never input) because this runs for
    every row."""
    cqls = [cql for _, cql, _ in lay.all_columns()]
    n_stored = len(cqls) - (2 if lay.latency else 1)          # values held by the Row
    names = [f"v{i}" for i in range(n_stored)]
    parts = [f"None if {v} is None else {_INLINE[cql].format(v)}" for v, cql in zip(names, cqls, strict=False)]
    parts.append("write_b")
    if lay.latency:
        parts.append("_PACK_LONG(write_ms - event_ms)")
    unpack = f"{', '.join(names)}, = values"
    source = (f"def serialize(values, event_ms, write_ms, write_b):\n    {unpack}\n"
              f"    return [{', '.join(parts)}]\n")
    namespace = {"_PACK_LONG": _PACK_LONG, "_PACK_DOUBLE": _PACK_DOUBLE, "_PACK_UINT": _PACK_UINT,
                 "_DATE_EPOCH": _DATE_EPOCH}
    exec(compile(source, f"<row serializer {lay.contract}>", "exec"), namespace)     # a fixed template, see above
    return namespace["serialize"]


@dataclass(slots=True)
class Item:
    """One consumed record on its way to Cassandra."""
    msg: Any                      # confluent_kafka.Message (key, value, headers kept for dead-letter)
    tp: tuple[str, int]
    offset: int
    mapping: Mapping
    row: Row


@dataclass(slots=True)
class Request:
    items: list[Item]
    attempt: int = 0
    not_before: float = 0.0
    sent_at: float = field(default=0.0)


class Writer:
    def __init__(self, session: Any, keyspace: str, mappings: Iterable[Mapping], max_batch_rows: int = 40,
                 timeout_s: float = 10.0):
        self.session = session
        self.timeout_s = timeout_s
        self.max_batch_rows = min(max_batch_rows, 0xFFFF)      # the protocol's limit per batch
        self._insert = {id(m): session.prepare(insert_cql(keyspace, m.table, m.layout, m.ttl_seconds))
                        for m in mappings}
        serializers = {m.layout: row_serializer(m.layout) for m in mappings}
        self._serialize = {id(m): serializers[m.layout] for m in mappings}
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._retry: list[Request] = []
        self._rejected: list[tuple[Item, str]] = []
        self.in_flight = 0              # rows sent or waiting for a retry
        self.failing_since: float | None = None
        self.last_error = ""
        self.retries_total = 0          # requests scheduled again, for the metrics

    # ---------------------------------------------------------------- sending

    def send(self, items: list[Item]) -> list[tuple[Item, str]]:
        """Group by table and partition, send; returns items that cannot even be bound."""
        groups: dict[tuple, list[Item]] = {}
        for item in items:
            groups.setdefault((id(item.mapping), item.row.partition), []).append(item)
        rejected: list[tuple[Item, str]] = []
        for group in groups.values():
            for start in range(0, len(group), self.max_batch_rows):
                rejected += self._send(Request(group[start:start + self.max_batch_rows]))
        return rejected

    def _send(self, req: Request) -> list[tuple[Item, str]]:
        write_ms = int(time.time() * 1000)
        write_b = _PACK_LONG(write_ms)
        mapping = req.items[0].mapping             # a request holds rows of one table (and one partition)
        serialize = self._serialize[id(mapping)]
        bound: list[Item] = []
        values: list[list] = []
        rejected: list[tuple[Item, str]] = []
        for item in req.items:
            row = item.row
            try:
                values.append(serialize(row.values, row.event_ms, write_ms, write_b))
            except (TypeError, ValueError, OverflowError, ArithmeticError, AttributeError, struct.error) as err:
                rejected.append((item, f"cannot bind row for table {item.mapping.table}: {err}"))
            else:
                bound.append(item)
        # New requests count their rows in flight; a retry's rows are counted already.
        if req.attempt == 0:
            self.in_flight += len(bound)
        else:
            self.in_flight -= len(rejected)
        if not bound:
            return rejected
        req.items = bound
        prepared = self._insert[id(mapping)]
        first = BoundStatement(prepared)
        first.raw_values, first.values = bound[0].row.values, values[0]    # raw_values: for its repr only
        if len(bound) == 1:
            statement = first
        else:
            statement = BatchStatement(batch_type=BatchType.UNLOGGED)
            statement.add(first)               # keyspace, routing key, consistency from the prepared insert
            query_id = prepared.query_id
            # What statement.add(BoundStatement) appends for each further row of the same prepared insert.
            statement._statements_and_parameters.extend([(True, query_id, v) for v in values[1:]])
        req.sent_at = time.monotonic()
        try:
            future = self.session.execute_async(statement, timeout=self.timeout_s)
        except Exception as err:  # noqa: BLE001 - e.g. the session is shutting down: retry later
            self._done.put((req, err))
        else:
            future.add_callbacks(lambda _r, r=req: self._done.put((r, None)),
                                 lambda e, r=req: self._done.put((r, e)))
        return rejected

    def send_due_retries(self) -> None:
        if not self._retry:
            return
        now = time.monotonic()
        due = [r for r in self._retry if r.not_before <= now]
        if due:
            self._retry = [r for r in self._retry if r.not_before > now]
            for req in due:
                self._rejected += self._send(req)

    # ---------------------------------------------------------------- outcomes

    def collect(self, wait_s: float = 0.0) -> tuple[list[Item], list[tuple[Item, str]], list[float]]:
        """Finished work since the last call: written items, rejected items with reasons, request latencies."""
        written: list[Item] = []
        latencies: list[float] = []
        block = wait_s > 0
        while True:
            try:
                entry = self._done.get(block, wait_s) if block else self._done.get_nowait()
            except queue.Empty:
                break
            block = False
            req, error = entry
            if error is None:
                self.in_flight -= len(req.items)
                self.failing_since = None
                written += req.items
                latencies.append(time.monotonic() - req.sent_at)
            elif isinstance(error, InvalidRequest):
                self._split_or_reject(req, error)
            else:
                self._schedule_retry(req, error)
        rejected, self._rejected = self._rejected, []
        return written, rejected, latencies

    def _split_or_reject(self, req: Request, error: Exception) -> None:
        self.in_flight -= len(req.items)
        if len(req.items) == 1:
            item = req.items[0]
            self._rejected.append((item, f"cassandra rejected the row for table {item.mapping.table}: {error}"))
            return
        # One bad row fails its whole batch: resend each row alone to find it.
        for item in req.items:
            self._rejected += self._send(Request([item]))

    def _schedule_retry(self, req: Request, error: Exception) -> None:
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        self.last_error = f"{type(error).__name__}: {error}"[:300]
        delay = _RETRY_BACKOFF.delay(req.attempt)
        req.attempt += 1
        self.retries_total += 1
        req.not_before = now + delay * random.uniform(0.5, 1.0)   # jitter: replicas do not retry in lockstep
        self._retry.append(req)

    @property
    def retries_waiting(self) -> int:
        return sum(len(r.items) for r in self._retry)
