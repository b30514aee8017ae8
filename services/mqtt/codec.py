"""MQTT v5 packet encoding and decoding for the bridge's client (services.mqtt.session).

Pure functions over bytes: no sockets, no clock, so every packet type is unit-tested
(tests/unit/mqtt). Only what the session needs; see session.py for what is supported.
"""
from __future__ import annotations

import struct

# Packet types (first nibble of the fixed header).
CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = 8, 9, 10, 11, 12, 13, 14, 15

RECV_BYTES = 256 * 1024          # one recv; also the most we buffer before letting TCP push back
MAX_VARINT = 268_435_455         # largest Variable Byte Integer (4 bytes)

# Property identifiers used here, and the wire type of every property MQTT 5 defines.
SESSION_EXPIRY_INTERVAL = 0x11
RECEIVE_MAXIMUM = 0x21
MAXIMUM_PACKET_SIZE = 0x27
SERVER_KEEP_ALIVE = 0x13
TOPIC_ALIAS = 0x23
REASON_STRING = 0x1F
USER_PROPERTY = 0x26
SUBSCRIPTION_IDENTIFIER = 0x0B
_BYTE, _U16, _U32, _VARINT, _UTF8, _BINARY, _PAIR = range(7)
PROPERTY_TYPES = {
    0x01: _BYTE, 0x02: _U32, 0x03: _UTF8, 0x08: _UTF8, 0x09: _BINARY, 0x0B: _VARINT, 0x11: _U32, 0x12: _UTF8,
    0x13: _U16, 0x15: _UTF8, 0x16: _BINARY, 0x17: _BYTE, 0x18: _U32, 0x19: _BYTE, 0x1A: _UTF8, 0x1C: _UTF8,
    0x1F: _UTF8, 0x21: _U16, 0x22: _U16, 0x23: _U16, 0x24: _BYTE, 0x25: _BYTE, 0x26: _PAIR, 0x27: _U32,
    0x28: _BYTE, 0x29: _BYTE, 0x2A: _BYTE,
}
_REPEATABLE = (USER_PROPERTY, SUBSCRIPTION_IDENTIFIER)

REASON_NAMES = {
    0x00: "Success", 0x01: "Granted QoS 1", 0x02: "Granted QoS 2", 0x04: "Disconnect with Will Message",
    0x10: "No matching subscribers", 0x11: "No subscription existed", 0x18: "Continue authentication",
    0x19: "Re-authenticate", 0x80: "Unspecified error", 0x81: "Malformed Packet", 0x82: "Protocol Error",
    0x83: "Implementation specific error", 0x84: "Unsupported Protocol Version",
    0x85: "Client Identifier not valid", 0x86: "Bad User Name or Password", 0x87: "Not authorized",
    0x88: "Server unavailable", 0x89: "Server busy", 0x8A: "Banned", 0x8B: "Server shutting down",
    0x8C: "Bad authentication method", 0x8D: "Keep Alive timeout", 0x8E: "Session taken over",
    0x8F: "Topic Filter invalid", 0x90: "Topic Name invalid", 0x91: "Packet Identifier in use",
    0x92: "Packet Identifier not found", 0x93: "Receive Maximum exceeded", 0x94: "Topic Alias invalid",
    0x95: "Packet too large", 0x96: "Message rate too high", 0x97: "Quota exceeded",
    0x98: "Administrative action", 0x99: "Payload format invalid", 0x9A: "Retain not supported",
    0x9B: "QoS not supported", 0x9C: "Use another server", 0x9D: "Server moved",
    0x9E: "Shared Subscriptions not supported", 0x9F: "Connection rate exceeded", 0xA0: "Maximum connect time",
    0xA1: "Subscription Identifiers not supported", 0xA2: "Wildcard Subscriptions not supported",
}


def reason_name(code: int) -> str:
    return REASON_NAMES.get(code, f"reason 0x{code:02x}")


class MalformedPacket(ValueError):
    """The broker sent bytes that are not a valid MQTT v5 packet (or break the protocol)."""


# ------------------------------------------------------------------ encoding

_U16_S, _U32_S = struct.Struct(">H"), struct.Struct(">I")
PUBACK_HEADER = struct.Struct(">BBH")           # fixed header, remaining length 2, packet id (reason Success implied)
PINGREQ_PACKET = b"\xc0\x00"


