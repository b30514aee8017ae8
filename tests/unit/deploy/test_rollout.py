"""Rolling upgrades (deploy/rollout.py): a changed stack is deployed in stages so that at
most one ZooKeeper, Kafka or Cassandra node changes at a time, the ZooKeeper leader last. Checked on the
stacks the templates render for inventory.example's site-a (three nodes of each)."""
from __future__ import annotations

import pytest
import yaml

from deploy.rollout import rollout_stages, zookeeper_leader, zookeeper_quorum
from deploy.topology import site_topology
from tooling.testbed.stack_render import REPO, image_ids, load_inventory, render

LABEL = "org.iot-stack.image-id"
STATEFUL = ["zookeeper-1", "zookeeper-2", "zookeeper-3", "kafka-1", "kafka-2", "kafka-3",
            "cassandra-1", "cassandra-2", "cassandra-3"]


@pytest.fixture(scope="module")
def topology():
    hostvars, groups = load_inventory(REPO / "inventory.example")
    return site_topology(hostvars, groups["site_a"], "site-a", "edge")


def text(stack: dict) -> str:
    return yaml.safe_dump(stack, sort_keys=False)


def stages(before: dict, after: dict, leader=None) -> list[dict]:
    return [{"service": s["service"], "stack": yaml.safe_load(s["text"]), "kafka_tls": s["kafka_tls"]}
            for s in rollout_stages(text(before), text(after), leader)]


def test_nothing_to_stage_on_a_first_deploy_or_when_only_stateless_services_change(topology):
    before = render("edge", topology, ids=image_ids())
    assert rollout_stages("", text(before)) == []
    assert stages(before, render("edge", topology, ids=image_ids(services="rebuilt"))) == []
    assert stages(before, before) == []


def test_every_image_rebuilt_rolls_one_stateful_node_per_stage_leader_last(topology):
    before = render("edge", topology, ids=image_ids())
    after = render("edge", topology, ids=image_ids(kafka="v2", cassandra="v2", services="v2"))
    planned = stages(before, after, leader="2")
    order = [s["service"] for s in planned]
    assert order == ["", "zookeeper-1", "zookeeper-3", "zookeeper-2", "kafka-1", "kafka-2", "kafka-3",
                     "cassandra-1", "cassandra-2", "cassandra-3"]
    for index, stage in enumerate(planned):
        services = stage["stack"]["services"]
        rolled = {name for name in STATEFUL
                  if services[name]["labels"][LABEL] == after["services"][name]["labels"][LABEL]}
        assert rolled == set(order[1:index + 1]), (index, rolled)      # exactly one more per stage
        assert services["bridge"] == after["services"]["bridge"]      # stateless services change in stage 0
    assert planned[-1]["stack"]["services"] == after["services"]


def test_a_kept_node_whose_secret_changed_keeps_the_deployed_secret(topology):
    before = render("edge", topology, ids=image_ids())
    after = render("edge", topology, ids=image_ids(kafka="v2"))
    rotated = "kafka_password_admin"
    after["secrets"][rotated] = dict(after["secrets"][rotated], name=after["secrets"][rotated]["name"] + "x")
    first = stages(before, after)[0]["stack"]
    kept = first["services"]["kafka-1"]
    refs = {ref["target"]: ref["source"] for ref in kept["secrets"]}
    assert refs["kafka_admin_password"] == rotated + "__deployed", kept["secrets"]
    assert first["secrets"][rotated + "__deployed"] == {"external": True, "name": before["secrets"][rotated]["name"]}
    assert first["secrets"][rotated] == after["secrets"][rotated]          # the new one, for stateless services


def test_a_changed_secret_alone_counts_as_a_change_of_the_nodes_that_use_it(topology):
    before = render("edge", topology, ids=image_ids())
    after = render("edge", topology, ids=image_ids())
    after["secrets"]["cassandra_password"] = dict(after["secrets"]["cassandra_password"],
                                                  name="site-a_cassandra_password_new")
    order = [s["service"] for s in stages(before, after)]
    assert order == ["", "cassandra-1", "cassandra-2", "cassandra-3"]


