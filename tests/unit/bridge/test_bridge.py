"""Bridge logic without brokers: routing, dead-letter records, headers, the ack window, commands, settings."""
from __future__ import annotations

import json

import pytest

from services.bridge import commands
from services.bridge import settings as bridge_settings
from services.bridge.commands import CommandForwarder, command_topic
from services.bridge.routing import OutRecord, Router, base_headers
from services.bridge.rules import DEFAULT_RULES, Mapping
from services.bridge.window import Window
from services.common import names
from services.common.contracts import ContractError
from services.common.dead_letter import DLQ_VALUE_LIMIT, dead_letter
from services.common.settings import SettingsError
from tests.unit.bridge.reference import apply, delivered, known_key

TOPIC = "sites/site-a/devices/d1/sensors/7/temperature"
GOOD = json.dumps({"timestamp": 1700000000000, "temperature": 21.5, "unit": "C"}).encode()


@pytest.fixture
def router():
    return Router(Mapping.from_dicts(DEFAULT_RULES), "dead-letter", max_payload=1024, site="site-a")


def _headers(record: OutRecord) -> dict[str, bytes]:
    return dict(record.headers)


def test_valid_reading_is_keyed_by_sensor_and_carries_site_ingest_and_user_properties(router):
    record = router.route(TOPIC, GOOD, [("firmware", "1.2")], now_ms=123)
    assert (record.topic, record.key, record.reason) == ("temperature-data", b"7", None)
    assert json.loads(record.value) == {"sensor_id": "7", "timestamp": 1700000000000, "temperature": 21.5,
                                        "unit": "C", "device_id": "d1"}
    assert _headers(record) == {"firmware": b"1.2", names.HEADER_MQTT_TOPIC: TOPIC.encode(),
                                names.HEADER_SITE: b"site-a", names.HEADER_INGEST_MS: b"123"}


def test_device_cannot_spoof_the_bridges_own_headers():
    headers = base_headers(TOPIC, [("site", "evil"), ("ingest_ms", "0"), ("ok", "1")], "site-a", 5)
    assert headers == [("ok", b"1"), ("mqtt_topic", TOPIC.encode()), ("site", b"site-a"), ("ingest_ms", b"5")]


def test_site_header_falls_back_to_configured_site_without_a_site_segment():
    mapping = Mapping.from_dicts([{"mqtt": "plant/{sensor_id}/t", "kafka_topic": "temperature-data",
                                   "key": "{sensor_id}", "contract": "temperature-reading"}])
    record = Router(mapping, "dead-letter", 1024, site="site-b").route("plant/9/t", GOOD, None, 1)
    assert _headers(record)[names.HEADER_SITE] == b"site-b"


def test_the_site_is_where_the_device_connected_and_a_topic_naming_another_is_dead_lettered(router):
    """BRIDGE_SITE is the site whose Mosquitto the device logged into; Mosquitto's ACL already keeps a device
    under its own site, and the bridge never records a reading as another site's."""
    foreign = "sites/site-b/devices/d1/sensors/7/temperature"
    record = router.route(foreign, GOOD, [("site", "site-b")], now_ms=1)
    assert (record.topic, record.reason) == ("dead-letter", "contract_violation")
    assert "topic names site 'site-b' but this bridge serves site 'site-a' (BRIDGE_SITE)" in \
        _headers(record)[names.HEADER_DLQ_REASON].decode()
    unset = Router(router.mapping, "dead-letter", max_payload=1024, site=None).route(foreign, GOOD, None, now_ms=1)
    assert (unset.topic, _headers(unset)[names.HEADER_SITE]) == ("temperature-data", b"site-b")


@pytest.mark.parametrize(("topic", "payload", "reason", "key"), [
    (TOPIC, b"{nope", "invalid_json", b"7"),
    (TOPIC, b"\xff\xfe\x00garbage", "invalid_json", b"7"),
    (TOPIC, json.dumps({"timestamp": 1, "temperature": 20, "unit": "X"}).encode(), "contract_violation", b"7"),
    (TOPIC, json.dumps({"timestamp": 1, "temperature": "hot", "unit": "C"}).encode(), "contract_violation", b"7"),
    (TOPIC, json.dumps({"temperature": 20, "unit": "C"}).encode(), "contract_violation", b"7"),
    (TOPIC, b" " * 1025, "oversized", b"7"),
    ("sites/site-a/devices/d1/sensors//temperature", GOOD, "unmapped", b"sites/site-a/devices/d1/sensors//temperature"),
])
def test_bad_input_becomes_a_dead_letter_record_with_original_bytes_key_and_reason(router, topic, payload, reason,
                                                                                     key):
    record = router.route(topic, payload, None, now_ms=42)
    headers = _headers(record)
    assert (record.topic, record.key, record.value, record.reason) == ("dead-letter", key, payload, reason)
    assert headers[names.HEADER_DLQ_SOURCE] == topic.encode()
    assert headers[names.HEADER_DLQ_REASON].decode().startswith(f"{reason}: ")
    assert headers[names.HEADER_DLQ_TIME_MS] == b"42"


