"""A paho MQTT client that keeps its window after a reconnection, as docs/operations.md asks of a device.

paho-mqtt 2.2 keeps at most `max_inflight_messages` QoS 1/2 messages unacknowledged while connected, but on
reconnecting it sends every message it holds at once. A device with a backlog then has thousands of readings
in flight; when the broker closes the connection for its rate, the PUBACKs of everything it took are lost with
the connection and the device sends the same readings again on every reconnection (docs/faults.md, "A device
whose backlog outgrows its burst"). This subclass puts the messages beyond the window back in the queue, from
which paho sends one per PUBACK; the lab's and the integration tests' devices use it.

connect_any does the other thing a device must do at a site with more than one mqtt_node: given every node's
address, it tries the next whenever a connection cannot be opened (services/commands/broker_hosts.py).
"""
from __future__ import annotations

import paho.mqtt.client as mqtt

from services.commands import broker_hosts


class WindowedClient(mqtt.Client):
    """paho's Client whose resend after a reconnection keeps to `max_inflight_messages`."""

    def connect_any(self, hosts: list[str], port: int, keepalive: int) -> None:
        """connect_async to the first of `hosts`; paho's loop (loop_start) connects, and reconnects to the next
        address whenever one cannot be reached (services/commands/broker_hosts.py)."""
        broker_hosts.follow_hosts(self, hosts)
        self.connect_async(hosts[0], port, keepalive=keepalive)

    def _messages_reconnect_reset_out(self) -> None:
        super()._messages_reconnect_reset_out()
        if not self._max_inflight_messages:
            return
        with self._out_message_mutex:
            # paho resends in insertion order and stops at the first queued message, so the first
            # `max_inflight_messages` stay to be sent and the rest wait for PUBACKs.
            to_send = 0
            for message in self._out_messages.values():
                if message.qos > 0 and message.state == mqtt.mqtt_ms_publish:
                    to_send += 1
                    if to_send > self._max_inflight_messages:
                        message.state = mqtt.mqtt_ms_queued
