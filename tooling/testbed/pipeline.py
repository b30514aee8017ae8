"""One edge site and the datacenter (or the edge alone) as plain containers of the project's images, set up from
the stack files the stack role renders, for benchmarks of the data path (tooling.bench.e2e, tooling.bench.site).

Each service runs with the command and environment the rendered stack gives it (inventory.example's site_a
and datacenter, readings relayed), single nodes, on one network:

  edge        zookeeper, kafka, mosquitto (TLS and logins for devices), bridge, cassandra, cassandra-adapter,
              threshold-detector (Spark, local mode as the lab runs it; `jobs` adds rollups)
  datacenter  dc-zookeeper, dc-kafka, mirrormaker (exactly once, the rendered mm2.properties' settings),
              dc-cassandra, dc-cassandra-adapter

What differs from a deployment, and why: Kafka's listeners are plaintext and Cassandra takes no logins
(single-node test clusters, tooling.testbed.kafka_cluster), so the services run without their
KAFKA_USERNAME / CASSANDRA_PASSWORD_FILE; `scripts/bench relay` measures what SASL_SSL costs the relay.
Replication factors are 1 (one node per tier), and Swarm's {{.Task.Slot}} is 1.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from deploy.topology import site_topology
from services.common import names
from tooling.build.progress import log
from tooling.testbed import stack_render
from tooling.testbed.cassandra_node import CassandraNode, start_cassandra
from tooling.testbed.docker_lab import Lab, wait_until
from tooling.testbed.kafka_cluster import KafkaCluster, create_topics, start_kafka_cluster
from tooling.testbed.mosquitto import start_site_mosquitto

SITE = "site-a"
DATACENTER = "datacenter"
RELAYED_READINGS = f"{SITE}.{names.TEMPERATURE_DATA}"
BRIDGE_USER = "bridge"
SPARK_JOB = "threshold-detector"


@dataclass(frozen=True)
class Pipeline:
    lab: Lab
    site_kafka: KafkaCluster
    dc_kafka: KafkaCluster | None          # None: the edge site alone (start(datacenter=False))
    site_cassandra: CassandraNode
    dc_cassandra: CassandraNode | None
    mqtt_port: int           # Mosquitto's TLS listener on 127.0.0.1
    mqtt_ca: str             # the CA its certificate chains to
    devices: dict[str, str]  # device login -> password


@dataclass(frozen=True)
class Rendered:
    """What the stack role renders for site_a and the datacenter, readings relayed."""
    edge: dict               # the edge stack file's services
    datacenter: dict         # the datacenter stack file's services
    bridge_mapping: str
    edge_mappings: str
    datacenter_mappings: str
    mm2: dict[str, str]      # mm2.properties as key -> value


def render() -> Rendered:
    hostvars, groups = stack_render.load_inventory(stack_render.REPO / "inventory.example")
    relay = [*stack_render.stack_defaults()["stack_relay_topics"], names.TEMPERATURE_DATA]

    def stack(group: str, alias: str, tier: str) -> dict:
        topology = site_topology(hostvars, groups[group], alias, tier)
        return stack_render.render(tier, topology)["services"]

    def template(name: str, group: str, tier: str) -> str:
        return stack_render.render_role_template(name, hostvars, groups, group, tier, stack_relay_topics=relay)

    return Rendered(stack("site_a", SITE, "edge"), stack("datacenter", DATACENTER, "datacenter"),
                    template("bridge-mapping.toml.j2", "site_a", "edge"),
                    template("adapter-mappings.toml.j2", "site_a", "edge"),
                    template("adapter-mappings.toml.j2", "datacenter", "datacenter"),
                    stack_render.properties(template("mm2.properties.j2", "datacenter", "datacenter")))


# Variables of a login the single-node test clusters do not take.
_LOGINS = ("KAFKA_USERNAME", "KAFKA_PASSWORD_FILE", "ADAPTER_CASSANDRA_USERNAME", "CASSANDRA_PASSWORD_FILE",
           "SPARK_AUTHENTICATE_SECRET_FILE")


def environment(service: dict, **overrides: str) -> dict[str, str]:
    """A rendered service's environment for `docker run`: logins dropped, Swarm's task slot 1, `overrides`."""
    env = {k: str(v).replace("{{.Task.Slot}}", "1") for k, v in (service.get("environment") or {}).items()
           if k not in _LOGINS}
    return env | overrides


def mm2_properties(rendered: dict[str, str], site: KafkaCluster, datacenter: KafkaCluster) -> str:
    """The rendered mm2.properties' own settings (intervals, exactly once, group filters), with one flow
    site-a -> datacenter between the test clusters (plaintext INTERNAL) and replication factors of 1."""
    aliases = ("site-a.", "site-b.", f"{DATACENTER}.", "site-a->", "site-b->", f"{DATACENTER}->")
    kept = {k: v for k, v in rendered.items() if not k.startswith(aliases) and k != "clusters"}
    kept |= {k: "1" for k in kept if k.endswith("replication.factor")}
    flow = rendered[f"{SITE}->{DATACENTER}.topics"]
    kept |= {"clusters": f"{SITE}, {DATACENTER}", f"{SITE}.bootstrap.servers": site.internal,
             f"{DATACENTER}.bootstrap.servers": datacenter.internal, f"{SITE}->{DATACENTER}.enabled": "true",
             f"{SITE}->{DATACENTER}.topics": flow,
             f"{SITE}->{DATACENTER}.groups": rendered[f"{SITE}->{DATACENTER}.groups"],
             f"{DATACENTER}->{SITE}.enabled": "false"}
    if rendered.get(f"{DATACENTER}.exactly.once.source.support"):
        kept[f"{DATACENTER}.exactly.once.source.support"] = rendered[f"{DATACENTER}.exactly.once.source.support"]
    return "".join(f"{k} = {v}\n" for k, v in kept.items())


def _write(directory: Path, name: str, text: str) -> str:
    path = directory / name
    path.write_text(text)
    path.chmod(0o644)                # the containers' uid 1000 reads it (test files, no secrets of a deployment)
    return str(path)


def _topics(cluster: KafkaCluster, tier: str) -> None:
    """The tier's topics with the partition counts of the topics role (replication 1)."""
    defaults = yaml.safe_load((stack_render.REPO / "ansible/roles/topics/defaults/main.yml").read_text())
    for spec in defaults[f"topics_{tier}"]:
        config = {"cleanup.policy": spec["cleanup"]}
        create_topics(cluster, spec["name"], partitions=spec["partitions"], config=config)


