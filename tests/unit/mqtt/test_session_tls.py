"""The bridge's MQTT client over TLS (issue 30: Mosquitto's services listener takes TLS only), against a TLS
server on loopback that plays the broker's side of the packets: the handshake checks the chain and the name,
and a burst much larger than one TLS record (16 KiB) is read whole through the bridge's own loop, although
select does not wake for bytes TLS has already taken off the socket (MqttSession.has_backlog)."""
from __future__ import annotations

import ipaddress
import select
import socket
import ssl
import struct
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID

from services.mqtt import codec as m
from services.mqtt import session as session_module
from services.mqtt.session import MqttSession, tls_context
from tooling.testbed import certs

BURST = 3000                     # PUBLISHes of ~200 bytes: ~600 KiB, dozens of TLS records


def _files(tmp_path, name: str, sans) -> tuple[str, str, str]:
    """(CA file, certificate chain file, key file) of a server certificate for `sans`."""
    ca = certs.ca(f"test CA {name}")
    key, cert = certs.issue(ca, name, ExtendedKeyUsageOID.SERVER_AUTH, sans)
    files = {"ca.pem": ca[1].public_bytes(Encoding.PEM), "cert.pem": cert.public_bytes(Encoding.PEM),
             "key.pem": certs.key_pem(key)}
    for file, content in files.items():
        (tmp_path / f"{name}-{file}").write_bytes(content)
    return tuple(str(tmp_path / f"{name}-{file}") for file in files)         # type: ignore[return-value]


def _publish(mid: int, payload: bytes) -> bytes:
    topic = b"sites/a/devices/d/sensors/s/readings"
    body = struct.pack(">H", len(topic)) + topic + struct.pack(">H", mid) + b"\x00" + payload
    return bytes((0x32,)) + m.encode_varint(len(body)) + body


def _exactly(conn, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise AssertionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


class _Broker(threading.Thread):
    """Accepts one TLS connection, reads CONNECT, answers CONNACK and a burst of QoS 1 PUBLISHes, then
    counts the PUBACKs that come back."""

    def __init__(self, cert: str, key: str):
        super().__init__(daemon=True)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.context, self.pubacks, self.error = context, [], None

    def run(self) -> None:
        try:
            raw, _ = self.listener.accept()
            with self.context.wrap_socket(raw, server_side=True) as conn:
                conn.settimeout(20)
                first, length = _exactly(conn, 2)             # CONNECT, under 128 bytes: one length byte
                if first >> 4 != 1 or length > 127:
                    raise AssertionError("no short CONNECT first")
                _exactly(conn, length)
                conn.sendall(bytes((0x20, 3, 0, 0, 0)))                               # CONNACK, success
                conn.sendall(b"".join(_publish(mid, b"x" * 150) for mid in range(1, BURST + 1)))
                acks = _exactly(conn, 4 * BURST)              # PUBACK: 0x40 0x02 <packet id>
                self.pubacks = [struct.unpack(">BBH", acks[i:i + 4]) for i in range(0, len(acks), 4)]
        except Exception as err:        # noqa: BLE001 - the test reports it
            self.error = err
        finally:
            self.listener.close()


def _session(port: int, ca: str, host: str = "127.0.0.1") -> MqttSession:
    return MqttSession(host, port, "bridge-1", keepalive=30, tls=tls_context(ca), receive_maximum=65535)


@pytest.mark.parametrize("recv_bytes", [session_module.RECV_BYTES, 1000], ids=["as-deployed", "reads-inside-records"])
def test_a_burst_larger_than_many_tls_records_is_read_whole_through_the_bridges_loop(tmp_path, monkeypatch,
                                                                                     recv_bytes):
    """With reads smaller than a record, TLS keeps the record's rest after each read: only has_backlog's
    look at it keeps the loop from waiting on a socket that has nothing more to say."""
    monkeypatch.setattr(session_module, "RECV_BYTES", recv_bytes)
    ca, cert, key = _files(tmp_path, "mosquitto", (x509.IPAddress(ipaddress.ip_address("127.0.0.1")),))
    broker = _Broker(cert, key)
    broker.start()
    client = _session(broker.port, ca)
    delivered: list[int] = []
    client.on_message = lambda _topic, _payload, mid, _qos, _user: (delivered.append(mid), client.ack(mid))
    client.connect()
    assert isinstance(client.sock, ssl.SSLSocket) and client.sock.version() in ("TLSv1.2", "TLSv1.3")
    for _ in range(200_000):                               # the bridge's _io: buffered work first, then select
        if len(delivered) == BURST and not client.want_write():
            break
        if client.has_backlog():
            client.read(1000)
        else:
            readable, _, _ = select.select([client.sock], [client.sock] if client.want_write() else [], [], 0.5)
            if readable:
                client.read(1000)
        if client.want_write():
            client.write()
    broker.join(20)
    assert broker.error is None, broker.error
    assert delivered == list(range(1, BURST + 1))           # all of them, in order, none twice
    assert broker.pubacks == [(0x40, 2, mid) for mid in range(1, BURST + 1)]
    client.close("done")


@pytest.mark.parametrize("case", ["another CA", "another name"])
def test_a_server_the_ca_did_not_certify_for_that_name_gets_no_login(tmp_path, case):
    """The handshake fails before CONNECT (the password) is sent: an OSError, which the bridge retries."""
    ca, _cert, _key = _files(tmp_path, "mosquitto", (x509.DNSName("mosquitto"),))
    other_ca, cert, key = _files(tmp_path, "impostor", (x509.IPAddress(ipaddress.ip_address("127.0.0.1")),)
                                 if case == "another CA" else (x509.DNSName("prometheus"),))
    broker = _Broker(cert, key)
    broker.start()
    client = _session(broker.port, ca if case == "another CA" else other_ca)
    with pytest.raises(ssl.SSLCertVerificationError):
        client.connect()
    assert client.sock is None
    broker.join(5)


def test_in_clear_without_a_ca_file():
    assert tls_context("") is None
