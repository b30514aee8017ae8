"""What the datacenter still holds of an edge site that was removed, and its purge.

  iot-site-data report --site site-c --known-sites site-a,site-b --bootstrap kafka-1:9092 \\
      --cassandra-hosts cassandra-1 --keyspace iot --tables temperature_readings,devices
  iot-site-data purge  (same flags)

`report` changes nothing; `purge` deletes the site's topics, then its Cassandra partitions, and reports the
same figures. Both refuse a site in --known-sites (the sites the inventory still relays). What belongs to a
site, the logins, the output and the exit codes: at the end of --help (EPILOG). Tests:
tests/unit/commands/test_site_data.py, tests/integration/test_site_data.py; the playbook: docs/operations.md,
"Removing a site".
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable

from services.common import kafka_auth, settings
from services.common.cql_tls import cql_tls_context

PROG = "iot-site-data"
# The long help (`--help` ends with it).
EPILOG = """\
What belongs to a site at the datacenter:
- Kafka: the topics MirrorMaker made for it, named "<site>.<topic>" (DefaultReplicationPolicy: the
  relayed topics, "<site>.checkpoints.internal", "<site>.heartbeats"), and its flow's own state,
  "mm2-{configs,offsets,status,offset-syncs}.<site>.internal".
- Cassandra: the rows of --tables whose partition key holds site = <site>. Every table the adapter
  writes has `site` in its partition key (services/adapter/schema.py), so a purge deletes whole
  partitions: one DELETE per (site, ...) key, found with SELECT DISTINCT over the partition keys.

A site in --known-sites is refused: remove its group from the inventory and rerun site.yml on the
datacenter first, or MirrorMaker would copy it again.

Logins: --kafka-user and --cassandra-user (none: test clusters without logins); their passwords come
as one JSON object on stdin, {"kafka": "...", "cassandra": "..."}, never on a command line. With
--cassandra-tls the same object carries the Cassandra CA's PEM certificate as "cassandra_ca".

stdout is one JSON line:
  {"site": ..., "purged": bool, "topics": [...], "partitions": {table: partitions of the site}}
