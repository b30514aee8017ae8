"""Cassandra table layouts of the adapter and the mapping from contract records to rows.

Pure Python (no driver import) so the unit tests can check every row. A layout belongs to a contract; the
table name comes from the adapter's mappings.

Time series (readings, threshold events, rollups) are partitioned by ((site, sensor_id, day)), one partition
per sensor and UTC day, and cluster by event time DESC. Event time is the clustering key, so a record
delivered twice (at-least-once) overwrites its own row instead of adding one (the tests: docs/architecture.md,
"Delivery guarantees"). Registrations are partitioned by site and clustered by id. Why these keys:
docs/architecture.md, "Inside the adapter".

A layout may gain columns (readings got `device_id`): the adapter adds what an existing table lacks at start
(add_columns_cql); rows written before hold null there."""
from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple

from services.common import contracts
from services.common.site import resolve_site

MS_PER_DAY = 86_400_000
_EPOCH = dt.date(1970, 1, 1)


class RowError(ValueError):
    """The record cannot become a row (for example: no site); goes to dead-letter."""


@dataclass(frozen=True)
class Layout:
    contract: str
    columns: tuple[tuple[str, str, str], ...]   # (column, cql type, contract field or "")
    partition_key: tuple[str, ...]
    clustering: tuple[tuple[str, str], ...]     # (column, ASC | DESC)
    time_field: str | None                      # contract field (epoch ms) bucketed into `day`
    latency: bool                               # store event->ingest and event->write latency

    @functools.cached_property
    def column_names(self) -> tuple[str, ...]:
        """Bind order: site, [day], contract columns, ingest fields, then write fields last."""
        return tuple(c for c, _, _ in self.all_columns())

    @functools.cached_property
    def partition_indexes(self) -> tuple[int, ...]:
        return tuple(self.column_names.index(c) for c in self.partition_key)

    def all_columns(self) -> list[tuple[str, str, str]]:
        cols = [("site", "text", "")]
        if self.time_field:
            cols.append(("day", "date", ""))
        cols += list(self.columns)
        cols.append(("ingest_time", "timestamp", ""))
        if self.latency:
            cols.append(("ingest_latency_ms", "bigint", ""))
        cols.append(("write_time", "timestamp", ""))
        if self.latency:
            cols.append(("write_latency_ms", "bigint", ""))
        return cols


def _ts(column: str, field: str) -> tuple[str, str, str]:
    return (column, "timestamp", field)


LAYOUTS: dict[str, Layout] = {layout.contract: layout for layout in (
    Layout(contracts.READING.name, (
        ("sensor_id", "text", "sensor_id"), _ts("event_time", "timestamp"),
        ("temperature", "double", "temperature"), ("unit", "text", "unit"),
        ("device_id", "text", "device_id"),        # added later: add_columns_cql puts it into older tables
    ), ("site", "sensor_id", "day"), (("event_time", "DESC"),), "timestamp", latency=True),
    # is_last is in the key so an episode's opening and closing events never overwrite each other.
    Layout(contracts.THRESHOLD_EVENT.name, (
        ("sensor_id", "text", "sensor_id"), _ts("event_time", "timestamp"),
        ("is_last", "boolean", "is_last"), ("is_first", "boolean", "is_first"),
        ("temperature_threshold", "double", "temperature_threshold"),
        ("average_transgression", "double", "average_transgression"),
        ("max_transgression", "double", "max_transgression"),
        ("exceeded_for_ms", "bigint", "exceeded_for_ms"),
        _ts("first_transgression", "first_transgression"), _ts("last_transgression", "last_transgression"),
    ), ("site", "sensor_id", "day"), (("event_time", "DESC"), ("is_last", "ASC")), "timestamp", latency=True),
    Layout(contracts.ROLLUP.name, (
        ("sensor_id", "text", "sensor_id"), _ts("window_start", "window_start"), _ts("window_end", "window_end"),
        ("count", "bigint", "count"), ("avg", "double", "avg"), ("min", "double", "min"), ("max", "double", "max"),
    ), ("site", "sensor_id", "day"), (("window_start", "DESC"),), "window_start", latency=False),
    Layout(contracts.DEVICE.name, (
        ("device_id", "text", "device_id"), ("name", "text", "name"),
        ("description", "text", "description"), ("location", "text", "location"),
    ), ("site",), (("device_id", "ASC"),), None, latency=False),
    Layout(contracts.SENSOR.name, (
        ("sensor_id", "text", "sensor_id"), ("name", "text", "name"), ("description", "text", "description"),
        ("device_id", "text", "device_id"), ("sensor_type_id", "text", "sensor_type_id"),
    ), ("site",), (("sensor_id", "ASC"),), None, latency=False),
    Layout(contracts.SENSOR_TYPE.name, (
        ("sensor_type_id", "text", "sensor_type_id"), ("name", "text", "name"),
        ("description", "text", "description"), ("unit", "text", "unit"),
    ), ("site",), (("sensor_type_id", "ASC"),), None, latency=False),
)}


def layout(contract_name: str) -> Layout:
    try:
        return LAYOUTS[contract_name]
    except KeyError:
        raise ValueError(f"contract '{contract_name}' has no Cassandra table layout "
                         f"(known: {', '.join(sorted(LAYOUTS))})") from None


# ------------------------------------------------------------------ CQL

def create_keyspace_cql(keyspace: str, replication: dict[str, int]) -> str:
    dcs = ", ".join(f"'{dc}': {rf}" for dc, rf in sorted(replication.items()))
    return (f"CREATE KEYSPACE IF NOT EXISTS {keyspace} "
            f"WITH replication = {{'class': 'NetworkTopologyStrategy', {dcs}}}")


