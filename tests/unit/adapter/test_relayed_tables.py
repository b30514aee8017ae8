"""Relaying readings to the datacenter is one inventory change: with `temperature-data` in the
datacenter's stack_relay_topics, MirrorMaker copies it, the relay may read it, and the datacenter's
adapter stores <site>.temperature-data in the readings table; without it the datacenter's adapter
does not subscribe to readings at all. Rendered from the stack role's real template and defaults."""
from __future__ import annotations

import pytest

from deploy.kafka_acls import relay_acls
from services.adapter.mappings import Router, parse_mappings
from tooling.testbed.stack_render import (
    REPO,
    load_inventory,
    properties,
    render_mm2,
    render_role_template,
    stack_defaults,
)

WITH_READINGS = [*stack_defaults()["stack_relay_topics"], "temperature-data"]


@pytest.fixture(scope="module")
def example():
    return load_inventory(REPO / "inventory.example")


def _router(example, tier: str, group: str, **overrides) -> Router:
    hostvars, groups = example
    text = render_role_template("adapter-mappings.toml.j2", hostvars, groups, group, tier, **overrides)
    return Router(parse_mappings(text, "rendered adapter-mappings.toml"))


def test_by_default_the_datacenter_neither_relays_nor_stores_readings(example):
    router = _router(example, "datacenter", "datacenter")
    assert router.route("site-a.temperature-data") is None
    assert router.route("site-a.temperature-threshold-events").table == "temperature_threshold_events"
    assert "temperature-data" not in properties(render_mm2(*example))["site-a->datacenter.topics"]


def test_relaying_readings_stores_them_at_the_datacenter_in_the_readings_table(example):
    router = _router(example, "datacenter", "datacenter", stack_relay_topics=WITH_READINGS)
    assert router.route("site-a.temperature-data").table == "temperature_readings"
    assert router.route("site-b.temperature-data").table == "temperature_readings"
    assert router.route("temperature-data") is None            # only mirrored <site>.<topic> topics
    mm2 = properties(render_mm2(*example, stack_relay_topics=WITH_READINGS))
    assert "temperature-data" in [t.strip() for t in mm2["site-a->datacenter.topics"].split(",")]
    acls = relay_acls("relay", WITH_READINGS, ["site-a-cassandra-adapter"])
    assert {"principal": "User:relay", "resource": "topic", "name": "temperature-data", "pattern": "literal",
            "operation": "READ"} in [{k: a[k] for k in ("principal", "resource", "name", "pattern", "operation")}
                                     for a in acls]


def test_a_dropped_relayed_topic_is_no_longer_stored(example):
    relayed = [t for t in WITH_READINGS if t != "temperature-rollups-1m"]
    router = _router(example, "datacenter", "datacenter", stack_relay_topics=relayed)
    assert router.route("site-a.temperature-rollups-1m") is None
    assert router.route("site-a.temperature-data").table == "temperature_readings"


def test_the_edge_stores_its_own_readings_whatever_the_datacenter_relays(example):
    router = _router(example, "edge", "site_a")
    assert router.route("temperature-data").table == "temperature_readings"
