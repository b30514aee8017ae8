"""iot-site-data: which topics and partitions belong to a removed site, and the refusals."""
from __future__ import annotations

import datetime as dt

import pytest

from services.commands import site_data as sd


def test_the_sites_topics_are_its_mirrors_and_its_flows_connect_state():
    topics = ["site-c.temperature-data", "site-c.checkpoints.internal", "site-c.heartbeats", "heartbeats",
              "mm2-offsets.site-c.internal", "mm2-status.site-c.internal", "mm2-configs.site-c.internal",
              "mm2-offset-syncs.site-c.internal",
              "site-cc.temperature-data", "site-a.temperature-data", "mm2-offsets.site-a.internal",
              "notifications", "site-c"]
    assert sd.site_topics("site-c", topics) == [
        "mm2-configs.site-c.internal", "mm2-offset-syncs.site-c.internal", "mm2-offsets.site-c.internal",
        "mm2-status.site-c.internal",
        "site-c.checkpoints.internal", "site-c.heartbeats", "site-c.temperature-data"]


def test_only_partitions_of_the_site_are_picked_whatever_the_key_order():
    day = dt.date(2026, 11, 25)
    keys = [("site-c", "s1", day), ("site-a", "s1", day), ("site-c", "s2", day), ("site-c", "s1", day)]
    assert sd.site_keys("site-c", ["site", "sensor_id", "day"], keys) == [("site-c", "s1", day), ("site-c", "s2", day)]
    assert sd.site_keys("site-c", ["sensor_id", "site"], [("s1", "site-c"), ("s1", "site-a")]) == [("s1", "site-c")]


def args(*extra: str):
    return sd.parse_args(["report", "--bootstrap", "k:9092", "--cassandra-hosts", "c", "--tables", "t", *extra])


def test_a_site_still_relayed_is_refused_with_the_fix():
    with pytest.raises(sd.UsageError, match="still one of the relayed sites .* remove its group"):
        sd.check_args(args("--site", "site-a", "--known-sites", "site-a,site-b"))
    sd.check_args(args("--site", "site-c", "--known-sites", "site-a,site-b"))


@pytest.mark.parametrize("flags, problem", [
    (("--site", "Site C"), "is not a site alias"),
    (("--site", "site-c", "--keyspace", "iot;drop"), "not a CQL keyspace or table name"),
])
def test_bad_names_are_refused(flags, problem):
    with pytest.raises(sd.UsageError, match=problem):
        sd.check_args(args(*flags))


def test_a_bad_flag_prints_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        sd.main(["purge", "--site", "site-c"])
    assert exit_.value.code == 2 and "usage: iot-site-data purge" in capsys.readouterr().err
