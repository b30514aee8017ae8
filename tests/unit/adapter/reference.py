"""Plain reference version of the adapter's row building; tests only.

The adapter builds rows with a per-layout builder (services.adapter.schema.row_builder);
this is the straightforward per-record version the tests pin it to and use to
state what a row holds. Production code and tooling never import this.
"""
from __future__ import annotations

from typing import Any

from services.adapter.schema import Layout, Row, utc_day


def build_row(lay: Layout, record: dict[str, Any], site: str, ingest_ms: int | None) -> Row:
    """Row values of a validated record (see Contract.validate)."""
    values: list[Any] = [site]
    event_ms = record[lay.time_field] if lay.time_field else None
    if event_ms is not None:
        values.append(utc_day(event_ms))
    values += [record[field] for _, _, field in lay.columns]
    values.append(ingest_ms)
    if lay.latency:
        values.append(None if ingest_ms is None else ingest_ms - event_ms)
    return Row(tuple(values), event_ms, tuple(values[i] for i in lay.partition_indexes))
