"""Benchmark: device management at scale. One site's Mosquitto (the image, the site's rendered configuration,
the iot_gate plugin), its mosquitto-agent and a Kafka with the device-credentials topic, then:

    python -m tooling.bench.devices [--devices 10000]

1. Mosquitto's memory with no device (the baseline), then `iot-devices import` of --devices devices from a
   CSV: how long the command takes, and how long until the last device logs in over TLS.
2. Mosquitto's memory with them all (container cgroup and the broker's RSS).
3. `iot-devices add` of one more device: time from the command's start until its first login succeeds.
4. `iot-devices rotate` of a connected device: time until its session is kicked, and until the new
   password logs in (the old one is then checked refused).
5. Mosquitto restarted with the whole table on its volume: time until a device logs in again (after the
   bridge's first SUBSCRIBE opens the gate, as the bridge does after every start).
No Mosquitto restart happens in 1-4: the figures include the agent's sync (Kafka -> the plugin). All on this
machine (a fresh lab network, removed at the end); indicative figures (docs/development.md, "Benchmarks").
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from services.common import names
from tooling.build.progress import log
from tooling.testbed.docker_lab import Lab, docker, wait_until
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster
from tooling.testbed.mosquitto import open_device_gate, start_site_mosquitto
from tooling.testbed.mosquitto_agent import AgentProcess

REPO = Path(__file__).resolve().parents[2]
SITE = "site-a"
BRIDGE_PASSWORD, AGENT_PASSWORD = "bench-bridge-password", "bench-agent-password"
NOT_AUTHORIZED = 0x87


def iot_devices(bootstrap: str, *args: str, stdin: str | None = None) -> list[dict]:
    """iot-devices as an operator runs it; its JSON lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "DEVICES_"))}
    result = subprocess.run([sys.executable, "-m", "services.commands.devices", "--bootstrap", bootstrap,
                             "--site", SITE, *args], input=stdin, capture_output=True, text=True, cwd=REPO,
                            env={**env, "PYTHONPATH": str(REPO)}, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"iot-devices {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return [json.loads(line) for line in result.stdout.splitlines()]


class Session:
    """One device connection over TLS (MQTT v5, client id = device id)."""

    def __init__(self, broker: dict, device: str, password: str):
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
        self.connack: int | None = None
        self.closed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device, protocol=MQTTProtocolVersion.MQTTv5)
        self.client.username_pw_set(device, password)
        self.client.tls_set(ca_certs=str(broker["ca"]))
        self.client.reconnect_delay_set(60, 60)
        self.client.on_connect = lambda _c, _u, _f, rc, _p: setattr(self, "connack", rc.value)
        self.client.on_disconnect = lambda *_: self.closed.set()
        self.client.connect("127.0.0.1", broker["tls"], keepalive=30)
        self.client.loop_start()
        deadline = time.monotonic() + 10
        while self.connack is None and not self.closed.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def login(broker: dict, device: str, password: str) -> int | None:
    """The CONNACK's reason code (0: in); None when the connection closed without one."""
    try:
        session = Session(broker, device, password)
    except OSError:
        return None
    try:
        return session.connack
    finally:
        session.close()


def until_login(broker: dict, device: str, password: str, expected: int = 0, timeout: float = 600) -> float:
    started = time.monotonic()
    wait_until(f"{device} login answered {expected}", lambda: login(broker, device, password) == expected,
               timeout=timeout, interval=0.05)
    return time.monotonic() - started


