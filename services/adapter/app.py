"""The Kafka-to-Cassandra adapter: at-least-once, bounded, never skips.

A consumer group reads the mapped topics (adapter.mappings), turns each record into a row (adapter.schema)
and writes it with prepared statements, many requests in flight (adapter.writer). Offsets are committed per
partition only up to the last record whose row is written or whose dead-letter copy Kafka acknowledged
(common.offsets), so a crash replays, never skips, and a replayed record overwrites its own row (event time
is part of the key): tests/integration/test_cassandra_adapter.py, tests/unit/common/test_offsets.py.
At most `window` records are between consume and done; while it stays full the partitions are paused and
polling goes on, so the consumer stays in its group. A record that can never become a row goes to
`dead-letter` (services.common.dead_letter), never crashes the adapter (tests/unit/adapter/test_adapter_poison.py).

Run with --help for the options, --print-schema for the CQL. This module holds the Adapter loop and main();
adapter.metrics the Prometheus metrics, adapter.cassandra the session and the DDL, adapter.writer the writes.
Back-pressure, CPU per record and the latency columns (with their queries): docs/architecture.md,
"Inside the adapter"; dead-letter reasons: "Dead letters"."""
from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from services.adapter import metrics
from services.adapter.assignment import UnreadWatch
from services.adapter.cassandra import Stop, connect_cassandra, missing_column_statements, schema_statements
from services.adapter.mappings import Mapping, MappingError, Router, load_mappings
from services.adapter.metrics import exposition
from services.adapter.schema import Row, RowError, row_builder, row_site
from services.adapter.settings import Settings, load, parser
from services.adapter.writer import Item, Writer
from services.common import kafka_auth, names
from services.common.backoff import Backoff
from services.common.contracts import EPOCH_MS_MAX, EPOCH_MS_MIN, ContractError, InvalidJson, parse_json
from services.common.dead_letter import (
    CONTRACT_VIOLATION,
    INVALID_JSON,
    UNMAPPED,
    UNPROCESSABLE,
    DeadLetter,
    bounded_detail,
    dead_letter,
)
from services.common.observability import StopFlag, kv, metrics_tls, serve_http, setup_logging
from services.common.offsets import OffsetTracker
from services.common.settings import SettingsError

log = logging.getLogger("cassandra-adapter")

PAUSE_AFTER_FULL_S = 1.0    # a full window that frees up within this is normal load, not an outage
STOP_GRACE_S = 20.0         # finish in-flight writes on SIGTERM; keep Swarm's stop_grace_period above it
REVOKE_GRACE_S = 10.0       # finish in-flight writes of partitions taken away in a rebalance
POLL_WAIT_S = 0.02          # longest wait for a record in a loop turn with room in the window
BATCH_MAX = 5000            # records taken from the consumer per loop turn (more rows per partition batch)
SCHEMA_RETRY_MIN_S, SCHEMA_RETRY_MAX_S = 1.0, 15.0

# Dead-letter reason of the adapter alone (the generic ones are in services.common.dead_letter):
# the row cannot be bound to the table, or Cassandra answered InvalidRequest.
UNWRITABLE = "unwritable"


class _Route:
    """What a topic's records need, looked up once per topic instead of once per record."""
    __slots__ = ("mapping", "validate", "build")

    def __init__(self, mapping: Mapping | None):
        self.mapping = mapping
        if mapping is not None:
            self.validate = mapping.contract.validate
            self.build = row_builder(mapping.layout)


def _ingest_ms(value: bytes) -> int | None:
    """The bridge's `ingest_ms` header, or None when it is not a time a row can hold: a broken
    latency header must not cost the reading (its latency would not fit the bigint column)."""
    try:
        ms = int(value)
    except (ValueError, TypeError):
        return None
    return ms if EPOCH_MS_MIN <= ms <= EPOCH_MS_MAX else None


MOVED_CHECK_S = 10.0      # how often a failing adapter checks whether Cassandra moved
MOVED_AFTER_S = 30.0      # writes failing this long before the check


class ConsumerFailed(Exception):
    """librdkafka raised a fatal consumer error: the consumer will never consume or commit again."""


def _raise_if_fatal(error: Any) -> None:
    """ConsumerFailed for a fatal consumer error. librdkafka hands it to a consumer as a record whose error
    code is _FATAL (KafkaError.fatal() stays false on such a record); e.g. a fenced static member."""
    from confluent_kafka import KafkaError

    if error.fatal() or error.code() == KafkaError._FATAL:
        raise ConsumerFailed(str(error))


