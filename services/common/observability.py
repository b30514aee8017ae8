"""Logging, metrics, health and shutdown plumbing shared by every service.

- `setup_logging(service)`: one key=value line per event on stdout.
- `serve_http(port, health, metrics)`: /metrics (whatever `metrics()` returns as
  (body, content type); each service passes its own Prometheus exposition) and
  /healthz (200 when `health()` returns (True, detail), else 503) on a daemon thread. A client that hangs
  up before the answer is written (the container healthcheck reads only the status line) is not an error.
- `StopFlag`: set by SIGTERM/SIGINT; services drain and exit when it is set.
"""
from __future__ import annotations

import logging
import signal
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


def serve_http(port: int, health: HealthProbe, metrics: MetricsExposition,
               host: str = "0.0.0.0") -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.startswith("/metrics"):
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

    server = _Server((host, port), Handler)
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
