"""Register devices, sensors and sensor types into their compacted Kafka topics.

Two sources (a file's records are all validated first, and nothing is produced if any is wrong:
tests/unit/commands/test_registrar_poison.py):
  file   a JSON or TOML file with lists `sensor_types`, `devices`, `sensors` (fields as in services/common/contracts.py)
  fleet  the simulator's fleet for a site (same ids as iot-simulator).
Keys are the ids, so the compacted topics keep the latest registration of each.

Examples:
  KAFKA_USERNAME=admin iot-registrar --bootstrap-servers kafka-1:9092 file registry.toml
  (on a site's overlay: INTERNAL, SCRAM as KAFKA_USERNAME with /run/secrets/kafka_password; no
  KAFKA_USERNAME: no login, for test clusters)
  iot-registrar --bootstrap-servers 10.20.0.11:9094 --kafka-user operator fleet --site site-a --devices 5
  (a site's EXTERNAL listener: SASL_SSL, with /run/secrets/kafka_password and kafka_ca.pem mounted)
"""
from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

from confluent_kafka import Producer

from services.commands import fleet
from services.common import contracts, kafka_auth, names, settings

# File section -> (topic, contract)
SECTIONS = {
    "sensor_types": (names.SENSOR_TYPE_REGISTRATION, contracts.SENSOR_TYPE),
    "devices": (names.DEVICE_REGISTRATION, contracts.DEVICE),
    "sensors": (names.SENSOR_REGISTRATION, contracts.SENSOR),
}


class RegistryError(ValueError):
    """The registry input is wrong; the message says where and how."""


