"""Flow-level simulation of collectives on any :class:`~topo.Topology`.

Two entry points, one result type:

* :func:`simulate` runs a :class:`~collectives.schedule.Schedule` (what the
  executor runs: any tree builder's reduce, broadcast or allreduce, an
  imported algorithm, a ring for small P) through the event-driven engine of
  :mod:`treecoll.collectives.sim_engine` (max-min fair link sharing, per-hop latency,
  reduce compute, chunk pipelining, scratch memory).
* :func:`simulate_ring` is NCCL's ring (allreduce = reduce-scatter +
  all-gather, or either half) in a per-step aggregated model: every step of a
  lockstep ring moves the same set of P transfers, so one max-min allocation
  gives each step's bandwidth time, and latency adds up along the chain of
  hops a chunk travels; this is
  what lets 8192-rank rings run in seconds (a ring Schedule of P ranks has
  P·2(P−1) steps). On a uniform ring both give the same time.

Both return a :class:`SimResult` with times in seconds, bytes per link and per
link kind, the busiest links, peak scratch memory per rank and algbw/busbw
exactly as nccl-tests defines them (doc/PERFORMANCE.md of https://github.com/NVIDIA/nccl-tests):
``algbw = S / t`` (S = the per-rank buffer, for allgather and reduce_scatter
the total size), ``busbw = algbw × 2(P−1)/P`` for allreduce, ``× (P−1)/P``
for reduce_scatter and allgather, ``× 1`` for reduce and broadcast.

>>> import networkx as nx
>>> from treecoll.topo import Topology
>>> from treecoll.collectives.schedule import Schedule, Step
>>> g = nx.DiGraph()
>>> for i in range(2): g.add_node(f"h/gpu{i}", kind="gpu", host="h", index=i)
>>> g.add_edge("h/gpu0", "h/gpu1", kind="nvlink", bw=100.0, lat=1.0)
>>> g.add_edge("h/gpu1", "h/gpu0", kind="nvlink", bw=100.0, lat=1.0)
>>> s = Schedule("broadcast", 2, 1, ((Step("send", 0, peer=1),), (Step("recv", 0, peer=0),)), root=0)
>>> r = simulate(Topology(g), s, 10**8)     # 1 µs + 1e8 B / 100 GB/s = 1001 µs
>>> round(r.time * 1e6, 3), r.kind_bytes
(1001.0, {'nvlink': 100000000})
"""
from __future__ import annotations

import dataclasses
import time as _time
from collections.abc import Sequence
from typing import Any

import numpy as np
from treecoll.topo import Topology
from treecoll.topo.errors import CollectiveError
from treecoll.topo.ranks import RanksArg

from ..placement import Placement, as_placement
from ..schedule import Schedule
from .engine import FlowEngine, Network, concurrent_times, gc_paused
from .profiles import Profile, get_profile
from .result import DTYPE_SIZES, SimResult, bandwidths, bus_factor, check_size, make_result, placed

__all__ = ["SimResult", "simulate", "simulate_ring", "simulate_algorithm", "simulate_executor",
           "simulate_nccl_allreduce", "bus_factor", "bandwidths", "DTYPE_SIZES", "placed"]



def _mem_bw(topology, gpus) -> list[float]:
    return [float(topology.node(g).get("mem_bw", 0.0) or 0.0) * 1e9 for g in gpus]


@gc_paused()
def simulate(placement: Placement | Topology, schedule: Schedule, nbytes: int, *, dtype: str = "float32",
             ranks: RanksArg = None, profile: Profile | str | None = None, top: int = 10,
             ordered_pairs: bool = False, rendezvous: bool = False, lanes: bool = False) -> SimResult:
    """Simulate ``schedule`` moving a message of ``nbytes`` bytes on ``placement``.

    ``placement``: a :class:`~treecoll.collectives.placement.Placement`, or a Topology
    with ``ranks`` (default: its first ``schedule.nranks`` GPUs in rank order).
    ``profile``: a :class:`Profile` or its name (default ``ideal``). ``ordered_pairs``: the
    messages of one rank to another travel in order over one connection (gloo over TCP: one socket per pair of
    ranks), instead of sharing the links fairly with each other (NCCL: several
    channels per pair). ``rendezvous``: a message moves only once its receiver
    has posted the matching recv. ``lanes``: a rank's step lanes (a tree allreduce's
    reduce-up and broadcast-down) issue independently, as NCCL's split tree
    kernels run them; default: every rank issues in list order, as treecoll's
    executor does. Deterministic: the same input gives the same result.
    """
    check_size(nbytes, dtype)
    prof = get_profile(profile)
    topology, gpus = placed(placement, ranks, nranks=schedule.nranks)
    net = Network(topology, prof)
    t0 = _time.perf_counter()
    raw = FlowEngine(net, schedule, schedule.chunk_bytes(nbytes), gpus, _mem_bw(topology, gpus),
                     reduce_cost=prof.reduce_cost, ordered_pairs=ordered_pairs, rendezvous=rendezvous,
                     lanes=lanes).run()
    stats = {"engine": "events", "transfers": raw.transfers, "subflows": raw.subflows,
             "rate_updates": raw.recomputes, "wall_s": _time.perf_counter() - t0}
    return make_result(net, schedule.collective, schedule.name or schedule.collective, nbytes, nbytes,
                   schedule.nranks, raw.makespan, raw.finish, raw.link_bytes, raw.peak_scratch, prof, dtype,
                   stats, top)


