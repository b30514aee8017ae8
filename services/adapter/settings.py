"""Settings of the Cassandra adapter: one typed class from flags, environment and secrets.

Every option has a flag and an environment variable (the flag wins); the
Cassandra password is only ever read from the secret `cassandra_password`
(/run/secrets/cassandra_password or CASSANDRA_PASSWORD_FILE).
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

from services.common import names
from services.common.settings import SettingsError, env, secret

# (flag/attribute, environment variable, default, type, help)
OPTIONS: tuple[tuple[str, str, Any, type, str], ...] = (
    ("kafka_bootstrap", "ADAPTER_KAFKA_BOOTSTRAP", "kafka-1:9092", str,
     "Kafka bootstrap servers, comma-separated host:port"),
    ("group_id", "ADAPTER_GROUP_ID", "cassandra-adapter", str,
     "consumer group; replicas with the same group split the partitions"),
    ("mappings_file", "ADAPTER_MAPPINGS_FILE", "", str,
     "TOML file of [[table]] topic-to-table mappings (empty: the edge defaults, see --print-schema)"),
    ("cassandra_hosts", "ADAPTER_CASSANDRA_HOSTS", "cassandra-1", str,
     "Cassandra contact points, comma-separated host names"),
    ("cassandra_port", "ADAPTER_CASSANDRA_PORT", 9042, int, "CQL port"),
    ("local_dc", "ADAPTER_CASSANDRA_LOCAL_DC", "", str,
     "data center the adapter writes to (empty: the contact points' data center)"),
    ("username", "ADAPTER_CASSANDRA_USERNAME", "", str,
     "Cassandra user (empty: no authentication); its password comes from the secret cassandra_password"),
    ("keyspace", "ADAPTER_KEYSPACE", "iot", str, "keyspace, created if missing"),
    ("replication", "ADAPTER_REPLICATION", "dc1:1", str,
     "replication per data center for a new keyspace, e.g. dc1:3,dc2:1 (NetworkTopologyStrategy)"),
    ("consistency", "ADAPTER_CONSISTENCY", "LOCAL_QUORUM", str, "write consistency level"),
    ("default_site", "ADAPTER_DEFAULT_SITE", "", str,
     "site of records with no site field, 'site' header or '<site>.' topic prefix (empty: dead-letter them)"),
    ("window", "ADAPTER_WINDOW", 10000, int,
     "most records consumed but not yet written (about 2 KB of memory each); consumption pauses beyond it"),
    ("max_batch_rows", "ADAPTER_MAX_BATCH_ROWS", 40, int,
     "most rows in one single-partition UNLOGGED batch (keep batches under Cassandra's 5 KB warning)"),
    ("write_timeout", "ADAPTER_WRITE_TIMEOUT_S", 10.0, float, "seconds before a write is retried"),
    ("commit_interval", "ADAPTER_COMMIT_INTERVAL_S", 1.0, float, "seconds between offset commits"),
    ("dead_letter_topic", "ADAPTER_DEAD_LETTER_TOPIC", names.DEAD_LETTER, str,
     "topic for records that can never be written"),
    ("metrics_port", "ADAPTER_METRICS_PORT", 9102, int, "port of /metrics and /healthz (0: off)"),
    ("log_level", "ADAPTER_LOG_LEVEL", "INFO", str, "DEBUG, INFO, WARNING or ERROR"),
)
_CONSISTENCY = ("ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM", "LOCAL_ONE", "ANY")


@dataclass(frozen=True)
class Settings:
    kafka_bootstrap: str
    group_id: str
    mappings_file: str
    cassandra_hosts: tuple[str, ...]
    cassandra_port: int
    local_dc: str
    username: str
    password: str | None
    keyspace: str
    replication: dict[str, int]
    consistency: str
    default_site: str
    window: int
    max_batch_rows: int
    write_timeout: float
    commit_interval: float
    dead_letter_topic: str
    metrics_port: int
    log_level: str


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
    p = argparse.ArgumentParser(
        prog="iot-cassandra-adapter",
        description="Consume Kafka topics and write them to Cassandra tables (at least once, offsets "
                    "committed after the rows are written; unwritable records go to dead-letter).",
        epilog="Every option also reads the environment variable shown; the flag wins. The Cassandra password "
               "is read from the secret cassandra_password (/run/secrets or CASSANDRA_PASSWORD_FILE).")
    for name, var, default, _kind, text in OPTIONS:
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar=var,
                       help=f"{text} [env {var}, default {default!r}]")
    p.add_argument("--print-schema", action="store_true",
                   help="print the keyspace and table CQL for the configured mappings, then exit")
    return p


def load(args: argparse.Namespace) -> Settings:
    values: dict[str, Any] = {}
    for name, var, default, kind, _ in OPTIONS:
        raw = getattr(args, name)
        if raw is None:
            values[name] = env(var, default, kind)
        else:
            try:
                values[name] = kind(raw)
            except ValueError:
                raise SettingsError(f"--{name.replace('_', '-')}={raw!r} is not a valid {kind.__name__}") from None
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
    password = secret("cassandra_password", required=bool(values["username"]))
    return Settings(**{**values, "cassandra_hosts": hosts, "consistency": consistency, "password": password,
                       "replication": parse_replication(values["replication"])})
