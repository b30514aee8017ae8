"""Every site's and the datacenter's stack runs its own Prometheus (issue 15): the JVMs export on the
overlay, the rendered scrape configuration names every component the alert rules watch with the
site's label, promtool accepts it, and the web configuration takes one bcrypt login over TLS. That
these work against real components: tests/integration/test_metrics.py (scrapes, status page,
KafkaBrokerDown) and tests/lab/test_2_monitoring.py (the lab's sites over HTTPS)."""
from __future__ import annotations

import re
import shutil
import subprocess

import bcrypt
import pytest
import yaml

from deploy.topology import pki_servers, site_topology
from tooling.testbed import alert_rules
from tooling.testbed.stack_render import REPO, load_inventory, render, render_role_template, stack_defaults

SITES = {"site_a": "edge", "site_b": "edge", "datacenter": "datacenter"}
SALT_KEY = "s" * 43


@pytest.fixture(scope="module")
def example():
    return load_inventory(REPO / "inventory.example")


def _topology(example, group):
    hostvars, groups = example
    return site_topology(hostvars, groups[group], group.replace("_", "-"), SITES[group])


def _scrape_config(example, group) -> dict:
    hostvars, groups = example
    return yaml.safe_load(render_role_template("prometheus.yml.j2", hostvars, groups, group, SITES[group],
                                               iot_site_alias=group.replace("_", "-")))


@pytest.mark.parametrize("group", SITES)
def test_every_jvm_exports_on_the_overlay_only(example, group):
    services = render(SITES[group], _topology(example, group))["services"]
    jvms = [n for n in services if re.fullmatch(r"(zookeeper|kafka|cassandra)-\d+|mirrormaker", n)]
    assert len(jvms) >= 9
    for name in jvms:
        env = services[name]["environment"]
        assert env["JMX_EXPORTER_PORT"] == "9404", name
        assert 9404 not in {p["target"] for p in services[name].get("ports", [])}, name
        # HTTPS with the metrics CA's certificate, to Prometheus' login (the jre image's jmx-exporter-agent).
        assert env["JMX_EXPORTER_KEYSTORE"] == "/run/secrets/metrics_keystore.pem", name
        assert env["JMX_EXPORTER_PASSWORD_FILE"] == "/run/secrets/metrics_password", name
        mounted = {(ref["source"], ref["target"]) for ref in services[name]["secrets"] if isinstance(ref, dict)}
        assert {("metrics_exporter_keystore", "metrics_keystore.pem"), ("metrics_password", "metrics_password")} \
            <= mounted, name


@pytest.mark.parametrize("group", SITES)
def test_prometheus_scrapes_everything_but_the_spark_uis_over_tls_with_the_metrics_ca(example, group):
    """Issue 30: no scrape crosses the site's LAN in clear but the Spark driver UIs' (docs/security.md)."""
    jobs = {job["job_name"]: job for job in _scrape_config(example, group)["scrape_configs"]}
    assert {name for name, job in jobs.items() if job.get("scheme") != "https"} == {"spark"}
    metrics_ca = {name for name, job in jobs.items() if job.get("tls_config", {}).get("ca_file")
                  == "/run/secrets/metrics_ca.pem"}
    assert metrics_ca == set(jobs) - {"spark", "prometheus", "alertmanager", "federate"}
    for name in metrics_ca:
        assert jobs[name]["tls_config"]["server_name"] == "metrics-exporter", name
        assert jobs[name]["tls_config"]["cert_file"] == "/run/secrets/scraper.pem", name
    for name in metrics_ca & {"zookeeper", "kafka", "cassandra", "mirrormaker"}:
        assert jobs[name]["basic_auth"] == {"username": "prometheus", "password_file": "/run/secrets/metrics_password"}


@pytest.mark.parametrize("group", SITES)
def test_prometheus_runs_on_the_apps_node_with_its_volume(example, group):
    prometheus = render(SITES[group], _topology(example, group))["services"]["prometheus"]
    assert prometheus["deploy"]["placement"]["constraints"] == ["node.labels.iot.apps == true"]
    assert prometheus["volumes"] == ["prometheus-data:/var/lib/prometheus/data"]
    assert {"source": "prometheus_config", "target": "/etc/prometheus/site.yml", "mode": 292} in prometheus["configs"]
    assert "--config.file=/etc/prometheus/site.yml" in prometheus["command"]


