"""A second run of site.yml against the running lab changes nothing."""
from __future__ import annotations

import re

from tests.lab.conftest import run_lab


def test_second_site_yml_run_reports_no_changes(lab_hosts):
    output = run_lab("playbook").stderr
    recap = re.findall(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output, re.M)
    assert {host for host, *_ in recap} >= {h.name for h in lab_hosts}
    changed = {host: int(c) for host, _, c, _, _ in recap if int(c)}
    assert changed == {}, f"second run changed something: {changed}"
    assert all(int(failed) == 0 and int(unreachable) == 0 for _, _, _, unreachable, failed in recap)
