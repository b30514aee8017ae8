"""iot-topics from the services image against a real broker: what the Ansible topics role runs."""
from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType

from tooling.testbed.docker_lab import docker, image
from tooling.testbed.kafka_cluster import start_kafka_cluster

RETENTION_MS = 86_400_000
SPEC = [
    {"name": "temperature-data", "partitions": 6, "cleanup": "delete"},
    {"name": "device-registration", "partitions": 1, "cleanup": "compact"},
    {"name": "dead-letter", "partitions": 2, "cleanup": "delete", "retention_ms": 3_600_000},
]
NAMES = sorted(t["name"] for t in SPEC)


@pytest.fixture(scope="module")
def cluster(lab):
    return start_kafka_cluster(lab)


def ensure(lab, bootstrap: str, *extra: str, spec: list[dict] = SPEC, wait: int = 120):
    """`iot-topics ensure` as the role runs it: a throwaway container on the brokers' network."""
    return docker("run", "--rm", "--network", lab.network, image("services"), "iot-topics", "ensure",
                  "--bootstrap", bootstrap, "--spec", json.dumps(spec), "--replication", "1", "--min-insync", "1",
                  "--retention-ms", str(RETENTION_MS), "--wait-seconds", str(wait), *extra,
                  check=False, timeout=wait + 180)


def summary(result) -> dict:
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout
    return json.loads(lines[0])


def topics(cluster) -> dict:
    return AdminClient({"bootstrap.servers": cluster.external}).list_topics(timeout=30).topics


def configs(cluster, name: str) -> dict:
    admin = AdminClient({"bootstrap.servers": cluster.external})
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)]).values()
    return future.result(timeout=60)


def set_on_topic(entry) -> bool:
    """The config was given to this topic (rather than inherited from the broker)."""
    return ConfigSource(entry.source) == ConfigSource.DYNAMIC_TOPIC_CONFIG


def test_dry_run_reports_every_topic_and_creates_nothing(lab, cluster):
    assert summary(ensure(lab, cluster.internal, "--dry-run")) == {
        "existing": [], "created": [], "would_create": NAMES}
    assert not set(NAMES) & set(topics(cluster))


def test_first_run_creates_every_topic_with_partitions_and_configs(lab, cluster):
    result = ensure(lab, cluster.internal)
    assert summary(result) == {"existing": [], "created": NAMES, "would_create": []}
    present = topics(cluster)
    assert {t["name"]: len(present[t["name"]].partitions) for t in SPEC} == {
        "temperature-data": 6, "device-registration": 1, "dead-letter": 2}
    data, registration, dead = (configs(cluster, t["name"]) for t in SPEC)
    assert data["cleanup.policy"].value == "delete"
    assert data["retention.ms"].value == str(RETENTION_MS)
    assert dead["retention.ms"].value == "3600000"   # the topic's own retention_ms wins
    assert registration["cleanup.policy"].value == "compact"
    # A compacted topic gets no retention.ms of its own.
    assert not set_on_topic(registration["retention.ms"])
    for entries in (data, registration, dead):
        assert entries["min.insync.replicas"].value == "1"
        assert set_on_topic(entries["min.insync.replicas"])


def test_second_run_changes_nothing(lab, cluster):
    assert summary(ensure(lab, cluster.internal)) == {"existing": NAMES, "created": [], "would_create": []}


def test_dry_run_with_a_new_topic_lists_only_that_one(lab, cluster):
    spec = [*SPEC, {"name": "notifications", "partitions": 3, "cleanup": "delete"}]
    assert summary(ensure(lab, cluster.internal, "--dry-run", spec=spec)) == {
        "existing": NAMES, "created": [], "would_create": ["notifications"]}
    assert "notifications" not in topics(cluster)


def test_existing_topic_that_differs_from_the_spec_is_a_warning_not_a_change(lab, cluster):
    spec = [{"name": "temperature-data", "partitions": 12, "cleanup": "compact"}]
    result = ensure(lab, cluster.internal, spec=spec)
    assert summary(result) == {"existing": ["temperature-data"], "created": [], "would_create": []}
    assert "topic temperature-data has 6 partitions, the spec wants 12" in result.stderr
    assert "topic temperature-data has cleanup.policy=delete, the spec wants compact" in result.stderr
    assert len(topics(cluster)["temperature-data"].partitions) == 6


def test_bad_spec_exits_2_naming_the_field(lab, cluster):
    result = ensure(lab, cluster.internal, spec=[{"name": "t", "partitions": 1, "cleanup": "keep"}])
    assert result.returncode == 2, result.stdout + result.stderr
    assert "spec[1] (t).cleanup: must be one of delete, compact (got 'keep')" in result.stderr
    assert result.stdout == ""


def test_no_cluster_fails_after_the_wait_naming_the_bootstrap_servers(lab):
    result = ensure(lab, "nowhere-1:9092,nowhere-2:9092", wait=15)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Kafka at nowhere-1:9092,nowhere-2:9092 did not answer with 1 broker(s) within 15s" in result.stderr
    assert result.stdout == ""
