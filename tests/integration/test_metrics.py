"""Metrics from the real JVMs: the kafka image's ZooKeeper (standalone and a three-server ensemble),
broker and MirrorMaker 2, and the cassandra image, each with the JMX exporter on (JMX_EXPORTER_PORT),
export every metric name the alert rules of monitoring/rules/ use for that component; the agent is
off without the variable; the prometheus image starts as the app user, loads the rules and answers
/-/ready, and its promtool checks them. That Prometheus runs the scrape configuration the stack role
renders for a one-node datacenter (each JVM answers to its stack name: zookeeper-1, kafka-1, ...): it
scrapes every JVM, serves the status page with their figures, and fires KafkaBrokerDown once the
broker has been stopped for the rule's two minutes (the module's last test).

Every container starts at once and the tests then wait for each (Cassandra's start dominates)."""
from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import time
import urllib.parse
import urllib.request

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tooling.testbed import alert_rules, certs, stack_render
from tooling.testbed.docker_lab import docker, free_port, wait_until
from tooling.testbed.kafka_cluster import MM2_SINGLE_BROKER

EXPORTER = "9404"
ENSEMBLE = " ".join(f"server.{i}=zk{i}:2888:3888;2181" for i in (1, 2, 3))
RELAYED = "relayed"
# MirrorMaker copies RELAYED from the broker to itself (alias src -> dst: topic src.relayed); no
# heartbeats, which on one cluster would be copied again and again (src.src.heartbeats, ...).
MM2_PROPERTIES = f"""
clusters = src, dst
src.bootstrap.servers = kafka:9092
dst.bootstrap.servers = kafka:9092
src->dst.enabled = true
src->dst.topics = {RELAYED}
dst->src.enabled = false
emit.heartbeats.enabled = false
emit.checkpoints.enabled = false
sync.group.offsets.enabled = false
sync.topic.acls.enabled = false
refresh.topics.interval.seconds = 5
{MM2_SINGLE_BROKER}
"""


def scrape_config(directory) -> str:
    """prometheus.yml.j2 as the stack role renders it for a one-node datacenter, scraping every 5 s, less
    what needs the site's certificate and login (its self-scrape, the sites' federation, its Alertmanager;
    the lab tests and test_alert_delivery.py / test_fleet.py cover those); the directory it is written
    to, mounted read-only into the container."""
    host = {"swarm_role": "manager", "zookeeper_id": 1, "kafka_id": 1, "cassandra_id": 1, "apps_node": True,
            "ansible_host": "127.0.0.1", "group_names": ["datacenter"]}
    rendered = stack_render.render_role_template(
        "prometheus.yml.j2", {"dc-1": host}, {"datacenter": ["dc-1"], "edge": [], "all": ["dc-1"]}, "datacenter",
        "datacenter", stack_prometheus_scrape_interval="5s", iot_site_alias="test")
    config = yaml.safe_load(rendered)
    config["scrape_configs"] = [job for job in config["scrape_configs"]
                                if job["job_name"] not in ("prometheus", "alertmanager", "federate")]
    config.pop("alerting")
    directory.chmod(0o755)
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    (directory / "prometheus.yml").chmod(0o644)
    return str(directory)


@pytest.fixture(scope="module", autouse=True)
def _metrics_pki(tmp_path_factory):
    """The site's metrics PKI (tooling/testbed/certs.py metrics_pki), for the module's containers and scrapes."""
    PKI.update(certs.metrics_pki(tmp_path_factory.mktemp("metrics-pki")))


PKI: dict[str, str] = {}


def _fetch(port: int, password: str | None) -> tuple[int, str]:
    """(status, body) of GET /metrics on 127.0.0.1:port over HTTPS, checking the certificate against the
    metrics CA and the name metrics-exporter (as the stack's scrape jobs do), with the login if given."""
    context = ssl.create_default_context(cafile=f"{PKI['prometheus']}/metrics_ca.pem")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
            context.wrap_socket(raw, server_hostname="metrics-exporter") as conn:
        login = f"Authorization: Basic {base64.b64encode(f'prometheus:{password}'.encode()).decode()}\r\n"
        conn.sendall(f"GET /metrics HTTP/1.0\r\n{login if password else ''}\r\n".encode())
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def scrape(port: int) -> dict[str, list[tuple[str, float]]]:
    """{metric name: [(labels, value), ...]} from a JMX exporter's /metrics on 127.0.0.1:port, as Prometheus
    reads it (HTTPS, its login)."""
    status, text = _fetch(port, PKI["password"])
    assert status == 200, f"/metrics on {port} answered {status}"
    found: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(\{.*\})?\s+(\S+)", line)
        if match and not line.startswith("#"):
            found.setdefault(match[1], []).append((match[2] or "", float(match[3])))
    return found


