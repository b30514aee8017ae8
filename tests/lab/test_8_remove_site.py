"""Removing an edge site: its group out of the inventory and one ansible/remove_site.yml run on the
datacenter (`scripts/lab remove-site site-b`). The relay flow goes; what the datacenter holds of the
site stays (keep, the default) until a second run with `--purge` deletes it, and the other site's data
stays either way. Not in the smoke: each run redeploys the datacenter (4-6 minutes here)."""
from __future__ import annotations

import re

import pytest
from confluent_kafka.admin import AdminClient

from tests.lab.conftest import run_lab
from tests.lab.test_2_end_to_end import rows
from tooling.lab import lab

SITE, OTHER = "site-b", "site-a"


def datacenter_topics(dc: lab.LabHost) -> set[str]:
    return set(AdminClient(lab.kafka_client(f"{lab.host_ip(dc)}:9094")).list_topics(timeout=30).topics)


def devices_at_datacenter(dc: lab.LabHost, site: str) -> int:
    out = rows(dc, "datacenter", f"SELECT count(*) FROM iot.devices WHERE site='{site}';")
    assert out and out[0][0].isdigit(), out
    return int(out[0][0])


def flows(dc: lab.LabHost) -> list[str]:
    mm2 = lab.host_exec(dc, "cat", "/opt/iot-stack/datacenter/secrets/mm2_properties").stdout
    return sorted(re.findall(r"^(\S+)->datacenter\.enabled = true$", mm2, re.M))


@pytest.mark.timeout(2700)
def test_a_removed_sites_relayed_data_is_kept_then_purged_and_the_other_site_keeps_its_own(lab_hosts):
    dc = lab.site_managers(lab_hosts)["datacenter"]
    assert SITE in flows(dc)
    site_topics = {t for t in datacenter_topics(dc) if t.startswith(f"{SITE}.") or f".{SITE}." in t}
    assert f"{SITE}.device-registration" in site_topics and f"mm2-offsets.{SITE}.internal" in site_topics
    kept_devices, other_devices = devices_at_datacenter(dc, SITE), devices_at_datacenter(dc, OTHER)
    assert kept_devices > 0 and other_devices > 0

    output = run_lab("remove-site", SITE).stderr
    assert f"{SITE}-1" not in {h.name for h in lab.existing_hosts()}
    assert set(re.findall(r"^(\S+)\s*:\s*ok=", output, re.M)) == {"dc-1"}, "only the datacenter is touched"
    assert flows(dc) == [OTHER]
    assert site_topics <= datacenter_topics(dc), "keep: the site's topics stay"
    assert devices_at_datacenter(dc, SITE) == kept_devices, "keep: the site's rows stay"

    run_lab("remove-site", SITE, "--purge")
    left = datacenter_topics(dc)
    assert not site_topics & left, site_topics & left
    assert devices_at_datacenter(dc, SITE) == 0
    assert f"{OTHER}.device-registration" in left and f"mm2-offsets.{OTHER}.internal" in left
    assert devices_at_datacenter(dc, OTHER) >= other_devices
