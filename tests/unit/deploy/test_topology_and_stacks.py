"""Inventory -> topology -> rendered stack files: every inventory shape renders a valid stack."""
from __future__ import annotations

import pytest
import yaml

from deploy.images import node_images, site_images
from deploy.passwords import mqtt_device_hashes, mqtt_service_accounts, registry_htpasswd
from deploy.swarm import replication_short, rolled_back, unconverged, updating
from deploy.topology import edge_sites, node_labels, pki_servers, site_topology, stale_node_labels
from tooling.testbed.stack_render import REPO, group_vars, load_inventory, render, resolve, stack_defaults

IGNORED = ["edge", "ungrouped"]


@pytest.fixture(scope="module")
def example():
    return load_inventory(REPO / "inventory.example")


def test_example_inventory_gives_three_of_each_per_site(example):
    hostvars, groups = example
    for group in ("datacenter", "site_a", "site_b"):
        topology = site_topology(hostvars, groups[group], group.replace("_", "-"),
                                         "datacenter" if group == "datacenter" else "edge")
        assert [len(topology[r]) for r in ("zookeeper", "kafka", "cassandra")] == [3, 3, 3]
    assert topology["zookeeper_connect"] == "zookeeper-1:2182,zookeeper-2:2182,zookeeper-3:2182"   # over TLS


def test_relay_sees_every_edge_site_with_external_bootstrap(example):
    hostvars, groups = example
    sites = edge_sites(hostvars, groups, "edge", IGNORED, 9094)
    assert sites == [
        {"alias": "site-a", "group": "site_a", "bootstrap": "10.20.0.11:9094,10.20.0.12:9094,10.20.0.13:9094",
         "apps_address": "10.20.0.13"},
        {"alias": "site-b", "group": "site_b", "bootstrap": "10.30.0.11:9094,10.30.0.12:9094,10.30.0.13:9094",
         "apps_address": "10.30.0.13"},
    ]


def _hosts(**per_host):
    return {name: {"swarm_role": "manager", **v} for name, v in per_host.items()}


SMALL_SITE = _hosts(n1={"zookeeper_id": 1, "kafka_id": 1, "cassandra_id": 1, "apps_node": True, "mqtt_node": True})


@pytest.mark.parametrize("hostvars, message", [
    (_hosts(n1={"swarm_role": "boss"}), "n1: swarm_role='boss' must be manager or worker"),
    (_hosts(n1={"zookeeper_id": 1, "kafka_id": "one", "cassandra_id": 1, "apps_node": True, "mqtt_node": True}),
     "n1: kafka_id='one' must be a whole number"),
    ({**SMALL_SITE, "n2": {"swarm_role": "worker", "kafka_id": 1}}, "n2: kafka_id=1 is already used by n1"),
    ({**SMALL_SITE, "n2": {"swarm_role": "worker", "kafka_id": 3}}, r"kafka_id values \[1, 3\] must run 1..2"),
    (_hosts(n1={"zookeeper_id": 1, "kafka_id": 1, "apps_node": True, "mqtt_node": True}),
     "no host has cassandra_id"),
    ({**SMALL_SITE, "n2": {"swarm_role": "manager"}}, "2 managers; use an odd number"),
    ({**SMALL_SITE, "n2": {"swarm_role": "worker", "zookeeper_id": 2}}, "2 ZooKeeper nodes; use an odd number"),
    (_hosts(n1={"zookeeper_id": 1, "kafka_id": 1, "cassandra_id": 1, "mqtt_node": True}),
     "exactly one host needs apps_node=true"),
    (_hosts(n1={"zookeeper_id": 1, "kafka_id": 1, "cassandra_id": 1, "apps_node": True}),
     "no host has mqtt_node=true .Mosquitto.; set it on at least one host"),
    ({**SMALL_SITE, "n2": {"swarm_role": "worker", "kafka_retire": True}}, "n2: kafka_retire=true without a kafka_id"),
    (_hosts(n1={"zookeeper_id": 1, "kafka_id": 1, "cassandra_id": 1, "apps_node": True, "mqtt_node": True,
                "kafka_retire": True}), "every broker has kafka_retire=true; at least one must stay"),
    ({**SMALL_SITE, "n1": {**SMALL_SITE["n1"], "kafka_retire": "true"}, "n2": {"swarm_role": "worker", "kafka_id": 2}},
     r"kafka_retire=true on kafka_id \[1\]; only the highest ids can leave \(\[2\]"),
    ({**SMALL_SITE, "n2": {"swarm_role": "worker", "cassandra_retire": True}},
     "n2: cassandra_retire=true without a cassandra_id; retire the host that runs the Cassandra node"),
    (_hosts(n1={**SMALL_SITE["n1"], "cassandra_retire": True}),
     "every Cassandra node has cassandra_retire=true; at least one must stay"),
    ({**SMALL_SITE, "n1": {**SMALL_SITE["n1"], "cassandra_retire": "true"},
      "n2": {"swarm_role": "worker", "cassandra_id": 2}},
     r"cassandra_retire=true on cassandra_id \[1\]; only the highest ids can leave \(\[2\] for as many Cassandra"),
])
def test_bad_inventory_is_named(hostvars, message):
    with pytest.raises(Exception, match=message):
        site_topology(hostvars, list(hostvars), "site-x", "edge")