Progress and errors go to stderr. Exit codes: 0 done; 1 Kafka or Cassandra failed; 2 bad arguments.
"""
SITE_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")     # a site alias (preflight checks the inventory's)
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,47}$")   # a CQL keyspace or table name
# A flow's own topics at the datacenter: MM2's Connect state and, as offset-syncs.topic.location=target,
# its offset syncs (mm2.properties.j2).
FLOW_STATE = ("configs", "offsets", "status", "offset-syncs")


class UsageError(ValueError):
    """A flag is wrong; the message names it."""


class DataError(RuntimeError):
    """Kafka or Cassandra failed; the message says which and why."""


# ------------------------------------------------------------------ pure logic


def site_topics(site: str, topics: Iterable[str]) -> list[str]:
    """The datacenter topics that belong to `site` alone."""
    state = {f"mm2-{kind}.{site}.internal" for kind in FLOW_STATE}
    return sorted(t for t in topics if t.startswith(f"{site}.") or t in state)


def site_keys(site: str, partition_key: list[str], keys: Iterable[tuple]) -> list[tuple]:
    """The partition keys (values in `partition_key` order) whose site column is `site`."""
    at = partition_key.index("site")
    return sorted({k for k in keys if k[at] == site}, key=str)


def check_args(args: argparse.Namespace) -> None:
    if not SITE_RE.match(args.site):
        raise UsageError(f"--site {args.site!r} is not a site alias (lower-case letters, digits and '-')")
    known = [s for s in args.known_sites.split(",") if s]
    if args.site in known:
        raise UsageError(f"--site {args.site} is still one of the relayed sites ({', '.join(known)}): remove its "
                         "group from the inventory and rerun site.yml on the datacenter first")
    for name in [args.keyspace, *args.tables]:
        if not NAME_RE.match(name):
            raise UsageError(f"{name!r} is not a CQL keyspace or table name (--keyspace, --tables)")


# ------------------------------------------------------------------ Kafka and Cassandra


def _say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def kafka_topics(args: argparse.Namespace, password: str | None, delete: bool) -> list[str]:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    login = kafka_auth.overlay_config(args.kafka_user, password or "") if args.kafka_user else {}
    admin = AdminClient({"bootstrap.servers": args.bootstrap, **login})
    try:
        names = site_topics(args.site, admin.list_topics(timeout=60).topics)
    except KafkaException as err:
        raise DataError(f"Kafka at {args.bootstrap} did not list its topics: {err.args[0]}") from None
    if delete and names:
        failures = []
        for name, future in admin.delete_topics(names, operation_timeout=60, request_timeout=90).items():
            try:
                future.result()
                _say(f"deleted topic {name}")
            except KafkaException as err:
                failures.append(f"could not delete topic {name}: {err.args[0]}")
        if failures:
            raise DataError("\n".join(failures))
    return names


def cassandra_partitions(args: argparse.Namespace, password: str | None, delete: bool,
                         ca_pem: str = "") -> dict[str, int]:
    from cassandra import ConsistencyLevel
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import Cluster, NoHostAvailable
    from cassandra.query import SimpleStatement

    auth = PlainTextAuthProvider(args.cassandra_user, password or "") if args.cassandra_user else None
    cluster = Cluster(args.cassandra_hosts, port=args.cassandra_port, auth_provider=auth, protocol_version=5,
                      connect_timeout=15, ssl_context=cql_tls_context(ca_pem=ca_pem))
    try:
        session = cluster.connect()
    except NoHostAvailable as err:
        raise DataError(f"Cassandra at {','.join(args.cassandra_hosts)} did not answer: {err}") from None
    try:
        counts = {}
        for table in args.tables:
            rows = session.execute("SELECT column_name, kind, position FROM system_schema.columns "
                                   "WHERE keyspace_name=%s AND table_name=%s", (args.keyspace, table))
            key = [r.column_name for r in sorted(rows, key=lambda r: r.position) if r.kind == "partition_key"]
            if not key:
                _say(f"table {args.keyspace}.{table} does not exist; nothing of it to keep or purge")
                counts[table] = 0
                continue
            if "site" not in key:
                raise DataError(f"table {args.keyspace}.{table} has no site in its partition key {key}; "
                                "remove it from --tables")
            columns = ", ".join(key)
            scan = SimpleStatement(f"SELECT DISTINCT {columns} FROM {args.keyspace}.{table}", fetch_size=1000,
                                   consistency_level=ConsistencyLevel.LOCAL_QUORUM)
            keys = site_keys(args.site, key, (tuple(r) for r in session.execute(scan)))
            counts[table] = len(keys)
            if delete and keys:
                where = " AND ".join(f"{c}=?" for c in key)
                statement = session.prepare(f"DELETE FROM {args.keyspace}.{table} WHERE {where}")
                statement.consistency_level = ConsistencyLevel.LOCAL_QUORUM
                for values in keys:
                    session.execute(statement, values)
                _say(f"deleted {len(keys)} partition(s) of {args.site} from {args.keyspace}.{table}")
        return counts
    finally:
        cluster.shutdown()


def run(args: argparse.Namespace, passwords: dict[str, str]) -> dict:
    delete = args.command == "purge"
    topics = kafka_topics(args, passwords.get("kafka"), delete)
    partitions = cassandra_partitions(args, passwords.get("cassandra"), delete, passwords.get("cassandra_ca", ""))
    return {"site": args.site, "purged": delete, "topics": topics, "partitions": partitions}


# ------------------------------------------------------------------ CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_text in (("report", "list what the datacenter holds of the site; change nothing"),
                            ("purge", "delete the site's topics and Cassandra partitions at the datacenter")):
        c = sub.add_parser(name, help=help_text)
        c.add_argument("--site", required=True, help="alias of the removed site, e.g. site-c")
        c.add_argument("--known-sites", default="", help="sites the inventory still relays (comma-separated)")
        c.add_argument("--bootstrap", required=True, help="the datacenter's Kafka, e.g. kafka-1:9095")
        c.add_argument("--kafka-user", default="",
                       help="SCRAM login on the overlay (password on stdin; inside TLS with KAFKA_CA_FILE)")
        c.add_argument("--cassandra-hosts", required=True, type=lambda s: [h for h in s.split(",") if h],
                       help="contact points, e.g. cassandra-1,cassandra-2")
        c.add_argument("--cassandra-port", type=settings.integer(1, 65535), default=9042)
        c.add_argument("--cassandra-user", default="", help="Cassandra login (password on stdin)")
        c.add_argument("--cassandra-tls", action="store_true",
                       help="CQL over TLS, nodes checked against the CA certificate on stdin (\"cassandra_ca\")")
        c.add_argument("--keyspace", default="iot")
        c.add_argument("--tables", required=True, type=lambda s: [t for t in s.split(",") if t],
                       help="tables whose rows carry the site, comma-separated")
    return p.parse_args(argv)


def read_passwords(args: argparse.Namespace) -> dict[str, str]:
    if not (args.kafka_user or args.cassandra_user or args.cassandra_tls):
        return {}
    try:
        passwords = json.loads(sys.stdin.read() or "{}")
    except json.JSONDecodeError as err:
        raise UsageError(f'stdin must be one JSON object {{"kafka": ..., "cassandra": ...}}: {err}') from None
    for who in ("kafka", "cassandra"):
        if getattr(args, f"{who}_user") and not (isinstance(passwords, dict) and passwords.get(who)):
            raise UsageError(f"--{who}-user is set but stdin has no {who!r} password")
    if args.cassandra_tls and "BEGIN CERTIFICATE" not in str(passwords.get("cassandra_ca", "")):
        raise UsageError("--cassandra-tls is set but stdin has no 'cassandra_ca' (the Cassandra CA's PEM certificate)")
    return passwords


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        check_args(args)
        result = run(args, read_passwords(args))
    except UsageError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    except DataError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
