"""Where a running lab's CPU goes: each service's cores over a window, from cgroup counters.

The lab's services run in the engines inside the lab hosts (containers on this machine), and those engines
make their containers' cgroups in this machine's cgroup tree, so their CPU counters can be read here: two reads
`window` seconds apart give each container's mean cores over that window exactly (tooling/bench/cgroup.py),
not a `docker stats` moment. Each lab host's own processes (its engine, containerd, sshd) are counted as
"<host> engine". `scripts/lab cpu` prints the table; the lab tests print it over the last minute of their
warm-up wait (tests/lab/conftest.py).
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tooling.bench import cgroup

SWARM_SERVICE = "com.docker.swarm.service.name"


class Host(Protocol):      # tooling.lab.lab.LabHost, which imports this module for `scripts/lab cpu`
    name: str
    container: str


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60).stdout


@dataclass(frozen=True)
class Container:
    host: str           # the lab host, e.g. site-a-1
    name: str           # the Swarm service (e.g. site-a_kafka-1), else the container's name
    cgroup_id: str      # the id its cgroup directory is named after


def cpu_ns(cgroup_id: str, root: Path = cgroup.ROOT) -> int | None:
    """CPU nanoseconds a container used since it started; None if its cgroup is gone (it stopped)."""
    for group in (root / "cpuacct" / "docker" / cgroup_id,                  # v1, cgroupfs driver
                  root / "system.slice" / f"docker-{cgroup_id}.scope", root / "docker" / cgroup_id):   # v2
        try:
            return cgroup.cpu_ns_in(group)
        except OSError:     # not this layout, or removed between the look and the read: the container stopped
            continue
    return None


def parse_ps(host: str, text: str) -> list[Container]:
    """Containers from `docker ps --no-trunc --format '{{.ID}}\\t{{.Names}}\\t{{.Label "..."}}'` in a lab host."""
    found = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0]:
            found.append(Container(host, parts[2] or parts[1], parts[0]))
    return found


def containers(hosts: Iterable[Host]) -> list[Container]:
    """Every lab host's own processes and every container its engine runs."""
    found = []
    for host in hosts:
        host_id = _docker("inspect", "-f", "{{.Id}}", host.container).strip()
        found.append(Container(host.name, f"{host.name} engine", host_id))
        found += parse_ps(host.name, _docker("exec", host.container, "docker", "ps", "--no-trunc", "--format",
                                             "{{.ID}}\t{{.Names}}\t{{.Label \"" + SWARM_SERVICE + "\"}}"))
    return found


def sample(found: list[Container], read: Callable[[str], int | None] = cpu_ns) -> dict[Container, int]:
    counts = {}
    for container in found:
        value = read(container.cgroup_id)
        if value is not None:
            counts[container] = value
    return counts


def cores(before: dict[Container, int], after: dict[Container, int], seconds: float) -> dict[str, float]:
    """Mean cores per service name between two samples (a service's replicas on several hosts add up);
    a container that started or stopped between them is left out."""
    used: dict[str, float] = {}
    for container, end in after.items():
        if container in before:
            used[container.name] = used.get(container.name, 0.0) + (end - before[container]) / 1e9 / seconds
    return used


def table(used: dict[str, float], seconds: float, top: int = 15) -> str:
    """The services by cores, the busiest first, the rest summed, and the total."""
    ranked = sorted(used.items(), key=lambda item: -item[1])
    lines = [f"lab CPU over {seconds:.0f} s, cores (core-seconds per second), busiest first:"]
    lines += [f"  {value:6.3f}  {name}" for name, value in ranked[:top]]
    rest = ranked[top:]
    if rest:
        lines.append(f"  {sum(value for _, value in rest):6.3f}  {len(rest)} others")
    lines.append(f"  {sum(used.values()):6.3f}  total of {len(used)}")
    return "\n".join(lines)


class LastMinute:
    """Samples taken along a wait (each `take()`), keeping what the last `window_s` seconds need: the lab tests
    sample at every load reading of their warm-up wait and print where the CPU went in its last minute."""

    def __init__(self, found: list[Container], window_s: float = 60.0,
                 read: Callable[[str], int | None] = cpu_ns, clock: Callable[[], float] = time.monotonic):
        self.found, self.window_s, self.read, self.clock = found, window_s, read, clock
        self.samples: list[tuple[float, dict[Container, int]]] = []

    def take(self) -> None:
        now = self.clock()
        self.samples.append((now, sample(self.found, self.read)))
        # Keep the newest sample at least window_s old, and everything after it.
        while len(self.samples) > 1 and now - self.samples[1][0] >= self.window_s:
            self.samples.pop(0)

    def table(self) -> str | None:
        """The table between the oldest kept sample and the newest; None before two samples."""
        if len(self.samples) < 2:
            return None
        (start, before), (end, after) = self.samples[0], self.samples[-1]
        return table(cores(before, after, end - start), end - start)


def measure(hosts: Iterable[Host], window_s: float, sleep: Callable[[float], None] = time.sleep) -> str:
    found = containers(hosts)
    started = time.monotonic()
    before = sample(found)
    sleep(window_s)
    after = sample(found)
    elapsed = time.monotonic() - started
    return table(cores(before, after, elapsed), elapsed)