def test_a_retiring_broker_still_runs_and_is_no_longer_one_the_topics_are_spread_over():
    hostvars = {**SMALL_SITE, "n2": {"swarm_role": "worker", "kafka_id": 2},
                "n3": {"swarm_role": "worker", "kafka_id": 3, "kafka_retire": "yes"}}
    topology = site_topology(hostvars, list(hostvars), "site-x", "edge")
    assert [k["id"] for k in topology["kafka"]] == [1, 2, 3]
    assert topology["kafka_retiring"] == [3] and topology["kafka_serving"] == [1, 2]
    assert topology["kafka_bootstrap_internal"] == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    plain = site_topology(SMALL_SITE, ["n1"], "site-x", "edge")
    assert plain["kafka_retiring"] == [] and plain["kafka_serving"] == [1]


def test_a_retiring_cassandra_node_still_runs_and_is_not_one_that_serves():
    hostvars = {**SMALL_SITE, "n2": {"swarm_role": "worker", "cassandra_id": 2},
                "n3": {"swarm_role": "worker", "cassandra_id": 3, "cassandra_retire": True}}
    topology = site_topology(hostvars, list(hostvars), "site-x", "edge")
    assert [c["id"] for c in topology["cassandra"]] == [1, 2, 3]
    assert topology["cassandra_retiring"] == [3] and topology["cassandra_serving"] == [1, 2]
    plain = site_topology(SMALL_SITE, ["n1"], "site-x", "edge")
    assert plain["cassandra_retiring"] == [] and plain["cassandra_serving"] == [1]


def test_bad_site_alias_is_named():
    with pytest.raises(Exception, match="site_alias='Site A' must be lowercase"):
        site_topology(SMALL_SITE, ["n1"], "Site A")


def test_node_labels_and_images_follow_the_host_variables():
    host = {"zookeeper_id": "2", "kafka_id": 2, "apps_node": "true"}
    assert node_labels(host) == {"iot.zookeeper": "2", "iot.kafka": "2", "iot.apps": "true", "iot.stateless": "true"}
    assert node_images(host, "edge", False) == ["kafka", "node-exporter", "prometheus", "services", "spark"]
    assert node_labels({"stateless_node": "yes"}) == {"iot.stateless": "true"}
    # A flag or id taken out of the inventory: its label goes, so its services leave the node.
    assert stale_node_labels(host) == ["iot.cassandra", "iot.mqtt"]
    assert stale_node_labels({}) == ["iot.apps", "iot.cassandra", "iot.kafka", "iot.mqtt", "iot.stateless",
                                     "iot.zookeeper"]
    assert node_images({"stateless_node": True}, "edge", False) == ["node-exporter", "services"]
    assert node_images({"stateless_node": True}, "datacenter", False) == ["kafka", "node-exporter", "services"]
    assert node_images({"cassandra_id": 1}, "edge", True) == ["cassandra", "kafka", "node-exporter", "services"]
    assert node_images({"cassandra_id": 1}, "edge", False) == ["cassandra", "node-exporter"]
    site = {"m": {"swarm_role": "manager", "kafka_id": 1}, "w": {"swarm_role": "worker", "cassandra_id": 1, **host}}
    assert site_images(site, ["m", "w"], "edge") == ["cassandra", "kafka", "node-exporter", "prometheus",
                                                             "services", "spark"]


