"""Names on the wire, in one place: Kafka topics, Kafka headers, MQTT topic templates.

Everything that names a topic or a header imports it from here: the bridge, the
adapter, the Spark jobs, the tools, the lab and the benchmarks. The Ansible roles
and the example inventory spell the same names in YAML; a unit test
(tests/unit/test_names_agree.py) checks that they agree with this module.
Standard library only.
"""
from __future__ import annotations

# Kafka topics (docs/architecture.md lists the key, value and cleanup policy of each).
TEMPERATURE_DATA = "temperature-data"
DEVICE_REGISTRATION = "device-registration"
SENSOR_REGISTRATION = "sensor-registration"
SENSOR_TYPE_REGISTRATION = "sensor-type-registration"
THRESHOLD_EVENTS = "temperature-threshold-events"
ROLLUPS_1M = "temperature-rollups-1m"
NOTIFICATIONS = "notifications"
DEVICE_COMMANDS = "device-commands"
DEAD_LETTER = "dead-letter"
# Device logins of an edge site (compacted; key device id, value services/common/device_credentials.py's JSON,
# a tombstone removes the device): written by iot-devices, read by mosquitto-agent into Mosquitto's iot_gate.
DEVICE_CREDENTIALS = "device-credentials"

# Kafka headers added by the bridge (site and ingest time travel beside the value).
HEADER_SITE = "site"
HEADER_INGEST_MS = "ingest_ms"
HEADER_MQTT_TOPIC = "mqtt_topic"
# Headers of a dead-letter record.
HEADER_DLQ_SOURCE = "dlq_source"        # MQTT topic or Kafka topic the record came from
HEADER_DLQ_REASON = "dlq_reason"        # "<reason>: <detail>": a reason code, then what is wrong and the fix
HEADER_DLQ_TIME_MS = "dlq_time_ms"      # when it was dead-lettered (epoch ms)
HEADER_DLQ_OFFSET = "dlq_offset"        # "<partition>:<offset>" of a Kafka source record (none for MQTT)

# MQTT topics: readings from devices, commands to devices (str.format templates). Both name the device:
# Mosquitto's ACL binds that segment to the device's login (%u) and the site segment to the site's own
# broker, so a device can write only its own readings and read only its own commands (docs/security.md).
MQTT_READINGS = "sites/{site}/devices/{device_id}/sensors/{sensor_id}/temperature"
MQTT_COMMANDS = "sites/{site}/devices/{device_id}/commands"
# The iot_gate plugin's control topics (services listener, agent accounts only): mosquitto-agent publishes
# snapshot/upsert/remove/stats requests and reads the plugin's JSON answers (images/mosquitto/plugin/iot_gate.c).
MQTT_GATE_CONTROL = "$CONTROL/iot-gate/v1"
MQTT_GATE_RESPONSE = "$CONTROL/iot-gate/v1/response"

# Kafka consumer groups: service -> group name. A service runs in the group "<owner>-<name>", where owner is
# the alias of the site (or of the datacenter) whose Kafka it reads, e.g. site-a-cassandra-adapter and
# datacenter-cassandra-adapter: no two tiers share a group. MirrorMaker 2 keeps a group's name when it syncs
# offsets into the datacenter, so a shared name would let it move a datacenter service's offsets; the
# stacks set each group explicitly (ansible/roles/stack: templates/, vars/main.yml) and MirrorMaker syncs only
# the sites' own groups (ansible/roles/stack/templates/mm2.properties.j2). tests/unit/roles/test_consumer_groups.py
# checks that all of these agree. A new Kafka consumer with committed offsets gets its name here.
CONSUMER_GROUPS = {
    "adapter": "cassandra-adapter",
    "bridge_commands": "bridge-commands",
}