def load_file(path: Path) -> dict[str, list[dict]]:
    """Read and validate a registry file; returns records by topic.

    Whatever the file holds, the answer is the records or a RegistryError naming
    the problem: never a traceback, and nothing produced from a file with an error."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RegistryError(f"registry file {path} not found") from None
    except OSError as err:
        raise RegistryError(f"cannot read registry file {path}: {err.strerror}") from None
    raw = _parse(path, data)
    if not isinstance(raw, dict):
        raise RegistryError(f"{path}: expected an object with the lists {', '.join(SECTIONS)}, "
                            f"got {type(raw).__name__}")
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        raise RegistryError(f"{path}: unknown sections {sorted(unknown)} (expected {', '.join(SECTIONS)})")
    records: dict[str, list[dict]] = {}
    errors = []
    for section, (topic, contract) in SECTIONS.items():
        items = raw.get(section, [])
        if not isinstance(items, list):
            errors.append(f"{path}: '{section}' must be a list of records, got {type(items).__name__}")
            continue
        for i, item in enumerate(items, start=1):
            try:
                records.setdefault(topic, []).append(contract.validate(item))
            except contracts.ContractError as err:
                errors.append(f"{path}: {section}[{i}]: {err}")
    errors += _dangling_references(records, path)
    if errors:
        raise RegistryError("\n".join(errors))
    if not records:
        raise RegistryError(f"{path}: nothing to register (add sensor_types, devices or sensors)")
    return records


def _parse(path: Path, data: bytes):
    """The file's TOML or JSON document; RegistryError for anything that is not one (encoding,
    syntax, nesting deeper than the recursion limit, numbers Python cannot hold)."""
    if path.suffix != ".toml":
        try:
            return contracts.parse_json(data)
        except contracts.InvalidJson as err:
            raise RegistryError(f"{path}: not valid JSON: {err}") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except RecursionError:
        raise RegistryError(f"{path}: not valid TOML: nested too deeply") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError) as err:
        raise RegistryError(f"{path}: not valid TOML: {err}") from None


def _dangling_references(records: dict[str, list[dict]], path: Path) -> list[str]:
    """Sensors must name devices and sensor types registered in the same file."""
    devices = {r["device_id"] for r in records.get(names.DEVICE_REGISTRATION, [])}
    types = {r["sensor_type_id"] for r in records.get(names.SENSOR_TYPE_REGISTRATION, [])}
    errors = []
    for sensor in records.get(names.SENSOR_REGISTRATION, []):
        if devices and sensor["device_id"] not in devices:
            errors.append(f"{path}: sensor {sensor['sensor_id']} names unknown device '{sensor['device_id']}'")
        if types and sensor["sensor_type_id"] not in types:
            errors.append(f"{path}: sensor {sensor['sensor_id']} names unknown sensor type "
                          f"'{sensor['sensor_type_id']}'")
    return errors


def produce(bootstrap: str, records: dict[str, list[dict]], timeout: float = 30.0,
            security: dict | None = None) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         **(security or {})})
    failures: list[str] = []
    count = 0
    for topic, items in records.items():
        contract = next(c for t, c in SECTIONS.values() if t == topic)
        for record in items:
            producer.produce(topic, key=contract.key(record), value=json.dumps(record),
                             on_delivery=lambda err, msg: err and failures.append(f"{msg.topic()}: {err}"))
            count += 1
            producer.poll(0)
    left = producer.flush(timeout)
    if left or failures:
        raise RegistryError(f"{left} registrations not delivered within {timeout:.0f}s; "
                            f"errors: {failures[:3]} (is {bootstrap} reachable and do the topics exist?)")
    return count


# --<name> flags, each also read from the variable shown (services/common/settings.py).
OPTIONS: tuple[settings.Option, ...] = (
    settings.Option("bootstrap_servers", "REGISTRAR_BOOTSTRAP_SERVERS", None,
                    "Kafka bootstrap servers, e.g. kafka-1:9092", required=True),
    # A site's EXTERNAL listener (host port 9094) takes SCRAM logins over mutual TLS only; its password is
    # the secret kafka_password (KAFKA_PASSWORD_FILE or /run/secrets/kafka_password).
    settings.Option("kafka_user", "REGISTRAR_KAFKA_USER", "",
                    "SCRAM user for a site's EXTERNAL listener (SASL_SSL); empty: plaintext "
                    "(INTERNAL, on the overlay)"),
    settings.Option("kafka_ca_file", "REGISTRAR_KAFKA_CA_FILE", "/run/secrets/kafka_ca.pem",
                    "CA certificate (PEM) that signed the brokers' certificates, with --kafka-user"),
    # EXTERNAL asks for a client certificate of the clients CA (mutual TLS): the operator's, from the pki role.
    settings.Option("kafka_cert_file", "REGISTRAR_KAFKA_CERT_FILE", "/run/secrets/kafka_client.crt",
                    "client certificate (PEM) of the clients CA, with --kafka-user (pki_dir/clients/operator.crt)"),
    settings.Option("kafka_key_file", "REGISTRAR_KAFKA_KEY_FILE", "/run/secrets/kafka_client.key",
                    "its private key (PEM), with --kafka-user (pki_dir/clients/operator.key)"),
)
FLEET_OPTIONS: tuple[settings.Option, ...] = (
    settings.Option("site", "REGISTRAR_SITE", None, "site alias, as given to iot-simulator --site", required=True),
    settings.Option("devices", "REGISTRAR_DEVICES", 5, "devices of the fleet", int),
    settings.Option("sensors_per_device", "REGISTRAR_SENSORS_PER_DEVICE", 2, "sensors per device", int),
    settings.Option("unit", "REGISTRAR_UNIT", "C", "unit the sensors report in", choices=contracts.UNITS),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="iot-registrar", description=__doc__, epilog=settings.epilog(OPTIONS),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    settings.add_options(p, OPTIONS)
    p.add_argument("--dry-run", action="store_true", help="validate and print the records, produce nothing")
    sub = p.add_subparsers(dest="source", required=True)
    file_p = sub.add_parser("file", help="register what a JSON or TOML file lists")
    file_p.add_argument("path", type=Path, help="JSON or TOML file listing sensor_types, devices and sensors")
    fleet_p = sub.add_parser("fleet", help="register the simulator's fleet of a site",
                             epilog=settings.epilog(FLEET_OPTIONS),
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    settings.add_options(fleet_p, FLEET_OPTIONS)
    args = p.parse_args(argv)
    parser = p
    try:
        settings.apply(p, OPTIONS, args)
        if args.source == "fleet":
            parser = fleet_p
            settings.apply(fleet_p, FLEET_OPTIONS, args)
    except settings.SettingsError as err:   # a bad variable: a usage error too (exit 2)
        parser.error(str(err))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.source == "file":
            records = load_file(args.path)
        else:
            sensors = fleet.build_fleet(args.site, args.devices, args.sensors_per_device)
            records = fleet.registrations(sensors, args.unit)
        if args.dry_run:
            for topic, items in records.items():
                for record in items:
                    print(topic, json.dumps(record))
            return 0
        security = kafka_auth.internal_config() or None
        if args.kafka_user:
            problem = kafka_auth.missing_file([
                ("--kafka-ca-file", args.kafka_ca_file, "the CA that signed the brokers' certificates"),
                ("--kafka-cert-file", args.kafka_cert_file, "the operator's certificate, pki_dir/clients/operator.crt"),
                ("--kafka-key-file", args.kafka_key_file, "its key, pki_dir/clients/operator.key")])
            if problem:
                raise RegistryError(problem)
            password = settings.secret("kafka_password", required=True)
            security = kafka_auth.sasl_ssl_config(args.kafka_user, password, args.kafka_ca_file,
                                                  args.kafka_cert_file, args.kafka_key_file)
        count = produce(args.bootstrap_servers, records, security=security)
    except (RegistryError, ValueError) as err:  # SettingsError is a ValueError
        print(f"iot-registrar: {err}", file=sys.stderr)
        return 1
    summary = ", ".join(f"{len(v)} {k}" for k, v in records.items())
    print(f"registered {count} records: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