def test_the_mqtt_services_logins_are_stable_and_salted_per_user_with_the_deployments_key():
    key, other_key = "k" * 43, "o" * 43
    users = {"bridge": "pw", "mosquitto-agent": "pw"}
    kinds = [{"user": "bridge", "kind": "bridge", "prefix": "bridge-"},
             {"user": "mosquitto-agent", "kind": "agent", "prefix": "mosquitto-agent-"}]
    first = mqtt_service_accounts(users, kinds, "site-a", key)
    assert first == mqtt_service_accounts(users, kinds, "site-a", key)
    assert first != mqtt_service_accounts(users, kinds, "site-a", other_key)
    with pytest.raises(Exception, match="salt key must be at least 32 characters"):
        mqtt_service_accounts(users, kinds, "site-a", "short")
    with pytest.raises(Exception, match="the agent login 'mosquitto-agent' needs a password"):
        mqtt_service_accounts({"bridge": "pw"}, kinds, "site-a", key)
    lines = [line.split() for line in first.splitlines() if not line.startswith("#")]
    assert [line[:3] for line in lines] == [["bridge", "bridge", "bridge-"], ["mosquitto-agent", "agent",
                                                                            "mosquitto-agent-"]]
    assert lines[0][3] != lines[1][3], "same password must not give the same hash"
    assert lines[0][3].startswith("$7$1000$")


def test_inventory_devices_hash_stably_and_never_alike():
    key = "k" * 43
    passwords = {"press-1": "pw-one-long-enough", "press-2": "pw-one-long-enough"}
    hashes = mqtt_device_hashes(passwords, "site-a", key)
    assert hashes == mqtt_device_hashes({"press-2": "pw-one-long-enough", "press-1": "pw-one-long-enough"},
                                                "site-a", key)
    assert hashes["press-1"] != hashes["press-2"] and hashes["press-1"].startswith("$7$1000$")


def _services(stack):
    return stack["services"]


@pytest.mark.parametrize("group, tier", [("site_a", "edge"), ("site_b", "edge"), ("datacenter", "datacenter")])
def test_every_rendered_service_is_complete(example, group, tier):
    hostvars, groups = example
    topology = site_topology(hostvars, groups[group], group.replace("_", "-"), tier)
    stack = render(tier, topology)
    for name, service in _services(stack).items():
        deploy = service["deploy"]
        assert deploy["endpoint_mode"] == "dnsrr", name
        # Placed on a labelled node, or one task on every node (the node exporter).
        assert deploy.get("mode") == "global" or deploy["placement"]["constraints"], name
        assert {"limits", "reservations"} <= set(deploy["resources"]), name
        assert deploy["restart_policy"]["condition"] == "any", name
        assert deploy["update_config"]["parallelism"] == 1, name
        assert service["healthcheck"]["test"], name
        for port in service.get("ports", []):
            assert port["mode"] == "host", f"{name}: ingress ports need IPVS, which the test machines lack"
        assert "environment" not in service or not any(
            "PASSWORD" in k and not k.endswith("_FILE") for k in service["environment"]), f"{name}: secret in env"


