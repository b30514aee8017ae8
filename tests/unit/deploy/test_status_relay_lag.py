"""The status table's relay lag: records of a site's topic that MirrorMaker has not copied, read
from MirrorMaker's own source offsets (it used to subtract end offsets across the tiers, which went
negative under exactly-once because transaction markers take offsets at the datacenter)."""
from __future__ import annotations

import json

from deploy.status import copied_offsets, mm2_offsets_topic, relay_lag

TOPIC = "temperature-threshold-events"


def _record(site: str, topic: str, partition: int, offset: int | None, connector: str = "MirrorSourceConnector"):
    key = json.dumps([connector, {"cluster": site, "partition": partition, "topic": topic}]).encode()
    return key, None if offset is None else json.dumps({"offset": offset}).encode()


def test_the_latest_source_offset_per_partition_wins_and_others_are_ignored():
    records = [
        _record("site-a", TOPIC, 0, 10), _record("site-a", TOPIC, 0, 41), _record("site-a", TOPIC, 1, 7),
        _record("site-b", TOPIC, 0, 999),                              # another site's flow
        _record("site-a", "device-registration", 0, 999),              # another topic
        _record("site-a", TOPIC, 2, 999, connector="MirrorCheckpointConnector"),
        (b"not json", b"{}"), (None, None), (b'["MirrorSourceConnector", 3]', b'{"offset": 1}'),
        (_record("site-a", TOPIC, 3, 1)[0], b"garbage"),
    ]
    assert copied_offsets(records, "site-a", TOPIC) == {0: 42, 1: 8}


def test_a_deleted_offset_is_forgotten():
    records = [_record("site-a", TOPIC, 0, 10), _record("site-a", TOPIC, 0, None)]
    assert copied_offsets(records, "site-a", TOPIC) == {}


def test_lag_counts_what_is_left_per_partition_and_never_goes_negative():
    ends = {0: (0, 50), 1: (0, 8), 2: (5, 20)}
    # 0: copied up to 42 of 50; 1: all copied; 2: nothing copied yet (starts at the oldest offset, 5).
    assert relay_lag(ends, {0: 42, 1: 8}) == 8 + 0 + 15
    # A copied offset past the end (the site's topic was recreated) counts as no lag, not as negative.
    assert relay_lag({0: (0, 3)}, {0: 10}) == 0
    # Records the site's retention removed before they were copied are not lag any more.
    assert relay_lag({0: (30, 40)}, {0: 12}) == 10


def test_mirrormaker_keeps_each_flows_offsets_in_its_own_topic_at_the_datacenter():
    assert mm2_offsets_topic("site-a") == "mm2-offsets.site-a.internal"
