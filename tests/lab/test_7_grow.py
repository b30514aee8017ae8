"""Growing a site, and shrinking it: one more Kafka broker joins site-a with one inventory line and one
playbook run (`scripts/lab add-broker site-a`) while a device publishes. Every partition, Kafka's own
included, is spread over the brokers with min(brokers, 3) replicas all in sync (from two brokers to three:
replication 2 -> 3, min.insync.replicas 1 -> 2); the running brokers, ZooKeeper, Cassandra and Mosquitto
keep their tasks; nothing is lost. Run again on the same lab, it adds one more broker each time. Then the
highest broker leaves (`scripts/lab retire-broker site-a`: kafka_retire=true and a run, its host out and a
run): its replicas are handed over first, nothing restarts that need not, nothing is lost.
Not in the smoke: a new host, its images and the deploy take 8-16 minutes here."""
from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, ResourceType

from tests.lab.conftest import run_lab
from tests.lab.test_2_end_to_end import RUN, publish, rows, wait_for
from tooling.lab import lab

SITE = "site-a"
BATCH = 100           # readings per batch; one batch every BATCH_EVERY_S while the broker joins
BATCH_EVERY_S = 20
STATEFUL = ("zookeeper-1", "cassandra-1", "mosquitto")     # and every broker already there


def running_tasks(host: lab.LabHost, services: tuple[str, ...], site: str = SITE) -> dict[str, str]:
    """The task id running each service now: a restart, with or without a spec change, gives a new one."""
    out = {}
    for name in services:
        ids = lab.host_exec(host, "docker", "service", "ps", f"{site}_{name}", "--filter", "desired-state=running",
                            "--format", "{{.ID}}").stdout.split()
        out[name] = ",".join(sorted(ids))
    return out


def publishing_while(manager: lab.LabHost, site: str, prefix: str, action) -> list[tuple[str, int]]:
    """Run `action()` while a device publishes a batch of BATCH readings at QoS 1 to `site` every
    BATCH_EVERY_S; returns the batches, (sensor, first event time in ms)."""
    sensors: list[tuple[str, int]] = []
    stop = threading.Event()

    def device() -> None:
        while not stop.is_set():
            sensor = f"{prefix}-{RUN}-{len(sensors)}"
            sensors.append((sensor, publish(manager, site, sensor, [21.0] * BATCH)))
            stop.wait(BATCH_EVERY_S)

    publisher = threading.Thread(target=device, daemon=True)
    publisher.start()
    try:
        action()
    finally:
        stop.set()
        publisher.join(timeout=300)
    return sensors


def batch_day(start_ms: int) -> str:
    return datetime.fromtimestamp(start_ms / 1000, UTC).strftime("%Y-%m-%d")


def assert_counted(manager: lab.LabHost, site: str, sensors: list[tuple[str, int]]) -> None:
    """Every batch has its BATCH rows in the site's Cassandra (waiting up to 10 min for each)."""
    for sensor, start_ms in sensors:
        day = batch_day(start_ms)

        def counted(sensor=sensor, day=day):
            out = rows(manager, site, "SELECT count(*) FROM iot.temperature_readings "
                                      f"WHERE site='{site}' AND sensor_id='{sensor}' AND day='{day}';")
            return int(out[0][0]) if out and out[0][0].isdigit() and int(out[0][0]) >= BATCH else None

        assert wait_for(f"{BATCH} rows of {sensor} in {site}'s Cassandra", counted, timeout=600) == BATCH


def assert_spread(manager: lab.LabHost, brokers: list[int]) -> ClusterMetadata:
    """Every partition of the site on min(brokers, 3) of `brokers`, all in sync; the cluster's metadata."""
    replication = min(len(brokers), 3)
    admin = AdminClient(lab.kafka_client(f"{lab.host_ip(manager)}:9094"))
    metadata = admin.list_topics(timeout=30)
    wrong = {(name, p): (list(part.replicas), list(part.isrs))
             for name, topic in metadata.topics.items() for p, part in topic.partitions.items()
             if len(set(part.replicas)) != replication or not set(part.replicas) <= set(brokers)
             or set(part.isrs) != set(part.replicas)}
    assert not wrong, wrong
    (future,) = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "temperature-data")]).values()
    assert future.result(timeout=60)["min.insync.replicas"].value == str(max(replication - 1, 1))
    return metadata