def test_stateful_services_are_one_per_node_with_own_volume(example):
    hostvars, groups = example
    stack = render("edge", site_topology(hostvars, groups["site_a"], "site-a", "edge"))
    services = _services(stack)
    for role in ("zookeeper", "kafka", "cassandra"):
        for n in (1, 2, 3):
            service = services[f"{role}-{n}"]
            assert service["deploy"]["replicas"] == 1
            assert service["deploy"]["placement"]["constraints"] == [f"node.labels.iot.{role} == {n}"]
            assert service["volumes"][0].startswith(f"{role}-{n}-data:")
            assert f"{role}-{n}-data" in stack["volumes"]
            # Not killed while it starts, however long a crash's recovery takes (STATEFUL_START_PERIOD).
            assert service["healthcheck"]["start_period"] == "1800s"
    kafka = services["kafka-2"]["environment"]
    # No INTERNAL (9092, in clear): the services and the deployment's tools use SERVICES (issue 30).
    assert kafka["KAFKA_LISTENERS"] == "BROKER://0.0.0.0:9093,EXTERNAL://0.0.0.0:9094,SERVICES://0.0.0.0:9095"
    assert kafka["KAFKA_ADVERTISED_LISTENERS"] == \
        "BROKER://kafka-2:9093,EXTERNAL://10.20.0.12:9094,SERVICES://kafka-2:9095"
    assert kafka["KAFKA_HEALTH_PORT"] == "9095"
    # BROKER (the brokers' replication, mutual TLS): this broker's own keystore and the site's brokers CA.
    assert {(kafka["KAFKA_BROKER_KEYSTORE_FILE"], kafka["KAFKA_BROKER_CA_FILE"])} == \
        {("/run/secrets/kafka_broker_keystore.pem", "/run/secrets/kafka_brokers_ca.pem")}
    targets = {s["target"]: s["source"] for s in services["kafka-2"]["secrets"]}
    assert targets["kafka_broker_keystore.pem"].startswith("kafka_2_broker_keystore")
    assert targets["kafka_brokers_ca.pem"].startswith("kafka_brokers_ca")
    assert all(port["target"] != 9093 for port in services["kafka-2"]["ports"])     # the overlay only
    # ZooKeeper's clients over TLS only (2182), each server its own keystore of the site's ZooKeeper CA; the
    # brokers check the servers against that CA; clear on a server's loopback only (ZOO_CLIENT_TLS).
    zookeeper = services["zookeeper-3"]
    assert (zookeeper["environment"]["ZOO_TLS_KEYSTORE_FILE"], zookeeper["environment"]["ZOO_CLIENT_TLS"]) == \
        ("/run/secrets/zookeeper_keystore.pem", "required")
    assert ";2181" not in zookeeper["environment"]["ZOO_SERVERS"]          # no client address on every interface
    # The servers among themselves: mutual TLS with certificates of the same CA.
    assert (zookeeper["environment"]["ZOO_QUORUM_TLS"], zookeeper["environment"]["ZOO_TLS_CA_FILE"]) == \
        ("required", "/run/secrets/zookeeper_ca.pem")
    targets = {s["target"]: s["source"] for s in zookeeper["secrets"]}
    assert targets["zookeeper_keystore.pem"].startswith("zookeeper_3_keystore")
    assert kafka["KAFKA_ZOOKEEPER_CONNECT"] == "zookeeper-1:2182,zookeeper-2:2182,zookeeper-3:2182"
    assert kafka["KAFKA_ZOOKEEPER_CA_FILE"] == "/run/secrets/zookeeper_ca.pem"
    targets = {s["target"]: s["source"] for s in services["kafka-2"]["secrets"]}
    assert targets["zookeeper_ca.pem"].startswith("zookeeper_ca")
    # CQL over TLS: each node its own keystore of the site's Cassandra CA; the adapter checks nodes against it.
    cassandra = services["cassandra-3"]
    env = cassandra["environment"]
    assert (env["CASSANDRA_TLS_KEYSTORE_FILE"], env["CASSANDRA_TLS_CA_FILE"]) == \
        ("/run/secrets/cassandra_keystore.pem", "/run/secrets/cassandra_ca.pem")
    assert "CASSANDRA_CLIENT_TLS" not in cassandra["environment"]                # required, the entrypoint's default
    # Mutual TLS between nodes, named so that deploy/rollout.py can tell a node deployed before it.
    assert env["CASSANDRA_INTERNODE_TLS"] == "required"
    targets = {s["target"]: s["source"] for s in cassandra["secrets"] if isinstance(s, dict)}
    assert targets["cassandra_keystore.pem"].startswith("cassandra_3_keystore")
    assert targets["cassandra_ca.pem"].startswith("cassandra_ca")
    adapter = services["cassandra-adapter"]
    assert adapter["environment"]["ADAPTER_CASSANDRA_CA_FILE"] == "/run/secrets/cassandra_ca.pem"
    assert {"source": "cassandra_ca", "target": "cassandra_ca.pem"} in adapter["secrets"]


