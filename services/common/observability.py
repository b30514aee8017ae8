"""Logging, metrics, health and shutdown plumbing shared by every service.

- `setup_logging(service)`: one key=value line per event on stdout.
- `serve_http(port, health, metrics)`: /metrics (whatever `metrics()` returns as
  (body, content type); each service passes its own Prometheus exposition) and
  /healthz (200 when `health()` returns (True, detail), else 503) on a daemon thread. A client that hangs
  up before the answer is written (the container healthcheck reads only the status line) is not an error.
  With `tls` (metrics_tls(keystore, client CA)) a client must speak TLS and show a certificate of that CA
  (the site's Prometheus: the scrapers CA); only the container's own healthcheck may ask /healthz in clear,
  from loopback (tests/integration/test_metrics_tls.py).
- `StopFlag`: set by SIGTERM/SIGINT; services drain and exit when it is set.
"""
from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _KeyValueFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        fields = {"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname.lower(),
                  "service": self.service, "msg": record.getMessage()}
        fields.update(getattr(record, "kv", {}))
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info).replace("\n", " | ")
        return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


def _quote(value: object) -> str:
    text = str(value)
    return f'"{text}"' if (" " in text or "=" in text or not text) else text


def setup_logging(service: str, level: str = "INFO") -> logging.Logger:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_KeyValueFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    return logging.getLogger(service)


def kv(**fields: object) -> dict:
    """Extra key=value fields for a log call: `log.info("produced", extra=kv(n=3))`."""
    return {"kv": fields}


HealthProbe = Callable[[], tuple[bool, str]]
# Returns the /metrics body and its Content-Type, e.g. prometheus_client's
# `generate_latest(REGISTRY), CONTENT_TYPE_LATEST` (this module stays stdlib-only).
MetricsExposition = Callable[[], tuple[bytes, str]]


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        # The stack's healthcheck (bash over /dev/tcp) closes once it has the status line, so writing the body
        # can meet a reset: socketserver would print a traceback for each, every 15 s in every Python service.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


_TLS_HANDSHAKE = b"\x16"  # the first byte of a TLS record carrying a ClientHello
_FIRST_BYTE_S = 10.0  # how long a connection may stay silent before its first byte


def metrics_tls(keystore: str, client_ca: str) -> ssl.SSLContext | None:
    """The TLS context of a /metrics endpoint, None without a keystore: its own key and certificate (one PEM
    file with the key, the certificate and its CA, as the pki role's keystores are), and the CA whose
    certificates may scrape. A file that is not what it should be raises ValueError naming it."""
    if not keystore:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    for what, path, load in (("keystore (key and certificate, PEM)", keystore, context.load_cert_chain),
                             ("client CA (PEM)", client_ca, context.load_verify_locations)):
        try:
            load(path)
        except (OSError, ssl.SSLError) as err:
            raise ValueError(f"the metrics {what} {path} cannot be used: {err}") from err
    return context


class _TLSServer(_Server):
    """TLS for every client but the container's own healthcheck: a connection whose first byte is not a TLS
    handshake is served in clear only from loopback, and then only /healthz (Handler.plain)."""

    def __init__(self, address: tuple[str, int], handler: type, tls: ssl.SSLContext):
        self.tls = tls
        super().__init__(address, handler)

    def finish_request(self, request, client_address) -> None:  # in the request's own thread
        request.settimeout(_FIRST_BYTE_S)
        try:
            first = request.recv(1, socket.MSG_PEEK)
            if first == _TLS_HANDSHAKE:
                request = self.tls.wrap_socket(request, server_side=True)
            elif not first or not ipaddress.ip_address(client_address[0]).is_loopback:
                return  # silent, or clear text from the network: hang up (shutdown_request closes it)
        except (OSError, ValueError):  # a failed handshake (no certificate, another CA) or a reset
            return
        handler = self.RequestHandlerClass
        handler(request, client_address, self, plain=not isinstance(request, ssl.SSLSocket))
        if isinstance(request, ssl.SSLSocket):
            request.close()


def serve_http(port: int, health: HealthProbe, metrics: MetricsExposition,
               host: str = "0.0.0.0", tls: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def __init__(self, *args, plain: bool = True, **kwargs) -> None:
            self.plain = plain and tls is not None  # clear text where TLS is required: /healthz only
            super().__init__(*args, **kwargs)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.plain and not self.path.startswith("/healthz"):
                body, status, ctype = b"over TLS only, with a certificate of the scrapers CA\n", 403, "text/plain"
            elif self.path.startswith("/metrics"):
                (body, ctype), status = metrics(), 200
            elif self.path.startswith("/healthz"):
                ok, detail = health()
                body, status, ctype = detail.encode() + b"\n", 200 if ok else 503, "text/plain"
            else:
                body, status, ctype = b"not found: try /metrics or /healthz\n", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args) -> None:  # scrapes would flood the log
            pass

    server = _TLSServer((host, port), Handler, tls) if tls else _Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


class StopFlag:
    """Set on SIGTERM or SIGINT so the main loop can drain, flush and exit."""

    def __init__(self) -> None:
        self._event = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        logging.getLogger(__name__).info("stopping", extra=kv(signal=signal.Signals(signum).name))
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)
