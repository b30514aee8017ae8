"""ansible/status.yml end to end without Docker: the real playbook against a throwaway inventory of local
hosts (a datacenter, site-a with two nodes, site-b), with a fake `docker` on PATH. The fake runs each probe's
bash script as the container would, with fake Kafka tools and cqlsh that print what the real ones print
(GetOffsetShell's topic:partition:offset, kafka-consumer-groups --describe, cqlsh's count; for the
datacenter's MirrorMaker offsets probe, the key<TAB>value records it prints), and records every command
line. So the probes' scripts, their logins on stdin, the parsing and the table are checked here; the real
tools' behaviour only in the lab (tests/lab/test_2_status.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tooling.lab import status as lab_status

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
OPERATOR_PASSWORD = "status-test-operator-Zq81"
CASSANDRA_PASSWORD = "status-test-superuser-Kx42"

LOCAL = "ansible_connection=local"
ONE_NODE = "zookeeper_id=1 kafka_id=1 cassandra_id=1 apps_node=true"
INVENTORY = f"""
[datacenter]
dc-1 {LOCAL} swarm_role=manager {ONE_NODE}

[site_a]
site-a-1 {LOCAL} swarm_role=manager {ONE_NODE} mqtt_node=true
site-a-2 {LOCAL} swarm_role=worker kafka_id=2

[site_b]
site-b-1 {LOCAL} swarm_role=manager {ONE_NODE} mqtt_node=true

