"""Logins survive the loss of a Cassandra node, and the adapter logs in with its own role.

images/cassandra/bin/cassandra-auth-setup runs on every Cassandra start. Its plain-Python
part is checked here against a small in-memory model of the auth tables: from a new
cluster it replicates system_auth like the data (NetworkTopologyStrategy, the wanted
replicas capped at the nodes the cluster has), raises the adapter's keyspace the same
way when a node joins (never lowering either), creates the adapter's role (login, no
superuser) and grants it only CREATE on keyspaces and SELECT/MODIFY on its keyspace; run
again, it changes nothing. The stacks give every node the same wanted figure whatever
the node count (so a new node changes no other node's spec) and give the adapter that
role and only its own secret. tests/integration/test_cassandra_image.py runs it in the
real image; tests/lab/test_9_grow_cassandra.py adds a node to a running site.
"""
from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import re
import sys

import pytest

from deploy.topology import site_topology
from tooling.testbed.stack_render import REPO, render, stack_defaults

_LOADER = importlib.machinery.SourceFileLoader("cassandra_auth_setup",
                                               str(REPO / "images/cassandra/bin/cassandra-auth-setup"))
_SPEC = importlib.util.spec_from_loader(_LOADER.name, _LOADER)
auth = importlib.util.module_from_spec(_SPEC)
sys.modules[_LOADER.name] = auth      # dataclasses look their module up there
_LOADER.exec_module(auth)

SIMPLE_1 = {"class": "org.apache.cassandra.locator.SimpleStrategy", "replication_factor": "1"}


class FakeCassandra(auth.Cql):
    """The auth state a superuser sees: system_auth's replication, roles, keyspaces, permissions."""

    def __init__(self, keyspaces=(), roles=None, system_auth=None, nodes=3):
        self.replication = {"system_auth": dict(system_auth or SIMPLE_1),
                            **{k: {"class": auth.NTS, "site-a": "1"} for k in keyspaces}}
        self.nodes = nodes                    # all in DC site-a
        self.roles = dict(roles or {})        # name -> {can_login, is_superuser, password}
        self.permissions: set[tuple[str, str, str]] = set()   # (role, resource, permission)
        self.writes: list[str] = []

    def execute(self, statement, params=()):
        if statement.startswith("SELECT replication FROM system_schema.keyspaces"):
            return [{"replication": dict(self.replication[params[0]])}] if params[0] in self.replication else []
        if statement == "SELECT data_center FROM system.local":
            return [{"data_center": "site-a"}]
        if statement == "SELECT data_center FROM system.peers_v2":
            return [{"data_center": "site-a"}] * (self.nodes - 1)
        if statement.startswith("SELECT can_login, is_superuser FROM system_auth.roles"):
            role = self.roles.get(params[0])
            return [{"can_login": role["can_login"], "is_superuser": role["is_superuser"]}] if role else []
        if statement.startswith("SELECT keyspace_name FROM system_schema.keyspaces"):
            return [{"keyspace_name": params[0]}] if params[0] in self.replication else []
        if match := re.fullmatch(r"LIST ALL PERMISSIONS OF (\w+) NORECURSIVE", statement):
            return [{"role": r, "username": r, "resource": res, "permission": p}
                    for r, res, p in sorted(self.permissions) if r == match[1]]
        self.writes.append(statement)
        if match := re.fullmatch(r"ALTER KEYSPACE (\w+) WITH replication = (\{.*\})", statement):
            replication = ast.literal_eval(match[2])
            assert replication.pop("class") == "NetworkTopologyStrategy"
            self.replication[match[1]] = {"class": auth.NTS, **{dc: str(n) for dc, n in replication.items()}}
        elif match := re.fullmatch(r"CREATE ROLE IF NOT EXISTS (\w+) WITH PASSWORD = %s AND LOGIN = true "
                                   r"AND SUPERUSER = false", statement):
            self.roles.setdefault(match[1], {"can_login": True, "is_superuser": False, "password": params[0]})
        elif match := re.fullmatch(r"ALTER ROLE (\w+) WITH (.*)", statement):
            role, values = self.roles[match[1]], list(params)
            for option in match[2].split(" AND "):
                key, value = option.split(" = ")
                role[{"PASSWORD": "password", "LOGIN": "can_login", "SUPERUSER": "is_superuser"}[key]] = \
                    values.pop(0) if value == "%s" else value == "true"
        elif match := re.fullmatch(r"GRANT (\w+) ON (ALL KEYSPACES|KEYSPACE \w+) TO (\w+)", statement):
            resource = "<all keyspaces>" if match[2] == "ALL KEYSPACES" else f"<keyspace {match[2].split()[1]}>"
            self.permissions.add((match[3], resource, match[1]))
        else:
            raise AssertionError(f"unexpected statement: {statement}")
        return []

    def login(self, role, password) -> bool:
        return role in self.roles and self.roles[role]["password"] == password and self.roles[role]["can_login"]


