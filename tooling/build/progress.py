"""Progress lines for long operations: '[stage +12.3s] message' on stderr."""
from __future__ import annotations

import sys
import time

_START = time.monotonic()
_last: dict[str, float] = {}


def log(stage: str, message: str, every: float = 0.0, force: bool = False) -> None:
    """Print a progress line; with `every`, at most one line per stage per `every` seconds."""
    now = time.monotonic()
    if every and not force and now - _last.get(stage, -every) < every:
        return
    _last[stage] = now
    print(f"[{stage} +{now - _START:.1f}s] {message}", file=sys.stderr, flush=True)
