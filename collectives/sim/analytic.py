"""The analytic engine: allreduce times on clusters of identical hosts too large for the flow engine.

The flow engine (:mod:`treecoll.collectives.sim.engine`) moves every chunk of every rank; its cost
grows with ranks x chunks. On a cluster of identical hosts (the same GPUs per host, every
group of hosts under the same leaf switches loading the network alike, as on a fat tree)
most of that work repeats: this module answers from a sample of a few hosts and a closed
form in the number of hosts ``H``, in time independent of ``H`` beyond reading the host list.

* ``ring`` (NCCL's ring, the lockstep model of
  :func:`~treecoll.collectives.sim.simulator.simulate_ring`): the step's drain time is the
  max-min allocation of the ring's transfers on a sample, the first hosts in whole leaf groups
  (hosts under the same leaf switches), at most :data:`RING_SAMPLE_HOSTS`; the latency is the
  chain of ``2(P-1)`` hops of the full ring, counted per hop class: the intra-host hops of the
  sample, the inter-host hops between hosts under the same leaf switches (the sample's) and
  those between hosts under different leaves (a route into the first host of another leaf
  group). Exact up to :data:`RING_SAMPLE_HOSTS` hosts; beyond, exact when every leaf group
  loads the spines as the sample's do (on the shipped 1024-host fat tree a 256-host sample
  gives the lockstep model's time to 1e-13).
* trees (``two_level``, ``tree`` = NCCL's tree as the flow engine runs it, a chain in each host under
  a double binary tree over hosts, one per NIC rail from 4 MiB:
  :func:`~treecoll.collectives.sim.simulator.simulate_nccl_algorithm`; any builder whose tree over
  hosts is binary): a pipelined tree allreduce takes ``T = a + b * d`` for a tree over hosts of depth
  ``d = ceil(log2 H)``: the bytes through the bottleneck and the intra-host part do not depend
  on ``H``, each level adds one hop's latency and one chunk's pipeline fill up and down. ``a``
  and ``b`` come from flow simulations
  (:func:`~treecoll.collectives.sim.simulator.simulate_nccl_algorithm` for ``tree``,
  :func:`~treecoll.collectives.sim.simulator.simulate_algorithm` otherwise: the same chunking and
  protocol choice) on the first 4 and 8 hosts (on 16 and 64 DGX H100 of the shipped rail-optimized
  fat tree, within 4% and 14% of the flow engine for both trees at 1 MiB and 64 MiB). ``auto`` is
  answered as the faster of ``two_level`` and ``tree`` (the tree search itself needs the whole cluster).

Results are :class:`~treecoll.collectives.sim.result.SimResult` with ``stats["engine"] ==
"analytic"`` and no per-link bytes. Every answer holds the assumptions above; a cluster whose
hosts differ in GPU count is refused.

>>> from treecoll import topo
>>> t = topo.resolve("dgx-h100-x16")
>>> r = analytic_allreduce(t, "ring", 1 << 30, profile="nccl-simple")
>>> from treecoll.collectives.sim.simulator import simulate_ring
>>> abs(r.time / simulate_ring(t, 1 << 30, profile="nccl-simple").time - 1) < 1e-9
True
>>> r.stats["engine"]
'analytic'
"""

from __future__ import annotations

import dataclasses
import math
import time as _time
from collections.abc import Sequence

import numpy as np
from treecoll.topo import Topology
from treecoll.topo.errors import CollectiveError
from treecoll.topo.ranks import RanksArg

from ..placement import Placement, as_placement
from .engine import Network
from .profiles import Profile
from .result import SimResult, bandwidths, check_size

__all__ = ["analytic_allreduce", "ANALYTIC_ALGOS", "ANALYTIC_ABOVE_GPUS", "choose_engine", "ENGINES"]

#: algorithms the analytic engine answers (``auto``: the faster of ``two_level`` and ``tree``)
ANALYTIC_ALGOS = ("ring", "tree", "two_level", "auto")
#: ``--engine auto`` runs the flow engine up to this many GPUs and the analytic engine above
ANALYTIC_ABOVE_GPUS = 16384
#: the engines a simulation can run on
ENGINES = ("auto", "flow", "analytic")
#: most hosts the ring's sample takes (the max-min allocation of its transfers is the step time)
RING_SAMPLE_HOSTS = 256
#: hosts of the two samples the tree model is fitted on
_TREE_SAMPLES = (4, 8)


def choose_engine(engine: str, nranks: int) -> str:
    """``flow`` or ``analytic`` for ``engine`` (``auto``: analytic above :data:`ANALYTIC_ABOVE_GPUS` ranks).

    >>> choose_engine("auto", 128), choose_engine("auto", 100_000), choose_engine("flow", 100_000)
    ('flow', 'analytic', 'flow')
    """
    if engine not in ENGINES:
        raise CollectiveError(f"engine {engine!r}: expected one of {list(ENGINES)}")
    if engine == "auto":
        return "analytic" if nranks > ANALYTIC_ABOVE_GPUS else "flow"
    return engine


