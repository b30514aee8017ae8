"""The lab's status table: `ansible/status.yml` (the status playbook of any deployment) run against the lab.

The playbook measures each site on its manager with Kafka's and Cassandra's own tools and prints one table;
its figures come from deploy/status.py. Here: running the playbook, and reading its table and PLAY RECAP
back (the lab test and `scripts/lab status` use them).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from deploy.status import STATUS_COLUMNS, parse_table  # noqa: F401 - parse_table is re-exported
from tooling import pins

PLAYBOOK = pins.REPO_ROOT / "ansible" / "status.yml"


# Re-exported: the status table's columns and parser live in the one place the playbook uses.
COLUMNS = STATUS_COLUMNS

RECAP = re.compile(r"^(\S+)\s*:\s*((?:\w+=\d+\s*)+)$", re.MULTILINE)


def run_playbook(inventory: Path, *extra: str, timeout: float = 900, playbook: Path = PLAYBOOK
                 ) -> subprocess.CompletedProcess:
    """ansible-playbook -i INVENTORY ansible/status.yml (or another playbook), as an operator runs it; output
    captured."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(pins.REPO_ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    return subprocess.run(["ansible-playbook", "-i", str(inventory), str(playbook), *extra], cwd=pins.REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def table_text(output: str) -> str:
    """The table the playbook printed (the status task's `msg: |-` block, dedented), or '' if it printed none."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if line.startswith("TASK [status : Print the status of every site]")), None)
    if start is None:
        return ""
    block: list[str] = []
    indent = None
    for line in lines[start + 1:]:
        if indent is None:
            match = re.match(r"^(\s*)msg: \|-?\s*$", line)
            if match:
                indent = len(match.group(1))
            elif line.startswith(("TASK [", "PLAY [", "PLAY RECAP")):
                return ""
            continue
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line)
    while block and not block[-1].strip():
        block.pop()
    if not block:
        return ""
    margin = min(len(line) - len(line.lstrip()) for line in block if line.strip())
    return "\n".join(line[margin:] for line in block)


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines -> {host: {ok: n, changed: n, unreachable: n, failed: n, ...}}."""
    part = output.split("PLAY RECAP", 1)[1] if "PLAY RECAP" in output else ""
    return {host: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)} for host, counts in RECAP.findall(part)}
