"""Spark jobs' pure logic without a SparkSession: conversions, hysteresis, configuration, webhook."""
from __future__ import annotations

import json
import random
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "spark"))

from iot_jobs.hysteresis import (  # noqa: E402
    ConfigError,
    Limits,
    SensorState,
    ThresholdConfig,
    Transition,
    advance,
)

from services.common import contracts  # noqa: E402

LIMITS = Limits(threshold=30.0, hysteresis=2.0)


def run(readings: list[tuple[int, float]], limits: Limits = LIMITS,
        state: SensorState | None = None) -> list[Transition]:
    state = state or SensorState()
    events = []
    for ts, celsius in readings:
        state, event = advance(state, ts, celsius, limits)
        if event:
            events.append(event)
    return events


# ------------------------------------------------------------------ conversions

@pytest.mark.parametrize(("value", "unit", "celsius"), [
    (0.0, "C", 0.0), (21.5, "C", 21.5),
    (32.0, "F", 0.0), (212.0, "F", 100.0), (-40.0, "F", -40.0), (98.6, "F", 37.0),
    (273.15, "K", 0.0), (0.0, "K", -273.15), (373.15, "K", 100.0),
])
def test_to_celsius_converts_fahrenheit_and_kelvin_correctly(value, unit, celsius):
    assert contracts.to_celsius(value, unit) == pytest.approx(celsius)
    assert contracts.from_celsius(celsius, unit) == pytest.approx(value)


def test_to_celsius_rejects_unknown_unit_naming_the_choices():
    with pytest.raises(contracts.ContractError, match="expected C, F or K"):
        contracts.to_celsius(1.0, "R")


# ------------------------------------------------------------------ hysteresis

def test_rise_above_threshold_opens_an_episode_with_one_first_event():
    events = run([(1000, 25.0), (2000, 30.0), (3000, 31.0), (4000, 33.0)])
    assert events == [Transition(timestamp=3000, temperature_threshold=30.0, average_transgression=31.0,
                                 max_transgression=31.0, exceeded_for_ms=0, first_transgression=3000,
                                 last_transgression=3000, is_first=True, is_last=False)]


def test_hovering_between_threshold_and_hysteresis_band_emits_nothing():
    events = run([(1, 31.0), (2, 29.0), (3, 28.0), (4, 30.0), (5, 28.5), (6, 30.5)])
    assert [e.is_first for e in events] == [True]


def test_drop_below_band_closes_episode_with_average_max_and_duration():
    events = run([(1000, 31.0), (2000, 29.0), (3000, 34.0), (4000, 28.0), (5000, 27.9), (6000, 20.0)])
    assert len(events) == 2
    closing = events[1]
    assert closing.is_last and not closing.is_first
    assert closing.timestamp == 5000
    assert closing.exceeded_for_ms == 4000
    assert closing.first_transgression == 1000
    assert closing.last_transgression == 3000          # last reading above the threshold
    assert closing.max_transgression == 34.0
    assert closing.average_transgression == pytest.approx((31 + 29 + 34 + 28) / 4)


def test_immediate_reentry_after_leaving_opens_a_new_episode():
    events = run([(1, 31.0), (2, 20.0), (3, 35.0), (4, 10.0)])
    assert [(e.timestamp, e.is_first, e.is_last) for e in events] == [
        (1, True, False), (2, False, True), (3, True, False), (4, False, True)]
    assert events[3].average_transgression == 35.0 and events[3].first_transgression == 3


def test_zero_hysteresis_leaves_just_below_threshold():
    events = run([(1, 30.1), (2, 30.0), (3, 29.9)], Limits(30.0, 0.0))
    assert [(e.timestamp, e.is_last) for e in events] == [(1, False), (3, True)]


def test_out_of_order_reading_older_than_newest_is_ignored_and_equal_time_applies():
    events = run([(10_000, 31.0), (20_000, 29.0),
                  (15_000, 10.0),     # late: would have closed the episode
                  (20_000, 40.0),     # same time as the newest: applied
                  (5_000, 99.0),      # late: would have raised the maximum
                  (25_000, 27.0)])
    assert [(e.timestamp, e.is_first) for e in events] == [(10_000, True), (25_000, False)]
    assert events[1].max_transgression == 40.0
    assert events[1].average_transgression == pytest.approx((31 + 29 + 40) / 3)