def _spark_command(service: dict, memory: str, conf: dict[str, str] | None = None) -> list[str]:
    """The rendered spark-submit, run as the lab runs jobs (local mode): the driver gets the executor's memory;
    `conf` adds `--conf key=value`s (before the job's file, its last argument)."""
    command = list(service["command"])
    command[command.index("--driver-memory") + 1] = memory
    extra = [arg for key, value in (conf or {}).items() for arg in ("--conf", f"{key}={value}")]
    return command[:-1] + extra + command[-1:]


# What a site's JVMs get from the rendered stack besides the test cluster's own settings: heaps, JVM options
# (KAFKA_JVM_OPTS, JVM_EXTRA_OPTS, when a stack sets them) and, with `exporters`, the JMX exporter's port.
_JVM_SETTINGS = ("ZOO_HEAP_OPTS", "KAFKA_HEAP_OPTS", "CASSANDRA_HEAP", "KAFKA_JVM_OPTS", "JVM_EXTRA_OPTS")


def jvm_environment(service: dict, exporters: bool) -> dict[str, str]:
    """The JVM settings of a rendered ZooKeeper, Kafka or Cassandra service (see _JVM_SETTINGS)."""
    env = service.get("environment") or {}
    keep = _JVM_SETTINGS + (("JMX_EXPORTER_PORT",) if exporters else ())
    return {k: str(v) for k, v in env.items() if k.endswith(keep)}


