"""The status playbook's figures (ansible/status.yml): each site's probe output -> one row per site.

The probes print what Kafka's and Cassandra's own tools say, on each site's manager; this module turns it
into figures on the controller: status_report (what -e status_json_file writes) and status_table (what it prints).
"""
from __future__ import annotations

import json
import re

from deploy.swarm import services_converged

STATUS_COLUMNS = ("site", "readings/s", "readings in kafka", "adapter lag", "events", "relay lag",
                  "cassandra readings", "cassandra events", "services converged")


def mm2_offsets_topic(site: str) -> str:
    """Where MirrorMaker 2 (dedicated mode) keeps its connectors' source offsets for one flow: in the
    target cluster, one topic per source (Kafka 3.9 MirrorMakerConfig: mm2-offsets.<source>.internal)."""
    return f"mm2-offsets.{site}.internal"


def copied_offsets(records, site: str, topic: str) -> dict[int, int]:
    """partition -> the next offset of `topic` at `site` that MirrorMaker has not copied yet, from the
    records (key, value) of its offsets topic, oldest first: the source connector stores, per source
    partition, the last upstream offset it copied ({"offset": N}); a later record replaces an earlier
    one and a null value deletes it. Records of other connectors, sites or topics, and bytes that are
    not the expected JSON, are ignored."""
    copied: dict[int, int] = {}
    for key, value in records:
        try:
            connector, partition = json.loads(key or b"null")
        except (TypeError, ValueError):
            continue
        if connector != "MirrorSourceConnector" or not isinstance(partition, dict) \
                or partition.get("cluster") != site or partition.get("topic") != topic \
                or not isinstance(partition.get("partition"), int):
            continue
        if value is None:
            copied.pop(partition["partition"], None)
            continue
        try:
            offset = json.loads(value)["offset"]
        except (TypeError, ValueError, KeyError):
            continue
        if isinstance(offset, int):
            copied[partition["partition"]] = offset + 1
    return copied


def relay_lag(site_ends: dict, copied: dict) -> int:
    """Records of a site's topic that MirrorMaker has not copied: per partition, from the next offset
    to copy (or the oldest offset there, if it has copied nothing yet) to the end. Offsets, not
    end-offset differences between the tiers: under exactly-once MirrorMaker's transaction markers
    take offsets at the datacenter too, which made the old difference go negative.
    `site_ends`: partition -> (low, high) watermark offsets at the site."""
    return sum(max(0, high - max(low, copied.get(partition, low))) for partition, (low, high) in site_ends.items())


def probe_sections(text: object) -> dict[str, list[str]]:
    """A probe's stdout, one `<section> <rest>` per line (the status role's scripts prefix each tool's
    lines with its section) -> {section: [rest, ...]}."""
    sections: dict[str, list[str]] = {}
    for line in str(text or "").splitlines():
        section, _, rest = line.partition(" ")
        if section:
            sections.setdefault(section, []).append(rest)
    return sections


def kafka_offsets(lines: list) -> dict[str, dict[int, int]]:
    """GetOffsetShell's `topic:partition:offset` lines -> {topic: {partition: offset}}; other lines are ignored."""
    offsets: dict[str, dict[int, int]] = {}
    for line in lines or []:
        parts = str(line).strip().rsplit(":", 2)
        if len(parts) == 3 and parts[0] and parts[1].isdigit() and parts[2].lstrip("-").isdigit():
            offsets.setdefault(parts[0], {})[int(parts[1])] = int(parts[2])
    return offsets


def group_offsets(lines: list, topic: str) -> dict[int, int]:
    """`kafka-consumer-groups --describe` output -> partition -> the group's committed offset on `topic`
    (partitions without one, shown as '-', are left out)."""
    header: list[str] = []
    committed: dict[int, int] = {}
    for line in lines or []:
        tokens = str(line).split()
        if "CURRENT-OFFSET" in tokens and "PARTITION" in tokens and "TOPIC" in tokens:
            header = tokens
            continue
        if not header or len(tokens) < len(header) - 3:
            continue
        row = dict(zip(header, tokens, strict=False))  # CONSUMER-ID and the rest may be missing
        if row.get("TOPIC") == topic and row.get("PARTITION", "").isdigit() and row.get("CURRENT-OFFSET", "").isdigit():
            committed[int(row["PARTITION"])] = int(row["CURRENT-OFFSET"])
    return committed


def mm2_records(lines: list) -> list[tuple[bytes, bytes | None]]:
    """The MirrorMaker offsets probe's `key<TAB>value` lines (files/mm2_offsets.py) -> (key, value) records,
    oldest first; the value `null` (a tombstone) becomes None. Lines without a tab are the tool's own messages."""
    records: list[tuple[bytes, bytes | None]] = []
    for line in lines or []:
        key, tab, value = str(line).partition("\t")
        if tab:
            records.append((key.encode(), None if value.strip() == "null" else value.encode()))
    return records


def cql_counts(lines: list) -> dict[str, int]:
    """cqlsh output of the status probe: a `<table>` line (its section) before each `SELECT count(*)`'s
    output -> {table: count}; a table whose query failed is left out."""
    counts: dict[str, int] = {}
    table = None
    for line in lines or []:
        text = str(line)
        if text.startswith("table "):
            table = text.split()[1] if len(text.split()) > 1 else None
        elif table and table not in counts and re.fullmatch(r"\s*\d+\s*", text):
            counts[table] = int(text)
    return counts