CONFIG = auth.Config(password="superuser-secret", replication={"site-a": 3}, adapter_role="iot_adapter",
                     adapter_password="adapter-secret", adapter_keyspace="iot")


def run(db: FakeCassandra, config=CONFIG) -> list[str]:
    return auth.setup(db, config, lambda: db.login(config.adapter_role, config.adapter_password)).changed


# ------------------------------------------------------------------ from a new cluster, then again

def test_new_cluster_gets_replicated_system_auth_and_a_least_privilege_adapter_role():
    db = FakeCassandra()
    changed = run(db)
    assert changed == [
        "ALTER KEYSPACE system_auth WITH replication = {'class': 'NetworkTopologyStrategy', 'site-a': 3}",
        "CREATE ROLE IF NOT EXISTS iot_adapter WITH PASSWORD = '***' AND LOGIN = true AND SUPERUSER = false",
        "GRANT CREATE ON ALL KEYSPACES TO iot_adapter",
    ]
    assert db.replication["system_auth"] == {"class": auth.NTS, "site-a": "3"}
    assert db.roles["iot_adapter"] == {"can_login": True, "is_superuser": False, "password": "adapter-secret"}
    assert db.permissions == {("iot_adapter", "<all keyspaces>", "CREATE")}


def test_second_run_changes_nothing():
    db = FakeCassandra()
    run(db)
    writes = len(db.writes)
    assert run(db) == []
    assert len(db.writes) == writes


def test_existing_keyspace_gets_select_and_modify_for_the_adapter():
    """A site deployed before: iot was created by the superuser, so the adapter does not own it."""
    db = FakeCassandra(keyspaces=["iot"])
    run(db)
    assert db.permissions == {("iot_adapter", "<all keyspaces>", "CREATE"), ("iot_adapter", "<keyspace iot>", "SELECT"),
                              ("iot_adapter", "<keyspace iot>", "MODIFY")}
    assert run(db) == []


def test_adapter_that_created_its_keyspace_gets_nothing_more():
    """Cassandra grants a keyspace's creator its permissions on it; nothing is granted twice or revoked."""
    db = FakeCassandra()
    run(db)
    db.replication["iot"] = {"class": auth.NTS, "site-a": "3"}     # as the adapter created it
    db.permissions |= {("iot_adapter", "<keyspace iot>", p) for p in ("ALTER", "DROP", "SELECT", "MODIFY")}
    assert run(db) == []


def test_rotated_password_is_set_without_recreating_the_role():
    db = FakeCassandra()
    run(db)
    rotated = auth.Config(**{**CONFIG.__dict__, "adapter_password": "rotated-secret"})
    assert run(db, rotated) == ["ALTER ROLE iot_adapter WITH PASSWORD = '***'"]
    assert db.login("iot_adapter", "rotated-secret")