def test_bridge_gets_a_stable_client_id_per_replica(example):
    hostvars, groups = example
    stack = render("edge", site_topology(hostvars, groups["site_a"], "site-a", "edge"))
    assert _services(stack)["bridge"]["environment"]["BRIDGE_CLIENT_ID"] == "bridge-{{.Task.Slot}}"


STATELESS = ["node.labels.iot.stateless == true"]


def test_stateless_services_run_on_every_stateless_node_one_replica_of_each_per_node(example):
    """The bridge, the adapter and mosquitto-agent may run on the apps_node and every stateless_node, and the
    bridge and the adapter have one replica per such node unless the inventory sets a figure; the apps with
    state on a node's volume stay on the apps_node."""
    hostvars, groups = example
    topology = site_topology(hostvars, groups["site_a"], "site-a", "edge")
    assert topology["stateless_nodes"] == ["site-a-2", "site-a-3"]     # stateless_node=true, apps_node=true
    services = _services(render("edge", topology))
    for name in ("bridge", "cassandra-adapter", "mosquitto-agent"):
        assert services[name]["deploy"]["placement"]["constraints"] == STATELESS, name
    assert services["bridge"]["deploy"]["replicas"] == services["cassandra-adapter"]["deploy"]["replicas"] == 2
    assert services["mosquitto-agent"]["deploy"]["replicas"] == 1
    for name in ("prometheus", "alertmanager", "threshold-detector"):
        assert services[name]["deploy"]["placement"]["constraints"] == ["node.labels.iot.apps == true"], name
    fixed = _services(render("edge", topology, stack_bridge_replicas=3))
    assert fixed["bridge"]["deploy"]["replicas"] == 3 and fixed["cassandra-adapter"]["deploy"]["replicas"] == 2
    one = _services(render("edge", site_topology(SMALL_SITE, ["n1"], "site-x", "edge")))
    assert one["bridge"]["deploy"]["replicas"] == one["cassandra-adapter"]["deploy"]["replicas"] == 1
    datacenter = _services(render("datacenter", site_topology(hostvars, groups["datacenter"], "datacenter",
                                                              "datacenter")))
    assert datacenter["mirrormaker"]["deploy"]["placement"]["constraints"] == STATELESS


def test_mosquitto_runs_once_on_any_mqtt_node_and_its_certificate_names_them_all(example):
    """Two mqtt_nodes (issue 29): one Mosquitto, which Swarm may start on either (its port published where it
    runs); devices are given both addresses, in inventory order, and the certificate names both."""
    hostvars, groups = example
    topology = site_topology(hostvars, groups["site_a"], "site-a", "edge")
    assert topology["mqtt_nodes"] == ["site-a-1", "site-a-2"]
    assert topology["mqtt_addresses"] == ["10.20.0.11", "10.20.0.12"]
    mosquitto = _services(render("edge", topology))["mosquitto"]
    assert mosquitto["deploy"]["replicas"] == 1
    assert mosquitto["deploy"]["placement"]["constraints"] == ["node.labels.iot.mqtt == true"]
    assert mosquitto["ports"] == [{"target": 8883, "published": 8883, "protocol": "tcp", "mode": "host"}]
    assert {"name": "mosquitto", "sans": ["IP:10.20.0.11", "IP:10.20.0.12", "DNS:mosquitto"]} \
        in pki_servers(topology)
    for host in topology["mqtt_nodes"]:
        assert "mosquitto" in node_images(hostvars[host], "edge", False), host
    # What the devices role hands a new device (ansible/roles/devices/vars/main.yml, __devices_broker).
    broker = yaml.safe_load((REPO / "ansible/roles/devices/vars/main.yml").read_text())["__devices_broker"]
    variables = {"iot_topology": topology, "pki_secrets": {"kafka_ca": "CA"}}
    assert resolve(variables, broker["mqtt_hosts"].strip("{} ")) == ["10.20.0.11", "10.20.0.12"]
    assert resolve(variables, broker["mqtt_host"].strip("{} ")) == "10.20.0.11"