def _cell(value: object) -> str:
    """A figure as the table shows it: n/a for a figure a probe could not measure, rates without decimals."""
    if value is None:
        return "n/a"
    return f"{value:.0f}" if isinstance(value, float) else str(value)


def _edge_row(probe: dict, topics: dict, records: list | None, relayed: list | None) -> dict:
    sections = probe_sections(probe.get("kafka"))
    first, last = kafka_offsets(sections.get("first")), kafka_offsets(sections.get("last"))
    earliest = kafka_offsets(sections.get("earliest"))
    times = {}
    for line in sections.get("time", []):
        name, _, stamp = line.partition(" ")
        try:
            times[name] = float(stamp)
        except ValueError:
            pass
    readings, events = topics["readings"], topics["events"]
    now = sum(last[readings].values()) if readings in last else None
    rate = None
    if now is not None and readings in first and times.get("last", 0) > times.get("first", 0) > 0:
        rate = (now - sum(first[readings].values())) / (times["last"] - times["first"])
    lag = None
    if readings in last and "group" in sections:
        committed = group_offsets(sections["group"], readings)
        # The group is described after the offsets were sampled: a partition committed past its sampled end
        # had caught up by then (not a negative lag; the lab showed -232 before this max).
        lag = sum(max(0, high - committed.get(partition, 0)) for partition, high in last[readings].items())
    relay: object = None
    if relayed is not None and events not in relayed:
        relay = "not relayed"
    elif records is not None and events in last:
        ends = {p: (earliest.get(events, {}).get(p, 0), high) for p, high in last[events].items()}
        relay = relay_lag(ends, copied_offsets(records, probe["site"], events))
    counts = cql_counts(str(probe.get("cassandra") or "").splitlines())
    return {"site": probe["site"], "readings/s": None if rate is None else round(rate, 1), "readings in kafka": now,
            "adapter lag": lag, "events": sum(last[events].values()) if events in last else None,
            "relay lag": relay, "cassandra readings": counts.get(topics["readings_table"]),
            "cassandra events": counts.get(topics["events_table"]),
            "services converged": services_converged(probe.get("services"), probe["site"])}


def status_rows(probes: list, sites: dict, topics: dict) -> list[dict]:
    """One row per site: each edge site's, then the datacenter's. `probes`: what each site's manager
    measured ({site, tier, kafka, cassandra, services; the datacenter's mm2 and relayed}); `sites`:
    alias -> tier of every site in the run (a site without a probe did not answer); `topics`: the names
    of the readings and threshold-events topics and tables."""
    by_site = {probe["site"]: probe for probe in probes or []}
    datacenter = next((p for p in by_site.values() if p.get("tier") == "datacenter"), None)
    records = mm2_records(str(datacenter.get("mm2") or "").splitlines()) if datacenter and datacenter.get("mm2") \
        else None
    relayed = list(datacenter.get("relayed") or []) if datacenter else None
    rows = []
    order = sorted(sites, key=lambda s: (sites[s] == "datacenter", s))
    for site in order:
        probe = by_site.get(site)
        if probe is None:
            rows.append({"site": site, **{c: "no answer" if c == "services converged" else "-"
                                          for c in STATUS_COLUMNS[1:]}})
        elif sites[site] == "datacenter":
            counts = cql_counts(str(probe.get("cassandra") or "").splitlines())
            readings = counts.get(topics["readings_table"]) if topics["readings"] in (relayed or []) else "-"
            rows.append({"site": site, "readings/s": "-", "readings in kafka": "-", "adapter lag": "-", "events": "-",
                         "relay lag": "-", "cassandra readings": readings,
                         "cassandra events": counts.get(topics["events_table"]),
                         "services converged": services_converged(probe.get("services"), site)})
        else:
            rows.append(_edge_row(probe, topics, records, relayed))
    return rows


def format_table(rows: list, columns: list | None = None) -> str:
    """Rows (dicts with the same keys) as left-aligned columns in the order of `columns` (default: the first
    row's keys), two spaces apart, no trailing blanks."""
    if not rows:
        return ""
    columns = list(columns or rows[0])
    widths = {c: max(len(c), *(len(_cell(r[c])) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(_cell(r[c]).ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)


def status_report(probes: list, sites: dict, topics: dict) -> dict:
    """What the status playbook prints and writes as JSON (-e status_json_file=PATH): the columns, one row per
    site (status_rows; a figure a probe could not measure is null) and a note for each probe that failed,
    with the last line it wrote on stderr."""
    notes = [f"{probe['site']}: the {name} probe failed: {message}"
             for probe in sorted(probes or [], key=lambda p: p["site"])
             for name, message in sorted((probe.get("errors") or {}).items())]
    return {"columns": list(STATUS_COLUMNS), "rows": status_rows(probes, sites, topics), "notes": notes}


def status_table(report: dict) -> str:
    """A status report as the operator reads it: the table, then its notes after a blank line."""
    notes = list(report.get("notes") or [])
    # The report's columns give the order: JSON readers (Ansible's to_nice_json among them) may sort a row's keys.
    table = format_table(report.get("rows") or [], report.get("columns"))
    return "\n".join([table, *([""] + notes if notes else [])])


# What ansible/filter_plugins/deploy_filters.py registers, by function name.
FILTERS = {f.__name__: f for f in (mm2_offsets_topic, status_report, status_table)}
