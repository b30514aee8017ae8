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
from services.common.settings import setting

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


# Each field is an option (services.common.settings.setting): its flag is --<name> unless given, and it reads
# the variable shown.
@dataclass(frozen=True)
class AgentSettings:
    mqtt_host: str = setting("MOSQUITTO_AGENT_MQTT_HOST", "mosquitto", "Mosquitto's services listener host")
    mqtt_port: int = setting("MOSQUITTO_AGENT_MQTT_PORT", 1883, "Mosquitto's services listener port",
                             settings.integer(1, 65535))
    mqtt_ca_file: str = setting(
        "MOSQUITTO_AGENT_MQTT_CA_FILE", "",
        "PEM file of the CA that issued Mosquitto's certificate: MQTT over TLS, the certificate checked against "
        "it and --mqtt-host (empty: in clear)")
    mqtt_username: str = setting("MOSQUITTO_AGENT_MQTT_USERNAME", "mosquitto-agent",
                                 "the agent account (kind agent in the mqtt_services file)")
    mqtt_password: str | None = setting(secret=True, help="MQTT password of --mqtt-username")
    client_id: str = setting(
        "MOSQUITTO_AGENT_CLIENT_ID", "mosquitto-agent-1",
        "MQTT client id; must start with mosquitto-agent- (Swarm: mosquitto-agent-{{.Task.Slot}})")
    keepalive_s: int = setting("MOSQUITTO_AGENT_KEEPALIVE_S", 30, "MQTT keepalive in seconds",
                               settings.integer(5, 3600), flag="--keepalive")
    kafka_bootstrap: str = setting("MOSQUITTO_AGENT_KAFKA_BOOTSTRAP", "kafka-1:9092",
                                   "Kafka bootstrap servers of the site (SERVICES on a stack)")
    credentials_topic: str = setting("MOSQUITTO_AGENT_CREDENTIALS_TOPIC", names.DEVICE_CREDENTIALS,
                                     "the compacted topic of device logins")
    metrics_port: int = setting("MOSQUITTO_AGENT_METRICS_PORT", 9103, "port of /metrics and /healthz; 0 disables",
                                settings.integer(0, 65535))
    metrics_keystore: str = setting("MOSQUITTO_AGENT_METRICS_KEYSTORE", "",
                                    "PEM file (key, certificate, CA) of /metrics over TLS; empty: in clear")
    metrics_client_ca: str = setting(
        "MOSQUITTO_AGENT_METRICS_CLIENT_CA", "",
        "CA whose certificates may scrape /metrics (with MOSQUITTO_AGENT_METRICS_KEYSTORE)")
    snapshot_chunk: int = setting(
        "MOSQUITTO_AGENT_SNAPSHOT_CHUNK", 500,
        "most devices per snapshot, upsert or remove message (each also stays within Mosquitto's "
        "maximum packet size)", settings.integer(1, 100000))
    stats_interval_s: float = setting("MOSQUITTO_AGENT_STATS_INTERVAL_S", 10.0,
                                      "seconds between stats requests to the plugin", float, flag="--stats-interval")
    memory_limit: int = setting(
        "MOSQUITTO_AGENT_MEMORY_LIMIT", 0,
        "Mosquitto's memory_limit in bytes, exported as mosquitto_memory_limit_bytes (0: not exported)",
        settings.integer(0))
    max_queued_messages: int = setting(
        "MOSQUITTO_AGENT_MAX_QUEUED_MESSAGES", 0,
        "Mosquitto's max_queued_messages, exported as mosquitto_max_queued_messages (0: not exported)",
        settings.integer(0))
    log_level: str = setting("MOSQUITTO_AGENT_LOG_LEVEL", "INFO", "log level")

    def __post_init__(self) -> None:
        if not self.client_id.startswith("mosquitto-agent-"):
            raise settings.SettingsError(
                f"MOSQUITTO_AGENT_CLIENT_ID={self.client_id!r} must start with 'mosquitto-agent-' (the plugin "
                "binds the agent account to that client id prefix); e.g. mosquitto-agent-1")
        if not 0 <= self.mqtt_port <= 65535 or not 0 <= self.metrics_port <= 65535:
            raise settings.SettingsError("MOSQUITTO_AGENT_MQTT_PORT and MOSQUITTO_AGENT_METRICS_PORT must be TCP "
                                         "ports (0..65535)")
        settings.readable_file("MOSQUITTO_AGENT_MQTT_CA_FILE", self.mqtt_ca_file)
        settings.readable_pair(("MOSQUITTO_AGENT_METRICS_KEYSTORE", "MOSQUITTO_AGENT_METRICS_CLIENT_CA"),
                               (self.metrics_keystore, self.metrics_client_ca))


OPTIONS: tuple[settings.Option, ...] = settings.options_of(AgentSettings)


def build_parser() -> argparse.ArgumentParser:
    return settings.build_parser(OPTIONS, prog="iot-mosquitto-agent", description=DESCRIPTION)


def from_args(argv: list[str] | None = None) -> AgentSettings:
    """Flags, else environment, else defaults; bad flags exit 2 with usage, bad variables raise SettingsError."""
    v = vars(settings.parse_args(build_parser(), OPTIONS, argv))
    if v["stats_interval_s"] <= 0:
        raise settings.SettingsError(f"MOSQUITTO_AGENT_STATS_INTERVAL_S={v['stats_interval_s']} must be positive")
    return AgentSettings(**v)
