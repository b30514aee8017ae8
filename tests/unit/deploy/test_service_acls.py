"""Each service's Kafka principal on INTERNAL and its ACLs, as the stack role renders them from the inventory
(ansible/roles/stack/templates/kafka-services.yml.j2, filter service_acls)."""
from __future__ import annotations

import yaml

from deploy.kafka_acls import service_acls
from deploy.preflight import spark_job_refusals
from deploy.topology import site_topology
from tooling.testbed.stack_render import REPO, load_inventory, render_role_template, stack_defaults

EDGE_ALIASES = ["site-a", "site-b"]


def _services(group: str, tier: str, **overrides) -> list[dict]:
    hostvars, groups = load_inventory(REPO / "inventory.example")
    return yaml.safe_load(render_role_template("kafka-services.yml.j2", hostvars, groups, group, tier, **overrides))


def _granted(acls: list[dict], user: str) -> set[tuple]:
    return {(a["resource"], a["name"], a["pattern"], a["operation"]) for a in acls if a["principal"] == f"User:{user}"}


def test_edge_services_may_do_what_they_do_and_nothing_else():
    acls = service_acls(_services("site_a", "edge"))
    assert _granted(acls, "bridge") == {
        ("topic", "temperature-data", "literal", "WRITE"), ("topic", "dead-letter", "literal", "WRITE"),
        ("topic", "device-commands", "literal", "READ"), ("topic", "sensor-registration", "literal", "READ"),
        ("group", "site-a-bridge-commands", "literal", "READ"), ("group", "bridge-", "prefixed", "DESCRIBE")}
    assert _granted(acls, "mosquitto-agent") == {("topic", "device-credentials", "literal", "READ"),
                                                 ("group", "mosquitto-agent-", "prefixed", "DESCRIBE")}
    assert _granted(acls, "adapter") == {
        *(("topic", t, "literal", "READ") for t in ("temperature-data", "temperature-threshold-events",
                                                     "temperature-rollups-1m", "device-registration",
                                                     "sensor-registration", "sensor-type-registration")),
        ("topic", "dead-letter", "literal", "WRITE"), ("group", "site-a-cassandra-adapter", "literal", "READ")}
    assert _granted(acls, "threshold-detector") == {
        ("topic", "temperature-data", "literal", "READ"), ("topic", "sensor-registration", "literal", "READ"),
        ("topic", "temperature-threshold-events", "literal", "WRITE"), ("topic", "dead-letter", "literal", "WRITE"),
        ("group", "site-a-threshold-detector", "prefixed", "READ")}
    assert _granted(acls, "rollups") == {
        ("topic", "temperature-data", "literal", "READ"), ("topic", "temperature-rollups-1m", "literal", "WRITE"),
        ("group", "site-a-rollups", "prefixed", "READ")}
    # Nobody at a site may administer it or touch every topic: no ALL, no cluster operation, no wildcard.
    assert not [a for a in acls if a["operation"] == "ALL" or a["resource"] == "cluster" or a["name"] == "*"]
    assert {a["principal"] for a in acls} == {"User:bridge", "User:adapter", "User:threshold-detector",
                                              "User:rollups", "User:mosquitto-agent"}


def test_datacenter_consumers_read_each_sites_relayed_topics_and_mirrormaker_owns_what_it_relays():
    acls = service_acls(_services("datacenter", "datacenter"), EDGE_ALIASES)
    relayed = ("temperature-threshold-events", "temperature-rollups-1m", "device-registration",
               "sensor-registration", "sensor-type-registration")
    assert _granted(acls, "adapter") == {
        *(("topic", f"{site}.{t}", "literal", "READ") for site in EDGE_ALIASES for t in relayed),
        ("topic", "dead-letter", "literal", "WRITE"), ("group", "datacenter-cassandra-adapter", "literal", "READ")}
    assert _granted(acls, "notifier") == {
        *(("topic", f"{site}.{t}", "literal", "READ") for site in EDGE_ALIASES
          for t in ("temperature-threshold-events", "sensor-registration", "device-registration")),
        ("topic", "notifications", "literal", "WRITE"), ("topic", "dead-letter", "literal", "WRITE"),
        ("group", "datacenter-notifier", "prefixed", "READ")}
    mirrormaker = _granted(acls, "mirrormaker")
    for site in EDGE_ALIASES:
        assert ("topic", f"{site}.", "prefixed", "ALL") in mirrormaker
        assert ("transactional_id", f"{site}-mm2", "prefixed", "ALL") in mirrormaker
        assert ("transactional_id", f"connect-cluster-{site}-mm2", "prefixed", "ALL") in mirrormaker
    assert ("topic", "mm2-", "prefixed", "ALL") in mirrormaker
    # It cannot write the datacenter's own topics (notifications, dead-letter).
    assert not [g for g in mirrormaker if g[0] == "topic" and g[1] in ("notifications", "dead-letter")]


def test_relaying_readings_lets_the_datacenter_adapter_read_them():
    relay = ["temperature-threshold-events", "temperature-data"]
    acls = service_acls(_services("datacenter", "datacenter", stack_relay_topics=relay), EDGE_ALIASES)
    assert {name for kind, name, _, op in _granted(acls, "adapter") if kind == "topic" and op == "READ"} == {
        f"{site}.{t}" for site in EDGE_ALIASES for t in relay}