@pytest.mark.parametrize("lines, nodes, quorum, leader", [
    (["1 follower", "2 leader", "3 follower"], 3, True, "2"),
    (["1 follower", "2 ", "3 follower"], 3, False, ""),               # node 2 does not answer
    (["1 follower", "2 follower", "3 follower"], 3, False, ""),       # no leader: election under way
    (["1 standalone"], 1, True, ""),
    (["1 follower", "2 leader"], 3, False, "2"),
])
def test_zookeeper_quorum_and_leader_from_srvr(lines, nodes, quorum, leader):
    assert zookeeper_quorum(lines, nodes) is quorum
    assert zookeeper_leader(lines) == leader


BROKERS = ("kafka-1", "kafka-2", "kafka-3")
KAFKA_CLIENTS = ("bridge", "mosquitto-agent", "cassandra-adapter", "threshold-detector")


def with_internal(stack: dict) -> dict:
    """A site's stack as deployed before INTERNAL closed: the brokers on the image's listeners, INTERNAL open."""
    for name in BROKERS:
        env = stack["services"][name]["environment"]
        del env["KAFKA_LISTENERS"], env["KAFKA_HEALTH_PORT"]
        env["KAFKA_ADVERTISED_LISTENERS"] = f"INTERNAL://{name}:9092," + env["KAFKA_ADVERTISED_LISTENERS"]
    return stack


def without_services(stack: dict) -> dict:
    """A site's stack as deployed before the SERVICES listener: the brokers without it and with INTERNAL, the
    clients logging in to INTERNAL in clear (no brokers CA, bootstrap on 9092; MirrorMaker's login is in its
    properties file, its brokers CA the one sign of it in the stack)."""
    with_internal(stack)
    for name in BROKERS:
        env = stack["services"][name]["environment"]
        env["KAFKA_ADVERTISED_LISTENERS"] = env["KAFKA_ADVERTISED_LISTENERS"].replace(f",SERVICES://{name}:9095", "")
    clients = [name for name, service in stack["services"].items() if not name.startswith("kafka-")
               and {"source": "kafka_brokers_ca", "target": "kafka_brokers_ca.pem"} in service.get("secrets", [])]
    for name in clients:
        service = stack["services"][name]
        env = service["environment"]
        env.pop("KAFKA_CA_FILE", None)
        for key, value in env.items():
            if "BOOTSTRAP" in key:
                env[key] = value.replace(":9095", ":9092")
        service["secrets"] = [s for s in service["secrets"] if "kafka_brokers_ca" not in str(s)]
    return stack


def test_brokers_open_services_before_any_client_moves_onto_it(topology):
    """A site deployed before the SERVICES listener (issue 30): a client on SERVICES could reach no broker
    without it, so every broker first opens SERVICES beside INTERNAL, one per stage, while the clients stay as
    deployed; they move in the first stage after, and each broker then restarts once more, on its new
    definition, which closes INTERNAL."""
    before = without_services(render("edge", topology, ids=image_ids()))
    after = render("edge", topology, ids=image_ids())
    planned = stages(before, after)
    assert [s["service"] for s in planned] == [
        "", "kafka-1 (SERVICES opened)", "kafka-2 (SERVICES opened)", "kafka-3 (SERVICES opened)",
        "kafka-1", "kafka-2", "kafka-3"]
    for index, stage in enumerate(planned):
        services = stage["stack"]["services"]
        opened = [name for name in BROKERS
                  if "SERVICES://" in services[name]["environment"]["KAFKA_ADVERTISED_LISTENERS"]]
        assert opened == list(BROKERS[:min(index, 3)]), (index, opened)
        clients = {name: services[name] == after["services"][name] for name in KAFKA_CLIENTS}
        assert clients == dict.fromkeys(KAFKA_CLIENTS, index >= 4), (index, clients)
        assert services["mosquitto"] == after["services"]["mosquitto"]      # the rest changes in stage 0
    assert planned[-1]["stack"]["services"] == after["services"]
    # The Kafka gate (health role) goes to SERVICES only once every broker has it, INTERNAL until then.
    assert [s["kafka_tls"] for s in planned] == [False] * 4 + [True] * 3
    # An opened broker keeps INTERNAL, which its new definition closes, for the clients not yet moved.
    for index, stage in enumerate(planned):
        for number, name in enumerate(BROKERS, start=1):
            env = stage["stack"]["services"][name]["environment"]
            internal = "INTERNAL://" in env["KAFKA_ADVERTISED_LISTENERS"]
            assert internal == (index < 4 + number - 1), (index, name, env["KAFKA_ADVERTISED_LISTENERS"])
            if internal and index > 0 and number <= index:     # opened: SERVICES beside INTERNAL
                assert env["KAFKA_LISTENERS"].startswith("INTERNAL://0.0.0.0:9092,"), env["KAFKA_LISTENERS"]
                assert "SERVICES://0.0.0.0:9095" in env["KAFKA_LISTENERS"]


