"""The late-PUBACK window: messages received on the current MQTT connection, acked in arrival order
once Kafka has their record. Pure logic, unit-tested without brokers."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from services.bridge.routing import Record


@dataclass(slots=True)
class Entry:
    seq: int
    mid: int
    qos: int
    received: float                    # monotonic time of receipt, for the latency histogram
    record: Record
    delivered: bool = False


@dataclass
class Window:
    """Messages received on the current MQTT connection and not yet acked, in arrival order.

    PUBACKs go out in arrival order (MQTT v5 4.6: a receiver acks QoS 1 PUBLISHes in the order
    received), so a delivered entry waits for older ones. On a lost connection every entry is
    dropped (`reset`): the broker redelivers those messages on the resumed session, and acking an
    old packet id on a new connection could ack a *different* message that reused the id.
    """
    size: int
    _order: deque[Entry] = field(default_factory=deque)
    _by_seq: dict[int, Entry] = field(default_factory=dict)
    _next: int = 0

    def __len__(self) -> int:
        return len(self._by_seq)

    @property
    def added(self) -> int:
        """Messages added so far (a cheap 'did that read bring a message?')."""
        return self._next

    def room(self) -> int:
        return max(0, self.size - len(self._by_seq))

    def add(self, mid: int, qos: int, received: float, record: Record) -> Entry:
        self._next += 1
        entry = Entry(self._next, mid, qos, received, record)
        self._order.append(entry)
        self._by_seq[entry.seq] = entry
        return entry

    def get(self, seq: int) -> Entry | None:
        """The live entry, or None when it was dropped by a reset (its delivery no longer acks anything)."""
        return self._by_seq.get(seq)

    def pop_ackable(self) -> list[Entry]:
        """Remove and return the delivered prefix: these are the messages to PUBACK now."""
        out = []
        while self._order and self._order[0].delivered:
            entry = self._order.popleft()
            del self._by_seq[entry.seq]
            out.append(entry)
        return out

    def reset(self) -> int:
        """Forget everything (connection lost); returns how many messages the broker will redeliver."""
        dropped = len(self._by_seq)
        self._order.clear()
        self._by_seq.clear()
        return dropped
