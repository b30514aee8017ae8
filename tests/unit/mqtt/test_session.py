"""The bridge's lean MQTT v5 client without a broker: packet encoding and decoding, the buffered parser.

Decoding goes through MqttSession.feed (what `read` calls with each received chunk); a
socketpair stands in for the connection where the client must write or close.
"""
from __future__ import annotations

import select
import socket
import struct
import threading
import time

import pytest

from services.mqtt import codec as m
from services.mqtt import session as session_module
from services.mqtt.codec import MalformedPacket
from services.mqtt.session import MqttSession


def _props(*items: bytes) -> bytes:
    body = b"".join(items)
    return m.encode_varint(len(body)) + body


def _utf8(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack(">H", len(raw)) + raw


def _publish(topic: str | bytes, payload: bytes, mid: int = 1, qos: int = 1, props: bytes = b"\x00",
             first: int | None = None) -> bytes:
    body = _utf8(topic) + (struct.pack(">H", mid) if qos else b"") + props + payload
    return bytes((first if first is not None else 0x30 | qos << 1,)) + m.encode_varint(len(body)) + body


class _Recorder:
    def __init__(self) -> None:
        self.messages: list[tuple] = []
        self.closed: list[str] = []


@pytest.fixture
def session():
    """A session on one end of a socketpair, recording what reaches the bridge's callbacks."""
    ours, broker = socket.socketpair()
    s = MqttSession("broker", 1883, "bridge-1", keepalive=30)
    s.sock, s.connected = ours, True
    s.rec = _Recorder()
    s.on_message = lambda *args: s.rec.messages.append(args)
    s.on_disconnect = s.rec.closed.append
    s.broker = broker
    broker.settimeout(1)
    yield s
    ours.close()
    broker.close()


# ------------------------------------------------------------------ encoding

@pytest.mark.parametrize(("value", "encoded"), [
    (0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16383, b"\xff\x7f"), (16384, b"\x80\x80\x01"),
    (2097151, b"\xff\xff\x7f"), (2097152, b"\x80\x80\x80\x01"), (268435455, b"\xff\xff\xff\x7f"),
])
def test_variable_byte_integer_edges_encode_and_decode(value, encoded):
    assert m.encode_varint(value) == encoded
    assert m.decode_varint(encoded, 0, len(encoded)) == (value, len(encoded))
    if len(encoded) > 1:      # cut short: incomplete, not an error
        assert m.decode_varint(encoded, 0, len(encoded) - 1)[0] == -1


def test_variable_byte_integer_of_five_bytes_is_malformed():
    with pytest.raises(MalformedPacket, match="longer than 4 bytes"):
        m.decode_varint(b"\xff\xff\xff\xff\x01", 0, 5)
    with pytest.raises(ValueError):
        m.encode_varint(268435456)


def test_connect_is_v5_without_clean_start_with_credentials_expiry_and_receive_maximum():
    packet = m.encode_connect("bridge-1", 30, "bridge", "pw", session_expiry=86400, receive_maximum=1000)
    props = b"\x11" + struct.pack(">I", 86400) + b"\x21" + struct.pack(">H", 1000)
    body = (b"\x00\x04MQTT\x05" + bytes((0xC0,)) + struct.pack(">H", 30) + bytes((len(props),)) + props
            + _utf8("bridge-1") + _utf8("bridge") + _utf8("pw"))
    assert packet == bytes((0x10, len(body))) + body


def test_connect_without_credentials_sets_no_flags():
    packet = m.encode_connect("c", 0)
    assert packet[9] == 0x00               # connect flags: no user, no password, clean start false
    assert packet[0] == 0x10 and packet[1] == len(packet) - 2


def test_subscribe_carries_options_byte_per_filter():
    packet = m.encode_subscribe(7, ["$share/g/a/+", "b"], qos=1)
    body = struct.pack(">H", 7) + b"\x00" + _utf8("$share/g/a/+") + b"\x01" + _utf8("b") + b"\x01"
    assert packet == bytes((0x82, len(body))) + body


def test_puback_and_publish_encoding():
    assert m.encode_puback(0x1234) == b"\x40\x02\x12\x34"
    assert m.encode_publish("a/b", b"hi", qos=1, mid=5) == b"\x32\x0a\x00\x03a/b\x00\x05\x00hi"
    assert m.encode_publish("a/b", b"hi", qos=1, mid=5, dup=True)[0] == 0x3A
    assert m.encode_publish("t", b"", qos=0) == b"\x30\x04\x00\x01t\x00"
    big = m.encode_publish("t", b"x" * 200, qos=1, mid=1)
    assert big[1:3] == m.encode_varint(len(big) - 3)     # two-byte remaining length


def test_disconnect_encoding():
    assert m.encode_disconnect() == b"\xe0\x00"
    assert m.encode_disconnect(0x81) == b"\xe0\x02\x81\x00"


# ------------------------------------------------------------------ decoding

def test_publish_without_properties(session):
    assert session.feed(_publish("sites/a/devices/d1/sensors/1/temperature", b'{"t":1}', mid=42), 100) == 1
    assert session.rec.messages == [("sites/a/devices/d1/sensors/1/temperature", b'{"t":1}', 42, 1, None)]


def test_publish_with_properties_keeps_user_properties_in_order_and_skips_the_rest(session):
    props = _props(b"\x01\x01", b"\x02" + struct.pack(">I", 60), b"\x03" + _utf8("application/json"),
                   b"\x26" + _utf8("firmware") + _utf8("1.4.2"), b"\x08" + _utf8("reply/to"),
                   b"\x09" + _utf8(b"\x00\x01"), b"\x0b\x80\x01", b"\x26" + _utf8("k") + _utf8("v"))
    session.feed(_publish("a/b", b"payload", mid=3, props=props), 100)
    assert session.rec.messages == [("a/b", b"payload", 3, 1, [("firmware", "1.4.2"), ("k", "v")])]


def test_qos0_publish_has_no_packet_id(session):
    session.feed(_publish("a/b", b"x", qos=0), 100)
    assert session.rec.messages == [("a/b", b"x", 0, 0, None)]


def test_non_utf8_topic_is_delivered_with_replacement_characters_for_dead_letter(session):
    session.feed(_publish(b"sites/\xff/x", b"{}", mid=9), 100)
    topic = session.rec.messages[0][0]
    assert topic == "sites/\ufffd/x"


def test_packets_split_across_reads_are_reassembled_in_order(session):
    stream = b"".join(_publish(f"t/{i}", b"v" * (i * 50), mid=i + 1) for i in range(20))
    for i in range(0, len(stream), 7):
        session.feed(stream[i:i + 7], 1000)
    assert [msg[2] for msg in session.rec.messages] == list(range(1, 21))
    assert [len(msg[1]) for msg in session.rec.messages] == [i * 50 for i in range(20)]
    assert session._buf == b""


def test_at_most_max_publish_are_handed_over_the_rest_wait_in_order(session):
    session.feed(b"".join(_publish("t", b"x", mid=i) for i in range(1, 6)), 2)
    assert [msg[2] for msg in session.rec.messages] == [1, 2]
    assert session.has_backlog()
    session.feed(b"", 10)
    assert [msg[2] for msg in session.rec.messages] == [1, 2, 3, 4, 5]
    assert not session.has_backlog()


def test_publish_larger_than_one_receive_is_read_whole_through_the_socket(session):
    payload = bytes(range(256)) * 4000                  # ~1 MB: several recv calls, 3-byte length
    sender = threading.Thread(target=session.broker.sendall,
                              args=(_publish("big", payload, mid=7) + _publish("small", b"s", mid=8),))
    sender.start()
    deadline = time.monotonic() + 10
    while len(session.rec.messages) < 2 and time.monotonic() < deadline:
        select.select([session.sock], [], [], 0.1)
        session.read(10)
    sender.join()
    assert [(msg[0], msg[1] == payload or msg[1]) for msg in session.rec.messages] == [("big", True),
                                                                                       ("small", b"s")]


def test_large_publish_with_multi_byte_length(session):
    payload = b"p" * 20000                 # remaining length needs 3 bytes
    packet = _publish("t", payload, mid=1)
    session.feed(packet[:3], 10)
    session.feed(packet[3:], 10)
    assert session.rec.messages[0][1] == payload


@pytest.mark.parametrize(("packet", "why"), [
    (b"\x32\xff\xff\xff\xff\x01", "longer than 4 bytes"),
    (_publish("t", b"x", first=0x36), "QoS 3"),
    (_publish("t", b"x", mid=0), "identifier 0"),
    (_publish("", b"x"), "without topic"),
    (_publish("t", b"x", props=_props(b"\x23\x00\x01")), "topic alias"),
    (_publish("t", b"x", props=_props(b"\x7f\x00")), "unknown property"),
    (_publish("t", b"x", props=b"\x09\x26\x00\x01k"), "runs past"),
    (b"\x32\x01\x00", "runs past"),
    (b"\x90\x00", "SUBACK shorter"),
    (b"\xb0\x02\x00\x01", "UNSUBACK shorter"),
    (b"\x90\x04\x00\x01\x05\x01", "runs past"),         # SUBACK properties longer than the packet
    (b"\x10\x00", "unexpected packet type 1"),
    (b"\xd1\x00", "reserved flags"),
])
def test_malformed_packet_closes_the_connection_without_delivering_it(session, packet, why, caplog):
    session.ack(1)
    session.feed(_publish("ok", b"1", mid=1) + packet + _publish("after", b"2", mid=2), 10)
    assert [msg[0] for msg in session.rec.messages] == ["ok"]
    assert session.sock is None and len(session.rec.closed) == 1
    assert session.rec.closed[0].startswith("malformed packet from the broker: ")
    assert why in session.rec.closed[0]
    assert "malformed MQTT packet from the broker" in caplog.text
    assert session.broker.recv(100) == b"\xe0\x02\x81\x00"    # DISCONNECT Malformed Packet, and no PUBACK


def test_publish_runs_past_its_declared_length_is_malformed_not_misread(session):
    # remaining length 4 but the topic claims 10 bytes: must not read into the next packet
    session.feed(b"\x32\x04\x00\x0aab" + _publish("next", b"x", mid=2), 10)
    assert session.rec.messages == [] and session.sock is None


# ------------------------------------------------------------------ control flow on a socket

def test_acks_of_a_turn_go_out_in_one_write(session):
    for mid in (1, 2, 300):
        session.ack(mid)
    session.write()
    assert session.broker.recv(100) == b"\x40\x02\x00\x01\x40\x02\x00\x02\x40\x02\x01\x2c"


def test_connack_suback_puback_pingresp_and_server_disconnect(session):
    connects, subacks, pubacks = [], [], []
    session.connected = False
    session.on_connect = lambda present, code, props: connects.append((present, code, props))
    session.on_suback = lambda mid, codes: subacks.append((mid, codes))
    session.on_puback = lambda mid, code: pubacks.append((mid, code))
    connack_props = _props(b"\x21" + struct.pack(">H", 20), b"\x27" + struct.pack(">I", 100000),
                           b"\x22\x00\x0a", b"\x2a\x01")
    session.feed(bytes((0x20, 2 + len(connack_props), 1, 0)) + connack_props, 10)
    assert connects == [(True, 0, {0x21: 20, 0x27: 100000, 0x22: 10, 0x2A: 1})]
    assert session.connected and session.server_receive_maximum == 20 and session.server_max_packet == 100000
    mid = session.publish("sites/a/devices/d/commands", b"{}")
    session.write()
    assert session.broker.recv(100) == m.encode_publish("sites/a/devices/d/commands", b"{}", 1, mid)
    session.feed(b"\x90\x04\x00\x01\x00\x01" + b"\x40\x02" + struct.pack(">H", mid) + b"\xd0\x00", 10)
    assert subacks == [(1, [1])] and pubacks == [(mid, 0)]
    reason = b"\x8b" + _props(b"\x1f" + _utf8("bye"))
    session.feed(bytes((0xE0, len(reason))) + reason, 10)
    assert session.sock is None and "Server shutting down (bye)" in session.rec.closed[0]


def test_unsubscribe_and_its_unsuback(session):
    unsubacks = []
    session.on_unsuback = lambda mid, codes: unsubacks.append((mid, codes))
    mid = session.unsubscribe(["$share/bridge/a/#", "b"])
    assert session.broker.recv(100) == m.encode_unsubscribe(mid, ["$share/bridge/a/#", "b"])
    assert m.encode_unsubscribe(7, ["a"]) == b"\xa2\x06\x00\x07\x00\x00\x01a"
    session.feed(b"\xb0\x05" + struct.pack(">H", mid) + b"\x00\x00\x11", 10)
    assert unsubacks == [(mid, [0x00, 0x11])]


@pytest.mark.parametrize("first", [0x90, 0xB0])
def test_suback_and_unsuback_skip_their_properties_and_report_every_reason_code(session, first):
    acks = []
    session.on_suback = lambda mid, codes: acks.append(("SUBACK", mid, codes))
    session.on_unsuback = lambda mid, codes: acks.append(("UNSUBACK", mid, codes))
    body = struct.pack(">H", 513) + _props(b"\x1f" + _utf8("why"), b"\x26" + _utf8("k") + _utf8("v")) + b"\x01\x80"
    session.feed(bytes((first, len(body))) + body, 10)
    assert acks == [("SUBACK" if first == 0x90 else "UNSUBACK", 513, [0x01, 0x80])] and session.sock is not None


def test_refused_connack_reports_and_closes(session):
    codes = []
    session.connected = False
    session.on_connect = lambda present, code, props: codes.append(code)
    session.feed(b"\x20\x03\x00\x86\x00", 10)
    assert codes == [0x86] and session.sock is None and "Bad User Name or Password" in session.rec.closed[0]


def test_unacked_publishes_are_resent_with_dup_on_the_next_connection(session):
    mid = session.publish("c/1", b"a")
    session.write()
    session.broker.recv(100)
    session.close("test")
    ours, broker = socket.socketpair()
    session.sock, session.connected = ours, False
    session.feed(b"\x20\x03\x01\x00\x00", 10)          # CONNACK, session present
    session.write()
    assert broker.recv(100) == m.encode_publish("c/1", b"a", 1, mid, dup=True)
    ours.close()
    broker.close()


def test_unacked_publishes_go_again_as_new_messages_when_the_broker_lost_the_session(session):
    mid = session.publish("c/1", b"a")
    session.write()
    session.broker.recv(100)
    session.close("test")
    ours, broker = socket.socketpair()
    session.sock, session.connected = ours, False
    session.feed(b"\x20\x03\x00\x00\x00", 10)          # CONNACK, no session: not a retransmission
    session.write()
    assert broker.recv(100) == m.encode_publish("c/1", b"a", 1, mid, dup=False)
    ours.close()
    broker.close()


def test_keepalive_sends_pingreq_when_idle_and_closes_when_nothing_answers(session, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(session_module.time, "monotonic", lambda: now[0])
    session._last_in = session._last_out = 1000.0
    now[0] += 31
    session.misc()
    assert session.broker.recv(10) == b"\xc0\x00"
    now[0] += 31
    session.misc()
    assert session.sock is None and "keep alive timeout" in session.rec.closed[0]
