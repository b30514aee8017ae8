"""The lab's alert receiver program (tooling/testbed/alert_receiver.py run as a program, as lab.start_alert_receiver
runs it in a container) logs every notification it gets as a JSON line, refuses a body that is no JSON, and
AlertLog reads back what arrived from a given time on."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tooling.build import pins
from tooling.testbed.alert_receiver import AlertLog

PROGRAM = pins.REPO_ROOT / "tooling/testbed/alert_receiver.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: bytes) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/alerts", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def _note(name: str, status: str = "firing") -> bytes:
    return json.dumps({"status": status, "alerts": [{"labels": {"alertname": name, "site": "site-a"}}]}).encode()


@pytest.fixture
def receiver(tmp_path):
    port = _free_port()
    log = tmp_path / "notifications.jsonl"
    # The program runs with the standard library only, as in the services image.
    proc = subprocess.Popen([sys.executable, "-I", str(PROGRAM), "--host", "127.0.0.1", "--port", str(port),
                             "--log", str(log)], stdout=subprocess.PIPE, text=True)
    assert "listening" in proc.stdout.readline()
    yield port, log
    proc.terminate()
    proc.wait(timeout=10)


def test_each_notification_is_logged_and_read_back_from_a_time_on(receiver):
    port, log = receiver
    assert _post(port, _note("KafkaBrokerDown")) == 200
    between = time.time()
    assert _post(port, _note("KafkaBrokerDown", "resolved")) == 200
    assert _post(port, b"not json") == 400
    everything = AlertLog(log)
    assert [n["status"] for n in everything.notifications] == ["firing", "resolved"]
    assert [n["status"] for n in AlertLog(log, since=between).about("KafkaBrokerDown")] == ["resolved"]
    assert everything.about("KafkaBrokerDown", "firing")[0]["alerts"][0]["labels"]["site"] == "site-a"
    assert everything.about("ServiceDown") == []


def test_a_log_not_written_yet_reads_as_nothing(tmp_path):
    assert AlertLog(tmp_path / "none.jsonl").received() == []
