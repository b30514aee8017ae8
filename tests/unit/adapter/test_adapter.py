"""Pure logic of the Cassandra adapter: rows, mappings, settings (offsets: tests/unit/common/test_offsets.py)."""
from __future__ import annotations

import datetime as dt

import pytest

from services.adapter.app import consumer_config, main
from services.adapter.mappings import DEFAULT_MAPPINGS, MappingError, Router, parse_mappings
from services.adapter.schema import (
    RowError,
    add_columns_cql,
    create_keyspace_cql,
    create_table_cql,
    insert_cql,
    layout,
    row_site,
    utc_day,
)
from services.adapter.settings import OPTIONS, load, parse_replication, parser
from services.common import contracts, names
from services.common.settings import SettingsError
from tests.unit.adapter.reference import build_row

READINGS = layout(contracts.READING.name)


def _ms(*args: int) -> int:
    return int(dt.datetime(*args, tzinfo=dt.UTC).timestamp() * 1000)


# ------------------------------------------------------------------ rows

@pytest.mark.parametrize(("epoch_ms", "day"), [
    (_ms(2026, 5, 9, 0, 0, 0), dt.date(2026, 5, 9)),
    (_ms(2026, 5, 9, 23, 59, 59) + 999, dt.date(2026, 5, 9)),
    (_ms(2026, 5, 10, 0, 0, 0), dt.date(2026, 5, 10)),
    (0, dt.date(1970, 1, 1)),
    (-1, dt.date(1969, 12, 31)),
])
def test_day_bucket_is_the_utc_calendar_day_of_the_event_time(epoch_ms, day):
    assert utc_day(epoch_ms).date == day


def test_reading_row_holds_values_partition_and_latency_fields():
    event = _ms(2026, 5, 9, 12, 0, 0)
    record = contracts.READING.validate({"sensor_id": "s-1", "timestamp": event, "temperature": 21.5, "unit": "C"})
    row = build_row(READINGS, record, "site-a", ingest_ms=event + 4)
    values = dict(zip(READINGS.column_names, row.bind(write_ms=event + 9, latency=True), strict=True))
    assert values["site"] == "site-a" and values["sensor_id"] == "s-1"
    assert str(values["day"]) == "2026-05-09"
    assert values["event_time"] == event and values["temperature"] == 21.5 and values["unit"] == "C"
    assert values["ingest_time"] == event + 4 and values["ingest_latency_ms"] == 4
    assert values["write_time"] == event + 9 and values["write_latency_ms"] == 9
    assert row.partition == ("site-a", "s-1", utc_day(event))


def test_reading_without_ingest_header_has_no_ingest_latency():
    record = contracts.READING.validate({"sensor_id": "s", "timestamp": 1000, "temperature": 1, "unit": "K"})
    values = dict(zip(READINGS.column_names, build_row(READINGS, record, "a", None).bind(1500, True), strict=True))
    assert values["ingest_time"] is None and values["ingest_latency_ms"] is None
    assert values["write_latency_ms"] == 500


def test_registration_row_is_partitioned_by_site_only():
    lay = layout(contracts.SENSOR.name)
    record = contracts.SENSOR.validate({"sensor_id": "s", "name": "n", "device_id": "d", "sensor_type_id": "t"})
    row = build_row(lay, record, "site-b", None)
    assert row.partition == ("site-b",)
    assert len(row.bind(5, lay.latency)) == len(lay.column_names)


# The one site rule (services.common.site, tests/unit/common/test_site.py): a mirrored topic's '<site>.' prefix
# (the site the relay read it from) wins; at a site, the header the bridge wrote wins over the record's own field.
@pytest.mark.parametrize(("record", "header", "topic", "default", "site"), [
    ({"site": "from-record"}, "from-header", "pfx.topic", "dflt", "pfx"),
    ({"site": "from-record"}, "from-header", "temperature-data", "dflt", "from-header"),
    ({"site": "from-record"}, None, "temperature-data", "dflt", "from-record"),
    ({}, "site-b", "site-a.temperature-data", "dflt", "site-a"),
    ({}, None, "site-c.temperature-data", "dflt", "site-c"),
    ({}, None, "temperature-data", "dflt", "dflt"),
])
def test_site_comes_from_topic_prefix_then_header_then_record_then_default(record, header, topic, default, site):
    assert row_site(record, header, topic, default) == site


