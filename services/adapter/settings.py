"""Settings of the Cassandra adapter: one typed class from flags, environment and secrets.

Every option (OPTIONS, a services.common.settings table) has a flag and an
environment variable (the flag wins); the Cassandra password is only ever
read from the secret `cassandra_password` (/run/secrets/cassandra_password or
CASSANDRA_PASSWORD_FILE).
"""
from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, dataclass
from typing import Any

from services.common import names, settings
from services.common.settings import Option, SettingsError, setting

_CONSISTENCY = ("ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM", "LOCAL_ONE", "ANY")


def _option(env: str = "", default: Any = None, help: str = "", type: Any = str, **kwargs: Any) -> Any:
    """A field of Settings that is an option; load() gives every field its value (no field default)."""
    return setting(env, default, help, type, field_default=MISSING, **kwargs)


# Each field is an option (services.common.settings.setting): its flag is --<name> and it reads the variable
# shown. load() turns cassandra_hosts and replication into their types and reads the password's secret.
@dataclass(frozen=True)
class Settings:
    kafka_bootstrap: str = _option("ADAPTER_KAFKA_BOOTSTRAP", "kafka-1:9092",
                                   "Kafka bootstrap servers, comma-separated host:port")
    group_id: str = _option("ADAPTER_GROUP_ID", names.CONSUMER_GROUPS["adapter"],
                            "consumer group; replicas with the same group split the partitions (the stacks set "
                            "<site>-cassandra-adapter, so no two tiers share a group)")
    # Static membership (KIP-345). A replica killed and restarted by Swarm rejoins under the same id and
    # gets its partitions back at once, where a new dynamic member waited for the dead one's session to
    # time out (~46 s of a partition's rows measured). The price: librdkafka sends no LeaveGroup for a
    # static member on close, so a replica that stops for good (a scale-down, a stack without that slot)
    # keeps its partitions unread until session_timeout_ms passes (docs/operations.md).
    group_instance_id: str = _option(
        "ADAPTER_GROUP_INSTANCE_ID", "",
        "static group membership (librdkafka group.instance.id): an id unique in the group and stable "
        "across restarts of a replica (the stacks set <site>-cassandra-adapter-{{.Task.Slot}}); a replica "
        "back within --session-timeout-ms gets its partitions again without a rebalance, but one that "
        "stops for good holds them until then (empty: dynamic membership)", settings.group_instance_id)
    session_timeout_ms: int = _option(
        "ADAPTER_SESSION_TIMEOUT_MS", 45000,
        "consumer group session timeout (librdkafka session.timeout.ms, 6000..300000): a member not heard "
        "from for this long loses its partitions; with a group instance id it is also how long a replica "
        "may be away and come back to them", settings.session_timeout_ms)
    mappings_file: str = _option(
        "ADAPTER_MAPPINGS_FILE", "",
        "TOML file of [[table]] topic-to-table mappings (empty: the edge defaults, see --print-schema)")
    cassandra_hosts: tuple[str, ...] = _option("ADAPTER_CASSANDRA_HOSTS", "cassandra-1",
                                               "Cassandra contact points, comma-separated host names")
    cassandra_port: int = _option("ADAPTER_CASSANDRA_PORT", 9042, "CQL port", int)
    cassandra_ca_file: str = _option(
        "ADAPTER_CASSANDRA_CA_FILE", "",
        "PEM file of the CA that issued the Cassandra nodes' certificates: CQL over TLS (empty: in clear)")
    local_dc: str = _option("ADAPTER_CASSANDRA_LOCAL_DC", "",
                            "data center the adapter writes to (empty: the contact points' data center)")
    username: str = _option(
        "ADAPTER_CASSANDRA_USERNAME", "",
        "Cassandra user (empty: no authentication); its password comes from the secret cassandra_password")
    password: str | None = _option(secret=True, name="cassandra_password",
                                   help="password of the Cassandra user, needed only with --username")
    keyspace: str = _option("ADAPTER_KEYSPACE", "iot", "keyspace, created if missing")
    replication: dict[str, int] = _option(
        "ADAPTER_REPLICATION", "dc1:1",
        "replication per data center for a new keyspace, e.g. dc1:3,dc2:1 (NetworkTopologyStrategy)")
    consistency: str = _option("ADAPTER_CONSISTENCY", "LOCAL_QUORUM", "write consistency level")
    default_site: str = _option(
        "ADAPTER_DEFAULT_SITE", "",
        "site of records with no site field, 'site' header or '<site>.' topic prefix (empty: dead-letter them)")
    window: int = _option(
        "ADAPTER_WINDOW", 10000,
        "most records consumed but not yet written (about 2 KB of memory each); consumption pauses beyond it",
        int)
    max_batch_rows: int = _option(
        "ADAPTER_MAX_BATCH_ROWS", 40,
        "most rows in one single-partition UNLOGGED batch (keep batches under Cassandra's 5 KB warning)", int)
    write_timeout: float = _option("ADAPTER_WRITE_TIMEOUT_S", 10.0, "seconds before a write is retried", float)
    commit_interval: float = _option("ADAPTER_COMMIT_INTERVAL_S", 1.0, "seconds between offset commits", float)
    dead_letter_topic: str = _option("ADAPTER_DEAD_LETTER_TOPIC", names.DEAD_LETTER,
                                     "topic for records that can never be written")
    metrics_port: int = _option("ADAPTER_METRICS_PORT", 9102, "port of /metrics and /healthz (0: off)", int)
    metrics_keystore: str = _option(
        "ADAPTER_METRICS_KEYSTORE", "", "PEM file (key, certificate, CA) of /metrics over TLS; empty: in clear")
    metrics_client_ca: str = _option(
        "ADAPTER_METRICS_CLIENT_CA", "", "CA whose certificates may scrape /metrics (with ADAPTER_METRICS_KEYSTORE)")
    log_level: str = _option("ADAPTER_LOG_LEVEL", "INFO", "DEBUG, INFO, WARNING or ERROR")


