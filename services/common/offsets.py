"""Which Kafka offsets may be committed: only past a contiguous run of finished records.

Writes finish out of order (many in flight, retries), so per partition the
tracker keeps the consumed offsets in order and commits up to the first one that
is not finished yet. A record counts as finished when its work is done (the
adapter: its row is written; the bridge's command path: the broker PUBACKed it) or
its dead-letter copy is acknowledged. Pure Python; one thread owns each tracker
(the adapter's main loop, the bridge's loop).
"""
from __future__ import annotations

from collections import deque

Partition = tuple[str, int]   # (topic, partition)


class OffsetTracker:
    def __init__(self) -> None:
        self._pending: dict[Partition, deque[int]] = {}
        self._finished: dict[Partition, set[int]] = {}
        self._committable: dict[Partition, int] = {}    # next offset to consume, not committed yet

    def consumed(self, tp: Partition, offset: int) -> None:
        try:
            self._pending[tp].append(offset)        # once per record: the common case first
        except KeyError:
            self._pending[tp] = deque((offset,))
            self._finished.setdefault(tp, set())

    def finished(self, tp: Partition, offset: int) -> None:
        """Mark one record done; ignored for partitions dropped since (revoked)."""
        pending = self._pending.get(tp)
        if pending is None:
            return
        done = self._finished[tp]
        done.add(offset)
        advanced = None
        while pending and pending[0] in done:
            advanced = pending.popleft()
            done.discard(advanced)
        if advanced is not None:
            self._committable[tp] = advanced + 1

    def take_commits(self) -> dict[Partition, int]:
        """Offsets (next to read) that became committable since the last call."""
        commits, self._committable = self._committable, {}
        return commits

    def recommit(self, tp: Partition, offset: int) -> None:
        """A commit failed: offer it again unless a newer one is waiting or the partition is gone."""
        if tp in self._pending and offset > self._committable.get(tp, -1):
            self._committable[tp] = offset

    def outstanding(self, tp: Partition | None = None) -> int:
        """Records consumed but not finished, on one partition or on all."""
        tps = [tp] if tp is not None else list(self._pending)
        return sum(len(self._pending.get(t, ())) - len(self._finished.get(t, ())) for t in tps)

    def drop(self, tp: Partition) -> None:
        """Forget a partition (revoked): its unfinished records will be redelivered to the new owner."""
        self._pending.pop(tp, None)
        self._finished.pop(tp, None)
        self._committable.pop(tp, None)