def start(lab: Lab, work: Path, devices: dict[str, str], datacenter: bool = True,
          jobs: tuple[str, ...] = (SPARK_JOB,), site_jvms: bool = False,
          site_env: dict[str, dict[str, str]] | None = None, job_env: dict[str, str] | None = None,
          job_conf: dict[str, str] | None = None) -> Pipeline:
    """Start both tiers (or, without `datacenter`, the edge site alone) and wait until each service is up;
    `work` holds their files. `jobs`: the edge's Spark jobs to run. `site_jvms`: the site's ZooKeeper, Kafka
    and Cassandra get the rendered stack's heaps, JVM options and JMX exporters (tooling.bench.site), and
    `site_env` ("zookeeper", "kafka" or "cassandra" -> variables) on top. `job_env` and `job_conf`: more
    environment and `--conf`s for every Spark job (a benchmark's baseline settings)."""
    rendered = render()
    work.chmod(0o755)
    tiers = "site and datacenter" if datacenter else "site"
    log("setup", f"starting kafka and cassandra ({tiers})", force=True)
    jvm_env = {role: (jvm_environment(rendered.edge[f"{role}-1"], exporters=True) if site_jvms else {})
               | (site_env or {}).get(role, {}) for role in ("zookeeper", "kafka", "cassandra")}
    with ThreadPoolExecutor(4) as pool:
        site_kafka = pool.submit(start_kafka_cluster, lab, zookeeper_env=jvm_env["zookeeper"],
                                 broker_env=jvm_env["kafka"], broker_memory="2g" if site_jvms else "1g")
        dc_kafka = pool.submit(start_kafka_cluster, lab, "dc-") if datacenter else None
        cassandra = {name: pool.submit(start_cassandra, lab, name, dc, heap="1G", memory="3g", tls=True,
                                       env=jvm_env["cassandra"] if dc == SITE else None)
                     for name, dc in (("cassandra", SITE), ("dc-cassandra", DATACENTER))
                     if datacenter or dc == SITE}
        site_kafka, dc_kafka = site_kafka.result(), dc_kafka and dc_kafka.result()
        site_cassandra = cassandra["cassandra"].result()
        dc_cassandra = cassandra["dc-cassandra"].result() if datacenter else None
    _topics(site_kafka, "edge")
    if dc_kafka:
        _topics(dc_kafka, "datacenter")

    log("setup", "starting mosquitto and the bridge", force=True)
    secrets = work / "mosquitto"
    secrets.mkdir()
    bridge_password = "bench-bridge-password"
    # Devices publish as fast as the benchmark asks: the per-device rate limit is not what it measures.
    mqtt = start_site_mosquitto(lab, secrets, devices, SITE, bridge_password, stack_mqtt_device_max_rate=0)
    bridge_files = work / "bridge"
    bridge_files.mkdir()
    bridge_files.chmod(0o755)
    _write(bridge_files, "mqtt_password", bridge_password)
    _write(bridge_files, "kafka_ca.pem", Path(mqtt["ca"]).read_text())     # MQTT over TLS: Mosquitto's CA
    lab.run("services", "bridge", *rendered.edge["bridge"]["command"], memory="512m",
            volumes={str(bridge_files): "/run/secrets:ro",
                     _write(work, "bridge-mapping.toml", rendered.bridge_mapping): "/etc/iot/bridge-mapping.toml:ro"},
            env=environment(rendered.edge["bridge"], BRIDGE_KAFKA_BOOTSTRAP=site_kafka.internal,
                            BRIDGE_MQTT_USERNAME=BRIDGE_USER))

    log("setup", f"starting the adapters, the Spark jobs ({', '.join(jobs)})"
                 + (" and MirrorMaker" if datacenter else ""), force=True)
    adapters = [("", rendered.edge, site_kafka, site_cassandra, rendered.edge_mappings, SITE)]
    if datacenter:
        adapters.append(("dc-", rendered.datacenter, dc_kafka, dc_cassandra, rendered.datacenter_mappings,
                         DATACENTER))
    for prefix, services, cluster, node, mappings, dc in adapters:
        adapter = services["cassandra-adapter"]
        lab.run("services", f"{prefix}cassandra-adapter", *adapter["command"], memory="512m",
                volumes={_write(work, f"{prefix}adapter-mappings.toml", mappings): "/etc/iot/adapter-mappings.toml:ro",
                         node.ca_file: "/run/secrets/cassandra_ca.pem:ro"},      # CQL over TLS, as deployed
                env=environment(adapter, ADAPTER_KAFKA_BOOTSTRAP=cluster.internal, ADAPTER_CASSANDRA_HOSTS=node.name,
                                ADAPTER_CASSANDRA_LOCAL_DC=dc, ADAPTER_REPLICATION=f"{dc}:1"))
    for job in (j for j in stack_render.stack_defaults()["stack_spark"]["jobs"]["edge"] if j["name"] in jobs):
        name = job["name"]
        lab.run("spark", name, *_spark_command(rendered.edge[name], job["executor_memory"], job_conf),
                memory="2g", env=environment(rendered.edge[name], SPARK_MASTER_URL=f"local[{job['cores']}]",
                                             KAFKA_BOOTSTRAP_SERVERS=site_kafka.internal,
                                             CHECKPOINT_DIR=f"/tmp/checkpoints/{name}", **(job_env or {})))
    adapters_up = ["cassandra-adapter"]
    if datacenter:
        _start_mirrormaker(lab, work, rendered, site_kafka, dc_kafka)
        adapters_up.append("dc-cassandra-adapter")
    for name in ("bridge", *adapters_up):
        wait_until(f"{name} healthy", lambda n=name: _healthy(lab, n), timeout=180,
                   on_timeout=lambda n=name: lab.logs(n))
    return Pipeline(lab, site_kafka, dc_kafka, site_cassandra, dc_cassandra, mqtt["tls"], str(mqtt["ca"]), devices)


