"""A lean MQTT v5 client for the bridge: just the packets it needs, driven by the bridge's own loop.

Supported (MQTT 5.0, OASIS standard), client side only: CONNECT (clean start false, keep alive, user
name/password, Session Expiry Interval, Receive Maximum) and CONNACK (reason code, session present; its
Receive Maximum, Maximum Packet Size and Server Keep Alive are honoured); SUBSCRIBE (subscription options)
and SUBACK (reason codes); incoming PUBLISH at QoS 0 and 1 (every property is parsed so unknown data is never
misread; user properties come as a list of (name, value)) and PUBACK out, in order; outgoing PUBLISH at QoS 1
and PUBACK in (resent with DUP after a reconnect, at most the server's Receive Maximum in flight);
PINGREQ/PINGRESP keep-alive with a dead connection timeout; DISCONNECT out (normal: the session is kept) and in.
Not supported: QoS 2, topic aliases (we advertise Topic Alias Maximum 0, so the broker must not use them),
enhanced authentication (AUTH), wills. With `tls` (an ssl.SSLContext) the handshake blocks like the TCP
connect, then reads and writes stay non-blocking. A malformed packet or a protocol error from the broker
closes the connection with an error log line; nothing of it is delivered or acked (tests/unit/mqtt/).
Single-threaded: the owner calls `read`, `write` and `misc` from its loop (after `select` on `sock`); every
callback runs inside those calls. Why not paho, and how it reads and acks: docs/architecture.md, "Inside the bridge"."""
from __future__ import annotations

import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable

from services.common.observability import kv
from services.mqtt.codec import (
    CONNACK,
    DISCONNECT,
    MAXIMUM_PACKET_SIZE,
    PINGREQ_PACKET,
    PINGRESP,
    PUBACK,
    PUBACK_HEADER,
    PUBLISH,
    REASON_STRING,
    RECEIVE_MAXIMUM,
    RECV_BYTES,
    SERVER_KEEP_ALIVE,
    SUBACK,
    UNSUBACK,
    MalformedPacket,
    decode_properties,
    decode_publish,
    decode_varint,
    encode_connect,
    encode_disconnect,
    encode_publish,
    encode_subscribe,
    encode_unsubscribe,
    reason_name,
)

# A non-blocking socket with nothing to do now; a TLS one says so with SSLWant*Error, OSErrors both.
WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)

log = logging.getLogger("bridge.mqtt")


def tls_context(ca_file: str) -> ssl.SSLContext | None:
    """For MQTT over TLS to Mosquitto's services listener: trust only `ca_file`, check the host name the
    session connects to (Mosquitto's certificate names `mosquitto`); None (in clear) when it is empty."""
    return ssl.create_default_context(cafile=ca_file) if ca_file else None


def _ignore(*_args) -> None:
    return None


def _reason_codes(name: str, data: bytes, pos: int, end: int) -> tuple[int, list[int]]:
    """(packet identifier, reason codes) of the SUBACK or UNSUBACK (`name`) body data[pos:end]. Both have
    one layout: packet identifier, properties (parsed, then dropped), one reason code per filter asked."""
    if end - pos < 3:
        raise MalformedPacket(f"{name} shorter than 3 bytes")
    mid = data[pos] << 8 | data[pos + 1]
    _props, _user, at = decode_properties(data, pos + 2, end)
    return mid, list(data[at:end])


