"""Gap-free offset commits (services.common.offsets), as the adapter and the bridge's command path use them."""
from __future__ import annotations

from services.common.offsets import OffsetTracker


def test_only_contiguous_finished_offsets_are_committable():
    tracker, tp = OffsetTracker(), ("temperature-data", 0)
    for offset in (10, 11, 12, 13):
        tracker.consumed(tp, offset)
    tracker.finished(tp, 12)
    tracker.finished(tp, 11)
    assert tracker.take_commits() == {}            # 10 is still being written
    tracker.finished(tp, 10)
    assert tracker.take_commits() == {tp: 13}      # 10, 11, 12 done: next to read is 13
    assert tracker.outstanding(tp) == 1
    tracker.finished(tp, 13)
    assert tracker.take_commits() == {tp: 14}
    assert tracker.take_commits() == {}


def test_command_offsets_commit_only_a_gap_free_prefix():
    """What the bridge's command path relies on: a later PUBACK commits nothing while an earlier one is open."""
    tracker, tp = OffsetTracker(), ("device-commands", 0)
    for offset in (3, 4, 5):
        tracker.consumed(tp, offset)
    tracker.finished(tp, 4)
    assert tracker.take_commits() == {}
    tracker.finished(tp, 3)
    assert tracker.take_commits() == {tp: 5}       # 3 and 4 done: next to read is 5


def test_partitions_are_tracked_independently():
    tracker, a, b = OffsetTracker(), ("t", 0), ("t", 1)
    tracker.consumed(a, 0)
    tracker.consumed(b, 0)
    tracker.consumed(b, 1)
    tracker.finished(b, 1)
    tracker.finished(a, 0)
    assert tracker.take_commits() == {a: 1}
    assert tracker.outstanding() == 1


def test_offset_gaps_from_compaction_do_not_block_commits():
    tracker, tp = OffsetTracker(), ("device-registration", 0)
    for offset in (3, 7, 8):
        tracker.consumed(tp, offset)
        tracker.finished(tp, offset)
    assert tracker.take_commits() == {tp: 9}


def test_revoked_partition_is_forgotten_and_late_completions_ignored():
    tracker, tp = OffsetTracker(), ("t", 0)
    tracker.consumed(tp, 5)
    tracker.drop(tp)
    tracker.finished(tp, 5)
    tracker.recommit(tp, 6)
    assert tracker.take_commits() == {} and tracker.outstanding() == 0


def test_failed_commit_is_offered_again_unless_a_newer_one_waits():
    tracker, tp = OffsetTracker(), ("t", 0)
    tracker.consumed(tp, 0)
    tracker.consumed(tp, 1)
    tracker.finished(tp, 0)
    assert tracker.take_commits() == {tp: 1}
    tracker.recommit(tp, 1)
    assert tracker.take_commits() == {tp: 1}
    tracker.finished(tp, 1)
    tracker.recommit(tp, 1)
    assert tracker.take_commits() == {tp: 2}
