"""The services image carries the project's package and the locked client libraries."""
from __future__ import annotations

import json

import pytest

from tooling.build import artifacts
from tooling.testbed.docker_lab import docker, image

ENTRY_POINTS = ("iot-bridge", "iot-cassandra-adapter", "iot-simulator", "iot-registrar", "iot-topics")


def _locked_version(project: str) -> str:
    for entry in artifacts.load_lock()["python"]["services"]:
        name, version = entry["file"].split("-")[:2]
        if name.lower().replace("_", "-") == project:
            return version
    raise AssertionError(f"{project} is not in the services lock")


def test_services_image_runs_as_non_root():
    result = docker("run", "--rm", image("services"), "id", "-u")
    assert result.stdout.strip() == "1000"


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_services_image_installs_entry_point(entry_point):
    result = docker("run", "--rm", image("services"), "sh", "-c", f"command -v {entry_point}")
    assert result.stdout.strip() == f"/opt/venv/bin/{entry_point}"


def test_services_image_has_locked_client_library_versions():
    script = ("import json, importlib.metadata as m; print(json.dumps({p: m.version(p) for p in "
              "('confluent-kafka', 'paho-mqtt', 'cassandra-driver', 'prometheus-client')}))")
    installed = json.loads(docker("run", "--rm", image("services"), "python", "-c", script).stdout)
    assert installed == {p: _locked_version(p) for p in installed}
