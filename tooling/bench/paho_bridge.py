"""The bridge with paho-mqtt as its MQTT client, two ways: the contenders `scripts/bench bridge` runs
against the bridge's own client (services.mqtt.session), to check the claim that made the project write one.

Everything but the MQTT client is the real bridge (services.bridge.app.Bridge): the same Router,
late-ack Window, idempotent producer, delivery reports and loop. paho-mqtt 2.x acks late with
`manual_ack_set(True)` and `ack(mid, qos)` once Kafka has the record; Receive Maximum is the window, as
in the bridge, so the broker never has more unacked messages out than the window holds.
- PahoBridge: paho on its own network thread (`loop_start`); its callbacks hand events to the
  bridge's thread through a queue.
- PahoLoopBridge: paho's external-loop API (`socket`, `loop_read`, `loop_write`, `loop_misc`,
  `on_socket_register_write`) driven by the bridge's own select loop (Bridge._io, unchanged): no second
  thread, no queue, callbacks straight into the bridge, and a turn's PUBACKs leave in one `loop_write`.

Bench-only: not part of the services package and not shipped in an image.
"""
from __future__ import annotations

import queue

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from services.bridge.app import READ_BATCH, Bridge
from services.bridge.settings import BridgeSettings


class _PahoCalls:
    """What both paho sessions share: the client as the bridge logs in (v5, manual acks, the window as
    Receive Maximum, a persistent session) and the calls the bridge makes on it."""

    def __init__(self, s: BridgeSettings):
        self.s = s
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=s.client_id, protocol=MQTTProtocolVersion.MQTTv5)
        client.manual_ack_set(True)
        if s.mqtt_username:
            client.username_pw_set(s.mqtt_username, s.mqtt_password)
        client.on_unsubscribe = lambda *_: None
        self.paho = client

    def connect(self) -> None:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = self.s.session_expiry_s
        props.ReceiveMaximum = self.s.window
        self.paho.connect(self.s.mqtt_host, self.s.mqtt_port, self.s.keepalive_s, clean_start=False,
                          properties=props)

    def subscribe(self, filters: list[str], qos: int = 1) -> int:
        return self.paho.subscribe([(f, qos) for f in filters])[1]

    def unsubscribe(self, filters: list[str]) -> int:
        return self.paho.unsubscribe(filters)[1]

    def ack(self, mid: int) -> None:
        self.paho.ack(mid, 1)


def _user_properties(m) -> list | None:
    return getattr(m.properties, "UserProperty", None)


class PahoSession(_PahoCalls):
    """paho on its own network thread; its callbacks become events (tuples) in `events` for the bridge's."""

    def __init__(self, s: BridgeSettings, events: queue.SimpleQueue):
        super().__init__(s)
        self.started = False
        client = self.paho
        client.on_connect = lambda _c, _u, flags, rc, _p: events.put(("connect", flags.session_present, rc.value))
        client.on_subscribe = lambda _c, _u, mid, codes, _p: events.put(("suback", mid, [c.value for c in codes]))
        client.on_disconnect = lambda _c, _u, _f, rc, _p: events.put(("disconnect", str(rc)))
        client.on_message = lambda _c, _u, m: events.put(("message", m.topic, m.payload, m.mid, m.qos,
                                                          _user_properties(m)))

    def connect(self) -> None:
        super().connect()
        self.paho.loop_start()
        self.started = True

    def write(self) -> None:
        """paho sends each PUBACK itself, from ack()."""

    def disconnect(self) -> None:
        if self.started:
            self.paho.disconnect()
            self.paho.loop_stop()


class PahoBridge(Bridge):
    """The bridge, with paho-mqtt on its own thread in place of services.mqtt.session."""

    def _mqtt_client(self) -> PahoSession:        # type: ignore[override]
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        return PahoSession(self.s, self.events)

    def _io(self, read: bool, timeout: float) -> None:
        if not self.client.started:
            self._wait_to_reconnect(timeout)
            return
        if read and self.window.room() == 0:
            return                                # only Kafka can make progress; run() waits in poll
        wait: float | None = timeout
        for _ in range(READ_BATCH):
            try:
                kind, *args = self.events.get(timeout=wait) if wait else self.events.get_nowait()
            except queue.Empty:
                return
            wait = None                           # only the first event is waited for
            if kind == "message":
                self._on_message(*args)
            elif kind == "connect":
                self._on_connect(args[0], args[1], {})
            elif kind == "suback":
                self._on_subscribe(*args)
            else:
                self._on_disconnect(*args)
            if read and self.window.room() == 0:
                return


class PahoLoopSession(_PahoCalls):
    """paho driven from the bridge's loop: its callbacks run inside loop_read, on the bridge's thread, and
    call the bridge directly."""

    def __init__(self, s: BridgeSettings, bridge: Bridge):
        super().__init__(s)
        self.messages = 0
        client = self.paho
        # Registered, so ack() only queues the PUBACK: write() sends a turn's worth in one loop_write.
        client.on_socket_register_write = lambda *_: None
        client.on_connect = lambda _c, _u, flags, rc, _p: bridge._on_connect(flags.session_present, rc.value, {})
        client.on_subscribe = lambda _c, _u, mid, codes, _p: bridge._on_subscribe(mid, [c.value for c in codes])
        client.on_disconnect = lambda _c, _u, _f, rc, _p: bridge._on_disconnect(str(rc))

        def on_message(_c, _u, m) -> None:
            self.messages += 1
            bridge._on_message(m.topic, m.payload, m.mid, m.qos, _user_properties(m))
        client.on_message = on_message

    @property
    def sock(self):
        return self.paho.socket()

    def can_read(self) -> bool:
        return self.paho.socket() is not None

    def has_backlog(self) -> bool:
        """paho keeps no buffer of complete packets: what is unread waits in the socket."""
        return False

    def want_write(self) -> bool:
        return self.paho.want_write()

    def misc(self) -> None:
        self.paho.loop_misc()

    def write(self) -> None:
        if self.paho.want_write():
            self.paho.loop_write()

    def read(self, room: int) -> None:
        """Up to `room` packets: loop_read takes one PUBLISH a call (its own count is of QoS 2 flows),
        so call it until a call brings no message (nothing left to read, or another packet)."""
        for _ in range(room):
            before = self.messages
            self.paho.loop_read()
            if self.messages == before or self.paho.socket() is None:
                return

    def disconnect(self) -> None:
        if self.paho.socket() is not None:
            self.paho.disconnect()
            self.paho.loop_write()


class PahoLoopBridge(Bridge):
    """The bridge, with paho-mqtt's external loop in place of services.mqtt.session: the bridge's own `_io`
    drives it through the same calls (PahoLoopSession)."""

    def _mqtt_client(self) -> PahoLoopSession:        # type: ignore[override]
        return PahoLoopSession(self.s, self)
