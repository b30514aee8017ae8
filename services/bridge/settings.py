"""Settings of the MQTT-to-Kafka bridge: one typed class, read from flags, environment and secrets.

Every option (OPTIONS, a services.common.settings table) has a command-line flag
and the environment variable named in its help, so a Swarm stack only sets
environment variables and mounts the `mqtt_password` secret. A flag wins over
the environment.
"""
from __future__ import annotations

import argparse
import socket
from dataclasses import dataclass

from services.bridge.routing import MAX_RECORD_BYTES
from services.common import names, settings
from services.common.dead_letter import MIN_RECORD_BYTES

DESCRIPTION = """\
MQTT-to-Kafka bridge of an edge site (and the Kafka-to-MQTT command path).

Subscribes to every mapping rule's MQTT filter through a shared subscription
($share/<group>/<filter>) with a persistent MQTT v5 session, validates each
message against its contract and produces it to Kafka. The bridge PUBACKs a
message to Mosquitto only after Kafka acknowledged its record, so a bridge or
Kafka failure loses nothing Mosquitto holds. Devices get their PUBACK from
Mosquitto on receipt: what a Mosquitto crash can cost them is stated in
docs/architecture.md ("What a Mosquitto crash costs"). Bad input goes to the
dead-letter topic with a reason, then is acked.
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
    max_record_bytes: int = MAX_RECORD_BYTES
    kafka_message_timeout_ms: int = 120000
    kafka_linger_ms: int = 5
    dead_letter_topic: str = names.DEAD_LETTER
    commands_topic: str | None = names.DEVICE_COMMANDS
    commands_group: str = "bridge-commands"
    commands_group_instance_id: str | None = None
    commands_session_timeout_ms: int = 45000
    sensor_owners_topic: str | None = None
    metrics_port: int = 9102
    drain_s: float = 8.0
    peers_dns: str | None = None
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if not 1 <= self.window <= 65535:
            raise settings.SettingsError(
                f"BRIDGE_WINDOW={self.window} is out of range (1..65535, the MQTT v5 Receive Maximum limit)")
        if self.max_payload_bytes < 1:
            raise settings.SettingsError(f"BRIDGE_MAX_PAYLOAD_BYTES={self.max_payload_bytes} must be positive")
        if self.max_record_bytes < MIN_RECORD_BYTES:
            raise settings.SettingsError(f"BRIDGE_MAX_RECORD_BYTES={self.max_record_bytes} is below "
                                         f"{MIN_RECORD_BYTES}, too small for a dead letter's own headers")
        if not 0 <= self.mqtt_port <= 65535 or not 0 <= self.metrics_port <= 65535:
            raise settings.SettingsError("BRIDGE_MQTT_PORT and BRIDGE_METRICS_PORT must be TCP ports (0..65535)")
        if self.session_expiry_s < 0 or self.kafka_message_timeout_ms < 0 or self.drain_s < 0:
            raise settings.SettingsError("session expiry, Kafka message timeout and drain time must not be negative")
        if "/" in self.share_group or "+" in self.share_group or "#" in self.share_group:
            raise settings.SettingsError(f"BRIDGE_SHARE_GROUP={self.share_group!r} must not contain '/', '+' or '#'")


_D = BridgeSettings()
# The flags are --<name> unless given; each reads the variable shown (see services/common/settings.py).
OPTIONS: tuple[settings.Option, ...] = (
    settings.Option("mqtt_host", "BRIDGE_MQTT_HOST", _D.mqtt_host, "MQTT broker host"),
    settings.Option("mqtt_port", "BRIDGE_MQTT_PORT", _D.mqtt_port, "MQTT broker port", int),
    settings.Option("mqtt_username", "BRIDGE_MQTT_USERNAME", _D.mqtt_username, "MQTT user name"),
    settings.Option("mqtt_password", secret=True, help="MQTT password of --mqtt-username"),
    settings.Option("client_id", "BRIDGE_CLIENT_ID", None,
                    "MQTT client id; stable and unique per replica (Swarm: bridge-{{.Task.Slot}}) because the "
                    "persistent session and its unacked messages belong to it; unset means bridge-<hostname>"),
    settings.Option("share_group", "BRIDGE_SHARE_GROUP", _D.share_group,
                    "shared subscription group: replicas in one group split the messages"),
    settings.Option("session_expiry_s", "BRIDGE_SESSION_EXPIRY_S", _D.session_expiry_s,
                    "seconds the broker keeps the session (and queues messages) while the bridge is away", int,
                    flag="--session-expiry"),
    settings.Option("keepalive_s", "BRIDGE_KEEPALIVE_S", _D.keepalive_s, "MQTT keepalive in seconds", int,
                    flag="--keepalive"),
    settings.Option("mapping_file", "BRIDGE_MAPPING_FILE", _D.mapping_file,
                    "TOML file of [[rule]] MQTT-to-Kafka mappings; unset means the built-in rule "
                    "sites/{site}/devices/{device_id}/sensors/{sensor_id}/temperature -> temperature-data"),
    settings.Option("kafka_bootstrap", "BRIDGE_KAFKA_BOOTSTRAP", _D.kafka_bootstrap, "Kafka bootstrap servers"),
    settings.Option("site", "BRIDGE_SITE", _D.site,
                    "site alias for the site header and for commands without a site (a {site} topic segment wins)"),
    settings.Option("window", "BRIDGE_WINDOW", _D.window,
                    "messages received but not yet acked (in flight to Kafka); sent to the broker as the MQTT v5 "
                    "Receive Maximum; keep Mosquitto's max_inflight_messages >= this", int),
    settings.Option("max_payload_bytes", "BRIDGE_MAX_PAYLOAD_BYTES", _D.max_payload_bytes,
                    "larger payloads go to the dead-letter topic", int, flag="--max-payload"),
    settings.Option("max_record_bytes", "BRIDGE_MAX_RECORD_BYTES", _D.max_record_bytes,
                    "bound of a whole Kafka record (key, value, every header's name and value): a reading whose "
                    "MQTT user properties would make it larger goes to the dead-letter topic, and a dead letter "
                    "drops the device's headers, then cuts the value, to fit; keep it below the max.message.bytes "
                    f"of temperature-data and dead-letter (Kafka's default 1048588); at least {MIN_RECORD_BYTES}",
                    int),
    settings.Option("kafka_message_timeout_ms", "BRIDGE_KAFKA_MESSAGE_TIMEOUT_MS", _D.kafka_message_timeout_ms,
                    "how long the producer retries one record before reporting failure; a failed record is "
                    "produced again and stays unacked, so this only bounds a single attempt", int),
    settings.Option("kafka_linger_ms", "BRIDGE_KAFKA_LINGER_MS", _D.kafka_linger_ms,
                    "producer linger: batching delay that trades latency for throughput", int),
    settings.Option("dead_letter_topic", "BRIDGE_DEAD_LETTER_TOPIC", _D.dead_letter_topic, "dead-letter Kafka topic"),
    settings.Option("commands_topic", "BRIDGE_COMMANDS_TOPIC", _D.commands_topic,
                    "Kafka topic forwarded to MQTT device command topics; 'none' disables the command path"),
    settings.Option("commands_group", "BRIDGE_COMMANDS_GROUP", _D.commands_group,
                    "Kafka consumer group of the command path"),
    # Static membership, as the adapter's ADAPTER_GROUP_INSTANCE_ID (services/adapter/settings.py): a
    # restarted replica takes its partitions back at once; one that stops for good holds them until its
    # session times out, because librdkafka sends no LeaveGroup for a static member (docs/operations.md).
    settings.Option("commands_group_instance_id", "BRIDGE_COMMANDS_GROUP_INSTANCE_ID", "",
                    "static membership in the command path's group (librdkafka group.instance.id): unique in the "
                    "group and stable across restarts of a replica (the stack sets "
                    "<site>-bridge-commands-{{.Task.Slot}}); a replica back within the session timeout gets its "
                    "partitions again without a rebalance, one that stops for good holds them until then "
                    "(empty: dynamic membership)", settings.group_instance_id),
    settings.Option("commands_session_timeout_ms", "BRIDGE_COMMANDS_SESSION_TIMEOUT_MS",
                    _D.commands_session_timeout_ms,
                    "session timeout of the command path's group (librdkafka session.timeout.ms, 6000..300000)",
                    settings.session_timeout_ms),
    settings.Option("sensor_owners_topic", "BRIDGE_SENSOR_OWNERS_TOPIC", "",
                    "compacted topic of sensor registrations (the stack sets sensor-registration): read from its "
                    "beginning before the bridge subscribes to MQTT and followed afterwards; a reading whose "
                    "sensor is not registered to the device in its topic goes to the dead-letter topic "
                    "(unregistered_sensor, foreign_sensor); empty: no ownership check"),
    settings.Option("metrics_port", "BRIDGE_METRICS_PORT", _D.metrics_port,
                    "port of /metrics and /healthz; 0 disables", int),
    settings.Option("drain_s", "BRIDGE_DRAIN_S", _D.drain_s,
                    "seconds to flush Kafka and send the last PUBACKs on SIGTERM (keep below the stop grace period)",
                    float, flag="--drain"),
    settings.Option("peers_dns", "BRIDGE_PEERS_DNS", None,
                    "DNS name that lists every running replica (Swarm: the service name, endpoint_mode dnsrr); "
                    "on SIGTERM a replica that sees another one unsubscribes and takes what the broker still "
                    "queued for it, so a scale-down strands nothing; unset means always keep the subscription"),
    settings.Option("log_level", "BRIDGE_LOG_LEVEL", _D.log_level, "log level"),
)


def build_parser() -> argparse.ArgumentParser:
    return settings.build_parser(OPTIONS, prog="iot-bridge", description=DESCRIPTION)


def from_args(argv: list[str] | None = None) -> BridgeSettings:
    """Flags, else environment, else defaults; bad flags exit 2 with usage, bad variables raise SettingsError."""
    v = vars(settings.parse_args(build_parser(), OPTIONS, argv))
    commands = None if v["commands_topic"] in (None, "", "none") else v["commands_topic"]
    return BridgeSettings(**{
        **v, "mqtt_username": v["mqtt_username"] or None, "commands_topic": commands,
        "client_id": v["client_id"] or f"bridge-{socket.gethostname()}",
        "mapping_file": v["mapping_file"] or None, "site": v["site"] or None, "peers_dns": v["peers_dns"] or None,
        "commands_group_instance_id": v["commands_group_instance_id"] or None,
        "sensor_owners_topic": v["sensor_owners_topic"] or None})
