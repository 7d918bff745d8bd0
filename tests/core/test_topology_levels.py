"""Topology levels as configuration (issue 26 item 6): one parser for the extender's and
the operator's ``--topology-levels`` and the chart's ``topology.levels``, and the
operator's snapshot grouping nodes by the levels it is given."""

import pytest

from rlsched.core.contract import DEFAULT_TOPOLOGY_LEVELS, parse_topology_levels
from rlsched.operator.snapshot import build_snapshot


def test_levels_parse_and_bad_keys_are_named():
    assert parse_topology_levels(",".join(DEFAULT_TOPOLOGY_LEVELS)) == DEFAULT_TOPOLOGY_LEVELS
    assert parse_topology_levels(" fabric.topograph.run/tier-1 , kubernetes.io/hostname ") == \
        ("fabric.topograph.run/tier-1", "kubernetes.io/hostname")
    for bad, match in (("", "at least the hostname"), ("a/b,a/b", "repeated"), ("Bad_Prefix/x", "not a Kubernetes"),
                       ("ok/-x", "not a Kubernetes"), ("x/" + "n" * 64, "not a Kubernetes")):
        with pytest.raises(ValueError, match=match):
            parse_topology_levels(bad)


def _node(name, labels):
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"}}}


def test_the_operators_snapshot_groups_nodes_by_the_levels_it_is_given():
    nodes = [_node("a", {"example.com/rack": "r1"}), _node("b", {"example.com/rack": "r1"}),
             _node("c", {"example.com/rack": "r2"})]
    custom = build_snapshot(nodes, [], levels=("example.com/rack", "kubernetes.io/hostname")).state.topology
    assert [n.rack for n in custom.nodes] == ["r1", "r1", "r2"]
    default = build_snapshot(nodes, []).state.topology  # rlsched's labels: absent, each node alone
    assert len({n.rack for n in default.nodes}) == 3