@pytest.mark.parametrize("group", SITES)
def test_scrape_configuration_names_every_component_with_the_sites_label(example, group):
    config = _scrape_config(example, group)
    topology = _topology(example, group)
    site = group.replace("_", "-")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for role in ("zookeeper", "kafka", "cassandra"):
        targets = [t for c in jobs[role]["static_configs"] for t in c["targets"]]
        assert targets == [f"{role}-{n['id']}:9404" for n in topology[role]]
        assert all(c["labels"] == {"site": site} for c in jobs[role]["static_configs"])
    services = ({"bridge", "mosquitto-agent", "adapter"} if SITES[group] == "edge"
                else {"adapter", "mirrormaker", "federate"})
    assert set(jobs) == {"prometheus", "alertmanager", "zookeeper", "kafka", "cassandra", "spark", "node"} | services
    assert jobs["alertmanager"]["scheme"] == "https" and jobs["alertmanager"]["basic_auth"] == \
        jobs["prometheus"]["basic_auth"]
    assert jobs["alertmanager"]["static_configs"] == [{"targets": ["alertmanager:9093"], "labels": {"site": site}}]
    spark_jobs = [job["name"] for job in stack_defaults()["stack_spark"]["jobs"][SITES[group]]]
    assert [(c["targets"], c["labels"]) for c in jobs["spark"]["static_configs"]] == [
        ([f"{name}:4040"], {"site": site, "spark_job": name}) for name in spark_jobs]
    assert jobs["node"]["dns_sd_configs"] == [{"names": ["node-exporter"], "type": "A", "port": 9100,
                                               "refresh_interval": "30s"}]
    for job in (services - {"mirrormaker", "federate"}) | {"node"}:
        assert jobs[job]["relabel_configs"] == [{"target_label": "site", "replacement": site}]
    # Every job a rule names is scraped here, or is the other tier's (the datacenter has no bridge and no
    # Mosquitto, the sites no MirrorMaker and no federation).
    named = {job for rule in alert_rules.rules() for match in re.findall(r'job=~?"([^"]+)"', rule["expr"])
             for job in match.split("|")}
    assert named >= {"kafka", "zookeeper", "cassandra", "bridge", "adapter", "mirrormaker", "node", "mosquitto-agent",
                     "federate", "alertmanager", "spark"}
    assert named <= set(jobs) | {"bridge", "mosquitto-agent", "mirrormaker", "federate"}
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]


# The services' jobs: job, the stack's service, the service's metrics port setting, that port.
SERVICE_JOBS = {
    "edge": [("bridge", "bridge", "BRIDGE_METRICS_PORT", 9102),
             ("mosquitto-agent", "mosquitto-agent", "MOSQUITTO_AGENT_METRICS_PORT", 9103),
             ("adapter", "cassandra-adapter", "ADAPTER_METRICS_PORT", 9102)],
    "datacenter": [("adapter", "cassandra-adapter", "ADAPTER_METRICS_PORT", 9102)],
}


@pytest.mark.parametrize("group, job, service, variable, port",
                         [(group, *job) for group, tier in SITES.items() for job in SERVICE_JOBS[tier]])
def test_each_service_job_scrapes_every_task_of_its_service_on_its_metrics_port(example, group, job, service,
                                                                                variable, port):
    jobs = {j["job_name"]: j for j in _scrape_config(example, group)["scrape_configs"]}
    assert jobs[job]["dns_sd_configs"] == [{"names": [service], "type": "A", "port": port, "refresh_interval": "30s"}]
    services = render(SITES[group], _topology(example, group))["services"]
    assert service in services, f"the {job} job scrapes {service}, which the {SITES[group]} stack does not run"
    # dnsrr: the service's name resolves to each task, not to one virtual IP in front of them.
    assert services[service]["deploy"]["endpoint_mode"] == "dnsrr"
    assert services[service]["environment"].get(variable) == str(port), \
        f"{service} must serve /metrics on {port} ({variable}), where Prometheus scrapes it"


