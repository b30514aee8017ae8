"""mosquitto-agent's settings: declared once, MOSQUITTO_AGENT_* variables, the defaults the spec names."""
from __future__ import annotations

import pytest

from services.common import names
from services.common.settings import SettingsError
from services.mosquitto_agent import settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for option in settings.OPTIONS:
        monkeypatch.delenv(option.env, raising=False)
    monkeypatch.setenv("MQTT_PASSWORD_FILE", str(tmp_path / "absent"))


def test_defaults_are_the_stacks():
    s = settings.from_args([])
    assert (s.mqtt_host, s.mqtt_port, s.mqtt_username, s.client_id) == \
        ("mosquitto", 1883, "mosquitto-agent", "mosquitto-agent-1")
    assert (s.kafka_bootstrap, s.credentials_topic) == ("kafka-1:9092", names.DEVICE_CREDENTIALS)
    assert (s.metrics_port, s.snapshot_chunk, s.stats_interval_s) == (9103, 500, 10.0)
    assert (s.memory_limit, s.max_queued_messages) == (0, 0)


def test_every_variable_is_prefixed_and_read(monkeypatch):
    assert all(o.env.startswith("MOSQUITTO_AGENT_") for o in settings.OPTIONS if not o.secret)
    monkeypatch.setenv("MOSQUITTO_AGENT_CLIENT_ID", "mosquitto-agent-3")
    monkeypatch.setenv("MOSQUITTO_AGENT_MEMORY_LIMIT", "268435456")
    monkeypatch.setenv("MOSQUITTO_AGENT_SNAPSHOT_CHUNK", "100")
    s = settings.from_args([])
    assert (s.client_id, s.memory_limit, s.snapshot_chunk) == ("mosquitto-agent-3", 268435456, 100)


def test_the_password_is_read_from_its_secret_file(monkeypatch, tmp_path):
    (tmp_path / "pw").write_text("agent-secret\n")
    monkeypatch.setenv("MQTT_PASSWORD_FILE", str(tmp_path / "pw"))
    assert settings.from_args([]).mqtt_password == "agent-secret"


def test_a_client_id_outside_the_agents_prefix_is_refused(monkeypatch):
    monkeypatch.setenv("MOSQUITTO_AGENT_CLIENT_ID", "agent-1")
    with pytest.raises(SettingsError, match="must start with 'mosquitto-agent-'"):
        settings.from_args([])


@pytest.mark.parametrize("variable, value", [("MOSQUITTO_AGENT_SNAPSHOT_CHUNK", "0"),
                                             ("MOSQUITTO_AGENT_METRICS_PORT", "70000"),
                                             ("MOSQUITTO_AGENT_STATS_INTERVAL_S", "0")])
def test_bad_values_name_their_variable(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        settings.from_args([])
