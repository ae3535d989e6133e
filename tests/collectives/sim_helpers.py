"""Hand-built topologies and schedules for the simulator tests (no builder/compile dependency)."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx
from treecoll.collectives.schedule import Schedule, Step
from treecoll.topo import Topology


def ring_topology(P: int, bw: float = 100.0, lat: float = 2.0, mem_bw: float | None = None) -> Topology:
    """P GPUs on a bidirectional ring of direct links (GB/s, µs)."""
    g = nx.DiGraph()
    for i in range(P):
        attrs = {"kind": "gpu", "host": "h", "index": i}
        if mem_bw:
            attrs["mem_bw"] = mem_bw
        g.add_node(f"h/gpu{i}", **attrs)
    for i in range(P):
        a, b = f"h/gpu{i}", f"h/gpu{(i + 1) % P}"
        if a != b and not g.has_edge(a, b):
            g.add_edge(a, b, kind="nvlink", bw=bw, lat=lat)
            g.add_edge(b, a, kind="nvlink", bw=bw, lat=lat)
    return Topology(g, name=f"ring{P}")


def star_topology(
    P: int, bw: float = 100.0, lat: float = 1.0, mem_bw: float | None = None, mem_gb: Sequence | None = None
) -> Topology:
    """P GPUs each with one link to a central switch (a single-host NVSwitch-like star); ``mem_gb``: each
    GPU's memory capacity (GB; None: the GPU carries none)."""
    g = nx.DiGraph()
    g.add_node("h/sw", kind="nvswitch", host="h")
    for i in range(P):
        attrs = {"kind": "gpu", "host": "h", "index": i}
        if mem_bw:
            attrs["mem_bw"] = mem_bw
        if mem_gb is not None and mem_gb[i] is not None:
            attrs["mem_gb"] = mem_gb[i]
        g.add_node(f"h/gpu{i}", **attrs)
        g.add_edge(f"h/gpu{i}", "h/sw", kind="nvlink", bw=bw, lat=lat)
        g.add_edge("h/sw", f"h/gpu{i}", kind="nvlink", bw=bw, lat=lat)
    return Topology(g, name=f"star{P}")


def ring_allreduce_schedule(P: int) -> Schedule:
    """NCCL's ring allreduce as a Schedule: P chunks, P-1 reduce-scatter then P-1 all-gather steps."""
    steps = [[] for _ in range(P)]
    for r in range(P):
        lst = steps[r]
        nxt, prv = (r + 1) % P, (r - 1) % P
        last_reduce = None
        for s in range(P - 1):
            c_send = (r - s) % P
            c_recv = (r - s - 1) % P
            deps = (last_reduce,) if last_reduce is not None else ()
            lst.append(Step("send", c_send, peer=nxt, deps=deps))
            lst.append(Step("recv", c_recv, peer=prv, slot=1))
            lst.append(Step("reduce", c_recv, slot=1, deps=(len(lst) - 1,)))
            last_reduce = len(lst) - 1
        last = last_reduce
        for s in range(P - 1):
            c_send = (r + 1 - s) % P
            c_recv = (r - s) % P
            lst.append(Step("send", c_send, peer=nxt, deps=(last,) if last is not None else ()))
            lst.append(Step("recv", c_recv, peer=prv))
            last = len(lst) - 1
    return Schedule("allreduce", P, P, steps, name="ring/allreduce")


def binomial_reduce_schedule(P: int, root: int = 0) -> Schedule:
    """Binomial-tree reduce to rank 0 (one chunk): in round k, rank r with bit k set sends to r - 2^k."""
    steps = [[] for _ in range(P)]
    for r in range(P):
        lst = steps[r]
        k = 1
        last = None
        while k < P:
            if r & k:
                lst.append(Step("send", 0, peer=r - k, deps=(last,) if last is not None else ()))
                break
            if r + k < P:
                lst.append(Step("recv", 0, peer=r + k, slot=1))
                lst.append(Step("reduce", 0, slot=1, deps=(len(lst) - 1,) + ((last,) if last is not None else ())))
                last = len(lst) - 1
            k <<= 1
    return Schedule("reduce", P, 1, steps, root=root, name="binomial/reduce")


def send_schedule(P: int, pairs, nchunks: int = 1) -> Schedule:
    """Each (src, dst) pair sends every chunk once, all at t = 0 (collective label 'broadcast', root 0)."""
    steps = [[] for _ in range(P)]
    for a, b in pairs:
        for c in range(nchunks):
            steps[a].append(Step("send", c, peer=b))
            steps[b].append(Step("recv", c, peer=a))
    return Schedule("broadcast", P, nchunks, steps, root=0, name="sends")
