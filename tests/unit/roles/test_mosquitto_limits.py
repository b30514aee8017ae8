"""Mosquitto's queue limits fit its memory limit, in the role's defaults, the example inventory and the lab.

Mosquitto keeps every queued message in memory. Measured with Mosquitto 2.0.11
(100,000 readings of 63 bytes queued for an offline persistent session: +39.6 MiB)
a queued reading costs ~420 bytes, i.e. ~360 bytes besides its payload. Without a
fitting bound, a long Kafka outage makes the queue outgrow the container, which is
then OOM-killed and loses what it had not saved.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tooling.lab import lab

REPO = Path(__file__).resolve().parents[3]
OVERHEAD_BYTES = 360          # per queued message besides its payload (measured, see above)
BUDGET = 0.75                 # of the memory limit; the rest is Mosquitto itself and its sessions


def _bytes(size: str) -> int:
    match = re.fullmatch(r"(\d+)([KMG]?)i?B?", str(size).strip(), re.IGNORECASE)
    assert match, f"unreadable memory size {size!r}"
    return int(match[1]) * {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}[match[2].upper()]


def _merged(*layers: dict) -> dict:
    out: dict = {}
    for layer in layers:
        out.update(layer or {})
    return out


DEFAULTS = yaml.safe_load((REPO / "ansible/roles/stack/defaults/main.yml").read_text())
EXAMPLE = _merged(*(yaml.safe_load(p.read_text()) for p in sorted((REPO / "inventory.example").rglob("*.yml"))))
LAB = yaml.safe_load(lab.LAB_GROUP_VARS)


@pytest.mark.parametrize(("name", "variables"), [("role defaults", DEFAULTS),
                                                 ("inventory.example", _merged(DEFAULTS, EXAMPLE)),
                                                 ("lab", _merged(DEFAULTS, LAB))])
def test_a_full_queue_fits_in_mosquittos_memory_limit(name, variables):
    memory = _bytes(variables["stack_resources"]["mosquitto"]["memory"])
    count, payload = variables["stack_mqtt_max_queued_messages"], variables["stack_mqtt_max_queued_bytes"]
    assert count > 0 and payload > 0, f"{name}: an unbounded queue (0) can outgrow any container"
    need = count * OVERHEAD_BYTES + payload
    assert need <= BUDGET * memory, (
        f"{name}: a full queue needs ~{need / 2**20:.0f} MiB ({count} messages x {OVERHEAD_BYTES} B + "
        f"{payload / 2**20:.0f} MiB payload) but Mosquitto may use {memory / 2**20:.0f} MiB; lower "
        "stack_mqtt_max_queued_messages/_bytes or raise stack_resources.mosquitto.memory")
