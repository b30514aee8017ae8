"""Simulated fleet, temperature formula, registrar input validation and CLI errors."""
from __future__ import annotations

import json
import random
import statistics

import pytest

from services.commands import fleet, registrar, simulator
from services.common import contracts, names


def test_fleet_ids_are_stable_and_hot_sensors_come_first():
    sensors = fleet.build_fleet("site-a", devices=2, sensors_per_device=2, hot_sensors=1)
    assert [s.sensor_id for s in sensors] == [
        "site-a-dev-1-s1", "site-a-dev-1-s2", "site-a-dev-2-s1", "site-a-dev-2-s2"]
    assert [s.hot for s in sensors] == [True, False, False, False]
    assert sensors[0].mqtt_topic == "sites/site-a/devices/site-a-dev-1/sensors/site-a-dev-1-s1/temperature"


def test_temperature_approaches_target_from_base():
    profile = fleet.Profile(base=20, target=30, tau_s=10, noise=0, spike_probability=0)
    rng = random.Random(1)
    assert fleet.temperature(profile, 0, False, rng) == pytest.approx(20)
    assert fleet.temperature(profile, 10, False, rng) == pytest.approx(30 - 10 / 2.718281828, abs=1e-3)
    assert fleet.temperature(profile, 1000, False, rng) == pytest.approx(30)


def test_hot_sensor_settles_above_normal_target():
    profile = fleet.Profile(base=20, target=24, tau_s=1, noise=0, spike_probability=0, hot_offset=50)
    assert fleet.temperature(profile, 100, True, random.Random(1)) == pytest.approx(74)


def test_noise_has_the_configured_spread():
    profile = fleet.Profile(base=20, target=20, noise=2.0, spike_probability=0)
    rng = random.Random(7)
    values = [fleet.temperature(profile, 0, False, rng) for _ in range(5000)]
    assert statistics.stdev(values) == pytest.approx(2.0, rel=0.05)


def test_spikes_appear_at_the_configured_rate():
    profile = fleet.Profile(base=20, target=20, noise=0, spike_probability=0.1, spike_magnitude=15)
    rng = random.Random(3)
    values = [fleet.temperature(profile, 0, False, rng) for _ in range(10000)]
    spikes = sum(abs(v - 20) > 10 for v in values)
    assert 850 < spikes < 1150


@pytest.mark.parametrize("unit, expected", [("C", 25.0), ("F", 77.0), ("K", 298.15)])
def test_readings_are_reported_in_the_chosen_unit(unit, expected):
    profile = fleet.Profile(base=25, target=25, noise=0, spike_probability=0, unit=unit)
    sensor = fleet.build_fleet("s", 1, 1)[0]
    record = fleet.reading(sensor, profile, 0, 1_700_000_000_000, random.Random(0))
    # device_id: the bridge fills it from the topic; a device's own payload leaves it out.
    assert contracts.READING.validate(record) == {"sensor_id": "s-dev-1-s1", "timestamp": 1_700_000_000_000,
                                                  "temperature": expected, "unit": unit, "device_id": None}


def test_fleet_registrations_are_valid_and_consistent():
    sensors = fleet.build_fleet("site-b", 2, 3)
    records = fleet.registrations(sensors, "F")
    assert len(records[names.DEVICE_REGISTRATION]) == 2
    assert len(records[names.SENSOR_REGISTRATION]) == 6
    assert {r["sensor_type_id"] for r in records[names.SENSOR_REGISTRATION]} == {"temperature-f"}


def test_registry_file_with_errors_reports_every_one(tmp_path):
    path = tmp_path / "registry.json"
    path.write_text(json.dumps({
        "sensor_types": [{"sensor_type_id": "t", "name": "T", "unit": "X"}],
        "devices": [{"device_id": "d1", "name": "D"}],
        "sensors": [{"sensor_id": "s1", "name": "S", "device_id": "d2", "sensor_type_id": "t"},
                    {"sensor_id": "s2", "device_id": "d1", "sensor_type_id": "t"}],
    }))
    with pytest.raises(registrar.RegistryError) as err:
        registrar.load_file(path)
    message = str(err.value)
    assert "sensor_types[1]: sensor-type-registration: field 'unit': unknown value 'X'" in message
    assert "sensors[2]: sensor-registration: missing field 'name'" in message
    assert "sensor s1 names unknown device 'd2'" in message


def test_registry_file_from_toml(tmp_path):
    path = tmp_path / "registry.toml"
    path.write_text('[[devices]]\ndevice_id = "d1"\nname = "Press"\nlocation = "hall 2"\n')
    assert registrar.load_file(path) == {names.DEVICE_REGISTRATION: [
        {"device_id": "d1", "name": "Press", "description": None, "location": "hall 2"}]}


def test_registry_file_with_unknown_section_is_named(tmp_path):
    path = tmp_path / "registry.json"
    path.write_text('{"device": []}')
    with pytest.raises(registrar.RegistryError, match=r"unknown sections \['device'\]"):
        registrar.load_file(path)


def test_registrar_dry_run_prints_records(capsys):
    assert registrar.main(["--bootstrap-servers", "unused:9092", "--dry-run", "fleet", "--site", "x",
                           "--devices", "1", "--sensors-per-device", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and lines[0].startswith("sensor-type-registration ")


def test_registrar_names_a_missing_client_certificate_with_its_flag(tmp_path, capsys):
    ca = tmp_path / "ca.pem"
    ca.write_text("not checked before the files exist\n")
    code = registrar.main(["--bootstrap-servers", "site-a:9094", "--kafka-user", "operator",
                           "--kafka-ca-file", str(ca), "--kafka-cert-file", str(tmp_path / "operator.crt"),
                           "--kafka-key-file", str(tmp_path / "operator.key"),
                           "fleet", "--site", "x", "--devices", "1", "--sensors-per-device", "1"])
    assert code == 1
    err = capsys.readouterr().err
    assert f"--kafka-cert-file {tmp_path / 'operator.crt'} not found (the operator's certificate" in err, err


@pytest.mark.parametrize("argv", [[], ["--bogus"], ["--site", "a", "--qos", "2"], ["--site", "a", "--rate", "0"]])
def test_simulator_bad_flags_print_usage_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        simulator.parse_args(argv)
    assert exit_info.value.code == 2
    assert "usage: iot-simulator" in capsys.readouterr().err


def test_registrar_without_source_prints_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        registrar.parse_args(["--bootstrap-servers", "k:9092"])
    assert exit_info.value.code == 2
    assert "usage: iot-registrar" in capsys.readouterr().err


def test_simulator_with_count_only_runs_until_the_count(tmp_path):
    (tmp_path / "creds").write_text(json.dumps({f"a-dev-{n}": "pw" for n in range(1, 6)}))
    args = simulator.parse_args(["--site", "a", "--count", "5", "--credentials-file", str(tmp_path / "creds"),
                                 "--plaintext"])
    assert args.count == 5 and args.duration == float("inf")