def test_a_site_with_services_closes_internal_one_broker_at_a_time(topology):
    """A site deployed with SERVICES and INTERNAL (every client already on SERVICES): each broker rolls once
    onto its definition without INTERNAL, the Kafka gate on SERVICES throughout."""
    before = with_internal(render("edge", topology, ids=image_ids()))
    after = render("edge", topology, ids=image_ids())
    planned = stages(before, after)
    assert [s["service"] for s in planned] == ["", *BROKERS]
    assert all(s["kafka_tls"] for s in planned)
    advertised = [[("INTERNAL://" in s["stack"]["services"][b]["environment"]["KAFKA_ADVERTISED_LISTENERS"])
                   for b in BROKERS] for s in planned]
    assert advertised == [[True] * 3, [False, True, True], [False, False, True], [False] * 3]
    assert planned[-1]["stack"]["services"] == after["services"]


def test_the_datacenters_mirrormaker_waits_for_services_too():
    """MirrorMaker's login to its own cluster is in its properties file, not its environment: the brokers CA it
    gains holds it back with the other clients (it would otherwise fail to write to the datacenter's brokers
    until they opened SERVICES)."""
    hostvars, groups = load_inventory(REPO / "inventory.example")
    datacenter = site_topology(hostvars, groups["datacenter"], "datacenter", "datacenter")
    before = without_services(render("datacenter", datacenter, ids=image_ids()))
    after = render("datacenter", datacenter, ids=image_ids())
    planned = stages(before, after)
    brokers = [f"kafka-{k['id']}" for k in datacenter["kafka"]]
    assert [s["service"] for s in planned] == ["", *(f"{b} (SERVICES opened)" for b in brokers), *brokers]
    moved = [stage["stack"]["services"]["mirrormaker"] == after["services"]["mirrormaker"] for stage in planned]
    assert moved == [False] * (1 + len(brokers)) + [True] * len(brokers)