def test_record_without_any_site_is_an_error_naming_the_fix():
    with pytest.raises(RowError, match="ADAPTER_DEFAULT_SITE"):
        row_site({}, None, "temperature-data", None)


def test_readings_table_is_partitioned_by_site_sensor_day_and_clustered_by_time():
    cql = create_table_cql("iot", "temperature_readings", READINGS)
    assert "PRIMARY KEY ((site, sensor_id, day), event_time)" in cql
    assert "CLUSTERING ORDER BY (event_time DESC)" in cql


def test_a_reading_row_stores_the_device_that_published_it_and_null_for_older_readings():
    base = {"sensor_id": "s-1", "timestamp": 1000, "temperature": 1.0, "unit": "C"}
    for record, device in ((dict(base, device_id="d1"), "d1"), (base, None)):
        row = build_row(READINGS, contracts.READING.validate(record), "a", None)
        assert dict(zip(READINGS.column_names, row.bind(1500, True), strict=True))["device_id"] == device
    assert "device_id text" in create_table_cql("iot", "temperature_readings", READINGS)


def test_a_readings_table_created_before_device_id_gets_the_column_added():
    old = {"site", "sensor_id", "day", "event_time", "temperature", "unit", "ingest_time", "ingest_latency_ms",
           "write_time", "write_latency_ms"}
    assert add_columns_cql("iot", "temperature_readings", READINGS, old) == [
        "ALTER TABLE iot.temperature_readings ADD IF NOT EXISTS device_id text"]
    assert add_columns_cql("iot", "temperature_readings", READINGS, old | {"device_id"}) == []     # idempotent
    assert add_columns_cql("iot", "temperature_readings", READINGS, set()) == []     # not there: CREATE makes it whole
    # Key columns can never be added to a table: a layout whose key changed needs a new table.
    assert add_columns_cql("iot", "t", READINGS, {"temperature"}) == [
        f"ALTER TABLE iot.t ADD IF NOT EXISTS {c} {t}" for c, t, _ in READINGS.all_columns()
        if c not in {"site", "sensor_id", "day", "event_time", "temperature"}]


def test_missing_columns_are_read_from_system_schema_for_every_mapped_table():
    from types import SimpleNamespace

    from services.adapter.cassandra import missing_column_statements

    class Session:
        def execute(self, query, params, timeout):
            self.asked = (query, params)
            before = tuple(c for c in READINGS.column_names if c != "device_id")      # a table of an older release
            have = {"temperature_readings": before, "other_table": ("x",)}
            return [SimpleNamespace(table_name=t, column_name=c) for t, cols in have.items() for c in cols]

    settings = load(parser().parse_args(["--keyspace", "edge"]))
    session = Session()
    statements = missing_column_statements(session, settings, DEFAULT_MAPPINGS)
    assert session.asked[1] == ("edge",) and "system_schema.columns" in session.asked[0]
    assert statements == ["ALTER TABLE edge.temperature_readings ADD IF NOT EXISTS device_id text"]


def test_keyspace_uses_network_topology_with_replication_per_dc():
    cql = create_keyspace_cql("iot", {"dc1": 3, "dc2": 1})
    assert "'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 1" in cql


def test_insert_sets_ttl_only_when_configured():
    assert "USING TTL 3600" in insert_cql("iot", "r", READINGS, 3600)
    assert "USING TTL" not in insert_cql("iot", "r", READINGS, None)


# ------------------------------------------------------------------ mappings

GOOD = """
[[table]]
topics = ["temperature-data"]
table = "temperature_readings"
contract = "temperature-reading"
ttl_seconds = 86400

[[table]]
topic_pattern = "^[a-z0-9-]+\\\\.temperature-threshold-events$"
table = "threshold_events"
contract = "temperature-threshold-event"
"""


def test_mapping_file_with_topics_pattern_and_ttl_parses():
    readings, events = parse_mappings(GOOD)
    assert readings.topics == ("temperature-data",) and readings.ttl_seconds == 86400
    assert events.pattern is not None and events.pattern.pattern == r"^[a-z0-9-]+\.temperature-threshold-events$"
    assert events.contract is contracts.THRESHOLD_EVENT