def used_by(component: str) -> set[str]:
    return alert_rules.names_by_owner()[component] | {"process_start_time_seconds"}


@pytest.fixture(scope="module")
def ports(lab, tmp_path_factory, _metrics_pki):
    ports = {name: free_port() for name in ("zookeeper", "zk1", "zk2", "zk3", "kafka", "kafka-external",
                                             "mirrormaker", "cassandra", "prometheus")}
    # As the stack runs them: HTTPS with the metrics CA's certificate, to Prometheus' login only.
    on = {"JMX_EXPORTER_PORT": EXPORTER, "JMX_EXPORTER_KEYSTORE": "/run/secrets/metrics_keystore.pem",
          "JMX_EXPORTER_PASSWORD_FILE": "/run/secrets/metrics_password"}
    secrets = {PKI["exporter"]: "/run/secrets:ro"}
    exporter = {name: {ports[name]: int(EXPORTER)} for name in ports}
    lab.run("cassandra", "cassandra", memory="1536m", ports=exporter["cassandra"], aliases=("cassandra-1",),
            env={**on, "CASSANDRA_FAST_START": "1", "CASSANDRA_HEAP": "512M"}, volumes=secrets)
    lab.run("kafka", "zookeeper", "zookeeper", memory="384m", ports=exporter["zookeeper"], env=on,
            aliases=("zookeeper-1",), volumes=secrets)
    for i in (1, 2, 3):
        lab.run("kafka", f"zk{i}", "zookeeper", memory="256m", ports=exporter[f"zk{i}"], volumes=secrets,
                env={**on, "ZOO_MY_ID": str(i), "ZOO_SERVERS": ENSEMBLE, "ZOO_HEAP_OPTS": "-Xms32m -Xmx96m"})
    lab.run("kafka", "kafka", "kafka", memory="1g", aliases=("kafka-1",), volumes=secrets,
            ports={**exporter["kafka"], ports["kafka-external"]: 9094},
            env={**on, "KAFKA_BROKER_ID": "1", "KAFKA_ZOOKEEPER_CONNECT": "zookeeper:2181",
                 "KAFKA_ADVERTISED_LISTENERS": f"INTERNAL://kafka:9092,EXTERNAL://127.0.0.1:{ports['kafka-external']}",
                 "KAFKA_INTERNAL_PLAINTEXT": "1", "KAFKA_EXTERNAL_PLAINTEXT": "1",
                 "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1", "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "3",
                 "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
                 "KAFKA_HEAP_OPTS": "-Xms128m -Xmx384m"})
    lab.run("prometheus", "prometheus", memory="512m", ports={ports["prometheus"]: 9090},
            env={"PROMETHEUS_CONFIG": "/etc/iot-test/prometheus.yml"},
            volumes={scrape_config(tmp_path_factory.mktemp("prometheus")): "/etc/iot-test:ro",
                     PKI["prometheus"]: "/run/secrets:ro"})
    # The same image and role with the variable unset: no agent.
    lab.run("kafka", "zookeeper-plain", "zookeeper", memory="256m", env={"ZOO_HEAP_OPTS": "-Xmx64m"})

    bootstrap = f"127.0.0.1:{ports['kafka-external']}"

    def topic_created() -> bool:
        admin = AdminClient({"bootstrap.servers": bootstrap})    # kept while the future runs
        futures = admin.create_topics([NewTopic(RELAYED, 2, 1)])
        try:
            futures[RELAYED].result(timeout=20)
        except Exception as err:  # noqa: BLE001 - the broker may still be starting
            if "TOPIC_ALREADY_EXISTS" not in str(err):
                raise
        return True

    wait_until("kafka broker takes a topic", topic_created, timeout=180, interval=3,
               on_timeout=lambda: lab.logs("zookeeper") + lab.logs("kafka"))
    config_dir = tmp_path_factory.mktemp("mm2")
    config_dir.chmod(0o755)
    (config_dir / "mm2.properties").write_text(MM2_PROPERTIES)
    (config_dir / "mm2.properties").chmod(0o644)
    lab.run("kafka", "mirrormaker", "mirrormaker", memory="768m", ports=exporter["mirrormaker"],
            env={**on, "MM2_CONFIG": "/etc/mirrormaker/mm2.properties", "MM2_HEAP_OPTS": "-Xms128m -Xmx384m"},
            volumes={str(config_dir): "/etc/mirrormaker:ro", **secrets})
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce(RELAYED, key=str(i), value=f"reading-{i}")
    assert producer.flush(30) == 0
    return ports


