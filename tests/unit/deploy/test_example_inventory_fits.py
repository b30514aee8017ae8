"""inventory.example's stacks, rendered as the stack role renders them, give no JVM a heap its container cannot hold.

Each site's stack file comes from the role's templates with the manager's inventory variables
(tooling/testbed/stack_render.py); every heap a rendered service passes its JVMs (heap options, Cassandra's
heap, Spark's daemon, worker and driver memory) is held against the service's memory limit by preflight's rule.
"""
from __future__ import annotations

import pytest

from deploy.preflight import DEFAULT_HEAP_SHARE, HEAP_SHARE, jvm_size, memory_limit, opts_heap
from deploy.topology import site_topology
from tooling.testbed.stack_render import REPO, load_inventory, render

SITES = [("site_a", "edge"), ("site_b", "edge"), ("datacenter", "datacenter")]
HEAP_OPTIONS = ("ZOO_HEAP_OPTS", "KAFKA_HEAP_OPTS", "MM2_HEAP_OPTS")
# Sizes of Spark's JVMs in one container: the master's or worker's daemon, the worker's executors.
SPARK_SIZES = ("SPARK_DAEMON_MEMORY", "SPARK_WORKER_MEMORY")


def service_heaps(service: dict) -> tuple[dict[str, int], float]:
    """The heaps a rendered service gives its JVMs ({where it says so: bytes}) and their share of its limit."""
    environment, command = service.get("environment") or {}, service.get("command") or []
    heaps = {name: opts_heap(environment[name]) for name in HEAP_OPTIONS if name in environment}
    heaps |= {name: jvm_size(environment[name]) for name in (*SPARK_SIZES, "CASSANDRA_HEAP") if name in environment}
    if "--driver-memory" in command:
        heaps["--driver-memory"] = jvm_size(command[command.index("--driver-memory") + 1])
    return heaps, HEAP_SHARE["cassandra"] if "CASSANDRA_HEAP" in environment else DEFAULT_HEAP_SHARE


@pytest.fixture(scope="module")
def stacks() -> dict[str, dict]:
    hostvars, groups = load_inventory(REPO / "inventory.example")
    rendered = {}
    for group, tier in SITES:
        topology = site_topology(hostvars, groups[group], group.replace("_", "-"), tier)
        rendered[group] = render(tier, topology, host_vars=hostvars[topology["manager"]])
    return rendered


@pytest.mark.parametrize("group", [group for group, _ in SITES])
def test_every_heap_of_the_example_fits_its_containers_memory_limit(stacks, group):
    services = stacks[group]["services"]
    unfit, checked = [], []
    for name, service in sorted(services.items()):
        heaps, share = service_heaps(service)
        if not any(heaps.values()):
            continue
        limit_text = service["deploy"]["resources"]["limits"]["memory"]
        limit = memory_limit(limit_text)
        assert None not in heaps.values() and limit, f"{name}: unreadable sizes {heaps} or limit {limit_text!r}"
        checked.append(name)
        if sum(heaps.values()) > limit * share:
            unfit.append(f"{name}: {heaps} ({sum(heaps.values()) >> 20} MiB) over {share:.0%} of {limit_text}")
    assert not unfit, "heaps that do not fit their containers in inventory.example:\n" + "\n".join(unfit)
    # Every JVM service was found, so the check cannot pass on a stack it failed to read.
    jvms = {"zookeeper-1", "kafka-1", "cassandra-1", "spark-master", "spark-worker"}
    jvms |= {"mirrormaker", "notifier"} if group == "datacenter" else {"threshold-detector", "rollups"}
    assert jvms <= set(checked), f"JVM services without a heap found: {sorted(jvms - set(checked))}"


def test_the_examples_heaps_are_its_own_not_the_defaults(stacks):
    """The render used the example's sizes (group_vars/all/sizes.yml), not only the role's defaults."""
    environment = stacks["site_a"]["services"]["kafka-1"]["environment"]
    assert environment["KAFKA_HEAP_OPTS"] == "-Xms1536m -Xmx1536m"