def encode_varint(n: int) -> bytes:
    if not 0 <= n <= MAX_VARINT:
        raise ValueError(f"{n} does not fit a Variable Byte Integer")
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def decode_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, position after it); value -1 when the bytes end first; MalformedPacket beyond 4 bytes."""
    value = shift = 0
    for i in range(pos, min(end, pos + 4)):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i + 1
        shift += 7
    if end >= pos + 4:
        raise MalformedPacket("Variable Byte Integer longer than 4 bytes")
    return -1, pos


def _utf8(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 65535:
        raise ValueError("UTF-8 string longer than 65535 bytes")
    return _U16_S.pack(len(raw)) + raw


def _binary(raw: bytes) -> bytes:
    return _U16_S.pack(len(raw)) + raw


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def encode_connect(client_id: str, keepalive: int, username: str | None = None, password: str | None = None,
                   session_expiry: int = 0, receive_maximum: int = 65535, clean_start: bool = False) -> bytes:
    flags = (0x80 if username is not None else 0) | (0x40 if password is not None else 0) | (0x02 if clean_start
                                                                                              else 0)
    props = bytes((SESSION_EXPIRY_INTERVAL,)) + _U32_S.pack(session_expiry)
    if receive_maximum != 65535:
        props += bytes((RECEIVE_MAXIMUM,)) + _U16_S.pack(receive_maximum)
    body = b"\x00\x04MQTT\x05" + bytes((flags,)) + _U16_S.pack(keepalive) + encode_varint(len(props)) + props
    body += _utf8(client_id)
    if username is not None:
        body += _utf8(username)
    if password is not None:
        body += _binary(password.encode())
    return _packet(CONNECT << 4, body)


def encode_subscribe(mid: int, filters: list[str], qos: int = 1) -> bytes:
    """SUBSCRIBE with options byte = QoS (No Local 0, Retain As Published 0, Retain Handling 0)."""
    body = _U16_S.pack(mid) + b"\x00" + b"".join(_utf8(f) + bytes((qos,)) for f in filters)
    return _packet(SUBSCRIBE << 4 | 0x02, body)


def encode_unsubscribe(mid: int, filters: list[str]) -> bytes:
    body = _U16_S.pack(mid) + b"\x00" + b"".join(_utf8(f) for f in filters)
    return _packet(UNSUBSCRIBE << 4 | 0x02, body)


def encode_puback(mid: int) -> bytes:
    return PUBACK_HEADER.pack(PUBACK << 4, 2, mid)


def encode_publish(topic: str, payload: bytes, qos: int = 1, mid: int = 0, dup: bool = False,
                   retain: bool = False) -> bytes:
    head = _utf8(topic) + (_U16_S.pack(mid) if qos else b"") + b"\x00"
    first = PUBLISH << 4 | (0x08 if dup else 0) | qos << 1 | (0x01 if retain else 0)
    return bytes((first,)) + encode_varint(len(head) + len(payload)) + head + payload


def encode_disconnect(reason: int = 0) -> bytes:
    return b"\xe0\x00" if reason == 0 else bytes((DISCONNECT << 4, 2, reason, 0))


# ------------------------------------------------------------------ decoding

def _string(data: bytes, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise MalformedPacket("string length runs past the packet")
    stop = pos + 2 + (data[pos] << 8 | data[pos + 1])
    if stop > end:
        raise MalformedPacket("string runs past the packet")
    return data[pos + 2:stop], stop


def decode_properties(data: bytes, pos: int, end: int) -> tuple[dict[int, object], list[tuple[str, str]], int]:
    """(properties by id, user properties, position after them) from a property length at `pos`.

    Strings are decoded with errors='replace': a device's bad user property must not make
    the broker's message undeliverable forever (the broker would redeliver it on every connection).
    """
    length, pos = decode_varint(data, pos, end)
    stop = pos + length
    if length < 0 or stop > end:
        raise MalformedPacket("property length runs past the packet")
    props: dict[int, object] = {}
    user: list[tuple[str, str]] = []
    while pos < stop:
        pid = data[pos]
        kind = PROPERTY_TYPES.get(pid)
        if kind is None:
            raise MalformedPacket(f"unknown property identifier 0x{pid:02x}")
        if pid in props and pid not in _REPEATABLE:
            raise MalformedPacket(f"property 0x{pid:02x} appears twice")
        pos += 1
        if kind == _BYTE:
            if pos + 1 > stop:
                raise MalformedPacket("property runs past its length")
            value, pos = data[pos], pos + 1
        elif kind == _U16:
            if pos + 2 > stop:
                raise MalformedPacket("property runs past its length")
            value, pos = data[pos] << 8 | data[pos + 1], pos + 2
        elif kind == _U32:
            if pos + 4 > stop:
                raise MalformedPacket("property runs past its length")
            value, pos = _U32_S.unpack_from(data, pos)[0], pos + 4
        elif kind == _VARINT:
            value, pos = decode_varint(data, pos, stop)
            if value < 0:
                raise MalformedPacket("property runs past its length")
        elif kind == _PAIR:
            name, pos = _string(data, pos, stop)
            text, pos = _string(data, pos, stop)
            user.append((name.decode(errors="replace"), text.decode(errors="replace")))
            continue
        else:
            raw, pos = _string(data, pos, stop)
            value = raw.decode(errors="replace") if kind == _UTF8 else raw
        if pid == SUBSCRIPTION_IDENTIFIER:
            props.setdefault(pid, []).append(value)
        else:
            props[pid] = value
    return props, user, stop


def decode_publish(first: int, data: bytes, pos: int, end: int):
    """(topic, payload, mid, qos, user properties, properties) of the PUBLISH body data[pos:end]."""
    qos = (first >> 1) & 3
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    if qos == 2:
        raise MalformedPacket("PUBLISH with QoS 2 on a QoS 1 subscription (protocol error)")
    raw, pos = _string(data, pos, end)
    if not raw:
        raise MalformedPacket("PUBLISH without topic (no topic alias was allowed)")
    mid = 0
    if qos:
        if pos + 2 > end:
            raise MalformedPacket("PUBLISH packet identifier runs past the packet")
        mid = data[pos] << 8 | data[pos + 1]
        if not mid:
            raise MalformedPacket("PUBLISH with packet identifier 0")
        pos += 2
    if pos < end and data[pos] == 0:              # the usual case: no properties
        props, user, pos = None, None, pos + 1
    else:
        props, user, pos = decode_properties(data, pos, end)
        if TOPIC_ALIAS in props:
            raise MalformedPacket("PUBLISH with a topic alias although Topic Alias Maximum is 0 (protocol error)")
        user = user or None
    try:
        topic = raw.decode()
    except UnicodeDecodeError:                     # dead-lettered by the bridge, never dropped
        topic = raw.decode(errors="replace")
    return topic, data[pos:end], mid, qos, user, props