@pytest.mark.parametrize("topic", [TOPIC, "sites/site-b/devices/d1/sensors/x-9/temperature",
                                   "sites/site-a/devices/d1/sensors//temperature", "other/topic"])
def test_dead_letter_key_is_the_key_the_topic_implies_else_the_topic(router, topic):
    record = router.route(topic, b"{nope", None, 1)
    implied = known_key(router.mapping, topic)
    assert record.key == (implied if implied is not None else topic).encode()
    assert names.HEADER_DLQ_OFFSET not in _headers(record)     # MQTT-sourced: no Kafka partition/offset


def test_device_cannot_spoof_dead_letter_headers():
    headers = base_headers(TOPIC, [(names.HEADER_DLQ_OFFSET, "0:1"), (names.HEADER_DLQ_REASON, "x")], "site-a", 5)
    assert [k for k, _ in headers] == [names.HEADER_MQTT_TOPIC, names.HEADER_SITE, names.HEADER_INGEST_MS]


def test_deeply_nested_json_is_dead_lettered_not_a_crash():
    router = Router(Mapping.from_dicts(DEFAULT_RULES), "dead-letter", max_payload=1_000_000)
    assert router.route(TOPIC, b"[" * 200_000 + b"]" * 200_000, None, 1).reason == "invalid_json"


def test_oversized_reason_names_the_limit_and_the_fix(router):
    reason = _headers(router.route(TOPIC, b"x" * 2000, None, 1))[names.HEADER_DLQ_REASON].decode()
    assert "2000 bytes exceeds BRIDGE_MAX_PAYLOAD_BYTES=1024" in reason


def test_dead_letter_value_is_cut_so_kafka_can_always_take_it():
    record = dead_letter("dead-letter", "t", None, b"x" * (DLQ_VALUE_LIMIT + 10), "oversized", "too big", 1)
    assert len(record.value) == DLQ_VALUE_LIMIT
    assert record.key == b"t"
    assert "cut to its first" in _headers(record)[names.HEADER_DLQ_REASON].decode()


def _entry(window: Window, mid: int, qos: int = 1):
    return window.add(mid, qos, 0.0, OutRecord("t", b"k", b"v", []))


def test_window_acks_only_the_delivered_prefix_in_arrival_order():
    window = Window(size=3)
    a, b, c = (_entry(window, mid) for mid in (10, 11, 12))
    assert window.room() == 0
    delivered(window, b.seq)
    delivered(window, c.seq)
    assert window.pop_ackable() == []          # 10 is not in Kafka yet: nothing may be acked
    delivered(window, a.seq)
    assert [e.mid for e in window.pop_ackable()] == [10, 11, 12]
    assert window.room() == 3 and len(window) == 0


def test_window_reset_forgets_unacked_messages_so_late_deliveries_ack_nothing():
    window = Window(size=10)
    old = _entry(window, 5)
    assert window.reset() == 1
    fresh = _entry(window, 5)                  # the broker may reuse packet id 5 on the new connection
    assert delivered(window, old.seq) is None  # the old delivery must not ack the new message
    assert window.pop_ackable() == []
    delivered(window, fresh.seq)
    assert [e.seq for e in window.pop_ackable()] == [fresh.seq]


def test_command_topic_uses_record_site_else_configured_site():
    value = json.dumps({"device_id": "d1", "command": "reboot"}).encode()
    assert command_topic(value, b"d1", "site-a") == "sites/site-a/devices/d1/commands"
    with_site = json.dumps({"device_id": "d1", "command": "reboot", "site": "site-b"}).encode()
    assert command_topic(with_site, None, "site-a") == "sites/site-b/devices/d1/commands"


@pytest.mark.parametrize(("value", "key", "site", "match"), [
    ({"device_id": "d1", "command": "x"}, b"d1", None, "BRIDGE_SITE is unset"),
    ({"device_id": "d1", "command": "x"}, b"d2", "s", "differs from device_id"),
    ({"device_id": "d/1", "command": "x"}, None, "s", "must not contain"),
    ({"device_id": "d1"}, None, "s", "missing field 'command'"),
])
def test_invalid_command_is_a_contract_error_naming_the_problem(value, key, site, match):
    with pytest.raises(ContractError, match=match):
        command_topic(json.dumps(value).encode(), key, site)