def memory(lab: Lab) -> dict[str, float]:
    """MiB: the container's cgroup memory, the mosquitto process' RSS."""
    out = lab.exec("mosquitto", "sh", "-c",
                   "cat /sys/fs/cgroup/memory.current 2>/dev/null || cat /sys/fs/cgroup/memory/memory.usage_in_bytes;"
                   " for p in /proc/[0-9]*; do [ \"$(cat $p/comm)\" = mosquitto ] && "
                   "awk '/VmRSS/ {print $2 * 1024}' $p/status; done").stdout.split()
    return {"cgroup_mib": int(out[0]) / 2**20, "rss_mib": int(out[1]) / 2**20}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench devices", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=10_000, help="devices to import (default 10000)")
    args = parser.parse_args(argv)
    if args.devices < 2:
        parser.error("--devices must be 2 or more")
    lab = Lab()
    agent = None
    figures: dict[str, str] = {}
    try:
        work = Path(tempfile.mkdtemp(prefix="bench-devices-"))
        log("bench", "starting mosquitto, kafka and mosquitto-agent")
        broker = start_site_mosquitto(lab, work / "mosquitto", {}, SITE, BRIDGE_PASSWORD, AGENT_PASSWORD)
        cluster = start_kafka_cluster(lab)
        create_topics(cluster, names.DEVICE_CREDENTIALS, partitions=3, config={"cleanup.policy": "compact"})
        (work / "agent").mkdir()
        agent = AgentProcess(work / "agent", broker, cluster.external, AGENT_PASSWORD)
        agent.start()
        before = memory(lab)

        ids = [f"{SITE}-bench-{i:05d}" for i in range(args.devices)]
        log("bench", f"importing {args.devices} devices")
        started = time.monotonic()
        credentials = iot_devices(cluster.external, "import", "-", stdin="device_id\n" + "\n".join(ids) + "\n")
        cli_s = time.monotonic() - started
        log("bench", f"iot-devices import took {cli_s:.1f}s; waiting for the last device's login")
        until_login(broker, credentials[-1]["device"], credentials[-1]["password"])
        import_s = time.monotonic() - started
        wait_until("the plugin counting every device", lambda: agent.metrics().get("mosquitto_devices", 0)
                   >= args.devices, timeout=120, interval=1)
        after = memory(lab)

        log("bench", "adding one device")
        started = time.monotonic()
        [added] = iot_devices(cluster.external, "add", f"{SITE}-bench-added")
        add_cli_s = time.monotonic() - started
        until_login(broker, added["device"], added["password"], timeout=60)
        add_s = time.monotonic() - started

        log("bench", "rotating a connected device")
        victim = credentials[len(credentials) // 2]
        session = Session(broker, victim["device"], victim["password"])
        assert session.connack == 0, f"{victim['device']} could not log in: {session.connack}"
        started = time.monotonic()
        [rotated] = iot_devices(cluster.external, "rotate", victim["device"])
        rotate_cli_s = time.monotonic() - started
        kicked = session.closed.wait(60)
        kicked_s = time.monotonic() - started
        session.close()
        until_login(broker, victim["device"], rotated["password"], timeout=60)
        rotate_s = time.monotonic() - started
        old_refused = login(broker, victim["device"], victim["password"]) == NOT_AUTHORIZED

        log("bench", "restarting mosquitto with the whole table on its volume")
        started = time.monotonic()
        docker("restart", f"{lab.network}-mosquitto")
        wait_until("the gate opened by a bridge SUBSCRIBE", lambda: _try_gate(broker), timeout=120, interval=0.2)
        until_login(broker, ids[-2], credentials[-2]["password"], timeout=60)
        restart_s = time.monotonic() - started

        figures = {
            "devices": f"{args.devices}",
            "import: iot-devices command": f"{cli_s:.1f} s",
            "import: command start -> last device logs in": f"{import_s:.1f} s",
            "add one: command": f"{add_cli_s:.2f} s",
            "add one: command start -> it logs in": f"{add_s:.2f} s",
            "rotate one: command": f"{rotate_cli_s:.2f} s",
            "rotate one: command start -> old session kicked": f"{kicked_s:.2f} s" if kicked else "not kicked",
            "rotate one: command start -> new password logs in": f"{rotate_s:.2f} s",
            "rotate one: old password refused after": "yes" if old_refused else "NO",
            "mosquitto restart -> a device logs in (gate opened at once)": f"{restart_s:.1f} s",
        }
        print("\ndevice management (figures of one run):")
        width = max(map(len, figures))
        for name, value in figures.items():
            print(f"  {name.ljust(width)}  {value}")
        print(f"\nMosquitto's memory     {'0 devices':>12}  {f'{args.devices} devices':>14}  per 1,000 devices")
        # Not Mosquitto's own heap figure: it leaves out the plugin's table (allocated by the plugin itself).
        for key, label in (("cgroup_mib", "container (cgroup)"), ("rss_mib", "mosquitto RSS")):
            per = (after[key] - before[key]) / args.devices * 1000
            print(f"  {label:<20} {before[key]:>9.1f} MiB  {after[key]:>11.1f} MiB  {per:>8.2f} MiB")
        return 0 if kicked and old_refused else 1
    finally:
        if agent is not None:
            agent.stop()
        lab.close()


def _try_gate(broker: dict) -> bool:
    try:
        open_device_gate(broker["services"], BRIDGE_PASSWORD, broker["ca"])
        return True
    except (AssertionError, OSError):
        return False


if __name__ == "__main__":
    sys.exit(main())