def ring_orders(topology: Topology, gpus: Sequence[str], channels: int) -> list[list[str]]:
    """One ring per channel: hosts in rank order, each host's GPUs rotated by the channel number.

    Rotating the host-local order makes channel c leave each host from a
    different GPU (hence through a different NIC), as NCCL spreads its ring
    channels over the NICs.
    """
    by_host: dict = {}
    nodes = topology.graph.nodes
    for g in gpus:
        by_host.setdefault(nodes[g].get("host"), []).append(g)
    out = []
    for c in range(channels):
        ring = []
        for lst in by_host.values():
            k = c % len(lst)
            ring.extend(lst[k:] + lst[:k])
        out.append(ring)
    return out


def default_channels(topology: Topology, gpus: Sequence[str]) -> int:
    """Ring channels: one per NIC of a host when the ring crosses hosts (at most its GPUs), else 1."""
    nodes = topology.graph.nodes
    gpu_count: dict = {}
    for g in gpus:
        h = nodes[g].get("host")
        gpu_count[h] = gpu_count.get(h, 0) + 1
    if len(gpu_count) < 2:
        return 1
    nic_count = dict.fromkeys(gpu_count, 0)
    for n in topology.nodes("nic"):
        h = nodes[n].get("host")
        if h in nic_count:
            nic_count[h] += 1
    return max(1, min(min(nic_count.values()), min(gpu_count.values())))


def _chain_latency(lat: np.ndarray, nsteps: int) -> float:
    """Largest summed latency of ``nsteps`` consecutive hops of any ring (``lat[channel, hop]``, cyclic)."""
    C, P = lat.shape
    full, rem = divmod(nsteps, P)
    tot = lat.sum(axis=1)
    if rem == 0:
        return float((full * tot).max())
    ext = np.concatenate([lat, lat], axis=1)
    cs = np.concatenate([np.zeros((C, 1)), np.cumsum(ext, axis=1)], axis=1)
    windows = cs[:, rem:rem + P] - cs[:, :P]
    return float((full * tot + windows.max(axis=1)).max())


@gc_paused()
def simulate_ring(placement: Placement | Topology, nbytes: int, *, collective: str = "allreduce",
                  dtype: str = "float32", ranks: RanksArg = None, profile: Profile | str | None = None,
                  channels: int | None = None, top: int = 10) -> SimResult:
    """NCCL-style ring ``allreduce`` (reduce-scatter then all-gather), ``reduce_scatter`` or ``allgather``.

    ``nbytes`` is the size nccl-tests prints: the per-rank buffer for
    allreduce, the total (all ranks' pieces) for reduce_scatter and
    allgather; each of the ``channels`` rings carries an equal share. Every step all
    ranks send one chunk (``size / (P × channels)``) to their ring successor at once; the
    step time comes from one max-min allocation of those P × channels transfers
    (:func:`~treecoll.collectives.sim.engine.concurrent_times`),
    and a reduce-scatter step takes the longer of that and its reduce
    (``3 × chunk / mem_bw``: NCCL reduces while the data streams in).
    Steps: 2(P−1) for allreduce, P−1 for either half.
    """
    if collective not in ("allreduce", "reduce_scatter", "allgather"):
        raise CollectiveError(f"ring collective {collective!r}: expected allreduce, reduce_scatter or allgather")
    check_size(nbytes, dtype)
    prof = get_profile(profile)
    topology, gpus = placed(placement, ranks, what="simulate_ring")
    P = len(gpus)
    C = channels or default_channels(topology, gpus)
    if C < 1:
        raise CollectiveError(f"channels: expected >= 1, got {C}")
    t0 = _time.perf_counter()
    net = Network(topology, prof)
    chunk = nbytes / (P * C)
    rs_steps = (P - 1) if collective in ("allreduce", "reduce_scatter") else 0
    ag_steps = (P - 1) if collective in ("allreduce", "allgather") else 0
    link_bytes = np.zeros(0)
    makespan = 0.0
    if P > 1:
        transfers: list[tuple[str, str, float]] = []
        rings = ring_orders(topology, gpus, C)
        for ring in rings:
            transfers.extend((ring[i], ring[(i + 1) % P], chunk) for i in range(P))
        lat, drain = concurrent_times(net, transfers)
        memb = _mem_bw(topology, gpus)
        red = 3.0 * chunk * C / min(memb) if (prof.reduce_cost and min(memb) > 0) else 0.0
        step = float(drain.max())
        makespan = _chain_latency(lat.reshape(C, P), rs_steps + ag_steps) + rs_steps * max(step, red) \
            + ag_steps * step
        link_bytes = net.link_load(transfers) * (rs_steps + ag_steps)
    peaks = [chunk * C if rs_steps else 0.0] * P
    stats = {"engine": "lockstep ring", "channels": C, "steps": rs_steps + ag_steps,
             "transfers_per_step": P * C, "wall_s": _time.perf_counter() - t0}
    return make_result(net, collective, "ring", nbytes, nbytes, P, makespan, [makespan] * P, link_bytes, peaks, prof,
                   dtype, stats, top)


