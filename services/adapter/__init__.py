"""Kafka-to-Cassandra adapter of both tiers (console script `iot-cassandra-adapter`, entry point `app.main`).

app: consume, write, commit after write; mappings: topic -> table (configuration); schema: table
layouts and rows; cassandra: connecting and the keyspace/table DDL; writer: bounded async writes;
metrics; settings.
"""
