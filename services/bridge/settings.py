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
from services.common.settings import setting

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


# Each field is an option (services.common.settings.setting): its flag is --<name> unless given, and it reads
# the variable shown. A field_default is the value of a BridgeSettings built in code; from_args computes it
# from the option's value (client_id from the host name, "" -> None, commands_topic "none" -> None).
@dataclass(frozen=True)
class BridgeSettings:
    mqtt_host: str = setting("BRIDGE_MQTT_HOST", "mosquitto", "MQTT broker host")
    mqtt_port: int = setting("BRIDGE_MQTT_PORT", 1883, "MQTT broker port", int)
    mqtt_ca_file: str = setting(
        "BRIDGE_MQTT_CA_FILE", "",
        "PEM file of the CA that issued Mosquitto's certificate: MQTT over TLS, the certificate checked against "
        "it and --mqtt-host (empty: in clear)")
    mqtt_username: str | None = setting("BRIDGE_MQTT_USERNAME", "bridge", "MQTT user name")
    mqtt_password: str | None = setting(secret=True, help="MQTT password of --mqtt-username")
    client_id: str = setting(
        "BRIDGE_CLIENT_ID", None,
        "MQTT client id; stable and unique per replica (Swarm: bridge-{{.Task.Slot}}) because the "
        "persistent session and its unacked messages belong to it; unset means bridge-<hostname>",
        field_default="bridge-1")
    share_group: str = setting("BRIDGE_SHARE_GROUP", "bridge",
                               "shared subscription group: replicas in one group split the messages")
    session_expiry_s: int = setting(
        "BRIDGE_SESSION_EXPIRY_S", 86400,
        "seconds the broker keeps the session (and queues messages) while the bridge is away", int,
        flag="--session-expiry")
    keepalive_s: int = setting("BRIDGE_KEEPALIVE_S", 30, "MQTT keepalive in seconds", int, flag="--keepalive")
    mapping_file: str | None = setting(
        "BRIDGE_MAPPING_FILE", None,
        "TOML file of [[rule]] MQTT-to-Kafka mappings; unset means the built-in rule "
        "sites/{site}/devices/{device_id}/sensors/{sensor_id}/temperature -> temperature-data")
    kafka_bootstrap: str = setting("BRIDGE_KAFKA_BOOTSTRAP", "kafka-1:9092", "Kafka bootstrap servers")
    site: str | None = setting(
        "BRIDGE_SITE", None,
        "site alias for the site header and for commands without a site (a {site} topic segment wins)")
    window: int = setting(
        "BRIDGE_WINDOW", 1000,
        "messages received but not yet acked (in flight to Kafka); sent to the broker as the MQTT v5 "
        "Receive Maximum; keep Mosquitto's max_inflight_messages >= this", int)
    max_payload_bytes: int = setting("BRIDGE_MAX_PAYLOAD_BYTES", 65536,
                                     "larger payloads go to the dead-letter topic", int, flag="--max-payload")
    max_record_bytes: int = setting(
        "BRIDGE_MAX_RECORD_BYTES", MAX_RECORD_BYTES,
        "bound of a whole Kafka record (key, value, every header's name and value): a reading whose "
        "MQTT user properties would make it larger goes to the dead-letter topic, and a dead letter "
        "drops the device's headers, then cuts the value, to fit; keep it below the max.message.bytes "
        f"of temperature-data and dead-letter (Kafka's default 1048588); at least {MIN_RECORD_BYTES}",
        int)
    kafka_message_timeout_ms: int = setting(
        "BRIDGE_KAFKA_MESSAGE_TIMEOUT_MS", 120000,
        "how long the producer retries one record before reporting failure; a failed record is "
        "produced again and stays unacked, so this only bounds a single attempt", int)
    kafka_linger_ms: int = setting("BRIDGE_KAFKA_LINGER_MS", 5,
                                   "producer linger: batching delay that trades latency for throughput", int)
    dead_letter_topic: str = setting("BRIDGE_DEAD_LETTER_TOPIC", names.DEAD_LETTER, "dead-letter Kafka topic")
    commands_topic: str | None = setting(
        "BRIDGE_COMMANDS_TOPIC", names.DEVICE_COMMANDS,
        "Kafka topic forwarded to MQTT device command topics; 'none' disables the command path")
    commands_group: str = setting("BRIDGE_COMMANDS_GROUP", "bridge-commands",
                                  "Kafka consumer group of the command path")
    # Static membership, as the adapter's ADAPTER_GROUP_INSTANCE_ID (services/adapter/settings.py): a
    # restarted replica takes its partitions back at once; one that stops for good holds them until its
    # session times out, because librdkafka sends no LeaveGroup for a static member (docs/operations.md).
    commands_group_instance_id: str | None = setting(
        "BRIDGE_COMMANDS_GROUP_INSTANCE_ID", "",
        "static membership in the command path's group (librdkafka group.instance.id): unique in the "
        "group and stable across restarts of a replica (the stack sets "
        "<site>-bridge-commands-{{.Task.Slot}}); a replica back within the session timeout gets its "
        "partitions again without a rebalance, one that stops for good holds them until then "
        "(empty: dynamic membership)", settings.group_instance_id, field_default=None)
    commands_session_timeout_ms: int = setting(
        "BRIDGE_COMMANDS_SESSION_TIMEOUT_MS", 45000,
        "session timeout of the command path's group (librdkafka session.timeout.ms, 6000..300000)",
        settings.session_timeout_ms)
    sensor_owners_topic: str | None = setting(
        "BRIDGE_SENSOR_OWNERS_TOPIC", "",
        "compacted topic of sensor registrations (the stack sets sensor-registration): read from its "
        "beginning before the bridge subscribes to MQTT and followed afterwards; a reading whose "
        "sensor is not registered to the device in its topic goes to the dead-letter topic "
        "(unregistered_sensor, foreign_sensor); empty: no ownership check", field_default=None)
    metrics_port: int = setting("BRIDGE_METRICS_PORT", 9102, "port of /metrics and /healthz; 0 disables", int)
    metrics_keystore: str = setting(
        "BRIDGE_METRICS_KEYSTORE", "", "PEM file (key, certificate, CA) of /metrics over TLS; empty: in clear")
    metrics_client_ca: str = setting(
        "BRIDGE_METRICS_CLIENT_CA", "", "CA whose certificates may scrape /metrics (with BRIDGE_METRICS_KEYSTORE)")
    drain_s: float = setting(
        "BRIDGE_DRAIN_S", 8.0,
        "seconds to flush Kafka and send the last PUBACKs on SIGTERM (keep below the stop grace period)",
        float, flag="--drain")
    peers_dns: str | None = setting(
        "BRIDGE_PEERS_DNS", None,
        "DNS name that lists every running replica (Swarm: the service name, endpoint_mode dnsrr); "
        "on SIGTERM a replica that sees another one unsubscribes and takes what the broker still "
        "queued for it, so a scale-down strands nothing; unset means always keep the subscription")
    log_level: str = setting("BRIDGE_LOG_LEVEL", "INFO", "log level")

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
        settings.readable_file("BRIDGE_MQTT_CA_FILE", self.mqtt_ca_file)
        settings.readable_pair(("BRIDGE_METRICS_KEYSTORE", "BRIDGE_METRICS_CLIENT_CA"),
                               (self.metrics_keystore, self.metrics_client_ca))
        if self.session_expiry_s < 0 or self.kafka_message_timeout_ms < 0 or self.drain_s < 0:
            raise settings.SettingsError("session expiry, Kafka message timeout and drain time must not be negative")
        if "/" in self.share_group or "+" in self.share_group or "#" in self.share_group:
            raise settings.SettingsError(f"BRIDGE_SHARE_GROUP={self.share_group!r} must not contain '/', '+' or '#'")


OPTIONS: tuple[settings.Option, ...] = settings.options_of(BridgeSettings)


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