def test_brokers_open_broker_before_any_moves_its_replication_onto_it(topology):
    """A site deployed before the BROKER listener (issue 30): a broker replicating on BROKER could fetch from no
    broker without it, so every broker first opens BROKER with replication still on INTERNAL, one per stage,
    and only then does each move onto it (found in the lab: the gate waited on under-replicated partitions)."""
    before, after = (without_services(render("edge", topology, ids=image_ids())) for _ in range(2))
    for name in ("kafka-1", "kafka-2", "kafka-3"):
        env = before["services"][name]["environment"]
        env["KAFKA_ADVERTISED_LISTENERS"] = env["KAFKA_ADVERTISED_LISTENERS"].replace(
            f"BROKER://{name}:9093,", "")
        del env["KAFKA_BROKER_KEYSTORE_FILE"], env["KAFKA_BROKER_CA_FILE"]
    planned = stages(before, after)
    assert [s["service"] for s in planned] == [
        "", "kafka-1 (BROKER opened)", "kafka-2 (BROKER opened)", "kafka-3 (BROKER opened)",
        "kafka-1", "kafka-2", "kafka-3"]
    assert [s["node"] for s in rollout_stages(text(before), text(after))] == \
        ["", "kafka-1", "kafka-2", "kafka-3", "kafka-1", "kafka-2", "kafka-3"]

    def state(stage: dict, name: str) -> str:
        env = stage["stack"]["services"][name]["environment"]
        if "BROKER://" not in env["KAFKA_ADVERTISED_LISTENERS"]:
            return "deployed"
        return "opened" if env.get("KAFKA_INTER_BROKER_LISTENER_NAME") == "INTERNAL" else "new"

    brokers = ("kafka-1", "kafka-2", "kafka-3")
    assert [[state(stage, name) for name in brokers] for stage in planned] == [
        ["deployed", "deployed", "deployed"],
        ["opened", "deployed", "deployed"], ["opened", "opened", "deployed"], ["opened", "opened", "opened"],
        ["new", "opened", "opened"], ["new", "new", "opened"], ["new", "new", "new"]]
    assert planned[-1]["stack"]["services"] == after["services"]
    # A site that has BROKER already rolls its brokers once each, as before.
    rebuilt = without_services(render("edge", topology, ids=image_ids(kafka="v2")))
    assert [s["service"] for s in stages(after, rebuilt)][1:4] == ["zookeeper-1", "zookeeper-2", "zookeeper-3"]
    assert not any("opened" in s["service"] for s in stages(after, rebuilt))


def nodes_of(count: int) -> list[str]:
    return [f"cassandra-{n}" for n in range(1, count + 1)]


def internode(stack: dict, name: str) -> str:
    """A Cassandra node's TLS between nodes as its entrypoint reads it ('off': an image from before it)."""
    env = stack["services"][name]["environment"]
    return env.get("CASSANDRA_INTERNODE_TLS", "off") if "CASSANDRA_TLS_KEYSTORE_FILE" in env else "off"


def before_internode_tls(topology) -> dict:
    """Site-a's stack as deployed before TLS between Cassandra nodes: CQL over TLS, the setting not named."""
    before = render("edge", topology, ids=image_ids())
    for name in nodes_of(3):
        del before["services"][name]["environment"]["CASSANDRA_INTERNODE_TLS"]
    return before


def test_cassandra_nodes_take_tls_before_any_client_or_node_requires_it(topology):
    """A site deployed before CQL over TLS (issue 30): a node requiring TLS would refuse the adapter still in
    clear, and an adapter requiring it would reach no node. So every node first takes both, one per stage,
    while the adapter stays as deployed and the health role probes in clear; then, between nodes, each sends
    TLS; then the adapter moves onto TLS and each node in turn refuses clear."""
    before = before_internode_tls(topology)
    for name in nodes_of(3):
        service = before["services"][name]
        del service["environment"]["CASSANDRA_TLS_KEYSTORE_FILE"], service["environment"]["CASSANDRA_TLS_CA_FILE"]
        service["secrets"] = [secret for secret in service["secrets"]
                              if "cassandra_ca" not in str(secret) and "keystore" not in str(secret)]
    adapter = before["services"]["cassandra-adapter"]
    del adapter["environment"]["ADAPTER_CASSANDRA_CA_FILE"]
    adapter["secrets"] = [s for s in adapter["secrets"] if "cassandra_ca" not in str(s)]
    after = render("edge", topology, ids=image_ids())
    planned = rollout_stages(text(before), text(after))
    assert [s["service"] for s in planned] == [
        "", "cassandra-1 (CQL over TLS opened)", "cassandra-2 (CQL over TLS opened)",
        "cassandra-3 (CQL over TLS opened)", "cassandra-1 (inter-node TLS sent)", "cassandra-2 (inter-node TLS sent)",
        "cassandra-3 (inter-node TLS sent)", "cassandra-1", "cassandra-2", "cassandra-3"]
    assert [s["cassandra_tls"] for s in planned] == [False] * 7 + [True] * 3
    # The role drains and gates by `node`, the service itself (a drain of "cassandra-1 (CQL over TLS
    # opened)" was a shell syntax error in the lab, 2026-11-29).
    assert [s["node"] for s in planned] == ["", *nodes_of(3), *nodes_of(3), *nodes_of(3)]

    def state(stack: dict, name: str) -> str:
        env = stack["services"][name]["environment"]
        if "CASSANDRA_TLS_KEYSTORE_FILE" not in env:
            return "clear"
        return "both" if env.get("CASSANDRA_CLIENT_TLS") == "optional" else "tls"

    stacks = [yaml.safe_load(s["text"]) for s in planned]
    assert [[state(stack, name) for name in nodes_of(3)] for stack in stacks] == [
        ["clear", "clear", "clear"],
        ["both", "clear", "clear"], ["both", "both", "clear"], ["both", "both", "both"],
        ["both", "both", "both"], ["both", "both", "both"], ["both", "both", "both"],
        ["tls", "both", "both"], ["tls", "tls", "both"], ["tls", "tls", "tls"]]
    assert [[internode(stack, name) for name in nodes_of(3)] for stack in stacks] == INTERNODE_ROLL
    adapter_tls = ["ADAPTER_CASSANDRA_CA_FILE" in stack["services"]["cassandra-adapter"]["environment"]
                   for stack in stacks]
    assert adapter_tls == [False] * 7 + [True] * 3
    assert stacks[-1]["services"] == after["services"]
    # A site with CQL over TLS already rolls its nodes once each, and its probes use TLS throughout.
    rebuilt = rollout_stages(text(after), text(render("edge", topology, ids=image_ids(cassandra="v2"))))
    assert [s["service"] for s in rebuilt] == ["", "cassandra-1", "cassandra-2", "cassandra-3"]
    assert all(s["cassandra_tls"] for s in rebuilt)