def test_a_role_made_superuser_is_demoted():
    db = FakeCassandra(roles={"iot_adapter": {"can_login": False, "is_superuser": True, "password": "adapter-secret"}})
    changed = run(db)
    # It could not log in, so its password is set again too.
    assert "ALTER ROLE iot_adapter WITH PASSWORD = '***' AND LOGIN = true AND SUPERUSER = false" in changed
    assert db.roles["iot_adapter"]["is_superuser"] is False


def test_system_auth_already_replicated_is_left_alone():
    assert auth.replication_change("system_auth", {"class": auth.NTS, "site-a": "3"}, {"site-a": 3}, True) == \
        (None, {"site-a": 3})
    assert auth.replication_change("system_auth", {"class": auth.NTS, "site-a": "1"}, {"site-a": 3}, True)[0] \
        is not None
    assert auth.replication_change("system_auth", SIMPLE_1, {}, True) == (None, {}), \
        "without CASSANDRA_REPLICATION nothing changes"


@pytest.mark.parametrize("current, wanted, alter, after", [
    ({"site-a": "1"}, {"site-a": 2}, "{'class': 'NetworkTopologyStrategy', 'site-a': 2}", {"site-a": 2}),
    ({"site-a": "3"}, {"site-a": 2}, None, {"site-a": 3}),                  # never lowered
    ({"site-a": "1", "dc-x": "2"}, {"site-a": 3}, "{'class': 'NetworkTopologyStrategy', 'dc-x': 2, 'site-a': 3}",
     {"site-a": 3, "dc-x": 2}),                                                 # a DC not named keeps its replicas
])
def test_replication_is_only_raised(current, wanted, alter, after):
    statement, replication = auth.replication_change("iot", {"class": auth.NTS, **current}, wanted)
    assert statement == (f"ALTER KEYSPACE iot WITH replication = {alter}" if alter else None)
    assert replication == after


def test_a_keyspace_with_another_strategy_is_the_operators():
    assert auth.replication_change("iot", SIMPLE_1, {"site-a": 3}) == (None, {})


@pytest.mark.parametrize("wanted, nodes, replicas", [
    ({"site-a": 3}, {"site-a": 1}, {"site-a": 1}),
    ({"site-a": 3}, {"site-a": 2}, {"site-a": 2}),
    ({"site-a": 3}, {"site-a": 5}, {"site-a": 3}),
    ({"site-a": 3}, {}, {"site-a": 1}),           # no node seen in the DC (a typo in CASSANDRA_DC): one replica
])
def test_wanted_replicas_are_capped_at_the_nodes(wanted, nodes, replicas):
    assert auth.capped(wanted, nodes) == replicas


# ------------------------------------------------------------------ a node joins

def test_a_joining_node_raises_both_keyspaces_by_one_and_repairs_them():
    db = FakeCassandra(keyspaces=["iot"], nodes=1)
    run(db)
    assert db.replication["system_auth"] == db.replication["iot"] == {"class": auth.NTS, "site-a": "1"}
    db.nodes = 2                            # what the new node's set-up sees
    outcome = auth.setup(db, CONFIG, lambda: db.login(CONFIG.adapter_role, CONFIG.adapter_password))
    assert outcome.changed == [
        "ALTER KEYSPACE system_auth WITH replication = {'class': 'NetworkTopologyStrategy', 'site-a': 2}",
        "ALTER KEYSPACE iot WITH replication = {'class': 'NetworkTopologyStrategy', 'site-a': 2}",
    ]
    assert outcome.replication == {"system_auth": {"site-a": 2}, "iot": {"site-a": 2}}
    assert all(auth.repair_needed(r, None) for r in outcome.replication.values()), "a new node repairs both"
    db.nodes = 4
    run(db)
    assert db.replication["iot"] == {"class": auth.NTS, "site-a": "3"}, "up to the wanted figure"
    assert run(db) == []


