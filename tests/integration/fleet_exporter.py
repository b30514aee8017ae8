"""A stand-in for one edge site's components in tests/integration/test_fleet.py: /metrics serves the
bridge's, a broker's and the adapter's names the fleet rules read, /node the node exporter's volume
figures. Counters grow with time at RATE readings/s. Runs on the services image's python3 (stdlib only)."""
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RATE = float(os.environ.get("RATE", "10"))
START = time.monotonic()


def metrics() -> str:
    t = time.monotonic() - START
    return "".join(f"{line}\n" for line in (
        f"bridge_messages_acked_total {RATE * t:.0f}",
        f'bridge_dead_lettered_total{{reason="invalid_json"}} {int(t // 10)}',
        f'bridge_dead_letters_dropped_total{{reason="too_large"}} {int(t // 15)}',
        f'kafka_server_brokertopicmetrics_messagesin_total{{topic="temperature-data"}} {RATE * t:.0f}',
        f'iot_adapter_consumed_total{{table="temperature_readings"}} {RATE * 0.9 * t:.0f}',
    ))


NODE = ('node_filesystem_avail_bytes{mountpoint="/node/volumes"} 40000000000\n'
        'node_filesystem_size_bytes{mountpoint="/node/volumes"} 100000000000\n')


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = (NODE if self.path == "/node" else metrics()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", 9102), Handler).serve_forever()
