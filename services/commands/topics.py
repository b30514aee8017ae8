"""Create a site's missing Kafka topics with one AdminClient call; plan and set the topics' replication.

  iot-topics ensure --bootstrap kafka-1:9092,kafka-2:9092 --replication 2 --min-insync 1 \\
      --retention-ms 604800000 \\
      --spec '[{"name": "temperature-data", "partitions": 6, "cleanup": "delete"},
               {"name": "device-registration", "partitions": 1, "cleanup": "compact"}]'
  iot-topics reassignment --bootstrap ... --brokers 1,2,3 --replication 3 [--drain 4]
  iot-topics min-insync --bootstrap ... --min-insync 2

`ensure` creates every listed topic that does not exist yet and never alters an existing one; `reassignment`
prints a kafka-reassign-partitions plan and moves nothing itself; `min-insync` sets every topic's
min.insync.replicas, always below its replication factor. Each command exactly, the login, the output and the
exit codes: at the end of --help (EPILOG). Tests: tests/unit/commands/test_topics.py, test_replica_plan.py.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from services.commands.replica_plan import min_insync_for, plan_replicas
from services.common import kafka_auth, settings

PROG = "iot-topics"
# The long help of every command (`--help` ends with it).
EPILOG = """\
ensure: --spec is a JSON list of {name, partitions, cleanup (delete|compact), optional retention_ms}. The
tool waits (up to --wait-seconds) until the cluster answers with at least --replication brokers, then
creates every listed topic that does not exist yet in a single CreateTopics request: replication factor,
cleanup.policy, min.insync.replicas and, for cleanup=delete only, retention.ms (a topic's own retention_ms
wins over --retention-ms). Existing topics are never altered; one with fewer partitions or another
cleanup.policy than the spec gets a warning on stderr. --dry-run creates nothing (ansible-playbook --check).
--internal also creates Kafka's own __consumer_offsets and __transaction_state when they are missing, with
the same replication and min.insync.replicas, before a client makes a broker create them with the broker's
defaults. stdout is exactly one JSON line, lists sorted:
  {"existing": [...], "created": [...], "would_create": [...]}

reassignment prints (stdout, one line) the kafka-reassign-partitions plan that gives every topic, Kafka's
own included, at least --replication replicas spread evenly over --brokers (services/commands/replica_plan.py);
{"version": 1, "partitions": []} when nothing has to move. --drain lists brokers that are retiring: the plan
takes every replica off them (replication falls only where fewer brokers remain than a topic had replicas).
It moves nothing itself: the topics role hands the plan to kafka-reassign-partitions, which confluent-kafka
cannot replace.

min-insync sets every topic's min.insync.replicas to --min-insync, but always below its replication factor
(at least 1), and prints {"changed": [...], "unchanged": N}.

