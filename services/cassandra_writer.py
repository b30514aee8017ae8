"""Asynchronous Cassandra writes for the adapter: grouping, retries, outcomes.

Rows bound for the same partition are sent as one UNLOGGED batch (a
single-partition batch is one mutation on one replica set: far fewer requests,
no batch log). Each request is an `execute_async`; the driver's callback threads
only put the outcome on a queue, and the adapter's main thread collects it, so
all bookkeeping stays single-threaded.

Outcomes: written; rejected (Cassandra answered InvalidRequest: the record can
never be written, a batch is split to find which row); or retried after a
backoff (node down, timeouts, overload: anything else). Nothing is dropped.
"""
from __future__ import annotations

import queue
import random
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cassandra import InvalidRequest
from cassandra.query import BatchStatement, BatchType, BoundStatement

from services.cassandra_mappings import Mapping
from services.cassandra_schema import Row, insert_cql

BACKOFF_MIN_S, BACKOFF_MAX_S = 0.25, 10.0
_DATE_EPOCH = 2 ** 31       # CQL `date`: unsigned days with 1970-01-01 in the middle of the range

# Serializers for the few CQL types our layouts use. The driver's generic
# PreparedStatement.bind costs ~5x more per row (type probing through
# exceptions), which is most of the adapter's CPU; values are already typed by
# the contract, so plain packing is exact.
_SERIALIZE = {
    "text": lambda v: v.encode("utf-8"),
    "bigint": struct.Struct(">q").pack,
    "timestamp": struct.Struct(">q").pack,
    "double": struct.Struct(">d").pack,
    "date": lambda v: struct.Struct(">I").pack(v.days_from_epoch + _DATE_EPOCH),
    "boolean": lambda v: b"\x01" if v else b"\x00",
}


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
        self.max_batch_rows = max_batch_rows
        self.timeout_s = timeout_s
        self._insert = {id(m): session.prepare(insert_cql(keyspace, m.table, m.layout, m.ttl_seconds))
                        for m in mappings}
        self._serializers = {id(m): tuple(_SERIALIZE[cql] for _, cql, _ in m.layout.all_columns())
                             for m in mappings}
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
        now_ms = int(time.time() * 1000)
        bound, rejected = [], []
        for item in req.items:
            try:
                values = item.row.bind(now_ms, item.mapping.layout.latency)
                bound.append((item, self._bind(item.mapping, values)))
            except (TypeError, ValueError, OverflowError, ArithmeticError, AttributeError, struct.error) as err:
                rejected.append((item, f"cannot bind row for table {item.mapping.table}: {err}"))
        # New requests count their rows in flight; a retry's rows are counted already.
        if req.attempt == 0:
            self.in_flight += len(bound)
        else:
            self.in_flight -= len(rejected)
        if not bound:
            return rejected
        req.items = [item for item, _ in bound]
        if len(bound) == 1:
            statement = bound[0][1]
        else:
            statement = BatchStatement(batch_type=BatchType.UNLOGGED)
            for _, stmt in bound:
                statement.add(stmt)
        req.sent_at = time.monotonic()
        try:
            future = self.session.execute_async(statement, timeout=self.timeout_s)
        except Exception as err:  # noqa: BLE001 - e.g. the session is shutting down: retry later
            self._done.put((req, err))
        else:
            future.add_callbacks(lambda _r, r=req: self._done.put((r, None)),
                                 lambda e, r=req: self._done.put((r, e)))
        return rejected

    def _bind(self, mapping: Mapping, values: tuple) -> BoundStatement:
        statement = BoundStatement(self._insert[id(mapping)])
        statement.raw_values = values
        statement.values = [None if v is None else ser(v) for ser, v in zip(self._serializers[id(mapping)], values,
                                                                                strict=True)]
        return statement

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
        delay = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** req.attempt)
        req.attempt += 1
        self.retries_total += 1
        req.not_before = now + delay * random.uniform(0.5, 1.0)   # jitter: replicas do not retry in lockstep
        self._retry.append(req)

    @property
    def retries_waiting(self) -> int:
        return sum(len(r.items) for r in self._retry)