# Each stage, each node's TLS between nodes: every node takes TLS before any sends it, and every node sends it
# before any refuses clear, so no link is ever between a node sending clear and one refusing it.
INTERNODE_ROLL = [
    ["off", "off", "off"],
    ["accepting", "off", "off"], ["accepting", "accepting", "off"], ["accepting", "accepting", "accepting"],
    ["sending", "accepting", "accepting"], ["sending", "sending", "accepting"], ["sending", "sending", "sending"],
    ["required", "sending", "sending"], ["required", "required", "sending"], ["required", "required", "required"]]


def test_cassandra_nodes_with_cql_over_tls_roll_tls_between_them_in_three_passes(topology):
    """A site deployed with CQL over TLS but clear between its Cassandra nodes: a node refusing clear must
    only ever hear from peers sending TLS, and a node sending TLS only reach peers taking it. CQL stays on TLS
    throughout, so the health role's probes use TLS and no client changes."""
    before, after = before_internode_tls(topology), render("edge", topology, ids=image_ids())
    planned = rollout_stages(text(before), text(after))
    assert [s["service"] for s in planned] == [
        "", *(f"{n} (inter-node TLS accepted)" for n in nodes_of(3)),
        *(f"{n} (inter-node TLS sent)" for n in nodes_of(3)), *nodes_of(3)]
    assert all(s["cassandra_tls"] for s in planned)
    stacks = [yaml.safe_load(s["text"]) for s in planned]
    assert [[internode(stack, name) for name in nodes_of(3)] for stack in stacks] == INTERNODE_ROLL
    assert not any(stack["services"][name]["environment"].get("CASSANDRA_CLIENT_TLS")
                   for stack in stacks for name in nodes_of(3))
    assert stacks[-1]["services"] == after["services"]


def test_a_cassandra_node_alone_in_its_ring_moves_onto_tls_between_nodes_in_one_restart(topology):
    """A site with one Cassandra node (site-b in the lab): nobody to hear it in clear, so no passes (each would
    be a restart of the site's only storage)."""
    before, after = before_internode_tls(topology), render("edge", topology, ids=image_ids())
    for stack in (before, after):
        for name in ("cassandra-2", "cassandra-3"):
            del stack["services"][name]
    planned = rollout_stages(text(before), text(after))
    assert [s["service"] for s in planned] == ["", "cassandra-1"]
    assert internode(yaml.safe_load(planned[-1]["text"]), "cassandra-1") == "required"