def test_without_an_adapter_role_only_system_auth_is_set():
    db = FakeCassandra()
    assert run(db, auth.Config(password="x" * 8, replication={"site-a": 1})) == [
        "ALTER KEYSPACE system_auth WITH replication = {'class': 'NetworkTopologyStrategy', 'site-a': 1}"]
    assert db.roles == {}


# ------------------------------------------------------------------ repair after a change, once per node

@pytest.mark.parametrize("replication, marker, needed", [
    ({"site-a": 1}, None, False),          # one node: nothing to repair
    ({"site-a": 3}, None, True),
    ({"site-a": 3}, "site-a:3", False),    # this node already repaired for this setting
    ({"site-a": 3}, "site-a:2", True),
    ({}, None, False),
])
def test_repair_runs_once_per_node_and_setting(replication, marker, needed):
    assert auth.repair_needed(replication, marker) is needed


# ------------------------------------------------------------------ configuration from the environment

def _env(tmp_path, **extra):
    (tmp_path / "su").write_text("superuser-secret\n")
    (tmp_path / "ad").write_text("adapter-secret\n")
    return {"CASSANDRA_PASSWORD_FILE": str(tmp_path / "su"), "CASSANDRA_ADAPTER_PASSWORD_FILE": str(tmp_path / "ad"),
            **extra}


def test_config_reads_the_environment(tmp_path):
    config = auth.config_from(_env(tmp_path, CASSANDRA_REPLICATION="site-a:3",
                                   CASSANDRA_ADAPTER_ROLE="iot_adapter"))
    assert config == CONFIG


@pytest.mark.parametrize("extra, message", [
    ({"CASSANDRA_ADAPTER_ROLE": "cassandra"}, "CASSANDRA_ADAPTER_ROLE='cassandra' must be"),
    ({"CASSANDRA_ADAPTER_ROLE": "x; DROP KEYSPACE iot"}, "CASSANDRA_ADAPTER_ROLE="),
    ({"CASSANDRA_ADAPTER_ROLE": "ok", "CASSANDRA_ADAPTER_KEYSPACE": "Iot"}, "CASSANDRA_ADAPTER_KEYSPACE='Iot'"),
    ({"CASSANDRA_REPLICATION": "site-a"}, "'site-a' is not <dc>:<replicas>"),
    ({"CASSANDRA_REPLICATION": "site-a:0"}, "'site-a:0' is not <dc>:<replicas>"),
])
def test_bad_config_is_named(tmp_path, extra, message):
    with pytest.raises(auth.ConfigError, match=re.escape(message)):
        auth.config_from(_env(tmp_path, **extra))


def test_role_without_password_file_is_refused(tmp_path):
    env = _env(tmp_path, CASSANDRA_ADAPTER_ROLE="iot_adapter")
    del env["CASSANDRA_ADAPTER_PASSWORD_FILE"]
    with pytest.raises(auth.ConfigError, match="needs CASSANDRA_ADAPTER_PASSWORD_FILE"):
        auth.config_from(env)


# ------------------------------------------------------------------ the stacks wire it up

NODES = {f"n{i}": {"swarm_role": "manager" if i == 1 else "worker", "zookeeper_id": 1 if i == 1 else None,
                   "kafka_id": i, "cassandra_id": i, "apps_node": i == 1, "mqtt_node": i == 1} for i in (1, 2, 3, 4)}


@pytest.mark.parametrize("nodes, replicas", [(1, 1), (2, 2), (4, 3)])
@pytest.mark.parametrize("tier", ["edge", "datacenter"])
def test_system_auth_gets_the_data_replication(tier, nodes, replicas):
    hosts = [f"n{i}" for i in range(1, nodes + 1)]
    services = render(tier, site_topology(NODES, hosts, "site-x", tier))["services"]
    adapter = services["cassandra-adapter"]["environment"]
    assert adapter["ADAPTER_REPLICATION"] == f"site-x:{replicas}"    # the data centre is the site (stack_cassandra_dc)
    for i in range(1, nodes + 1):
        # The nodes cap the wanted 3 at the nodes they see, which gives the adapter's figure.
        node = services[f"cassandra-{i}"]["environment"]
        assert node["CASSANDRA_REPLICATION"] == "site-x:3"
        assert auth.capped(auth.parse_replication(node["CASSANDRA_REPLICATION"]), {"site-x": nodes}) == \
            auth.parse_replication(adapter["ADAPTER_REPLICATION"])


