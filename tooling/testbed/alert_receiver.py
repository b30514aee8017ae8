"""A local webhook receiver for Alertmanager's notifications: what a person's pager would get.

Listens on one address (a test network's gateway, so containers reach it) in a thread of the test
process and keeps every notification (Alertmanager's webhook JSON) in arrival order.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class AlertReceiver:
    def __init__(self, host: str, port: int):
        self.notifications: list[dict] = []
        self.arrived: list[float] = []          # time.time() of each notification
        self._lock = threading.Lock()
        received, arrived, lock = self.notifications, self.arrived, self._lock

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    received.append(json.loads(body))
                    arrived.append(time.time())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):  # quiet: the tests print what they got on failure
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{port}/alerts"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def received(self) -> list[tuple[float, dict]]:
        """Every notification with its arrival time."""
        with self._lock:
            return list(zip(self.arrived, self.notifications, strict=True))

    def about(self, alertname: str, status: str | None = None) -> list[dict]:
        """The notifications that carry `alertname` (and, if given, have that status: firing, resolved)."""
        with self._lock:
            return [n for n in self.notifications
                    if any(a["labels"].get("alertname") == alertname for a in n.get("alerts", []))
                    and (status is None or n.get("status") == status)]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
