"""Prometheus figures of Mosquitto and of the agent (served on /metrics by observability.serve_http).

Mosquitto's own figures come from its $SYS topics (SYS_METRICS: topic -> metric), the iot_gate plugin's
from its answers (every answer carries its counters). Both are held by one collector, `Figures`, which
the agent's thread fills and a scrape reads under a lock; a figure is exported only once known and
dropped when the MQTT connection drops, so a scrape never shows a stale value as current (mosquitto_up
says 0 then). Counters are the broker's own totals: they restart from 0 with Mosquitto, which
Prometheus' rate() and increase() take as a reset. Limit: Mosquitto publishes a $SYS value only when it
changed at a tick (sys_interval, 10 s) and keeps none for a new subscriber (retain_available false), so
after the agent reconnects, uptime and heap return within 10 s but clients/connected only at the next
connect or disconnect (tests/integration/test_devices_and_agent.py::test_the_agent_exports_mosquittos_figures).
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.mosquitto_agent.protocol import Answer

GAUGE, COUNTER = "gauge", "counter"
# Mosquitto 2.0's $SYS topics -> (metric, type, help). Counter names carry _total as exported.
SYS_METRICS: dict[str, tuple[str, str, str]] = {
    "$SYS/broker/uptime": ("mosquitto_uptime_seconds", GAUGE, "seconds since Mosquitto started"),
    "$SYS/broker/clients/connected": ("mosquitto_clients_connected", GAUGE, "clients connected now"),
    "$SYS/broker/publish/messages/received": ("mosquitto_messages_received_total", COUNTER,
                                              "PUBLISH messages Mosquitto received"),
    "$SYS/broker/publish/messages/sent": ("mosquitto_messages_sent_total", COUNTER, "PUBLISH messages Mosquitto sent"),
    "$SYS/broker/publish/messages/dropped": ("mosquitto_messages_dropped_total", COUNTER,
                                             "PUBLISH messages Mosquitto dropped (queues full, limits)"),
    "$SYS/broker/store/messages/count": ("mosquitto_store_messages", GAUGE,
                                         "messages held in Mosquitto's store (queued, in flight)"),
    "$SYS/broker/store/messages/bytes": ("mosquitto_store_bytes", GAUGE, "payload bytes of those messages"),
    "$SYS/broker/heap/current": ("mosquitto_heap_bytes", GAUGE, "Mosquitto's heap in use"),
}
# The plugin's counters -> (metric, help); acl_denied_* become one metric with an action label.
GATE_COUNTERS: dict[str, tuple[str, str]] = {
    "auth_ok": ("mosquitto_gate_auth_ok_total", "device logins the gate accepted"),
    "auth_refused": ("mosquitto_gate_auth_refused_total",
                     "device logins refused: unknown, disabled or wrong credentials"),
    "unknown_device": ("mosquitto_gate_unknown_device_total", "device logins refused for an id not in the table"),
    "gate_refused": ("mosquitto_gate_start_refused_total",
                     "device logins refused because no bridge had subscribed since Mosquitto started"),
    "rate_limited": ("mosquitto_gate_rate_limited_total",
                     "device connections closed for publishing over their rate (all devices)"),
    "rested": ("mosquitto_gate_rested_total",
               "device logins refused at CONNECT while their rate bucket refills after going over it"),
    "control": ("mosquitto_gate_control_total", "control requests the plugin handled"),
    "offences": ("mosquitto_gate_offences_counted_total",
                 "offences of every login since Mosquitto started (mosquitto_gate_offences_total names the "
                 "recent ones)"),
}
ACL_DENIED = {"acl_denied_publish": "publish", "acl_denied_subscribe": "subscribe"}


def sys_figure(topic: str, payload: bytes) -> tuple[str, float] | None:
    """(metric, value) of a $SYS message this module exports, else None. Values are numbers,
    `$SYS/broker/uptime` says '<n> seconds'."""
    spec = SYS_METRICS.get(topic)
    if spec is None:
        return None
    try:
        return spec[0], float(payload.split(b" ", 1)[0])
    except ValueError:
        return None


class Figures(Collector):
    """What is known of Mosquitto now; written by the agent's thread, read by scrapes."""

    def __init__(self, registry=REGISTRY) -> None:
        self._lock = threading.Lock()
        self._sys: dict[str, float] = {}
        self._answer: Answer | None = None
        self.up: Callable[[], bool] = lambda: False
        self.sync_age: Callable[[], float] = lambda: 0.0
        self.devices_synced: int | None = None
        self.memory_limit = 0
        self.max_queued_messages = 0
        if registry is not None:
            registry.register(self)

    def set_sys(self, topic: str, payload: bytes) -> bool:
        figure = sys_figure(topic, payload)
        if figure is None:
            return False
        with self._lock:
            self._sys[figure[0]] = figure[1]
        return True

    def set_answer(self, answer: Answer) -> None:
        with self._lock:
            self._answer = answer

    def forget_broker(self) -> None:
        """The connection dropped: what was known of this Mosquitto is no longer current."""
        with self._lock:
            self._sys.clear()
            self._answer = None

    def collect(self):
        with self._lock:
            sys_values, answer = dict(self._sys), self._answer
        yield GaugeMetricFamily("mosquitto_up", "1 while the agent is connected to Mosquitto and the plugin answers",
                                value=1 if self.up() else 0)
        for name, kind, help_text in SYS_METRICS.values():
            if name in sys_values:
                family = CounterMetricFamily if kind == COUNTER else GaugeMetricFamily
                yield family(name, help_text, value=sys_values[name])
        if answer is not None:
            yield from _gate_families(answer, "mosquitto_uptime_seconds" not in sys_values)
        if self.devices_synced is not None:
            yield GaugeMetricFamily("mosquitto_agent_devices_synced",
                                    "devices in the last snapshot the plugin acknowledged", value=self.devices_synced)
        yield GaugeMetricFamily("mosquitto_agent_sync_age_seconds",
                                "seconds the plugin's table has not been known equal to the topic (0: in sync)",
                                value=self.sync_age())
        if self.memory_limit:
            yield GaugeMetricFamily("mosquitto_memory_limit_bytes", "Mosquitto's memory_limit (the stack's setting)",
                                    value=self.memory_limit)
        if self.max_queued_messages:
            yield GaugeMetricFamily("mosquitto_max_queued_messages",
                                    "Mosquitto's max_queued_messages per client (the stack's setting)",
                                    value=self.max_queued_messages)

    def describe(self):
        return []        # figures come and go with the connection: nothing to check at registration


