"""The lab tests: the real multi-site lab from `scripts/lab up`, checked from outside.

The session brings the lab up once (reusing a running lab when IOT_LAB_REUSE=1)
and takes it down at the end unless IOT_LAB_KEEP=1. Modules run in name order:
hosts, end to end, idempotence, add-site.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tooling import lab

REPO = lab.pins.REPO_ROOT
# testinfra's ansible backend calls ansible-inventory/ansible from PATH.
os.environ["PATH"] = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"


def run_lab(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "tooling.lab", *args], cwd=REPO, capture_output=True,
                            text=True, timeout=timeout)
    sys.stderr.write(result.stderr[-20000:])
    assert result.returncode == 0, f"scripts/lab {' '.join(args)} failed:\n{result.stderr[-5000:]}"
    return result


@pytest.fixture(scope="session")
def lab_hosts():
    reuse = os.environ.get("IOT_LAB_REUSE") == "1" and lab.existing_hosts()
    if not reuse:
        run_lab("down")
        run_lab("up", "--no-build")  # scripts/test built everything already
    yield lab.existing_hosts()
    if os.environ.get("IOT_LAB_KEEP") != "1":
        run_lab("down")


@pytest.fixture(scope="session")
def inventory(lab_hosts):
    return lab.lab_dir() / "inventory"
