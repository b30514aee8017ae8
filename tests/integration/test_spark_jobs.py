"""The Spark jobs in the spark image against the project's real Kafka (local mode).

- threshold-detector: a crafted sequence in, the exact events out; stopped with
  SIGTERM mid-episode and restarted from its checkpoint: no duplicate, no loss.
  A malformed reading lands in dead-letter with its reason.
- rollups: exact one-minute windows.
- notifier: events of two sites (topics found by pattern) joined with the
  registrations; an unregistered sensor still notifies; a webhook that keeps
  failing ends in dead-letter, one that answers gets the text.
"""
from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from tooling.testbed.docker_lab import docker
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "spark"))
from iot_jobs.hysteresis import Limits, SensorState, advance  # noqa: E402

JOBS = "/opt/iot-stack/spark/jobs"
START_TIMEOUT = 420          # Spark starts slowly on two shared cores
T0 = 1_700_000_040_000       # a minute boundary (epoch ms)
THRESHOLDS = {"default": {"threshold": 30.0, "hysteresis": 2.0}, "types": {"oven": {"threshold": 200.0,
                                                                                   "hysteresis": 10.0}}}


@pytest.fixture(scope="module")
def cluster(lab):
    return start_kafka_cluster(lab)


def produce(cluster, topic: str, records: list[tuple[str, object]], headers: list | None = None) -> None:
    producer = Producer({"bootstrap.servers": cluster.external, "acks": "all", "enable.idempotence": True})
    for key, value in records:
        payload = value if isinstance(value, bytes) or value is None else json.dumps(value)
        producer.produce(topic, key=key, value=payload, headers=headers)
    assert producer.flush(30) == 0