def _hosts(topology: Topology, gpus: Sequence[str]) -> list[list[str]]:
    """The ranks' GPUs grouped by host, hosts in rank order; refuses hosts of different GPU counts."""
    nodes = topology.graph.nodes
    by_host: dict = {}
    for g in gpus:
        by_host.setdefault(nodes[g].get("host"), []).append(g)
    hosts = list(by_host.values())
    counts = {len(h) for h in hosts}
    if len(counts) > 1:
        raise CollectiveError(
            f"analytic engine: expected the same number of GPUs on every host, got {sorted(counts)}; use --engine flow"
        )
    return hosts


def _sample_hosts(topology: Topology, hosts: list[list[str]]) -> int:
    """How many of the first hosts the ring's sample takes: whole leaf groups (hosts plugged into the same leaf
    switches) up to :data:`RING_SAMPLE_HOSTS` hosts (at least one group; every host when they fit)."""
    if len(hosts) <= RING_SAMPLE_HOSTS:
        return len(hosts)
    nodes = topology.graph.nodes
    leaves = [topology.leaves_of(nodes[h[0]]["host"]) for h in hosts[: RING_SAMPLE_HOSTS + 1]]
    ends = [k for k in range(1, len(leaves)) if leaves[k] != leaves[k - 1]]  # where a group ends
    return max(ends) if ends else RING_SAMPLE_HOSTS


def _ring(
    topology: Topology, hosts: list[list[str]], nbytes: int, prof: Profile, collective: str, dtype: str
) -> SimResult:
    """NCCL's ring on ``H`` identical hosts from the sample of :func:`_sample_hosts` (module docstring)."""
    from .result import mem_bw_of
    from .simulator import _channels_staged, _nccl_ring_run, default_channels, hop_times, nccl_rings

    H, G = len(hosts), len(hosts[0])
    P = H * G
    S = _sample_hosts(topology, hosts)
    sample = [g for h in hosts[:S] for g in h]
    C = default_channels(topology, sample)
    chunk = nbytes / (P * C)
    # what a rank sends is capped by the channels NCCL runs at this size (as simulate_ring)
    send_bw, nccl_channels = (
        _nccl_ring_run(topology, [g for h in hosts for g in h], nbytes, prof) if P > 1 else (math.inf, None)
    )
    net = Network(topology, prof, _channels_staged(prof, chunk * C, C, nccl_channels))
    rs = (P - 1) if collective in ("allreduce", "reduce_scatter") else 0
    ag = (P - 1) if collective in ("allreduce", "allgather") else 0
    makespan = 0.0
    if P > 1:
        hop_rings = nccl_rings(topology, sample, C)  # NCCL's rings over the NICs (PXN hops too)
        n = len(sample)
        lat, drain = hop_times(net, [h for ring in hop_rings for h in ring], [chunk] * (C * n))
        lat = lat.reshape(C, n)
        step = max(float(drain.max()), chunk * C / (send_bw * 1e9))
        memb = min(mem_bw_of(topology, sample))
        red = 3.0 * chunk * C / memb if (prof.reduce_cost and memb > 0) else 0.0
        chain = _ring_chain(topology, hosts, S, hop_rings, lat, net, rs + ag)
        makespan = chain + rs * max(step, red) + ag * step
    t = makespan + prof.base_lat
    alg, bus = bandwidths(collective, nbytes, P, t)
    stats = {"engine": "analytic", "model": f"lockstep ring, {S}-host sample", "channels": C, "steps": rs + ag}
    return SimResult(
        collective,
        "ring",
        P,
        nbytes,
        t,
        (t,) * P,
        alg,
        bus,
        {},
        {},
        (),
        (chunk * C if rs else 0.0,) * P,
        prof.name,
        dtype,
        stats,
    )


def _ring_chain(
    topology: Topology,
    hosts: list[list[str]],
    S: int,
    rings: list[list[tuple]],
    lat: np.ndarray,
    net: Network,
    nsteps: int,
) -> float:
    """Largest summed latency of ``nsteps`` consecutive hops of any channel's full ring of ``H`` hosts.

    ``lat[c]``: the hop latencies of channel ``c``'s ring on the sample of ``S`` hosts (per host its
    intra-host hops, then the hop to the next host). Each host of the full ring has the sample hosts'
    mean intra-host latency; its hop to the next host is the sample's mean when the next host plugs
    into the same leaf switches, else the latency of a route into the first host of another leaf group.
    """
    H, G = len(hosts), len(hosts[0])
    P = H * G
    C, n = lat.shape
    if H == S:
        cycle = lat.sum(axis=1)
    else:
        inter_idx = [k * G + G - 1 for k in range(S)]  # the hop leaving each sample host
        near = lat[:, inter_idx].mean(axis=1)
        per_host = (lat.sum(axis=1) - lat[:, inter_idx].sum(axis=1)) / S
        nodes = topology.graph.nodes
        leaves = [topology.leaves_of(nodes[h[0]]["host"]) for h in hosts]
        far_hops = sum(1 for i in range(H) if leaves[i] != leaves[(i + 1) % H])
        far = near.copy()
        if far_hops:
            j = next(i for i in range(H) if leaves[i] != leaves[0])
            from .simulator import hop_times

            for c, ring in enumerate(rings):  # hops (src, dst, via): the hop leaving the first host
                src, dst, via = ring[G - 1]
                far[c] = hop_times(net, [(src, _entry(hosts[j], dst, hosts[1]), via)], [1.0])[0][0]
        cycle = H * per_host + (H - far_hops) * near + far_hops * far
    full, rem = divmod(nsteps, P)
    if rem == 0:
        return float((full * cycle).max())
    # leave out the cheapest ``P - rem`` consecutive hops (of the sample ring: the full ring has the same kinds)
    skip = min(P - rem, n)
    ext = np.concatenate([lat, lat], axis=1)
    cs = np.concatenate([np.zeros((C, 1)), np.cumsum(ext, axis=1)], axis=1)
    least = (cs[:, skip : skip + n] - cs[:, :n]).min(axis=1) * ((P - rem) / skip)
    return float((full * cycle + cycle - least).max())


