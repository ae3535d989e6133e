"""How many chunks a tree collective is split into when the caller gives none: one policy
(:func:`treecoll.collectives.cost.nchunks_for`) for the executor and the simulator."""

from __future__ import annotations

import networkx as nx
from treecoll.collectives import as_multi, build
from treecoll.collectives.cost import MIN_CHUNK_BYTES, nchunks_for
from treecoll.collectives.placement import Placement
from treecoll.collectives.planner import Planner
from treecoll.collectives.sim.simulator import simulate_executor
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
    # nothing to model: chunks of 1 MiB (n // 2**20), at least 1, at most 16
    for n, k in ((1, 1), (1 << 20, 1), (3 << 20, 3), (16 << 20, 16), (1 << 30, 16)):
        assert nchunks_for(plan, "allreduce", n, Placement(ranks=4)) == k


def test_slow_links_get_more_chunks_never_below_the_floor():
    n = 16 << 20
    slow, fast = two_hosts(0.125), two_hosts(50.0)
    ks = {}
    planner = Planner()
    for name, t in (("slow", slow), ("fast", fast)):
        plan = build("two_level", t, nbytes=n)
        ks[name] = nchunks_for(plan, "allreduce", n, Placement(t))
        assert 1 <= ks[name] and n / ks[name] >= MIN_CHUNK_BYTES
        assert planner.nchunks_for(plan, "allreduce", n, Placement(t)) == ks[name]  # the planner asks the same
    assert ks["slow"] > 16  # a 1 Gbit/s hop: smaller chunks than the 1 MiB of the no-topology rule
    assert ks["fast"] <= ks["slow"]  # both pipeline the reductions (mem_bw 20 GB/s); the slow hop no less
    small = build("two_level", slow, nbytes=64 << 10)
    assert nchunks_for(small, "allreduce", 64 << 10, Placement(slow)) == 1  # below the floor: one message


def test_the_simulator_pipelines_as_the_executor_does():
    """Same plan, same size: the executor's schedule (the planner's) and the simulator's run
    of it have the same chunks per tree, because both ask :func:`nchunks_for`."""
    for net in (0.125, 50.0):
        p = Placement(two_hosts(net))
        for n in (64 << 10, 4 << 20, 16 << 20):
            plan, sched = Planner().schedule_for(
                "two_level", collective="allreduce", nbytes=n, placement=p, algo="tree"
            )
            assert plan == build("two_level", p, nbytes=n, collective="allreduce")
            r = simulate_executor(p, "two_level", n, algo="tree")
            assert r.stats["chunks"] == sched.nchunks // len(as_multi(plan)) == nchunks_for(plan, "allreduce", n, p)
            assert r.nranks == 4 and r.time > 0