def test_late_reading_cannot_open_an_episode():
    assert run([(10, 20.0), (5, 50.0), (11, 21.0)]) == []


def test_episode_keeps_the_limits_it_opened_with():
    state, opened = advance(SensorState(), 1, 31.0, LIMITS)
    # The sensor's type changes to one with a higher threshold mid-episode.
    state, none = advance(state, 2, 28.5, Limits(50.0, 0.0))
    state, closed = advance(state, 3, 27.0, Limits(50.0, 0.0))
    assert opened.is_first and none is None and closed.is_last
    assert closed.temperature_threshold == 30.0


def test_interleaved_sensors_keep_separate_state():
    readings = [("a", 1, 31.0), ("b", 1, 20.0), ("a", 2, 29.0), ("b", 2, 45.0),
                ("a", 3, 20.0), ("b", 3, 44.0), ("b", 4, 10.0), ("a", 4, 22.0)]
    states: dict[str, SensorState] = {}
    events = []
    for sensor, ts, celsius in readings:
        states[sensor], event = advance(states.get(sensor, SensorState()), ts, celsius, LIMITS)
        if event:
            events.append((sensor, event.timestamp, event.is_first, event.max_transgression))
    assert events == [("a", 1, True, 31.0), ("b", 2, True, 45.0), ("a", 3, False, 31.0), ("b", 4, False, 45.0)]


def test_outcome_does_not_depend_on_how_the_sequence_is_cut_into_batches():
    from iot_jobs.detector import run_sequence
    rng = random.Random(4)
    rows = [(1000 * i + rng.choice([0, 0, 0, -3000]), rng.uniform(24, 36), "site-a") for i in range(400)]
    config = ThresholdConfig(LIMITS, {})
    _, whole = run_sequence("s", SensorState(), rows, None, config)
    state, cut = SensorState(), []
    for start in range(0, 400, 37):
        state, events = run_sequence("s", state, rows[start:start + 37], None, config)
        cut.extend(events)
    assert whole == cut and len(whole) > 10


# ------------------------------------------------------------------ configuration

def test_threshold_config_uses_type_limits_and_falls_back_to_default():
    config = ThresholdConfig.parse(json.dumps({
        "default": {"threshold": 40, "hysteresis": 1.5},
        "types": {"oven": {"threshold": 250, "hysteresis": 10}, "fridge": {"threshold": 8}}}), "THRESHOLDS")
    assert config.limits_for("oven") == Limits(250.0, 10.0)
    assert config.limits_for("fridge") == Limits(8.0, 0.0)
    assert config.limits_for("unknown") == config.limits_for(None) == Limits(40.0, 1.5)


def test_threshold_config_from_file_and_builtin_default(tmp_path):
    path = tmp_path / "thresholds.json"
    path.write_text('{"types": {"oven": {"threshold": 200, "hysteresis": 5}}}')
    config = ThresholdConfig.from_env({"THRESHOLDS_FILE": str(path)})
    assert config.limits_for("oven") == Limits(200.0, 5.0)
    assert config.default == Limits(30.0, 2.0)
    assert ThresholdConfig.from_env({}).by_type == {}


