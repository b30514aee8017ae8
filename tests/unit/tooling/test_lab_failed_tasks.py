"""`scripts/lab up` names each failure that stopped a host, with its task and message, even when the run goes on
for twenty minutes on the other hosts: a CI run's error showed only the datacenter's last retries, and the
sites' failure (a timed-out overlay attach) had to be dug out of the ansible log."""
from __future__ import annotations

from tooling.lab.lab import failed_tasks

# Shaped like that run's output (ansible's YAML callback), shortened.
OUTPUT = """\
TASK [stack : Ensure the Kafka principals and their ACLs] **********************
ok: [site-a-1]
TASK [stack : Stop when the Kafka principals or ACLs could not be ensured] *****
skipping: [dc-1]
fatal: [site-b-1]: FAILED! =>
    changed: false
    msg: 'Kafka users and ACLs of kafka-1:9092 not ensured (exit 125): docker: Error response
        from daemon: attaching to network failed'

TASK [topics : Create the site's missing Kafka topics] *************************
fatal: [dc-1]: FAILED! => {"changed": false, "msg": "probe"}
...ignoring
TASK [health : Wait until every service runs all its replicas] *****************
FAILED - RETRYING: [dc-1]: Wait until every service runs all its replicas (144 retries left).
failed: [dc-1] (item=cassandra-1) => {"msg": "down"}
ok: [dc-1]
PLAY RECAP *********************************************************************
site-b-1                   : ok=69   changed=15   unreachable=0    failed=1    skipped=29
""".splitlines()


def test_each_failure_comes_with_its_task_and_its_message():
    assert failed_tasks(OUTPUT) == [
        "TASK [stack : Stop when the Kafka principals or ACLs could not be ensured]",
        "fatal: [site-b-1]: FAILED! =>",
        "    changed: false",
        "    msg: 'Kafka users and ACLs of kafka-1:9092 not ensured (exit 125): docker: Error response",
        "        from daemon: attaching to network failed'",
        "TASK [health : Wait until every service runs all its replicas]",
        'failed: [dc-1] (item=cassandra-1) => {"msg": "down"}',
    ]


def test_a_run_without_failures_reports_none():
    assert failed_tasks([line for line in OUTPUT if not line.startswith(("fatal", "failed", "    "))]) == []
