"""A rolling upgrade of one lab site, as an operator runs it, and when each of its stateful nodes was down.

`run(hosts, site)` makes a new version of every project image (same tag, new id: the image plus one label,
as a rebuild with changed inputs would give), reruns site.yml for the site (the images role ships them, and
the stack role deploys in stages: deploy/rollout.py), then reads the Docker events of the site's hosts over
the run, streamed into a file per host while the upgrade runs (why: docs/operations.md, "Upgrades"). A node
is down from the first kill, stop or die of its container until a container of the same service reports
healthy (each stateful service has a healthcheck), so the figures include the time a node takes to serve
again, not only its process restart.

tooling/lab/chaos.py runs it as the `rolling-upgrade` case while a device publishes
(tests/lab/test_6_upgrade.py asserts nothing acknowledged was lost and no two nodes of a kind were down at
once).
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass, field

from tooling.build.progress import log
from tooling.lab import lab
from tooling.testbed import stack_render

IMAGES = stack_render.STACK_IMAGES     # every image the stacks run
STATEFUL = re.compile(r"^(zookeeper|kafka|cassandra)-\d+$")
# Not "health_status: unhealthy": a loaded node's check can time out once while it keeps serving.
DOWN_ACTIONS = ("kill", "stop", "die")
UP_ACTION = "health_status: healthy"


@dataclass(frozen=True)
class Downtime:
    service: str          # e.g. kafka-2
    start: float          # epoch seconds
    end: float            # epoch seconds; the end of the window when it never came back

    @property
    def kind(self) -> str:
        return self.service.rsplit("-", 1)[0]

    @property
    def seconds(self) -> float:
        return round(self.end - self.start, 1)


@dataclass
class Upgrade:
    site: str
    started: float
    finished: float
    images: dict[str, str]                         # name -> new id
    downtimes: list[Downtime] = field(default_factory=list)

    def restarted(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for down in self.downtimes:
            counts[down.service] = counts.get(down.service, 0) + 1
        return counts

    def summary(self) -> str:
        downs = ", ".join(f"{d.service} {d.seconds:g}s" for d in sorted(self.downtimes, key=lambda d: d.start))
        return f"upgrade of {self.site} took {self.finished - self.started:.0f}s; down: {downs or 'none'}"


def rebuild(stamp: str) -> dict[str, str]:
    """A new version of every project image under its own tag; returns name -> new image id."""
    tag = lab.pins.load().image_tag
    ids = {}
    for name in IMAGES:
        ref = f"iot-stack/{name}:{tag}"
        dockerfile = f"FROM {ref}\nLABEL org.iot-stack.upgrade-test=\"{stamp}\"\n"
        subprocess.run(["docker", "build", "-q", "-t", ref, "-"], input=dockerfile, text=True, check=True,
                       capture_output=True, timeout=600)
        ids[name] = lab.run("docker", "image", "inspect", "-f", "{{.Id}}", ref).stdout.strip()
    log("upgrade", f"new image versions ({stamp}): " + ", ".join(f"{n} {i[7:19]}" for n, i in ids.items()))
    return ids


class EventStream:
    """Container events of the site's stack on every host of the site, from now until stop(): one
    `docker events` per host, written to a file (a pipe left unread would stall it over a long run)."""

    def __init__(self, hosts: list[lab.LabHost], site: str) -> None:
        self.files = []
        self.procs = []
        for host in (h for h in hosts if h.site == site):
            path = lab.lab_dir() / f"upgrade-events-{host.name}.jsonl"
            out = path.open("w")
            self.files.append((path, out))
            self.procs.append(subprocess.Popen(
                ["docker", "exec", host.container, "docker", "events", "--filter", "type=container",
                 "--filter", f"label=com.docker.stack.namespace={site}", "--format", "{{json .}}"],
                stdout=out, stderr=subprocess.DEVNULL))

    def stop(self) -> list[dict]:
        """Ends the streams; every event they wrote, oldest first."""
        time.sleep(2)                  # the last events of the run reach the files
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        found = []
        for path, out in self.files:
            out.close()
            found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return sorted(found, key=lambda e: int(e.get("timeNano", 0)))


def downtimes(found: list[dict], site: str, until: float) -> list[Downtime]:
    """When each stateful service of `site` was down, from its containers' events (see the module docstring)."""
    down_since: dict[str, float] = {}
    result = []
    for event in found:
        service = event.get("Actor", {}).get("Attributes", {}).get("com.docker.swarm.service.name", "")
        name = service.removeprefix(f"{site}_")
        if not STATEFUL.match(name):
            continue
        action = event.get("Action") or event.get("status") or ""
        when = int(event["timeNano"]) / 1e9
        if action in DOWN_ACTIONS and name not in down_since:
            down_since[name] = when
        elif action == UP_ACTION and name in down_since:
            result.append(Downtime(name, down_since.pop(name), when))
    result += [Downtime(name, start, until) for name, start in down_since.items()]
    return sorted(result, key=lambda d: d.start)


def overlapping(downs: list[Downtime]) -> list[tuple[Downtime, Downtime]]:
    """Pairs of nodes of one kind (two brokers, say) that were down at the same time."""
    pairs = []
    for i, first in enumerate(downs):
        for second in downs[i + 1:]:
            if first.kind == second.kind and first.service != second.service \
                    and first.start < second.end and second.start < first.end:
                pairs.append((first, second))
    return pairs


def run(hosts: list[lab.LabHost], site: str) -> Upgrade:
    """New image versions, then site.yml for the site; the stateful nodes' downtimes over the run."""
    group = next(h.group for h in hosts if h.site == site)
    stream = EventStream(hosts, site)
    started = time.time()
    try:
        ids = rebuild(time.strftime("%Y%m%dT%H%M%S"))
        lab.playbook(lab.write_inventory(hosts), "--limit", group)
    finally:
        finished = time.time()
        found = stream.stop()
    upgrade = Upgrade(site, started, finished, ids, downtimes(found, site, finished))
    log("upgrade", upgrade.summary())
    return upgrade
