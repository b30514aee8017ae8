"""Registers the deploy package's filters with Ansible; the logic and its tests live in deploy/."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository, which holds deploy/

import deploy  # noqa: E402


class FilterModule:
    def filters(self):
        return deploy.filters()
