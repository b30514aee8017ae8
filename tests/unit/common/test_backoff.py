"""Exponential backoff (services.common.backoff) with the delays each user had before it was shared."""
from __future__ import annotations

import pytest

from services.common.backoff import Backoff


@pytest.mark.parametrize(("initial", "maximum", "expected"), [
    (0.5, 10.0, [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]),      # bridge: MQTT reconnect
    (1.0, 15.0, [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]),           # adapter: Cassandra connect, schema
    (0.25, 10.0, [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0]),     # adapter: write retries
])
def test_next_doubles_from_initial_up_to_maximum(initial, maximum, expected):
    backoff = Backoff(initial, maximum)
    assert [backoff.next() for _ in expected] == expected


def test_reset_starts_again_at_initial_and_current_is_the_next_delay():
    backoff = Backoff(0.5, 10.0)
    backoff.next()
    backoff.next()
    assert backoff.current == 2.0
    backoff.reset()
    assert backoff.current == 0.5 and backoff.next() == 0.5


@pytest.mark.parametrize("attempt", range(12))
def test_delay_by_attempt_equals_the_formulas_it_replaced(attempt):
    assert Backoff(0.25, 10.0).delay(attempt) == min(10.0, 0.25 * 2 ** attempt)        # adapter writer
    assert Backoff(0.5, 30.0).delay(attempt) == min(0.5 * 2 ** attempt, 30.0)           # webhook


def test_a_retry_that_goes_on_for_ever_stays_at_maximum_without_overflowing():
    assert Backoff(0.25, 10.0).delay(5000) == 10.0


def test_zero_initial_never_waits_and_a_shrinking_factor_is_refused():
    assert Backoff(0.0, 30.0).delay(3) == 0.0
    with pytest.raises(ValueError, match="factor"):
        Backoff(1.0, 10.0, factor=0.5)