[edge:children]
site_a
site_b
"""
SECRETS = f"""---
stack_cassandra_password: {CASSANDRA_PASSWORD}
stack_cassandra_adapter_password: status-test-adapter-Pw93
stack_kafka_operator_password: {OPERATOR_PASSWORD}
stack_kafka_relay_password: status-test-relay-Hv27
stack_mqtt_users: {{bridge: status-test-bridge-Lm55, mosquitto-agent: status-test-agent-Lm55}}
iot_stack_dir: {{stack_dir}}
stack_alert_receivers: [{{name: operations, email_configs: [{{to: operations@example.com}}]}}]
"""

# The fake tools. Offsets grow 20 a second over three partitions; the threshold events' partitions end at
# 10, 20 and 30 (the oldest offset of partition 2 is 5). MirrorMaker has copied site-a's partitions 0 and 1
# up to offsets 7 (next 8) and 19 (next 20) and nothing of partition 2; of site-b everything.
FAKE_TOOLS = r'''#!/usr/bin/env python3
import json, os, sys, time
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
def opt(name):
    return args[args.index(name) + 1] if name in args else None
if tool == "kafka-run-class" and args[0].endswith("GetOffsetShell"):
    topics, when = opt("--topic").split("|"), opt("--time")
    for topic in topics:
        for p in range(3):
            if topic == "temperature-data":
                print(f"{topic}:{p}:{int(time.time() * 20 / 3) + 1000 * p if when == '-1' else 0}")
            else:
                print(f"{topic}:{p}:{(p + 1) * 10 if when == '-1' else (5 if p == 2 else 0)}")
elif tool == "kafka-consumer-groups":
    group = opt("--group")
    print(f"\nConsumer group '{group}' has no active members.\n")
    print("GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID")
    print(f"{group} temperature-data 0 100 2000 1900 - - -")
    print(f"{group} temperature-data 1 - - - - - -")
elif tool == "cqlsh":
    table = opt("-e").split("FROM ")[1].rstrip(";").split(".")[1]
    print(f"\n count\n-------\n   {len(table) * 10}\n\n(1 rows)\n")
'''

FAKE_DOCKER = r'''#!/usr/bin/env python3
"""docker for the status playbook's tests: logs its argv, lists services, runs a probe's script."""
import json, os, re, subprocess, sys
args = sys.argv[1:]
stdin = sys.stdin.read() if "-i" in args else ""
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps({"argv": args, "stdin": stdin}) + "\n")
if args[:2] == ["stack", "services"]:
    site = args[2]
    for name in ("zookeeper-1", "kafka-1", "cassandra-1", "adapter"):
        print(f"{site}_{name} 1/1")
    print(f"{site}_bridge {'0/2' if site == 'site-b' else '2/2'}")
    sys.exit(0)
if args[0] == "run" and "python" in args:
    # The datacenter's MirrorMaker offsets probe (files/mm2_offsets.py): it needs a real Kafka, so print what
    # it prints, key<TAB>value records, for the topics it was given.
    def record(site, p, offset):
        key = json.dumps(["MirrorSourceConnector", {"cluster": site, "partition": p,
                                                    "topic": "temperature-threshold-events"}], separators=(",", ":"))
        return f"{key}\t" + ("null" if offset is None else json.dumps({"offset": offset}))
    topics = args[args.index("-c") + 3:]
    if "mm2-offsets.site-a.internal" in topics:
        print(record("site-a", 0, 3)); print(record("site-a", 0, 7)); print(record("site-a", 1, 19))
    if "mm2-offsets.site-b.internal" in topics:
        print(record("site-b", 0, 9)); print(record("site-b", 1, 19)); print(record("site-b", 2, 29))
    sys.exit(0)
if args[0] == "run":
    script = args[args.index("-c") + 1]
    private = os.environ["FAKE_DOCKER_TMP"] + f"/{os.getpid()}/"
    os.makedirs(private)
    script = script.replace("/tmp/", private).replace("/run/secrets/", os.environ["FAKE_SECRETS"] + "/")
    env = dict(os.environ, PATH=os.environ["FAKE_TOOLS"] + ":" + os.environ["PATH"])
    sys.exit(subprocess.run(["bash", "-c", script], input=stdin, text=True, env=env).returncode)
sys.exit(f"fake docker: unexpected {args}")
'''


def _status(root: Path, sites_with_ca=("datacenter", "site-a", "site-b")):
    """status.yml run with the fake docker, in `root`; the brokers CA that site.yml writes on each manager exists
    for `sites_with_ca` only. Returns (result, docker calls, JSON report or None)."""
    inventory, fake, tools, secrets = root / "inventory", root / "bin", root / "tools", root / "secrets"
    for path in (inventory / "group_vars" / "all", fake, tools, secrets, root / "tmp"):
        path.mkdir(parents=True)
    for site in sites_with_ca:
        (root / "opt" / site).mkdir(parents=True)
        (root / "opt" / site / "kafka_brokers_ca.pem").write_text("a certificate\n")
    (inventory / "hosts.ini").write_text(INVENTORY)
    (inventory / "group_vars" / "all" / "secrets.yml").write_text(SECRETS.replace("{stack_dir}", str(root / "opt")))
    (secrets / "cassandra_password").write_text(CASSANDRA_PASSWORD + "\n")
    (fake / "docker").write_text(FAKE_DOCKER)
    (tools / "fake").write_text(FAKE_TOOLS)
    for name in ("kafka-run-class", "kafka-consumer-groups", "cqlsh"):
        (tools / name).symlink_to(tools / "fake")
    for path in (fake / "docker", tools / "fake"):
        path.chmod(0o755)
    log = root / "docker.log"
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_LOG_PATH="", ANSIBLE_RETRY_FILES_ENABLED="0", FAKE_DOCKER_LOG=str(log),
               FAKE_DOCKER_TMP=str(root / "tmp"), FAKE_TOOLS=str(tools), FAKE_SECRETS=str(secrets),
               PATH=f"{fake}:{BIN}:{os.environ.get('PATH', '')}")
    result = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "ansible/status.yml"),
                             "-e", "ansible_become=false", "-e", "status_sample_seconds=2",
                             "-e", f"status_json_file={root / 'status.json'}", "-e", f"iot_stack_dir={root / 'opt'}",
                             "-e", "ansible_python_interpreter=" + sys.executable],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    report = json.loads((root / "status.json").read_text()) if (root / "status.json").exists() else None
    return result, calls, report


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _status(tmp_path_factory.mktemp("status"))


def _rows(result, report) -> dict[str, dict]:
    assert report is not None, "no JSON report: " + result.stdout[-3000:]
    return lab_status.rows_by_site(report)


def test_the_run_succeeds_and_changes_nothing(run):
    result, _, _ = run
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    recap = lab_status.recap(result.stdout)
    assert set(recap) == {"dc-1", "site-a-1", "site-a-2", "site-b-1"}, result.stdout[-3000:]
    assert all(counts["changed"] == 0 and counts["failed"] == 0 for counts in recap.values()), recap


def test_one_row_per_site_with_the_figures_the_tools_printed(run):
    result, _, report = run
    rows = _rows(result, report)
    assert report["columns"] == list(lab_status.COLUMNS)
    header = next(line for line in result.stdout.splitlines() if "services converged" in line).split()
    assert header[:3] == ["site", "readings/s", "readings"], header                # the table, in column order
    assert list(rows) == ["site-a", "site-b", "datacenter"], result.stdout[-3000:]
    site_a = rows["site-a"]
    assert 12 <= float(site_a["readings/s"]) <= 28, site_a          # 20/s, sampled about 2 s apart
    assert int(site_a["readings in kafka"]) > 3000
    # Partition 0 committed at 100; partitions 1 and 2 have no committed offset and count from 0.
    assert int(site_a["adapter lag"]) == int(site_a["readings in kafka"]) - 100, site_a
    assert site_a["events"] == 60
    # Copied up to 8 of 10 and 20 of 20; nothing of partition 2, whose oldest offset is 5: 2 + 0 + 25.
    assert site_a["relay lag"] == 27, site_a
    assert rows["site-b"]["relay lag"] == 0, rows["site-b"]
    assert site_a["cassandra readings"] == len("temperature_readings") * 10
    assert site_a["cassandra events"] == len("temperature_threshold_events") * 10
    assert site_a["services converged"] == "5/5"
    assert rows["site-b"]["services converged"] == "4/5 (bridge 0/2)"
    datacenter = rows["datacenter"]
    assert datacenter["readings/s"] == "-" and datacenter["cassandra readings"] == "-"   # readings are not relayed
    assert datacenter["cassandra events"] == len("temperature_threshold_events") * 10


def test_passwords_go_on_stdin_never_on_a_command_line_or_in_the_output(run):
    result, calls, _ = run
    assert calls, "the fake docker was never called"
    assert not any(OPERATOR_PASSWORD in arg or CASSANDRA_PASSWORD in arg for call in calls for arg in call["argv"])
    kafka_logins = [call for call in calls if OPERATOR_PASSWORD in call["stdin"]]
    assert len(kafka_logins) == 3, calls                    # site-a's, site-b's and the datacenter's probe
    assert OPERATOR_PASSWORD not in result.stdout + result.stderr
    assert CASSANDRA_PASSWORD not in result.stdout + result.stderr


def test_the_probes_run_on_each_sites_manager_only(run):
    _, calls, _ = run
    services = sorted(call["argv"][2] for call in calls if call["argv"][:2] == ["stack", "services"])
    assert services == ["datacenter", "site-a", "site-b"]


def test_mirrormaker_offsets_are_read_for_every_edge_site_without_committing(run):
    _, calls, _ = run
    (mm2,) = [call for call in calls if "python" in call["argv"]]
    argv = mm2["argv"]
    assert argv[argv.index("-c") + 3:] == ["mm2-offsets.site-a.internal", "mm2-offsets.site-b.internal"]
    assert argv[argv.index("python") - 2] == "timeout"                       # it cannot hang the run
    script = argv[argv.index("-c") + 1]
    assert '"enable.auto.commit": False' in script and '"isolation.level": "read_committed"' in script
    assert json.loads(mm2["stdin"]) == {"user": "operator", "password": OPERATOR_PASSWORD}
    assert OPERATOR_PASSWORD not in " ".join(argv)


def test_a_site_whose_site_yml_did_not_write_the_ca_is_named_with_the_fix(tmp_path):
    """A site that has not run site.yml with this release has no brokers CA on its manager: its row says it did
    not answer, the run names the missing file and site.yml, and no probe of it starts (Docker would say only
    "bind source path does not exist")."""
    result, calls, report = _status(tmp_path, sites_with_ca=("datacenter", "site-a"))
    rows = _rows(result, report)
    assert rows["site-b"]["services converged"] == "no answer", rows["site-b"]
    assert rows["site-a"]["services converged"] == "5/5", rows["site-a"]
    assert f"{tmp_path}/opt/site-b/kafka_brokers_ca.pem is missing on site-b-1" in result.stdout, result.stdout[-3000:]
    assert "ansible/site.yml" in result.stdout
    assert not any(call["argv"][:3] == ["stack", "services", "site-b"] for call in calls)
