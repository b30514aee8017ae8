"""mosquitto-agent's pure parts: device lines, chunked requests, the plugin's answers, $SYS topics and the
figures a scrape shows."""
from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from services.common.device_credentials import Credential
from services.mosquitto_agent import protocol
from services.mosquitto_agent.metrics import SYS_METRICS, Figures, sys_figure

HASH = "$7$1000$AAAAAAAAAAAAAAAA$" + "A" * 86 + "=="


# ------------------------------------------------------------------ lines and requests

def test_a_device_line_is_id_enabled_auth_hash():
    assert protocol.device_line("press-1", Credential(True, "password", HASH, "cli", 1)) == f"press-1 1 password {HASH}"
    assert protocol.device_line("cam-1", Credential(False, "certificate", None, "cli", 1)) == "cam-1 0 certificate -"


def test_chunks_hold_at_most_the_chunk_size():
    lines = [f"d{i}" for i in range(1201)]
    parts = protocol.chunks(lines, 500, 10**9)
    assert [len(p) for p in parts] == [500, 500, 201]
    assert [line for part in parts for line in part] == lines


def test_chunks_stay_within_the_byte_limit():
    lines = [f"{i:03d} 1 password {HASH}" for i in range(500)]
    limit = 4096
    parts = protocol.chunks(lines, 500, limit)
    assert len(parts) > 1
    assert all(sum(len(line) + 1 for line in part) <= limit for part in parts)
    assert [line for part in parts for line in part] == lines


def test_a_line_longer_than_the_limit_goes_alone():
    assert protocol.chunks(["a", "x" * 50, "b"], 10, 20) == [["a"], ["x" * 50], ["b"]]


def test_a_snapshot_numbers_its_parts_under_one_token():
    requests = protocol.snapshot_requests([f"d{i} 1 certificate -" for i in range(5)], "t1", 2, 10**6)
    assert [r.split(b"\n", 1)[0] for r in requests] == [b"snapshot t1 1 3", b"snapshot t1 2 3", b"snapshot t1 3 3"]
    assert requests[0] == b"snapshot t1 1 3\nd0 1 certificate -\nd1 1 certificate -"
    assert [protocol.request_size(r) for r in requests] == [2, 2, 1]


def test_an_empty_table_is_a_snapshot_of_one_empty_part():
    assert protocol.snapshot_requests([], "t", 500, 10**6) == [b"snapshot t 1 1"]


def test_upserts_and_removes_carry_lines_and_ids():
    assert protocol.upsert_requests(["a 1 certificate -", "b 0 certificate -"], 1, 10**6) == \
        [b"upsert\na 1 certificate -", b"upsert\nb 0 certificate -"]
    assert protocol.remove_requests(["a", "b"], 500, 10**6) == [b"remove\na\nb"]
    assert protocol.remove_requests([], 500, 10**6) == []


def test_a_snapshot_of_thousands_fits_mosquittos_default_packet_size():
    lines = [f"site-a-device-{i:05d} 1 password {HASH}" for i in range(2000)]
    limit = 65536 - protocol.PACKET_OVERHEAD
    requests = protocol.snapshot_requests(lines, "t", 500, limit)
    assert all(len(r) <= 65536 - 64 for r in requests)
    assert sum(protocol.request_size(r) for r in requests) == 2000


# ------------------------------------------------------------------ answers

ANSWER = {"ok": True, "command": "stats", "error": "", "devices": 3, "connected": 2, "gate_open": True, "uptime_s": 42,
          "kicked": 1,
          "counters": {"auth_ok": 5, "auth_refused": 2, "unknown_device": 1, "gate_refused": 7,
                       "acl_denied_publish": 1, "acl_denied_subscribe": 4, "rate_limited": 9, "rested": 5,
                       "control": 11, "offences": 15},
          "offences": {"press-1": {"rate_limited": 6, "wrong_password": 2}, "press-2": {"rate_limited": 3},
                       "press-3": {"subscribe_denied": 4}}}


def test_an_answer_gives_its_figures():
    answer = protocol.parse_answer(json.dumps(ANSWER).encode())
    assert answer.ok and answer.command == "stats" and answer.devices == 3 and answer.gate_open is True
    assert answer.uptime_s == 42.0 and answer.kicked == 1 and answer.connected == 2
    assert answer.counters["gate_refused"] == 7 and answer.counters["offences"] == 15
    assert answer.offences["press-1"] == {"rate_limited": 6, "wrong_password": 2}
    assert answer.offences["press-2"] == {"rate_limited": 3}


def test_a_refusal_carries_the_plugins_error():
    answer = protocol.parse_answer(b'{"ok":false,"command":"upsert","error":"invalid device id"}')
    assert not answer.ok and answer.error == "invalid device id" and answer.devices is None