def _gate_families(answer: Answer, with_uptime: bool):
    if answer.gate_open is not None:
        yield GaugeMetricFamily("mosquitto_gate_open",
                                "1 once a bridge subscribed since Mosquitto started (device logins accepted)",
                                value=1 if answer.gate_open else 0)
    if answer.devices is not None:
        yield GaugeMetricFamily("mosquitto_devices", "devices in the plugin's table", value=answer.devices)
    if answer.connected is not None:
        yield GaugeMetricFamily("mosquitto_devices_connected",
                                "device connections the gate let in that are open now (the plugin's count, known "
                                "at every stats answer, unlike $SYS's clients/connected)", value=answer.connected)
    if with_uptime and answer.uptime_s is not None:
        yield GaugeMetricFamily("mosquitto_uptime_seconds", "seconds since Mosquitto started", value=answer.uptime_s)
    if answer.kicked is not None:
        yield CounterMetricFamily("mosquitto_gate_kicked_total",
                                  "device connections closed because their login was removed, disabled or changed",
                                  value=answer.kicked)
    for key, (name, help_text) in GATE_COUNTERS.items():
        if key in answer.counters:
            yield CounterMetricFamily(name, help_text, value=answer.counters[key])
    denied = CounterMetricFamily("mosquitto_gate_acl_denied_total",
                                 "device PUBLISHes and SUBSCRIBEs the gate refused", labels=["action"])
    for key, action in ACL_DENIED.items():
        if key in answer.counters:
            denied.add_metric([action], answer.counters[key])
    if denied.samples:
        yield denied
    offences = CounterMetricFamily("mosquitto_gate_offences_total",
                                   "what one MQTT login did that the gate refused or closed it for, by offence "
                                   "(the logins that offended most recently)", labels=["login", "offence"])
    for login, counts in sorted(answer.offences.items()):
        for offence, count in sorted(counts.items()):
            offences.add_metric([login, offence], count)
    yield offences


FIGURES = Figures()
PLUGIN_ERRORS = Counter("mosquitto_agent_plugin_errors_total",
                        "requests the plugin refused (ok=false) or Mosquitto did not take", ["command"])
SNAPSHOTS = Counter("mosquitto_agent_snapshots_total", "full snapshots the plugin acknowledged")
for _command in ("snapshot", "upsert", "remove", "stats"):
    PLUGIN_ERRORS.labels(_command)


def exposition() -> tuple[bytes, str]:
    """The /metrics body and Content-Type (for observability.serve_http)."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
