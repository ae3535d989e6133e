"""How many chunks a tree collective is split into when the caller gives none."""
from __future__ import annotations

import networkx as nx
from treecoll.collectives import build
from treecoll.collectives.execute import MIN_MODEL_CHUNK, default_nchunks, nchunks_for
from treecoll.topo import Topology


def two_hosts(net_gbps: float) -> Topology:
    """2 hosts x 2 rank slots: fast intra-host links, one network link of ``net_gbps`` GB/s."""
    g = nx.DiGraph()

    def link(a, b, **k):
        g.add_edge(a, b, **k)
        g.add_edge(b, a, **k)

    g.add_node("sw", kind="net_switch", tier=0)
    for h in ("h0", "h1"):
        g.add_node(f"{h}/cpu0", kind="cpu", host=h, numa=0)
        g.add_node(f"{h}/nic0", kind="nic", host=h, bw=net_gbps)
        link(f"{h}/cpu0", f"{h}/nic0", kind="pcie", bw=4.0, lat=1.0)
        link(f"{h}/nic0", "sw", kind="net", bw=net_gbps, lat=5.0)
        for i in range(2):
            g.add_node(f"{h}/p{i}", kind="gpu", host=h, index=i, mem_bw=20.0)
            link(f"{h}/p{i}", f"{h}/cpu0", kind="pcie", bw=4.0, lat=1.0)
    return Topology(g, name=f"2x2-{net_gbps}")


def test_without_topology_the_size_rule():
    plan = build("binomial", nranks=4)
    for n in (1, 1 << 20, 16 << 20, 1 << 30):
        assert nchunks_for(plan, "allreduce", n) == default_nchunks(n)


def test_slow_links_get_more_chunks_never_below_the_floor():
    n = 16 << 20
    slow, fast = two_hosts(0.125), two_hosts(50.0)
    ks = {}
    for name, t in (("slow", slow), ("fast", fast)):
        plan = build("two_level", t, nbytes=n)
        ks[name] = nchunks_for(plan, "allreduce", n, topology=t)
        assert 1 <= ks[name] and n / ks[name] >= MIN_MODEL_CHUNK
        assert nchunks_for(plan, "allreduce", n, topology=t) == ks[name]          # cached, same answer
    assert ks["slow"] > default_nchunks(n)        # a 1 Gbit/s hop: fill the pipeline with small chunks
    assert ks["fast"] < ks["slow"]
    small = build("two_level", slow, nbytes=64 << 10)
    assert nchunks_for(small, "allreduce", 64 << 10, topology=slow) == 1       # below the floor: one message
