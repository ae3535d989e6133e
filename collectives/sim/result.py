"""What every simulation shares: its inputs checked, its rank -> GPU map, and its result.

:func:`check_size` and :func:`placed` check what a simulation is given;
:func:`make_result` turns what an engine measured into a :class:`SimResult`,
with algbw and busbw as nccl-tests defines them (doc/PERFORMANCE.md of
https://github.com/NVIDIA/nccl-tests): ``algbw = S / t``, ``busbw = algbw ×``
:func:`bus_factor`.

>>> bandwidths("allreduce", 10**9, 8, 0.5)    # 2 GB/s algbw, x 2(8-1)/8 busbw
(2.0, 3.5)
>>> check_size(6, "float32")
Traceback (most recent call last):
  ...
treecoll.topo.errors.CollectiveError: message size 6 B: expected a multiple of the float32 element size 4 B
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from treecoll.topo import Topology
from treecoll.topo.errors import CollectiveError, PlacementError
from treecoll.topo.ranks import RanksArg

from ..placement import Placement, as_placement
from .engine import Network
from .profiles import Profile

__all__ = [
    "SimResult",
    "DTYPE_SIZES",
    "EXECUTOR_RUN",
    "bus_factor",
    "bandwidths",
    "placed",
    "mem_bw_of",
    "engine_stats",
    "schedule_result",
    "check_size",
    "make_result",
]

#: bytes per element of the dtypes the simulator accepts
DTYPE_SIZES = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8": 1,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
}


#: the collectives nccl-tests measures, by their busbw/algbw factor (nccl-tests src/*.cu ``*GetBw``)
PER_RANK_COLLECTIVES = ("reduce_scatter", "allgather", "alltoall")
UNIT_COLLECTIVES = ("broadcast", "reduce", "sendrecv")


def bus_factor(collective: str, nranks: int) -> float:
    """nccl-tests' busbw/algbw factor: 2(n−1)/n allreduce, (n−1)/n reduce_scatter, allgather and
    alltoall, 1 broadcast, reduce and sendrecv (nccl-tests doc/PERFORMANCE.md, src/*.cu ``*GetBw``).

    >>> bus_factor("allreduce", 8), bus_factor("alltoall", 8), bus_factor("sendrecv", 8)
    (1.75, 0.875, 1.0)
    """
    n = nranks
    if collective == "allreduce":
        return 2.0 * (n - 1) / n if n > 0 else 0.0
    if collective in PER_RANK_COLLECTIVES:
        return (n - 1) / n if n > 0 else 0.0
    if collective in UNIT_COLLECTIVES:
        return 1.0
    raise CollectiveError(
        f"collective {collective!r}: expected one of allreduce, {', '.join(PER_RANK_COLLECTIVES + UNIT_COLLECTIVES)}"
    )


def bandwidths(collective: str, nbytes: int, nranks: int, seconds: float) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (1e9 B/s) for a run of ``seconds``; ``nbytes`` as nccl-tests counts it."""
    if seconds <= 0:
        return float("inf"), float("inf")
    alg = nbytes / seconds / 1e9
    return alg, alg * bus_factor(collective, nranks)


@dataclass(frozen=True)
class SimResult:
    """One simulated run. Times in seconds, sizes in bytes, bandwidths in GB/s.

    ``link_bytes``: ``{"a->b": bytes}`` for links that carried data;
    ``kind_bytes``: bytes summed per link kind; ``busiest``: the top links as
    ``{link, kind, bytes, busy}`` dicts (``busy`` = bytes / (capacity × time));
    ``peak_scratch``: peak extra buffer bytes per rank (received copies alive
    before they are reduced); ``stats``: engine counters and wall time.
    """

    collective: str
    algorithm: str
    nranks: int
    nbytes: int
    time: float
    finish: tuple[float, ...]
    algbw: float
    busbw: float
    link_bytes: dict = field(repr=False)
    kind_bytes: dict = field(default_factory=dict)
    busiest: tuple = ()
    peak_scratch: tuple = field(default=(), repr=False)
    profile: str = "ideal"
    dtype: str = "float32"
    stats: dict = field(default_factory=dict)

    def as_dict(self, links: bool = False) -> dict[str, Any]:
        """Plain data (``links=True`` adds every link's bytes)."""
        d = {
            "collective": self.collective,
            "algorithm": self.algorithm,
            "nranks": self.nranks,
            "nbytes": self.nbytes,
            "dtype": self.dtype,
            "profile": self.profile,
            "time_s": self.time,
            "time_us": self.time * 1e6,
            "algbw_GBps": self.algbw,
            "busbw_GBps": self.busbw,
            "finish_max_s": max(self.finish, default=0.0),
            "kind_bytes": dict(self.kind_bytes),
            "busiest": [dict(b) for b in self.busiest],
            "peak_scratch_max_bytes": max(self.peak_scratch, default=0.0),
            "stats": dict(self.stats),
        }
        if links:
            d["link_bytes"] = dict(self.link_bytes)
            d["finish_s"] = list(self.finish)
            d["peak_scratch_bytes"] = list(self.peak_scratch)
        return d


#: the ranks a simulation is given: GPU ids (rank r on the r-th), a count of the first ranks, or None for all


def placed(
    placement: Placement | Topology, ranks: RanksArg = None, *, nranks: int | None = None, what: str = "simulate"
) -> tuple[Topology, tuple[str, ...]]:
    """The topology and the GPU of every rank a simulation runs on: ``placement`` (a
    :class:`~treecoll.collectives.placement.Placement`, or a Topology with ``ranks``)
    through :func:`~treecoll.collectives.placement.as_placement`; a simulation needs a topology."""
    p = as_placement(placement, ranks, nranks=nranks, what=what)
    if p.topology is None:
        raise PlacementError(
            f"{what}: expected a placement with a topology (the simulator moves bytes over its links), got one without"
        )
    return p.topology, p.gpus


#: how treecoll's executor moves its point-to-point messages on the backends (gloo: one TCP
#: connection per pair of ranks): in order per pair of ranks, each once its receive is posted
#: (:class:`~treecoll.collectives.sim.engine.FlowEngine`'s ``ordered_pairs`` and ``rendezvous``)
EXECUTOR_RUN = {"ordered_pairs": True, "rendezvous": True}


def check_size(nbytes: int, dtype: str) -> None:
    """A message of ``nbytes`` bytes of ``dtype``: a known dtype and a whole, non-negative number of elements."""
    if dtype not in DTYPE_SIZES:
        raise CollectiveError(f"dtype {dtype!r}: expected one of {sorted(DTYPE_SIZES)}")
    if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise CollectiveError(f"message size: expected a non-negative integer number of bytes, got {nbytes!r}")
    if nbytes % DTYPE_SIZES[dtype]:
        raise CollectiveError(
            f"message size {nbytes} B: expected a multiple of the {dtype} element size {DTYPE_SIZES[dtype]} B"
        )


def make_result(
    net: Network,
    collective: str,
    algorithm: str,
    nbytes: int,
    count_bytes: int,
    P: int,
    makespan: float,
    finish: Sequence[float],
    link_bytes: np.ndarray,
    peaks: Sequence[float],
    profile: Profile,
    dtype: str,
    stats: dict[str, Any],
    top: int,
) -> SimResult:
    """The :class:`SimResult` of a run that took ``makespan`` seconds (plus the profile's base latency):
    per-link bytes by name and by kind, the ``top`` busiest links, bandwidths as nccl-tests counts them."""
    t = makespan + profile.base_lat
    alg, bus = bandwidths(collective, count_bytes, P, t)
    lb = {}
    kinds: dict[str, int] = {}
    nz = np.nonzero(link_bytes > 0)[0]
    for i in nz.tolist():
        a, b = net.ends[i]
        v = float(link_bytes[i])
        lb[f"{a}->{b}"] = int(round(v))
        kinds[net.kinds[i]] = kinds.get(net.kinds[i], 0) + int(round(v))
    busiest = []
    if len(nz):
        cap = net.cap[nz]
        order = nz[np.lexsort((nz, -link_bytes[nz] / cap))][:top]
        for i in order.tolist():
            a, b = net.ends[i]
            busiest.append(
                {
                    "link": f"{a}->{b}",
                    "kind": net.kinds[i],
                    "bytes": int(round(float(link_bytes[i]))),
                    "busy": float(link_bytes[i] / net.cap[i] / t) if t > 0 else 0.0,
                }
            )
    return SimResult(
        collective,
        algorithm,
        P,
        nbytes,
        t,
        tuple(f + profile.base_lat for f in finish),
        alg,
        bus,
        lb,
        dict(sorted(kinds.items())),
        tuple(busiest),
        tuple(peaks),
        profile.name,
        dtype,
        stats,
    )


def mem_bw_of(topology: Topology, gpus: Sequence[str]) -> list[float]:
    """Each GPU's memory bandwidth in B/s (its ``mem_bw`` GB/s; 0: reductions are free)."""
    return [float(topology.node(g).get("mem_bw", 0.0) or 0.0) * 1e9 for g in gpus]


def engine_stats(engine: str, raw: Any, wall_s: float) -> dict[str, Any]:
    """The ``stats`` of an event engine's run ``raw`` that took ``wall_s`` seconds of wall time:
    the engine's name, its loop, transfers, subflows and rate updates (``raw.recomputes``)."""
    return {
        "engine": engine,
        "loop": raw.loop,
        "transfers": raw.transfers,
        "subflows": raw.subflows,
        "rate_updates": raw.recomputes,
        "wall_s": wall_s,
    }


def schedule_result(
    net: Network,
    schedule: Any,
    nbytes: int,
    raw: Any,
    profile: Profile,
    dtype: str,
    stats: dict[str, Any],
    top: int,
) -> SimResult:
    """:func:`make_result` of an engine's run ``raw`` of ``schedule`` (a
    :class:`~treecoll.collectives.schedule.Schedule`) on ``nbytes``."""
    return make_result(
        net,
        schedule.collective,
        schedule.name or schedule.collective,
        nbytes,
        nbytes,
        schedule.nranks,
        raw.makespan,
        raw.finish,
        raw.link_bytes,
        raw.peak_scratch,
        profile,
        dtype,
        stats,
        top,
    )