@pytest.mark.parametrize("tier", ["edge", "datacenter"])
def test_a_new_cassandra_node_changes_no_other_node(tier):
    """The seeds, the wanted replication and the fast start do not follow the node count."""
    def nodes(count: int) -> dict:
        hosts = [f"n{i}" for i in range(1, count + 1)]
        services = render(tier, site_topology(NODES, hosts, "site-x", tier))["services"]
        return {name: spec for name, spec in services.items() if name.startswith("cassandra-") and name[-1].isdigit()}
    for count in (1, 2, 3):
        before, after = nodes(count), nodes(count + 1)
        assert set(after) - set(before) == {f"cassandra-{count + 1}"}
        for name, spec in before.items():
            assert after[name] == spec, f"{name} changes when cassandra-{count + 1} is added"
    assert nodes(1)["cassandra-1"]["environment"]["CASSANDRA_SEEDS"] == "cassandra-1,cassandra-2,cassandra-3"


@pytest.mark.parametrize("tier", ["edge", "datacenter"])
def test_adapter_logs_in_with_its_own_role_and_secret(tier):
    services = render(tier, site_topology(NODES, ["n1"], "site-x", tier))["services"]
    adapter, node = services["cassandra-adapter"], services["cassandra-1"]
    role = stack_defaults()["stack_cassandra_adapter_user"]
    assert role != "cassandra"
    assert adapter["environment"]["ADAPTER_CASSANDRA_USERNAME"] == role == node["environment"]["CASSANDRA_ADAPTER_ROLE"]
    assert adapter["secrets"] == ["cassandra_adapter_password",      # not the superuser's password
                                  {"source": "cassandra_ca", "target": "cassandra_ca.pem"},   # CQL over TLS
                                  {"source": "kafka_password_adapter", "target": "kafka_password"},
                                  {"source": "kafka_brokers_ca", "target": "kafka_brokers_ca.pem"},   # Kafka over TLS
                                  {"source": "metrics_exporter_keystore", "target": "metrics_keystore.pem"},
                                  {"source": "scrapers_ca", "target": "scrapers_ca.pem"}]   # /metrics over TLS
    assert adapter["environment"]["CASSANDRA_PASSWORD_FILE"] == "/run/secrets/cassandra_adapter_password"
    assert adapter["environment"]["ADAPTER_KEYSPACE"] == node["environment"]["CASSANDRA_ADAPTER_KEYSPACE"]
    assert [s for s in node["secrets"] if isinstance(s, str)] == ["cassandra_password", "cassandra_adapter_password"]
    assert {s["source"] for s in node["secrets"] if isinstance(s, dict)} == {
        "cassandra_1_keystore", "cassandra_ca", "metrics_exporter_keystore", "metrics_password"}   # + its exporter's
    assert node["environment"]["CASSANDRA_ADAPTER_PASSWORD_FILE"] == "/run/secrets/cassandra_adapter_password"


def test_a_refused_login_is_told_from_a_node_not_answering_yet():
    from cassandra import AuthenticationFailed
    from cassandra.cluster import NoHostAvailable
    refused = NoHostAvailable("Unable to connect", {"127.0.0.1:9042": AuthenticationFailed("Bad credentials")})
    down = NoHostAvailable("Unable to connect", {"127.0.0.1:9042": ConnectionRefusedError()})
    starting = NoHostAvailable("Unable to connect to any servers", ["127.0.0.1"])   # crashed the script once
    assert [auth._refused(err) for err in (refused, down, starting)] == [True, False, False]
