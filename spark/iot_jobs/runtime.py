"""I/O wiring shared by the jobs: settings from env, session, Kafka source/sink, shutdown.

Settings are services.common.settings Options read from the environment only: COMMON_OPTIONS here, each
job's own in its module (OPTIONS); spark/README.md's tables are made from them (tests/unit/spark).

Nothing here transforms data; the transforms live in the other modules.
"""
from __future__ import annotations

import ast
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from services.common import kafka_auth, settings
from services.common.backoff import Backoff
from services.common.settings import Option, SettingsError, integer

log = logging.getLogger("iot_stack.jobs")

OFFSET_CHOICES = ("latest", "earliest")
# STARTING_OFFSETS="<n> <unit> ago": start at the first record not older than that.
_LOOKBACK = re.compile(r"(\d+)\s*(second|minute|hour|day)s?\s+ago")
_UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
DEFAULT_STARTING_OFFSETS = "1 hour ago"


# Settings common to the jobs (COMMON_OPTIONS below); the jobs' own are declared in their modules. Empty counts
# as unset.
KAFKA_BOOTSTRAP_SERVERS = Option("bootstrap_servers", "KAFKA_BOOTSTRAP_SERVERS", None,
                                 "Kafka bootstrap servers, comma-separated host:port", required=True)
CHECKPOINT_DIR = Option("checkpoint_dir", "CHECKPOINT_DIR", None,
                        "checkpoint root, one sub-directory per query", required=True)
TRIGGER_INTERVAL = Option("trigger_interval", "TRIGGER_INTERVAL", "",
                          "micro-batch interval, e.g. '2 seconds' (empty: next batch as soon as the last ends)")
# KAFKA_OPTION_SECURITY_PROTOCOL=SSL -> kafka.security.protocol=SSL (TLS, SASL...): a family, not one Option.
KAFKA_OPTION_PREFIX = "KAFKA_OPTION_"
# The threshold detector's dead-letter query reads every reading again only to find the invalid ones. Back to
# back it took the job's one core from the event query for each of its micro-batches; dead letters are not
# urgent, so by default it runs every 10 s with more rows per (fixed-cost) batch. scripts/bench spark measures it.
DEAD_LETTER_TRIGGER_INTERVAL = Option("dead_letter_trigger_interval", "DEAD_LETTER_TRIGGER_INTERVAL", "10 seconds",
                                      "micro-batch interval of the threshold detector's dead-letter query "
                                      "('0 seconds': back to back)")
STOP_TIMEOUT_SECONDS = Option("stop_timeout_seconds", "STOP_TIMEOUT_SECONDS", 60,
                              "seconds a query may finish its running micro-batch on SIGTERM", integer(0))
LOG_LEVEL = Option("log_level", "IOT_STACK_LOG_LEVEL", "INFO", "log level of the driver")
# The consumer groups of the job's Kafka reads are named "<prefix>-<uuid>-...": the stack sets
# "<site>-<job>", which the job's principal may use (its ACLs); Spark's default is spark-kafka-source.
KAFKA_GROUP_ID_PREFIX = Option("group_id_prefix", "KAFKA_GROUP_ID_PREFIX", "",
                               "prefix of the Kafka consumer groups of the job's reads (empty: Spark's)")


def _starting_offsets(text: str) -> str:
    if text not in OFFSET_CHOICES and not text.startswith("{") and not _LOOKBACK.fullmatch(text):
        raise ValueError("expected latest, earliest, '<n> seconds|minutes|hours|days ago' or a Spark offsets JSON")
    return text


# The site of readings without a site header: the edge jobs' own setting (the notifier's SITE means another thing).
READINGS_SITE = Option("site", "SITE", None, "site of readings without a site header", required=True)
STARTING_OFFSETS = Option("starting_offsets", "STARTING_OFFSETS", DEFAULT_STARTING_OFFSETS,
                          "where a query without a checkpoint starts: '<n> seconds|minutes|hours|days ago', latest, "
                          "earliest or Spark's offsets JSON; afterwards the checkpoint decides (registries are "
                          "always read from earliest)", _starting_offsets)

# What every job reads (KafkaSettings.from_env, checkpoint, trigger_options, run_until_stopped, configure_logging).
COMMON_OPTIONS: tuple[Option, ...] = (
    KAFKA_BOOTSTRAP_SERVERS, CHECKPOINT_DIR, STARTING_OFFSETS, TRIGGER_INTERVAL, STOP_TIMEOUT_SECONDS,
    KAFKA_GROUP_ID_PREFIX, kafka_auth.USERNAME, kafka_auth.PASSWORD, kafka_auth.CA_FILE, LOG_LEVEL)