def _entry(host: list[str], sample_gpu: str, sample_host: list[str]) -> str:
    """The GPU of ``host`` at the local position of ``sample_gpu`` in ``sample_host``."""
    return host[sample_host.index(sample_gpu)]


def _tree(
    placement: Placement, hosts: list[list[str]], algo: str, nbytes: int, profile, collective: str, dtype: str
) -> SimResult:
    """A pipelined tree allreduce on ``H`` hosts: ``a + b * ceil(log2 H)`` fitted on flow runs of 4 and 8 hosts
    (``tree``: NCCL's tree as :func:`~treecoll.collectives.sim.simulator.simulate_nccl_algorithm` runs it)."""
    from .simulator import simulate_algorithm, simulate_nccl_algorithm

    run = simulate_nccl_algorithm if algo == "tree" else simulate_algorithm

    H = len(hosts)
    P = H * len(hosts[0])
    topology = placement.topology
    if H <= _TREE_SAMPLES[-1]:
        r = run(placement, algo, nbytes, collective=collective, profile=profile, dtype=dtype)
        return dataclasses.replace(r, stats=dict(r.stats, engine="flow"))
    runs = []
    for h in _TREE_SAMPLES:
        sub = Placement(topology, [g for hh in hosts[:h] for g in hh])
        runs.append(run(sub, algo, nbytes, collective=collective, profile=profile, dtype=dtype))
    (h1, h2), (r1, r2) = _TREE_SAMPLES, runs
    d1, d2, d = (math.ceil(math.log2(x)) for x in (h1, h2, H))
    slope = (r2.time - r1.time) / (d2 - d1)
    t = r2.time + slope * (d - d2)
    alg, bus = bandwidths(collective, nbytes, P, t)
    stats = {
        "engine": "analytic",
        "model": f"pipelined tree, a + b*ceil(log2 hosts) from flow runs on {h1} and {h2} hosts",
        "sample_time_s": [r1.time, r2.time],
    }
    return SimResult(collective, algo, P, nbytes, t, (t,) * P, alg, bus, {}, {}, (), (), r2.profile, dtype, stats)


def analytic_allreduce(
    placement: Placement | Topology,
    algo: str,
    nbytes: int,
    *,
    ranks: RanksArg = None,
    profile: Profile | str | None = "auto",
    dtype: str = "float32",
) -> SimResult:
    """``algo``'s allreduce of ``nbytes`` bytes per rank on ``placement`` by the analytic engine (module docstring).

    ``algo``: one of :data:`ANALYTIC_ALGOS`; ``profile`` as
    :func:`~treecoll.collectives.sim.simulator.simulate_algorithm` takes it (``auto``: the fastest
    NCCL protocol). ``stats["wall_s"]``: seconds the answer took.
    """
    from .simulator import _profiles

    check_size(nbytes, dtype)
    if algo not in ANALYTIC_ALGOS:
        raise CollectiveError(
            f"analytic engine: algorithm {algo!r} is not modelled; expected one of "
            f"{list(ANALYTIC_ALGOS)}, or use --engine flow"
        )
    t0 = _time.perf_counter()
    p = as_placement(placement, ranks, what=f"analytic {algo}")
    if p.topology is None:
        raise CollectiveError(f"analytic {algo}: expected a placement with a topology, got one without")
    hosts = _hosts(p.topology, p.gpus)
    if algo == "ring":
        sample = [g for h in hosts[:2] for g in h]
        best = min(
            (
                _ring(p.topology, hosts, nbytes, pr, "allreduce", dtype)
                for pr in _profiles(profile, nbytes, p.topology, sample)
            ),
            key=lambda r: r.time,
        )
    else:
        names = ("two_level", "tree") if algo == "auto" else (algo,)
        best = min((_tree(p, hosts, a, nbytes, profile, "allreduce", dtype) for a in names), key=lambda r: r.time)
        if algo == "auto":
            best = dataclasses.replace(best, stats=dict(best.stats, chosen=best.algorithm))
    return dataclasses.replace(best, stats=dict(best.stats, wall_s=_time.perf_counter() - t0))
