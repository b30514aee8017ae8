"""A restarted adapter consumer is assigned the topics created after its restart (real broker).

The adapter subscribes to topics that may not exist yet: a first deploy starts the stack before the
topics role, and the datacenter's relayed topics appear when MirrorMaker first copies them. Swarm
restarts a replica as a new process that rejoins its group, as a static member (the stacks set
ADAPTER_GROUP_INSTANCE_ID) or a dynamic one; in both cases the topic created afterwards must be
assigned (services/adapter/assignment.py watches the same thing in production).
"""
from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer

from services.adapter.app import consumer_config
from services.adapter.settings import load, parser
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster


def _assignment(consumer: Consumer, want: set[str], seconds: float) -> set[str]:
    """Poll until the consumer's assignment covers `want` or `seconds` pass; the topics it has then."""
    deadline = time.monotonic() + seconds
    while True:
        consumer.poll(0.5)
        topics = {tp.topic for tp in consumer.assignment()}
        if want <= topics or time.monotonic() > deadline:
            return topics


@pytest.fixture(scope="module")
def cluster(lab):
    return start_kafka_cluster(lab)


@pytest.mark.parametrize("instance", ["", "site-it-cassandra-adapter-1"], ids=["dynamic", "static"])
def test_a_restarted_adapter_consumer_is_assigned_a_topic_created_after_its_restart(cluster, instance):
    old, new = f"old-{uuid.uuid4().hex[:6]}", f"new-{uuid.uuid4().hex[:6]}"
    create_topics(cluster, old, partitions=1)
    config = consumer_config(load(parser().parse_args(
        ["--kafka-bootstrap", cluster.external, "--group-id", f"membership-{uuid.uuid4().hex[:6]}",
         "--group-instance-id", instance])))
    config["topic.metadata.refresh.interval.ms"] = 2000      # the adapter's 30 s, shortened for the test

    first = Consumer(config)
    first.subscribe([old, new])
    assert _assignment(first, {old}, 60) == {old}
    first.close()                   # as a replica Swarm restarts: closes, and a new process joins

    second = Consumer(config)
    second.subscribe([old, new])
    try:
        assert _assignment(second, {old}, 60) == {old}
        create_topics(cluster, new, partitions=1)
        assert _assignment(second, {old, new}, 60) == {old, new}, \
            "the restarted consumer was never assigned the topic created after its restart"
    finally:
        second.close()


def test_the_unread_watch_names_a_subscribed_topic_no_member_of_the_group_holds(cluster):
    from confluent_kafka.admin import AdminClient

    from services.adapter.assignment import UnreadWatch
    read, unread = f"read-{uuid.uuid4().hex[:6]}", f"unread-{uuid.uuid4().hex[:6]}"
    create_topics(cluster, read, unread, partitions=2)
    group = f"watch-{uuid.uuid4().hex[:6]}"
    consumer = Consumer(cluster.client(**{"group.id": group}))
    consumer.subscribe([read])      # as a member whose assignment missed `unread`
    try:
        assert _assignment(consumer, {read}, 60) == {read}
        watch = UnreadWatch({}, group, lambda topic: topic in (read, unread), threading.Event())
        admin = AdminClient(cluster.client())
        topics, held = watch._observe(admin)
        assert sorted(held) == [(read, 0), (read, 1)] and topics[unread] == 2
        watch.check(topics, held)
        assert watch.check(*watch._observe(admin)) == {(unread, 0), (unread, 1)}
    finally:
        consumer.close()
