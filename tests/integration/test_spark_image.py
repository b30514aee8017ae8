"""The spark image runs structured streaming against the project's real Kafka.

A query in the image reads a topic with the baked-in Kafka connector and writes
transformed records back, once in local mode and once submitted to a standalone
master and worker started from the same image.
"""
from __future__ import annotations

import json
import secrets as secrets_module
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from tooling.build import pins
from tooling.testbed.docker_lab import docker, free_port, image, wait_until
from tooling.testbed.kafka_cluster import create_topics, start_kafka_cluster

RECORDS = 100
JOB = Path(__file__).with_name("spark_smoke_job.py")
JOB_IN_CONTAINER = "/opt/smoke/spark_smoke_job.py"
# Spark starts slowly on two cores with Kafka running beside it.
JOB_TIMEOUT = 420


@pytest.fixture(scope="module")
def cluster(lab):
    return start_kafka_cluster(lab)


def reading(i: int) -> dict:
    return {"sensor": f"s{i % 5}", "seq": i, "celsius": i * 0.5 - 10}


def expected(i: int) -> dict:
    r = reading(i)
    return {**r, "fahrenheit": r["celsius"] * 9 / 5 + 32}


def produce_readings(cluster, topic: str) -> None:
    producer = Producer({"bootstrap.servers": cluster.external, "acks": "all", "enable.idempotence": True})
    failures = []
    for i in range(RECORDS):
        producer.produce(topic, key=f"s{i % 5}", value=json.dumps(reading(i)),
                         on_delivery=lambda err, _msg: err and failures.append(err))
        producer.poll(0)
    assert producer.flush(30) == 0
    assert failures == []