def wait_for_names(lab, container: str, port: int, names: set[str], timeout: float = 120) -> dict:
    """The scrape of `port` once it has every name of `names` (JVMs register some MBeans late)."""
    seen: dict = {}

    def complete() -> bool:
        seen.clear()
        seen.update(scrape(port))
        return names <= set(seen)

    wait_until(f"{container}'s /metrics with {sorted(names)}", complete, timeout=timeout, interval=3,
               on_timeout=lambda: f"missing: {sorted(names - set(seen))}\n{lab.logs(container)}")
    return seen


def test_standalone_zookeeper_exports_what_the_rules_use(lab, ports):
    metrics = wait_for_names(lab, "zookeeper", ports["zookeeper"], used_by("zookeeper"))
    assert metrics["zookeeper_serving"] == [('{role="standalone"}', 1.0)]


def test_zookeeper_ensemble_exports_one_leader_two_followers_and_its_size(lab, ports):
    def roles_now() -> list[str]:
        roles = []
        for i in (1, 2, 3):
            metrics = wait_for_names(lab, f"zk{i}", ports[f"zk{i}"],
                                     used_by("zookeeper") | {"zookeeper_quorum_size"})
            assert metrics["zookeeper_quorum_size"] == [(f'{{server_id="{i}"}}', 3.0)]
            [(labels, value)] = metrics["zookeeper_serving"]
            assert value == 1.0 and f'server_id="{i}"' in labels
            roles.append(re.search(r'role="(\w+)"', labels)[1])
        return sorted(roles)

    # The three are scraped one after the other: a CI run read two leaders while the new ensemble re-elected
    # (zk1 led, then zk2). Each round is retried for a while; the last one must show one leader.
    deadline = time.monotonic() + 60
    while (roles := roles_now()) != ["Follower", "Follower", "Leader"] and time.monotonic() < deadline:
        time.sleep(3)
    assert roles == ["Follower", "Follower", "Leader"]


def test_kafka_broker_exports_what_the_rules_use(lab, ports):
    metrics = wait_for_names(lab, "kafka", ports["kafka"], used_by("kafka"))
    assert metrics["kafka_controller_activecontrollercount"] == [("", 1.0)]
    assert metrics["kafka_server_replicamanager_underreplicatedpartitions"] == [("", 0.0)]
    topics = {labels for labels, _ in metrics["kafka_server_brokertopicmetrics_messagesin_total"]}
    assert f'{{topic="{RELAYED}"}}' in topics


def test_mirrormaker_exports_replication_latency_and_lag_per_partition(lab, ports):
    metrics = wait_for_names(lab, "mirrormaker", ports["mirrormaker"], used_by("mirrormaker"), timeout=150)
    lag = {labels for labels, _ in metrics["kafka_connect_mirror_source_consumer_records_lag"]}
    assert {f'{{flow="src->dst",partition="{p}",topic="{RELAYED}"}}' for p in (0, 1)} <= lag

    def copied() -> bool:   # the latency is NaN until MirrorMaker has copied a record of the window
        latency = scrape(ports["mirrormaker"])["kafka_connect_mirror_source_replication_latency_ms_max"]
        return any(value == value and f'topic="src.{RELAYED}"' in labels for labels, value in latency)

    wait_until("MirrorMaker's replication latency of copied records", copied, timeout=90, interval=3,
               on_timeout=lambda: lab.logs("mirrormaker"))


def test_cassandra_exports_what_the_rules_use(lab, ports):
    metrics = wait_for_names(lab, "cassandra", ports["cassandra"], used_by("cassandra"), timeout=240)
    assert dict(metrics["cassandra_endpoints"]) == {'{state="up"}': 1.0, '{state="down"}': 0.0}


