"""Host templates stamped onto the graph: the fast copy of a template's local adjacency makes the graph
that adding each host's nodes and links one by one makes (same nodes, links, attributes, order)."""

from __future__ import annotations

import networkx as nx
import pytest
from treecoll.topo._schema import Doc
from treecoll.topo.compact import HostTemplate, expand
from treecoll.topo.yaml_io import _template

from treecoll import topo


def _one_by_one(ht: HostTemplate, hosts: list[str]) -> nx.DiGraph:
    g = nx.DiGraph()
    for h in hosts:
        p = h + "/"
        g.add_nodes_from((p + n, {**a, "host": h}) for n, a in ht.nodes)
        g.add_edges_from((p + a, p + b, d) for a, b, d in ht.links)
        g.add_edges_from((p + b, p + a, d) for a, b, d in ht.links)
    return g


def _layout(g: nx.DiGraph) -> list:
    """Everything of ``g`` in networkx's order: nodes with attributes, then each node's successors and
    predecessors with the links' attributes."""
    return [
        list(g._node.items()),
        [(u, list(v.items())) for u, v in g._succ.items()],
        [(u, list(v.items())) for u, v in g._pred.items()],
    ]


@pytest.mark.parametrize("ref", ["dgx-h100", "dgx-a100", "hgx-b200", "pcie-8gpu", "a100-pcie", "gh200-x4", "l40s"])
def test_stamped_hosts_are_the_hosts_added_one_by_one(ref):
    ht = _template(Doc("x.yaml", "", None), {}, ref, ("t",), topo.yaml_io.SHIPPED_DIR, set())
    hosts = [f"h{i}" for i in range(3)]
    g = nx.DiGraph()
    expand(g, ht, hosts)
    assert _layout(g) == _layout(_one_by_one(ht, hosts))
    first, second = (g._succ[f"h{i}/gpu0"] for i in (0, 1))
    assert all(first[f"h0/{v[3:]}"] is d for v, d in second.items())  # the template's link dicts, shared


def test_a_link_listed_twice_or_to_a_missing_node_is_added_as_networkx_adds_it():
    link = {"kind": "pcie", "bw": 1.0, "lat": 0.5, "count": 1}
    ht = HostTemplate(
        "t",
        "x.yaml",
        nodes=[("gpu0", {"kind": "gpu", "index": 0}), ("cpu0", {"kind": "cpu", "numa": 0})],
        links=[("gpu0", "cpu0", link), ("gpu0", "cpu0", {**link, "bw": 2.0})],
    )
    g = nx.DiGraph()
    expand(g, ht, ["a", "b"])
    assert _layout(g) == _layout(_one_by_one(ht, ["a", "b"]))
    assert g.edges["b/cpu0", "b/gpu0"]["bw"] == 2.0
    lost = HostTemplate("t", "x.yaml", nodes=ht.nodes[:1], links=[("gpu0", "cpu0", link)])
    g = nx.DiGraph()
    expand(g, lost, ["a", "b"])
    assert _layout(g) == _layout(_one_by_one(lost, ["a", "b"]))


def test_a_host_whose_node_exists_already_is_merged_as_networkx_merges_it():
    ht = _template(Doc("x.yaml", "", None), {}, "dgx-h100", ("t",), topo.yaml_io.SHIPPED_DIR, set())
    g = nx.DiGraph()
    g.add_node("b/gpu0", kind="gpu", mark=1)
    want = nx.DiGraph()
    want.add_node("b/gpu0", kind="gpu", mark=1)
    expand(g, ht, ["a", "b"])
    want.update(_one_by_one(ht, ["a", "b"]))
    assert sorted(g.nodes(data=True), key=str) == sorted(want.nodes(data=True), key=str)
    assert g.nodes["b/gpu0"]["mark"] == 1 and g.nodes["b/gpu0"]["host"] == "b"
    assert sorted(g.edges(data=True), key=str) == sorted(want.edges(data=True), key=str)


def test_a_cluster_loaded_from_templates_equals_its_explicit_form():
    t = topo.resolve("dgx-h100-x16")
    again = topo.Topology.from_dict(t.to_dict())
    assert again == t and list(again.graph.nodes) == list(t.graph.nodes)


@pytest.mark.parametrize(
    "fault, message",
    [
        ("loop", r"link 'h1/gpu3' -> 'h1/gpu3': a link cannot join a node to itself"),
        ("one way", r"link 'h1/gpu2' -> 'h1/nvswitch0': the reverse direction is missing"),
        ("bad bw", r"link 'h1/gpu2' -> 'h1/nvswitch0': bw: expected a positive number \(GB/s\), got -1.0"),
    ],
)
def test_validation_finds_a_fault_among_links_that_share_checked_attributes(fault, message):
    from treecoll.topo.errors import TopologyError

    g = topo.resolve("dgx-h100-x2").graph.copy()  # shares nothing with the loaded graph but its values
    good = g._succ["h0/gpu0"]["h0/nvswitch0"]
    if fault == "loop":  # an attribute dict checked before, on a link to itself
        g._succ["h1/gpu3"]["h1/gpu3"] = g._pred["h1/gpu3"]["h1/gpu3"] = good
    elif fault == "one way":
        g.remove_edge("h1/nvswitch0", "h1/gpu2")
    else:
        g.edges["h1/gpu2", "h1/nvswitch0"]["bw"] = -1.0
    with pytest.raises(TopologyError, match="^" + message):
        topo.Topology(g)