#: algorithms :func:`simulate_algorithm` knows besides the tree builders of :mod:`treecoll.collectives.builders`:
#: NCCL's ring and NVLS (NVLSTree across NVLink domains, :mod:`treecoll.collectives.sim.nvls`)
RING_ALGOS = ("ring",)
NVLS_ALGOS = ("nvls",)
#: NCCL's tree kernels pipeline a message in slices of this order: :func:`simulate_algorithm` runs
#: trees as NCCL's kernels run them (:data:`NCCL_TREE_RUN`), so in chunks of this many bytes
#: (NCCL's pipelining as modelled here; what treecoll's executor runs is :func:`simulate_executor`)
NCCL_TREE_CHUNK_BYTES = 512 << 10
#: most pipeline chunks per tree the engine simulates exactly (its cost grows with chunks x tree edges);
#: beyond, and beyond 8192 / P, a run is extrapolated from two (:func:`_extrapolate`)
MAX_SIM_CHUNKS = 32


def _sim_chunks(want: int, nranks: int) -> int:
    """Chunks the engine simulates for a run that pipelines ``want``: at most
    :data:`MAX_SIM_CHUNKS` and ``8192 / P`` (1 chunk from 8192 ranks on)."""
    return int(max(1, min(want, MAX_SIM_CHUNKS, 8192 // max(nranks, 1))))


#: above this many bytes "auto" skips the LL protocol (half bandwidth; NCCL's tuner never picks it there)
LL_MAX_BYTES = 8 << 20


#: how NCCL's tree kernels run a compiled schedule: each (tree, phase) lane in its own thread
#: group, the chunks of a lane in order over its connection (see :func:`simulate`)
NCCL_TREE_RUN = {"lanes": True, "ordered_pairs": True}


def _profiles(profile: Profile | str | None, nbytes: int = 0, topology: Topology | None = None,
              gpus: Sequence[str] = ()) -> list[Profile]:
    """The profiles to try: ``auto`` is NCCL's protocols (LL up to :data:`LL_MAX_BYTES`; LL128 where
    :func:`treecoll.collectives.sim.nccl_model.ll128_enabled`, given the topology and GPUs), anything
    else that one profile."""
    from .nccl_model import ll128_enabled
    from .profiles import NCCL_PROTOCOLS
    if profile == "auto":
        ll128 = topology is None or ll128_enabled(topology, gpus)
        return [get_profile(p) for p in NCCL_PROTOCOLS
                if not (p == "nccl-ll" and nbytes > LL_MAX_BYTES) and (ll128 or p != "nccl-ll128")]
    return [get_profile(profile)]


def simulate_algorithm(placement: Placement | Topology, algo: str, nbytes: int, *, collective: str = "allreduce",
                       ranks: RanksArg = None, profile: Profile | str | None = "auto", nchunks: int | None = None,
                       dtype: str = "float32", root: int = 0, top: int = 10, forward_lag: int = 0,
                       **opts: Any) -> SimResult:
    """Simulate one named algorithm: ``ring``, ``nvls`` (allreduce only) or any tree builder name
    (``two_level``, ``kary:4``, ...; or a Tree / MultiTree) on ``placement`` (a Placement, or a Topology
    with ``ranks``), as NCCL's kernels run it.

    Trees are built for ``nbytes`` by :func:`treecoll.collectives.builders.build` and
    compiled by :func:`treecoll.collectives.compile.compile_plan` with ``nchunks``
    pipeline chunks per tree (default: NCCL's slices, ``nbytes /``
    :data:`NCCL_TREE_CHUNK_BYTES`; more than the engine simulates exactly are
    extrapolated from two runs). ``profile="auto"``
    simulates each NCCL protocol profile and keeps the fastest (what NCCL's
    tuner aims for; LL only up to :data:`LL_MAX_BYTES`); ``opts`` go to the
    builder. ``forward_lag`` 0: an inner rank forwards each broadcast chunk as it
    arrives, as NCCL's tree kernels do, and its reduce-up and broadcast-down run
    concurrently (``lanes``; NCCL's ``runTreeSplit``). What treecoll's executor runs
    (its plan, its chunking, its in-order issue) is :func:`simulate_executor`.
    """
    p = as_placement(placement, ranks, what=f"simulate {getattr(algo, 'name', algo)}")
    topology, gpus = placed(p, what=f"simulate {getattr(algo, 'name', algo)}")
    if algo in NVLS_ALGOS:
        if collective != "allreduce":
            raise CollectiveError(f"nvls: simulated for allreduce only, got collective {collective!r}")
        from .nvls import simulate_nvls
        return simulate_nvls(topology, nbytes, dtype=dtype, ranks=gpus, profile=profile, top=top)
    profs = _profiles(profile, nbytes, topology, gpus)
    best = None
    if algo in RING_ALGOS:
        for pr in profs:
            r = simulate_ring(p, nbytes, collective=collective, dtype=dtype, profile=pr, top=top)
            best = r if best is None or r.time < best.time else best
        return best
    from .. import builders
    from .. import compile as compile_
    from ..tree import MultiTree, Tree
    if isinstance(algo, (Tree, MultiTree)):     # a tree given as is: the in-kernel mode of a built tree
        tree = algo
    else:
        tree = builders.build(algo, p, nbytes=nbytes, **opts) if algo.partition(":")[0] in (
            "auto", "two_level") else builders.build(algo, p, **opts)
    want = nchunks if nchunks is not None else max(1, nbytes // NCCL_TREE_CHUNK_BYTES)
    k = want if nchunks is not None else _sim_chunks(want, len(gpus))
    rt = root if collective in ("reduce", "broadcast") else None
    sched = compile_.compile_plan(tree, collective, k, root=rt, forward_lag=forward_lag)
    half = compile_.compile_plan(tree, collective, k // 2, root=rt, forward_lag=forward_lag) if want > k >= 4 else None
    if collective == "allreduce":
        profs = [pr.for_tree_allreduce() for pr in profs]
    for pr in profs:
        r = simulate(p, sched, nbytes, dtype=dtype, profile=pr, top=top, **NCCL_TREE_RUN)
        if half is not None:
            r = _extrapolate(r, simulate(p, half, nbytes, dtype=dtype, profile=pr, top=top, **NCCL_TREE_RUN),
                             k, want)
        best = r if best is None or r.time < best.time else best
    return best


#: how treecoll's executor runs a schedule over gloo: one TCP connection per pair of ranks (a rank's
#: messages to a peer go in order), a message moving once its receiver has posted the receive
GLOO_RUN = {"ordered_pairs": True, "rendezvous": True}


def simulate_executor(placement: Placement | Topology, tree: Any, nbytes: int, *, collective: str = "allreduce",
                      ranks: RanksArg = None, op: Any = None, algo: str = "auto", root: int | None = None,
                      nchunks: int | None = None, profile: Profile | str | None = "ideal", dtype: str = "float32",
                      top: int = 10, run: dict | None = None) -> SimResult:
    """What treecoll's executor runs for these arguments, simulated: the planner's schedule
    (:meth:`treecoll.collectives.planner.Planner.schedule_for`: the same plan, the same
    algorithm choice and the same chunks, from the one chunking policy
    :func:`treecoll.collectives.cost.nchunks_for`), issued in order on every rank.

    ``tree``, ``op``, ``algo``, ``root``, ``nchunks`` as the executor takes them (``op``
    None: a commutative one). ``run``: engine options (default :data:`GLOO_RUN`);
    ``stats["chunks"]``: chunks per tree.
    """
    from ..ops import resolve_op
    from ..planner import default_planner
    from ..tree import as_multi
    check_size(nbytes, dtype)
    p = as_placement(placement, ranks, what="simulate_executor")
    plan, sched = default_planner().schedule_for(
        tree, collective=collective, nbytes=nbytes, placement=p, op=resolve_op(op) if op is not None else None,
        algo=algo if collective == "allreduce" else "tree", root=root, nchunks=nchunks,
        max_chunks=max(1, nbytes // DTYPE_SIZES[dtype]))
    r = simulate(p, sched, nbytes, dtype=dtype, profile=profile, top=top, **(GLOO_RUN if run is None else run))
    per = sched.nchunks // (len(as_multi(plan)) if plan is not None else 1)
    return dataclasses.replace(r, stats=dict(r.stats, chunks=per))


#: NCCL's allreduce algorithms as the simulator runs them: NCCL name -> (algorithm, builder options);
#: NCCL's tree is a chain inside each host under a tree over hosts, one per NIC rail for large messages
NCCL_ALLREDUCE: dict[str, tuple[str, dict[str, Any]]] = {
    "ring": ("ring", {}), "tree": ("two_level", {"intra": "chain"}), "nvls": ("nvls", {})}
#: message size from which the simulated NCCL tree runs one tree per NIC rail: NCCL spreads a
#: message over fewer channels (so fewer NICs) the smaller it is (enqueue.cc); this size stands in
#: for that rule (an approximation: NCCL's count depends on threads and protocol)
NCCL_TREE_RAIL_BYTES = 4 << 20


def simulate_nccl_allreduce(placement: Placement | Topology, nbytes: int, *, ranks: RanksArg = None,
                            profile: Profile | str | None = "auto", algos: Sequence[str] | None = None,
                            **kw: Any) -> tuple[str, SimResult]:
    """What NCCL would run: the fastest of its allreduce algorithms, as ``(NCCL name, result)``.

    ``algos``: NCCL names to choose among (default all NCCL offers on these
    GPUs, :func:`treecoll.collectives.sim.nccl_model.nccl_algos`: ring, tree, and nvls on
    Hopper-or-later NVSwitch systems); ``nvls`` is dropped when ``profile``
    names the LL or LL128 protocol (NVLS runs Simple only).
    """
    from .. import builders
    from .nccl_model import nccl_algos
    p = as_placement(placement, ranks, what="simulate NCCL allreduce")
    topology, gpus = placed(p, what="simulate NCCL allreduce")
    offered = nccl_algos(topology, gpus, {"nccl-ll": "LL", "nccl-ll128": "LL128"}.get(profile)
                         if isinstance(profile, str) else None)
    names = [a for a in (algos or offered) if a in offered]
    if not names:
        raise CollectiveError(f"NCCL allreduce: none of {list(algos or ())} is offered here; "
                              f"expected some of {list(offered)}")

    def run(a: str) -> tuple[str, SimResult]:
        name, opts = NCCL_ALLREDUCE[a]
        if a == "tree":
            opts = {**opts, "rails": nbytes >= NCCL_TREE_RAIL_BYTES and builders.rails_possible(topology, gpus)}
        return a, simulate_algorithm(p, name, nbytes, profile=profile, **opts, **kw)

    return min((run(a) for a in names), key=lambda ar: ar[1].time)   # the first of equals


def _extrapolate(r: SimResult, r_half: SimResult, k: int, want: int) -> SimResult:
    """Pipeline extrapolation to ``want`` chunks from runs with ``k`` and ``k // 2`` chunks.

    A pipelined tree takes ``T(K) ≈ a + b / K`` (``a``: latency and the
    bottleneck's share of the bytes, ``b / K``: filling the pipeline with
    chunks of ``1/K`` of the message); two runs fix ``a`` and ``b``. Used when
    the 512 KiB chunks NCCL-like pipelining wants are more than the engine
    simulates. Times shrink by the same amount for every rank; bytes per
    link do not depend on K.
    """
    k2 = k // 2
    b = (r_half.time - r.time) / (1.0 / k2 - 1.0 / k)
    if b <= 0:
        return r
    cut = b * (1.0 / k - 1.0 / want)
    t = r.time - cut
    alg, bus = bandwidths(r.collective, r.nbytes, r.nranks, t)
    stats = dict(r.stats, extrapolated_from_chunks=[k2, k], chunks=want)
    return dataclasses.replace(r, time=t, finish=tuple(max(f - cut, 0.0) for f in r.finish), algbw=alg,
                               busbw=bus, stats=stats)
