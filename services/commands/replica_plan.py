"""Where each partition's replicas should live as a site's brokers change: the pure logic of
`iot-topics reassignment` (services/commands/topics.py). It moves as little as it can, per topic:
0. Replicas on a broker of `drain` (kafka_retire=true; docs/operations.md, "Removing a Kafka broker from
   a site") are dropped; the others keep their order, so the next one, in sync, becomes preferred leader.
1. A replica stays where it is when its broker is one of the site's; the order of the list is kept,
   so the partition's preferred leader does not change.
2. A partition with fewer replicas than the target gets the site brokers it lacks that hold the
   fewest of the topic's replicas (then the fewest of all topics', then the lowest id).
3. While one site broker holds two or more of the topic's replicas more than another, one replica
   moves from the fullest to the emptiest: a follower where one can move, so leaders move least.
Replication is only raised, except where fewer brokers remain after a drain than a topic had replicas.
A replica on a broker that is neither the site's nor drained (a broker taken out of the inventory) is
left where it is and reported: moving data off a broker is an operator's decision, not a deploy's.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

Assignment = dict[str, dict[int, list[int]]]     # topic -> partition -> replicas, first one preferred leader


@dataclass
class ReplicaPlan:
    moves: Assignment = field(default_factory=dict)       # only the partitions whose replicas change
    notes: list[str] = field(default_factory=list)        # what the plan left alone, and why

    def partitions(self) -> int:
        return sum(len(parts) for parts in self.moves.values())

    def kafka_json(self) -> str:
        """The plan in the format kafka-reassign-partitions --reassignment-json-file reads."""
        return json.dumps({"version": 1, "partitions": [
            {"topic": topic, "partition": p, "replicas": replicas}
            for topic in sorted(self.moves) for p, replicas in sorted(self.moves[topic].items())]})

    def summary(self, current: Assignment) -> list[str]:
        """One line per topic that changes: its replication and how many partitions move."""
        lines = []
        for topic in sorted(self.moves):
            before = {len(r) for r in current[topic].values()}
            after = {len(self.moves[topic].get(p, r)) for p, r in current[topic].items()}
            lines.append(f"{topic}: {len(self.moves[topic])} of {len(current[topic])} partitions move, "
                         f"replication {_span(before)} -> {_span(after)}")
        return lines


def _span(values: set[int]) -> str:
    return str(min(values)) if len(values) == 1 else f"{min(values)}-{max(values)}"


def plan_replicas(current: Assignment, brokers: list[int], replication: int,
                  drain: list[int] | tuple[int, ...] = ()) -> ReplicaPlan:
    """The partitions to move so every topic has `replication` replicas (at least) spread evenly
    over `brokers` and none on a broker of `drain`; `current` is what the cluster's metadata says now."""
    if not brokers or len(set(brokers)) != len(brokers):
        raise ValueError(f"brokers must be distinct broker ids, got {brokers}")
    if not 1 <= replication <= len(brokers):
        raise ValueError(f"replication must be between 1 and the {len(brokers)} brokers, got {replication}")
    if set(drain) & set(brokers):
        raise ValueError(f"a broker cannot both stay and be drained: {sorted(set(drain) & set(brokers))}")
    site = sorted(brokers)
    overall: Counter[int] = Counter({b: 0 for b in site})
    for parts in current.values():
        overall.update(b for replicas in parts.values() for b in replicas if b in overall)
    plan = ReplicaPlan()
    for topic in sorted(current):
        wanted = {p: [b for b in r if b not in drain] for p, r in current[topic].items()}
        strays = sorted({b for r in wanted.values() for b in r if b not in overall})
        if strays:
            plan.notes.append(f"{topic}: replicas on broker(s) {strays}, which are not the site's {site}; "
                              "left where they are (to move them off, retire the broker: kafka_retire=true)")
        _add_missing(wanted, site, replication, overall)
        _even_out(wanted, site, overall)
        lowered = sorted(p for p, r in wanted.items() if len(r) < len(current[topic][p]))
        if lowered:
            plan.notes.append(f"{topic}: {len(lowered)} partition(s) lose a replica with broker(s) {sorted(drain)} "
                              f"and keep {replication}: fewer brokers remain than they had replicas")
        changed = {p: r for p, r in wanted.items() if r != current[topic][p]}
        if changed:
            plan.moves[topic] = changed
        too_many = sorted(p for p, r in wanted.items() if len(r) > replication)
        if too_many:
            plan.notes.append(f"{topic}: {len(too_many)} partition(s) have more than {replication} replicas; "
                              "left as they are (replication is never lowered)")
    return plan


def _topic_counts(wanted: dict[int, list[int]], site: list[int]) -> Counter[int]:
    counts: Counter[int] = Counter({b: 0 for b in site})
    counts.update(b for r in wanted.values() for b in r if b in counts)
    return counts


def _add_missing(wanted: dict[int, list[int]], site: list[int], replication: int, overall: Counter[int]) -> None:
    counts = _topic_counts(wanted, site)
    for p in sorted(wanted):
        replicas = wanted[p]
        while len(replicas) < replication:
            target = min((b for b in site if b not in replicas), key=lambda b: (counts[b], overall[b], b))
            replicas.append(target)
            counts[target] += 1
            overall[target] += 1


def _even_out(wanted: dict[int, list[int]], site: list[int], overall: Counter[int]) -> None:
    counts = _topic_counts(wanted, site)
    while True:
        fullest = max(site, key=lambda b: (counts[b], overall[b], b))
        emptiest = min(site, key=lambda b: (counts[b], overall[b], b))
        if counts[fullest] - counts[emptiest] < 2:
            return
        candidates = [p for p in sorted(wanted) if fullest in wanted[p] and emptiest not in wanted[p]]
        if not candidates:
            return
        # A follower moves before a leader: moving the first replica changes the preferred leader.
        p = next((p for p in candidates if wanted[p][0] != fullest), candidates[0])
        replicas = wanted[p]
        replicas[replicas.index(fullest)] = emptiest
        counts[fullest] -= 1
        counts[emptiest] += 1
        overall[fullest] -= 1
        overall[emptiest] += 1


def min_insync_for(replication: int, target: int) -> int:
    """min.insync.replicas of a topic with `replication` replicas: the site's target, but always one
    less than the replicas (at least 1), so a partition keeps taking acks=all writes with one down."""
    return max(1, min(target, replication - 1))
