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
import math
import time as _time
from collections.abc import Sequence
from typing import Any

import numpy as np
from treecoll.topo import Topology
from treecoll.topo.errors import CollectiveError, TreeError
from treecoll.topo.gcpause import gc_paused
from treecoll.topo.ranks import RanksArg

from ..placement import Placement, as_placement
from ..schedule import Schedule
from .engine import FlowEngine, Network, drain_times
from .nccl_model import PROTO_CHUNK_BYTES
from .profiles import NCCL_PROTO_NAMES, NCCL_PROTO_PROFILES, Profile, get_profile
from .result import (
    DTYPE_SIZES,
    EXECUTOR_RUN,
    SimResult,
    bandwidths,
    bus_factor,
    check_size,
    engine_stats,
    make_result,
    mem_bw_of,
    placed,
    schedule_result,
)

__all__ = [
    "SimResult",
    "simulate",
    "simulate_ring",
    "simulate_p2p",
    "simulate_algorithm",
    "simulate_executor",
    "executor_schedule",
    "simulate_nccl_allreduce",
    "simulate_nccl",
    "simulate_nccl_algorithm",
    "nccl_rings",
    "nccl_hop_profile",
    "hop_times",
    "staged_bytes",
    "bus_factor",
    "bandwidths",
    "DTYPE_SIZES",
    "placed",
]


@gc_paused()
def simulate(
    placement: Placement | Topology,
    schedule: Schedule,
    nbytes: int,
    *,
    dtype: str = "float32",
    ranks: RanksArg = None,
    profile: Profile | str | None = None,
    top: int = 10,
    ordered_pairs: bool = False,
    rendezvous: bool = False,
    lanes: bool = False,
    staged: float | None = None,
) -> SimResult:
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
    executor does. ``staged``: with NCCL's LL protocol, the bytes of one step a GPU writes into its host
    memory before its NIC sends them (:func:`staged_bytes`; None: the schedule's largest chunk).
    Deterministic: the same input gives the same result.
    """
    check_size(nbytes, dtype)
    prof = get_profile(profile)
    topology, gpus = placed(placement, ranks, nranks=schedule.nranks)
    chunks = schedule.chunk_bytes(nbytes)
    net = Network(topology, prof, staged_bytes(prof, max(chunks, default=0) if staged is None else staged))
    t0 = _time.perf_counter()
    raw = FlowEngine(
        net,
        schedule,
        chunks,
        gpus,
        mem_bw_of(topology, gpus),
        reduce_cost=prof.reduce_cost,
        ordered_pairs=ordered_pairs,
        rendezvous=rendezvous,
        lanes=lanes,
    ).run()
    stats = engine_stats("events", raw, _time.perf_counter() - t0)
    return schedule_result(net, schedule, nbytes, raw, prof, dtype, stats, top)


def staged_bytes(prof: Profile, step: float) -> float:
    """Bytes of one network step a GPU writes into (reads from) its host memory where NCCL's net
    transport keeps the step's buffer there: ``step`` (the bytes of one buffer step of every channel it
    sends, each at most one step of the protocol,
    :data:`~treecoll.collectives.sim.nccl_model.PROTO_CHUNK_BYTES`) with NCCL's protocols (a profile of
    :data:`~treecoll.collectives.sim.profiles.NCCL_PROTO_NAMES`, calibrated or not), else 0. Which sides
    of a route stage it (LL's send side always, every protocol's both sides without GPUDirect RDMA):
    :meth:`~treecoll.collectives.sim.engine.Network.host_staged`.

    >>> staged_bytes(get_profile("nccl-ll"), 65536), staged_bytes(get_profile("ideal"), 65536)
    (65536, 0.0)
    """
    return step if prof.name in NCCL_PROTO_NAMES else 0.0


def _proto_step(prof: Profile) -> int:
    """Bytes of one buffer step of ``prof``'s NCCL protocol (LL's for a profile that is not one of NCCL's)."""
    return PROTO_CHUNK_BYTES[NCCL_PROTO_NAMES.get(prof.name, "LL")]


def _channels_staged(prof: Profile, step: float, senders: int, channels: int | None) -> float:
    """:func:`staged_bytes` of a collective moving ``step`` bytes a step across hosts over ``channels``
    NCCL channels (None: ``senders``) spread over ``senders`` GPUs of a host, one per NIC (a ring's
    :func:`nccl_rings`; NCCL's tree channels over the host's NICs): each GPU writes one step of each of
    the ``max(1, channels / senders)`` channels it sends, a channel's step ``step / channels`` bytes up
    to one step of the protocol.

    >>> _channels_staged(get_profile("nccl-ll"), 1 << 20, 1, 4), _channels_staged(get_profile("nccl-ll"), 65536, 8, 16)
    (131072.0, 8192.0)
    >>> _channels_staged(get_profile("nccl-simple"), 1 << 20, 1, 4)   # 4 channels of 256 KiB (Simple: 512 KiB a step)
    1048576.0
    """
    nc = channels or senders
    return staged_bytes(prof, min(step / nc, _proto_step(prof)) * max(1.0, nc / senders))


def _host_groups(topology: Topology, gpus: Sequence[str]) -> dict:
    """The ranks' GPUs per host, in rank order (hosts in the order of their first rank)."""
    by_host: dict = {}
    nodes = topology.graph.nodes
    for g in gpus:
        by_host.setdefault(nodes[g].get("host"), []).append(g)
    return by_host


