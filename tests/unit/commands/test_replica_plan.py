"""The reassignment plan of a growing site: replication raised, replicas spread, as little moved as it can."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from services.commands.replica_plan import min_insync_for, plan_replicas


def after(current, plan):
    return {t: {p: plan.moves.get(t, {}).get(p, r) for p, r in parts.items()} for t, parts in current.items()}


def counts(assignment, topic):
    return Counter(b for r in assignment[topic].values() for b in r)


def test_a_second_broker_gets_a_copy_of_every_partition_and_leaders_stay():
    current = {"temperature-data": {p: [1] for p in range(6)}, "__consumer_offsets": {p: [1] for p in range(50)}}
    plan = plan_replicas(current, [1, 2], 2)
    result = after(current, plan)
    assert all(r == [1, 2] for parts in result.values() for r in parts.values())
    assert plan.partitions() == 56
    assert plan.summary(current) == ["__consumer_offsets: 50 of 50 partitions move, replication 1 -> 2",
                                     "temperature-data: 6 of 6 partitions move, replication 1 -> 2"]


def test_a_fourth_broker_takes_an_even_share_and_only_followers_move():
    current = {"temperature-data": {p: [1 + (p + i) % 3 for i in range(3)] for p in range(6)}}
    plan = plan_replicas(current, [1, 2, 3, 4], 3)
    result = after(current, plan)
    assert sorted(counts(result, "temperature-data").values()) == [4, 4, 5, 5]
    assert all(result["temperature-data"][p][0] == current["temperature-data"][p][0] for p in range(6))
    assert all(len(set(r)) == 3 for r in result["temperature-data"].values())
    # Exactly the replicas the new broker takes move: four of eighteen.
    moved = sum(len(set(r) - set(current["temperature-data"][p])) for p, r in result["temperature-data"].items())
    assert moved == 4


def test_a_balanced_cluster_has_nothing_to_move():
    current = {"t": {0: [1, 2], 1: [2, 1], 2: [1, 2]}}
    plan = plan_replicas(current, [1, 2], 2)
    assert plan.moves == {} and plan.notes == []
    assert json.loads(plan.kafka_json()) == {"version": 1, "partitions": []}


def test_growing_from_two_to_three_raises_replication_to_three():
    current = {"t": {p: [1 + p % 2, 2 - p % 2] for p in range(3)}}
    result = after(current, plan_replicas(current, [1, 2, 3], 3))
    assert all(sorted(r) == [1, 2, 3] for r in result["t"].values())


def test_new_replicas_go_to_the_least_loaded_broker_across_topics():
    current = {"a": {0: [1]}, "b": {0: [1]}, "c": {0: [2]}}
    result = after(current, plan_replicas(current, [1, 2, 3], 2))
    assert result["a"][0] == [1, 3]          # broker 3 held nothing, broker 2 one replica
    assert result["b"][0] == [1, 2]          # now 2 and 3 hold one each: the lower id
    assert result["c"][0] == [2, 3]


def test_replication_is_never_lowered_and_strays_are_reported_not_moved():
    current = {"wide": {0: [1, 2, 3]}, "stray": {0: [1, 9]}}
    plan = plan_replicas(current, [1, 2], 2)
    assert plan.moves == {}
    assert any("wide: 1 partition(s) have more than 2 replicas" in n for n in plan.notes)
    assert any("stray: replicas on broker(s) [9]" in n for n in plan.notes)


def test_the_kafka_json_lists_only_the_moved_partitions():
    current = {"t": {0: [1, 2], 1: [1]}}
    plan = plan_replicas(current, [1, 2], 2)
    assert json.loads(plan.kafka_json()) == {"version": 1, "partitions": [
        {"topic": "t", "partition": 1, "replicas": [1, 2]}]}


@pytest.mark.parametrize("brokers, replication", [([], 1), ([1, 1], 1), ([1, 2], 3), ([1, 2], 0)])
def test_bad_brokers_or_replication_are_refused(brokers, replication):
    with pytest.raises(ValueError):
        plan_replicas({}, brokers, replication)


@pytest.mark.parametrize("replication, target, expected", [(1, 1, 1), (2, 1, 1), (3, 2, 2), (2, 2, 1), (5, 2, 2)])
def test_min_insync_is_one_less_than_the_replicas_at_most_the_target(replication, target, expected):
    assert min_insync_for(replication, target) == expected


def test_a_retiring_fourth_broker_hands_every_replica_to_the_others_and_replication_stays():
    current = {"t": {p: [1 + (p + i) % 4 for i in range(3)] for p in range(8)}}
    plan = plan_replicas(current, [1, 2, 3], 3, drain=[4])
    result = after(current, plan)
    assert all(sorted(r) == [1, 2, 3] for r in result["t"].values()), result
    for p, replicas in current["t"].items():
        kept = [b for b in replicas if b != 4]
        assert result["t"][p][:len(kept)] == kept, "the others keep their order: the next in sync leads"
    assert plan.partitions() == 6 and plan.notes == []      # the 6 partitions broker 4 held
    assert plan.summary(current) == ["t: 6 of 8 partitions move, replication 3 -> 3"]


def test_retiring_the_third_of_three_brokers_lowers_replication_to_the_two_that_remain():
    current = {"t": {p: [1 + (p + i) % 3 for i in range(3)] for p in range(3)}}
    plan = plan_replicas(current, [1, 2], 2, drain=[3])
    result = after(current, plan)
    assert all(sorted(r) == [1, 2] for r in result["t"].values())
    assert plan.notes == ["t: 3 partition(s) lose a replica with broker(s) [3] and keep 2: fewer brokers remain "
                          "than they had replicas"]
    assert min_insync_for(2, 2) == 1


def test_a_partition_only_on_the_retiring_broker_is_copied_to_the_least_loaded_one():
    current = {"a": {0: [2]}, "b": {0: [1]}}
    result = after(current, plan_replicas(current, [1, 3], 1, drain=[2]))
    assert result["a"][0] == [3] and result["b"] == {0: [1]}


def test_a_broker_cannot_both_stay_and_be_drained():
    with pytest.raises(ValueError, match="both stay and be drained"):
        plan_replicas({}, [1, 2], 1, drain=[2])