def test_router_matches_exact_topics_and_prefixed_mirrored_topics():
    router = Router(parse_mappings(GOOD))
    assert router.route("temperature-data").table == "temperature_readings"
    assert router.route("site-a.temperature-threshold-events").table == "threshold_events"
    assert router.route("temperature-threshold-events") is None
    assert router.subscription() == ["temperature-data", r"^[a-z0-9-]+\.temperature-threshold-events$"]


def test_default_mappings_cover_readings_events_rollups_and_registrations():
    topics = {t for m in DEFAULT_MAPPINGS for t in m.topics}
    assert topics == {names.TEMPERATURE_DATA, names.THRESHOLD_EVENTS, names.ROLLUPS_1M,
                      names.DEVICE_REGISTRATION, names.SENSOR_REGISTRATION,
                      names.SENSOR_TYPE_REGISTRATION}


_ENTRY = '[[table]]\ntopics = ["t"]\ntable = "x"\ncontract = "temperature-reading"\n'


@pytest.mark.parametrize(("text", "error"), [
    ("[[table]\n", "not valid TOML"),
    ("", "no \\[\\[table\\]\\] entries"),
    ("[other]\na = 1\n", "unknown top-level key"),
    (_ENTRY + "colour = 'red'\n", "unknown key"),
    ('[[table]]\ntopics = ["t"]\ntable = "x"\n', "'contract' is required"),
    ('[[table]]\ntopics = ["t"]\ntable = "x"\ncontract = "nope"\n', "unknown contract 'nope'"),
    ('[[table]]\ntopics = ["t"]\ntable = "x"\ncontract = "device-command"\n', "has no Cassandra table layout"),
    ('[[table]]\ntable = "x"\ncontract = "temperature-reading"\n', "exactly one of 'topics'"),
    (_ENTRY + 'topic_pattern = "^t$"\n', "exactly one of 'topics'"),
    ('[[table]]\ntopic_pattern = "t.*"\ntable = "x"\ncontract = "temperature-reading"\n', "starting with \\^"),
    ('[[table]]\ntopic_pattern = "^(t"\ntable = "x"\ncontract = "temperature-reading"\n', "not a valid regex"),
    ('[[table]]\ntopics = []\ntable = "x"\ncontract = "temperature-reading"\n', "non-empty list"),
    ('[[table]]\ntopics = ["t"]\ntable = "Bad-Name"\ncontract = "temperature-reading"\n', "lower-case CQL name"),
    (_ENTRY + "ttl_seconds = -5\n", "ttl_seconds"),
    (_ENTRY + "ttl_seconds = '1d'\n", "ttl_seconds"),
    (_ENTRY + _ENTRY, "topic t is mapped twice"),
    (_ENTRY + '[[table]]\ntopics = ["u"]\ntable = "x"\ncontract = "device-registration"\n', "two contracts"),
])
def test_mapping_file_errors_name_the_entry_and_the_fix(text, error):
    with pytest.raises(MappingError, match=error):
        parse_mappings(text, "m.toml")


# ------------------------------------------------------------------ settings and CLI

def test_replication_parses_per_dc_and_rejects_garbage():
    assert parse_replication("dc1:3, dc2:1") == {"dc1": 3, "dc2": 1}
    for bad in ("", "dc1", "dc1:0", "dc1:x", "d c:1"):
        with pytest.raises(SettingsError, match="ADAPTER_REPLICATION"):
            parse_replication(bad)


