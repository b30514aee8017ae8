"""mosquitto-agent as a child process of this checkout (python -m services.mosquitto_agent.app), against a
testbed Mosquitto's services listener and a test Kafka's EXTERNAL listener, as the stack runs it on the
overlay; its log in a file."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tooling.testbed.docker_lab import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]


class AgentProcess:
    def __init__(self, work: Path, broker: dict, bootstrap: str, password: str, stats_s: float = 10,
                 memory_limit: int = 0, max_queued_messages: int = 300000):
        self.work, self.port = work, free_port()
        (work / "mqtt_password").write_text(password + "\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "MOSQUITTO_AGENT_"))}
        self.env.update({
            "PYTHONPATH": str(REPO), "MQTT_PASSWORD_FILE": str(work / "mqtt_password"),
            "MOSQUITTO_AGENT_MQTT_HOST": "127.0.0.1", "MOSQUITTO_AGENT_MQTT_PORT": str(broker["services"]),
            "MOSQUITTO_AGENT_MQTT_CA_FILE": str(broker["ca"]),      # MQTT over TLS, as at a site
            "MOSQUITTO_AGENT_KAFKA_BOOTSTRAP": bootstrap, "MOSQUITTO_AGENT_METRICS_PORT": str(self.port),
            "MOSQUITTO_AGENT_STATS_INTERVAL_S": str(stats_s), "MOSQUITTO_AGENT_MEMORY_LIMIT": str(memory_limit),
            "MOSQUITTO_AGENT_MAX_QUEUED_MESSAGES": str(max_queued_messages)})
        self.log = work / "agent.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "services.mosquitto_agent.app"], cwd=REPO,
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT)
        wait_until("mosquitto-agent healthy", lambda: self.health()[0] == 200, timeout=90, interval=0.5,
                   on_timeout=self.tail)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def health(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=3) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            lines = resp.read().decode().splitlines()
        return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in lines
                                                       if line and not line.startswith("#"))}

    def tail(self) -> str:
        return self.log.read_text()[-6000:] if self.log.exists() else "(no agent log)"
