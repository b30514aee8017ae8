"""The fault suite's faults hit exactly the service they name. Docker's `name` filter matches a substring
as a regular expression: "site-a_mosquitto." matched site-a_mosquitto-agent's containers too, and the
Mosquitto cases killed the agent instead of Mosquitto (caught by their expected alert, MosquittoRestarted)."""
from __future__ import annotations

import re
from pathlib import Path

from tooling.lab.chaos import service_filter

REPO = Path(__file__).resolve().parents[3]


def test_a_service_is_found_by_its_swarm_label_not_by_a_name_pattern():
    assert service_filter("site-a", "mosquitto") == ["-f", "label=com.docker.swarm.service.name=site-a_mosquitto"]


def test_no_lab_code_picks_a_container_by_a_name_filter():
    pattern = re.compile(r"docker\"?,? .*ps.*-f\"?,? *f?\"?name=|-f name=\{")
    offenders = [f"{path.relative_to(REPO)}:{number}"
                 for root in ("tooling", "tests/lab", "scripts")
                 for path in (REPO / root).rglob("*") if path.is_file() and path.suffix in ("", ".py", ".sh")
                 for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == [], f"use a label=com.docker.swarm.service.name= filter: {offenders}"
