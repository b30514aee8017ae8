"""The unread-partitions watch: subscribed partitions that no member of the adapter's group holds.

A topic the adapter subscribes to but whose partitions no member is assigned is never written to
Cassandra, and nothing else shows it: the adapter is healthy and the topic simply grows (seen once in
the lab, cause not found: docs/faults.md, "An unread topic"). A thread asks the brokers every
CHECK_S which partitions match the subscription and which the group holds; a partition unheld in two
checks in a row (a rebalance is over well within CHECK_S) counts in iot_adapter_unread_partitions,
which the AdapterTopicUnread alert watches, and is logged with its fix.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping

from services.adapter import metrics
from services.common.observability import kv

log = logging.getLogger("iot_stack.adapter")
CHECK_S = 60.0
Partition = tuple[str, int]


def subscribed_partitions(topics: Mapping[str, int], subscribed: Callable[[str], bool]) -> set[Partition]:
    """Every partition of the topics (name -> partition count) the subscription takes."""
    return {(name, p) for name, count in topics.items()
            if not name.startswith("__") and subscribed(name) for p in range(count)}


def unheld(topics: Mapping[str, int], subscribed: Callable[[str], bool],
           held: Iterable[Partition]) -> set[Partition]:
    """Subscribed partitions that no member of the group holds."""
    return subscribed_partitions(topics, subscribed) - set(held)


class UnreadWatch:
    """Every CHECK_S: list the topics and the group's assignment (AdminClient), update the gauge."""

    def __init__(self, admin_config: dict, group: str, subscribed: Callable[[str], bool], stop: threading.Event):
        self.admin_config, self.group, self.subscribed, self.stop = admin_config, group, subscribed, stop
        self.suspects: set[Partition] = set()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="unread-watch", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        from confluent_kafka.admin import AdminClient
        admin = AdminClient(self.admin_config)
        while not self.stop.wait(CHECK_S):
            try:
                self.check(*self._observe(admin))
            except Exception as err:  # noqa: BLE001 - a broker away for a minute: try at the next check
                log.info("unread-partitions check skipped", extra=kv(error=str(err)[:300]))

    def _observe(self, admin) -> tuple[dict[str, int], list[Partition] | None]:
        from confluent_kafka import ConsumerGroupState
        topics = {name: len(t.partitions) for name, t in admin.list_topics(timeout=15).topics.items()}
        (future,) = admin.describe_consumer_groups([self.group], request_timeout=15).values()
        group = future.result()
        if group.state != ConsumerGroupState.STABLE:
            return topics, None         # joining or rebalancing: no verdict this time
        return topics, [(tp.topic, tp.partition) for member in group.members
                        for tp in member.assignment.topic_partitions]

    def check(self, topics: dict[str, int], held: list[Partition] | None) -> set[Partition]:
        """One observation; returns (and counts) the partitions unheld in this and the last one."""
        if held is None:
            return set()
        now = unheld(topics, self.subscribed, held)
        unread, self.suspects = now & self.suspects, now
        metrics.UNREAD_PARTITIONS.set(len(unread))
        if unread:
            log.error("subscribed partitions that no member of the group reads", extra=kv(
                group=self.group, partitions=",".join(f"{t}[{p}]" for t, p in sorted(unread)),
                fix="restart the adapter (docker service update --force <stack>_cassandra-adapter) and "
                    "report it: its records stay in Kafka until retention"))
        return unread