def test_datacenter_runs_mirrormaker_and_no_mqtt(example):
    hostvars, groups = example
    services = _services(render("datacenter", site_topology(hostvars, groups["datacenter"], "datacenter",
                                                                    "datacenter")))
    assert "mirrormaker" in services and "mosquitto" not in services and "bridge" not in services


def test_config_and_secret_names_carry_a_content_hash(example):
    hostvars, groups = example
    stack = render("edge", site_topology(hostvars, groups["site_a"], "site-a", "edge"))
    assert stack["secrets"]["mqtt_services"]["name"].startswith("site-a_mqtt_services_")
    assert len(stack["secrets"]["mqtt_services"]["name"].rsplit("_", 1)[1]) == 12
    assert stack["configs"]["mosquitto_config"]["name"].startswith("site-a_mosquitto_config_")


def test_adding_a_broker_leaves_the_other_brokers_spec_alone():
    """Replication is per topic (topics role), so a second broker must not change kafka-1 (a restart)."""
    one = {"n1": {**SMALL_SITE["n1"], "ansible_host": "172.20.0.5"}}
    two = {**one, "n2": {"swarm_role": "worker", "kafka_id": 2, "ansible_host": "172.20.0.6"}}
    before = render("edge", site_topology(one, ["n1"], "site-b"))["services"]
    after = render("edge", site_topology(two, ["n1", "n2"], "site-b"))["services"]
    assert "kafka-2" in after and "kafka-2" not in before
    assert after["kafka-1"] == before["kafka-1"]
    for name in ("zookeeper-1", "cassandra-1", "mosquitto"):    # tests/lab/test_7_grow.py checks these too
        assert after[name] == before[name], name
    assert not {"KAFKA_DEFAULT_REPLICATION_FACTOR", "KAFKA_MIN_INSYNC_REPLICAS"} & set(after["kafka-1"]["environment"])


def test_unconverged_lists_services_missing_replicas():
    lines = ["site-a_kafka-1 1/1", "site-a_bridge 0/2", "site-a_rollups 2/2 (max 1 per node)", ""]
    assert unconverged(lines) == ["site-a_bridge"]


# cqlsh's output of SELECT JSON keyspace_name, replication FROM system_schema.keyspaces ...
CQLSH_JSON = [
    "", " [json]", "------------------------------------------------------------------",
    ' {"keyspace_name": "system_auth", "replication": {"class": "org.apache.cassandra.locator.'
    'NetworkTopologyStrategy", "site-a": "2"}}',
    ' {"keyspace_name": "iot", "replication": {"class": "org.apache.cassandra.locator.NetworkTopologyStrategy", '
    '"site-a": "1"}}', "", "(2 rows)",
]


@pytest.mark.parametrize("nodes, short", [(1, []), (2, ["iot"]), (3, ["system_auth", "iot"]),
                                          (5, ["system_auth", "iot"])])
def test_replication_short_names_keyspaces_below_min_nodes_3(nodes, short):
    assert replication_short(CQLSH_JSON, "site-a", nodes, ["system_auth", "iot"]) == short


def test_replication_short_skips_a_keyspace_not_created_yet():
    assert replication_short(CQLSH_JSON[:4], "site-a", 2, ["system_auth", "iot"]) == []
    assert replication_short(CQLSH_JSON, "other-dc", 1, ["system_auth"]) == ["system_auth"]


def test_local_spark_mode_runs_jobs_without_master_or_worker():
    spark = {**stack_defaults()["stack_spark"], "mode": "local"}
    services = render("edge", site_topology(SMALL_SITE, ["n1"], "site-b"), stack_spark=spark)["services"]
    assert "spark-master" not in services and "spark-worker" not in services
    assert services["threshold-detector"]["environment"]["SPARK_MASTER_URL"] == "local[1]"