@pytest.mark.timeout(2700)
def test_a_new_broker_takes_a_replica_of_every_partition_and_restarts_no_other(lab_hosts, capsys):
    manager = lab.site_managers(lab_hosts)[SITE]
    brokers_before = lab.role_ids(lab_hosts, SITE, "kafka")
    stateful = STATEFUL + tuple(f"kafka-{b}" for b in brokers_before)
    tasks_before = running_tasks(manager, stateful)

    started = time.monotonic()
    sensors = publishing_while(manager, SITE, "grow", lambda: run_lab("add-broker", SITE))
    new_broker = brokers_before[-1] + 1
    with capsys.disabled():
        print(f"\nadding broker {new_broker} to {SITE} (new host, site.yml --limit datacenter,site_a) took "
              f"{time.monotonic() - started:.0f}s; {len(sensors)} batches of {BATCH} published meanwhile")

    manager = lab.site_managers(lab.existing_hosts())[SITE]
    # The running task of each: a restart, with or without a spec change, gives a new one. (A service's
    # version index is no signal: every `docker stack deploy` rewrites each service, changed or not.)
    assert running_tasks(manager, stateful) == tasks_before, "a running stateful service was restarted"
    assert running_tasks(manager, (f"kafka-{new_broker}",))[f"kafka-{new_broker}"], "the new broker runs"

    topics = assert_spread(manager, brokers_before + [new_broker]).topics
    assert {"__consumer_offsets", "__transaction_state", "temperature-data"} <= set(topics)
    on_new = {name for name, topic in topics.items()
              if any(new_broker in part.replicas for part in topic.partitions.values())}
    assert {"__consumer_offsets", "temperature-data"} <= on_new

    assert_counted(manager, SITE, sensors)


@pytest.mark.timeout(3600)
def test_the_highest_broker_retires_with_its_replicas_handed_over_and_restarts_no_other(lab_hosts, capsys):
    top = max((h for h in lab.existing_hosts() if h.site == SITE and "kafka_id" in h.variables),
              key=lambda h: int(h.variables["kafka_id"]))
    if set(top.variables) - {"swarm_role", "kafka_id"}:
        run_lab("add-broker", SITE)           # the lab retires only a node that runs nothing but its broker
    hosts = lab.existing_hosts()
    manager = lab.site_managers(hosts)[SITE]
    brokers_before = lab.role_ids(hosts, SITE, "kafka")
    retired, staying = brokers_before[-1], brokers_before[:-1]
    stateful = STATEFUL + tuple(f"kafka-{b}" for b in staying)
    tasks_before = running_tasks(manager, stateful)

    started = time.monotonic()
    sensors = publishing_while(manager, SITE, "retire", lambda: run_lab("retire-broker", SITE))
    with capsys.disabled():
        print(f"\nretiring broker {retired} of {SITE} (kafka_retire=true and site.yml, then its host out and "
              f"site.yml) took {time.monotonic() - started:.0f}s; {len(sensors)} batches of {BATCH} published")

    hosts = lab.existing_hosts()
    assert retired not in lab.role_ids(hosts, SITE, "kafka")
    assert running_tasks(manager, stateful) == tasks_before, "a running stateful service was restarted"
    services = lab.host_exec(manager, "docker", "service", "ls", "--format", "{{.Name}}").stdout.split()
    assert f"{SITE}_kafka-{retired}" not in services and f"{SITE}_kafka-{staying[-1]}" in services
    metadata = assert_spread(manager, staying)
    assert sorted(metadata.brokers) == staying, "the retired broker is no longer registered"
    assert_counted(manager, SITE, sensors)