def test_fields_of_the_wrong_type_are_left_out():
    answer = protocol.parse_answer(b'{"ok":true,"command":"stats","devices":"many","gate_open":1,'
                                   b'"counters":{"auth_ok":-1,"rate_limited":true,"control":3},'
                                   b'"offences":[1]}')
    assert answer.devices is None and answer.gate_open is None and answer.connected is None
    assert answer.counters == {"control": 3} and answer.offences == {}


@pytest.mark.parametrize("payload", [b"", b"not json", b"[]", b'{"ok": "yes", "command": "stats"}',
                                     b'{"ok": true}', b"\xff"])
def test_something_else_than_an_answer_is_refused(payload):
    with pytest.raises(ValueError):
        protocol.parse_answer(payload)


# ------------------------------------------------------------------ $SYS and the figures

@pytest.mark.parametrize("topic, payload, expected", [
    ("$SYS/broker/uptime", b"1234 seconds", ("mosquitto_uptime_seconds", 1234.0)),
    ("$SYS/broker/clients/connected", b"17", ("mosquitto_clients_connected", 17.0)),
    ("$SYS/broker/publish/messages/received", b"99", ("mosquitto_messages_received_total", 99.0)),
    ("$SYS/broker/publish/messages/sent", b"98", ("mosquitto_messages_sent_total", 98.0)),
    ("$SYS/broker/publish/messages/dropped", b"3", ("mosquitto_messages_dropped_total", 3.0)),
    ("$SYS/broker/store/messages/count", b"12", ("mosquitto_store_messages", 12.0)),
    ("$SYS/broker/store/messages/bytes", b"4096", ("mosquitto_store_bytes", 4096.0)),
    ("$SYS/broker/heap/current", b"123456", ("mosquitto_heap_bytes", 123456.0)),
    ("$SYS/broker/version", b"mosquitto version 2.0.20", None),
    ("$SYS/broker/clients/connected", b"lots", None),
])
def test_sys_topics_map_to_the_metrics_the_spec_names(topic, payload, expected):
    assert sys_figure(topic, payload) == expected


def _scrape(figures: Figures, registry: CollectorRegistry) -> dict[str, float]:
    values = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_a_scrape_shows_sys_figures_plugin_counters_and_settings():
    registry = CollectorRegistry()
    figures = Figures(registry)
    figures.up = lambda: True
    figures.sync_age = lambda: 0.0
    figures.devices_synced, figures.memory_limit, figures.max_queued_messages = 3, 268435456, 1000
    for topic, payload in [("$SYS/broker/uptime", b"50 seconds"), ("$SYS/broker/publish/messages/dropped", b"4"),
                           ("$SYS/broker/heap/current", b"2048")]:
        assert figures.set_sys(topic, payload)
    figures.set_answer(protocol.parse_answer(json.dumps(ANSWER).encode()))
    got = _scrape(figures, registry)
    assert got["mosquitto_up"] == 1 and got["mosquitto_uptime_seconds"] == 50
    assert got["mosquitto_messages_dropped_total"] == 4 and got["mosquitto_heap_bytes"] == 2048
    assert got["mosquitto_gate_open"] == 1 and got["mosquitto_devices"] == 3
    assert got["mosquitto_devices_connected"] == 2
    assert got["mosquitto_gate_auth_refused_total"] == 2 and got["mosquitto_gate_start_refused_total"] == 7
    assert got["mosquitto_gate_rate_limited_total"] == 9 and got["mosquitto_gate_rested_total"] == 5
    assert got['mosquitto_gate_acl_denied_total{action="publish"}'] == 1
    assert got['mosquitto_gate_acl_denied_total{action="subscribe"}'] == 4
    assert got["mosquitto_gate_unknown_device_total"] == 1
    assert got["mosquitto_gate_offences_counted_total"] == 15
    assert got['mosquitto_gate_offences_total{login="press-1",offence="rate_limited"}'] == 6
    assert got['mosquitto_gate_offences_total{login="press-1",offence="wrong_password"}'] == 2
    assert got['mosquitto_gate_offences_total{login="press-3",offence="subscribe_denied"}'] == 4
    assert 'mosquitto_gate_offences_total{login="press-3",offence="rate_limited"}' not in got
    assert got["mosquitto_agent_devices_synced"] == 3 and got["mosquitto_agent_sync_age_seconds"] == 0
    assert got["mosquitto_memory_limit_bytes"] == 268435456 and got["mosquitto_max_queued_messages"] == 1000


def test_after_a_disconnect_only_up_zero_and_the_agents_own_figures_remain():
    registry = CollectorRegistry()
    figures = Figures(registry)
    figures.set_sys("$SYS/broker/clients/connected", b"5")
    figures.set_answer(protocol.parse_answer(json.dumps(ANSWER).encode()))
    figures.forget_broker()
    figures.sync_age = lambda: 12.5
    got = _scrape(figures, registry)
    assert got == {"mosquitto_up": 0, "mosquitto_agent_sync_age_seconds": 12.5}


def test_every_sys_metric_is_named_once():
    names = [name for name, _, _ in SYS_METRICS.values()]
    assert len(names) == len(set(names))
