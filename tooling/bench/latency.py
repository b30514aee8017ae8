"""Latency figures of the benchmarks: p50/p95/p99/max of a list of milliseconds."""
from __future__ import annotations


def percentiles(values: list[int]) -> dict:
    """n, p50, p95, p99 and max, each picked from the sorted values (None when there are none)."""
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99), "max": ordered[-1]}
