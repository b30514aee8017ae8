"""Exponential backoff: initial, initial * factor, ... capped at maximum. Standard library only.

Two ways to use it, same delays:
- a retry loop keeps one Backoff and calls `next()` before each wait and `reset()`
  after a success (the bridge's MQTT reconnect, the adapter's Cassandra connect);
- whoever counts attempts itself asks `delay(attempt)` (the adapter's write
  retries keep the attempt count per request; the webhook per message).
"""
from __future__ import annotations


class Backoff:
    def __init__(self, initial: float, maximum: float, factor: float = 2.0):
        if initial < 0 or factor < 1:
            raise ValueError(f"backoff needs initial >= 0 and factor >= 1 (got initial={initial}, factor={factor})")
        self.initial, self.maximum, self.factor = initial, maximum, factor
        # The attempt from which the delay is `maximum`: later attempts stop growing the exponent,
        # so a retry that goes on for days never overflows a float.
        self._cap = 0
        if initial > 0 and factor > 1:
            while initial * factor ** self._cap < maximum:
                self._cap += 1
        self.attempt = 0

    def delay(self, attempt: int) -> float:
        """The wait before retry number `attempt` + 1 (attempt 0: the first retry waits `initial`)."""
        return min(self.maximum, self.initial * self.factor ** min(attempt, self._cap))

    @property
    def current(self) -> float:
        """The delay the next call of `next()` returns."""
        return self.delay(self.attempt)

    def next(self) -> float:
        """The delay to wait now; the following one is `factor` times longer (up to `maximum`)."""
        delay = self.delay(self.attempt)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        """Back to `initial` (after a success)."""
        self.attempt = 0