def create_table_cql(keyspace: str, table: str, lay: Layout) -> str:
    cols = ", ".join(f"{name} {cql}" for name, cql, _ in lay.all_columns())
    pk = f"({', '.join(lay.partition_key)})"
    clustering = ", ".join(c for c, _ in lay.clustering)
    order = ", ".join(f"{c} {o}" for c, o in lay.clustering)
    return (f"CREATE TABLE IF NOT EXISTS {keyspace}.{table} ({cols}, PRIMARY KEY ({pk}, {clustering})) "
            f"WITH CLUSTERING ORDER BY ({order})")


def add_columns_cql(keyspace: str, table: str, lay: Layout, existing: set[str]) -> list[str]:
    """ALTER TABLE ... ADD for each column of the layout that the table's `existing` columns lack (a table
    created before its layout gained the column). Idempotent (IF NOT EXISTS: two adapters may start at once).
    Key columns are never added (a table cannot change its key), nor anything to a table not there yet."""
    if not existing:
        return []
    key = {*lay.partition_key, *(c for c, _ in lay.clustering)}
    return [f"ALTER TABLE {keyspace}.{table} ADD IF NOT EXISTS {name} {cql}"
            for name, cql, _ in lay.all_columns() if name not in existing and name not in key]


def insert_cql(keyspace: str, table: str, lay: Layout, ttl_seconds: int | None = None) -> str:
    names = lay.column_names
    ttl = f" USING TTL {ttl_seconds}" if ttl_seconds else ""
    return (f"INSERT INTO {keyspace}.{table} ({', '.join(names)}) "
            f"VALUES ({', '.join('?' for _ in names)}){ttl}")


# ------------------------------------------------------------------ rows

class Row(NamedTuple):
    """Column values up to the ingest fields; the write fields are added at write time.

    A named tuple rather than a frozen dataclass: equally immutable, but built
    several times faster, and the adapter builds one per record."""
    values: tuple[Any, ...]
    event_ms: int | None
    partition: tuple[Any, ...]    # partition key values, to group rows into single-partition batches

    def bind(self, write_ms: int, latency: bool) -> tuple[Any, ...]:
        if latency:
            return (*self.values, write_ms, write_ms - self.event_ms)
        return (*self.values, write_ms)


@dataclass(frozen=True, slots=True)
class Day:
    """A CQL `date`. The driver serializes anything with `days_from_epoch` directly,
    which is much cheaper per row than a datetime.date (calendar.timegm per value)."""
    days_from_epoch: int

    @property
    def date(self) -> dt.date:
        return _EPOCH + dt.timedelta(days=self.days_from_epoch)

    def __str__(self) -> str:
        return self.date.isoformat()


@functools.lru_cache(maxsize=4096)
def _day(days_since_epoch: int) -> Day:
    return Day(days_since_epoch)


def utc_day(epoch_ms: int) -> Day:
    """UTC calendar day of an epoch-millisecond time (floor division, so pre-1970 works too)."""
    return _day(epoch_ms // MS_PER_DAY)


def row_site(record: dict[str, Any], header_site: str | None, topic: str, default_site: str | None) -> str:
    """The row's site by the one rule (services.common.site.resolve_site: the '<site>.' prefix of a mirrored
    topic, else the `site` header, else the record's `site` field, else the default); RowError if there is none."""
    site = resolve_site(header=header_site, field=record.get("site"), topic=topic, default=default_site)
    if not site:
        raise RowError(f"no site for a record on {topic}: no 'site' header or field, no '<site>.' topic "
                       "prefix, and ADAPTER_DEFAULT_SITE is not set")
    return site


RowBuilder = Callable[[dict[str, Any], str, "int | None"], Row]


def row_builder(lay: Layout) -> RowBuilder:
    """The row builder of one layout: build(validated record, site, ingest_ms) -> Row.

    Row values: site, [day of the event time], the contract columns, ingest time
    [and ingest latency]. The per-layout work (fields, time field, partition
    indexes) is done once here, because the adapter builds one row per record and
    that lookup was a measurable share of its CPU. tests/unit/adapter/reference.py
    keeps the plain per-record version that the tests pin this to."""
    fields = tuple(field for _, _, field in lay.columns)
    get = itemgetter(*fields) if len(fields) > 1 else (lambda record: (record[fields[0]],))
    pidx = lay.partition_indexes
    partition = itemgetter(*pidx) if len(pidx) > 1 else (lambda values: (values[pidx[0]],))
    time_field, latency = lay.time_field, lay.latency

    if time_field is None:
        if latency:     # no such layout: latency is measured from the event time
            raise ValueError(f"layout {lay.contract}: latency columns need a time field")

        def build_registration(record: dict[str, Any], site: str, ingest_ms: int | None) -> Row:
            values = (site, *get(record), ingest_ms)
            return Row(values, None, partition(values))
        return build_registration

    def build_series(record: dict[str, Any], site: str, ingest_ms: int | None) -> Row:
        event_ms = record[time_field]
        if event_ms is None:    # every contract requires its time field: only an unvalidated record gets here
            raise RowError(f"{lay.contract}: no '{time_field}' to put the row in a day partition")
        if latency:
            values = (site, utc_day(event_ms), *get(record), ingest_ms,
                      None if ingest_ms is None else ingest_ms - event_ms)
        else:
            values = (site, utc_day(event_ms), *get(record), ingest_ms)
        return Row(values, event_ms, partition(values))
    return build_series