On a site whose brokers take SCRAM logins, the tool logs in as KAFKA_USERNAME with the password in the
file KAFKA_PASSWORD_FILE (the stack runs it as the site's admin principal, password on stdin:
KAFKA_PASSWORD_FILE=/dev/stdin), inside TLS to SERVICES with KAFKA_CA_FILE (the site's brokers CA).

Progress, warnings and errors go to stderr. Exit codes: 0 done; 1 Kafka did not answer in time or refused
a topic; 2 bad arguments or a bad spec.
"""
CLEANUP_POLICIES = ("delete", "compact")
SPEC_FIELDS = ("name", "partitions", "cleanup", "retention_ms")
# Kafka's own rule (org.apache.kafka.common.internals.Topic): 1-249 of these, not "." or "..".
TOPIC_NAME_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
PROGRESS_EVERY_S = 10.0
CREATE_ATTEMPTS = 5          # one request, plus retries of retriable errors only
CREATE_RETRY_DELAY_S = 5.0
# Kafka's own topics as its brokers would create them (Kafka 3.9 GroupMetadataManager.offsetsTopicConfigs,
# TransactionStateManager.transactionTopicConfigs, with the default partition and segment sizes).
INTERNAL_TOPICS: dict[str, tuple[int, dict[str, str]]] = {
    "__consumer_offsets": (50, {"cleanup.policy": "compact", "compression.type": "producer",
                                "segment.bytes": "104857600"}),
    "__transaction_state": (50, {"cleanup.policy": "compact", "compression.type": "uncompressed",
                                 "segment.bytes": "104857600", "unclean.leader.election.enable": "false"}),
}


class SpecError(ValueError):
    """The spec or a flag is wrong; the message names the field and what it should be."""


class TopicsError(RuntimeError):
    """Kafka did not answer in time or refused a topic; the message says which and why."""


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    cleanup: str
    retention_ms: int | None = None


@dataclass(frozen=True)
class ExistingTopic:
    partitions: int
    cleanup: str | None = None   # None: its configs could not be read


@dataclass(frozen=True)
class NewTopicPlan:
    name: str
    partitions: int
    replication: int
    config: dict[str, str]

    def describe(self) -> str:
        configs = ", ".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{self.name} ({self.partitions} partitions, replication {self.replication}, {configs})"


@dataclass
class Plan:
    create: list[NewTopicPlan] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ pure logic


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def topic_name_error(name: Any) -> str | None:
    """Why `name` is not a legal Kafka topic name, or None when it is."""
    if not isinstance(name, str) or not name:
        return f"must be a non-empty string (got {name!r})"
    if name in (".", ".."):
        return f"{name!r} is not a legal Kafka topic name ('.' and '..' are reserved)"
    if len(name) > 249:
        return f"is {len(name)} characters long; a Kafka topic name has at most 249"
    if not TOPIC_NAME_RE.match(name):
        return f"{name!r} is not a legal Kafka topic name: use only letters, digits, '.', '_' and '-'"
    return None


def validate_spec(raw: Any) -> list[TopicSpec]:
    """The topics of a decoded --spec; raises SpecError listing every bad field."""
    if not isinstance(raw, list):
        raise SpecError(f"spec: must be a JSON list of topics, got {type(raw).__name__}")
    errors: list[str] = []
    topics: list[TopicSpec] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(raw, start=1):
        where = f"spec[{i}]"
        if not isinstance(item, dict):
            errors.append(f"{where}: must be an object with {', '.join(SPEC_FIELDS)}, got {item!r}")
            continue
        if isinstance(item.get("name"), str):
            where += f" ({item['name']})"
        item_errors = [f"{where}: unknown field {key!r} (fields: {', '.join(SPEC_FIELDS)})"
                       for key in item if key not in SPEC_FIELDS]
        name = item.get("name")
        if "name" not in item:
            item_errors.append(f"{where}.name: missing; every topic needs a name")
        elif (why := topic_name_error(name)) is not None:
            item_errors.append(f"{where}.name: {why}")
        elif name in seen:
            item_errors.append(f"{where}.name: {name!r} is listed twice (also spec[{seen[name]}])")
        partitions = item.get("partitions")
        if not _is_int(partitions) or partitions < 1:
            item_errors.append(f"{where}.partitions: must be a whole number of 1 or more (got {partitions!r})")
        cleanup = item.get("cleanup")
        if cleanup not in CLEANUP_POLICIES:
            item_errors.append(f"{where}.cleanup: must be one of {', '.join(CLEANUP_POLICIES)} (got {cleanup!r})")
        retention = item.get("retention_ms")
        if retention is not None:
            if not _is_int(retention) or retention < -1:
                item_errors.append(f"{where}.retention_ms: must be a whole number of milliseconds, "
                                   f"or -1 for no limit (got {retention!r})")
            elif cleanup == "compact":
                item_errors.append(f"{where}.retention_ms: applies only to cleanup=delete; "
                                   "remove it from this compacted topic")
        if item_errors:
            errors += item_errors
            continue
        seen[name] = i
        topics.append(TopicSpec(name, partitions, cleanup, retention))
    if errors:
        raise SpecError("\n".join(errors))
    return topics


def parse_spec(text: str) -> list[TopicSpec]:
    """--spec text -> topics; raises SpecError naming what is wrong."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise SpecError(f"spec: not valid JSON: {err}") from None
    return validate_spec(raw)


def check_settings(replication: int, min_insync: int, retention_ms: int | None) -> None:
    """The cluster-wide flags; raises SpecError naming the flag."""
    if replication < 1:
        raise SpecError(f"--replication must be 1 or more (got {replication})")
    if not 1 <= min_insync <= replication:
        raise SpecError(f"--min-insync must be between 1 and --replication ({replication}) (got {min_insync})")
    if retention_ms is not None and retention_ms < -1:
        raise SpecError(f"--retention-ms must be milliseconds, or -1 for no limit (got {retention_ms})")


def topic_config(topic: TopicSpec, min_insync: int, retention_ms: int | None) -> dict[str, str]:
    """Configs a new topic is created with; retention.ms only where old records are deleted."""
    config = {"cleanup.policy": topic.cleanup, "min.insync.replicas": str(min_insync)}
    if topic.cleanup == "delete":
        retention = topic.retention_ms if topic.retention_ms is not None else retention_ms
        if retention is not None:
            config["retention.ms"] = str(retention)
    return config


def drift_warnings(topic: TopicSpec, actual: ExistingTopic) -> list[str]:
    """How an existing topic differs from the spec in what this tool would not change."""
    warnings = []
    if actual.partitions < topic.partitions:
        warnings.append(f"topic {topic.name} has {actual.partitions} partitions, the spec wants {topic.partitions}; "
                        "left as it is (add partitions with kafka-topics --alter)")
    if actual.cleanup is not None:
        policies = {p.strip() for p in actual.cleanup.split(",") if p.strip()}
        if policies != {topic.cleanup}:
            warnings.append(f"topic {topic.name} has cleanup.policy={actual.cleanup}, the spec wants {topic.cleanup}; "
                            "left as it is")
    return warnings


def plan_topics(spec: list[TopicSpec], existing: dict[str, ExistingTopic], replication: int, min_insync: int,
                retention_ms: int | None) -> Plan:
    """Which topics to create and with what configs; drift warnings for the existing ones."""
    plan = Plan()
    for topic in spec:
        if topic.name in existing:
            plan.existing.append(topic.name)
            plan.warnings += drift_warnings(topic, existing[topic.name])
        else:
            plan.create.append(NewTopicPlan(topic.name, topic.partitions, replication,
                                            topic_config(topic, min_insync, retention_ms)))
    plan.existing.sort()
    return plan


def plan_internal_topics(present: set[str], replication: int, min_insync: int) -> list[NewTopicPlan]:
    """Kafka's own topics that are missing, with the site's replication rather than the broker's default."""
    return [NewTopicPlan(name, partitions, replication, {**config, "min.insync.replicas": str(min_insync)})
            for name, (partitions, config) in INTERNAL_TOPICS.items() if name not in present]


def parse_brokers(text: str, flag: str = "--brokers") -> list[int]:
    """--brokers "1,2,3" -> [1, 2, 3]; SpecError naming the flag otherwise."""
    try:
        brokers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        brokers = []
    if not brokers or len(set(brokers)) != len(brokers) or min(brokers) < 0:
        raise SpecError(f"{flag} must list distinct broker ids separated by commas, e.g. 1,2,3 (got {text!r})")
    return brokers


def result_line(existing: list[str], created: list[str], would_create: list[str]) -> str:
    return json.dumps({"existing": sorted(existing), "created": sorted(created),
                       "would_create": sorted(would_create)})


# ------------------------------------------------------------------ Kafka


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


_RDKAFKA_PREFIX = re.compile(r"^\S+ \[[^\]]*\] \[thrd:[^\]]*\]: ")


class _LastMessage(logging.Handler):
    """Keeps librdkafka's latest log line for progress and error messages instead of printing them all."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.log: str | None = None      # latest log line (e.g. "Failed to resolve 'kafka-1:9092' ...")
        self.error: str | None = None    # latest error callback (e.g. "1/1 brokers are down")

    def emit(self, record: logging.LogRecord) -> None:
        # "FAIL [rdkafka#producer-1] [thrd:kafka-1:9092/bootstrap]: kafka-1:9092/bootstrap: Failed to ..."
        self.log = _RDKAFKA_PREFIX.sub("", record.getMessage())

    @property
    def last(self) -> str | None:
        return self.log or self.error


def admin_client(bootstrap: str, quiet: _LastMessage, login: dict[str, str] | None = None):
    """An AdminClient of `bootstrap` whose librdkafka messages go to `quiet`; `login`: the settings of
    its SCRAM login on the overlay (kafka_auth.internal_config), none on a plaintext test cluster."""
    from confluent_kafka.admin import AdminClient

    logger = logging.getLogger(f"{PROG}.librdkafka")
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    logger.handlers = [quiet]
    return AdminClient({"bootstrap.servers": bootstrap, "logger": logger,
                        "error_cb": lambda err: setattr(quiet, "error", err.str()), **(login or {})})


def wait_for_brokers(admin, bootstrap: str, needed: int, wait_seconds: float, quiet: _LastMessage,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
    """Cluster metadata once at least `needed` brokers are registered; TopicsError after wait_seconds."""
    from confluent_kafka import KafkaException

    started = clock()
    deadline = started + wait_seconds
    last_report = started
    problem = "no answer yet"
    while True:
        remaining = deadline - clock()
        try:
            metadata = admin.list_topics(timeout=max(1.0, min(8.0, remaining)))
            if len(metadata.brokers) >= needed:
                return metadata
            problem = f"{len(metadata.brokers)} of {needed} brokers registered"
        except KafkaException as err:
            problem = err.args[0].str() if err.args and hasattr(err.args[0], "str") else str(err)
        admin.poll(0)  # serves the log and error callbacks
        detail = f"{problem}; librdkafka: {quiet.last}" if quiet.last else problem
        now = clock()
        if now >= deadline:
            raise TopicsError(f"Kafka at {bootstrap} did not answer with {needed} broker(s) within "
                              f"{wait_seconds:.0f}s ({detail})")
        sleep(min(2.0, deadline - now))
        now = clock()
        if now - last_report >= PROGRESS_EVERY_S and now < deadline:
            _say(f"waiting for Kafka at {bootstrap} ({now - started:.0f}s of {wait_seconds:.0f}s): {detail}")
            last_report = now


def read_existing(admin, metadata, names: list[str]) -> tuple[dict[str, ExistingTopic], list[str]]:
    """Partitions and cleanup.policy of those of `names` that exist; warnings for configs not readable."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    present = [n for n in names if n in metadata.topics]
    cleanup: dict[str, str | None] = dict.fromkeys(present)
    warnings = []
    if present:
        futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in present],
                                         request_timeout=60)
        for resource, future in futures.items():
            try:
                entry = future.result().get("cleanup.policy")
                cleanup[resource.name] = entry.value if entry is not None else None
            except KafkaException as err:
                warnings.append(f"could not read the configs of topic {resource.name}: {err.args[0]}")
    existing = {n: ExistingTopic(len(metadata.topics[n].partitions), cleanup[n]) for n in present}
    return existing, warnings