@pytest.mark.parametrize("group", [group for group, tier in SITES.items() if tier == "edge"])
def test_the_mosquitto_agent_exports_the_limits_mosquitto_runs_with(example, group):
    """MosquittoQueueFilling and MosquittoMemoryHigh compare Mosquitto's figures with the limits the agent
    exports; the agent is told them by the stack (0 or unset: not exported, the alert cannot fire)."""
    hostvars, groups = example
    agent = render(SITES[group], _topology(example, group))["services"]["mosquitto-agent"]["environment"]
    # Mosquitto's memory_limit: 85 % of its container's memory, in bytes (the role's vars/main.yml).
    memory = stack_defaults()["stack_resources"]["mosquitto"]["memory"]
    assert memory.endswith("M") and int(agent["MOSQUITTO_AGENT_MEMORY_LIMIT"]) == int(int(memory[:-1]) * 2**20 * 0.85)
    conf = render_role_template("mosquitto.conf.j2", hostvars, groups, group, SITES[group],
                                iot_site_alias=group.replace("_", "-"),
                                __stack_mqtt_memory_limit=agent["MOSQUITTO_AGENT_MEMORY_LIMIT"])
    settings = dict(line.split(" ", 1) for line in conf.splitlines() if line and not line.startswith("#"))
    assert settings["max_queued_messages"] == agent["MOSQUITTO_AGENT_MAX_QUEUED_MESSAGES"]