def test_exporter_is_off_without_jmx_exporter_port(lab, ports):
    def java_runs() -> bool:
        return "QuorumPeerMain" in command_lines()

    def command_lines() -> str:
        return lab.exec("zookeeper-plain", "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout

    wait_until("ZooKeeper without the exporter", java_runs, timeout=60, on_timeout=lambda: lab.logs("zookeeper-plain"))
    assert "-javaagent" not in command_lines()
    assert "jmx_prometheus_javaagent" in lab.exec("zookeeper", "sh", "-c", "cat /proc/[0-9]*/cmdline").stdout


def test_a_jmx_exporter_answers_only_prometheus_login_over_tls(lab, ports):
    wait_for_names(lab, "zookeeper", ports["zookeeper"], {"process_start_time_seconds"})
    assert _fetch(ports["zookeeper"], None)[0] == 401
    assert _fetch(ports["zookeeper"], "not-the-password-of-the-site")[0] == 401
    with socket.create_connection(("127.0.0.1", ports["zookeeper"]), timeout=10) as conn:
        conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        answer = conn.recv(4096)
    assert b"process_start_time_seconds" not in answer, "the exporter answered a clear-text request"
    # The keystore and the rules with the login live in the container's run directory, for its user alone.
    listed = lab.exec("zookeeper", "stat", "-c", "%a %n", "/opt/kafka/run/jmx-exporter.p12",
                      "/opt/kafka/run/jmx-exporter.yml").stdout.split("\n")
    assert all(line.startswith("600 ") for line in listed if line), listed


def test_prometheus_image_loads_the_rules_and_answers_ready(lab, ports):
    base = f"http://127.0.0.1:{ports['prometheus']}"

    def ready() -> bool:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=5) as resp:
            return resp.status == 200

    wait_until("prometheus /-/ready", ready, timeout=60, on_timeout=lambda: lab.logs("prometheus"))
    with urllib.request.urlopen(f"{base}/api/v1/rules", timeout=10) as resp:
        groups = json.load(resp)["data"]["groups"]
    loaded = {rule["name"] for group in groups for rule in group["rules"]}
    assert loaded == {rule.get("alert") or rule["record"] for rule in alert_rules.rules()}
    container = f"{lab.network}-prometheus"
    assert docker("exec", container, "id", "-u").stdout.strip() == "1000"
    checked = docker("exec", container, "promtool", "check", "rules", "/etc/prometheus/rules/iot-stack.yml",
                     "/etc/prometheus/rules/fleet.yml", check=False)
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout, checked.stdout + checked.stderr


def prometheus_query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(expr)}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)["data"]["result"]


def test_prometheus_scrapes_every_jvm_and_its_status_page_shows_their_figures(lab, ports):
    port = ports["prometheus"]
    wanted = {"zookeeper", "kafka", "cassandra", "mirrormaker"}
    up: dict = {}

    def all_up() -> bool:
        up.clear()
        up.update({r["metric"]["job"]: float(r["value"][1]) for r in prometheus_query(port, "up")})
        return set(up) >= wanted and all(up[job] == 1 for job in wanted)

    wait_until("every JVM scraped and up", all_up, timeout=300, interval=5,
               on_timeout=lambda: f"up: {up}\n{lab.logs('prometheus')}")
    assert {r["metric"]["site"] for r in prometheus_query(port, "up")} == {"test"}
    page = ""

    def relay_lag_shown() -> bool:
        # MirrorMaker exports its lag only once its consumer has fetched: "up" comes first.
        nonlocal page
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/consoles/iot-stack.html", timeout=30) as resp:
            page = resp.read().decode()
        return re.search(r'id="relay-lag">\d+\.\d<', page) is not None

    wait_until("the page shows MirrorMaker's relay lag", relay_lag_shown, timeout=180, interval=5,
               on_timeout=lambda: f"{page}\n{lab.logs('mirrormaker')}")
    figures = dict(re.findall(r'id="([a-z-]+)">([^<]*)<', page))
    assert figures["under-replicated"] == "0.0"
    assert re.fullmatch(r"\d+\.\d", figures["relay-lag"]), figures        # MirrorMaker's lag, a number
    assert figures["bridge-acked"] == "no data"                             # nothing here exports it
    assert '<span class="site">test</span>' in page
    for job in wanted:
        assert f"<td>{job}</td>" in page


def test_zz_kafka_broker_down_fires_once_the_broker_has_been_stopped_two_minutes(lab, ports):
    """Last in the module: it stops the broker the other tests read."""
    port = ports["prometheus"]
    wait_until("kafka up in Prometheus", lambda: any(
        float(r["value"][1]) == 1 for r in prometheus_query(port, 'up{job="kafka"}')), timeout=120, interval=5)
    assert not prometheus_query(port, 'ALERTS{alertname="KafkaBrokerDown"}')
    docker("stop", "-t", "30", f"{lab.network}-kafka")
    stopped = time.monotonic()
    wait_until("KafkaBrokerDown pending", lambda: bool(prometheus_query(
        port, 'ALERTS{alertname="KafkaBrokerDown", alertstate="pending"}')), timeout=60, interval=3)
    assert not prometheus_query(port, 'ALERTS{alertname="KafkaBrokerDown", alertstate="firing"}')
    wait_until("KafkaBrokerDown firing", lambda: bool(prometheus_query(
        port, 'ALERTS{alertname="KafkaBrokerDown", alertstate="firing"}')), timeout=200, interval=5,
        on_timeout=lambda: lab.logs("prometheus"))
    assert time.monotonic() - stopped >= 120          # the rule's `for: 2m`, not earlier
    [alert] = prometheus_query(port, 'ALERTS{alertname="KafkaBrokerDown", alertstate="firing"}')
    assert alert["metric"]["site"] == "test" and alert["metric"]["instance"] == "kafka-1:9404"