def _retriable(kerr) -> bool:
    """Per-topic admin results do not carry librdkafka's retriable flag, so the codes are listed."""
    from confluent_kafka import KafkaError

    return kerr.retriable() or kerr.code() in (
        KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError.NOT_CONTROLLER,
        KafkaError.LEADER_NOT_AVAILABLE, KafkaError.BROKER_NOT_AVAILABLE)


def create_topics(admin, topics: list[NewTopicPlan], deadline: float,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> tuple[list[str], list[str]]:
    """(created, already there) after one CreateTopics request (retried only for retriable errors)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    created: list[str] = []
    raced: list[str] = []
    pending = {t.name: t for t in topics}
    timed_out: set[str] = set()   # a retriable failure may still have created the topic
    for attempt in range(1, CREATE_ATTEMPTS + 1):
        futures = admin.create_topics([NewTopic(t.name, num_partitions=t.partitions,
                                                replication_factor=t.replication, config=t.config)
                                       for t in pending.values()], operation_timeout=30, request_timeout=60)
        retry: dict[str, NewTopicPlan] = {}
        failures: list[str] = []
        for name, future in futures.items():
            try:
                future.result()
                created.append(name)
            except KafkaException as err:
                kerr = err.args[0]
                if kerr.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    (created if name in timed_out else raced).append(name)
                elif _retriable(kerr) and attempt < CREATE_ATTEMPTS and clock() < deadline:
                    _say(f"creating topic {name}: {kerr.name()}: {kerr.str()}; retrying")
                    retry[name] = pending[name]
                    timed_out.add(name)
                else:
                    failures.append(f"could not create topic {name}: {kerr.name()}: {kerr.str()}")
        if failures:
            raise TopicsError("\n".join(failures))
        if not retry:
            break
        pending = retry
        sleep(CREATE_RETRY_DELAY_S)
    return created, raced


def ensure(args: argparse.Namespace) -> int:
    spec = parse_spec(args.spec)
    check_settings(args.replication, args.min_insync, args.retention_ms)
    quiet = _LastMessage()
    admin = admin_client(args.bootstrap, quiet, kafka_auth.internal_config())
    deadline = time.monotonic() + args.wait_seconds
    metadata = wait_for_brokers(admin, args.bootstrap, args.replication, args.wait_seconds, quiet)
    existing, warnings = read_existing(admin, metadata, [t.name for t in spec])
    plan = plan_topics(spec, existing, args.replication, args.min_insync, args.retention_ms)
    if args.internal:
        internal = plan_internal_topics(set(metadata.topics), args.replication, args.min_insync)
        plan.create += internal
        plan.existing += sorted(set(INTERNAL_TOPICS) - {t.name for t in internal})
    for warning in warnings + plan.warnings:
        _say(f"warning: {warning}")
    if args.dry_run:
        for topic in plan.create:
            _say(f"would create {topic.describe()}")
        print(result_line(plan.existing, [], [t.name for t in plan.create]))
        return 0
    created, raced = create_topics(admin, plan.create, deadline) if plan.create else ([], [])
    by_name = {t.name: t for t in plan.create}
    for name in sorted(created):
        _say(f"created {by_name[name].describe()}")
    for name in sorted(raced):
        _say(f"topic {name} was created by someone else meanwhile; left as it is")
    print(result_line(plan.existing + raced, created, []))
    return 0


def current_assignment(metadata) -> dict[str, dict[int, list[int]]]:
    """Every topic's partitions and their replicas (first: preferred leader), Kafka's own included."""
    return {name: {p: list(part.replicas) for p, part in topic.partitions.items()}
            for name, topic in metadata.topics.items()}


def reassignment(args: argparse.Namespace) -> int:
    brokers = parse_brokers(args.brokers)
    if not 1 <= args.replication <= len(brokers):
        raise SpecError(f"--replication must be between 1 and the {len(brokers)} --brokers (got {args.replication})")
    drain = parse_brokers(args.drain, "--drain") if args.drain else []
    if set(drain) & set(brokers):
        raise SpecError(f"--drain {args.drain} names broker(s) of --brokers {args.brokers}: "
                        f"{sorted(set(drain) & set(brokers))} cannot both stay and retire")
    quiet = _LastMessage()
    admin = admin_client(args.bootstrap, quiet, kafka_auth.internal_config())
    metadata = wait_for_brokers(admin, args.bootstrap, len(brokers), args.wait_seconds, quiet)
    missing = sorted(set(brokers) - set(metadata.brokers))
    if missing:
        raise TopicsError(f"broker(s) {missing} of --brokers are not registered at {args.bootstrap} "
                          f"(registered: {sorted(metadata.brokers)})")
    current = current_assignment(metadata)
    gone = sorted(set(drain) - set(metadata.brokers))
    if gone:
        _say(f"warning: retiring broker(s) {gone} are not registered: a partition whose only replicas were "
             "on them has no copy to move")
    plan = plan_replicas(current, brokers, args.replication, drain)
    for note in plan.notes:
        _say(f"warning: {note}")
    for line in plan.summary(current):
        _say(f"plan: {line}")
    if not plan.moves:
        _say(f"every topic has {args.replication} replicas or more, spread over brokers {sorted(brokers)}"
             + (f", none on retiring broker(s) {sorted(drain)}" if drain else ""))
    print(plan.kafka_json())
    return 0


def min_insync(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    if args.min_insync < 1:
        raise SpecError(f"--min-insync must be 1 or more (got {args.min_insync})")
    quiet = _LastMessage()
    admin = admin_client(args.bootstrap, quiet, kafka_auth.internal_config())
    metadata = wait_for_brokers(admin, args.bootstrap, 1, args.wait_seconds, quiet)
    wanted = {name: str(min_insync_for(min(len(p.replicas) for p in topic.partitions.values()), args.min_insync))
              for name, topic in metadata.topics.items() if topic.partitions}
    current: dict[str, str | None] = {}
    for resource, future in admin.describe_configs(
            [ConfigResource(ResourceType.TOPIC, name) for name in sorted(wanted)], request_timeout=60).items():
        try:
            entry = future.result().get("min.insync.replicas")
        except KafkaException as err:   # e.g. a topic deleted since the metadata was read
            _say(f"warning: could not read the configs of topic {resource.name}: {err.args[0]}; left as it is")
            del wanted[resource.name]
            continue
        current[resource.name] = entry.value if entry is not None else None
    changes = sorted(name for name in wanted if current.get(name) != wanted[name])
    if changes:
        futures = admin.incremental_alter_configs([
            ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
                ConfigEntry("min.insync.replicas", wanted[name],
                            incremental_operation=AlterConfigOpType.SET)]) for name in changes],
            request_timeout=60)
        failures = []
        for resource, future in futures.items():
            try:
                future.result()
                _say(f"{resource.name}: min.insync.replicas {current.get(resource.name)} -> {wanted[resource.name]}")
            except KafkaException as err:
                failures.append(f"could not set min.insync.replicas of {resource.name}: {err.args[0]}")
        if failures:
            raise TopicsError("\n".join(failures))
    print(json.dumps({"changed": changes, "unchanged": len(wanted) - len(changes)}))
    return 0


# ------------------------------------------------------------------ CLI


# Options of `ensure`: --<name> flags, each also read from the variable shown (services/common/settings.py).
OPTIONS: tuple[settings.Option, ...] = (
    settings.Option("bootstrap", "TOPICS_BOOTSTRAP", None, "Kafka bootstrap servers, e.g. kafka-1:9092,kafka-2:9092",
                    required=True),
    settings.Option("spec", "TOPICS_SPEC", None,
                    'JSON list of {"name", "partitions", "cleanup": "delete"|"compact", optional "retention_ms"}',
                    required=True),
    settings.Option("replication", "TOPICS_REPLICATION", 1, "replication factor of new topics", int),
    settings.Option("min_insync", "TOPICS_MIN_INSYNC", 1, "min.insync.replicas of new topics", int),
    settings.Option("retention_ms", "TOPICS_RETENTION_MS", None,
                    "retention.ms of new cleanup=delete topics without their own retention_ms "
                    "(unset: the broker's)", int),
    settings.Option("wait_seconds", "TOPICS_WAIT_SECONDS", 600.0,
                    "how long to wait for the cluster to answer with --replication brokers", float),
)


_BOOTSTRAP, _WAIT = OPTIONS[0], OPTIONS[-1]     # shared with the other commands
REASSIGNMENT_OPTIONS: tuple[settings.Option, ...] = (
    _BOOTSTRAP,
    settings.Option("brokers", "TOPICS_BROKERS", None, "the site's broker ids, e.g. 1,2,3", required=True),
    settings.Option("replication", "TOPICS_REPLICATION", 1, "replication factor every topic gets at least", int),
    settings.Option("drain", "TOPICS_DRAIN", "",
                    "retiring broker ids, e.g. 4: every replica moves off them (empty: none)"),
    settings.Option("wait_seconds", "TOPICS_WAIT_SECONDS", 600.0,
                    "how long to wait for every broker of --brokers to register", float),
)
MIN_INSYNC_OPTIONS: tuple[settings.Option, ...] = (
    _BOOTSTRAP,
    settings.Option("min_insync", "TOPICS_MIN_INSYNC", 1,
                    "min.insync.replicas of every topic (always below its replication factor, at least 1)", int),
    _WAIT,
)
COMMANDS = {
    "ensure": (OPTIONS, ensure, "create the spec's missing topics, leave existing ones alone"),
    "reassignment": (REASSIGNMENT_OPTIONS, reassignment,
                     "print the kafka-reassign-partitions plan that spreads every topic over the brokers"),
    "min-insync": (MIN_INSYNC_OPTIONS, min_insync, "set every topic's min.insync.replicas"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    parsers = {}
    for name, (options, _, help_text) in COMMANDS.items():
        parsers[name] = sub.add_parser(name, help=help_text, epilog=settings.epilog(options),
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        settings.add_options(parsers[name], options)
    parsers["ensure"].add_argument("--dry-run", action="store_true", help="print what would be created, create nothing")
    parsers["ensure"].add_argument("--internal", action="store_true",
                                   help="also create __consumer_offsets and __transaction_state when missing")
    args = p.parse_args(argv)
    try:
        return settings.apply(parsers[args.command], COMMANDS[args.command][0], args)
    except settings.SettingsError as err:   # a bad variable: a usage error too (exit 2)
        parsers[args.command].error(str(err))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except (SpecError, settings.SettingsError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except TopicsError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
