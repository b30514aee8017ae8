"""Prometheus metrics of the bridge (served on /metrics by observability.serve_http)."""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.bridge_records import REASONS

RECEIVED = Counter("bridge_messages_received_total", "MQTT messages received from devices")
PRODUCED = Counter("bridge_records_produced_total", "records Kafka acknowledged (including dead-letter ones)",
                   ["topic"])
ACKED = Counter("bridge_messages_acked_total", "PUBACKs sent to the broker after Kafka acknowledged")
DEAD_LETTERED = Counter("bridge_dead_lettered_total", "messages written to the dead-letter topic", ["reason"])
KAFKA_RETRIES = Counter("bridge_kafka_reproduced_total",
                        "records produced again after the producer gave up on them (kept unacked meanwhile)")
REDELIVERY_EXPECTED = Counter("bridge_unacked_on_disconnect_total",
                              "messages in flight when the MQTT connection dropped (the broker redelivers them)")
IN_FLIGHT = Gauge("bridge_in_flight", "messages received and not yet acked (bounded by the window)")
MQTT_CONNECTED = Gauge("bridge_mqtt_connected", "1 while the MQTT session is up")
DELIVERY_LATENCY = Histogram("bridge_delivery_latency_seconds", "MQTT receipt to Kafka acknowledgement",
                             buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
COMMANDS = Counter("bridge_commands_forwarded_total", "device commands published to MQTT and PUBACKed")
COMMANDS_DEAD_LETTERED = Counter("bridge_commands_dead_lettered_total", "invalid device commands dead-lettered")

for _reason in REASONS:        # export every reason from the start, so rate() works on the first one
    DEAD_LETTERED.labels(_reason)