@pytest.mark.parametrize("group", SITES)
def test_a_node_exporter_runs_on_every_node_and_sees_only_an_empty_volume_of_its_own(example, group):
    services = render(SITES[group], _topology(example, group))["services"]
    exporter = services["node-exporter"]
    assert exporter["deploy"]["mode"] == "global" and "placement" not in exporter["deploy"]
    assert exporter["volumes"] == ["node-volumes:/node/volumes:ro"]
    assert not exporter.get("ports")
    # Only what its /metrics over mutual TLS needs: its certificate and the CA whose certificates may scrape.
    assert exporter["secrets"] == [{"source": "metrics_exporter_keystore", "target": "metrics_keystore.pem"},
                                   {"source": "scrapers_ca", "target": "scrapers_ca.pem"}]
    assert exporter["command"] == ["--web.config.file=/etc/node-exporter/web-tls.yml"]
    assert exporter["hostname"] == "{{.Node.Hostname}}"     # Swarm's template: node_uname_info names the node
    # The rules watch the mount point the volume is mounted at.
    watched = {m for rule in alert_rules.rules() for m in re.findall(r'mountpoint="([^"]+)"', rule["expr"])}
    assert watched == {"/node/volumes"}


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool (Debian's prometheus; scripts/test installs it)")
@pytest.mark.parametrize("group", SITES)
def test_promtool_accepts_the_rendered_scrape_configuration(example, group, tmp_path):
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(_scrape_config(example, group)))
    checked = subprocess.run(["promtool", "check", "config", "--syntax-only", str(path)],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _web(example, group) -> dict:
    hostvars, groups = example
    return yaml.safe_load(render_role_template(
        "prometheus-web.yml.j2", hostvars, groups, group, SITES[group], iot_site_alias=group.replace("_", "-"),
        __stack_prometheus_password="the-operators-password", __stack_prometheus_fleet_password="the-fleets-password",
        pki_password_salt_key=SALT_KEY))


def test_web_configuration_is_tls_with_bcrypt_logins_the_datacenters_only_at_the_edge(example):
    web = _web(example, "site_a")
    assert web["tls_server_config"]["cert_file"] == "/run/secrets/prometheus_tls_cert"
    assert web["tls_server_config"]["key_file"] == "/run/secrets/prometheus_tls_key"
    users = web["basic_auth_users"]
    assert set(users) == {"operator", "fleet"}
    assert bcrypt.checkpw(b"the-operators-password", users["operator"].encode())
    assert bcrypt.checkpw(b"the-fleets-password", users["fleet"].encode())
    assert not bcrypt.checkpw(b"another-password", users["operator"].encode())
    assert not bcrypt.checkpw(b"the-operators-password", users["fleet"].encode())
    assert set(_web(example, "datacenter")["basic_auth_users"]) == {"operator"}


def test_the_datacenter_federates_each_edge_sites_recorded_series_over_https_with_its_login(example):
    jobs = {job["job_name"]: job for job in _scrape_config(example, "datacenter")["scrape_configs"]}
    federate = jobs["federate"]
    # One target per edge site: its apps node's address (Prometheus' certificate names it), the published port.
    assert [(c["targets"], c["labels"]) for c in federate["static_configs"]] == [
        (["10.20.0.13:9090"], {"site": "site-a"}), (["10.30.0.13:9090"], {"site": "site-b"})]
    assert federate["metrics_path"] == "/federate" and federate["honor_labels"] is True
    assert federate["params"] == {"match[]": ['{__name__=~"site:.+"}']}
    recorded = {rule["record"] for rule in alert_rules.rules() if "record" in rule}
    assert recorded and all(name.startswith("site:") for name in recorded)
    assert federate["scheme"] == "https"
    assert federate["tls_config"] == {"ca_file": "/run/secrets/ca.pem"}     # no server_name: the address is checked
    assert federate["basic_auth"] == {"username": "fleet", "password_file": "/run/secrets/prometheus_fleet_password"}
    for group in ("site_a", "site_b"):
        assert "federate" not in {job["job_name"] for job in _scrape_config(example, group)["scrape_configs"]}


@pytest.mark.parametrize("group", SITES)
def test_only_the_datacenters_prometheus_gets_the_fleet_password(example, group):
    secrets = {s["source"]: s["target"] for s in
               render(SITES[group], _topology(example, group))["services"]["prometheus"]["secrets"]}
    assert ("prometheus_fleet_password" in secrets) == (SITES[group] == "datacenter")
    if SITES[group] == "datacenter":
        assert secrets["prometheus_fleet_password"] == "prometheus_fleet_password"
        assert secrets["kafka_ca"] == "ca.pem"


def test_the_monitoring_certificate_names_the_apps_node_prometheus_and_alertmanager(example):
    servers = {s["name"]: s["sans"] for s in pki_servers(_topology(example, "site_a"))}
    assert servers["prometheus"] == ["IP:10.20.0.13", "DNS:prometheus", "DNS:alertmanager"]  # site-a-3: apps node


def _relabel(rules: list[dict], name: str) -> tuple[str, dict] | None:
    """Prometheus' metric_relabel_configs (replace and keep on __name__) applied to one sample's name;
    None when a keep rule drops it. Prometheus anchors its regexes, as fullmatch does."""
    labels = {"__name__": name}
    for rule in rules:
        value = ";".join(labels.get(label, "") for label in rule["source_labels"])
        match = re.fullmatch(rule["regex"], value)
        if rule.get("action") == "keep":
            if not match:
                return None
        elif match:
            labels[rule["target_label"]] = match.expand(rule["replacement"].replace("$", "\\"))
    return labels.pop("__name__"), labels


def test_spark_streaming_gauges_are_renamed_per_query_and_the_rest_dropped(example):
    """Names as the spark image's PrometheusServlet serves them (namespace iot; seen on Spark 4.2.0)."""
    rules = {job["job_name"]: job for job in _scrape_config(example, "site_a")["scrape_configs"]}["spark"]
    rules = rules["metric_relabel_configs"]
    assert _relabel(rules, "metrics_iot_driver_spark_streaming_threshold_events_latency_Value") == \
        ("spark_streaming_latency", {"query": "threshold_events"})
    assert _relabel(rules, "metrics_iot_driver_spark_streaming_dead_letters_inputRate_total_Value") == \
        ("spark_streaming_inputRate_total", {"query": "dead_letters"})
    assert _relabel(rules, "metrics_iot_driver_spark_streaming_threshold_events_latency_Number") is None
    assert _relabel(rules, "metrics_iot_driver_BlockManager_memory_maxMem_MB_Value") is None
    # Every spark_streaming_ name the rules use is one the relabelling makes.
    used = alert_rules.names_by_owner()["spark"]
    figures = re.search(r"\(([A-Za-z_|]+)\)_Value$", rules[0]["regex"])[1].split("|")
    made = {f"spark_streaming_{figure}" for figure in figures}
    assert used and used <= made
