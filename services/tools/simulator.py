"""Simulated devices publishing temperature readings over MQTT.

Every sensor of the fleet (see services/tools/fleet.py for ids and the temperature
formula) publishes to sites/<site>/sensors/<sensor_id>/temperature; the
aggregate rate is spread over the sensors round-robin. Prints sent and acked
counts and the achieved rate every few seconds and at the end.

Example: iot-simulator --host 127.0.0.1 --username sim --password-file pw \\
           --site site-a --devices 10 --sensors-per-device 2 --rate 1000 --duration 60
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from services.common import settings
from services.common.observability import StopFlag
from services.tools import fleet


@dataclass
class Counters:
    sent: int = 0
    acked: int = 0
    failed: int = 0
    elapsed: float = 0.0

    def __post_init__(self) -> None:
        self.lock = threading.Lock()

    def ack(self) -> None:
        with self.lock:
            self.acked += 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="iot-simulator", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    conn = p.add_argument_group("MQTT connection")
    conn.add_argument("--host", default="127.0.0.1", help="broker host (default 127.0.0.1)")
    conn.add_argument("--port", type=int, default=1883, help="broker port (default 1883)")
    conn.add_argument("--username", default=None, help="MQTT user name")
    conn.add_argument("--password-file", default=None,
                      help="file holding the MQTT password (default: secret mqtt_password, i.e. "
                           "$MQTT_PASSWORD_FILE or /run/secrets/mqtt_password)")
    conn.add_argument("--connections", type=int, default=2,
                      help="MQTT connections to spread the load over (default 2)")
    conn.add_argument("--client-prefix", default="simulator", help="client id prefix (default simulator)")
    fl = p.add_argument_group("fleet")
    fl.add_argument("--site", required=True, help="site alias, e.g. site-a (part of topic and ids)")
    fl.add_argument("--devices", type=int, default=5, help="devices (default 5)")
    fl.add_argument("--sensors-per-device", type=int, default=2, help="sensors per device (default 2)")
    fl.add_argument("--hot-sensors", type=int, default=0,
                    help="sensors whose target is raised by --hot-offset so they exceed thresholds (default 0)")
    load = p.add_argument_group("load")
    load.add_argument("--rate", type=float, default=100.0, help="aggregate readings per second (default 100)")
    load.add_argument("--duration", type=float, default=None, help="seconds to run (default: until --count or ^C)")
    load.add_argument("--count", type=int, default=None, help="stop after this many readings")
    load.add_argument("--qos", type=int, choices=(0, 1), default=1, help="MQTT QoS (default 1)")
    model = p.add_argument_group("temperature model (thesis formula)")
    model.add_argument("--unit", choices=("C", "F", "K"), default="C", help="unit of the readings (default C)")
    model.add_argument("--base", type=float, default=20.0, help="start temperature, Celsius (default 20)")
    model.add_argument("--target", type=float, default=24.0, help="temperature approached, Celsius (default 24)")
    model.add_argument("--tau", type=float, default=60.0, help="approach time constant, s (default 60)")
    model.add_argument("--noise", type=float, default=0.3, help="Gaussian noise std dev (default 0.3)")
    model.add_argument("--spike-probability", type=float, default=0.001, help="chance of a spike (default 0.001)")
    model.add_argument("--spike-magnitude", type=float, default=15.0, help="spike size, Celsius (default 15)")
    model.add_argument("--hot-offset", type=float, default=60.0, help="target raise of hot sensors (default 60)")
    p.add_argument("--seed", type=int, default=None, help="random seed for reproducible runs")
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    args = p.parse_args(argv)
    if args.rate <= 0:
        p.error("--rate must be positive")
    if args.connections < 1:
        p.error("--connections must be at least 1")
    if args.duration is None:
        args.duration = float("inf")  # until --count, or ^C
    return args


def _password(args: argparse.Namespace) -> str | None:
    if args.password_file:
        with open(args.password_file) as fh:
            return fh.read().strip()
    return settings.secret("mqtt_password")


def _connect(args: argparse.Namespace, index: int, counters: Counters) -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{args.client_prefix}-{args.site}-{index}",
                         protocol=MQTTProtocolVersion.MQTTv5)
    if args.username:
        client.username_pw_set(args.username, _password(args))
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    # QoS 1: called on PUBACK; QoS 0: called once the message is written to the socket.
    client.on_publish = lambda *_a: counters.ack()
    connected = threading.Event()
    refused: list[str] = []

    def on_connect(_c, _u, _f, reason, _p):
        if reason.is_failure:
            refused.append(str(reason))
        connected.set()

    client.on_connect = on_connect
    client.connect(args.host, args.port, keepalive=30)
    client.loop_start()
    if not connected.wait(15):
        raise SystemExit(f"iot-simulator: no answer from MQTT broker {args.host}:{args.port} within 15 s")
    if refused:
        raise SystemExit(f"iot-simulator: broker refused the connection: {refused[0]} "
                         "(check --username / --password-file)")
    return client


def run(args: argparse.Namespace) -> Counters:
    profile = fleet.Profile(base=args.base, target=args.target, tau_s=args.tau, noise=args.noise,
                            spike_probability=args.spike_probability, spike_magnitude=args.spike_magnitude,
                            hot_offset=args.hot_offset, unit=args.unit)
    sensors = fleet.build_fleet(args.site, args.devices, args.sensors_per_device, args.hot_sensors)
    rng = random.Random(args.seed)
    counters = Counters()
    clients = [_connect(args, i, counters) for i in range(args.connections)]
    stop = StopFlag()
    started = time.monotonic()
    last_report = started
    try:
        while not stop.is_set():
            now = time.monotonic()
            elapsed = now - started
            if elapsed >= args.duration or (args.count is not None and counters.sent >= args.count):
                break
            due = int(elapsed * args.rate) + 1 - counters.sent
            if args.count is not None:
                due = min(due, args.count - counters.sent)
            if due <= 0:
                time.sleep(min(0.005, 1.0 / args.rate))
                continue
            now_ms = int(time.time() * 1000)
            for _ in range(due):
                sensor = sensors[counters.sent % len(sensors)]
                payload = json.dumps(fleet.reading(sensor, profile, elapsed, now_ms, rng))
                info = clients[counters.sent % len(clients)].publish(sensor.mqtt_topic, payload, qos=args.qos)
                if info.rc != mqtt.MQTT_ERR_SUCCESS:
                    counters.failed += 1
                counters.sent += 1
            if now - last_report >= 5:
                _report(counters, now - started)
                last_report = now
        deadline = time.monotonic() + 30
        while args.qos and counters.acked < counters.sent - counters.failed and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for client in clients:
            client.disconnect()
            client.loop_stop()
    counters.elapsed = time.monotonic() - started
    return counters


def _report(counters: Counters, elapsed: float) -> None:
    print(f"sent={counters.sent} acked={counters.acked} failed={counters.failed} "
          f"rate={counters.sent / max(elapsed, 1e-9):.0f}/s elapsed={elapsed:.1f}s", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counters = run(args)
    if args.json:
        print(json.dumps({"sent": counters.sent, "acked": counters.acked, "failed": counters.failed,
                          "elapsed_s": round(counters.elapsed, 3),
                          "rate": round(counters.sent / max(counters.elapsed, 1e-9), 1)}))
    else:
        _report(counters, counters.elapsed)
    return 0 if counters.failed == 0 and counters.acked == counters.sent else 1


if __name__ == "__main__":
    sys.exit(main())
