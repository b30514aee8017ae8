"""Lab hosts as testinfra sees them over SSH: engine, Swarm, labels, services, ports."""
from __future__ import annotations

import json
import socket

import pytest
import testinfra

from deploy.topology import NODE_LABELS, node_labels
from tooling.lab import lab

HOSTS = {h.name: h for h in lab.DEFAULT_HOSTS}
SITES = sorted({h.site for h in lab.DEFAULT_HOSTS})
JOBS = {tier: [job["name"] for job in jobs] for tier, jobs in lab.LAB_JOBS.items()}
EDGE_SERVICES = ["zookeeper-1", "kafka-1", "cassandra-1", "mosquitto", "bridge", "cassandra-adapter",
                 *JOBS["edge"]]
SERVICES = {
    "site-a": EDGE_SERVICES + ["kafka-2"],
    "site-b": EDGE_SERVICES,
    "datacenter": ["zookeeper-1", "kafka-1", "cassandra-1", "mirrormaker", "cassandra-adapter", *JOBS["datacenter"]],
}


@pytest.fixture(scope="module")
def host_of(lab_hosts):
    """testinfra hosts over SSH with the lab's key, as an operator would log in."""
    cache = {}
    extra = f"{lab.ssh_options(list(lab_hosts))} -o LogLevel=ERROR"      # host keys checked, as Ansible does

    def connect(name: str):
        if name not in cache:
            cache[name] = testinfra.get_host(f"ssh://root@{lab.host_ip(HOSTS[name])}",
                                             ssh_identity_file=str(lab.ssh_key()), ssh_extra_args=extra)
        return cache[name]
    return connect


def _manager(site: str) -> str:
    return next(h.name for h in lab.DEFAULT_HOSTS if h.site == site and h.variables.get("swarm_role") == "manager")


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_engine_runs_on_host(host_of, name):
    host = host_of(name)
    assert host.process.filter(comm="dockerd"), "dockerd is not running"
    assert host.run("docker info --format '{{.Swarm.LocalNodeState}}'").stdout.strip() == "active"


@pytest.mark.smoke      # seconds: the smoke's own site.yml ran this way
def test_the_lab_deploys_as_a_user_that_is_not_root_and_has_no_docker_access(host_of, lab_hosts):
    """Issue 28: site.yml (which brought this lab up) logs in as `deployer` and becomes root through sudo;
    `deployer` itself cannot reach the engine, so every Docker step went through become."""
    inventory = (lab.lab_dir() / "inventory" / "hosts.ini").read_text()
    assert f"ansible_user={lab.DEPLOY_USER}" in inventory and "ansible_user=root" not in inventory
    for name in sorted(HOSTS):
        host = host_of(name)
        assert host.user(lab.DEPLOY_USER).uid != 0
        assert "docker" not in host.user(lab.DEPLOY_USER).groups, f"{name}: {lab.DEPLOY_USER} is in group docker"
        assert host.run(f"su {lab.DEPLOY_USER} -c 'sudo -n true'").rc == 0, f"{name}: no passwordless sudo"
        assert host.run(f"su {lab.DEPLOY_USER} -c 'docker info'").rc != 0, f"{name}: docker works without sudo"


@pytest.mark.parametrize("site", SITES)
def test_swarm_has_the_sites_nodes_ready(host_of, site):
    expected = sorted(h.name for h in lab.DEFAULT_HOSTS if h.site == site)
    out = host_of(_manager(site)).check_output("docker node ls --format '{{.Hostname}} {{.Status}}'")
    assert sorted(line.split()[0] for line in out.splitlines()) == expected
    assert all(line.split()[1] == "Ready" for line in out.splitlines())


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_node_carries_labels_from_inventory(host_of, name):
    host = HOSTS[name]
    raw = host_of(_manager(host.site)).check_output(f"docker node inspect {name} --format '{{{{json .Spec.Labels}}}}'")
    labels = json.loads(raw)
    # The project's labels exactly as deploy/topology.py gives them (its rules: tests/unit, topology tests).
    assert {k: v for k, v in labels.items() if k in NODE_LABELS} == node_labels(host.variables)


STATELESS_NODES = {site: sorted(h.name for h in lab.DEFAULT_HOSTS
                                if h.site == site and "iot.stateless" in node_labels(h.variables)) for site in SITES}


@pytest.mark.smoke      # seconds
@pytest.mark.parametrize("site, service", [(s, svc) for s in SITES if len(STATELESS_NODES[s]) > 1
                                           for svc in ("bridge", "cassandra-adapter")])
def test_a_stateless_service_has_a_replica_on_each_node_that_may_run_it(host_of, site, service):
    """One replica per node with the iot.stateless label (stack_*_replicas 0), spread one per node by Swarm."""
    out = host_of(_manager(site)).check_output(
        f"docker service ps {site}_{service} --filter desired-state=running --format '{{{{.Node}}}}'")
    assert sorted(out.split()) == STATELESS_NODES[site]


@pytest.mark.parametrize("site, service", [(s, svc) for s in SITES for svc in SERVICES[s]])
def test_service_runs_all_replicas(host_of, site, service):
    out = host_of(_manager(site)).check_output(
        f"docker service ls --filter name={site}_{service} --format '{{{{.Name}}}} {{{{.Replicas}}}}'")
    replicas = dict(line.split()[:2] for line in out.splitlines()).get(f"{site}_{service}")
    assert replicas is not None, f"{site}_{service} is not deployed"
    running, wanted = replicas.split("/")
    assert running == wanted and int(wanted) >= 1


PORTS = [(h.name, 9094) for h in lab.DEFAULT_HOSTS if "kafka_id" in h.variables]


@pytest.mark.parametrize("name, port", PORTS)
def test_published_port_answers_from_outside_the_site(lab_hosts, name, port):
    address = lab.host_ip(HOSTS[name])
    with socket.create_connection((address, port), timeout=5):
        pass


@pytest.mark.smoke      # seconds
@pytest.mark.parametrize("site", [s for s in SITES if any(h.variables.get("mqtt_node") for h in lab.DEFAULT_HOSTS
                                                          if h.site == s)])
def test_mosquitto_answers_on_the_one_mqtt_node_that_runs_it(lab_hosts, site):
    """One Mosquitto per site, its 8883 published in host mode where it runs: a device given every mqtt_node's
    address finds it on exactly one (site-a has two mqtt_nodes; tests/lab/test_5_faults.py moves it)."""
    answering = []
    for host in (h for h in lab_hosts if h.site == site and h.variables.get("mqtt_node")):
        try:
            with socket.create_connection((lab.host_ip(host), 8883), timeout=5):
                answering.append(host.name)
        except OSError:
            pass
    assert answering == [lab.mosquitto_host(lab_hosts, site).name]