def _start_mirrormaker(lab: Lab, work: Path, rendered: Rendered, site_kafka: KafkaCluster,
                       dc_kafka: KafkaCluster) -> None:
    mm2_dir = work / "mirrormaker"
    mm2_dir.mkdir()
    mm2_dir.chmod(0o755)
    _write(mm2_dir, "mm2.properties", mm2_properties(rendered.mm2, site_kafka, dc_kafka))
    lab.run("kafka", "mirrormaker", *rendered.datacenter["mirrormaker"]["command"], memory="1g",
            volumes={str(mm2_dir): "/etc/mirrormaker:ro"},
            env=environment(rendered.datacenter["mirrormaker"], MM2_CONFIG="/etc/mirrormaker/mm2.properties"))


def register_sensors(pipeline: Pipeline, sensors: dict[str, list[str]]) -> None:
    """Register each device's sensors at the site (sensor-registration, as `iot-registrar` does): the bridge
    dead-letters a reading whose sensor is not registered to the device that sent it. Waits for the bridge
    to read them (it polls the topic about every 10 ms)."""
    import time

    from services.commands import fleet, registrar
    from services.common import contracts
    type_id = fleet.sensor_type_id("C")
    records = {names.SENSOR_REGISTRATION: [contracts.SENSOR.validate({
        "sensor_id": sensor, "name": f"Bench sensor {sensor}", "device_id": device, "sensor_type_id": type_id})
        for device, ids in sensors.items() for sensor in ids]}
    registrar.produce(pipeline.site_kafka.external, records)
    time.sleep(2)


def _healthy(lab: Lab, name: str) -> bool:
    probe = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9102/healthz', timeout=3)"
    return lab.exec(name, "python", "-c", probe).returncode == 0


def stopped(lab: Lab) -> list[str]:
    """Containers of the pipeline that are not running (a service that died mid-benchmark)."""
    from tooling.testbed.docker_lab import docker

    states = docker("inspect", "-f", "{{.Name}} {{.State.Running}}", *lab.containers, check=False).stdout
    return [re.sub(r"^/", "", line.split()[0]) for line in states.splitlines() if line.split()[-1] != "true"]
