"""Settings of the MQTT-to-Kafka bridge: one typed class, read from flags, environment and secrets.

Every option has a command-line flag whose default comes from the environment
variable named in its help, so a Swarm stack only sets environment variables and
mounts the `mqtt_password` secret. A flag wins over the environment.
"""
from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass

from services.common import names, settings

DESCRIPTION = """\
MQTT-to-Kafka bridge of an edge site (and the Kafka-to-MQTT command path).

Subscribes to every mapping rule's MQTT filter through a shared subscription
($share/<group>/<filter>) with a persistent MQTT v5 session, validates each
message against its contract and produces it to Kafka. The device gets its
PUBACK only after Kafka acknowledged the record, so nothing acknowledged is ever
lost. Bad input goes to the dead-letter topic with a reason, then is acked.
Records on the commands topic are published to
sites/<site>/devices/<device_id>/commands at QoS 1.

The MQTT password is the secret mqtt_password: the file named by
$MQTT_PASSWORD_FILE, else /run/secrets/mqtt_password.
"""


@dataclass(frozen=True)
class BridgeSettings:
    mqtt_host: str = "mosquitto"
    mqtt_port: int = 1883
    mqtt_username: str | None = "bridge"
    mqtt_password: str | None = None
    client_id: str = "bridge-1"
    share_group: str = "bridge"
    session_expiry_s: int = 86400
    keepalive_s: int = 30
    mapping_file: str | None = None
    kafka_bootstrap: str = "kafka-1:9092"
    site: str | None = None
    window: int = 1000
    max_payload_bytes: int = 65536
    kafka_message_timeout_ms: int = 120000
    kafka_linger_ms: int = 5
    dead_letter_topic: str = names.DEAD_LETTER
    commands_topic: str | None = names.DEVICE_COMMANDS
    commands_group: str = "bridge-commands"
    metrics_port: int = 9102
    drain_s: float = 8.0
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if not 1 <= self.window <= 65535:
            raise settings.SettingsError(
                f"BRIDGE_WINDOW={self.window} is out of range (1..65535, the MQTT v5 Receive Maximum limit)")
        if self.max_payload_bytes < 1:
            raise settings.SettingsError(f"BRIDGE_MAX_PAYLOAD_BYTES={self.max_payload_bytes} must be positive")
        if not 0 <= self.mqtt_port <= 65535 or not 0 <= self.metrics_port <= 65535:
            raise settings.SettingsError("BRIDGE_MQTT_PORT and BRIDGE_METRICS_PORT must be TCP ports (0..65535)")
        if self.session_expiry_s < 0 or self.kafka_message_timeout_ms < 0 or self.drain_s < 0:
            raise settings.SettingsError("session expiry, Kafka message timeout and drain time must not be negative")
        if "/" in self.share_group or "+" in self.share_group or "#" in self.share_group:
            raise settings.SettingsError(f"BRIDGE_SHARE_GROUP={self.share_group!r} must not contain '/', '+' or '#'")


