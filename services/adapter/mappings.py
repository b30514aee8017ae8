"""Topic-to-table mappings of the Cassandra adapter: TOML file, defaults, lookup.

    [[table]]
    topics = ["temperature-data"]                 # exact topic names, or
    # topic_pattern = "^[a-z0-9-]+\\.temperature-data$"   # a regex (must start with ^)
    table = "temperature_readings"
    contract = "temperature-reading"              # services.common.contracts name; decides the columns
    ttl_seconds = 2592000                         # optional: rows expire after 30 days

Patterns are handed to the consumer's subscription as they are (librdkafka
treats a topic starting with ^ as a regex), which is how the datacenter picks
up `<site>.<topic>` mirrored topics of sites added later.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from services.adapter.schema import Layout, layout
from services.common import contracts, names

_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_KEYS = {"topics", "topic_pattern", "table", "contract", "ttl_seconds"}


class MappingError(ValueError):
    """The mappings file is wrong; the message names the entry and the fix."""


@dataclass(frozen=True)
class Mapping:
    table: str
    contract: contracts.Contract
    layout: Layout
    topics: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None
    ttl_seconds: int | None = None


def _mapping(topics: tuple[str, ...], table: str, contract_name: str) -> Mapping:
    return Mapping(table, contracts.contract(contract_name), layout(contract_name), topics=topics)


# The edge tier: the site's own topics (docs/architecture.md, "Data contracts").
DEFAULT_MAPPINGS: tuple[Mapping, ...] = (
    _mapping((names.TEMPERATURE_DATA,), "temperature_readings", contracts.READING.name),
    _mapping((names.THRESHOLD_EVENTS,), "temperature_threshold_events", contracts.THRESHOLD_EVENT.name),
    _mapping((names.ROLLUPS_1M,), "temperature_rollups_1m", contracts.ROLLUP.name),
    _mapping((names.DEVICE_REGISTRATION,), "devices", contracts.DEVICE.name),
    _mapping((names.SENSOR_REGISTRATION,), "sensors", contracts.SENSOR.name),
    _mapping((names.SENSOR_TYPE_REGISTRATION,), "sensor_types", contracts.SENSOR_TYPE.name),
)


def parse_mappings(text: str, source: str = "mappings") -> tuple[Mapping, ...]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise MappingError(f"{source}: not valid TOML: {err}") from None
    unknown = set(doc) - {"table"}
    if unknown:
        raise MappingError(f"{source}: unknown top-level key(s) {sorted(unknown)} (expected [[table]] entries)")
    entries = doc.get("table")
    if not isinstance(entries, list) or not entries:
        raise MappingError(f"{source}: no [[table]] entries")
    mappings = tuple(_entry(f"{source}: [[table]] #{i}", e) for i, e in enumerate(entries, 1))
    _check_conflicts(source, mappings)
    return mappings


def load_mappings(path: str | None) -> tuple[Mapping, ...]:
    if not path:
        return DEFAULT_MAPPINGS
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise MappingError(f"cannot read mappings file {path}: {err.strerror} (set ADAPTER_MAPPINGS_FILE)") from None
    return parse_mappings(text, path)


def _entry(where: str, entry: dict) -> Mapping:
    unknown = set(entry) - _KEYS
    if unknown:
        raise MappingError(f"{where}: unknown key(s) {sorted(unknown)} (expected {', '.join(sorted(_KEYS))})")
    table, contract_name = entry.get("table"), entry.get("contract")
    if not isinstance(table, str) or not _TABLE_NAME.match(table):
        raise MappingError(f"{where}: 'table' must be a lower-case CQL name like temperature_readings, got {table!r}")
    if not isinstance(contract_name, str):
        raise MappingError(f"{where}: 'contract' is required (one of {', '.join(sorted(contracts.CONTRACTS))})")
    try:
        contract, lay = contracts.contract(contract_name), layout(contract_name)
    except ValueError as err:
        raise MappingError(f"{where}: {err}") from None
    topics, pattern = entry.get("topics"), entry.get("topic_pattern")
    if (topics is None) == (pattern is None):
        raise MappingError(f"{where}: give exactly one of 'topics' (a list of names) or 'topic_pattern' (a ^regex)")
    compiled = None
    if topics is not None:
        if not isinstance(topics, list) or not topics or not all(isinstance(t, str) and t for t in topics):
            raise MappingError(f"{where}: 'topics' must be a non-empty list of topic names")
    else:
        if not isinstance(pattern, str) or not pattern.startswith("^"):
            raise MappingError(f"{where}: 'topic_pattern' must be a regex starting with ^ (Kafka's regex marker)")
        try:
            compiled = re.compile(pattern)
        except re.error as err:
            raise MappingError(f"{where}: 'topic_pattern' {pattern!r} is not a valid regex: {err}") from None
    ttl = entry.get("ttl_seconds")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 < ttl <= 630_720_000):
        raise MappingError(f"{where}: 'ttl_seconds' must be a whole number of seconds from 1 to 630720000 (20 years)")
    return Mapping(table, contract, lay, tuple(topics or ()), compiled, ttl)


def _check_conflicts(source: str, mappings: tuple[Mapping, ...]) -> None:
    seen_topics: dict[str, str] = {}
    table_contract: dict[str, str] = {}
    for m in mappings:
        for topic in m.topics:
            if topic in seen_topics:
                raise MappingError(f"{source}: topic {topic} is mapped twice "
                                   f"(tables {seen_topics[topic]} and {m.table})")
            seen_topics[topic] = m.table
        known = table_contract.setdefault(m.table, m.contract.name)
        if known != m.contract.name:
            raise MappingError(f"{source}: table {m.table} is mapped with two contracts ({known}, {m.contract.name});"
                               " a table has one layout")


class Router:
    """Topic -> mapping; exact names first, then patterns in file order (cached per topic)."""

    def __init__(self, mappings: tuple[Mapping, ...]):
        self.mappings = mappings
        self._cache: dict[str, Mapping | None] = {t: m for m in mappings for t in m.topics}

    def subscription(self) -> list[str]:
        return [t for m in self.mappings for t in m.topics] + [m.pattern.pattern for m in self.mappings if m.pattern]

    def route(self, topic: str) -> Mapping | None:
        try:
            return self._cache[topic]
        except KeyError:
            found = next((m for m in self.mappings if m.pattern and m.pattern.search(topic)), None)
            self._cache[topic] = found
            return found
