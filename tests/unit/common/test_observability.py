"""The services' HTTP endpoint (services/common/observability.py serve_http): a client that hangs up early."""
from __future__ import annotations

import socket
import struct
import threading

from services.common.observability import serve_http


def test_a_client_that_hangs_up_before_the_body_leaves_no_traceback(capfd):
    """The stack's healthcheck reads the status line and closes: the server's write of the rest then meets a
    reset, which socketserver printed as a traceback every 15 s in every Python service."""
    hung_up = threading.Event()
    answered = threading.Event()

    def health():
        hung_up.wait(5)           # answer only once the client is gone, so the write meets the reset
        answered.set()
        return True, "ok " * 50_000   # more than a socket buffer takes without the peer reading

    server = serve_http(0, health, lambda: (b"", "text/plain"), host="127.0.0.1")
    try:
        client = socket.create_connection(server.server_address[:2], timeout=5)
        client.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        # SO_LINGER 0: close() sends a reset, as a peer that closes with unread data does
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        hung_up.set()
        assert answered.wait(5)
        probe = socket.create_connection(server.server_address[:2], timeout=5)   # still serving
        probe.sendall(b"GET /nothing HTTP/1.0\r\n\r\n")
        assert probe.recv(64).startswith(b"HTTP/1.0 404")
        probe.close()
    finally:
        server.shutdown()
        server.server_close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err and "BrokenPipeError" not in err, err
