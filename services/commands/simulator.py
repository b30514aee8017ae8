"""Simulated devices publishing temperature readings over MQTT.

Every sensor of the fleet (see services/commands/fleet.py for ids and the temperature
formula) publishes to sites/<site>/devices/<device_id>/sensors/<sensor_id>/temperature; the
aggregate rate is spread over the sensors round-robin. Each device logs in as itself
(user name = device id, password from the credentials file, a JSON object
{"<device id>": "<password>"}) over TLS, checking the broker's certificate against
the CA file, as a real device does: Mosquitto's ACL lets it write only its own topics.
Given every mqtt_node's address (--host a,b), a device connects to the first that answers and
moves on to the next when it loses the broker (services/commands/broker_hosts.py).
Prints sent and acked counts and the achieved rate every few seconds and at the end.

Example: iot-simulator --host 10.20.0.11 --credentials-file site-a-devices.json --ca-file ca.crt \\
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
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from services.commands import broker_hosts, fleet
from services.common import settings
from services.common.observability import StopFlag
from services.common.settings import Option


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


# --<name> flags by help group; each also reads the variable shown (services/common/settings.py).
OPTION_GROUPS: dict[str, tuple[Option, ...]] = {
    "MQTT connection": (
        Option("host", "SIMULATOR_HOST", "127.0.0.1",
               "broker host, or every mqtt_node's address separated by commas, tried in turn "
               "(the certificate must name each)"),
        Option("port", "SIMULATOR_PORT", None, "broker port (default 8883, with --plaintext 1883)", int),
        Option("credentials_file", "SIMULATOR_CREDENTIALS_FILE", None,
               "JSON object of device id -> MQTT password, every device of the fleet "
               "(unset: the secret mqtt_credentials, /run/secrets/mqtt_credentials)"),
        Option("ca_file", "SIMULATOR_CA_FILE", None,
               "CA certificate the broker's certificate is checked against (unset: the secret mqtt_ca.pem)"),
        Option("plaintext", "SIMULATOR_PLAINTEXT", False, "plain MQTT, no TLS (a test broker only)", bool),
    ),
    "fleet": (
        Option("site", "SIMULATOR_SITE", None, "site alias, e.g. site-a (part of topic and ids)", required=True),
        Option("devices", "SIMULATOR_DEVICES", 5, "devices", int),
        Option("sensors_per_device", "SIMULATOR_SENSORS_PER_DEVICE", 2, "sensors per device", int),
        Option("hot_sensors", "SIMULATOR_HOT_SENSORS", 0,
               "sensors whose target is raised by --hot-offset so they exceed thresholds", int),
    ),
    "load": (
        Option("rate", "SIMULATOR_RATE", 100.0, "aggregate readings per second", float),
        Option("duration", "SIMULATOR_DURATION", None, "seconds to run (unset: until --count or ^C)", float),
        Option("count", "SIMULATOR_COUNT", None, "stop after this many readings", int),
        Option("qos", "SIMULATOR_QOS", 1, "MQTT QoS", int, choices=(0, 1)),
    ),
    "temperature model (thesis formula)": (
        Option("unit", "SIMULATOR_UNIT", "C", "unit of the readings", choices=("C", "F", "K")),
        Option("base", "SIMULATOR_BASE", 20.0, "start temperature, Celsius", float),
        Option("target", "SIMULATOR_TARGET", 24.0, "temperature approached, Celsius", float),
        Option("tau", "SIMULATOR_TAU", 60.0, "approach time constant, s", float),
        Option("noise", "SIMULATOR_NOISE", 0.3, "Gaussian noise std dev", float),
        Option("spike_probability", "SIMULATOR_SPIKE_PROBABILITY", 0.001, "chance of a spike", float),
        Option("spike_magnitude", "SIMULATOR_SPIKE_MAGNITUDE", 15.0, "spike size, Celsius", float),
        Option("hot_offset", "SIMULATOR_HOT_OFFSET", 60.0, "target raise of hot sensors", float),
    ),
    "": (Option("seed", "SIMULATOR_SEED", None, "random seed for reproducible runs", int),),
}
OPTIONS: tuple[Option, ...] = tuple(o for group in OPTION_GROUPS.values() for o in group)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="iot-simulator", description=__doc__, epilog=settings.epilog(OPTIONS),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for title, options in OPTION_GROUPS.items():
        settings.add_options(p.add_argument_group(title) if title else p, options)
    p.add_argument("--json", action="store_true", help="print the final summary as JSON")
    try:
        args = settings.parse_args(p, OPTIONS, argv)
        args.credentials = _credentials(args)
        args.ca_file = None if args.plaintext else _ca_file(args)
    except settings.SettingsError as err:   # a bad variable or secret file: a usage error too (exit 2)
        p.error(str(err))
    if args.port is None:
        args.port = 1883 if args.plaintext else 8883
    try:
        args.hosts = broker_hosts.parse_hosts(args.host)
    except ValueError as err:
        p.error(f"--host (SIMULATOR_HOST): {err}")
    if args.rate <= 0:
        p.error("--rate must be positive")
    missing = sorted({s.device_id for s in fleet.build_fleet(args.site, args.devices, 1)} - set(args.credentials))
    if missing:
        p.error(f"the credentials file has no password for devices {', '.join(missing[:5])}"
                f"{' ...' if len(missing) > 5 else ''} (add them, as in the site's stack_mqtt_devices)")
    if args.duration is None:
        args.duration = float("inf")  # until --count, or ^C
    return args


def _credentials(args: argparse.Namespace) -> dict[str, str]:
    """device id -> password from --credentials-file, else the secret mqtt_credentials."""
    source = args.credentials_file or str(settings.SECRETS_DIR / "mqtt_credentials")
    try:
        text = Path(source).read_text()
    except OSError as err:
        raise settings.SettingsError(f"--credentials-file (SIMULATOR_CREDENTIALS_FILE) {source}: cannot read it "
                                     f"({err.strerror}); give the devices' logins as a JSON object") from None
    try:
        credentials = json.loads(text)
    except ValueError as err:
        raise settings.SettingsError(f"credentials file {source} is not JSON ({err}); expected "
                                     '{"<device id>": "<password>", ...}') from None
    if not isinstance(credentials, dict) or not all(isinstance(v, str) and v for v in credentials.values()):
        raise settings.SettingsError(f"credentials file {source}: expected a JSON object of device id -> "
                                     "non-empty password string")
    return credentials


def _ca_file(args: argparse.Namespace) -> str:
    path = Path(args.ca_file or settings.SECRETS_DIR / "mqtt_ca.pem")
    if not path.is_file():
        raise settings.SettingsError(f"--ca-file (SIMULATOR_CA_FILE) {path} is missing: give the deployment's CA "
                                     "certificate (the pki role's ca.crt), or --plaintext for a plain listener")
    return str(path)


def _connect(args: argparse.Namespace, device_id: str, counters: Counters) -> mqtt.Client:
    """One device's connection, logged in as itself, its device id as client id (a site's Mosquitto refuses
    another)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device_id,
                         protocol=MQTTProtocolVersion.MQTTv5)
    client.username_pw_set(device_id, args.credentials[device_id])
    if args.ca_file:
        client.tls_set(ca_certs=args.ca_file)     # verifies the chain and that the certificate names the host
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
    try:
        host = broker_hosts.connect_first(client, args.hosts, args.port, keepalive=30)
    except OSError as err:     # ssl.SSLError (a certificate that does not verify) is an OSError
        raise SystemExit(f"iot-simulator: cannot connect device {device_id} to {args.host} port {args.port}: "
                         f"{err}") from None
    broker_hosts.follow_hosts(client, args.hosts)
    client.loop_start()
    if not connected.wait(15):
        raise SystemExit(f"iot-simulator: no answer from MQTT broker {host}:{args.port} within 15 s")
    if refused:
        raise SystemExit(f"iot-simulator: broker refused device {device_id}: {refused[0]} "
                         "(check its password in the credentials file and the site's stack_mqtt_devices)")
    return client


def run(args: argparse.Namespace) -> Counters:
    profile = fleet.Profile(base=args.base, target=args.target, tau_s=args.tau, noise=args.noise,
                            spike_probability=args.spike_probability, spike_magnitude=args.spike_magnitude,
                            hot_offset=args.hot_offset, unit=args.unit)
    sensors = fleet.build_fleet(args.site, args.devices, args.sensors_per_device, args.hot_sensors)
    rng = random.Random(args.seed)
    counters = Counters()
    clients = {device: _connect(args, device, counters) for device in dict.fromkeys(s.device_id for s in sensors)}
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
                info = clients[sensor.device_id].publish(sensor.mqtt_topic, payload, qos=args.qos)
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
        for client in clients.values():
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
