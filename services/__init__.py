"""The site services: MQTT-to-Kafka bridge, Cassandra adapter, simulator, registrar."""