def topic_options(name: str, what: str, topic: str = "", pattern: str = "",
                  topic_note: str = "") -> tuple[Option, Option]:
    """<NAME>_TOPIC and <NAME>_TOPIC_PATTERN, the settings of one subscription (Source.from_env)."""
    key, note = name.lower(), f" ({topic_note})" if topic_note else ""
    return (Option(f"{key}_topic", f"{name}_TOPIC", topic, f"topic of {what}{note}"),
            Option(f"{key}_topic_pattern", f"{name}_TOPIC_PATTERN", pattern,
                   f"Java regex of the topics of {what}; wins over {name}_TOPIC"))


@dataclass(frozen=True)
class Source:
    """One Kafka subscription: a topic name or a Java regex pattern."""
    topic: str = ""
    pattern: str = ""

    @classmethod
    def from_env(cls, options: tuple[Option, Option]) -> Source:
        """The subscription topic_options(NAME, ...) declares: <NAME>_TOPIC or <NAME>_TOPIC_PATTERN (which wins)."""
        topic, pattern = options
        if settings.value(pattern):
            return cls(pattern=settings.value(pattern))
        return cls(topic=settings.value(topic))

    def options(self) -> dict[str, str]:
        return {"subscribePattern": self.pattern} if self.pattern else {"subscribe": self.topic}


@dataclass(frozen=True)
class KafkaSettings:
    options: dict[str, str]          # kafka.* options for every source and sink
    starting_offsets: str            # for the data sources; registries always start at earliest
    group_id_prefix: str = ""        # groupIdPrefix of every source ("": Spark's default)

    def starting_options(self, now_ms: int | None = None) -> dict[str, str]:
        """Source options for a query's first start (a checkpoint overrides them).

        A lookback becomes Spark's startingTimestamp, computed when the job
        starts: a job that crash-loops before its first checkpoint still
        starts before the records that arrived meanwhile. Partitions with no
        record that recent start at their end instead of failing the query."""
        match = _LOOKBACK.fullmatch(self.starting_offsets)
        if not match:
            return {"startingOffsets": self.starting_offsets}
        seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return {"startingTimestamp": str(now_ms - seconds * 1000), "startingOffsetsByTimestampStrategy": "latest"}

    @classmethod
    def from_env(cls) -> KafkaSettings:
        options = {"kafka.bootstrap.servers": settings.value(KAFKA_BOOTSTRAP_SERVERS)}
        for name, value in os.environ.items():
            if name.startswith(KAFKA_OPTION_PREFIX) and value:
                options["kafka." + name.removeprefix(KAFKA_OPTION_PREFIX).lower().replace("_", ".")] = value
        # The job's own principal (KAFKA_USERNAME, the secret kafka_password): SCRAM, inside TLS with
        # KAFKA_CA_FILE. Its password travels in the options, which the session redacts (session()).
        options |= {"kafka." + key: value for key, value in kafka_auth.java_internal_options().items()}
        return cls(options, settings.value(STARTING_OFFSETS), settings.value(KAFKA_GROUP_ID_PREFIX))

    def source_options(self, subscription: dict[str, str], starting: dict[str, str]) -> dict[str, str]:
        """The options of one Kafka read (source_options, with the job's group id prefix)."""
        group = {"groupIdPrefix": self.group_id_prefix} if self.group_id_prefix else {}
        return source_options({**self.options, **group}, subscription, starting)


def checkpoint(job: str, query: str) -> str:
    """<CHECKPOINT_DIR>/<query>: one directory per query of the job."""
    root = settings.value(CHECKPOINT_DIR)
    if "://" not in root:
        Path(root).mkdir(parents=True, exist_ok=True)
    return f"{root.rstrip('/')}/{query}"


def trigger_options(option: Option = TRIGGER_INTERVAL) -> dict[str, str]:
    """The micro-batch trigger `option` sets ('2 seconds'); unset: next micro-batch as soon as the last ends."""
    interval = settings.value(option)
    return {"processingTime": interval} if interval else {}