def consume_all(cluster, topic: str, count: int, timeout: float = 60) -> list[tuple[str, dict]]:
    consumer = Consumer({"bootstrap.servers": cluster.external, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen: list[tuple[str, dict]] = []
    deadline = time.monotonic() + timeout
    try:
        # Keep reading a few seconds after `count` arrived so duplicates would show up too.
        while time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=1.0):
                assert msg.error() is None, msg.error()
                seen.append((msg.key().decode(), json.loads(msg.value())))
            if len(seen) >= count:
                deadline = min(deadline, time.monotonic() + 5)
    finally:
        consumer.close()
    return seen


def start_job(lab, name: str, cluster, topic_in: str, topic_out: str, *submit_args: str,
              env: dict[str, str] | None = None, volumes: dict[str, str] | None = None) -> str:
    """Start the smoke job with the image's `submit` role; returns the container's name."""
    return lab.run("spark", name, "submit", *submit_args, JOB_IN_CONTAINER,
                   "--bootstrap", cluster.internal, "--input", topic_in, "--output", topic_out,
                   "--checkpoint", f"/var/lib/spark/checkpoints/{topic_in}",
                   env=env, volumes={str(JOB): f"{JOB_IN_CONTAINER}:ro", **(volumes or {})}, memory="2g")


def run_job_to_completion(lab, name: str, cluster, topic_in: str, topic_out: str, *submit_args: str,
                          env: dict[str, str] | None = None, volumes: dict[str, str] | None = None) -> None:
    """Start the smoke job and wait for the driver to exit 0."""
    cname = start_job(lab, name, cluster, topic_in, topic_out, *submit_args, env=env, volumes=volumes)
    wait_until(f"spark job {name} to finish",
               lambda: docker("inspect", "-f", "{{.State.Running}}", cname).stdout.strip() == "false",
               timeout=JOB_TIMEOUT, interval=2, on_timeout=lambda: lab.logs(name, tail=200))
    code = docker("inspect", "-f", "{{.State.ExitCode}}", cname).stdout.strip()
    assert code == "0", f"spark job {name} exited {code}:\n{lab.logs(name, tail=200)}"


def assert_exact_output(cluster, topic_out: str) -> None:
    seen = consume_all(cluster, topic_out, RECORDS)
    assert sorted(seen, key=lambda kv: kv[1]["seq"]) == [(f"s{i % 5}", expected(i)) for i in range(RECORDS)]


def test_spark_image_imports_the_python_stack_as_app_user():
    result = docker("run", "--rm", image("spark"), "python", "-c",
                    "import os, pyspark, pandas, pyarrow, grpc, google.protobuf, services; "
                    "print(os.getuid(), pyspark.__version__)")
    assert result.stdout.split() == ["1000", pins.load().versions["spark"]], result.stderr


def test_spark_worker_refuses_to_start_without_master_url():
    result = docker("run", "--rm", image("spark"), "worker", check=False)
    assert result.returncode == 64
    assert "SPARK_MASTER_URL is required" in result.stderr


def test_streaming_query_in_local_mode_moves_kafka_records_through_the_connector(lab, cluster):
    topic_in, topic_out = f"local-in-{uuid.uuid4().hex[:6]}", f"local-out-{uuid.uuid4().hex[:6]}"
    create_topics(cluster, topic_in, topic_out)
    produce_readings(cluster, topic_in)
    run_job_to_completion(lab, "spark-local-job", cluster, topic_in, topic_out)
    assert_exact_output(cluster, topic_out)


def test_streaming_query_submitted_to_standalone_master_and_worker_moves_kafka_records(lab, cluster, tmp_path):
    """As a site runs Spark in cluster mode: master, worker and job share the site's secret
    (spark.authenticate, RPC encrypted); a job without it is refused by the master."""
    topic_in, topic_out = f"cluster-in-{uuid.uuid4().hex[:6]}", f"cluster-out-{uuid.uuid4().hex[:6]}"
    create_topics(cluster, topic_in, topic_out)
    produce_readings(cluster, topic_in)
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o755)
    (secrets / "spark_auth_secret").write_text(secrets_module.token_hex(24) + "\n")
    (secrets / "spark_auth_secret").chmod(0o644)          # the container's uid 1000 reads it (a test secret)
    auth = {"SPARK_AUTHENTICATE_SECRET_FILE": "/run/secrets/spark_auth_secret"}
    mount = {str(secrets): "/run/secrets:ro"}

    ui_port = free_port()
    lab.run("spark", "spark-master", "master", ports={ui_port: 8080}, memory="1g", env=auth, volumes=mount)
    lab.run("spark", "spark-worker", "worker", memory="2g", volumes=mount, env={
        "SPARK_MASTER_URL": "spark://spark-master:7077", "SPARK_WORKER_CORES": "2", "SPARK_WORKER_MEMORY": "1g",
        **auth})

    def master_state() -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
            return json.load(response)

    wait_until("spark worker registered with the master", lambda: master_state()["aliveworkers"] == 1,
               timeout=180, interval=2, on_timeout=lambda: lab.logs("spark-master") + lab.logs("spark-worker"))

    run_job_to_completion(lab, "spark-cluster-job", cluster, topic_in, topic_out,
                          "--conf", "spark.executor.memory=768m",
                          env={"SPARK_MASTER_URL": "spark://spark-master:7077", **auth}, volumes=mount)
    assert_exact_output(cluster, topic_out)
    # The records went through an executor on the worker, not a local driver.
    completed = [app["name"] for app in master_state()["completedapps"]]
    assert f"smoke-{topic_in}" in completed, (completed, lab.logs("spark-worker"))

    # Without the secret the master does not let the driver in: it never becomes an application.
    start_job(lab, "spark-intruder-job", cluster, topic_in, f"intruder-{topic_out}",
              "--conf", "spark.executor.memory=768m", env={"SPARK_MASTER_URL": "spark://spark-master:7077"})
    wait_until("the driver without the secret to fail to connect to the master",
               lambda: "Failed to connect to master" in lab.logs("spark-intruder-job", tail=400),
               timeout=JOB_TIMEOUT, interval=2, on_timeout=lambda: lab.logs("spark-intruder-job", tail=200))
    state = master_state()
    assert f"smoke-{topic_in}" not in [app["name"] for app in state["activeapps"]], state["activeapps"]
    assert [app["name"] for app in state["completedapps"]].count(f"smoke-{topic_in}") == 1