@pytest.mark.parametrize(("environ", "message"), [
    ({"THRESHOLDS": "{nope"}, "THRESHOLDS: not valid JSON"),
    ({"THRESHOLDS": '{"default": {"threshold": "hot"}}'}, "THRESHOLDS: default: 'threshold' must be a finite"),
    ({"THRESHOLDS": '{"types": {"x": {"threshold": 1, "hysteresis": -1}}}'}, "types.x: 'hysteresis' must be >= 0"),
    ({"THRESHOLDS": '{"defaults": {}}'}, "expected an object with keys 'default' and 'types'"),
    ({"THRESHOLDS_FILE": "/nonexistent/t.json"}, "THRESHOLDS_FILE=/nonexistent/t.json: cannot read it"),
    ({"THRESHOLDS_FILE": "/x", "THRESHOLDS": "{}"}, "not both"),
])
def test_threshold_config_errors_name_the_setting(environ, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ThresholdConfig.from_env(environ)


def test_kafka_settings_pass_security_options_and_name_missing_variables(monkeypatch):
    from iot_jobs import runtime
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(runtime.SettingsError, match="KAFKA_BOOTSTRAP_SERVERS is required"):
        runtime.KafkaSettings.from_env()
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-1:9092")
    monkeypatch.setenv("KAFKA_OPTION_SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("KAFKA_OPTION_SSL_TRUSTSTORE_LOCATION", "/run/secrets/truststore.jks")
    monkeypatch.setenv("STARTING_OFFSETS", "earliest")
    settings = runtime.KafkaSettings.from_env()
    assert settings.options == {"kafka.bootstrap.servers": "kafka-1:9092", "kafka.security.protocol": "SSL",
                                "kafka.ssl.truststore.location": "/run/secrets/truststore.jks"}
    assert settings.starting_offsets == "earliest"
    assert settings.starting_options() == {"startingOffsets": "earliest"}
    monkeypatch.setenv("STARTING_OFFSETS", "newest")
    with pytest.raises(runtime.SettingsError, match="STARTING_OFFSETS='newest'"):
        runtime.KafkaSettings.from_env()


@pytest.mark.parametrize("value, seconds", [("1 hour ago", 3600), ("90 seconds ago", 90), ("2 days ago", 172800),
                                            ("1 minute ago", 60)])
def test_starting_offsets_lookback_starts_at_a_timestamp_relative_to_job_start(monkeypatch, value, seconds):
    from iot_jobs import runtime
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-1:9092")
    monkeypatch.setenv("STARTING_OFFSETS", value)
    options = runtime.KafkaSettings.from_env().starting_options(now_ms=10_000_000_000)
    # Partitions with nothing that recent start at their end instead of failing the query.
    assert options == {"startingTimestamp": str(10_000_000_000 - seconds * 1000),
                       "startingOffsetsByTimestampStrategy": "latest"}


def test_starting_offsets_default_is_a_one_hour_lookback(monkeypatch):
    from iot_jobs import runtime
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-1:9092")
    monkeypatch.delenv("STARTING_OFFSETS", raising=False)
    assert runtime.KafkaSettings.from_env().starting_options(now_ms=7_200_000) == {
        "startingTimestamp": "3600000", "startingOffsetsByTimestampStrategy": "latest"}
    monkeypatch.setenv("STARTING_OFFSETS", "1 fortnight ago")
    with pytest.raises(runtime.SettingsError, match="'<n> seconds\\|minutes\\|hours\\|days ago'"):
        runtime.KafkaSettings.from_env()


def test_source_pattern_setting_wins_over_topic(monkeypatch):
    from iot_jobs import runtime
    readings = runtime.topic_options("READINGS", "the readings", "temperature-data")
    assert [o.env for o in readings] == ["READINGS_TOPIC", "READINGS_TOPIC_PATTERN"]
    assert runtime.Source.from_env(readings).options() == {"subscribe": "temperature-data"}
    monkeypatch.setenv("READINGS_TOPIC", "other")
    assert runtime.Source.from_env(readings).options() == {"subscribe": "other"}
    monkeypatch.setenv("READINGS_TOPIC_PATTERN", r".+\.temperature-data")
    assert runtime.Source.from_env(readings).options() == {"subscribePattern": r".+\.temperature-data"}


def test_runtime_settings_error_is_the_one_of_services_common():
    from iot_jobs import runtime

    from services.common import settings
    assert runtime.SettingsError is settings.SettingsError and issubclass(runtime.SettingsError, ValueError)


@pytest.mark.parametrize(("job", "environ", "message"), [
    ("rollups", {}, "configuration error: KAFKA_BOOTSTRAP_SERVERS is required"),
    ("threshold_detector", {"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "SITE": "a", "STATE_TTL_SECONDS": "0"},
     "configuration error: STATE_TTL_SECONDS='0': must be >= 1"),
    ("threshold_detector", {"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "SITE": "a", "THRESHOLDS": "{nope"},
     "configuration error: THRESHOLDS: not valid JSON"),
    ("notifier", {"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "STARTING_OFFSETS": "newest"},
     "configuration error: STARTING_OFFSETS='newest'"),
])
def test_runtime_settings_error_exits_the_job_1_before_spark_starts(job, environ, message, tmp_path):
    import subprocess
    script = Path(__file__).resolve().parents[3] / "spark" / "jobs" / f"{job}.py"
    # PYTHONPATH: this checkout's services, also where the venv installs another one (a git worktree).
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(script.parents[2]), **environ}
    result = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


# ------------------------------------------------------------------ webhook

class ScriptedServer:
    """HTTP server on 127.0.0.1 answering POSTs with scripted (status, body, headers)."""

    def __init__(self, script: list[tuple[int, dict, dict]]) -> None:
        self.script, self.requests = list(script), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                outer.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                status, body, headers = outer.script.pop(0) if outer.script else (200, {"ok": True}, {})
                payload = json.dumps(body).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/bot123:abc/sendMessage"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted():
    servers = []

    def start(script):
        servers.append(ScriptedServer(script))
        return servers[-1]
    yield start
    for server in servers:
        server.close()


def make_webhook(url, sleeps, attempts=4):
    from iot_jobs.webhook import Webhook
    return Webhook(url=url, chat_id="-10042", attempts=attempts, timeout=2, backoff=0.5, sleep=sleeps.append)


def test_webhook_retries_server_errors_then_delivers_telegram_payload(scripted):
    server = scripted([(502, {}, {}), (500, {"ok": False}, {})])
    sleeps = []
    assert make_webhook(server.url, sleeps).send("hot") is None
    assert server.requests == [{"chat_id": "-10042", "text": "hot"}] * 3
    assert sleeps == [0.5, 1.0]


def test_webhook_honours_telegram_retry_after_on_429(scripted):
    server = scripted([(429, {"ok": False, "parameters": {"retry_after": 3}}, {})])
    sleeps = []
    assert make_webhook(server.url, sleeps).send("hot") is None
    assert sleeps == [3.0]


def test_webhook_gives_up_on_client_error_without_retrying(scripted):
    server = scripted([(400, {"ok": False, "description": "Bad Request: chat not found"}, {})])
    sleeps = []
    reason = make_webhook(server.url, sleeps).send("hot")
    assert "after 1 attempt(s): HTTP 400" in reason and "chat not found" in reason
    assert sleeps == [] and len(server.requests) == 1


def test_webhook_reports_final_failure_after_all_attempts(scripted):
    server = scripted([(503, {}, {})] * 5)
    sleeps = []
    failed = make_webhook(server.url, sleeps, attempts=3).send_all([("n1", "hot")])
    assert failed == [("n1", "webhook failed after 3 attempt(s): HTTP 503 Service Unavailable: {}")]
    assert len(server.requests) == 3


def test_webhook_retries_connection_refused():
    import socket
    with socket.socket() as sock:       # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sleeps = []
    reason = make_webhook(f"http://127.0.0.1:{port}/x", sleeps, attempts=2).send("hot")
    assert reason.startswith("webhook failed after 2 attempt(s): URLError") and sleeps == [0.5]


def test_only_a_slow_python_worker_start_restarts_a_query_in_process_and_only_a_bounded_number_of_times():
    from iot_jobs import runtime
    slow = ("[STREAM_FAILED] Query [id = 3b, runId = 24] terminated with exception: "
            "org.apache.spark.SparkException: Python worker failed to connect back.")
    assert "python worker start timed out" in runtime.restart_reason(slow, 0)
    assert runtime.restart_reason("[CANNOT_OPEN_SOCKET] Can not open socket", 3) is not None
    assert runtime.restart_reason(slow, runtime.WORKER_START_RETRIES) is None
    assert [runtime.restart_delay(n) for n in (1, 2, 4, 5, 6, 10)] == [2.0, 4.0, 16.0, 30.0, 30.0, 30.0]
    # Anything else (bad data, Kafka authorisation, a bug) ends the job for Swarm to restart.
    assert runtime.restart_reason("org.apache.kafka.common.errors.TopicAuthorizationException", 0) is None
    assert runtime.restart_reason("None", 0) is None
