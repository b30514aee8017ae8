"""A container's CPU time and memory from its cgroup's counters, read on the Docker host.

`docker stats` samples a moment; the counters add up every nanosecond a container ran, so two reads a minute
apart give its mean CPU over that minute exactly. The cgroup is found from the container's first process
(/proc/<pid>/cgroup), so the same code reads cgroup v1 (cpuacct, memory) and v2 (one unified tree), with
Docker's cgroupfs or systemd driver.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def cgroup_paths(proc_cgroup: str) -> dict[str, str]:
    """controller -> path of /proc/<pid>/cgroup's lines ("4:cpu,cpuacct:/docker/<id>"); the unified
    hierarchy (cgroup v2, "0::/system.slice/docker-<id>.scope") is under the key ""."""
    paths: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller] = parts[2]
    return paths


def stat_value(text: str, key: str) -> int:
    """The value of `key` in a "key value" per line file (cpu.stat, memory.stat); 0 when absent."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


@dataclass(frozen=True)
class Counters:
    cpu_ns: int          # CPU time used since the container started, in nanoseconds
    memory_bytes: int    # memory in use less the page cache the kernel may drop (as `docker stats` shows it)


def cpu_ns_in(group: Path) -> int:
    """CPU nanoseconds of one cgroup directory: cpuacct.usage (v1) or cpu.stat's usage_usec (v2)."""
    if (group / "cpuacct.usage").exists():
        return int((group / "cpuacct.usage").read_text())
    return stat_value((group / "cpu.stat").read_text(), "usage_usec") * 1000


def read(pid: int, root: Path = ROOT) -> Counters:
    """The counters of the cgroup process `pid` is in."""
    paths = cgroup_paths(Path(f"/proc/{pid}/cgroup").read_text())
    if "cpuacct" in paths:                              # cgroup v1
        cpu_dir = next(d for d in (root / "cpuacct", root / "cpu,cpuacct") if d.exists())
        cpu_ns = cpu_ns_in(cpu_dir / paths["cpuacct"].lstrip("/"))
        memory = root / "memory" / paths["memory"].lstrip("/")
        used = int((memory / "memory.usage_in_bytes").read_text())
        inactive = stat_value((memory / "memory.stat").read_text(), "total_inactive_file")
    else:                                               # cgroup v2
        group = root / paths[""].lstrip("/")
        cpu_ns = cpu_ns_in(group)
        used = int((group / "memory.current").read_text())
        inactive = stat_value((group / "memory.stat").read_text(), "inactive_file")
    return Counters(cpu_ns, max(used - inactive, 0))


def cores(before: Counters, after: Counters, seconds: float) -> float:
    """Mean cores used between two reads `seconds` apart (core-seconds per second)."""
    return (after.cpu_ns - before.cpu_ns) / 1e9 / seconds
