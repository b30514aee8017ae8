"""The unread-partitions watch (services/adapter/assignment.py): which subscribed partitions no member
holds, counted only when two checks in a row see them (a rebalance in between is not an alert)."""
from __future__ import annotations

import logging
import threading

from services.adapter import metrics
from services.adapter.assignment import UnreadWatch, subscribed_partitions, unheld
from services.adapter.mappings import Mapping, Router, load_mappings

TOPICS = {"temperature-data": 3, "temperature-threshold-events": 2, "dead-letter": 1, "__consumer_offsets": 50,
          "site-b.temperature-data": 1}


def subscribed(topic: str) -> bool:
    return topic in ("temperature-data", "temperature-threshold-events")


def test_subscribed_partitions_are_every_partition_of_the_taken_topics_and_never_internal_ones():
    assert subscribed_partitions(TOPICS, subscribed) == {
        ("temperature-data", 0), ("temperature-data", 1), ("temperature-data", 2),
        ("temperature-threshold-events", 0), ("temperature-threshold-events", 1)}
    assert subscribed_partitions(TOPICS, lambda topic: True) >= {("dead-letter", 0)}
    assert not {p for p in subscribed_partitions(TOPICS, lambda topic: True) if p[0].startswith("__")}


def test_unheld_is_what_no_member_holds():
    held = [("temperature-data", 0), ("temperature-data", 1), ("temperature-data", 2), ("dead-letter", 0)]
    assert unheld(TOPICS, subscribed, held) == {("temperature-threshold-events", 0),
                                                ("temperature-threshold-events", 1)}


def test_a_pattern_mapping_takes_the_relayed_topics_it_matches():
    router = Router(load_mappings(None))
    patterns: tuple[Mapping, ...] = tuple(m for m in router.mappings if m.pattern)
    taken = subscribed_partitions(TOPICS, lambda topic: router.route(topic) is not None)
    assert ("temperature-data", 0) in taken and ("dead-letter", 0) not in taken
    assert (("site-b.temperature-data", 0) in taken) == any(m.pattern.search("site-b.temperature-data")
                                                           for m in patterns)


def test_a_partition_counts_only_when_two_checks_in_a_row_find_it_unheld(caplog):
    watch = UnreadWatch({}, "site-a-cassandra-adapter", subscribed, threading.Event())
    all_but_events = [("temperature-data", p) for p in range(3)]
    caplog.set_level(logging.ERROR, "iot_stack.adapter")
    assert watch.check(TOPICS, all_but_events) == set()                   # first sight: maybe a rebalance
    assert metrics.UNREAD_PARTITIONS._value.get() == 0
    assert watch.check(TOPICS, None) == set()                             # rebalancing: no verdict
    unread = watch.check(TOPICS, all_but_events)
    assert unread == {("temperature-threshold-events", 0), ("temperature-threshold-events", 1)}
    assert metrics.UNREAD_PARTITIONS._value.get() == 2
    (record,) = caplog.records
    assert record.kv["partitions"] == "temperature-threshold-events[0],temperature-threshold-events[1]"
    assert "restart the adapter" in record.kv["fix"]
    held_again = all_but_events + [("temperature-threshold-events", 0), ("temperature-threshold-events", 1)]
    assert watch.check(TOPICS, held_again) == set()
    assert metrics.UNREAD_PARTITIONS._value.get() == 0
