"""The route table a Topology owns: routes kept, bounded, clearable, the same answers whatever it holds."""

from __future__ import annotations

import pytest
from treecoll.topo.errors import TopologyError
from treecoll.topo.routes import RouteTable

from treecoll import topo


def test_a_topology_owns_one_table_and_a_new_topology_a_new_one():
    t = topo.resolve("dgx-h100-x2")
    assert t.routes is t.routes and len(t.routes) == 0
    p = t.path("h0/gpu0", "h1/gpu3")
    assert len(t.routes) == 1 and t.path("h0/gpu0", "h1/gpu3") is p  # kept, not found again
    r = t.with_ranks(reversed(t.gpus()))
    assert r.routes is not t.routes and len(r.routes) == 0 and r.path("h0/gpu0", "h1/gpu3") == p


def test_clear_drops_everything_and_the_answers_stay_the_same():
    t = topo.resolve("dgx-h100-x2")
    gpus = t.gpus()
    before = {(a, b): t.path(a, b) for a in gpus for b in gpus}
    nics = {g: t.nearest_nic(g) for g in gpus}
    assert len(t.routes) == len(gpus) ** 2
    t.routes.clear()
    assert len(t.routes) == 0 and not t.routes._pci and not t.routes._nic and not t.routes._switch_dist
    assert {g: t.nearest_nic(g) for g in gpus} == nics
    assert {(a, b): t.path(a, b) for a in gpus for b in gpus} == before


def test_the_pairs_kept_are_bounded_oldest_dropped_first():
    t = topo.resolve("dgx-h100-x2")
    table = RouteTable(t.graph, t.name, max_routes=5)
    gpus = t.gpus()
    for b in gpus:
        assert table.path(gpus[0], b) == t.path(gpus[0], b)
        assert len(table) <= 5
    assert list(table._routes) == [(gpus[0], b) for b in gpus[-5:]]
    with pytest.raises(TopologyError, match="max_routes expected >= 1, got 0"):
        RouteTable(t.graph, max_routes=0)


def test_unknown_endpoints_name_the_topology():
    t = topo.resolve("dgx-h100")
    with pytest.raises(TopologyError, match=r"node 'h0/gpu9': not in topology 'dgx-h100'"):
        t.path("h0/gpu0", "h0/gpu9")
    with pytest.raises(TopologyError, match=r"node 'x': not in topology 'dgx-h100'"):
        t.nearest_nic("x")


def _changed_host(t, host: str):
    """``t`` with one PCIe link of ``host`` slower (both directions): that host is no longer built like the others."""
    import networkx as nx

    g = nx.DiGraph(t.graph)
    a, b = next((a, b) for a, b, d in g.edges(data=True) if d["kind"] == "pcie" and g.nodes[a].get("host") == host)
    for u, v in ((a, b), (b, a)):
        g.edges[u, v]["bw"] = g.edges[u, v]["bw"] / 4
    return topo.Topology(g, name=t.name + "-changed")


@pytest.mark.parametrize("name", ["dgx-h100-x16", "dgx-a100", "gb200-nvl72"])
def test_hosts_built_alike_share_routes_and_give_the_routes_of_their_own_search(name):
    t = topo.resolve(name)
    if len(t.hosts()) > 2:
        t = _changed_host(t, t.hosts()[3])
    alone = RouteTable(t.graph, t.name, alike=False)
    gpus = t.gpus()
    for g in gpus:
        assert t.nearest_nic(g) == alone.nearest_nic(g)
    for host in t.hosts():
        mine = t.gpus(host)
        nics = t.nics(host)
        for a in mine:
            for b in mine + nics:
                assert t.path(a, b) == alone.path(a, b), (a, b)
    for a, b in zip(gpus, gpus[len(gpus) // 2 :] + gpus[: len(gpus) // 2]):  # across hosts too
        assert t.path(a, b) == alone.path(a, b)
    reps = {h: t.routes._rep_host(h) for h in t.hosts()}
    if name == "dgx-h100-x16":  # every host like h0 but the changed one, which stands alone
        assert reps["h3"] is None and reps["h0"] is None
        assert all(reps[h] == "h0" for h in t.hosts() if h not in ("h0", "h3"))
    if name == "gb200-nvl72":  # trays joined by NVLink to rack switches: never shared
        assert set(reps.values()) == {None}


_TWO_TEMPLATES = """
name: mixed
templates:
  a: {gpus: {count: 2, numa: 0}, cpus: [{numa: 0}], pcie: {bw: 24.0}, nics: {count: 1, bw: 25.0, numa: 0}}
  b: {gpus: {count: 2, numa: 0}, cpus: [{numa: 0}], pcie: {bw: 24.0}, nics: {count: 1, bw: 25.0, numa: 0}}
  c: {gpus: {count: 2, numa: 0}, cpus: [{numa: 0}], pcie: {bw: 12.0}, nics: {count: 1, bw: 25.0, numa: 0}}
hosts: [{template: a, count: 3}, {template: c, count: 2}, {template: b, count: 2}, {template: a, count: 1}]
network: {type: single_switch}
"""


@pytest.mark.parametrize("source", ["dgx-h100-x16", "gb200-nvl72", "dgx-a100", _TWO_TEMPLATES])
@pytest.mark.parametrize("order", [1, -1])
def test_the_loaders_host_groups_give_the_classes_of_every_host_compared(source, order):
    t = topo.loads(source) if "\n" in source else topo.resolve(source)
    compared = RouteTable(t.graph, t.name)  # no groups: every host's signature compared
    hosts = t.hosts()[::order]
    assert [t.routes.host_class(h) for h in hosts] == [compared.host_class(h) for h in hosts]
    assert all(t.routes._is_sealed(h) == compared._is_sealed(h) for h in hosts)
    groups = t._host_groups
    if source == "gb200-nvl72":  # trays on rack-level NVLink switches: no group, every host compared
        assert groups is None
    else:
        assert set(groups) == set(t.hosts())
    if source == _TWO_TEMPLATES:  # templates a and b are built alike: one class; c apart
        first = hosts[0]
        assert {t.routes.host_class(h) for h in hosts} == {first, "h3" if order == 1 else "h4"}
        assert t.path("h0/gpu0", "h5/gpu1") == RouteTable(t.graph, alike=False).path("h0/gpu0", "h5/gpu1")


def test_explicit_links_beside_hosts_give_no_host_groups():
    t = topo.loads(
        "hosts: [{template: dgx-h100, count: 2}]\nnetwork: {type: single_switch}\n"
        "links: [{a: h0/gpu0, b: h1/gpu0, kind: pcie, bw: 1.0}]\n"
    )
    assert t._host_groups is None
    assert t.routes.host_class("h1") == "h1"  # h0 and h1 now differ: each its own class


@pytest.mark.parametrize(
    "source", ["dgx-h100-x16", "hosts: [{template: dgx-h100, count: 8}]\nnetwork: {type: torus, dims: [2, 4]}\n"]
)
def test_switch_distances_are_the_shortest_paths_through_switches(source):
    import networkx as nx

    t = topo.loads(source) if "\n" in source else topo.resolve(source)
    g = t.graph
    switches = [n for n, d in g.nodes(data=True) if d["kind"] == "net_switch"]
    fabric = g.subgraph(switches).edge_subgraph(
        [(a, b) for a, b, d in g.subgraph(switches).edges(data=True) if d["kind"] == "net"]
    )
    for target in switches[:: max(1, len(switches) // 6)]:
        want = nx.single_target_shortest_path_length(fabric, target)
        assert t.routes._dist_to_switch(target) == dict(want)