def session(app_name: str, extra: dict[str, str] | None = None) -> SparkSession:
    from pyspark import SparkConf, SparkContext
    SparkContext._ensure_initialized()   # the JVM holds spark-submit's --conf values...
    submitted = SparkConf()              # ...which win over the defaults below
    builder = SparkSession.builder.appName(app_name)
    defaults = {
        # transformWithStateInPandas and state TTL need RocksDB.
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        # Each commit writes the batch's changes, not a RocksDB snapshot (snapshots move to the maintenance
        # thread): the state commit fell from about 500 to 320 ms a batch at 1,000 sensors (scripts/bench
        # spark, docs/operations.md "Benchmarks"). An existing checkpoint takes it (Spark's documentation;
        # not tested here).
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # 200 state partitions cost seconds per micro-batch on a small site; fixed once checkpointed.
        "spark.sql.shuffle.partitions": "4",
        # A query with no trigger interval that found no new data asks Kafka again after this delay (10 ms by
        # default). On an idle site Kafka then served 211 ListOffsets, 211 DescribeCluster and 422 Metadata
        # requests a second, and the two jobs and Kafka took 0.46 of the site's 0.50 core; with 1 s, 2, 2 and 5
        # requests and about 0.1 core in all (scripts/bench site --baseline). A query that finds data never waits,
        # so this only delays the first reading after a quiet spell, by at most the delay.
        "spark.sql.streaming.pollingDelay": "1s",
        # A Python worker's socket back to the JVM (SPARK_AUTH_SOCKET_TIMEOUT in the worker) gets 15 s
        # by default; on a CPU-starved host that failed queries (CANNOT_OPEN_SOCKET) before they ran.
        "spark.python.authenticate.socketTimeout": "60s",
        "spark.sql.session.timeZone": "UTC",
        # Kafka options hold the job's SCRAM login (kafka.sasl.jaas.config): hidden in plans and the UI.
        "spark.sql.redaction.options.regex": "(?i)url|jaas|password",
        **(extra or {}),
    }
    for key, value in defaults.items():
        if not submitted.contains(key):
            builder = builder.config(key, value)
    ship_package()
    return builder.getOrCreate()


def ship_package() -> None:
    """Pickle iot_jobs code by value into the Python UDFs (the stateful processor).

    Spark's Python processes (executors' workers and the driver-side runner that
    initialises transformWithStateInPandas) then need no copy of this package on
    their path: only pyspark, pandas and `services`, which the image installs.
    """
    from pyspark import cloudpickle

    import iot_jobs
    cloudpickle.register_pickle_by_value(iot_jobs)


# Options of every Kafka read of every job (the streams and the notifier's registry batches), after the
# KAFKA_OPTION_* ones so that no setting can change them (docs/architecture.md, "Delivery guarantees"):
#  - read_committed: MirrorMaker writes the relayed topics in transactions; an aborted one's records
#    would otherwise be read (a duplicate notification after a MirrorMaker restart). On the site's own
#    topics, written without transactions, it changes nothing.
#  - failOnDataLoss=false: with true, a record removed by retention before it was read (a job down for
#    longer than the topic's retention) or a deleted topic (a site taken out of the relay) fails the
#    query, and fails it again after every restart since the checkpoint still points there: every
#    site's jobs would stay down until someone edits the checkpoint, and the records are gone either
#    way. So such records are skipped; offset_regressions logs what the driver can see of it.
FIXED_SOURCE_OPTIONS = {
    "kafka.isolation.level": "read_committed",
    "failOnDataLoss": "false",
    "includeHeaders": "true",
}


def source_options(kafka_options: dict[str, str], subscription: dict[str, str],
                   starting: dict[str, str]) -> dict[str, str]:
    """The options of one Kafka read: connection (kafka_options), topics, where to start, FIXED_SOURCE_OPTIONS."""
    return {**kafka_options, **subscription, **starting, **FIXED_SOURCE_OPTIONS}


def read_kafka(spark: SparkSession, kafka: KafkaSettings, source: Source, whole_topic: bool = False,
               starting: dict | None = None) -> DataFrame:
    """The source's records from the checkpoint, or on a first start from where
    STARTING_OFFSETS says (whole_topic: from the beginning, for registries; starting: from these offsets,
    {topic: {partition: offset}})."""
    if starting is not None:
        first_start = {"startingOffsets": json.dumps(starting)}
    else:
        first_start = {"startingOffsets": "earliest"} if whole_topic else kafka.starting_options()
    return (spark.readStream.format("kafka")
            .options(**kafka.source_options(source.options(), first_start))
            .load())


def _partition_offsets(text: object) -> dict[tuple[str, str], int] | None:
    """A Kafka source's offsets in a progress report ('{"topic": {"0": 42}}', or that dict) by (topic, partition);
    None for anything else (another kind of source, no offsets yet)."""
    if isinstance(text, str):
        try:
            text = json.loads(text)
        except ValueError:
            try:
                text = ast.literal_eval(text)       # PySpark may give str(dict) instead of the JSON
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return None
    if not isinstance(text, dict):
        return None
    return {(topic, str(p)): o for topic, parts in text.items() if isinstance(parts, dict)
            for p, o in parts.items() if isinstance(o, int)}