ZOOKEEPERS = ("zookeeper-1", "zookeeper-2", "zookeeper-3")


def without_zookeeper_tls(stack: dict) -> dict:
    """A site's stack as deployed before ZooKeeper took clients over TLS: the servers' client port in clear on
    every address, the brokers reaching it there without the ZooKeeper CA, the servers' quorum in clear."""
    for name in ZOOKEEPERS:
        service = stack["services"][name]
        env = service["environment"]
        for key in ("ZOO_TLS_KEYSTORE_FILE", "ZOO_CLIENT_TLS", "ZOO_TLS_CA_FILE", "ZOO_QUORUM_TLS"):
            del env[key]
        env["ZOO_SERVERS"] = " ".join(f"{server};2181" for server in env["ZOO_SERVERS"].split())
        service["secrets"] = [s for s in service["secrets"] if "keystore" not in str(s) and "_ca" not in str(s)]
    for name in BROKERS:
        service = stack["services"][name]
        env = service["environment"]
        del env["KAFKA_ZOOKEEPER_CA_FILE"]
        env["KAFKA_ZOOKEEPER_CONNECT"] = env["KAFKA_ZOOKEEPER_CONNECT"].replace(":2182", ":2181")
        service["secrets"] = [s for s in service["secrets"] if "zookeeper_ca" not in str(s)]
    return stack


QUORUM_ORDER = {"off": 0, "accepting": 1, "sending": 2, "required": 3}


def test_zookeeper_servers_open_tls_and_close_clear_only_after_every_broker_moved(topology):
    """A site deployed before ZooKeeper over TLS (issue 30): each server first takes clients over TLS and in
    clear, and its peers over TLS and in clear, one per stage, the leader last; then each sends TLS to its
    peers; each broker then moves onto TLS; only then does each server restart on its definition that takes
    clear on its loopback only and TLS only from its peers. No stage has a broker that cannot reach every
    server, nor a server that refuses what a peer sends it."""
    before = without_zookeeper_tls(render("edge", topology, ids=image_ids()))
    after = render("edge", topology, ids=image_ids())
    planned = stages(before, after, leader="2")
    opened, sent = " (clients over TLS opened, inter-node TLS accepted)", " (inter-node TLS sent)"
    assert [s["service"] for s in planned] == [
        "", "zookeeper-1" + opened, "zookeeper-3" + opened, "zookeeper-2" + opened,
        "zookeeper-1" + sent, "zookeeper-3" + sent, "zookeeper-2" + sent, *BROKERS,
        "zookeeper-1", "zookeeper-3", "zookeeper-2"]
    for index, stage in enumerate(planned):
        services = stage["stack"]["services"]
        quorum = [QUORUM_ORDER[services[name]["environment"].get("ZOO_QUORUM_TLS", "off")] for name in ZOOKEEPERS]
        if max(quorum) >= QUORUM_ORDER["sending"]:
            assert min(quorum) >= QUORUM_ORDER["accepting"], (index, quorum)    # TLS sent only to who takes it
        if max(quorum) == QUORUM_ORDER["required"]:
            assert min(quorum) >= QUORUM_ORDER["sending"], (index, quorum)      # clear refused only when none sends it
        modes = {name: services[name]["environment"].get("ZOO_CLIENT_TLS", "clear") for name in ZOOKEEPERS}
        on_tls = [name for name in BROKERS if "KAFKA_ZOOKEEPER_CA_FILE" in services[name]["environment"]]
        if on_tls:
            assert "clear" not in modes.values(), (index, modes)       # a broker on TLS reaches every server
        if "required" in modes.values():
            assert on_tls == list(BROKERS), (index, on_tls)             # no broker left in clear
        assert set(modes.values()) <= {"clear", "optional", "required"}, modes
        if 1 <= index <= 6:
            assert services[planned[index]["service"].split()[0]]["environment"]["ZOO_CLIENT_TLS"] == "optional"
    assert planned[-1]["stack"]["services"] == after["services"]
    assert all(s["kafka_tls"] for s in planned)
