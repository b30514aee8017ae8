"""Wait, boundedly, for a freshly started lab to stop warming up before tests measure it.

Right after `scripts/lab up` every JVM of the lab (four Kafkas, three Cassandras and ZooKeepers, MirrorMaker,
three Spark drivers) compiles its hot code and Cassandra flushes and compacts: on a 2-core machine the load average
stays at 35-40 for several minutes, then falls to about 4 with the simulated devices still publishing (measured
with the lab up, `cat /proc/loadavg`). A lab test started inside that window can see a broker miss librdkafka's
10 s API-version timeout or a `cqlsh` miss its 60 s: a harness artefact, not a fault of the stack. The lab tests
(tests/lab/conftest.py) therefore wait until the 1-minute load average has stayed under PER_CORE times the cores
for CALM_SAMPLES samples in a row, or until it has stopped falling under STEADY_PER_CORE times the cores (a lab
whose devices and jobs keep it busier than "calm" on a slow machine: a fresh-clone CI run on 2026-11-29 waited the
whole 600 s then and ended at load 9.2 on 2 cores, the landing CI of stop 44 at 14.8, and both smokes passed), at most
LIMIT_S, printing the load as they wait; after the limit they go on and say so. Nothing is skipped and no
timeout is raised by the wait itself.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

PER_CORE = 3.0          # calm: 1-minute load under 3 per core (idle lab with devices: about 2 per core)
CALM_SAMPLES = 2        # in a row, `interval_s` apart
INTERVAL_S = 15.0
LIMIT_S = 240.0         # the full 600 s on 2026-11-29 ended at load 55.9: waiting longer did not calm it
STEADY_PER_CORE = 10.0  # steady: under 10 per core (warm-up peaks at 17-34 per core) and...
STEADY_SAMPLES = 5      # ...not lower than 90 % of the load a minute (4 intervals) earlier


@dataclass(frozen=True)
class Settled:
    calm: bool          # calm or steady; False: the limit came first
    waited_s: float
    load: float         # the last 1-minute load average read
    cores: int
    steady: bool = False  # ended because the load stopped falling, not because it was calm

    def describe(self) -> str:
        if not self.calm:
            state = "still busy at the limit; the tests go on"
        else:
            state = "steady (busy, no longer falling)" if self.steady else "calm"
        return f"lab load {self.load:.1f} on {self.cores} cores after {self.waited_s:.0f} s of waiting: {state}"


def is_calm(recent_loads: list[float], cores: int, per_core: float = PER_CORE,
            calm_samples: int = CALM_SAMPLES) -> bool:
    """The last `calm_samples` loads are each under per_core x cores."""
    tail = recent_loads[-calm_samples:]
    return len(tail) == calm_samples and all(load < per_core * cores for load in tail)


def is_steady(recent_loads: list[float], cores: int) -> bool:
    """Past the warm-up peak (under STEADY_PER_CORE x cores) and no longer falling: the last load is at
    least 90 % of the one STEADY_SAMPLES - 1 samples before it."""
    tail = recent_loads[-STEADY_SAMPLES:]
    return (len(tail) == STEADY_SAMPLES and all(load < STEADY_PER_CORE * cores for load in tail)
            and tail[-1] >= 0.9 * tail[0])


def wait_until_calm(limit_s: float = LIMIT_S, interval_s: float = INTERVAL_S,
                    load: Callable[[], float] = lambda: os.getloadavg()[0],
                    cores: int | None = None, sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic, say: Callable[[str], None] | None = None) -> Settled:
    cores = cores or os.cpu_count() or 1
    say = say or (lambda text: print(f"[lab] {text}", file=sys.stderr, flush=True))
    started = clock()
    loads: list[float] = []
    while True:
        loads.append(load())
        waited = clock() - started
        if is_calm(loads, cores):
            return Settled(True, waited, loads[-1], cores)
        if is_steady(loads, cores):
            return Settled(True, waited, loads[-1], cores, steady=True)
        if waited >= limit_s:
            return Settled(False, waited, loads[-1], cores)
        if len(loads) % 4 == 1:         # once a minute at the default interval
            say(f"waiting for the lab to warm up: load {loads[-1]:.1f} on {cores} cores "
                f"(calm under {PER_CORE * cores:.0f}), {waited:.0f} s of at most {limit_s:.0f} s")
        sleep(interval_s)