class _Message:
    def __init__(self, offset: int, value: dict | bytes, partition: int = 0):
        self._offset, self._partition = offset, partition
        self._value = value if isinstance(value, bytes) else json.dumps(value).encode()

    def error(self):
        return None

    def topic(self):
        return names.DEVICE_COMMANDS

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def key(self):
        return None

    def value(self):
        return self._value

    def headers(self):
        return [("trace", b"t-1")]


class _Consumer:
    """Stands in for confluent_kafka.Consumer: hands out the queued messages, records commits."""

    def __init__(self, config):
        self.config = config
        self.queued: list[_Message] = []
        self.commits: list[list[tuple[str, int, int]]] = []
        self.on_revoke = None
        self.closed = False

    def subscribe(self, _topics, on_revoke=None):
        self.on_revoke = on_revoke

    def consume(self, num_messages, timeout):
        batch, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return batch

    def commit(self, offsets, asynchronous):
        self.commits.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])

    def close(self):
        self.closed = True


class _ErrorMessage(_Message):
    def __init__(self, error):
        super().__init__(0, b"")
        self._error = error

    def error(self):
        return self._error


class _Client:
    def __init__(self):
        self.published: list[tuple[str, bytes]] = []

    def publish(self, topic, value, qos):
        self.published.append((topic, value))
        return len(self.published)            # the packet id


@pytest.fixture
def forwarder(monkeypatch):
    monkeypatch.setattr(commands, "Consumer", _Consumer)
    dead = []
    fwd = CommandForwarder("kafka:9092", names.DEVICE_COMMANDS, "g", "bridge-1", "dead-letter", "site-a",
                           lambda record, done: dead.append((record, done)))
    return fwd, dead


def test_command_offsets_are_committed_only_after_the_puback_and_as_a_gap_free_prefix(forwarder):
    fwd, _dead = forwarder
    fwd.consumer.queued = [_Message(o, {"device_id": "d1", "command": f"c{o}"}) for o in (3, 4, 5)]
    fwd.pump(_Client())
    assert fwd.in_flight == 3 and fwd.consumer.commits == []      # published, not yet PUBACKed
    fwd.on_publish(2, 0)                       # offset 4 acked first: 3 is still open, nothing to commit
    assert fwd.consumer.commits == []
    fwd.on_publish(1, 0x87)                    # 3 refused by the broker: still its final answer
    assert fwd.consumer.commits == [[(names.DEVICE_COMMANDS, 0, 5)]]   # 3 and 4 done: next to read is 5
    fwd.on_publish(3, 0)
    assert fwd.consumer.commits[-1] == [(names.DEVICE_COMMANDS, 0, 6)] and fwd.in_flight == 0


def test_invalid_command_is_committed_only_once_its_dead_letter_is_acknowledged(forwarder):
    fwd, dead = forwarder
    fwd.consumer.queued = [_Message(7, b"{nope", partition=1)]
    fwd.pump(_Client())
    ((record, done),) = dead
    headers = dict(record.headers)
    assert (record.topic, record.key, record.value, record.reason) == (
        "dead-letter", names.DEVICE_COMMANDS.encode(), b"{nope", "invalid_json")
    assert headers["trace"] == b"t-1" and headers[names.HEADER_DLQ_SOURCE] == names.DEVICE_COMMANDS.encode()
    assert headers[names.HEADER_DLQ_OFFSET] == b"1:7"
    assert fwd.consumer.commits == []
    done()                                     # Kafka acknowledged the dead-letter record
    assert fwd.consumer.commits == [[(names.DEVICE_COMMANDS, 1, 8)]] and fwd.in_flight == 0


def test_revoked_command_partition_commits_nothing_more(forwarder):
    fwd, _dead = forwarder
    fwd.consumer.queued = [_Message(0, {"device_id": "d1", "command": "c"})]
    fwd.pump(_Client())
    fwd.consumer.on_revoke(fwd.consumer, [commands.TopicPartition(names.DEVICE_COMMANDS, 0)])
    fwd.on_publish(1, 0)                       # the PUBACK arrives after the partition went to another member
    assert fwd.consumer.commits == [] and fwd.in_flight == 0


def test_command_consumer_is_a_static_member_only_when_given_an_instance_id(monkeypatch):
    monkeypatch.setattr(commands, "Consumer", _Consumer)
    dynamic = CommandForwarder("kafka:9092", names.DEVICE_COMMANDS, "g", "bridge-1", "dead-letter", None,
                               lambda record, done: None).consumer.config
    assert "group.instance.id" not in dynamic and dynamic["session.timeout.ms"] == 45000
    static = CommandForwarder("kafka:9092", names.DEVICE_COMMANDS, "g", "bridge-1", "dead-letter", None,
                              lambda record, done: None, group_instance_id="site-a-bridge-commands-2",
                              session_timeout_ms=30000).consumer.config
    assert (static["group.instance.id"], static["session.timeout.ms"]) == ("site-a-bridge-commands-2", 30000)