def offset_regressions(start: object, end: object) -> list[str]:
    """What a micro-batch shows of skipped Kafka data (failOnDataLoss=false): partitions it started from that
    are gone at its end (a deleted topic), and partitions whose end offset is below their start (a topic
    deleted and created again). Records removed by retention before they were read do not show here."""
    begin, finish = _partition_offsets(start), _partition_offsets(end)
    if not begin or finish is None:
        return []
    found = []
    for (topic, partition), offset in sorted(begin.items()):
        if (topic, partition) not in finish:
            found.append(f"{topic}[{partition}] is gone at offset {offset}")
        elif finish[(topic, partition)] < offset:
            found.append(f"{topic}[{partition}] went back from offset {offset} to {finish[(topic, partition)]}")
    return found


def write_kafka(records: DataFrame, kafka: KafkaSettings, name: str, checkpoint_dir: str,
                topic: str | None = None, trigger: Option = TRIGGER_INTERVAL) -> DataStreamWriter:
    """records: key, value, optional headers, and `topic` unless `topic` is given; `trigger`: the setting
    of its micro-batch interval.

    Returns the writer; run_until_stopped starts it (and can start it again)."""
    writer = (records.writeStream.format("kafka").queryName(name)
              .options(**kafka.options)
              .option("checkpointLocation", checkpoint_dir)
              .outputMode("append"))
    if trigger_options(trigger):
        writer = writer.trigger(**trigger_options(trigger))
    if topic:
        writer = writer.option("topic", topic)
    return writer


# PySpark waits a fixed 10 s (PythonWorkerFactory, not configurable) for a new
# Python worker to connect back; transformWithStateInPandas starts one while it
# plans a query's first micro-batch. On a CPU-starved host the worker's imports
# take longer and the query fails before it ran. Starting the query again in
# this driver costs seconds; letting Swarm restart the JVM costs minutes of CPU
# and makes the starvation worse. The count is of failures in a row: a query that
# finished a micro-batch since its last failure starts counting again. Between
# attempts the driver waits (restart_delay), so a starved host gets its CPU back.
WORKER_START_FAILURES = ("Python worker failed to connect back", "CANNOT_OPEN_SOCKET")
WORKER_START_RETRIES = 10


_RESTART_BACKOFF = Backoff(1.0, 30.0)     # 1, 2, 4 ... 30 s


def restart_delay(failures: int) -> float:
    """Seconds to wait before starting a query again after `failures` worker-start failures in a row."""
    return _RESTART_BACKOFF.delay(failures)


def restart_reason(error: str, restarts: int) -> str | None:
    """Why a failed query may be started again in-process (restarts: failures in a row so far),
    or None (then the job exits)."""
    if restarts >= WORKER_START_RETRIES:
        return None
    return next((f"python worker start timed out ({marker})" for marker in WORKER_START_FAILURES
                 if marker in error), None)


def run_until_stopped(spark: SparkSession, writers: list[DataStreamWriter]) -> None:
    """Start the queries, wait for SIGTERM/SIGINT, then stop each between micro-batches and exit 0.

    A query that fails because its Python worker started too slowly is started
    again from its checkpoint (up to WORKER_START_RETRIES failures in a row,
    restart_delay apart); any other
    failure ends the job with the query's error, for Swarm to restart.

    The JVM owns the process that Docker signals (spark-submit), so SIGTERM is
    caught there with a JVM signal handler calling back into Python; the default
    JVM handler would run the shutdown hooks and cut a batch in half (replayed,
    so duplicated in Kafka, on restart).
    """
    stop_timeout = settings.value(STOP_TIMEOUT_SECONDS)   # read before anything starts: a bad value fails now
    stop = threading.Event()
    _catch_signals(spark, stop)
    queries = [writer.start() for writer in writers]
    log.info("started queries=%s", ",".join(q.name or q.id for q in queries))
    logged: dict[str, int] = {}
    failures = [0] * len(queries)          # worker-start failures in a row, per query
    while not stop.is_set():
        for i, query in enumerate(queries):
            if query.exception() is not None or not query.isActive:
                reason = restart_reason(str(query.exception()), failures[i])
                if reason is None:
                    raise RuntimeError(f"query {query.name} stopped: {query.exception()}")
                failures[i] += 1
                delay = restart_delay(failures[i])
                log.warning("restarting query=%s attempt=%d in=%.0fs reason=%s", query.name, failures[i], delay,
                            reason)
                if stop.wait(delay):
                    break
                query = queries[i] = writers[i].start()
            elif query.lastProgress is not None:
                failures[i] = 0            # it ran a micro-batch: the host has CPU again
            _log_progress(query, logged)
        stop.wait(1.0)
    log.info("stopping: signal received")
    for query in queries:
        deadline = time.monotonic() + stop_timeout
        # Let the running micro-batch commit first, so nothing is replayed.
        while query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.01)
        query.stop()
        log.info("stopped query=%s last_batch=%s", query.name,
                 (query.lastProgress or {}).get("batchId"))
    spark.stop()


