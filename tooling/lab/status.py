"""The lab's status table: `ansible/status.yml` (the status playbook of any deployment) run against the lab.

The playbook measures each site on its manager with Kafka's and Cassandra's own tools and prints one table;
its figures come from deploy/status.py. Here: running the playbook, and reading its JSON report and PLAY RECAP
(the lab test and `scripts/lab status` use them).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from deploy.status import STATUS_COLUMNS
from tooling.build import pins

PLAYBOOK = pins.REPO_ROOT / "ansible" / "status.yml"


COLUMNS = STATUS_COLUMNS      # re-exported: the columns live where the playbook's figures are computed

RECAP = re.compile(r"^(\S+)\s*:\s*((?:\w+=\d+\s*)+)$", re.MULTILINE)


def run_playbook(inventory: Path, *extra: str, timeout: float = 900, playbook: Path = PLAYBOOK
                 ) -> subprocess.CompletedProcess:
    """ansible-playbook -i INVENTORY ansible/status.yml (or another playbook), as an operator runs it; output
    captured."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(pins.REPO_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    return subprocess.run(["ansible-playbook", "-i", str(inventory), str(playbook), *extra], cwd=pins.REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def run_report(inventory: Path, *extra: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, dict | None]:
    """The status playbook's run and the figures it wrote as JSON (deploy/status.py status_report); None when
    it wrote none (it failed before its last task)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "status.json"
        result = run_playbook(inventory, "-e", f"status_json_file={path}", *extra, timeout=timeout)
        return result, json.loads(path.read_text()) if path.exists() else None


def rows_by_site(report: dict) -> dict[str, dict]:
    return {row["site"]: row for row in report["rows"]}


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines -> {host: {ok: n, changed: n, unreachable: n, failed: n, ...}}."""
    part = output.split("PLAY RECAP", 1)[1] if "PLAY RECAP" in output else ""
    return {host: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)} for host, counts in RECAP.findall(part)}