def test_a_fatal_command_consumer_error_is_kept_and_stops_the_pump(forwarder, caplog):
    from confluent_kafka import KafkaError
    fwd, _dead = forwarder
    client = _Client()
    fwd.consumer.queued = [_ErrorMessage(KafkaError(KafkaError._TRANSPORT, "broker down")),
                           _Message(1, {"device_id": "d1", "command": "a"})]
    fwd.pump(client)
    assert fwd.fatal is None and "command consumer error" in caplog.text and len(client.published) == 1
    fwd.consumer.queued = [_ErrorMessage(KafkaError(KafkaError._FATAL, "fenced")),
                           _Message(2, {"device_id": "d1", "command": "b"})]
    fwd.pump(client)
    assert "fenced" in fwd.fatal and len(client.published) == 1


def test_settings_defaults_come_from_environment(monkeypatch, tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("MQTT_PASSWORD_FILE", str(secret))
    monkeypatch.setenv("BRIDGE_WINDOW", "2000")
    monkeypatch.setenv("BRIDGE_CLIENT_ID", "bridge-3")
    monkeypatch.setenv("BRIDGE_COMMANDS_TOPIC", "none")
    s = bridge_settings.from_args([])
    assert (s.window, s.client_id, s.mqtt_password, s.commands_topic) == (2000, "bridge-3", "s3cret", None)
    assert (s.commands_group_instance_id, s.commands_session_timeout_ms) == (None, 45000)
    assert bridge_settings.from_args(["--window", "10"]).window == 10
    monkeypatch.setenv("BRIDGE_COMMANDS_GROUP_INSTANCE_ID", "site-a-bridge-commands-3")
    monkeypatch.setenv("BRIDGE_COMMANDS_SESSION_TIMEOUT_MS", "20000")
    s = bridge_settings.from_args([])
    assert (s.commands_group_instance_id, s.commands_session_timeout_ms) == ("site-a-bridge-commands-3", 20000)
    assert (s.max_record_bytes, s.sensor_owners_topic) == (900_000, None)         # the defaults: ownership off
    monkeypatch.setenv("BRIDGE_MAX_RECORD_BYTES", "500000")
    monkeypatch.setenv("BRIDGE_SENSOR_OWNERS_TOPIC", "sensor-registration")
    s = bridge_settings.from_args([])
    assert (s.max_record_bytes, s.sensor_owners_topic) == (500_000, "sensor-registration")


@pytest.mark.parametrize(("env", "match"), [
    ({"BRIDGE_WINDOW": "lots"}, "BRIDGE_WINDOW='lots' is not a valid int"),
    ({"BRIDGE_WINDOW": "70000"}, "out of range"),
    ({"BRIDGE_SHARE_GROUP": "a/b"}, "must not contain"),
    ({"BRIDGE_COMMANDS_GROUP_INSTANCE_ID": "bridge-commands-{{.Task.Slot}}"}, "unexpanded Swarm template"),
    ({"BRIDGE_COMMANDS_SESSION_TIMEOUT_MS": "400000"}, "must be <= 300000"),
    ({"BRIDGE_MAX_RECORD_BYTES": "1000"}, "BRIDGE_MAX_RECORD_BYTES=1000 is below 16384"),
])
def test_bad_setting_names_the_variable(monkeypatch, env, match):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=match):
        bridge_settings.from_args([])


def test_unknown_flag_prints_usage_and_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        bridge_settings.from_args(["--no-such-flag"])
    assert exc.value.code == 2
    assert "usage: iot-bridge" in capsys.readouterr().err


def test_help_names_the_environment_variable_of_every_option():
    text = bridge_settings.build_parser().format_help()
    for action in bridge_settings.build_parser()._actions:
        if action.dest != "help":
            assert action.help and "(env BRIDGE_" in action.help, action.dest
    assert "mqtt_password" in text