def consume(cluster, topic: str, until: int, timeout: float = START_TIMEOUT, linger: float = 8,
            pattern: bool = False) -> list:
    """Read `topic` from the start until `until` records arrived, then `linger` seconds more (to see duplicates)."""
    consumer = Consumer({"bootstrap.servers": cluster.external, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([f"^{topic}" if pattern else topic])
    seen, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                if msg.error() is None:
                    seen.append(msg)
            if len(seen) >= until:
                deadline = min(deadline, time.monotonic() + linger)
    finally:
        consumer.close()
    return seen


def job_env(cluster, **extra: str) -> dict[str, str]:
    return {"KAFKA_BOOTSTRAP_SERVERS": cluster.internal, "SITE": "site-a", "CHECKPOINT_DIR": "/checkpoints",
            "STARTING_OFFSETS": "earliest", **extra}


def checkpoint_dir(tmp_path: Path) -> str:
    path = tmp_path / "checkpoints"
    path.mkdir()
    os.chmod(path, 0o777)        # the job runs as `app` (uid 1000)
    return str(path)


def start_job(lab, name: str, job: str, env: dict, checkpoints: str, volumes: dict | None = None) -> str:
    return lab.run("spark", name, "submit", "--name", job, f"{JOBS}/{job.replace('-', '_')}.py",
                   env=env, volumes={checkpoints: "/checkpoints", **(volumes or {})}, memory="2g")


def stop_gracefully(lab, name: str) -> None:
    """docker stop (SIGTERM) and require a clean exit: the query stopped between micro-batches."""
    cname = f"{lab.network}-{name}"
    docker("stop", "-t", "90", cname, timeout=150)
    code = docker("inspect", "-f", "{{.State.ExitCode}}", cname).stdout.strip()
    logs = lab.logs(name, tail=400)
    assert code == "0", f"{name} exited {code}:\n{logs}"
    assert "stopping: signal received" in logs and "stopped query=threshold-events" in logs, logs


def event_tuple(msg) -> tuple:
    e = json.loads(msg.value())
    return (msg.key().decode(), e["site"], e["timestamp"], e["is_first"], e["is_last"], e["exceeded_for_ms"],
            e["first_transgression"], e["last_transgression"], round(e["average_transgression"], 6),
            e["max_transgression"], e["temperature_threshold"])


def reading(sensor: str, second: int, value: float, unit: str = "C") -> tuple[str, dict]:
    return sensor, {"sensor_id": sensor, "timestamp": T0 + second * 1000, "temperature": value, "unit": unit}


# Part 1 opens episodes of s1 (in Fahrenheit: 89.6 F = 32 C) and of the oven; part 2 closes them after the restart.
PART_1 = [reading("s1", 0, 77.0, "F"), reading("s1", 1, 89.6, "F"), reading("s2", 1, 20.0),
          reading("oven", 1, 480.15, "K"), reading("s1", 2, 29.0), reading("s2", 2, 31.0),
          reading("s2", 3, 27.5)]
PART_2 = [reading("s1", 3, 303.15 + 3, "K"), reading("s1", 1, 0.0),     # late: ignored
          reading("s1", 4, 28.5), reading("s1", 5, 27.9), reading("s2", 4, 40.0), reading("s1", 6, 35.0),
          reading("oven", 2, 195.0), reading("oven", 3, 189.0)]


def expected_events(records) -> list[tuple]:
    states, out = {}, []
    for sensor, r in records:
        value = r["temperature"]
        celsius = {"C": value, "F": (value - 32) * 5 / 9, "K": value - 273.15}[r["unit"]]
        limits = Limits(**THRESHOLDS["types"]["oven"]) if sensor == "oven" else Limits(30.0, 2.0)
        states[sensor], e = advance(states.get(sensor, SensorState()), r["timestamp"], celsius, limits)
        if e:
            out.append((sensor, "site-a", e.timestamp, e.is_first, e.is_last, e.exceeded_for_ms,
                        e.first_transgression, e.last_transgression, round(e.average_transgression, 6),
                        e.max_transgression, e.temperature_threshold))
    return out


def test_threshold_detector_emits_exact_events_and_resumes_from_checkpoint_without_duplicates(lab, cluster,
                                                                                                  tmp_path):
    create_topics(cluster, "temperature-data", "temperature-threshold-events", "dead-letter")
    create_topics(cluster, "sensor-registration", partitions=1, config={"cleanup.policy": "compact"})
    produce(cluster, "sensor-registration", [("oven", {"sensor_id": "oven", "name": "Oven probe",
                                                       "device_id": "d1", "sensor_type_id": "oven"})])
    produce(cluster, "temperature-data", PART_1, headers=[("site", b"site-a")])
    produce(cluster, "temperature-data", [("s3", b'{"sensor_id": "s3", "timestamp": 1, "unit": "C"}')])
    checkpoints = checkpoint_dir(tmp_path)
    env = job_env(cluster, THRESHOLDS=json.dumps(THRESHOLDS))

    first = expected_events(PART_1)
    assert [(e[0], e[3]) for e in first] == [("s1", True), ("oven", True), ("s2", True), ("s2", False)]
    start_job(lab, "detector-1", "threshold-detector", env, checkpoints)
    seen = consume(cluster, "temperature-threshold-events", until=len(first))
    assert sorted(map(event_tuple, seen)) == sorted(first), lab.logs("detector-1", tail=1000)
    stop_gracefully(lab, "detector-1")

    produce(cluster, "temperature-data", PART_2, headers=[("site", b"site-a")])
    everything = expected_events(PART_1 + PART_2)
    start_job(lab, "detector-2", "threshold-detector", env, checkpoints)
    seen = consume(cluster, "temperature-threshold-events", until=len(everything))
    assert sorted(map(event_tuple, seen)) == sorted(everything), lab.logs("detector-2", tail=1000)
    # The episode open across the restart closed with statistics spanning both runs.
    s1_close = next(e for e in everything if e[0] == "s1" and e[4])
    assert s1_close[2] == T0 + 5000 and s1_close[6] == T0 + 1000 and s1_close[9] == pytest.approx(33.0)
    assert all(dict(m.headers())["site"] == b"site-a" for m in seen)

    dead = consume(cluster, "dead-letter", until=1, timeout=60, linger=2)
    assert [(m.key(), dict(m.headers())["dlq_reason"]) for m in dead] == [
        (b"s3", b"contract_violation: missing or invalid field 'temperature' (number)")]
    stop_gracefully(lab, "detector-2")


def test_rollups_job_writes_exact_one_minute_windows(lab, cluster, tmp_path):
    create_topics(cluster, "rollup-input", "temperature-rollups-1m")
    minute = [reading("r1", 5, 20.0), reading("r1", 30, 71.6, "F"), reading("r2", 59, 300.0, "K"),
              reading("r1", 61, 30.0), reading("r1", 200, 0.0)]   # the last one moves the watermark past 120 s
    produce(cluster, "rollup-input", minute, headers=[("site", b"site-a")])
    start_job(lab, "rollups", "rollups", job_env(cluster, READINGS_TOPIC="rollup-input",
                                                  ROLLUP_WATERMARK="10 seconds"), checkpoint_dir(tmp_path))
    seen = consume(cluster, "temperature-rollups-1m", until=3)
    got = sorted((m.key().decode(), *(round(v, 6) if isinstance(v, float) else v
                                        for v in json.loads(m.value()).values())) for m in seen)
    assert got == [
        ("r1", "r1", "site-a", T0, T0 + 60_000, 2, 21.0, 20.0, 22.0),
        ("r1", "r1", "site-a", T0 + 60_000, T0 + 120_000, 1, 30.0, 30.0, 30.0),
        ("r2", "r2", "site-a", T0, T0 + 60_000, 1, 26.85, 26.85, 26.85),
    ], lab.logs("rollups", tail=200)


HOOK = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ok = "site-b" not in body["text"]
        print("HOOK", "ok" if ok else "fail", json.dumps(body), flush=True)
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"ok": true}' if ok else b'{"ok": false}')
HTTPServer(("0.0.0.0", 8443), H).serve_forever()
"""


def test_notifier_joins_registrations_of_every_site_and_dead_letters_failed_webhook(lab, cluster, tmp_path):
    hook = tmp_path / "hook.py"
    hook.write_text(HOOK)
    os.chmod(tmp_path, 0o755)
    lab.run("spark", "webhook", "python", "/hook/hook.py", volumes={str(tmp_path): "/hook:ro"}, memory="256m")
    create_topics(cluster, "notifications", "notifier-dead-letter")
    for site in ("site-a", "site-b"):
        create_topics(cluster, f"{site}.temperature-threshold-events")
        create_topics(cluster, f"{site}.sensor-registration", f"{site}.device-registration", partitions=1,
                      config={"cleanup.policy": "compact"})
    produce(cluster, "site-a.device-registration", [("d1", {"device_id": "d1", "name": "Boiler 3",
                                                            "location": "Hall 2"})])
    produce(cluster, "site-a.sensor-registration", [("n1", {"sensor_id": "n1", "name": "Boiler probe",
                                                            "device_id": "d1", "sensor_type_id": "t"})])
    event = {"sensor_id": "n1", "site": "site-a", "timestamp": T0 + 65_000, "temperature_threshold": 30.0,
             "average_transgression": 31.5, "max_transgression": 33.0, "exceeded_for_ms": 65_000,
             "first_transgression": T0, "last_transgression": T0 + 60_000, "is_first": False, "is_last": True}
    # Older than the job's starting lookback (record time two hours ago): never announced.
    old = Producer({"bootstrap.servers": cluster.external, "acks": "all"})
    old.produce("site-a.temperature-threshold-events", key="n0", value=json.dumps({**event, "sensor_id": "n0"}),
                timestamp=int(time.time() * 1000) - 2 * 3600_000)
    assert old.flush(30) == 0
    produce(cluster, "site-a.temperature-threshold-events", [("n1", event)])
    produce(cluster, "site-b.temperature-threshold-events", [("n7", {**event, "sensor_id": "n7", "site": "site-b"})])
    start_job(lab, "notifier", "notifier", job_env(cluster, SITE="datacenter", STARTING_OFFSETS="1 hour ago",
                                                    WEBHOOK_URL="http://webhook:8443/bot1:x/sendMessage",
                                                    WEBHOOK_CHAT_ID="42", WEBHOOK_ATTEMPTS="2",
                                                    WEBHOOK_BACKOFF_SECONDS="0.2",
                                                    DEAD_LETTER_TOPIC="notifier-dead-letter"),
              checkpoint_dir(tmp_path))
    seen = consume(cluster, "notifications", until=2)
    texts = sorted(json.loads(m.value())["text"] for m in seen)
    assert texts == [
        "[site-a] Sensor 'Boiler probe' (n1) on device 'Boiler 3' (d1) at Hall 2 stopped exceeding 30.0 °C at "
        "2023-11-14 22:15:05 UTC after 1 min 5 s: average 31.5 °C, maximum 33.0 °C.",
        "[site-b] Sensor n7 (not registered) on an unknown device stopped exceeding 30.0 °C at "
        "2023-11-14 22:15:05 UTC after 1 min 5 s: average 31.5 °C, maximum 33.0 °C.",
    ], lab.logs("notifier", tail=200)
    dead = consume(cluster, "notifier-dead-letter", until=1, timeout=120, linger=2)
    assert [m.key() for m in dead] == [b"n7"]
    assert dict(dead[0].headers())["dlq_reason"].startswith(
        b"webhook_failed: webhook failed after 2 attempt(s): HTTP 503")
    hook_log = lab.logs("webhook")
    assert hook_log.count("HOOK ok") == 1 and hook_log.count("HOOK fail") == 2, hook_log
    assert '"chat_id": "42"' in hook_log
