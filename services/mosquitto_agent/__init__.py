"""mosquitto-agent of an edge site (console script `iot-mosquitto-agent`, entry point `app.main`): keeps
Mosquitto's device table (the iot_gate plugin's) equal to the Kafka topic `device-credentials` and exports
Mosquitto's figures to Prometheus.

app: the single-threaded loop (Kafka consumer, MQTT client, requests and answers); protocol: the plugin's
control requests and answers as bytes; metrics: $SYS topics and the plugin's stats as Prometheus figures;
settings.
"""
