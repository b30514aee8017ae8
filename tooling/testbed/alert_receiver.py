"""A local webhook receiver for Alertmanager's notifications: what a person's pager would get.

AlertReceiver listens on one address (a test network's gateway, so containers reach it) in a thread of the
test process and keeps every notification (Alertmanager's webhook JSON) in arrival order. Run as a program
(`python alert_receiver.py --host H --port P --log FILE`, standard library only) it is the lab's receiver for
the lab's whole life, appending each notification to FILE as a JSON line; AlertLog reads that file.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


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


class AlertLog:
    """The notifications the lab's receiver program wrote to its log, those that arrived at or after `since`
    (epoch seconds): the same reading methods as AlertReceiver."""

    def __init__(self, path: Path, since: float = 0.0):
        self.path, self.since = Path(path), since

    def received(self) -> list[tuple[float, dict]]:
        found = []
        text = self.path.read_text() if self.path.exists() else ""
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue            # a line being written
            if entry["at"] >= self.since:
                found.append((entry["at"], entry["notification"]))
        return found

    @property
    def notifications(self) -> list[dict]:
        return [note for _, note in self.received()]

    def about(self, alertname: str, status: str | None = None) -> list[dict]:
        return [n for n in self.notifications
                if any(a["labels"].get("alertname") == alertname for a in n.get("alerts", []))
                and (status is None or n.get("status") == status)]

    def close(self) -> None:
        """Nothing to stop: the program runs on."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Append every notification POSTed to it to a JSON-lines log.")
    parser.add_argument("--host", required=True, help="address to listen on")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True, help="file each notification is appended to")
    args = parser.parse_args(argv)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                entry = json.dumps({"at": time.time(), "notification": json.loads(body)})
            except ValueError:
                self.send_response(400)
                self.end_headers()
                return
            with lock, args.log.open("a") as log:
                log.write(entry + "\n")
            self.send_response(200)
            self.end_headers()

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"alert receiver: listening on {args.host}:{args.port}, writing {args.log}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