_skipped: dict[str, int] = {}       # per query: Kafka partitions seen gone or reset (offset_regressions)


def _log_progress(query: StreamingQuery, logged: dict[str, int]) -> None:
    """One line per finished micro-batch (at most one per second and query): rows, rates, durations;
    and a warning with a running count for Kafka data the batch skipped."""
    progress = query.lastProgress
    if not progress or logged.get(query.name) == progress["batchId"]:
        return
    previous = logged.get(query.name)
    logged[query.name] = progress["batchId"]
    # Every batch since the last call is checked for skipped data; usually that is just this one.
    batches = [progress] if previous is None or progress["batchId"] == previous + 1 else [
        p for p in query.recentProgress if p["batchId"] > previous]
    for batch in batches:
        for source in batch.get("sources") or ():
            for problem in offset_regressions(source.get("startOffset"), source.get("endOffset")):
                _skipped[query.name] = _skipped.get(query.name, 0) + 1
                log.warning("kafka data skipped query=%s batch=%s skipped_total=%d: %s (failOnDataLoss=false)",
                            query.name, batch["batchId"], _skipped[query.name], problem)
    log.info("progress query=%s batch=%s rows=%s input_rate=%.0f processed_rate=%.0f state_rows=%s %s",
             query.name, progress["batchId"], progress.get("numInputRows"),
             progress.get("inputRowsPerSecond") or 0, progress.get("processedRowsPerSecond") or 0,
             sum(op.get("numRowsTotal", 0) for op in progress.get("stateOperators", [])), stage_fields(progress))


# The stages of a micro-batch as Spark reports them (durationMs), in the order they run; triggerExecution is
# the whole batch. state_commit is the state stores' commit (RocksDB checkpoint), part of addBatch.
STAGES = (("latestOffset", "offsets_ms"), ("queryPlanning", "planning_ms"), ("walCommit", "wal_ms"),
          ("getBatch", "get_batch_ms"), ("addBatch", "add_batch_ms"), ("commitOffsets", "commit_ms"),
          ("triggerExecution", "trigger_ms"))


def stage_fields(progress: dict) -> str:
    """'offsets_ms=3 planning_ms=40 ... trigger_ms=900 state_commit_ms=12': where a micro-batch's time went
    (stages Spark did not report are left out), for the log line and scripts/bench spark's breakdown."""
    durations = progress.get("durationMs") or {}
    fields = [f"{name}={durations[key]}" for key, name in STAGES if key in durations]
    operators = progress.get("stateOperators") or []
    if operators:
        fields.append(f"state_commit_ms={sum(op.get('commitTimeMs', 0) for op in operators)}")
    return " ".join(fields)


def _catch_signals(spark: SparkSession, stop: threading.Event) -> None:
    def on_signal(*_args: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if os.environ.get("PYSPARK_GATEWAY_PORT") is None:
        return  # Python launched the JVM (tests): the Python handlers above get the signal
    try:
        from pyspark.java_gateway import ensure_callback_server_started
        gateway = spark.sparkContext._gateway
        ensure_callback_server_started(gateway)
        jvm = spark.sparkContext._jvm
        handler = _JvmSignalHandler(stop)
        for name in ("TERM", "INT"):
            jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal(name), handler)
        _JvmSignalHandler.keep.append(handler)
    except Exception as err:  # noqa: BLE001 - fall back to the JVM's default (stop by shutdown hook)
        log.warning("cannot install the JVM signal handler, SIGTERM will not wait for the batch: %s", err)


class _JvmSignalHandler:
    keep: list[_JvmSignalHandler] = []   # py4j holds only a weak reference

    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop

    def handle(self, _signal: object) -> None:
        self._stop.set()

    class Java:
        implements = ["sun.misc.SignalHandler"]


def configure_logging() -> None:
    logging.basicConfig(level=settings.value(LOG_LEVEL),
                        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")


def main(run: Callable[[], None]) -> None:
    """A job's entry point: run() it; a bad setting exits 1 with 'configuration error: ...' before Spark starts."""
    try:
        run()
    except SettingsError as err:
        sys.exit(f"configuration error: {err}")
