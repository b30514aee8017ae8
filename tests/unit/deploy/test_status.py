"""The status table's figures from what Kafka's and Cassandra's tools print (deploy/status.py,
status_table and its parsers), the role's names against the rest of the project, and reading the PLAY RECAP
from ansible-playbook's output (tooling/lab/status.py)."""
from __future__ import annotations

import json

import yaml

from deploy.status import (
    cql_counts,
    group_offsets,
    kafka_offsets,
    mm2_records,
    status_report,
    status_rows,
    status_table,
)
from deploy.swarm import services_converged
from services.common import names
from tooling.lab import status as lab_status
from tooling.testbed.stack_render import REPO

TOPICS = {"readings": names.TEMPERATURE_DATA, "events": names.THRESHOLD_EVENTS,
          "readings_table": "temperature_readings", "events_table": "temperature_threshold_events"}


def test_the_roles_names_are_the_projects():
    defaults = yaml.safe_load((REPO / "ansible/roles/status/defaults/main.yml").read_text())
    assert defaults["status_topics"] == TOPICS
    assert defaults["status_adapter_group"].endswith("-" + names.CONSUMER_GROUPS["adapter"])
    stack = yaml.safe_load((REPO / "ansible/roles/stack/defaults/main.yml").read_text())
    assert f"default({stack['stack_kafka_operator_user']!r})" in defaults["status_kafka_login"]["user"]
    assert f"default({stack['stack_cassandra_keyspace']!r})" in defaults["status_cassandra_keyspace"]
    assert str(stack["stack_relay_topics"]) in " ".join(defaults["status_relay_topics"].split())
    tables = {t["table"] for t in stack["stack_adapter_tables"]["edge"]}
    assert {TOPICS["readings_table"], TOPICS["events_table"]} <= tables


def test_offsets_group_offsets_and_mm2_records_are_read_from_the_tools_output():
    assert kafka_offsets(["temperature-data:0:12", "temperature-data:1:3", "noise", "x:y:z"]) == \
        {"temperature-data": {0: 12, 1: 3}}
    describe = ["", "Consumer group 'g' has no active members.", "",
                "GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID",
                "g temperature-data 0 100 120 20 - - -", "g temperature-data 1 - 5 - - - -",
                "g other 0 7 7 0 - - -"]
    assert group_offsets(describe, "temperature-data") == {0: 100}
    assert group_offsets(["Error: Consumer group 'g' does not exist."], "temperature-data") == {}
    assert mm2_records(['["k",{}]\t{"offset": 1}', '["k",{}]\tnull', "Processed a total of 2"]) == \
        [(b'["k",{}]', b'{"offset": 1}'), (b'["k",{}]', None)]
    assert cql_counts(["table a", "", " count", "-------", "   42", "", "(1 rows)", "table b",
                               "<stdin>:1:InvalidRequest: unconfigured table b"]) == {"a": 42}


def test_services_converged_names_the_services_short_of_their_replicas():
    lines = ["site-a_kafka-1 1/1", "site-a_bridge 1/2", "site-a_mosquitto 1/1 (max 1 per node)"]
    assert services_converged(lines, "site-a") == "2/3 (bridge 1/2)"
    assert services_converged(lines[:1] + lines[2:], "site-a") == "2/2"
    assert services_converged([], "site-a") == "none"


def _probe(site: str, first: int, last: int, tier: str = "edge", **extra) -> dict:
    kafka = "\n".join([f"first temperature-data:0:{first}", "time first 100.0",
                       f"last temperature-data:0:{last}", f"last {names.THRESHOLD_EVENTS}:0:4", "time last 105.0",
                       f"earliest {names.THRESHOLD_EVENTS}:0:0",
                       "group GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID",
                       f"group g temperature-data 0 {last - 3} {last} 3 - - -"])
    return {"site": site, "tier": tier, "kafka": kafka, "cassandra": "table temperature_readings\n 9\n",
            "services": [f"{site}_kafka-1 1/1"], **extra}


