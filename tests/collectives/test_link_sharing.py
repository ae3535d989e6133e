"""What the cost models of one topology and rank list share: link rates and tree times, kept once computed."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from treecoll.collectives import Tree, build, link_sharing
from treecoll.collectives.cost import CostModel
from treecoll.collectives.placement import Placement
from treecoll.topo import resolve


@pytest.fixture()
def fresh():
    """No shared tables left from other tests (and none left behind)."""
    link_sharing._LINKS.clear()
    yield
    link_sharing._LINKS.clear()


def _rates_by_the_definition(topology, gpus, flows):
    """The module docstring's rule, link by link: a link's load is the sum of the shares of the routes
    crossing it; a route gets ``bw * share / load`` of each of its links, the least; a flow the sum of
    its routes (in route order, from zero)."""
    g = topology.graph
    load = defaultdict(float)
    for i, j in flows:
        for nodes, share in topology.path(gpus[i], gpus[j]).routes:
            for e in zip(nodes, nodes[1:]):
                load[e] += share
    out = {}
    for i, j in flows:
        total = 0.0
        for nodes, share in topology.path(gpus[i], gpus[j]).routes:
            total += min(g.edges[e]["bw"] * share / load[e] for e in zip(nodes, nodes[1:]))
        out[(i, j)] = total * 1e9
    return out


def test_rates_are_the_definition_to_the_last_bit(fresh):
    t = resolve("dgx-h100-x2")  # NVSwitch routes (four parallel subroutes) and NIC routes between hosts
    cm = CostModel(t)
    rng = random.Random(3)
    flows = [(i, j) for i in range(16) for j in range(16) if i != j and rng.random() < 0.3]
    flows += flows[:5]  # duplicates count as separate flows
    assert cm.rates(flows) == _rates_by_the_definition(t, cm.gpus, flows)
    assert cm.rates([(1, 0)]) == _rates_by_the_definition(t, cm.gpus, [(1, 0)])
    assert cm.rates([]) == {}


def test_models_of_one_topology_and_ranks_share_their_tables(fresh):
    t = resolve("dgx-h100-x2")
    a = CostModel(t)
    assert a._shared() is CostModel(Placement(t), step_through=True, msg_overhead=1e-6)._shared()
    others = [
        CostModel(t, list(reversed(t.rank_gpus()))),  # other ranks
        CostModel(resolve("dgx-h100-x2")),  # another topology object
        CostModel(t, step_overhead=1e-6),  # latencies differ
    ]
    assert all(o._shared() is not a._shared() for o in others)
    assert others[2].p2p(0, 1, 0) == pytest.approx(a.p2p(0, 1, 0) + 1e-6)
    assert len(link_sharing._LINKS) <= link_sharing.SHARED_LINKS


def test_kept_tree_times_are_the_recomputed_ones(fresh):
    t = resolve("dgx-h100-x2")
    p = Placement(t)
    plans = [build("two_level", p, nbytes=1 << 26), build("binomial", p), Tree.from_parents([-1] + [0] * 15)]
    sizes = (16512, 1 << 26)

    def times():
        closed, stepped = CostModel(p), CostModel(p, step_through=True)
        return [
            (
                closed.tree_times(plan, n, coll, (1, 4, 16)),
                stepped.tree_times(plan, n, coll, (1, 2)),
                closed.rsag_time(n),
                closed.ring_time(n),
            )
            for plan in plans
            for n in sizes
            for coll in ("allreduce", "broadcast")
        ]

    first = times()
    assert len(next(iter(link_sharing._LINKS.values())).times) > 0
    assert times() == first  # from the kept tables
    link_sharing._LINKS.clear()
    assert times() == first  # recomputed
    # other inputs are other entries: the per-message cost, the size, the child order
    cm = CostModel(p)
    slow = CostModel(p, msg_overhead=cm.msg_overhead * 2)
    star = plans[2]
    assert slow.tree_time(star, 16512, nchunks=4) > cm.tree_time(star, 16512, nchunks=4)
    assert cm.tree_time(star, 1 << 26, nchunks=4) > cm.tree_time(star, 16512, nchunks=4)
    # a star on a host whose leader reaches its own GPUs first: the order of sends changes the broadcast
    mixed = Tree(star.parents, (tuple(range(15, 0, -1)),) + star.children[1:])
    assert cm.tree_time(mixed, 1 << 26, "broadcast") != cm.tree_time(star, 1 << 26, "broadcast")
