"""Preflight refuses a JVM heap that does not fit its container's memory limit (deploy/preflight.py heap_refusals).

The rule: the heaps in a container take at most 75 % of stack_resources.<service>.memory, Cassandra's at most
50 %; each refusal names the heap's variable, the limit's variable and both fixes.
"""
from __future__ import annotations

import pytest
import yaml

from deploy.preflight import heap_refusals, jvm_size, memory_limit, opts_heap
from tooling.lab.lab import LAB_GROUP_VARS
from tooling.testbed.stack_render import stack_defaults

DEFAULTS = stack_defaults()
HEAP, RESOURCES, SPARK = DEFAULTS["stack_heap"], DEFAULTS["stack_resources"], DEFAULTS["stack_spark"]


def _refusals(heap=None, resources=None, spark=None) -> list[str]:
    return heap_refusals({**HEAP, **(heap or {})}, {**RESOURCES, **(resources or {})}, {**SPARK, **(spark or {})})


@pytest.mark.parametrize("text, size", [("4G", 4 << 30), ("1536m", 1536 << 20), ("512k", 512 << 10),
                                        ("1073741824", 1 << 30), ("1.5g", None), ("4GB", None), ("", None)])
def test_jvm_sizes_read_as_the_jvm_reads_them(text, size):
    assert jvm_size(text) == size


@pytest.mark.parametrize("text, size", [("3G", 3 << 30), ("1536M", 1536 << 20), ("1.5g", 3 << 29),
                                        ("512MiB", 512 << 20), (1073741824, 1 << 30), ("lots", None)])
def test_memory_limits_read_as_docker_reads_them(text, size):
    assert memory_limit(text) == size


@pytest.mark.parametrize("opts, size", [("-Xms256m -Xmx512m", 512 << 20), ("-Xmx1g -Xmx2g", 2 << 30),
                                        ("-Xms768m", 768 << 20), ("-XX:+UseG1GC", 0), ("-Xmx2gb", None)])
def test_the_heap_of_jvm_options_is_the_last_xmx_else_xms(opts, size):
    assert opts_heap(opts) == size


def test_the_roles_defaults_and_the_labs_sizes_fit():
    assert _refusals() == []
    lab = yaml.safe_load(LAB_GROUP_VARS)
    assert heap_refusals(lab["stack_heap"], lab["stack_resources"], lab["stack_spark"]) == []


def test_cassandras_heap_over_half_its_container_is_refused_naming_both_variables_and_the_fix():
    assert _refusals(heap={"cassandra": "4G"}) == [
        "stack_heap.cassandra = 4G (4G of heap) does not fit stack_resources.cassandra.memory = 3G: the heap may"
        " take at most 50% of the container's memory limit (1536M; the rest is Cassandra's off-heap memory:"
        " memtables and caches), or the container is killed for memory. Lower stack_heap.cassandra to 1536M or"
        " less, or raise stack_resources.cassandra.memory to 8G or more."]
    assert _refusals(heap={"cassandra": "1536M"}) == []


@pytest.mark.parametrize("key, fits, too_big", [
    ("kafka", "-Xms1536m -Xmx1536m", "-Xms2g -Xmx2g"),
    ("zookeeper", "-Xmx384m", "-Xms256m -Xmx512m"),
    ("mirrormaker", "-Xms512m -Xmx768m", "-Xms512m -Xmx1g"),
])
def test_a_jvm_heap_over_three_quarters_of_its_container_is_refused(key, fits, too_big):
    assert _refusals(heap={key: fits}) == []
    (refusal,) = _refusals(heap={key: too_big})
    assert refusal.startswith(f"stack_heap.{key} = {too_big} (")
    assert f"does not fit stack_resources.{key}.memory = {RESOURCES[key]['memory']}: the heap may take at most 75%" \
        in refusal
    assert f"Lower the -Xmx of stack_heap.{key} to " in refusal and f"raise stack_resources.{key}.memory to " in refusal


def test_a_bigger_container_lets_the_same_heap_pass():
    assert _refusals(heap={"kafka": "-Xmx2g"}, resources={"kafka": {"cpus": "2.0", "memory": "3G"}}) == []
    assert _refusals(heap={"cassandra": "4G"}, resources={"cassandra": {"cpus": "2.0", "memory": "8G"}}) == []


def test_the_spark_workers_daemon_and_executor_memory_share_its_container():
    (refusal,) = _refusals(spark={"worker_memory": "3g"})
    assert refusal.startswith("stack_spark.daemon_memory + stack_spark.worker_memory = 512m + 3g (3584M of heap)"
                              " does not fit stack_resources.spark_worker.memory = 4G")
    assert "Lower stack_spark.worker_memory to 2560M or less, or raise stack_resources.spark_worker.memory" in refusal


def test_the_spark_drivers_heap_is_checked_in_both_modes_the_master_and_worker_only_in_cluster_mode():
    assert [r.split(" does not fit ")[1].split(" =")[0] for r in _refusals(spark={"driver_memory": "2g"})] == \
        ["stack_resources.spark_job.memory"]
    assert _refusals(spark={"mode": "local", "worker_memory": "8g", "daemon_memory": "2g"}) == []
    assert len(_refusals(spark={"daemon_memory": "1g"})) == 2   # the master's and the worker's container


def test_unreadable_or_missing_sizes_are_named():
    assert _refusals(heap={"cassandra": "4 gigs"}) == [
        "stack_heap.cassandra = '4 gigs' must be a size such as 4G or 1536M"
        " (Cassandra's -Xms and -Xmx, CASSANDRA_HEAP)"]
    heap = {k: v for k, v in HEAP.items() if k != "kafka"}
    assert heap_refusals(heap, RESOURCES, SPARK) == [
        "stack_heap.kafka = None must be JVM heap options with sizes the JVM reads, e.g. \"-Xms512m -Xmx1g\""
        " (the stack passes it as KAFKA_HEAP_OPTS)"]
    assert _refusals(resources={"kafka": {"cpus": "2.0"}}) == [
        "stack_resources.kafka.memory = None must be a memory limit such as 3G or 1536M"]
    assert _refusals(spark={"worker_memory": "lots"}) == [
        "stack_spark.worker_memory = 'lots' must be a size such as 512m or 2g (Spark's memory settings)"]