class MqttSession:
    """One MQTT v5 connection at a time to one broker; `connect` again after it closed."""

    def __init__(self, host: str, port: int, client_id: str, *, keepalive: int = 60, username: str | None = None,
                 password: str | None = None, session_expiry: int = 0, receive_maximum: int = 65535,
                 connect_timeout: float = 5.0, tls: ssl.SSLContext | None = None):
        self.host, self.port, self.client_id = host, port, client_id
        self.tls = tls
        self.keepalive, self.username, self.password = keepalive, username, password
        self.session_expiry, self.receive_maximum = session_expiry, receive_maximum
        self.connect_timeout = connect_timeout
        # Callbacks, all run inside read/write/misc/close:
        self.on_connect: Callable[[bool, int, dict], None] = _ignore        # (session_present, reason, props)
        self.on_disconnect: Callable[[str], None] = _ignore                  # (why)
        self.on_message: Callable[[str, bytes, int, int, list | None], None] = _ignore  # topic, payload, mid, qos, user
        self.on_suback: Callable[[int, list[int]], None] = _ignore           # (mid, reason codes)
        self.on_unsuback: Callable[[int, list[int]], None] = _ignore         # (mid, reason codes)
        self.on_puback: Callable[[int, int], None] = _ignore                 # (mid, reason code) of our PUBLISH
        self.sock: socket.socket | None = None
        self.connected = False
        self._buf = b""                  # received bytes not parsed yet
        self._backlog = False            # complete PUBLISHes wait in _buf (stopped at max_publish)
        self._out: list[bytes] = []      # packets to send, in order
        self._partial = b""              # the unsent rest of the last write
        self._next_mid = 0
        self._inflight: dict[int, tuple[str, bytes]] = {}   # our QoS 1 PUBLISHes the broker has not acked
        self._waiting: deque[int] = deque()                  # ... and those held back by its Receive Maximum
        self._refused: list[int] = []    # our PUBLISHes too large for the broker: answered in `misc`
        self.server_receive_maximum = 65535
        self.server_max_packet: int | None = None
        self._keepalive = keepalive
        self._last_in = self._last_out = self._ping_sent = self._connack_by = 0.0

    # -------------------------------------------------------------- connection

    def connect(self) -> None:
        """Open the TCP connection and send CONNECT (blocking only for the TCP handshake); raises OSError."""
        if self.sock is not None:
            self.close("reconnecting")
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            try:    # the handshake under the connect timeout; a refused certificate is an OSError (SSLError)
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        sock.setblocking(False)
        self.sock, self.connected = sock, False
        self._buf, self._backlog, self._out, self._partial = b"", False, [], b""
        self._waiting.clear()
        self._keepalive = self.keepalive
        now = time.monotonic()
        self._last_in = self._last_out = now
        self._ping_sent = 0.0
        self._connack_by = now + max(10.0, float(self.keepalive))
        self._out.append(encode_connect(self.client_id, self.keepalive, self.username, self.password,
                                        self.session_expiry, self.receive_maximum))
        self.write()

    def disconnect(self, timeout: float = 0.2) -> None:
        """Normal DISCONNECT (the session and its unacked messages stay with the broker), flush, close."""
        if self.sock is None:
            return
        self._out.append(encode_disconnect(0))
        deadline = time.monotonic() + timeout
        while self.sock is not None and self.want_write() and time.monotonic() < deadline:
            self.write()
            time.sleep(0.005)
        self.close("normal disconnection by the bridge")

    def close(self, why: str) -> None:
        """Drop the connection; queued PUBACKs are dropped with it (they must not reach a newer connection)."""
        sock, self.sock = self.sock, None
        if sock is None:
            return
        self.connected = False
        self._buf, self._backlog, self._out, self._partial = b"", False, [], b""
        try:
            sock.close()
        except OSError:
            pass
        self.on_disconnect(why)

    def _protocol_error(self, detail: str) -> None:
        log.error("malformed MQTT packet from the broker; closing the connection (nothing of it is acked, "
                  "the broker redelivers)", extra=kv(host=self.host, error=detail))
        if self.sock is not None:
            self._out, self._partial = [encode_disconnect(0x81)], b""
            self.write()
        self.close(f"malformed packet from the broker: {detail}")

    # -------------------------------------------------------------- sending

    def want_write(self) -> bool:
        return bool(self._out or self._partial)

    def write(self) -> None:
        """Send everything queued in as few socket writes as the kernel takes (usually one)."""
        if self.sock is None or not (self._out or self._partial):
            return
        data = self._partial + b"".join(self._out) if self._out else self._partial
        self._out = []
        try:
            sent = self.sock.send(data)
        except WOULD_BLOCK:
            sent = 0
        except OSError as err:
            self.close(f"socket error on send: {err}")
            return
        self._partial = data[sent:] if sent < len(data) else b""
        if sent:
            self._last_out = time.monotonic()

    def ack(self, mid: int) -> None:
        """Queue the PUBACK of an incoming QoS 1 PUBLISH; `write` sends all queued ones at once."""
        self._out.append(PUBACK_HEADER.pack(0x40, 2, mid))

    def subscribe(self, filters: list[str], qos: int = 1) -> int:
        mid = self._new_mid()
        self._out.append(encode_subscribe(mid, filters, qos))
        self.write()
        return mid

    def unsubscribe(self, filters: list[str]) -> int:
        mid = self._new_mid()
        self._out.append(encode_unsubscribe(mid, filters))
        self.write()
        return mid

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> int:
        """Publish at QoS 1 (or 0); returns the packet id whose PUBACK `on_puback` reports."""
        mid = self._new_mid() if qos else 0
        if self.server_max_packet is not None and len(encode_publish(topic, payload, qos, mid)) > \
                self.server_max_packet:
            if qos:
                self._refused.append(mid)     # the broker would close on it: answer "Packet too large" locally
            return mid
        if not qos:
            self._out.append(encode_publish(topic, payload, 0))
            return 0
        self._inflight[mid] = (topic, payload)
        if len(self._inflight) - len(self._waiting) > self.server_receive_maximum or not self.connected:
            self._waiting.append(mid)
        else:
            self._out.append(encode_publish(topic, payload, 1, mid))
        return mid

    def _new_mid(self) -> int:
        for _ in range(65535):
            self._next_mid = self._next_mid % 65535 + 1
            if self._next_mid not in self._inflight:
                return self._next_mid
        raise RuntimeError("all 65535 MQTT packet identifiers are in flight")

    def _release_waiting(self) -> None:
        sent = len(self._inflight) - len(self._waiting)
        while self._waiting and sent < self.server_receive_maximum:
            mid = self._waiting.popleft()
            if mid in self._inflight:
                topic, payload = self._inflight[mid]
                self._out.append(encode_publish(topic, payload, 1, mid))
                sent += 1

    # -------------------------------------------------------------- receiving

    def can_read(self) -> bool:
        """Connected, and either room to buffer more or only part of a packet buffered (a large
        packet must be read whole). With RECV_BYTES of complete packets waiting, TCP pushes back."""
        return self.sock is not None and (not self._backlog or len(self._buf) < RECV_BYTES)

    def has_backlog(self) -> bool:
        """Complete PUBLISHes are buffered, or TLS holds decrypted bytes: `read` has work without waiting for
        the socket (select would not wake for bytes TLS has already taken off it)."""
        sock = self.sock
        return self._backlog or (sock is not None and self.tls is not None and sock.pending() > 0)

    def read(self, max_publish: int) -> int:
        """Receive one chunk and handle the complete packets buffered; returns PUBLISHes delivered.

        At most `max_publish` PUBLISHes go to on_message; later packets wait in the buffer,
        so the caller's window is never exceeded and arrival order is kept.
        """
        sock = self.sock
        if sock is None:
            return 0
        if not self._backlog or len(self._buf) < RECV_BYTES:
            try:
                chunk = sock.recv(RECV_BYTES) if self.tls is None else self._recv_tls(sock)
            except WOULD_BLOCK:
                chunk = None
            except OSError as err:
                self.close(f"socket error on receive: {err}")
                return 0
            if chunk is not None:
                if not chunk:
                    self.close("connection closed by the broker")
                    return 0
                self._last_in = time.monotonic()
                self._buf = self._buf + chunk if self._buf else chunk
        return self.feed(b"", max_publish)

    @staticmethod
    def _recv_tls(sock) -> bytes:
        """Up to RECV_BYTES of plaintext: one TLS recv returns one record (16 KiB at most), so take records
        until the socket has no more, as one plain recv takes what the kernel holds."""
        chunks, size = [], 0
        while size < RECV_BYTES:
            try:
                chunk = sock.recv(RECV_BYTES - size)
            except WOULD_BLOCK:
                if chunks:
                    break
                raise
            if not chunk:
                break               # closed: hand over what came before; the next recv returns b"" again
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)

    def feed(self, data: bytes, max_publish: int) -> int:
        """Handle received bytes (appended to the buffer); the parser proper. Returns PUBLISHes delivered."""
        buf = self._buf + data if data else self._buf
        n, pos, delivered = len(buf), 0, 0
        self._backlog = False
        on_message = self.on_message
        sock = self.sock
        try:
            while pos + 1 < n:
                first = buf[pos]
                length = buf[pos + 1]
                body = pos + 2
                if length & 0x80:
                    length, body = decode_varint(buf, pos + 1, n)
                    if length < 0:
                        break
                end = body + length
                if end > n:
                    break
                if first >> 4 == PUBLISH:
                    if delivered >= max_publish:
                        self._backlog = True
                        break
                    # Inline fast path of decode_publish for QoS 1, a valid UTF-8 topic and no properties.
                    tlen = buf[body] << 8 | buf[body + 1] if length >= 2 else 0
                    at = body + 2 + tlen
                    if first & 0x06 == 0x02 and tlen and at + 3 <= end and buf[at + 2] == 0:
                        mid = buf[at] << 8 | buf[at + 1]
                        if not mid:
                            raise MalformedPacket("PUBLISH with packet identifier 0")
                        try:
                            topic = buf[body + 2:at].decode()
                        except UnicodeDecodeError:
                            topic = buf[body + 2:at].decode(errors="replace")
                        pos = end
                        delivered += 1
                        on_message(topic, buf[at + 3:end], mid, 1, None)
                    else:
                        topic, payload, mid, qos, user, _props = decode_publish(first, buf, body, end)
                        pos = end
                        delivered += 1
                        on_message(topic, payload, mid, qos, user)
                else:
                    pos = end
                    self._control(first, buf, body, end)
                if self.sock is not sock:        # closed (or replaced) by a callback or a control packet
                    return delivered
        except MalformedPacket as err:
            self._buf = b""
            self._protocol_error(str(err))
            return delivered
        self._buf = buf[pos:] if pos < n else b""
        return delivered

    def _control(self, first: int, data: bytes, pos: int, end: int) -> None:
        kind, flags = first >> 4, first & 0x0F
        if flags:
            raise MalformedPacket(f"packet type {kind} with reserved flags 0x{flags:x}")
        if kind == PUBACK:
            if end - pos < 2:
                raise MalformedPacket("PUBACK shorter than 2 bytes")
            mid = data[pos] << 8 | data[pos + 1]
            code = data[pos + 2] if end - pos > 2 else 0
            if end - pos > 3:
                decode_properties(data, pos + 3, end)
            if self._inflight.pop(mid, None) is not None:
                self._release_waiting()
                self.on_puback(mid, code)
        elif kind == PINGRESP:
            self._ping_sent = 0.0
        elif kind == SUBACK:
            self.on_suback(*_reason_codes("SUBACK", data, pos, end))
        elif kind == UNSUBACK:
            self.on_unsuback(*_reason_codes("UNSUBACK", data, pos, end))
        elif kind == CONNACK:
            self._connack(data, pos, end)
        elif kind == DISCONNECT:
            code = data[pos] if end > pos else 0
            props, _user, _ = decode_properties(data, pos + 1, end) if end - pos > 1 else ({}, [], end)
            why = reason_name(code)
            if REASON_STRING in props:
                why += f" ({props[REASON_STRING]})"
            log.warning("the MQTT broker disconnected the bridge", extra=kv(reason=why))
            self.close(f"broker sent DISCONNECT: {why}")
        else:
            raise MalformedPacket(f"unexpected packet type {kind} from the broker (protocol error)")

    def _connack(self, data: bytes, pos: int, end: int) -> None:
        if self.connected:
            raise MalformedPacket("second CONNACK (protocol error)")
        if end - pos < 2 or data[pos] & 0xFE:
            raise MalformedPacket("CONNACK too short or with reserved flags set")
        session_present, code = bool(data[pos] & 1), data[pos + 1]
        props, _user, _ = decode_properties(data, pos + 2, end) if end - pos > 2 else ({}, [], end)
        if code >= 0x80:
            self.on_connect(session_present, code, props)
            self.close(f"connection refused: {reason_name(code)}")
            return
        self.server_receive_maximum = int(props.get(RECEIVE_MAXIMUM, 65535)) or 65535
        self.server_max_packet = props.get(MAXIMUM_PACKET_SIZE)
        self._keepalive = int(props.get(SERVER_KEEP_ALIVE, self.keepalive))
        self.connected = True
        # Our unacked PUBLISHes go again in their order, within the broker's Receive Maximum: as
        # retransmissions (DUP) into a resumed session, as new messages when the broker lost it.
        resend = [mid for mid in self._inflight]
        self._waiting = deque(resend)
        sent = 0
        while self._waiting and sent < self.server_receive_maximum:
            mid = self._waiting.popleft()
            topic, payload = self._inflight[mid]
            self._out.append(encode_publish(topic, payload, 1, mid, dup=session_present))
            sent += 1
        self.on_connect(session_present, code, props)

    # -------------------------------------------------------------- timers

    def misc(self) -> None:
        """Keep-alive, CONNACK and dead-connection timeouts; local answers. Call every loop turn."""
        if self._refused:
            refused, self._refused = self._refused, []
            for mid in refused:
                self.on_puback(mid, 0x95)
        if self.sock is None:
            return
        now = time.monotonic()
        if not self.connected:
            if now > self._connack_by:
                log.warning("no CONNACK from the MQTT broker in time", extra=kv(host=self.host))
                self.close("no CONNACK in time")
            return
        keepalive = self._keepalive
        if not keepalive:
            return
        if self._ping_sent:
            # Dead only if nothing at all came from the broker since the ping.
            if now - self._ping_sent >= keepalive and now - self._last_in >= keepalive:
                self.close(f"keep alive timeout: no answer to PINGREQ within {keepalive}s")
        elif now - self._last_out >= keepalive:
            self._ping_sent = now
            self._out.append(PINGREQ_PACKET)
            self.write()
