"""Prometheus metrics of the bridge (served on /metrics by observability.serve_http).

The bridge counts in plain ints on its hot path and pushes them here once per loop
turn (`inc(n)`): a prometheus_client Counter.inc takes a lock and costs ~2 us, a
Histogram.observe ~5 us, too much per message at tens of thousands per second. The
latency histogram is therefore a collector over plain bucket counts (same name,
buckets, _count and _sum as a Histogram), filled by the bridge thread only.
"""
from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from services.bridge.routing import REASONS


class BucketHistogram(Collector):
    """A histogram whose observations are plain list increments (one writer thread, lock-free).

    A scrape may see a sum that lags the counts by a few observations; counts are always
    cumulative and _count equals the +Inf bucket.
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry=REGISTRY):
        self.name, self.documentation = name, documentation
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)      # last: above the largest bound (+Inf)
        self.sum = 0.0
        if registry is not None:
            registry.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def collect(self):
        counts, total = list(self.counts), self.sum
        cumulative, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
            running += count
            cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=cumulative, sum_value=total)

    def describe(self):
        yield HistogramMetricFamily(self.name, self.documentation, buckets=[("+Inf", 0)], sum_value=0)


RECEIVED = Counter("bridge_messages_received_total", "MQTT messages received from devices")
PRODUCED = Counter("bridge_records_produced_total", "records Kafka acknowledged (including dead-letter ones)",
                   ["topic"])
ACKED = Counter("bridge_messages_acked_total", "PUBACKs sent to the broker after Kafka acknowledged")
DEAD_LETTERED = Counter("bridge_dead_lettered_total", "messages written to the dead-letter topic", ["reason"])
DEAD_LETTERS_DROPPED = Counter("bridge_dead_letters_dropped_total",
                               "dead letters Kafka refused for good: dropped and their message acked, so the "
                               "window moves on (an error log line names the MQTT topic)", ["reason"])
KAFKA_RETRIES = Counter("bridge_kafka_reproduced_total",
                        "records produced again after the producer gave up on them (kept unacked meanwhile)")
REDELIVERY_EXPECTED = Counter("bridge_unacked_on_disconnect_total",
                              "messages in flight when the MQTT connection dropped (the broker redelivers them)")
IN_FLIGHT = Gauge("bridge_in_flight", "messages received and not yet acked (bounded by the window)")
WINDOW_SIZE = Gauge("bridge_window_size", "the configured window (BRIDGE_WINDOW): bridge_in_flight at this value "
                                          "means the window is full and the broker sends nothing more")
SENSORS_REGISTERED = Gauge("bridge_sensors_registered",
                           "sensors whose owning device the bridge knows (BRIDGE_SENSOR_OWNERS_TOPIC; 0 when off)")
MQTT_CONNECTED = Gauge("bridge_mqtt_connected", "1 while the MQTT session is up")
SUBSCRIBED = Gauge("bridge_mqtt_subscribed", "1 while every mapped filter is subscribed at QoS 1")
SESSIONS_LOST = Counter("bridge_sessions_lost_total",
                        "reconnects where the broker no longer had the bridge's session (its queue was lost)")
DELIVERY_LATENCY = BucketHistogram("bridge_delivery_latency_seconds", "MQTT receipt to Kafka acknowledgement",
                                   buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
COMMANDS = Counter("bridge_commands_forwarded_total", "device commands published to MQTT and PUBACKed")
COMMANDS_DEAD_LETTERED = Counter("bridge_commands_dead_lettered_total", "invalid device commands dead-lettered")

for _reason in REASONS:        # export every reason from the start, so rate() works on the first one
    DEAD_LETTERED.labels(_reason)
    DEAD_LETTERS_DROPPED.labels(_reason)


def exposition() -> tuple[bytes, str]:
    """The /metrics body and Content-Type (for observability.serve_http)."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