@pytest.mark.parametrize("payload", [
    {"timestamp": 1700000000000, "temperature": 21.5, "unit": "C"},
    {"sensor_id": "7", "timestamp": 1700000000000, "temperature": 21.5, "unit": "C", "extra": [1, 2]},
    {"sensor_id": 7, "timestamp": 1.7e12, "temperature": 20, "unit": "F"},
    {"timestamp": 5, "temperature": -0.0, "unit": "K", "sensor_id": None},
    {"timestamp": 5, "temperature": 1e308, "unit": "C"},
    {"timestamp": 5, "temperature": True, "unit": "C"},
    {"timestamp": 5, "temperature": 10 ** 400, "unit": "C"},
    {"timestamp": 5, "temperature": 2.5, "unit": "c"},
    {"timestamp": 5, "temperature": 2.5, "unit": ""},
    {"sensor_id": "8", "timestamp": 5, "temperature": 2.5, "unit": "C"},
    {"timestamp": 5, "temperature": 2.5, "unit": "C", "device_id": "d1"},
    {"timestamp": 5, "temperature": 2.5, "unit": "C", "device_id": "d2"},      # another device than the topic's
    {"timestamp": 5, "temperature": 2.5, "unit": "C", "device_id": ""},
    {"timestamp": 5, "temperature": 2.5, "unit": "C", "device_id": None},
    {"timestamp": "5", "temperature": 2.5, "unit": "C"},
    {"timestamp": 10 ** 30, "temperature": 2.5, "unit": "C"},            # beyond 64 bits
    {"timestamp": 253_402_300_800_000, "temperature": 2.5, "unit": "C"},  # year 10000
    {"timestamp": -62_135_596_800_001, "temperature": 2.5, "unit": "C"},  # before year 1
    [1, 2],
    "text",
])
def test_cached_topic_fast_path_maps_exactly_like_mapping_apply(router, payload):
    """The router's per-topic fast path must give the reference mapping's record or error, byte for byte."""
    raw = json.dumps(payload).encode()
    try:
        mapped = apply(Mapping.from_dicts(DEFAULT_RULES), TOPIC, json.loads(raw))
        expected = ("temperature-data", mapped.key.encode(),
                    json.JSONEncoder(separators=(",", ":")).encode(mapped.value).encode(), None)
    except ContractError as err:
        expected = ("dead-letter", b"7", raw, f"contract_violation: {err}")
    except OverflowError:
        expected = OverflowError
    for _ in range(2):                         # first call fills the topic cache, the second uses it
        if expected is OverflowError:          # the bridge dead-letters this as "unprocessable"
            with pytest.raises(OverflowError):
                router.route(TOPIC, raw, None, 1)
            continue
        record = router.route(TOPIC, raw, None, 1)
        reason = _headers(record).get(names.HEADER_DLQ_REASON)
        assert (record.topic, record.key, record.value, reason and reason.decode()) == expected


def test_non_utf8_topic_dead_letters_as_unmapped(router):
    topic = b"sites/site-a/devices/d1/sensors/\xff/temp".decode(errors="replace")
    record = router.route(topic, GOOD, None, 1)
    assert (record.topic, record.reason) == ("dead-letter", "unmapped")


# ------------------------------------------------------------------ MQTT connection state (issue 12, item 5)

class _NoProducer:
    def produce(self, *args, **kwargs):
        raise AssertionError("not expected")

    def poll(self, _timeout=0):
        return 0

    def flush(self, _timeout=0):
        return 0


@pytest.fixture
def bridge(monkeypatch):
    from services.bridge import app
    from services.common.observability import StopFlag
    s = bridge_settings.BridgeSettings(commands_topic=None, metrics_port=0)
    b = app.Bridge(s, Mapping.from_dicts(DEFAULT_RULES), StopFlag(), producer=_NoProducer())
    subscribed: list[list[str]] = []
    monkeypatch.setattr(b.client, "subscribe", lambda filters, qos=1: subscribed.append(list(filters)) or 1)
    b.kafka_ok_at = __import__("time").monotonic()
    b.subscribed_calls = subscribed
    return b


def test_a_fatal_command_consumer_error_stops_the_bridge_with_status_1(monkeypatch):
    from confluent_kafka import KafkaError

    from services.bridge import app
    from services.common.observability import StopFlag
    monkeypatch.setattr(commands, "Consumer", _Consumer)
    s = bridge_settings.BridgeSettings(metrics_port=0, commands_group_instance_id="site-a-bridge-commands-1")
    b = app.Bridge(s, Mapping.from_dicts(DEFAULT_RULES), StopFlag(), producer=_NoProducer())
    b.connected, b.reconnect_at = True, float("inf")      # no socket, and no connect attempt
    b.commands.consumer.queued = [_ErrorMessage(KafkaError(KafkaError._FATAL, "fenced"))]
    assert b.run() == 1
    assert "fenced" in b.fatal and b.commands.consumer.closed


def test_every_connect_subscribes_again_even_with_a_resumed_session(bridge):
    # Mosquitto 2.0 restores a session from its store without its $share subscriptions.
    bridge._on_connect(True, 0, {})
    bridge._on_disconnect("test")
    bridge._on_connect(True, 0, {})
    assert bridge.subscribed_calls == [bridge.subscriptions, bridge.subscriptions]


def test_bridge_is_healthy_only_once_every_filter_is_granted_at_qos1(bridge):
    bridge._on_connect(False, 0, {})
    assert bridge.health()[0] is False                      # connected, SUBACK not yet in
    bridge._on_subscribe(1, [1])
    assert bridge.health()[0] is True