OPTIONS: tuple[Option, ...] = settings.options_of(Settings)


def parse_replication(text: str) -> dict[str, int]:
    """'dc1:3,dc2:1' -> {'dc1': 3, 'dc2': 1}."""
    result: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        dc, _, rf = part.partition(":")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", dc) or not rf.isdigit() or int(rf) < 1:
            raise SettingsError(f"ADAPTER_REPLICATION: '{part}' is not <dc>:<replicas> (e.g. dc1:3,dc2:1)")
        result[dc] = int(rf)
    if not result:
        raise SettingsError("ADAPTER_REPLICATION is empty (e.g. dc1:3)")
    return result


def parser() -> argparse.ArgumentParser:
    p = settings.build_parser(
        OPTIONS, prog="iot-cassandra-adapter",
        description="Consume Kafka topics and write them to Cassandra tables (at least once, offsets\n"
                    "committed after the rows are written; unwritable records go to dead-letter).")
    p.add_argument("--print-schema", action="store_true",
                   help="print the keyspace and table CQL for the configured mappings, then exit")
    return p


def load(args: argparse.Namespace) -> Settings:
    """The options of `args` (flags as text), else the environment, else defaults; SettingsError if bad."""
    values: dict[str, Any] = settings.resolve([o for o in OPTIONS if not o.secret], args)
    for name in ("window", "max_batch_rows", "cassandra_port"):
        if values[name] < 1:
            raise SettingsError(f"{name} must be at least 1, got {values[name]}")
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,47}", values["keyspace"]):
        raise SettingsError(f"ADAPTER_KEYSPACE={values['keyspace']!r} must be a lower-case CQL name like iot")
    consistency = values["consistency"].upper()
    if consistency not in _CONSISTENCY:
        raise SettingsError(f"ADAPTER_CONSISTENCY={consistency!r} (expected one of {', '.join(_CONSISTENCY)})")
    hosts = tuple(h.strip() for h in values["cassandra_hosts"].split(",") if h.strip())
    if not hosts:
        raise SettingsError("ADAPTER_CASSANDRA_HOSTS is empty")
    settings.readable_file("ADAPTER_CASSANDRA_CA_FILE", values["cassandra_ca_file"])
    settings.readable_pair(("ADAPTER_METRICS_KEYSTORE", "ADAPTER_METRICS_CLIENT_CA"),
                           (values["metrics_keystore"], values["metrics_client_ca"]))
    password = settings.secret("cassandra_password", required=bool(values["username"]))
    return Settings(**{**values, "cassandra_hosts": hosts, "consistency": consistency, "password": password,
                       "replication": parse_replication(values["replication"])})