def test_a_spark_job_slow_to_start_on_a_loaded_node_is_not_killed_while_it_starts():
    """Its healthcheck is the driver's UI (4040); a start period of 120 s killed a detector every 3.5 minutes for
    good on a lab at load 60. A driver that dies exits by itself: the check is only for one that hangs."""
    services = render("edge", site_topology(SMALL_SITE, ["n1"], "site-b"))["services"]
    for job in ("threshold-detector", "rollups"):
        check = services[job]["healthcheck"]
        assert check["test"][-1] == "4040" and check["start_period"] == "900s", check


def test_jvm_extra_opts_reach_every_jvm_of_the_stack_and_nothing_when_empty():
    """stack_jvm_extra_opts (the lab's C1-only JIT) in each image's variable for its JVM flags and in each Spark
    job's driver and executor options; left empty, the services render as they always did (no restart)."""
    opts = "-XX:TieredStopAtLevel=1"
    topology = site_topology(SMALL_SITE, ["n1"], "site-b")
    plain = render("edge", topology)["services"]
    edge = render("edge", topology, stack_jvm_extra_opts=opts)["services"]
    dc = render("datacenter", site_topology(SMALL_SITE, ["n1"], "datacenter"), stack_jvm_extra_opts=opts)["services"]
    assert edge["kafka-1"]["environment"]["KAFKA_JVM_OPTS"] == opts
    assert edge["zookeeper-1"]["environment"]["KAFKA_JVM_OPTS"] == opts
    assert edge["cassandra-1"]["environment"]["JVM_EXTRA_OPTS"] == opts
    assert dc["mirrormaker"]["environment"]["KAFKA_JVM_OPTS"] == opts
    for job in ("threshold-detector", "rollups"):
        command = edge[job]["command"]
        assert f"spark.driver.extraJavaOptions={opts}" in command
        assert f"spark.executor.extraJavaOptions={opts}" in command
        assert not any("extraJavaOptions" in arg for arg in plain[job]["command"])
    assert plain == {name: _without_jvm_extra_opts(service) for name, service in edge.items()}


def _without_jvm_extra_opts(service: dict) -> dict:
    service = dict(service)
    if "environment" in service:
        service["environment"] = {k: v for k, v in service["environment"].items()
                                  if k not in ("KAFKA_JVM_OPTS", "JVM_EXTRA_OPTS")}
    command = service.get("command")
    if isinstance(command, list):
        kept = []
        for arg in command:
            if "extraJavaOptions=" in arg:
                kept.pop()      # its "--conf"
            else:
                kept.append(arg)
        service["command"] = kept
    return service


def test_updating_lists_services_with_unfinished_rollouts():
    lines = ["site-a_bridge updating", "site-a_kafka-1 completed", "site-a_mosquitto", "site-a_adapter paused"]
    assert updating(lines) == ["site-a_bridge", "site-a_adapter"]


def test_rolled_back_lists_services_left_on_their_previous_spec():
    lines = ["site-a_bridge rollback_completed", "site-a_kafka-1 completed", "site-a_mosquitto",
             "site-a_adapter rollback_started"]
    assert rolled_back(lines) == ["site-a_bridge"]


def test_lab_jobs_render_with_their_env_and_spark_conf():
    from tooling.lab import lab
    spark = {**stack_defaults()["stack_spark"], "mode": "local", "jobs": lab.LAB_JOBS}
    edge = render("edge", site_topology(SMALL_SITE, ["n1"], "site-b"), stack_spark=spark)["services"]
    job = edge["threshold-detector"]
    assert job["environment"]["TRIGGER_INTERVAL"] == "15 seconds"
    assert job["environment"]["DEAD_LETTER_TRIGGER_INTERVAL"] == "60 seconds"
    conf = job["command"].index("spark.sql.shuffle.partitions=1")
    assert job["command"][conf - 1] == "--conf"
    assert "rollups" not in edge