@pytest.mark.parametrize(("codes", "problem"), [([0x87], "refused (Not authorized)"),
                                                ([0], "granted QoS 0 instead of 1"),
                                                ([], "no reason code")])
def test_refused_or_downgraded_subscription_makes_the_bridge_unhealthy(bridge, caplog, codes, problem):
    bridge._on_connect(False, 0, {})
    bridge._on_subscribe(1, codes)
    ok, text = bridge.health()
    assert not ok and problem in text
    assert [r.levelname for r in caplog.records if "not granted" in r.getMessage()] == ["ERROR"]


def test_session_present_0_after_a_session_is_counted_and_logged_as_lost(bridge, caplog):
    from services.bridge import metrics
    before = metrics.SESSIONS_LOST._value.get()
    bridge._on_connect(False, 0, {})                        # first connect: no session yet is normal
    bridge._on_subscribe(1, [1])
    bridge._on_disconnect("test")
    bridge._on_connect(True, 0, {})                         # resumed: fine
    assert metrics.SESSIONS_LOST._value.get() == before
    bridge._on_subscribe(2, [1])
    bridge._on_disconnect("test")
    bridge._on_connect(False, 0, {})                        # the broker lost it
    assert metrics.SESSIONS_LOST._value.get() == before + 1
    assert "lost the bridge's session" in caplog.text


def test_reconnect_backs_off_to_2s_until_a_connection_is_subscribed(bridge, monkeypatch):
    from services.bridge import app
    now = [1000.0]
    monkeypatch.setattr(app.time, "monotonic", lambda: now[0])
    delays = []
    for _ in range(6):                                      # a broker that accepts, then drops at once
        bridge._on_connect(False, 0, {})
        bridge._on_disconnect("dropped")
        delays.append(round(bridge.reconnect_at - now[0], 2))
    assert delays == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    bridge._on_connect(False, 0, {})
    bridge._on_subscribe(1, [1])
    bridge._on_disconnect("dropped")
    assert bridge.reconnect_at - now[0] == 0.25


# ------------------------------------------------------------------ hand-over on SIGTERM (issue 12, item 4)

