"""The tree passes its linters: ruff, yamllint, ansible-lint (production profile)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("command", [
    ["ruff", "check", "."],
    ["yamllint", "-s", "ansible", "inventory.example"],
    ["ansible-lint", "--nocolor", "-q"],
], ids=lambda c: c[0])
def test_linter_passes(command):
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    result = subprocess.run([str(BIN / command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