def test_one_overlay_network_name_for_roles_and_stacks(example):
    """iot_network (ansible/group_vars/all) names the overlay network everywhere. It
    stays `iot`: running sites were deployed with that name."""
    assert group_vars()["iot_network"] == "iot"
    for role, name in (("swarm", "swarm_network"), ("topics", "topics_network"), ("health", "health_network"),
                       ("stack", "stack_network")):
        defaults = yaml.safe_load((REPO / "ansible/roles" / role / "defaults/main.yml").read_text())
        assert defaults[name] == "{{ iot_network }}", f"{role} role: {name} must derive from iot_network"
    hostvars, groups = example
    for group, tier in (("site_a", "edge"), ("datacenter", "datacenter")):
        stack = render(tier, site_topology(hostvars, groups[group], group.replace("_", "-"), tier))
        assert stack["networks"] == {"iot": {"external": True}}
        assert {name: s["networks"] for name, s in _services(stack).items()} == dict.fromkeys(_services(stack), ["iot"])


@pytest.mark.parametrize("group, tier", [("site_a", "edge"), ("datacenter", "datacenter")])
def test_spark_in_cluster_mode_authenticates_every_daemon_and_job_with_the_sites_secret(example, group, tier):
    hostvars, groups = example
    topology = site_topology(hostvars, groups[group], group.replace("_", "-"), tier)
    settings = stack_defaults()["stack_spark"]
    assert settings["mode"] == "cluster"                          # the default
    services = _services(render(tier, topology))
    spark = {name: s for name, s in services.items() if s["image"].startswith("iot-stack/spark:")}
    assert {"spark-master", "spark-worker"} < set(spark) and len(spark) > 2
    for name, service in spark.items():
        assert service["environment"]["SPARK_AUTHENTICATE_SECRET_FILE"] == "/run/secrets/spark_auth_secret", name
        assert "spark_auth_secret" in service["secrets"], name
    # Jobs in their own drivers: no Spark RPC.
    local = _services(render(tier, topology, stack_spark={**settings, "mode": "local"}))
    assert "spark-master" not in local
    for job in (name for name in spark if name in local):
        assert "SPARK_AUTHENTICATE_SECRET_FILE" not in local[job]["environment"], job


def test_registry_htpasswd_is_bcrypt_stable_and_checks_the_password():
    import bcrypt
    key = "k" * 43
    line = registry_htpasswd("iot", "the-registry-password", key)
    assert line == registry_htpasswd("iot", "the-registry-password", key)      # reruns change nothing
    user, hashed = line.rstrip("\n").split(":", 1)
    assert user == "iot" and hashed.startswith("$2b$10$")
    assert bcrypt.checkpw(b"the-registry-password", hashed.encode())
    assert not bcrypt.checkpw(b"another-password", hashed.encode())
    assert hashed != registry_htpasswd("iot", "the-registry-password", "o" * 43).split(":", 1)[1].strip()


def test_the_python_services_healthcheck_is_healthy_on_200_only_without_starting_python(example):
    # The rendered test, as Swarm runs it (`$$` is docker stack deploy's escape of `$`), against an HTTP server
    # on the port it names: 200 is healthy; 503 (what /healthz answers while unhealthy) and no server are not.
    import http.server
    import subprocess
    import threading

    hostvars, groups = example
    services = _services(render("edge", site_topology(hostvars, groups["site_a"], "site-a", "edge")))
    tests = {name: services[name]["healthcheck"]["test"] for name in ("bridge", "cassandra-adapter", "mosquitto-agent")}
    assert {test[1] for test in tests.values()} == {"bash"}
    status = [200]

    class Healthz(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            self.send_response(status[0] if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name, test in tests.items():
            port = test[3].split("/dev/tcp/127.0.0.1/")[1].split(" ")[0]
            assert port in ("9102", "9103"), name
            command = test[3].replace("$$", "$").replace(f"/127.0.0.1/{port} ", f"/127.0.0.1/{server.server_port} ")
            runs = {}
            for status[0] in (200, 503):
                runs[status[0]] = subprocess.run(["bash", "-c", command], timeout=10).returncode
            assert runs[200] == 0 and runs[503] != 0, (name, runs)
    finally:
        server.shutdown()
    closed = tests["bridge"][3].replace("$$", "$").replace("/127.0.0.1/9102 ", "/127.0.0.1/1 ")
    assert subprocess.run(["bash", "-c", closed], capture_output=True, timeout=10).returncode != 0