def _env(name: str, default: object, cast=str):
    """Default for a flag: the environment variable if set, cast here so an error names the variable."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return cast(raw)
    except ValueError:
        raise settings.SettingsError(f"{name}={raw!r} is not a valid {cast.__name__}") from None


def build_parser() -> argparse.ArgumentParser:
    d = BridgeSettings()
    p = argparse.ArgumentParser(prog="iot-bridge", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)

    def opt(flag: str, env: str, default: object, help_: str, type_=str) -> None:
        shown = "unset" if default is None else default
        p.add_argument(flag, type=type_, default=_env(env, default, type_),
                       help=f"{help_} (env {env}, default {shown})")

    opt("--mqtt-host", "BRIDGE_MQTT_HOST", d.mqtt_host, "MQTT broker host")
    opt("--mqtt-port", "BRIDGE_MQTT_PORT", d.mqtt_port, "MQTT broker port", int)
    opt("--mqtt-username", "BRIDGE_MQTT_USERNAME", d.mqtt_username, "MQTT user name")
    opt("--client-id", "BRIDGE_CLIENT_ID", None,
        "MQTT client id; stable and unique per replica (Swarm: bridge-{{.Task.Slot}}) because the "
        "persistent session and its unacked messages belong to it; unset means bridge-<hostname>")
    opt("--share-group", "BRIDGE_SHARE_GROUP", d.share_group,
        "shared subscription group: replicas in one group split the messages")
    opt("--session-expiry", "BRIDGE_SESSION_EXPIRY_S", d.session_expiry_s,
        "seconds the broker keeps the session (and queues messages) while the bridge is away", int)
    opt("--keepalive", "BRIDGE_KEEPALIVE_S", d.keepalive_s, "MQTT keepalive in seconds", int)
    opt("--mapping-file", "BRIDGE_MAPPING_FILE", d.mapping_file,
        "TOML file of [[rule]] MQTT-to-Kafka mappings; unset means the built-in rule "
        "sites/{site}/sensors/{sensor_id}/temperature -> temperature-data")
    opt("--kafka-bootstrap", "BRIDGE_KAFKA_BOOTSTRAP", d.kafka_bootstrap, "Kafka bootstrap servers")
    opt("--site", "BRIDGE_SITE", d.site,
        "site alias for the site header and for commands without a site (a {site} topic segment wins)")
    opt("--window", "BRIDGE_WINDOW", d.window,
        "messages received but not yet acked (in flight to Kafka); sent to the broker as the MQTT v5 "
        "Receive Maximum; keep Mosquitto's max_inflight_messages >= this", int)
    opt("--max-payload", "BRIDGE_MAX_PAYLOAD_BYTES", d.max_payload_bytes,
        "larger payloads go to the dead-letter topic", int)
    opt("--kafka-message-timeout-ms", "BRIDGE_KAFKA_MESSAGE_TIMEOUT_MS", d.kafka_message_timeout_ms,
        "how long the producer retries one record before reporting failure; a failed record is "
        "produced again and stays unacked, so this only bounds a single attempt", int)
    opt("--kafka-linger-ms", "BRIDGE_KAFKA_LINGER_MS", d.kafka_linger_ms,
        "producer linger: batching delay that trades latency for throughput", int)
    opt("--dead-letter-topic", "BRIDGE_DEAD_LETTER_TOPIC", d.dead_letter_topic, "dead-letter Kafka topic")
    opt("--commands-topic", "BRIDGE_COMMANDS_TOPIC", d.commands_topic,
        "Kafka topic forwarded to MQTT device command topics; 'none' disables the command path")
    opt("--commands-group", "BRIDGE_COMMANDS_GROUP", d.commands_group, "Kafka consumer group of the command path")
    opt("--metrics-port", "BRIDGE_METRICS_PORT", d.metrics_port, "port of /metrics and /healthz; 0 disables", int)
    opt("--drain", "BRIDGE_DRAIN_S", d.drain_s,
        "seconds to flush Kafka and send the last PUBACKs on SIGTERM (keep below the stop grace period)", float)
    opt("--log-level", "BRIDGE_LOG_LEVEL", d.log_level, "log level")
    return p


def from_args(argv: list[str] | None = None) -> BridgeSettings:
    """Parse flags (defaults from the environment); bad flags exit 2 with usage, bad values raise SettingsError."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    commands = None if ns.commands_topic in (None, "", "none") else ns.commands_topic
    return BridgeSettings(
        mqtt_host=ns.mqtt_host, mqtt_port=ns.mqtt_port, mqtt_username=ns.mqtt_username or None,
        mqtt_password=settings.secret("mqtt_password"),
        client_id=ns.client_id or f"bridge-{socket.gethostname()}",
        share_group=ns.share_group, session_expiry_s=ns.session_expiry, keepalive_s=ns.keepalive,
        mapping_file=ns.mapping_file or None, kafka_bootstrap=ns.kafka_bootstrap, site=ns.site or None,
        window=ns.window, max_payload_bytes=ns.max_payload,
        kafka_message_timeout_ms=ns.kafka_message_timeout_ms, kafka_linger_ms=ns.kafka_linger_ms,
        dead_letter_topic=ns.dead_letter_topic, commands_topic=commands or None,
        commands_group=ns.commands_group, metrics_port=ns.metrics_port, drain_s=ns.drain,
        log_level=ns.log_level)