def _host_ring(topology: Topology, host: Any, members: list[str], c: int) -> tuple[list[str], str | None]:
    """Channel ``c``'s order through one host and the GPU it leaves the host through (PXN), or None.

    NCCL's ring search (src/graph/search.cc, NCCL 2.30: ``NET n -> GPU a -> ... -> GPU x -> NET n``,
    ``NCCL_CROSS_NIC`` default 2 tries the same NIC in and out first) enters and leaves every host
    through one NIC, so each channel stays on one rail: channel ``c`` uses the host's NIC
    ``c mod #NICs`` (``nets[(nChannels + i) % netCount]``), enters at a GPU nearest to it and ends at
    another GPU nearest to it if there is one; otherwise the last GPU sends through the entry GPU's
    NIC over NVLink (PXN, NCCL 2.12+: ``NET/IB/n(proxy)``).
    """
    nics = topology.nics(host) if host is not None else ()
    k = c % len(members)
    rotated = members[k:] + members[:k]
    if not nics:
        return rotated, None
    nic = nics[c % len(nics)]
    near = [g for g in members if topology.nearest_nic(g) == nic]
    if not near:
        return rotated, None
    entry = near[(c // len(nics)) % len(near)]
    i = members.index(entry)
    order = members[i:] + members[:i]
    others = [g for g in near if g != entry]
    if others:
        order.remove(others[0])
        order.append(others[0])
        return order, None
    last = order[-1]
    if last != entry and topology.path(last, entry).nccl in ("NVL", "NVB"):
        return order, entry
    return order, None


def nccl_rings(topology: Topology, gpus: Sequence[str], channels: int) -> list[list[tuple[str, str, str | None]]]:
    """NCCL's ring of every channel as its hops ``(src, dst, via)``: ``via`` is the GPU whose NIC a
    host-leaving hop goes through (PXN; None: the sender's own route). See :func:`_host_ring`;
    on one host the rings rotate the rank order by the channel number."""
    groups = _host_groups(topology, gpus)
    multi = len(groups) > 1
    out = []
    for c in range(channels):
        order: list[str] = []
        vias: dict[str, str] = {}
        for host, members in groups.items():
            if multi:
                seg, via = _host_ring(topology, host, members, c)
                if via is not None:
                    vias[seg[-1]] = via
            else:
                k = c % len(members)
                seg = members[k:] + members[:k]
            order.extend(seg)
        P = len(order)
        out.append([(order[i], order[(i + 1) % P], vias.get(order[i]) if multi else None) for i in range(P)])
    return out


def ring_orders(topology: Topology, gpus: Sequence[str], channels: int) -> list[list[str]]:
    """One ring per channel (the GPUs in ring order), as :func:`nccl_rings` lays them over the NICs."""
    return [[s for s, _, _ in ring] for ring in nccl_rings(topology, gpus, channels)]


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


def _hop_route(net: Network, src: str, dst: str, via: str | None) -> tuple[list[tuple[np.ndarray, float]], float]:
    """``(subroutes, latency s)`` of one hop; through ``via`` (PXN): the NVLink route to ``via`` joined to
    ``via``'s route to ``dst`` (latency: the second route's, plus the first's links)."""
    r = net.route(src, dst if via is None else via)
    if via is None:
        return list(r.subroutes), r.lat
    r2 = net.route(via, dst)
    lat1 = net.topology.path(src, via).lat * 1e-6
    subs = [
        (np.concatenate([ids, ids2]), share * share2) for ids, share in r.subroutes for ids2, share2 in r2.subroutes
    ]
    return subs, r2.lat + lat1


def _hop_subflows(net: Network, hops: Sequence[tuple[str, str, str | None]], sizes: Sequence[float]):
    """``(link id arrays, bytes, owning hop, hop latencies)`` of every subflow of ``hops`` moving ``sizes``."""
    links, subsizes, owner, lats = [], [], [], []
    for i, ((a, b, via), n) in enumerate(zip(hops, sizes)):
        subs, lat = _hop_route(net, a, b, via)
        lats.append(lat)
        for ids, share in subs:
            links.append(ids)
            subsizes.append(n * share)
            owner.append(i)
    return links, subsizes, owner, lats


def hop_times(
    net: Network, hops: Sequence[tuple[str, str, str | None]], sizes: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """``(latency, drain)`` in seconds of hops ``(src, dst, via)`` that all start together, moving
    ``sizes[i]`` bytes each; rates from one max-min allocation (as
    :func:`~treecoll.collectives.sim.engine.concurrent_times`, with PXN hops through ``via``)."""
    links, subsizes, owner, lats = _hop_subflows(net, hops, sizes)
    drain = np.zeros(len(hops))
    if links:
        np.maximum.at(drain, np.asarray(owner, dtype=np.int64), drain_times(net, links, subsizes))
    return np.asarray(lats, dtype=np.float64), drain


def _hop_load(net: Network, hops: Sequence[tuple[str, str, str | None]], sizes: Sequence[float]) -> np.ndarray:
    """Bytes each numbered link carries for ``hops`` moving ``sizes`` bytes."""
    links, subsizes, _, _ = _hop_subflows(net, hops, sizes)
    out = np.zeros(len(net.ends))
    if links:
        np.add.at(out, np.concatenate(links), np.repeat(subsizes, [len(ids) for ids in links]))
    return out


def _chain_latency(lat: np.ndarray, nsteps: int) -> float:
    """Largest summed latency of ``nsteps`` consecutive hops of any ring (``lat[channel, hop]``, cyclic)."""
    C, P = lat.shape
    full, rem = divmod(nsteps, P)
    tot = lat.sum(axis=1)
    if rem == 0:
        return float((full * tot).max())
    ext = np.concatenate([lat, lat], axis=1)
    cs = np.concatenate([np.zeros((C, 1)), np.cumsum(ext, axis=1)], axis=1)
    windows = cs[:, rem : rem + P] - cs[:, :P]
    return float((full * tot + windows.max(axis=1)).max())


def _inputs(
    placement: Placement | Topology,
    ranks: RanksArg,
    nbytes: int,
    dtype: str,
    profile: Profile | str | None,
    collective: str,
    kind: str,
    allowed: Sequence[str],
) -> tuple[Profile, Topology, tuple[str, ...]]:
    """The checked inputs of a lockstep simulation: its profile, topology and rank GPUs."""
    if collective not in allowed:
        raise CollectiveError(f"{kind} collective {collective!r}: expected one of {', '.join(allowed)}")
    check_size(nbytes, dtype)
    prof = get_profile(profile)
    topology, gpus = placed(placement, ranks, what=f"simulate_{kind}")
    return prof, topology, gpus


#: collectives NCCL runs on its rings (broadcast and reduce: a pipelined chain from / to the root)
RING_COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")
#: bytes of one pipeline chunk of NCCL's ring broadcast / reduce per protocol profile: a buffer step
#: (:data:`treecoll.collectives.sim.nccl_model.PROTO_CHUNK_BYTES`) times BROADCAST_CHUNKSTEPS =
#: REDUCE_CHUNKSTEPS = 1 (src/include/collectives.h)
PIPELINE_CHUNK_BYTES = {f"nccl-{p.lower()}": b for p, b in PROTO_CHUNK_BYTES.items()}


@gc_paused()
def simulate_ring(
    placement: Placement | Topology,
    nbytes: int,
    *,
    collective: str = "allreduce",
    dtype: str = "float32",
    ranks: RanksArg = None,
    profile: Profile | str | None = None,
    channels: int | None = None,
    top: int = 10,
    root: int = 0,
) -> SimResult:
    """NCCL's ring ``allreduce`` (reduce-scatter then all-gather), ``reduce_scatter``, ``allgather``,
    ``broadcast`` or ``reduce`` (``root``: a rank), over one ring per channel (:func:`nccl_rings`:
    each channel enters and leaves every host through one NIC, the channels spread over the NICs).

    ``nbytes`` is the size nccl-tests prints: the per-rank buffer for
    allreduce, broadcast and reduce, the total (all ranks' pieces) for reduce_scatter and
    allgather; each of the ``channels`` rings carries an equal share. Every step all
    ranks send one chunk (``size / (P × channels)``) to their ring successor at once; the
    step time comes from one max-min allocation of those P × channels transfers
    (:func:`hop_times`), and a reduce-scatter step takes the longer of that and its reduce
    (``3 × chunk / mem_bw``: NCCL reduces while the data streams in).
    Steps: 2(P−1) for allreduce, P−1 for either half. Broadcast and reduce pipeline
    :data:`PIPELINE_CHUNK_BYTES` chunks down the chain of P−1 hops from (to) the root: ``k``
    chunks per channel take the chain's latency plus ``k + P − 2`` chunk steps.
    With NCCL's LL protocol a hop across hosts runs from the sender's host memory, one LL step
    of each channel written there first (:func:`staged_bytes`).
    """
    prof, topology, gpus = _inputs(placement, ranks, nbytes, dtype, profile, collective, "ring", RING_COLLECTIVES)
    prof = nccl_hop_profile(prof, "ring", one_per_host=len(_host_groups(topology, gpus)) == len(gpus))
    P = len(gpus)
    C = channels or default_channels(topology, gpus)
    if C < 1:
        raise CollectiveError(f"channels: expected >= 1, got {C}")
    if collective in ("broadcast", "reduce") and not 0 <= root < P:
        raise CollectiveError(f"{collective} root: expected a rank in 0..{P - 1}, got {root}")
    t0 = _time.perf_counter()
    chunk = nbytes / C if collective in ("broadcast", "reduce") else nbytes / (P * C)
    send_bw, nccl_channels = _nccl_ring_run(topology, gpus, nbytes, prof) if P > 1 else (math.inf, None)
    net = Network(topology, prof, _channels_staged(prof, chunk * C, C, nccl_channels))
    link_bytes = np.zeros(0)
    makespan = 0.0
    stats: dict[str, Any] = {"engine": "lockstep ring", "channels": C}
    memb = mem_bw_of(topology, gpus)
    reduce_bw = min(memb) if (prof.reduce_cost and min(memb) > 0) else 0.0
    rings = nccl_rings(topology, gpus, C) if P > 1 else []
    stats["rank_send_cap_GBps"] = send_bw if math.isfinite(send_bw) else None
    if collective in ("broadcast", "reduce"):
        if P > 1:
            makespan, link_bytes, k = _ring_chain(
                net, rings, root, gpus, chunk, prof, reduce_bw, collective == "reduce", send_bw
            )
            stats.update(steps=k + P - 2, pipeline_chunks=k, transfers_per_step=(P - 1) * C)
        peaks = [0.0] * P
    else:
        rs_steps = (P - 1) if collective in ("allreduce", "reduce_scatter") else 0
        ag_steps = (P - 1) if collective in ("allreduce", "allgather") else 0
        if P > 1:
            hops = [h for ring in rings for h in ring]
            sizes = [chunk] * len(hops)
            lat, drain = hop_times(net, hops, sizes)
            red = 3.0 * chunk * C / reduce_bw if reduce_bw else 0.0
            step = max(float(drain.max()), chunk * C / (send_bw * 1e9))
            makespan = (
                _chain_latency(lat.reshape(C, P), rs_steps + ag_steps) + rs_steps * max(step, red) + ag_steps * step
            )
            link_bytes = _hop_load(net, hops, sizes) * (rs_steps + ag_steps)
        peaks = [chunk * C if rs_steps else 0.0] * P
        stats.update(steps=rs_steps + ag_steps, transfers_per_step=P * C)
    stats["wall_s"] = _time.perf_counter() - t0
    return make_result(
        net, collective, "ring", nbytes, nbytes, P, makespan, [makespan] * P, link_bytes, peaks, prof, dtype, stats, top
    )


def _nccl_ring_run(topology: Topology, gpus: Sequence[str], nbytes: int, prof: Profile) -> tuple[float, int | None]:
    """``(GB/s, channels)``: what a rank sends at on NCCL's ring with an NCCL protocol profile, the
    channels NCCL runs at this size (:func:`treecoll.collectives.sim.nccl_model.ring_run`, enqueue.cc)
    times the protocol's efficiency on the slowest link kind that bandwidth comes from
    (:func:`_ring_kinds`), and how many channels that is; ``(inf, None)`` for other profiles, on CPUs
    and where no NCCL ring bandwidth can be derived."""
    proto = NCCL_PROTO_NAMES.get(prof.name)
    if proto is None:
        return math.inf, None
    from treecoll.topo.discover import CPU_SLOT_MODEL

    from .nccl_model import ring_run

    if any(topology.graph.nodes[g].get("model") == CPU_SLOT_MODEL for g in gpus):
        return math.inf, None
    try:
        bw, nc = ring_run(topology, gpus, nbytes, proto)
    except TreeError:  # no NCCL ring bandwidth to derive (e.g. hosts without NIC bandwidth)
        return math.inf, None
    return bw * min(prof.efficiency(k) for k in _ring_kinds(topology, gpus)), nc


def _ring_kinds(topology: Topology, gpus: Sequence[str]) -> set[str]:
    """The link kinds NCCL's ring bandwidth comes from (nccl_model's ``min(intra-host, NIC)``): those on
    the route between two GPUs of a host, and ``net`` across hosts."""
    groups = _host_groups(topology, gpus)
    kinds = {"net"} if len(groups) > 1 else set()
    pair = next((m for m in groups.values() if len(m) > 1), None)
    if pair is not None:
        nodes = topology.path(pair[0], pair[1]).nodes
        kinds.update(topology.graph.edges[u, v]["kind"] for u, v in zip(nodes, nodes[1:]))
    return kinds or {"net"}


def _ring_chain(
    net: Network,
    rings,
    root: int,
    gpus: Sequence[str],
    chunk: float,
    prof: Profile,
    reduce_bw: float,
    reduce: bool,
    send_bw: float = math.inf,
) -> tuple[float, np.ndarray, int]:
    """(seconds, link bytes, chunks per channel) of a broadcast (or, ``reduce``, a reduce) of ``chunk``
    bytes per channel down each ring from rank ``root`` (to it): the P−1 hops that do not enter
    (leave) the root, every hop busy at once in the pipeline's steady state."""
    src = gpus[root]
    hops = []
    for ring in rings:
        i = next(k for k, h in enumerate(ring) if h[0] == src)
        # broadcast: every hop but the one back into the root; reduce: every hop but the one out of it
        first = i + 1 if reduce else i
        hops.extend(ring[(first + j) % len(ring)] for j in range(len(ring) - 1))
    step_bytes = min(chunk, PIPELINE_CHUNK_BYTES.get(prof.name, PIPELINE_CHUNK_BYTES["nccl-simple"]))
    k = max(1, int(math.ceil(chunk / step_bytes))) if chunk > 0 else 1
    step_bytes = chunk / k
    sizes = [step_bytes] * len(hops)
    lat, drain = hop_times(net, hops, sizes)
    n = len(hops) // len(rings)
    chain_lat = float(lat.reshape(len(rings), n).sum(axis=1).max())
    step = max(float(drain.max()), step_bytes * len(rings) / (send_bw * 1e9))
    if reduce and reduce_bw:
        step = max(step, 3.0 * step_bytes * len(rings) / reduce_bw)
    seconds = chain_lat + (k + n - 1) * step
    return seconds, _hop_load(net, hops, sizes) * k, k


#: NCCL point-to-point collectives of nccl-tests: alltoall (rank r sends ``S / P`` to every rank) and
#: sendrecv (rank r sends ``S`` to r + 1 and receives from r − 1)
P2P_COLLECTIVES = ("alltoall", "sendrecv")
#: most ranks :func:`simulate_p2p` runs an alltoall on (its P(P−1) transfers are simulated one by one)
MAX_ALLTOALL_RANKS = 1024


@gc_paused()
def simulate_p2p(
    placement: Placement | Topology,
    nbytes: int,
    *,
    collective: str = "alltoall",
    dtype: str = "float32",
    ranks: RanksArg = None,
    profile: Profile | str | None = None,
    top: int = 10,
) -> SimResult:
    """nccl-tests' ``alltoall`` or ``sendrecv`` of ``nbytes`` (the size it prints: a rank's send
    buffer), every transfer at once: the time is the largest of each transfer's route latency
    plus its drain under one max-min allocation (:func:`hop_times`), plus the profile's base latency.

    Two GPUs on one link of ``B`` GB/s and ``lat`` µs, ``ideal`` profile: sendrecv takes
    ``lat + S / B``. With NCCL's protocol profiles a transfer also moves at most as fast as the
    channels NCCL runs it on (:func:`~treecoll.collectives.sim.nccl_model.p2p_channels`) carry
    (:func:`~treecoll.collectives.sim.nccl_model.p2p_channel_bw` each).
    """
    prof, topology, gpus = _inputs(placement, ranks, nbytes, dtype, profile, collective, "p2p", P2P_COLLECTIVES)
    P = len(gpus)
    if collective == "alltoall" and P > MAX_ALLTOALL_RANKS:
        raise CollectiveError(
            f"alltoall on {P} ranks: the simulator runs it on at most {MAX_ALLTOALL_RANKS} "
            f"(P(P-1) transfers); use the NCCL model (nccl_predict) beyond"
        )
    t0 = _time.perf_counter()
    if collective == "alltoall":
        hops = [(a, b, None) for a in gpus for b in gpus if a != b]
        sizes = [nbytes / P] * len(hops)
    else:
        hops = [(gpus[r], gpus[(r + 1) % P], None) for r in range(P)] if P > 1 else []
        sizes = [float(nbytes)] * len(hops)
    net = Network(topology, prof, staged_bytes(prof, min(sizes[0] if sizes else 0.0, _proto_step(prof))))
    makespan, link_bytes = 0.0, np.zeros(0)
    if hops:
        lat, drain = hop_times(net, hops, sizes)
        if prof.name in NCCL_P2P_PROFILES:  # a peer's channels, each one thread block (nccl_model.p2p_channels)
            drain = _p2p_drain(topology, gpus, hops, sizes, drain)
        makespan = float((lat + drain).max())
        link_bytes = _hop_load(net, hops, sizes)
    stats = {"engine": "p2p", "transfers": len(hops), "wall_s": _time.perf_counter() - t0}
    return make_result(
        net,
        collective,
        "p2p",
        nbytes,
        nbytes,
        P,
        makespan,
        [makespan] * P,
        link_bytes,
        [0.0] * P,
        prof,
        dtype,
        stats,
        top,
    )


#: the protocol profiles NCCL runs point-to-point operations with (never LL128; src/enqueue.cc addP2pToPlan)
NCCL_P2P_PROFILES = {name: NCCL_PROTO_NAMES[name] for name in ("nccl-ll", "nccl-simple")}


def _p2p_setup_or_none(topology: Topology, gpus: Sequence[str]) -> dict | None:
    """NCCL's point-to-point setup (:func:`~treecoll.collectives.sim.nccl_model.p2p_setup`) for these GPUs;
    None where NCCL does not run (CPU process slots, one rank) or its channels cannot be derived
    (hosts without NIC bandwidth). Kept per topology object and GPUs: a sendrecv asks it for the
    protocol and again for each profile's drain."""
    from treecoll.topo.discover import CPU_SLOT_MODEL

    from ..in_network import _kept
    from .nccl_model import p2p_setup

    def answer() -> dict | None:
        if len(gpus) < 2 or any(topology.graph.nodes[g].get("model") == CPU_SLOT_MODEL for g in gpus):
            return None
        try:
            return p2p_setup(topology, gpus)
        except TreeError:
            return None

    return _kept("p2p_setup", topology, gpus, answer)


def _p2p_drain(
    topology: Topology,
    gpus: Sequence[str],
    hops: Sequence[tuple[str, str, str | None]],
    sizes: Sequence[float],
    drain: np.ndarray,
) -> np.ndarray:
    """``drain`` (s) of ``hops`` moving ``sizes`` bytes, each at most as fast as the channels NCCL runs it
    on carry (:func:`~treecoll.collectives.sim.nccl_model.p2p_channels` x
    :func:`~treecoll.collectives.sim.nccl_model.p2p_channel_bw`); the routes are looked up only where
    the slowest channel rate could bind."""
    from .nccl_model import NVLINK_BW, P2P_PER_CHANNEL_NET_BW, p2p_channel_bw, p2p_channels

    setup = _p2p_setup_or_none(topology, gpus)
    if setup is None:
        return drain
    nch = {n: p2p_channels(n, setup) for n in set(sizes)}
    slowest = min(NVLINK_BW[setup["gen"]], P2P_PER_CHANNEL_NET_BW)
    out = np.asarray(drain, dtype=np.float64).copy()
    for i, ((a, b, _), n) in enumerate(zip(hops, sizes)):
        if n / (nch[n] * slowest * 1e9) > out[i]:
            out[i] = max(out[i], n / (nch[n] * p2p_channel_bw(topology, a, b, setup["gen"]) * 1e9))
    return out


def _p2p_profiles(profiles: Sequence[Profile], topology: Topology, gpus: Sequence[str], nbytes: int, collective: str):
    """Of NCCL's protocol ``profiles``, the one NCCL runs a point-to-point collective of ``nbytes`` with
    (:func:`~treecoll.collectives.sim.nccl_model.p2p_protocol` of one operation: a rank's buffer for
    sendrecv, its share per peer for alltoall); other profiles as given."""
    from .nccl_model import p2p_channels, p2p_protocol

    if not profiles or any(p.name not in NCCL_P2P_PROFILES and p.name != "nccl-ll128" for p in profiles):
        return list(profiles)
    setup = _p2p_setup_or_none(topology, gpus)
    if setup is None:
        return list(profiles)
    op = nbytes / len(gpus) if collective == "alltoall" else nbytes
    proto = p2p_protocol(op, p2p_channels(op, setup))
    chosen = [p for p in profiles if NCCL_P2P_PROFILES.get(p.name) == proto]
    return chosen or [p for p in profiles if p.name in NCCL_P2P_PROFILES] or list(profiles)


#: algorithms :func:`simulate_algorithm` knows besides the tree builders of :mod:`treecoll.collectives.builders`:
#: NCCL's ring and NVLS (NVLSTree across NVLink domains, :mod:`treecoll.collectives.sim.nvls`)
RING_ALGOS = ("ring", "pat")
NVLS_ALGOS = ("nvls",)
P2P_ALGOS = ("p2p",)
#: NCCL's tree kernels pipeline each channel's share in chunks of one buffer step (Simple: 512 KiB);
#: :func:`simulate_algorithm` runs trees as NCCL's kernels run them (:data:`NCCL_TREE_RUN`), a step
#: moving a chunk on every channel (:func:`_tree_slice`), this many bytes where no channel count can
#: be derived (what treecoll's executor runs is :func:`simulate_executor`)
NCCL_TREE_CHUNK_BYTES = 512 << 10
#: most pipeline chunks per tree the engine simulates exactly (its cost grows with chunks x tree edges);
#: beyond, and beyond 8192 / P, a run is extrapolated from two (:func:`_extrapolate`)
MAX_SIM_CHUNKS = 32


def _sim_chunks(want: int, nranks: int) -> int:
    """Chunks the engine simulates for a run that pipelines ``want``: at most
    :data:`MAX_SIM_CHUNKS` and ``8192 / P``, and at least 2 when ``want`` is (so that
    :func:`_extrapolate` has the runs of 1 and 2 chunks from 4096 ranks on).

    >>> _sim_chunks(8, 128), _sim_chunks(64, 128), _sim_chunks(8, 4096), _sim_chunks(8, 16384), _sim_chunks(1, 16384)
    (8, 32, 2, 2, 1)
    """
    return int(max(min(want, 2), min(want, MAX_SIM_CHUNKS, 8192 // max(nranks, 1))))


#: above this many bytes "auto" skips the LL protocol (half bandwidth; NCCL's tuner never picks it there)
LL_MAX_BYTES = 8 << 20


#: how NCCL's tree kernels run a compiled schedule: each (tree, phase) lane in its own thread
#: group, the chunks of a lane in order over its connection (see :func:`simulate`)
NCCL_TREE_RUN = {"lanes": True, "ordered_pairs": True}


def _profiles(
    profile: Profile | str | None,
    nbytes: int = 0,
    topology: Topology | None = None,
    gpus: Sequence[str] = (),
    family: str = "ring",
) -> list[Profile]:
    """The profiles to try: ``auto`` is NCCL's protocols (LL up to :data:`LL_MAX_BYTES`; given the topology
    and GPUs, those :func:`treecoll.collectives.sim.nccl_model.nccl_protocols` runs there); a
    :class:`~treecoll.collectives.sim.profiles.Calibration` the same protocols (those its switch points
    run at this size, :meth:`~treecoll.collectives.sim.profiles.Calibration.runs`) with its factors for
    algorithm ``family`` (:meth:`~treecoll.collectives.sim.profiles.Calibration.apply`); anything
    else that one profile."""
    from .nccl_model import PROTOS, nccl_protocols
    from .profiles import NCCL_PROTOCOLS, Calibration

    prof = None if profile == "auto" else get_profile(profile)
    if prof is None or isinstance(prof, Calibration):
        offered = PROTOS if topology is None else nccl_protocols(topology, gpus)

        def runs(p: str) -> bool:
            said = prof.runs(p, nbytes) if prof is not None else None  # a calibration's switch point
            return not (p == "nccl-ll" and nbytes > LL_MAX_BYTES) if said is None else said

        protos = [get_profile(p) for p, q in zip(NCCL_PROTOCOLS, PROTOS) if runs(p) and q in offered]
        protos = protos or [get_profile("nccl-simple")]  # a switch point to a protocol the fabric does not run
        if prof is None:
            return protos
        one = topology is not None and len(_host_groups(topology, gpus)) == len(gpus)
        if family in ("ring", "tree"):  # the family's own NCCL latencies, then the calibration's factors
            protos = [nccl_hop_profile(p, family, one_per_host=one and family == "ring") for p in protos]
        return [prof.apply(p, family) for p in protos]
    return [prof]


def simulate_algorithm(
    placement: Placement | Topology,
    algo: str,
    nbytes: int,
    *,
    collective: str = "allreduce",
    ranks: RanksArg = None,
    profile: Profile | str | None = "auto",
    nchunks: int | None = None,
    dtype: str = "float32",
    root: int = 0,
    top: int = 10,
    forward_lag: int = 0,
    **opts: Any,
) -> SimResult:
    """Simulate one named algorithm: ``ring``, ``nvls`` (allreduce only) or any tree builder name
    (``two_level``, ``kary:4``, ...; or a Tree / MultiTree) on ``placement`` (a Placement, or a Topology
    with ``ranks``), as NCCL's kernels run it.

    Trees are built for ``nbytes`` by :func:`treecoll.collectives.builders.build` and
    compiled by :func:`treecoll.collectives.compile.compile_plan` with ``nchunks``
    pipeline chunks per tree (default: NCCL's pipeline steps per protocol, ``nbytes /``
    (channels × chunk), :func:`_tree_slice`; more than the engine simulates exactly are
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
    if (algo in P2P_ALGOS) != (collective in P2P_COLLECTIVES):
        raise CollectiveError(
            f"{collective} with algorithm {algo!r}: alltoall and sendrecv run as 'p2p', "
            f"the other collectives on a ring, NVLS or a tree"
        )
    if algo in P2P_ALGOS:
        return min(
            (
                simulate_p2p(p, nbytes, collective=collective, dtype=dtype, profile=pr, top=top)
                for pr in _p2p_profiles(
                    _profiles(profile, nbytes, topology, gpus, "p2p"), topology, gpus, nbytes, collective
                )
            ),
            key=lambda r: r.time,
        )
    if algo in NVLS_ALGOS:
        if collective != "allreduce":
            raise CollectiveError(f"nvls: simulated for allreduce only, got collective {collective!r}")
        from .nvls import simulate_nvls

        return simulate_nvls(topology, nbytes, dtype=dtype, ranks=gpus, profile=profile, top=top)
    profs = _profiles(profile, nbytes, topology, gpus, "ring" if algo in RING_ALGOS else "tree")
    best = None
    if algo in RING_ALGOS:  # PAT (NCCL's allgather / reduce_scatter at one GPU per node) runs as the ring
        for pr in profs:
            r = simulate_ring(p, nbytes, collective=collective, dtype=dtype, profile=pr, top=top, root=root)
            best = r if best is None or r.time < best.time else best
        return best
    from .. import builders
    from .. import compile as compile_
    from ..tree import MultiTree, Tree

    if isinstance(algo, (Tree, MultiTree)):  # a tree given as is: the in-kernel mode of a built tree
        tree = algo
    else:
        tree = (
            builders.build(algo, p, nbytes=nbytes, **opts)
            if algo.partition(":")[0] in ("auto", "two_level")
            else builders.build(algo, p, **opts)
        )
    rt = root if collective in ("reduce", "broadcast") else None
    plans: dict[int, Schedule] = {}

    def plan(k: int) -> Schedule:
        if k not in plans:
            plans[k] = compile_.compile_plan(tree, collective, k, root=rt, forward_lag=forward_lag)
        return plans[k]

    for pr in profs:
        want = nchunks if nchunks is not None else max(1, -(-nbytes // _tree_slice(topology, gpus, nbytes, pr)))
        k = want if nchunks is not None else _sim_chunks(want, len(gpus))
        pr = nccl_hop_profile(pr, "tree")
        if collective == "allreduce":
            pr = pr.for_tree_allreduce()
        run = {**NCCL_TREE_RUN, "staged": _tree_staged(topology, gpus, nbytes, want, pr)}
        r = simulate(p, plan(k), nbytes, dtype=dtype, profile=pr, top=top, **run)
        if want > k >= 2:
            r_half = simulate(p, plan(k // 2), nbytes, dtype=dtype, profile=pr, top=top, **run)
            r = _extrapolate(r, r_half, k, want)
        best = r if best is None or r.time < best.time else best
    return best


def nccl_hop_profile(prof: Profile, algo: str, one_per_host: bool = False) -> Profile:
    """``prof`` with NCCL's base and per-hop latencies of ``algo`` (``ring`` or ``tree``) when it is one of
    NCCL's built-in protocol profiles (a calibrated or other profile is returned as it is).

    NCCL 2.30 src/graph/tuning.cc: trees have their own ``baseLatencies`` and ``hwLatencies``
    (a network hop of a tree costs more than a ring's: 5.0 / 8.5 / 14 µs against 2.7 / 4.0 / 14 for
    LL / LL128 / Simple), and with one rank per node a ring's network hops take the tree's ("With
    ppn=1 latencies are fully exposed, use the Tree network latency"), as :mod:`.nccl_model` does.

    >>> from treecoll.collectives.sim.profiles import get_profile
    >>> p = nccl_hop_profile(get_profile("nccl-ll"), "tree")
    >>> p.base_lat_us, p.lat_floor_us
    (6.8, {'nvlink': 0.6, 'pci': 1.0, 'net': 5.0})
    >>> nccl_hop_profile(get_profile("nccl-ll"), "ring", one_per_host=True).lat_floor_us["net"]
    5.0
    """
    from .nccl_model import BASE_LAT, HW_LAT, PROTOS
    from .profiles import NCCL_PROTOCOLS, PROFILES

    if prof.name not in NCCL_PROTOCOLS or prof != PROFILES[prof.name]:
        return prof
    pi = PROTOS.index(NCCL_PROTO_NAMES[prof.name])
    net = HW_LAT["NET"]["tree" if one_per_host else algo][pi]
    floors = {"nvlink": HW_LAT["NVLINK"][algo][pi], "pci": HW_LAT["PCI"][algo][pi], "net": net}
    return dataclasses.replace(prof, base_lat_us=BASE_LAT[algo][pi], lat_floor_us=floors)


def _tree_staged(topology: Topology, gpus: Sequence[str], nbytes: int, steps: int, prof: Profile) -> float | None:
    """:func:`staged_bytes` of NCCL's tree moving ``nbytes`` in ``steps`` pipeline steps with ``prof`` (None:
    not one of NCCL's protocols, the schedule's chunk): the simulated tree carries every channel through
    one GPU of a host, where NCCL spreads its tree channels over the host's NICs, each NIC's GPU writing
    its own channels' steps (:func:`_channels_staged`; LL: :func:`_tree_slice`'s 32 KiB a channel, the
    other protocols a step's share of each NIC).

    >>> from treecoll import topo
    >>> t = topo.resolve("dgx-h100-x2")    # 64 KiB: 16 channels over 8 NICs, 2 of 4 KiB a GPU
    >>> _tree_staged(t, t.rank_gpus(), 65536, 1, get_profile("nccl-ll"))
    8192.0
    """
    if prof.name not in NCCL_PROTO_NAMES:
        return None
    nics = min(len(topology.nics(h)) for h in _host_groups(topology, gpus))
    channels = None
    if prof.name == "nccl-ll":
        channels = max(1, _tree_slice(topology, gpus, nbytes, prof) // PROTO_CHUNK_BYTES["LL"])
    return _channels_staged(prof, nbytes / steps, max(1, nics), channels)


def _tree_slice(topology: Topology, gpus: Sequence[str], nbytes: int, profile: Profile) -> int:
    """Bytes a tree moves per pipeline step as NCCL's kernels run it with ``profile``'s protocol
    (Simple for a profile that is not one of NCCL's): a chunk on every channel it runs on
    (:func:`treecoll.collectives.sim.nccl_model.tree_slice_bytes`); :data:`NCCL_TREE_CHUNK_BYTES`
    where the GPUs give NCCL no channels to derive (hosts without NIC bandwidth)."""
    from .nccl_model import tree_slice_bytes

    proto = NCCL_PROTO_NAMES.get(profile.name, "Simple")
    try:
        return tree_slice_bytes(topology, gpus, nbytes, proto)
    except TreeError:
        return NCCL_TREE_CHUNK_BYTES


def simulate_executor(
    placement: Placement | Topology,
    tree: Any,
    nbytes: int,
    *,
    collective: str = "allreduce",
    ranks: RanksArg = None,
    op: Any = None,
    algo: str = "auto",
    root: int | None = None,
    nchunks: int | None = None,
    profile: Profile | str | None = "ideal",
    dtype: str = "float32",
    top: int = 10,
    run: dict | None = None,
) -> SimResult:
    """What treecoll's executor runs for these arguments, simulated: the planner's schedule
    (:meth:`treecoll.collectives.planner.Planner.schedule_for`: the same plan, the same
    algorithm choice and the same chunks, from the one chunking policy
    :func:`treecoll.collectives.cost.nchunks_for`), issued in order on every rank.

    ``tree``, ``op``, ``algo``, ``root``, ``nchunks`` as the executor takes them (``op``
    None: a commutative one). ``run``: engine options (default :data:`EXECUTOR_RUN`);
    ``stats["chunks"]``: chunks per tree.
    """
    from ..ops import resolve_op

    check_size(nbytes, dtype)
    p = as_placement(placement, ranks, what="simulate_executor")
    op = resolve_op(op) if op is not None else None
    sched, per = executor_schedule(
        p, tree, nbytes, collective=collective, op=op, algo=algo, root=root, nchunks=nchunks, dtype=dtype
    )
    r = simulate(p, sched, nbytes, dtype=dtype, profile=profile, top=top, **(EXECUTOR_RUN if run is None else run))
    return dataclasses.replace(r, stats=dict(r.stats, chunks=per))


def executor_schedule(
    placement: Placement,
    tree: Any,
    nbytes: int,
    *,
    collective: str,
    op: Any = None,
    algo: str,
    root: int | None,
    nchunks: int | None,
    dtype: str,
) -> tuple[Schedule, int]:
    """The schedule treecoll's executor runs for these arguments (the planner's,
    :meth:`treecoll.collectives.planner.Planner.schedule_for`; ``algo`` applies to an allreduce,
    other collectives run the tree; at most one chunk per ``dtype`` element) and its chunks per tree."""
    from ..planner import default_planner
    from ..tree import as_multi

    plan, sched = default_planner().schedule_for(
        tree,
        collective=collective,
        nbytes=nbytes,
        placement=placement,
        op=op,
        algo=algo if collective == "allreduce" else "tree",
        root=root,
        nchunks=nchunks,
        max_chunks=max(1, nbytes // DTYPE_SIZES[dtype]),
    )
    return sched, sched.nchunks // (len(as_multi(plan)) if plan is not None else 1)


#: NCCL's allreduce algorithms as the simulator runs them: NCCL name -> (algorithm, builder options);
#: NCCL's tree is a chain inside each host under a tree over hosts, one per NIC rail for large messages
NCCL_ALLREDUCE: dict[str, tuple[str, dict[str, Any]]] = {
    "ring": ("ring", {}),
    "tree": ("two_level", {"intra": "chain"}),
    "nvls": ("nvls", {}),
}
#: message size from which the simulated NCCL tree runs one tree per NIC rail: NCCL spreads a
#: message over fewer channels (so fewer NICs) the smaller it is (enqueue.cc); this size stands in
#: for that rule (an approximation: NCCL's count depends on threads and protocol)
NCCL_TREE_RAIL_BYTES = 4 << 20


def simulate_nccl_allreduce(
    placement: Placement | Topology,
    nbytes: int,
    *,
    ranks: RanksArg = None,
    profile: Profile | str | None = "auto",
    algos: Sequence[str] | None = None,
    **kw: Any,
) -> tuple[str, SimResult]:
    """What NCCL would run for an allreduce: :func:`simulate_nccl` with ``collective="allreduce"``."""
    return simulate_nccl(placement, nbytes, collective="allreduce", ranks=ranks, profile=profile, algos=algos, **kw)


def nccl_offered(
    topology: Topology, gpus: Sequence[str], collective: str, profile: Profile | str | None = None
) -> tuple[str, ...]:
    """The NCCL algorithms :func:`simulate_nccl` chooses among for ``collective`` on ``gpus``: NCCL's
    offer (:func:`~treecoll.collectives.sim.nccl_model.nccl_algos`, restricted to the protocol
    of a named NCCL protocol ``profile``), without CollNet (not simulated) and with NVLS for
    allreduce only.

    >>> from treecoll.collectives.cost import uniform_topology
    >>> t = uniform_topology(4)                  # 4 GPUs on one NVLS-capable switch
    >>> nccl_offered(t, t.rank_gpus(), "allreduce"), nccl_offered(t, t.rank_gpus(), "allgather")
    (('ring', 'tree', 'nvls'), ('ring',))
    >>> nccl_offered(t, t.rank_gpus(), "allreduce", "nccl-ll")   # NVLS runs Simple only
    ('ring', 'tree')
    """
    from .nccl_model import nccl_algos

    proto = NCCL_PROTO_NAMES.get(profile) if isinstance(profile, str) else None
    offered = nccl_algos(topology, gpus, proto, collective)
    return tuple(a for a in offered if a != "collnet" and (a != "nvls" or collective == "allreduce"))


def simulate_nccl(
    placement: Placement | Topology,
    nbytes: int,
    *,
    collective: str = "allreduce",
    ranks: RanksArg = None,
    profile: Profile | str | None = "auto",
    algos: Sequence[str] | None = None,
    choose: str = "fastest",
    **kw: Any,
) -> tuple[str, SimResult]:
    """What NCCL would run for ``collective`` (one of nccl-tests' seven): the fastest of the algorithms
    NCCL offers for it, simulated, as ``(NCCL name, result)``.

    ``algos``: NCCL names to choose among (default all NCCL offers on these
    GPUs, :func:`treecoll.collectives.sim.nccl_model.nccl_algos`: allreduce ring, tree, and nvls on
    Hopper-or-later NVSwitch systems; allgather / reduce_scatter ring and PAT (simulated as the ring);
    broadcast / reduce ring; alltoall / sendrecv p2p); ``nvls`` is dropped when ``profile``
    names the LL or LL128 protocol (NVLS runs Simple only), and simulated for allreduce only;
    CollNet (SHARP) is not simulated (:func:`treecoll.collectives.sim.nccl_model.nccl_predict` models it).

    ``choose``: ``fastest`` simulates every algorithm (with ``profile="auto"`` every protocol) and
    keeps the fastest; ``tuner`` simulates only what NCCL's tuner picks with ``profile="auto"``
    (:func:`~treecoll.collectives.sim.nccl_model.nccl_predict`'s least predicted time over the
    algorithms and protocols, enqueue.cc ``topoGetAlgoInfo``), as NCCL runs it.
    """
    from .nccl_model import COLLECTIVES

    if collective not in COLLECTIVES:
        raise CollectiveError(f"NCCL collective {collective!r}: expected one of {', '.join(COLLECTIVES)}")
    p = as_placement(placement, ranks, what=f"simulate NCCL {collective}")
    topology, gpus = placed(p, what=f"simulate NCCL {collective}")
    offered = nccl_offered(topology, gpus, collective, profile)
    names = [a for a in (algos or offered) if a in offered]
    if not names:
        raise CollectiveError(
            f"NCCL {collective}: none of {list(algos or ())} is offered here; expected some of {list(offered)}"
        )

    if choose not in ("fastest", "tuner"):
        raise CollectiveError(f"simulate NCCL: choose expected 'fastest' or 'tuner', got {choose!r}")
    prof_of = {a: profile for a in names}
    if choose == "tuner" and profile == "auto" and len(gpus) > 1:
        from .nccl_model import nccl_predict

        pick = min(
            (nccl_predict(p, None, nbytes, algo=a, collective=collective) for a in names), key=lambda r: r["time"]
        )
        names = [pick["algo"] if pick["algo"] != "nvls_tree" else "nvls"]
        if names[0] in ("ring", "tree", "pat"):
            prof_of[names[0]] = NCCL_PROTO_PROFILES[pick["proto"]]

    runs = ((a, simulate_nccl_algorithm(p, a, nbytes, collective=collective, profile=prof_of[a], **kw)) for a in names)
    return min(runs, key=lambda ar: ar[1].time)  # the first of equals


def simulate_nccl_algorithm(
    placement: Placement | Topology,
    algo: str,
    nbytes: int,
    *,
    collective: str = "allreduce",
    ranks: RanksArg = None,
    profile: Profile | str | None = "auto",
    **kw: Any,
) -> SimResult:
    """One of NCCL's algorithms (``ring``, ``tree``, ``nvls``; others by their name) as the simulator
    runs it: :data:`NCCL_ALLREDUCE`'s algorithm and options, NCCL's tree one per NIC rail from
    :data:`NCCL_TREE_RAIL_BYTES`; what :func:`simulate_nccl` chooses among, and what
    ``treecoll simulate --algo ring,tree,nvls`` prints. ``kw`` go to :func:`simulate_algorithm`."""
    from .. import builders

    p = as_placement(placement, ranks, what=f"simulate NCCL {algo}")
    name, opts = NCCL_ALLREDUCE.get(algo, (algo, {}))
    if algo == "tree":
        topology, gpus = placed(p, what=f"simulate NCCL {algo}")
        opts = {**opts, "rails": nbytes >= NCCL_TREE_RAIL_BYTES and builders.rails_possible(topology, gpus)}
    return simulate_algorithm(p, name, nbytes, collective=collective, profile=profile, **opts, **kw)


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
    return dataclasses.replace(
        r, time=t, finish=tuple(max(f - cut, 0.0) for f in r.finish), algbw=alg, busbw=bus, stats=stats
    )
