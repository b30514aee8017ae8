"""images/cassandra/bin/cassandra-dead-peer: which dead node a node without data replaces (its rack's)."""
from __future__ import annotations

import importlib.machinery
import importlib.util

import pytest

from tooling.testbed.stack_render import REPO

_LOADER = importlib.machinery.SourceFileLoader("cassandra_dead_peer",
                                               str(REPO / "images/cassandra/bin/cassandra-dead-peer"))
_SPEC = importlib.util.spec_from_loader(_LOADER.name, _LOADER)
dead_peer = importlib.util.module_from_spec(_SPEC)
_LOADER.exec_module(dead_peer)

RING = [("10.0.1.5", "site-a", "rack-1"), ("10.0.1.7", "site-a", "rack-2"), ("10.0.1.9", "site-a", "rack-3")]


def test_the_node_of_this_nodes_rack_is_the_one_it_replaces():
    assert dead_peer.dead_peer(RING, "site-a", "rack-2") == "10.0.1.7"


@pytest.mark.parametrize(("dc", "rack"), [("site-a", "rack-4"), ("site-b", "rack-2")])
def test_a_new_node_id_or_another_data_centre_replaces_nothing(dc, rack):
    """A node added with the next cassandra_id has a rack nobody has: it bootstraps as one more node."""
    assert dead_peer.dead_peer(RING, dc, rack) is None


def test_two_nodes_in_one_rack_are_refused_by_name():
    with pytest.raises(SystemExit, match=r"2 nodes in site-a/rack-2 .*each node needs its own rack"):
        dead_peer.dead_peer([*RING, ("10.0.1.11", "site-a", "rack-2")], "site-a", "rack-2")


def test_without_a_seed_it_prints_usage(capsys):
    assert dead_peer.main(["cassandra-dead-peer"]) == 2
    assert "cassandra-dead-peer SEED_HOST" in capsys.readouterr().err
