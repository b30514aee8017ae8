"""Settings of mosquitto-agent: one typed class, read from flags, environment (MOSQUITTO_AGENT_*) and secrets.

Every option (OPTIONS, a services.common.settings table) has a flag and the variable named in its
help; a Swarm stack sets variables only and mounts the secret `mqtt_password` (the agent account's
password on Mosquitto's services listener). The Kafka login is services/common/kafka_auth.py's
(KAFKA_USERNAME and the secret kafka_password).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from services.common import names, settings

DESCRIPTION = """\
mosquitto-agent of an edge site.

Reads the compacted Kafka topic device-credentials from its beginning (no consumer
group) and keeps Mosquitto's device table, held by the iot_gate plugin, equal to
it: a full snapshot on every MQTT (re)connect once the topic was read to its end,
then an upsert or remove for each new record. Asks the plugin for its stats every
interval and exports them, with Mosquitto's $SYS figures, on /metrics; /healthz
answers 200 while MQTT is connected, the last snapshot was acknowledged and Kafka
answered within 30 s.
"""


@dataclass(frozen=True)
class AgentSettings:
    mqtt_host: str = "mosquitto"
    mqtt_port: int = 1883
    mqtt_username: str = "mosquitto-agent"
    mqtt_password: str | None = None
    client_id: str = "mosquitto-agent-1"
    keepalive_s: int = 30
    kafka_bootstrap: str = "kafka-1:9092"
    credentials_topic: str = names.DEVICE_CREDENTIALS
    metrics_port: int = 9103
    snapshot_chunk: int = 500
    stats_interval_s: float = 10.0
    memory_limit: int = 0
    max_queued_messages: int = 0
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if not self.client_id.startswith("mosquitto-agent-"):
            raise settings.SettingsError(
                f"MOSQUITTO_AGENT_CLIENT_ID={self.client_id!r} must start with 'mosquitto-agent-' (the plugin "
                "binds the agent account to that client id prefix); e.g. mosquitto-agent-1")
        if not 0 <= self.mqtt_port <= 65535 or not 0 <= self.metrics_port <= 65535:
            raise settings.SettingsError("MOSQUITTO_AGENT_MQTT_PORT and MOSQUITTO_AGENT_METRICS_PORT must be TCP "
                                         "ports (0..65535)")


_D = AgentSettings()
OPTIONS: tuple[settings.Option, ...] = (
    settings.Option("mqtt_host", "MOSQUITTO_AGENT_MQTT_HOST", _D.mqtt_host, "Mosquitto's services listener host"),
    settings.Option("mqtt_port", "MOSQUITTO_AGENT_MQTT_PORT", _D.mqtt_port, "Mosquitto's services listener port",
                    settings.integer(1, 65535)),
    settings.Option("mqtt_username", "MOSQUITTO_AGENT_MQTT_USERNAME", _D.mqtt_username,
                    "the agent account (kind agent in the mqtt_services file)"),
    settings.Option("mqtt_password", secret=True, help="MQTT password of --mqtt-username"),
    settings.Option("client_id", "MOSQUITTO_AGENT_CLIENT_ID", _D.client_id,
                    "MQTT client id; must start with mosquitto-agent- (Swarm: mosquitto-agent-{{.Task.Slot}})"),
    settings.Option("keepalive_s", "MOSQUITTO_AGENT_KEEPALIVE_S", _D.keepalive_s, "MQTT keepalive in seconds",
                    settings.integer(5, 3600), flag="--keepalive"),
    settings.Option("kafka_bootstrap", "MOSQUITTO_AGENT_KAFKA_BOOTSTRAP", _D.kafka_bootstrap,
                    "Kafka bootstrap servers of the site (INTERNAL)"),
    settings.Option("credentials_topic", "MOSQUITTO_AGENT_CREDENTIALS_TOPIC", _D.credentials_topic,
                    "the compacted topic of device logins"),
    settings.Option("metrics_port", "MOSQUITTO_AGENT_METRICS_PORT", _D.metrics_port,
                    "port of /metrics and /healthz; 0 disables", settings.integer(0, 65535)),
    settings.Option("snapshot_chunk", "MOSQUITTO_AGENT_SNAPSHOT_CHUNK", _D.snapshot_chunk,
                    "most devices per snapshot, upsert or remove message (each also stays within Mosquitto's "
                    "maximum packet size)", settings.integer(1, 100000)),
    settings.Option("stats_interval_s", "MOSQUITTO_AGENT_STATS_INTERVAL_S", _D.stats_interval_s,
                    "seconds between stats requests to the plugin", float, flag="--stats-interval"),
    settings.Option("memory_limit", "MOSQUITTO_AGENT_MEMORY_LIMIT", _D.memory_limit,
                    "Mosquitto's memory_limit in bytes, exported as mosquitto_memory_limit_bytes (0: not exported)",
                    settings.integer(0)),
    settings.Option("max_queued_messages", "MOSQUITTO_AGENT_MAX_QUEUED_MESSAGES", _D.max_queued_messages,
                    "Mosquitto's max_queued_messages, exported as mosquitto_max_queued_messages (0: not exported)",
                    settings.integer(0)),
    settings.Option("log_level", "MOSQUITTO_AGENT_LOG_LEVEL", _D.log_level, "log level"),
)


def build_parser() -> argparse.ArgumentParser:
    return settings.build_parser(OPTIONS, prog="iot-mosquitto-agent", description=DESCRIPTION)


def from_args(argv: list[str] | None = None) -> AgentSettings:
    """Flags, else environment, else defaults; bad flags exit 2 with usage, bad variables raise SettingsError."""
    v = vars(settings.parse_args(build_parser(), OPTIONS, argv))
    if v["stats_interval_s"] <= 0:
        raise settings.SettingsError(f"MOSQUITTO_AGENT_STATS_INTERVAL_S={v['stats_interval_s']} must be positive")
    return AgentSettings(**v)
