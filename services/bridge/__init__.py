"""MQTT-to-Kafka bridge of an edge site (console script `iot-bridge`, entry point `app.main`).

app: the single-threaded loop; rules: MQTT filter -> Kafka topic/key/contract (configuration);
routing: one MQTT message -> the Kafka record or a dead-letter one; window: the late-PUBACK window;
commands: the reverse path, Kafka `device-commands` -> MQTT; owners: sensor_id -> device_id from
`sensor-registration` (BRIDGE_SENSOR_OWNERS_TOPIC); metrics; settings.
"""
