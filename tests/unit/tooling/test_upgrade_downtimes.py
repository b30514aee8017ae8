"""tooling/lab/upgrade.py's reading of Docker events: a node is down from its container's first kill/stop/die until a
container of its service reports healthy; overlapping downtimes of one kind are found, of two kinds are not."""
from __future__ import annotations

from tooling.lab import upgrade


def event(service: str, action: str, seconds: float, site: str = "site-a") -> dict:
    return {"Action": action, "timeNano": str(int(seconds * 1e9)),
            "Actor": {"Attributes": {"com.docker.swarm.service.name": f"{site}_{service}"}}}


def test_down_from_the_first_kill_until_healthy_again():
    found = [event("kafka-1", "kill", 10), event("kafka-1", "die", 12), event("kafka-1", "start", 15),
             event("kafka-1", "health_status: healthy", 30), event("bridge", "kill", 11),
             event("kafka-2", "kill", 40), event("kafka-2", "die", 41)]
    downs = upgrade.downtimes(found, "site-a", until=100)
    assert [(d.service, d.start, d.end) for d in downs] == [("kafka-1", 10, 30), ("kafka-2", 40, 100)]
    assert upgrade.overlapping(downs) == []


def test_two_brokers_down_together_overlap_but_a_broker_and_a_cassandra_node_do_not():
    found = [event("kafka-1", "kill", 10), event("kafka-2", "kill", 20), event("cassandra-1", "kill", 15),
             event("kafka-1", "health_status: healthy", 30), event("kafka-2", "health_status: healthy", 35),
             event("cassandra-1", "health_status: healthy", 40)]
    pairs = upgrade.overlapping(upgrade.downtimes(found, "site-a", until=100))
    assert [(a.service, b.service) for a, b in pairs] == [("kafka-1", "kafka-2")]


def test_other_sites_and_stateless_services_are_ignored():
    found = [event("kafka-1", "kill", 10, site="site-b"), event("mosquitto", "kill", 10)]
    assert upgrade.downtimes(found, "site-a", until=100) == []