def test_help_explains_every_option_and_its_environment_variable(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in OPTIONS:
        if option.secret:   # no flag: read from the file named by the variable
            assert option.name in out and option.env in out
        else:
            assert option.flag == f"--{option.name.replace('_', '-')}" and option.flag in out and option.env in out


def test_unknown_flag_prints_usage_and_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--no-such-flag"])
    assert exit_info.value.code == 2
    assert "usage: iot-cassandra-adapter" in capsys.readouterr().err


@pytest.mark.parametrize(("env", "message"), [
    ({"ADAPTER_WINDOW": "many"}, "ADAPTER_WINDOW"),
    ({"ADAPTER_REPLICATION": "dc1"}, "ADAPTER_REPLICATION"),
    ({"ADAPTER_CONSISTENCY": "SOME"}, "ADAPTER_CONSISTENCY"),
    ({"ADAPTER_KEYSPACE": "Bad-Name"}, "ADAPTER_KEYSPACE"),
    ({"ADAPTER_MAPPINGS_FILE": "/nonexistent/m.toml"}, "cannot read mappings file"),
    ({"ADAPTER_GROUP_INSTANCE_ID": "site-a-cassandra-adapter-{{.Task.Slot}}"},
     "ADAPTER_GROUP_INSTANCE_ID='site-a-cassandra-adapter-{{.Task.Slot}}': an unexpanded Swarm template"),
    ({"ADAPTER_GROUP_INSTANCE_ID": "adapter 1"}, "ADAPTER_GROUP_INSTANCE_ID='adapter 1'"),
    ({"ADAPTER_SESSION_TIMEOUT_MS": "1000"}, "ADAPTER_SESSION_TIMEOUT_MS='1000': must be >= 6000"),
    ({"ADAPTER_CASSANDRA_USERNAME": "adapter", "CASSANDRA_PASSWORD_FILE": "/nonexistent"}, "secret cassandra_password"),
])
def test_bad_setting_exits_2_naming_the_variable(monkeypatch, capsys, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["--print-schema"]) == 2
    assert message in capsys.readouterr().err


def test_consumer_is_a_dynamic_member_with_a_45s_session_by_default(monkeypatch):
    for option in OPTIONS:
        if option.env and not option.secret:
            monkeypatch.delenv(option.env, raising=False)
    config = consumer_config(load(parser().parse_args([])))
    assert "group.instance.id" not in config and config["session.timeout.ms"] == 45000
    assert config["group.id"] == names.CONSUMER_GROUPS["adapter"] and config["enable.auto.commit"] is False
    # A pattern subscription sees a new site's relayed topics within 30 s (librdkafka's default: 5 min).
    assert config["topic.metadata.refresh.interval.ms"] == 30_000


def test_group_instance_id_and_session_timeout_reach_the_consumer(monkeypatch):
    monkeypatch.setenv("ADAPTER_GROUP_INSTANCE_ID", "site-a-cassandra-adapter-2")
    monkeypatch.setenv("ADAPTER_SESSION_TIMEOUT_MS", "30000")
    config = consumer_config(load(parser().parse_args([])))
    assert (config["group.instance.id"], config["session.timeout.ms"]) == ("site-a-cassandra-adapter-2", 30000)
    flags = parser().parse_args(["--group-instance-id", "x-1", "--session-timeout-ms", "60000"])
    assert consumer_config(load(flags))["group.instance.id"] == "x-1"       # the flag wins
    assert consumer_config(load(flags))["session.timeout.ms"] == 60000


def test_print_schema_shows_keyspace_and_every_default_table(capsys):
    assert main(["--print-schema", "--replication", "dc1:3,dc2:2", "--keyspace", "edge"]) == 0
    out = capsys.readouterr().out
    assert "CREATE KEYSPACE IF NOT EXISTS edge" in out and "'dc1': 3, 'dc2': 2" in out
    for mapping in DEFAULT_MAPPINGS:
        assert f"CREATE TABLE IF NOT EXISTS edge.{mapping.table} " in out


# ------------------------------------------------------------------ serialization

@pytest.mark.parametrize(("cql", "value"), [
    ("text", "s-1 ü"), ("bigint", -5), ("bigint", 2**62), ("timestamp", 1_778_300_000_123),
    ("double", 21.5), ("boolean", True), ("boolean", False), ("date", utc_day(1_778_300_000_123)),
    ("date", utc_day(-1)),
])
def test_writer_serializes_each_column_type_exactly_like_the_driver(cql, value):
    from cassandra import cqltypes

    from services.adapter.writer import _SERIALIZE

    driver = {"text": cqltypes.UTF8Type, "bigint": cqltypes.LongType, "timestamp": cqltypes.DateType,
              "double": cqltypes.DoubleType, "boolean": cqltypes.BooleanType, "date": cqltypes.SimpleDateType}
    assert _SERIALIZE[cql](value) == driver[cql].serialize(value, 5)


def test_every_layout_column_type_has_a_serializer():
    from services.adapter.schema import LAYOUTS
    from services.adapter.writer import _SERIALIZE

    assert {cql for lay in LAYOUTS.values() for _, cql, _ in lay.all_columns()} <= set(_SERIALIZE)
