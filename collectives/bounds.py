"""Lower bounds on the time of any collective algorithm on a topology's GPUs.

Units: bytes in, seconds out (link bandwidths in GB/s, latencies in µs, as the topology
gives them; the per-message cost in seconds).

:func:`lower_bound` is the largest of the bounds below, each valid for every algorithm
(point to point, trees, rings, and reductions inside the switches);
:meth:`~treecoll.collectives.cost.CostModel.lower_bound` gives it for a model's ranks.

* GPU port (allreduce). With point-to-point transfers only, every rank
  sends and receives at least ``2 (P-1)/P n`` bytes (Patarasuk & Yuan,
  "Bandwidth optimal all-reduce algorithms for clusters of workstations",
  J. Parallel Distrib. Comput. 69(2), 2009), through its own links
  (their summed bandwidth ``B``, the smaller direction): ``2 (P-1)/P n / B``.
  When the switches reduce (:func:`in_network_reduction`: NVLink SHARP,
  NCCL's NVLS, NCCL 2.17+; SHARP in InfiniBand switches, Graham et al.,
  "Scalable Hierarchical Aggregation Protocol (SHArP)", COMHPC 2016), a
  GPU only has to send its ``n`` bytes once and receive the ``n``-byte
  result once (NCCL's own count for CollNet: ``S`` per GPU across nodes,
  https://github.com/NVIDIA/nccl/issues/457): ``n / B``. Reduce and broadcast: the root
  receives (sends) ``n`` bytes: ``n / B``. ``in_network`` False gives the
  bound of point-to-point algorithms only (trees and rings, what the
  executor runs) where the switches could reduce; None detects it.
* Host cut (several hosts): each host's inputs must leave it and the
  result enter it, ``n`` bytes each way, however the network reduces,
  through the links that cross the host's boundary (its NICs' network
  links; NVLink to switches outside the host in a rack-scale NVLink
  domain): ``n / (their summed bandwidth, the smaller direction)``.
* Latency: rank 0's data must reach every rank: the largest
  shortest-path latency (over the graph's links) from rank 0, plus one
  message overhead ``o`` (``msg_overhead``); and, as a rank handles one
  message per ``o`` (so holds at most ``2^t`` combined values after ``t o``),
  ``o * ceil(log2 P)``.

>>> from treecoll.collectives.cost import uniform_topology
>>> t = uniform_topology(4)            # 4 ports of 12 GB/s on one (NVLS-capable) switch
>>> in_network_reduction(t, t.rank_gpus()), lower_bound(t, t.rank_gpus(), 12e9, msg_overhead=1e-6)
(True, 1.0)
>>> lower_bound(t, t.rank_gpus(), 12e9, in_network=False, msg_overhead=1e-6)   # 2 (P-1)/P n / 12 GB/s
1.5
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import networkx as nx
from treecoll.topo import Topology
from treecoll.topo.errors import TreeError

from .in_network import nvls_domains

__all__ = ["in_network_reduction", "lower_bound"]


def in_network_reduction(topology: Topology, gpus: Sequence[str]) -> bool:
    """True when the switches can reduce for ``gpus``: NVLink SHARP, where NCCL offers its NVLS
    algorithm (:func:`treecoll.collectives.in_network.nvls_domains`)."""
    try:
        nvls_domains(topology, gpus)
    except TreeError:
        return False
    return True


def lower_bound(
    topology: Topology,
    gpus: Sequence[str],
    nbytes: float,
    collective: str = "allreduce",
    *,
    msg_overhead: float,
    in_network: bool | None = None,
) -> float:
    """A lower bound (seconds) on the time of any algorithm for ``collective`` on ``nbytes`` over
    ``gpus`` (one per rank) of ``topology``, each rank paying ``msg_overhead`` seconds per message
    (module docstring)."""
    n = len(gpus)
    if n == 1:
        return 0.0
    g = topology.graph
    out_bw = [sum(g.edges[e]["bw"] for e in g.out_edges(x)) for x in gpus]
    in_bw = [sum(g.edges[e]["bw"] for e in g.in_edges(x)) for x in gpus]
    if in_network is None:
        in_network = in_network_reduction(topology, gpus)
    if collective == "allreduce" and not in_network:
        vol = 2 * (n - 1) / n * nbytes
    else:
        vol = nbytes
    bw_lb = max(vol / (min(out_bw[i], in_bw[i]) * 1e9) for i in range(n))
    hosts = {topology.host_of(x) for x in gpus}
    if len(hosts) > 1:
        out_cut: dict = defaultdict(float)
        in_cut: dict = defaultdict(float)
        for u, v, d in g.edges(data=True):
            hu, hv = g.nodes[u].get("host"), g.nodes[v].get("host")
            if hu != hv:
                out_cut[hu] += d["bw"]
                in_cut[hv] += d["bw"]
        for h in hosts:
            cut = min(out_cut[h], in_cut[h])
            if cut > 0:
                bw_lb = max(bw_lb, nbytes / (cut * 1e9))
    dist = nx.single_source_dijkstra_path_length(g, gpus[0], weight=lambda u, v, d: d.get("lat", 0.0))
    o = msg_overhead
    lat = max(dist.get(x, 0.0) for x in gpus) * 1e-6 + o
    # a rank merges at most one more message per overhead o: after t*o it holds <= 2^t values
    lat = max(lat, o * math.ceil(math.log2(n)))
    return max(bw_lb, lat) if math.isfinite(bw_lb) else lat
