"""The adapter's Cassandra session and schema: connecting (retried until Cassandra answers), the
keyspace/table DDL (built by adapter.schema) that the adapter creates at start and --print-schema shows,
and the columns it adds at start to tables created before their layout gained them.

Note: `import cassandra` inside the services.adapter package still means the driver (imports are
absolute); only running a file of this directory as a script would shadow it.
"""
from __future__ import annotations

import logging
import time
from typing import Protocol

from services.adapter.mappings import Mapping
from services.adapter.schema import add_columns_cql, create_keyspace_cql, create_table_cql
from services.adapter.settings import Settings
from services.common.backoff import Backoff
from services.common.cql_tls import cql_tls_context
from services.common.observability import kv

log = logging.getLogger("cassandra-adapter")

CONNECT_RETRY_MIN_S, CONNECT_RETRY_MAX_S = 1.0, 15.0


class Stop(Protocol):
    def is_set(self) -> bool: ...


def schema_statements(settings: Settings, mappings: tuple[Mapping, ...]) -> list[str]:
    tables = {m.table: m.layout for m in mappings}
    return [create_keyspace_cql(settings.keyspace, settings.replication)] + [
        create_table_cql(settings.keyspace, table, lay) for table, lay in tables.items()]


def missing_column_statements(session, settings: Settings, mappings: tuple[Mapping, ...]) -> list[str]:
    """ALTER TABLE statements for the columns the keyspace's existing tables lack (adapter.schema.add_columns_cql),
    from what system_schema lists now."""
    rows = session.execute("SELECT table_name, column_name FROM system_schema.columns WHERE keyspace_name = %s",
                           (settings.keyspace,), timeout=60)
    existing: dict[str, set[str]] = {}
    for row in rows:
        existing.setdefault(row.table_name, set()).add(row.column_name)
    tables = {m.table: m.layout for m in mappings}
    return [statement for table, lay in tables.items()
            for statement in add_columns_cql(settings.keyspace, table, lay, existing.get(table, set()))]


def connect_cassandra(settings: Settings, stop: Stop):
    """A driver session, retrying until Cassandra answers (Swarm starts services in any order)."""
    from cassandra import ConsistencyLevel, UnresolvableContactPoints
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, NoHostAvailable
    from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy, TokenAwarePolicy

    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=settings.local_dc or None)),
        consistency_level=ConsistencyLevel.name_to_value[settings.consistency],
        request_timeout=settings.write_timeout)
    auth = PlainTextAuthProvider(settings.username, settings.password) if settings.username else None
    tls = cql_tls_context(settings.cassandra_ca_file)
    backoff = Backoff(CONNECT_RETRY_MIN_S, CONNECT_RETRY_MAX_S)
    while not stop.is_set():
        cluster = None
        try:
            # Reconnect within 10 s after an outage; the driver's default backs off to 10 minutes.
            # In Swarm a service's name resolves only once its task is healthy, so even
            # the contact points may be unresolvable for a while.
            cluster = Cluster(list(settings.cassandra_hosts), port=settings.cassandra_port, auth_provider=auth,
                              ssl_context=tls, execution_profiles={EXEC_PROFILE_DEFAULT: profile}, protocol_version=5,
                              reconnection_policy=ExponentialReconnectionPolicy(0.5, 10.0), connect_timeout=10)
            session = cluster.connect()
            # The coordinator stamps each write with its own clock when it applies it (not the driver when
            # it sends): a row's WRITETIME is then when Cassandra stored it, and WRITETIME(temperature)/1000
            # minus the event time is the device-to-stored latency, where write_latency_ms is taken before
            # the write is sent (docs/architecture.md, "Inside the adapter"). Rows are never updated, so
            # last-write-wins by the coordinator's clock changes nothing.
            session.use_client_timestamp = False
            return session
        except (NoHostAvailable, UnresolvableContactPoints, OSError) as err:
            if cluster is not None:
                cluster.shutdown()
            delay = backoff.next()
            log.warning("cassandra not reachable, retrying", extra=kv(
                hosts=",".join(settings.cassandra_hosts), retry_s=delay, error=str(err)[:300]))
            time.sleep(delay)
    return None