PATTERN_REFRESH_MS = 30_000


def consumer_config(settings: Settings) -> dict[str, Any]:
    """The Kafka consumer's configuration (without callbacks)."""
    config: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "group.id": settings.group_id,
        "session.timeout.ms": settings.session_timeout_ms,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "queued.max.messages.kbytes": 16384,      # bound the prefetch: the container has a memory limit
        # The datacenter subscribes by pattern (<site>.<topic>): librdkafka matches new topics only when it
        # refreshes metadata, by default every 5 min, so a new site's (or a first deploy's) relayed records
        # waited up to 5 min (scripts/bench e2e's warm-up showed 300 s). 30 s bounds that wait.
        "topic.metadata.refresh.interval.ms": PATTERN_REFRESH_MS,
        **kafka_auth.internal_config(),           # its own principal: reads its topics in its group
    }
    if settings.group_instance_id:
        # Static membership: see the option's comment in adapter.settings. A second consumer with the
        # same id fences this one (FENCED_INSTANCE_ID, fatal): _accept then stops the adapter.
        config["group.instance.id"] = settings.group_instance_id
    return config


def resolve_all(hosts) -> set[str]:
    """Every address the contact points resolve to now (unresolvable ones add nothing)."""
    found: set[str] = set()
    for host in hosts:
        try:
            found |= {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
        except OSError:
            continue
    return found


class Adapter:
    def __init__(self, settings: Settings, mappings: tuple[Mapping, ...], stop: Stop):
        self.settings, self.stop = settings, stop
        self.router = Router(mappings)
        self._routes: dict[str, _Route] = {}
        self.tracker = OffsetTracker()
        self.session: Any = None
        self.writer: Writer | None = None
        self.consumer: Any = None
        self.producer: Any = None
        self.paused = False
        self.full_since: float | None = None
        self.dlq_pending = 0
        self._dlq_retry: list[tuple[Any, DeadLetter]] = []      # (source message, its dead-letter record)
        self.written = 0          # rows, for benchmarks and logs
        self.dead_lettered = 0
        self.heartbeat = 0.0
        self._retries_seen = 0
        self.watch_stop = threading.Event()     # ends the unread-partitions watch (assignment.py)

    # ---------------------------------------------------------------- health

    def health(self) -> tuple[bool, str]:
        if self.writer is None:
            return False, "starting: connecting to cassandra"
        if time.monotonic() - self.heartbeat > 60:
            return False, "main loop stalled for more than 60 s"
        if self.writer.failing_since is not None:
            since = time.monotonic() - self.writer.failing_since
            return True, f"waiting for cassandra for {since:.0f}s ({self.writer.last_error}); nothing is skipped"
        return True, f"ok in_flight={self.writer.in_flight} paused={self.paused}"

    # ---------------------------------------------------------------- setup

    def start(self) -> bool:
        from confluent_kafka import Consumer, Producer

        self.session = connect_cassandra(self.settings, self.stop)
        if self.session is None:
            return False
        for statement in schema_statements(self.settings, self.router.mappings):
            self._retry_until_done("create schema", lambda s=statement: self.session.execute(s, timeout=60))
        self._retry_until_done("add missing columns", self._add_missing_columns)
        self.writer = Writer(self.session, self.settings.keyspace, self.router.mappings,
                             self.settings.max_batch_rows, self.settings.write_timeout)
        self.consumer = Consumer({**consumer_config(self.settings), "on_commit": self._on_commit})
        self.producer = Producer({"bootstrap.servers": self.settings.kafka_bootstrap,
                                  "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                                  **kafka_auth.internal_config()})
        self.consumer.subscribe(self.router.subscription(), on_assign=self._on_assign,
                                on_revoke=self._on_revoke, on_lost=self._on_lost)
        UnreadWatch({"bootstrap.servers": self.settings.kafka_bootstrap, **kafka_auth.internal_config()},
                    self.settings.group_id, lambda topic: self.router.route(topic) is not None,
                    self.watch_stop).start()
        self.heartbeat = time.monotonic()
        log.info("started", extra=kv(keyspace=self.settings.keyspace, topics=",".join(self.router.subscription()),
                                     window=self.settings.window, group=self.settings.group_id,
                                     instance=self.settings.group_instance_id or "dynamic"))
        return True

    def _add_missing_columns(self) -> None:
        """Tables created before their layout gained a column get it (rows written before hold null)."""
        for statement in missing_column_statements(self.session, self.settings, self.router.mappings):
            self.session.execute(statement, timeout=60)
            log.info("added a column to an existing table", extra=kv(cql=statement))

    def _retry_until_done(self, what: str, action) -> None:
        backoff = Backoff(SCHEMA_RETRY_MIN_S, SCHEMA_RETRY_MAX_S)
        while not self.stop.is_set():
            try:
                action()
                return
            except Exception as err:  # noqa: BLE001 - Cassandra may still be starting: keep trying
                delay = backoff.next()
                log.warning(f"{what} failed, retrying", extra=kv(retry_s=delay, error=str(err)[:300]))
                time.sleep(delay)

    # ---------------------------------------------------------------- main loop

    def run(self) -> int:
        if not self.start():
            return 0
        last_commit = last_moved_check = time.monotonic()
        try:
            while not self.stop.is_set():
                self.heartbeat = time.monotonic()
                self._tick()
                if self.heartbeat - last_commit >= self.settings.commit_interval:
                    self._commit(asynchronous=True)
                    last_commit = self.heartbeat
                if self.heartbeat - last_moved_check >= MOVED_CHECK_S:
                    last_moved_check = self.heartbeat
                    moved = self._cassandra_moved()
                    if moved:
                        log.error("cassandra answers at a new address the driver will never try; exiting so the "
                                  "restart connects afresh (nothing uncommitted is lost: it is read again)",
                                  extra=kv(**moved))
                        return 1
        except ConsumerFailed as err:
            log.error("the Kafka consumer failed for good; exiting so that the restart creates a new one "
                      "(nothing uncommitted is lost: it is read again)", extra=kv(
                          error=str(err), instance=self.settings.group_instance_id or "dynamic",
                          fix="if fenced: two running replicas share ADAPTER_GROUP_INSTANCE_ID; give each its own"))
            return 1
        finally:
            self._shutdown()
        return 0

    def _cassandra_moved(self) -> dict[str, str] | None:
        """After MOVED_AFTER_S of failing writes: do the contact points now resolve to addresses the
        driver does not know? The driver resolves them once, at connect; a single-node cluster whose
        task restarted on a new address (Swarm gives a new task a new IP) is otherwise never found again."""
        failing = self.writer.failing_since if self.writer else None
        if failing is None or time.monotonic() - failing < MOVED_AFTER_S:
            return None
        known = {str(getattr(h, "address", "")) for h in self.session.cluster.metadata.all_hosts()}
        now = resolve_all(self.settings.cassandra_hosts)
        return {"known": ",".join(sorted(known)), "resolved": ",".join(sorted(now))} if now - known else None

    def _tick(self) -> None:
        outstanding = self.writer.in_flight + self.dlq_pending
        room = self.settings.window - outstanding
        self._serve_outcomes(wait_s=0.05 if room <= 0 else 0.0)
        metrics.IN_FLIGHT.set(self.writer.in_flight + self.dlq_pending)
        room = self.settings.window - self.writer.in_flight - self.dlq_pending
        now = time.monotonic()
        if room <= 0:
            self.full_since = self.full_since or now
            if not self.paused and now - self.full_since >= PAUSE_AFTER_FULL_S:
                self._pause(True)
            if not self.paused:
                return      # full for a moment: wait for writes instead of taking more
        else:
            self.full_since = None
            if self.paused and room >= self.settings.window // 2:
                self._pause(False)
        if self.paused:
            # Polling while paused returns nothing but keeps us in the group (max.poll.interval.ms).
            self._accept(self.consumer.consume(1, 0.05))
            return
        # Wait for a record even with writes in flight: a write's outcome only frees window room and
        # advances commits, and a turn later is soon enough for both. Polling without waiting spun a
        # core whenever a write was out, which on a small site is the CPU Kafka and Cassandra need.
        first = self.consumer.poll(POLL_WAIT_S)
        if first is None:
            return
        self._accept([first] + self.consumer.consume(min(room, BATCH_MAX) - 1, 0) if room > 1 else [first])

    def _pause(self, pause: bool) -> None:
        assignment = self.consumer.assignment()
        if pause:
            self.consumer.pause(assignment)
            log.warning("window full, consumption paused", extra=kv(
                in_flight=self.writer.in_flight, retrying=self.writer.retries_waiting, error=self.writer.last_error))
        else:
            self.consumer.resume(assignment)
            log.info("consumption resumed", extra=kv(in_flight=self.writer.in_flight))
        self.paused = pause
        metrics.PAUSED.set(1 if pause else 0)

    # ---------------------------------------------------------------- records in

    def _accept(self, msgs: list) -> None:
        items: list[Item] = []
        consumed: dict[str, int] = {}
        track = self.tracker.consumed
        routes = self._routes
        for msg in msgs:
            if msg.error():
                _raise_if_fatal(msg.error())
                log.warning("consumer error", extra=kv(error=msg.error()))
                continue
            topic = msg.topic()
            tp, offset = (topic, msg.partition()), msg.offset()
            track(tp, offset)
            route = routes.get(topic) or self._route(topic)
            mapping = route.mapping
            if mapping is None:
                self._dead_letter(msg, UNMAPPED,
                                  f"no table mapping for topic {topic} (add it to ADAPTER_MAPPINGS_FILE)")
                continue
            consumed[mapping.table] = consumed.get(mapping.table, 0) + 1
            if msg.value() is None:
                metrics.SKIPPED.inc()     # a deletion marker on a compacted topic: no row to write
                self.tracker.finished(tp, offset)
                continue
            try:
                row = self._row(msg, route, topic)
            except InvalidJson as err:
                self._dead_letter(msg, INVALID_JSON, f"invalid JSON for {mapping.contract.name}: {err}")
            except (ContractError, RowError) as err:
                self._dead_letter(msg, CONTRACT_VIOLATION, str(err))
            except Exception as err:  # noqa: BLE001 - one record's data must never stop the adapter
                self._dead_letter(msg, UNPROCESSABLE, f"{type(err).__name__}: {err}")
            else:
                items.append(Item(msg, tp, offset, mapping, row))
        for table, n in consumed.items():
            metrics.CONSUMED.labels(table).inc(n)
        if items:
            for item, detail in self.writer.send(items):
                self._dead_letter(item.msg, UNWRITABLE, detail)

    def _route(self, topic: str) -> _Route:
        route = self._routes[topic] = _Route(self.router.route(topic))
        return route

    def _row(self, msg: Any, route: _Route, topic: str) -> Row:
        record = route.validate(parse_json(msg.value()))
        header_site = ingest_ms = None
        for key, value in msg.headers() or ():
            if key == names.HEADER_SITE and value:
                header_site = value.decode("utf-8", "replace")
            elif key == names.HEADER_INGEST_MS and value:
                ingest_ms = _ingest_ms(value)
        site = row_site(record, header_site, topic, self.settings.default_site or None)
        return route.build(record, site, ingest_ms)

    # ---------------------------------------------------------------- outcomes

    def _serve_outcomes(self, wait_s: float) -> None:
        """One round of everything that finishes records: collect writes (waiting up to wait_s for the
        first), serve the producer's delivery reports, resend failed dead letters, send due write retries."""
        self._collect(wait_s)
        self.producer.poll(0)
        self._resend_dead_letters()
        self.writer.send_due_retries()

    def _drain(self, until: Callable[[], bool], deadline: float) -> None:
        """Serve outcomes until `until()` is true or the (monotonic) deadline has passed."""
        while not until() and time.monotonic() < deadline:
            self._serve_outcomes(wait_s=0.05)

    def _collect(self, wait_s: float) -> None:
        written, rejected, latencies = self.writer.collect(wait_s)
        for item in written:
            self.tracker.finished(item.tp, item.offset)
        if written:
            self.written += len(written)
            counts: dict[str, int] = {}
            for item in written:
                counts[item.mapping.table] = counts.get(item.mapping.table, 0) + 1
            for table, n in counts.items():
                metrics.WRITTEN.labels(table).inc(n)
        for seconds in latencies:
            metrics.WRITE_SECONDS.observe(seconds)
        for item, detail in rejected:
            self._dead_letter(item.msg, UNWRITABLE, detail)
        if self.writer.retries_total > self._retries_seen:
            metrics.RETRIED.inc(self.writer.retries_total - self._retries_seen)
            self._retries_seen = self.writer.retries_total

    def _dead_letter(self, msg: Any, reason: str, detail: str) -> None:
        detail = bounded_detail(detail)
        record = dead_letter(self.settings.dead_letter_topic, msg.topic(), msg.key(), msg.value(), reason, detail,
                             int(time.time() * 1000), msg.headers(), msg.partition(), msg.offset())
        log.warning("dead-letter", extra=kv(topic=msg.topic(), partition=msg.partition(), offset=msg.offset(),
                                            reason=reason, detail=detail[:300]))
        self.dlq_pending += 1
        self._produce_dead_letter(msg, record)

    def _produce_dead_letter(self, msg: Any, record: DeadLetter) -> None:
        def delivered(err, _record, msg=msg, record=record) -> None:
            if err is not None:
                log.warning("dead-letter delivery failed, retrying", extra=kv(error=err))
                self._dlq_retry.append((msg, record))
                return
            self.dlq_pending -= 1
            self.dead_lettered += 1
            metrics.DEAD_LETTERED.labels(msg.topic()).inc()
            self.tracker.finished((msg.topic(), msg.partition()), msg.offset())
        try:
            self.producer.produce(record.topic, key=record.key, value=record.value, headers=record.headers,
                                  on_delivery=delivered)
        except BufferError:
            self._dlq_retry.append((msg, record))

    def _resend_dead_letters(self) -> None:
        retry, self._dlq_retry = self._dlq_retry, []
        for msg, record in retry:
            self._produce_dead_letter(msg, record)

    # ---------------------------------------------------------------- offsets

    def _commit(self, asynchronous: bool) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        commits = self.tracker.take_commits()
        if not commits:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in commits.items()]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except KafkaException as err:
            log.warning("commit failed, will retry", extra=kv(error=err))
            for (t, p), o in commits.items():
                self.tracker.recommit((t, p), o)

    def _on_commit(self, err, partitions) -> None:
        if err is not None:
            log.warning("commit failed, will retry", extra=kv(error=err))
            for tp in partitions:
                self.tracker.recommit((tp.topic, tp.partition), tp.offset)

    def _on_assign(self, consumer, partitions) -> None:
        log.info("partitions assigned", extra=kv(partitions=_names(partitions)))
        for topic in {p.topic for p in partitions}:     # exported at 0, so the first dead letter is an
            metrics.DEAD_LETTERED.labels(topic)          # increase (RecordsDeadLettered)
        if self.paused:     # assign first (the client then skips its own assign), so pause applies
            consumer.assign(partitions)
            consumer.pause(partitions)

    def _on_revoke(self, _consumer, partitions) -> None:
        """Finish (briefly) what is in flight for the partitions we lose, commit, forget them."""
        tps = [(p.topic, p.partition) for p in partitions]
        self._drain(until=lambda: not any(self.tracker.outstanding(tp) for tp in tps),
                    deadline=time.monotonic() + REVOKE_GRACE_S)
        self._commit(asynchronous=False)
        for tp in tps:
            self.tracker.drop(tp)
        log.info("partitions revoked", extra=kv(partitions=_names(partitions)))

    def _on_lost(self, _consumer, partitions) -> None:
        for p in partitions:
            self.tracker.drop((p.topic, p.partition))
        log.warning("partitions lost (another member owns them now)", extra=kv(partitions=_names(partitions)))

    # ---------------------------------------------------------------- stop

    def _shutdown(self) -> None:
        self.watch_stop.set()
        if self.consumer is None:
            if self.session is not None:
                self.session.cluster.shutdown()
            return
        try:
            self.consumer.pause(self.consumer.assignment())
            self._drain(until=lambda: self.writer.in_flight + self.dlq_pending <= 0,
                        deadline=time.monotonic() + STOP_GRACE_S)
            self._commit(asynchronous=False)
            self.producer.flush(5)
            log.info("stopped", extra=kv(written=self.written, dead_lettered=self.dead_lettered,
                                         unfinished=self.writer.in_flight + self.dlq_pending))
        finally:
            self.consumer.close()
            self.session.cluster.shutdown()
            # Destroy the producer now rather than whenever this object is collected
            # (an embedding process, e.g. a benchmark, may outlive its Kafka).
            self.producer = None


def _names(partitions) -> str:
    return ",".join(f"{p.topic}[{p.partition}]" for p in partitions)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)     # a bad flag: usage on stderr, exit 2
    try:
        settings = load(args)
        mappings = load_mappings(settings.mappings_file or None)
        kafka_auth.internal_config()     # KAFKA_USERNAME without its password file, a missing CA: say so now
    except (SettingsError, MappingError) as err:
        print(f"iot-cassandra-adapter: {err}", file=sys.stderr)
        return 2
    if args.print_schema:
        print(";\n".join(schema_statements(settings, mappings)) + ";")
        return 0
    setup_logging("cassandra-adapter", settings.log_level)
    adapter = Adapter(settings, mappings, StopFlag())
    if settings.metrics_port:
        serve_http(settings.metrics_port, adapter.health, exposition,
                   tls=metrics_tls(settings.metrics_keystore, settings.metrics_client_ca))
    return adapter.run()


if __name__ == "__main__":
    sys.exit(main())