def test_the_group_ids_of_readers_that_never_join_are_ones_their_principal_may_look_up():
    # librdkafka looks up the coordinator of a consumer's group.id even if it only assigns partitions; without
    # DESCRIBE the broker denied it every second and logged each denial (found in the lab's Kafka logs).
    import re

    edge = (REPO / "ansible/roles/stack/templates/stack-edge.yml.j2").read_text()
    owners = (REPO / "services/bridge/owners.py").read_text()
    agent = (REPO / "services/mosquitto_agent/app.py").read_text()
    assert 'BRIDGE_CLIENT_ID: "{% raw %}bridge-{{.Task.Slot}}' in edge
    assert 'MOSQUITTO_AGENT_CLIENT_ID: "{% raw %}mosquitto-agent-{{.Task.Slot}}' in edge
    assert re.search(r'"group.id": f"\{client_id\}-sensor-owners"', owners)
    assert re.search(r'"group.id": f"\{s.client_id\}-no-commits"', agent)
    acls = service_acls(_services("site_a", "edge"))
    looked_up = {(a["principal"], a["name"]) for a in acls if a["operation"] == "DESCRIBE"}
    assert looked_up == {("User:bridge", "bridge-"), ("User:mosquitto-agent", "mosquitto-agent-")}


def test_every_acl_is_one_iot_kafka_access_accepts():
    import json

    from services.commands import kafka_access
    for group, tier, sites in (("site_a", "edge", None), ("datacenter", "datacenter", EDGE_ALIASES)):
        acls = service_acls(_services(group, tier), sites)
        assert len(kafka_access.parse_acls(json.dumps(acls))) == len(acls) > 0


def test_every_kafka_client_in_the_stacks_logs_in_as_its_own_principal_inside_tls():
    from tooling.testbed.stack_render import render
    hostvars, groups = load_inventory(REPO / "inventory.example")
    for group, tier, alias in (("site_a", "edge", "site-a"), ("datacenter", "datacenter", "datacenter")):
        services = render(tier, site_topology(hostvars, groups[group], alias, tier))["services"]
        clients = {name: service for name, service in services.items()
                   if any(key.endswith("BOOTSTRAP") or key.endswith("BOOTSTRAP_SERVERS")
                          for key in service.get("environment", {}))}
        assert len(clients) == (5 if tier == "edge" else 2), sorted(clients)   # bridge, adapter, agent, jobs
        users = []
        for name, service in clients.items():
            user = service["environment"]["KAFKA_USERNAME"]
            assert service["environment"]["KAFKA_PASSWORD_FILE"] == "/run/secrets/kafka_password", name
            assert {"source": f"kafka_password_{user}", "target": "kafka_password"} in service["secrets"], name
            # Inside TLS, on SERVICES: the brokers' certificates checked against the site's brokers CA.
            bootstrap = next(value for key, value in service["environment"].items() if "BOOTSTRAP" in key)
            assert {address.split(":")[1] for address in bootstrap.split(",")} == {"9095"}, (name, bootstrap)
            assert service["environment"]["KAFKA_CA_FILE"] == "/run/secrets/kafka_brokers_ca.pem", name
            assert {"source": "kafka_brokers_ca", "target": "kafka_brokers_ca.pem"} in service["secrets"], name
            users.append(user)
        assert len(set(users)) == len(users), users          # no two services share a principal
        for name in (n for n in services if n.startswith("kafka-")):
            broker = services[name]
            assert broker["environment"]["KAFKA_INTERNAL_USER"] == "broker"
            assert {"source": "kafka_password_broker", "target": "kafka_internal_password"} in broker["secrets"]
            assert {"source": "kafka_password_admin", "target": "kafka_admin_password"} in broker["secrets"]
            assert broker["environment"]["KAFKA_INTERNAL_JAAS_FILE"] == "/run/secrets/kafka_internal_jaas"
            assert {"source": "kafka_internal_jaas", "target": "kafka_internal_jaas"} in broker["secrets"]
            assert "KAFKA_INTERNAL_PLAINTEXT" not in broker["environment"]


def test_the_brokers_login_secret_is_the_one_jaas_builders_line_for_the_broker_principal():
    from services.common import kafka_auth
    from tooling.testbed.stack_render import resolve, role_variables
    hostvars, groups = load_inventory(REPO / "inventory.example")
    variables = role_variables("edge", site_topology(hostvars, groups["site_a"], "site-a", "edge"),
                               __stack_kafka_passwords={"broker": 'p"w\\1', "admin": "a"})
    assert resolve(variables, "__stack_kafka_broker_jaas") == kafka_auth.properties_value(
        kafka_auth.jaas_config("broker", 'p"w\\1'))


def test_preflight_refuses_a_spark_job_without_its_topics_or_with_a_services_name():
    from tooling.lab import lab
    assert spark_job_refusals(stack_defaults()["stack_spark"]["jobs"]) == []
    assert spark_job_refusals(lab.LAB_JOBS) == []
    refusals = spark_job_refusals({"edge": [{"name": "bridge", "reads": ["a"], "writes": ["b"]},
                                                    {"name": "my-job", "reads": [], "writes": ["b"]},
                                                    {"name": "Bad Name", "reads": ["a"]}]})
    assert refusals == [
        "stack_spark.jobs.edge[0]: name 'bridge' is another service's Kafka principal; rename the job",
        "stack_spark.jobs.edge[1] (my-job): `reads` must list the Kafka topics the job reads, e.g. reads: "
        "[temperature-data]; its Kafka principal may use no other",
        "stack_spark.jobs.edge[2]: name 'Bad Name' must be 2-42 lower-case letters, digits or dashes (it names the "
        "job's service and its Kafka principal)",
        "stack_spark.jobs.edge[2] (Bad Name): `writes` must list the Kafka topics the job writes, e.g. writes: "
        "[temperature-data]; its Kafka principal may use no other"]