def test_rows_edge_sites_first_then_the_datacenter_and_a_silent_site_says_so():
    datacenter = {"site": "datacenter", "tier": "datacenter", "relayed": [names.THRESHOLD_EVENTS],
                  "mm2": '["MirrorSourceConnector",{"cluster":"site-a","partition":0,"topic":"'
                         + names.THRESHOLD_EVENTS + '"}]\t{"offset":2}',
                  "cassandra": "table temperature_threshold_events\n 4\n", "services": ["datacenter_kafka-1 1/1"]}
    sites = {"datacenter": "datacenter", "site-b": "edge", "site-a": "edge", "site-c": "edge"}
    rows = status_rows([datacenter, _probe("site-b", 0, 0), _probe("site-a", 100, 200)], sites, TOPICS)
    assert [r["site"] for r in rows] == ["site-a", "site-b", "site-c", "datacenter"]
    site_a = rows[0]
    assert (site_a["readings/s"], site_a["readings in kafka"], site_a["adapter lag"], site_a["events"]) == \
        (20.0, 200, 3, 4)
    assert site_a["relay lag"] == 1                        # copied 0..2 of 4
    assert site_a["cassandra readings"] == 9 and site_a["cassandra events"] is None
    assert rows[1]["relay lag"] == 4 and rows[1]["readings/s"] == 0
    assert rows[2]["services converged"] == "no answer"
    assert rows[3]["cassandra events"] == 4 and rows[3]["cassandra readings"] == "-"


def test_relay_lag_is_not_relayed_without_the_topic_and_n_a_without_the_datacenter():
    datacenter = {"site": "datacenter", "tier": "datacenter", "relayed": ["device-registration"], "mm2": ""}
    rows = status_rows([datacenter, _probe("site-a", 0, 5)], {"site-a": "edge", "datacenter": "datacenter"},
                               TOPICS)
    assert rows[0]["relay lag"] == "not relayed"
    rows = status_rows([_probe("site-a", 0, 5)], {"site-a": "edge"}, TOPICS)
    assert rows[0]["relay lag"] is None


def test_a_failed_probe_is_null_in_the_report_n_a_in_the_table_and_a_note():
    broken = {"site": "site-a", "tier": "edge", "kafka": "time first 1.0\ntime last 2.0", "cassandra": "",
              "services": [], "errors": {"kafka": "Error occurred: Timed out waiting for a node assignment."}}
    report = status_report([broken], {"site-a": "edge"}, TOPICS)
    assert json.loads(json.dumps(report)) == report                         # what status_json_file holds
    assert report["rows"] == [{"site": "site-a", "readings/s": None, "readings in kafka": None, "adapter lag": None,
                               "events": None, "relay lag": None, "cassandra readings": None,
                               "cassandra events": None, "services converged": "none"}]
    shuffled = {**report, "rows": [dict(sorted(row.items())) for row in report["rows"]]}   # as to_nice_json writes
    header, row, blank, note = status_table(shuffled).split("\n")
    assert header.split() == "site readings/s readings in kafka adapter lag events relay lag".split() + \
        "cassandra readings cassandra events services converged".split()
    assert header.split("  ")[0] == "site" and row.split() == ["site-a", *["n/a"] * 7, "none"] and blank == ""
    assert note == "site-a: the kafka probe failed: Error occurred: Timed out waiting for a node assignment."


RECAP = """PLAY RECAP *********************************************************************
dc-1                       : ok=14   changed=0    unreachable=0    failed=0    skipped=3    rescued=0    ignored=0
site-a-1                   : ok=16   changed=1    unreachable=0    failed=0    skipped=2    rescued=0    ignored=0
"""


def test_the_recap_is_read_from_ansible_playbooks_output():
    assert lab_status.recap(RECAP)["site-a-1"]["changed"] == 1
    assert lab_status.recap(RECAP)["dc-1"] == {"ok": 14, "changed": 0, "unreachable": 0, "failed": 0, "skipped": 3,
                                                "rescued": 0, "ignored": 0}
    assert lab_status.recap("no recap here") == {}
