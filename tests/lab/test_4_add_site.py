"""Adding a site is one inventory group and one limited playbook run; other sites stay untouched."""
from __future__ import annotations

import json
import re
import time

import pytest

from tests.lab.conftest import run_lab
from tests.lab.test_2_end_to_end import RUN, publish, rows, wait_for
from tooling.lab import lab

NEW_SITE = "site-c"


def service_versions(host: lab.LabHost, site: str) -> dict[str, str]:
    """Each service's Swarm version index: it moves whenever the service is updated."""
    names = lab.host_exec(host, "docker", "stack", "services", site, "--format", "{{.Name}}").stdout.split()
    out = lab.host_exec(host, "docker", "service", "inspect", *names, "--format",
                        "{{.Spec.Name}} {{.Version.Index}}").stdout
    return dict(line.split() for line in out.splitlines())


# A new host, its images streamed, a deploy and the datacenter's relay update take
# 15-20 minutes on the 2-core machine while the other sites keep running.
@pytest.mark.timeout(2700)
def test_new_site_reaches_the_datacenter_without_touching_other_sites(lab_hosts, capsys):
    managers = lab.site_managers(lab_hosts)
    before = {site: service_versions(host, site) for site, host in managers.items() if site != "datacenter"}

    started = time.monotonic()
    output = run_lab("add-site", NEW_SITE).stderr
    with capsys.disabled():
        print(f"\nadding {NEW_SITE} (new host, site.yml --limit datacenter,{NEW_SITE}) took "
              f"{time.monotonic() - started:.0f}s")
    recap_hosts = set(re.findall(r"^(\S+)\s*:\s*ok=", output, re.M))
    assert recap_hosts == {"dc-1", f"{NEW_SITE}-1"}, f"the run touched {recap_hosts}"

    hosts = lab.existing_hosts()
    managers = lab.site_managers(hosts)
    after = {site: service_versions(managers[site], site) for site in before}
    assert after == before, "services of existing sites changed"

    sensor = f"hot-{RUN}-c"
    publish(managers[NEW_SITE], NEW_SITE, sensor, [150.0] * 20 + [20.0] * 20)
    dc = managers["datacenter"]
    found = wait_for(f"{NEW_SITE}'s threshold events in the datacenter's Cassandra", lambda: rows(
        dc, "datacenter", "SELECT site, sensor_id FROM iot.temperature_threshold_events "
                          f"WHERE sensor_id='{sensor}' ALLOW FILTERING;"), timeout=900)
    assert {r[0] for r in found} == {NEW_SITE}
    mm2 = lab.host_exec(dc, "cat", "/opt/iot-stack/datacenter/secrets/mm2_properties").stdout
    assert f"{NEW_SITE}->datacenter.enabled = true" in mm2
    assert json.dumps(sorted({"site-a", "site-b", NEW_SITE})) == json.dumps(
        sorted(re.findall(r"^(site-[a-z])->datacenter\.enabled = true$", mm2, re.M)))