def test_peers_are_the_addresses_of_the_service_name_besides_our_own(monkeypatch):
    from services.bridge import app

    def getaddrinfo(name, *_args, **_kwargs):
        ips = {"bridge": ["10.0.0.5", "10.0.0.6"], "me": ["10.0.0.5"]}[name]
        return [(2, 1, 6, "", (ip, 0)) for ip in ips]
    monkeypatch.setattr(app.socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(app.socket, "gethostname", lambda: "me")
    assert app.peers_alive("bridge") == ["10.0.0.6"]


def test_unresolvable_peers_name_means_no_peers(monkeypatch):
    from services.bridge import app

    def fail(*_args, **_kwargs):
        raise OSError("no such name")
    monkeypatch.setattr(app.socket, "getaddrinfo", fail)
    assert app.peers_alive("bridge") == []


@pytest.mark.parametrize(("peers", "hands_over"), [(["10.0.0.6"], True), ([], False)])
def test_sigterm_unsubscribes_only_when_another_replica_runs(bridge, monkeypatch, peers, hands_over):
    from services.bridge import app
    unsubscribed = []
    monkeypatch.setattr(app, "peers_alive", lambda _name: peers)
    monkeypatch.setattr(bridge.client, "unsubscribe", lambda filters: unsubscribed.append(filters) or 1)
    bridge.s = bridge_settings.BridgeSettings(commands_topic=None, metrics_port=0, peers_dns="bridge")
    bridge._on_connect(True, 0, {})
    bridge._begin_stop()
    assert bridge.handing_over is hands_over
    assert unsubscribed == ([bridge.subscriptions] if hands_over else [])


def test_handing_over_waits_until_the_session_queue_went_quiet(bridge, monkeypatch):
    from services.bridge import app
    now = [100.0]
    monkeypatch.setattr(app.time, "monotonic", lambda: now[0])
    bridge._on_connect(True, 0, {})
    bridge.handing_over, bridge.last_message_at = True, 99.5       # a message 0.5 s ago, window empty
    assert bridge._stopped(drain_until=120.0) is False
    now[0] = 100.6                                                 # quiet for 1.1 s
    assert bridge._stopped(drain_until=120.0) is True
    bridge.last_message_at = now[0]
    now[0] = 121.0                                                 # the drain limit always wins
    assert bridge._stopped(drain_until=120.0) is True


# ------------------------------------------------------------------ readings name their device (issue 26)

def test_a_reading_carries_the_device_of_its_topic_and_one_naming_another_device_is_dead_lettered(router):
    other = json.dumps({"timestamp": 1, "temperature": 20.0, "unit": "C", "device_id": "d2"}).encode()
    assert json.loads(router.route(TOPIC, GOOD, None, 1).value)["device_id"] == "d1"
    record = router.route(TOPIC, other, None, 1)
    assert (record.topic, record.reason, record.value) == ("dead-letter", "contract_violation", other)
    assert "field 'device_id' is 'd2' but the topic says 'd1'" in _headers(record)[names.HEADER_DLQ_REASON].decode()


# ------------------------------------------------------------------ every record fits Kafka (issue 26)

BIG_USER_PROPERTIES = [(f"p{i}", "v" * 60_000) for i in range(17)]      # ~1 MB, as the reading had


def _size(record) -> int:
    return len(record.key) + len(record.value or b"") + sum(len(k.encode()) + len(v) for k, v in record.headers)


def test_a_reading_whose_user_properties_make_the_record_too_large_is_dead_lettered_without_them(router):
    record = router.route(TOPIC, GOOD, BIG_USER_PROPERTIES, now_ms=7)
    headers = _headers(record)
    reason = headers[names.HEADER_DLQ_REASON].decode()
    assert (record.topic, record.reason, record.key, record.value) == ("dead-letter", "oversized", b"7", GOOD)
    assert "over BRIDGE_MAX_RECORD_BYTES=900000: its 17 MQTT user properties take 1020211 bytes" in reason
    assert "dropped the 17 headers that came with the message" in reason
    assert not any(k.startswith("p") for k in headers)                       # the device's headers are gone,
    assert headers[names.HEADER_MQTT_TOPIC] == TOPIC.encode() and headers[names.HEADER_SITE] == b"site-a"   # ours stay
    assert _size(record) <= 900_000


def test_user_properties_within_the_bound_travel_with_the_reading(router):
    record = router.route(TOPIC, GOOD, BIG_USER_PROPERTIES[:14], now_ms=7)       # 840 kB of user properties
    assert (record.topic, record.reason) == ("temperature-data", None)
    assert _headers(record)["p13"] == b"v" * 60_000 and _size(record) <= 900_000


def test_a_bad_reading_with_huge_user_properties_is_a_dead_letter_that_fits(router):
    record = router.route(TOPIC, b"{nope", BIG_USER_PROPERTIES, now_ms=7)
    assert (record.reason, record.value) == ("invalid_json", b"{nope")
    assert _size(record) <= 900_000 and "dropped the 17 headers" in _headers(record)[names.HEADER_DLQ_REASON].decode()


class _Producer:
    """Records what the bridge produces; the test reports each delivery (error or not) itself."""

    def __init__(self):
        self.produced: list[tuple[str, bytes, list, object]] = []

    def produce(self, topic, value, key, headers=None, on_delivery=None):
        self.produced.append((topic, value, headers, on_delivery))

    def poll(self, _timeout=0):
        return 0

    def flush(self, _timeout=0):
        return 0


class _Delivered:
    def __init__(self, topic):
        self._topic = topic

    def topic(self):
        return self._topic


@pytest.fixture
def producing_bridge(monkeypatch):
    from services.bridge import app
    from services.common.observability import StopFlag
    s = bridge_settings.BridgeSettings(commands_topic=None, metrics_port=0, window=50, site="site-a")
    producer = _Producer()
    b = app.Bridge(s, Mapping.from_dicts(DEFAULT_RULES), StopFlag(), producer=producer)
    acked: list[int] = []
    monkeypatch.setattr(b.client, "ack", acked.append)
    monkeypatch.setattr(b.client, "write", lambda: None)
    b.acked_mids, b.fake_producer = acked, producer
    return b


def test_the_window_size_is_exported_so_an_alert_can_tell_a_full_window(producing_bridge):
    from services.bridge import metrics
    assert metrics.WINDOW_SIZE._value.get() == 50


def test_a_dead_letter_kafka_refuses_for_good_is_dropped_counted_logged_and_its_message_acked(producing_bridge,
                                                                                              caplog):
    from confluent_kafka import KafkaError

    from services.bridge import metrics
    b = producing_bridge
    dropped = metrics.DEAD_LETTERS_DROPPED.labels("oversized")
    before = dropped._value.get()
    b._on_message(TOPIC, GOOD, 11, 1, BIG_USER_PROPERTIES)
    b._on_message(TOPIC, GOOD, 12, 1, None)
    (dlq_topic, _, _, report_dead), (_, _, _, report_good) = b.fake_producer.produced
    assert dlq_topic == "dead-letter"
    report_dead(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)          # refused for good: never again
    report_good(None, _Delivered("temperature-data"))
    b._ack()
    assert b.acked_mids == [11, 12] and len(b.window) == 0 and not b.retries
    assert len(b.fake_producer.produced) == 2                             # the dead letter was not produced again
    assert dropped._value.get() == before + 1
    lines = [r for r in caplog.records if "dead letter dropped" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelname == "ERROR"
    fields = lines[0].kv
    assert fields["mqtt_topic"] == TOPIC and "max.message.bytes of dead-letter" in fields["fix"]


def test_a_dead_letter_kafka_cannot_take_now_stays_unacked_and_is_produced_again(producing_bridge, monkeypatch):
    from confluent_kafka import KafkaError

    from services.bridge import app
    b = producing_bridge
    b._on_message(TOPIC, b"{nope", 21, 1, None)
    b.fake_producer.produced[0][3](KafkaError(KafkaError._MSG_TIMED_OUT), None)
    b._ack()
    assert b.acked_mids == [] and len(b.retries) == 1
    monkeypatch.setattr(app.time, "monotonic", lambda: float("inf"))
    b._retry_due()
    assert len(b.fake_producer.produced) == 2 and b.fake_producer.produced[1][0] == "dead-letter"


def test_a_reading_kafka_refuses_for_good_becomes_a_bounded_kafka_rejected_dead_letter(producing_bridge):
    from confluent_kafka import KafkaError
    b = producing_bridge
    b._on_message(TOPIC, GOOD, 31, 1, BIG_USER_PROPERTIES[:14])
    topic, value, headers, report = b.fake_producer.produced[0]
    assert topic == "temperature-data"
    report(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)             # e.g. the topic's max.message.bytes is lower
    topic, value, headers, _ = b.fake_producer.produced[1]
    reason = dict(headers)[names.HEADER_DLQ_REASON].decode()
    assert topic == "dead-letter" and reason.startswith("kafka_rejected: Kafka refused the record for temperature-data")
    assert dict(headers)[names.HEADER_DLQ_SOURCE] == TOPIC.encode()
    assert len(b"7") + len(value) + sum(len(k.encode()) + len(v) for k, v in headers) <= 900_000


def test_a_record_produce_refuses_outright_is_permanent_not_retried(producing_bridge):
    """produce() raising for a record's own arguments (here a header name with no UTF-8) would raise again."""
    b = producing_bridge

    def refuse(topic, value, key, headers=None, on_delivery=None):
        if any("\ud800" in k for k, _ in headers or ()):
            raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
        b.fake_producer.produced.append((topic, value, headers, on_delivery))

    b.producer.produce = refuse
    from services.bridge.routing import OutRecord
    from services.bridge.window import Entry
    entry = b.window.add(41, 1, 0.0, OutRecord("temperature-data", b"7", b"{}", [("x\ud800", b"1")]))
    b._produce(entry)
    assert [p[0] for p in b.fake_producer.produced] == ["dead-letter"] and not b.retries
    assert isinstance(entry, Entry) and entry.record.reason == "kafka_rejected"


def test_a_command_dead_letter_kafka_refuses_for_good_is_dropped_and_its_offset_finished(producing_bridge):
    from confluent_kafka import KafkaError
    b = producing_bridge
    done: list[bool] = []
    record = dead_letter("dead-letter", names.DEVICE_COMMANDS, b"k", b"{}", "contract_violation", "bad", 1)
    b._produce_dead_letter(record, lambda: done.append(True))
    b.fake_producer.produced[0][3](KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)
    assert done == [True] and len(b.fake_producer.produced) == 1


@pytest.mark.parametrize("linger_ms, wait_s", [(5, 0.005), (20, 0.02), (0, 0.001)])
def test_with_readings_in_flight_the_loop_waits_the_producers_linger_not_a_millisecond(monkeypatch, linger_ms,
                                                                                       wait_s):
    # Waiting 1 ms for delivery reports made a bridge at 20 readings/s turn about 500 times a second.
    from services.bridge import app
    from services.common.observability import StopFlag
    s = bridge_settings.BridgeSettings(commands_topic=None, sensor_owners_topic=None, metrics_port=0,
                                       kafka_linger_ms=linger_ms)
    stop = StopFlag()
    b = app.Bridge(s, Mapping.from_dicts(DEFAULT_RULES), stop, producer=_Producer())
    monkeypatch.setattr(b.client, "ack", lambda mid: None)
    b.connected = True
    waits: list[float] = []

    def one_turn(read, timeout):
        waits.append(timeout)
        stop.set()

    monkeypatch.setattr(b, "_io", one_turn)
    monkeypatch.setattr(b, "_stopped", lambda until: True)
    b._on_message(TOPIC, GOOD, 11, 1, None)           # produced, its delivery report still to come
    b.run()
    assert waits[0] == wait_s
