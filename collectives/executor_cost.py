"""What treecoll's executor and the backends' own collectives cost in software, per backend and process count.

treecoll's executor issues every send and receive from Python, one after another on each rank: the
``executor`` prediction mode (:data:`MODES`) charges every message a serial cost
on top of the links' latency and bandwidth, and a backend's own allreduce and all-gather a cost per ring
step, and each kind of call a cost of its own when the ranks come to it apart. :class:`ExecutorCost` holds
these for one backend (:data:`EXECUTOR_COSTS`: ``gloo`` and ``nccl``), :func:`executor_cost` gives the one a
placement's collectives are planned for, at its process count: what the planner's cost model
(:class:`treecoll.collectives.cost.CostModel`), the executor simulation
(:mod:`treecoll.collectives.sim.executor`) and the decode-step model (:mod:`treecoll.attention.cost`) all
charge.

Units: seconds (per message, per ring step, per call); a row of :data:`GLOO_BY_NRANKS` starts with its
process count.

Where the numbers come from:

* ``gloo``: fitted over gloo (torch.distributed on 127.0.0.1) on this project's machine, on each process
  count alone (:data:`GLOO_BY_NRANKS`, what the model uses: the costs at a count include the machine's
  sharing of its cores among that many processes) and over every count at once (:data:`GLOO_STEP_S`,
  :data:`GLOO_NATIVE_STEP_S`).
* ``nccl``: the executor's own Python cost per message (:data:`PYTHON_STEP_S`, fitted with the in-process
  transport of :mod:`treecoll.collectives.local`) plus NCCL's published small-message point-to-point time
  (:data:`NCCL_P2P_S`); NCCL's own allreduce has a model of its own
  (:func:`treecoll.collectives.sim.nccl_model.nccl_predict`).

To refit them on the machine you predict for (a quiet one), run the command below and paste what it prints
for ``GLOO_STEP_S``, ``GLOO_NATIVE_STEP_S``, ``PYTHON_STEP_S`` and ``GLOO_BY_NRANKS`` here (its
``GLOO_LOCAL_BY_NRANKS`` belongs to :mod:`treecoll.attention.cost`)::

    python -m treecoll.tools.fit_executor_cost --procs 2 4 6 --reps 30

>>> from treecoll.collectives.placement import Placement
>>> gloo = executor_cost(Placement(ranks=4))
>>> gloo.backend, gloo.step_s == GLOO_BY_NRANKS[1][1], gloo.native_step_s == GLOO_BY_NRANKS[1][2]
('gloo', True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from treecoll.topo.errors import TreeError

from .placement import Placement

__all__ = [
    "ExecutorCost",
    "EXECUTOR_COSTS",
    "executor_cost",
    "backend_of",
    "row_for_nranks",
    "GLOO_STEP_S",
    "GLOO_NATIVE_STEP_S",
    "PYTHON_STEP_S",
    "NCCL_P2P_S",
    "GLOO_BY_NRANKS",
    "MODES",
]

#: how a treecoll tree is predicted (:func:`treecoll.collectives.sim.executor.predict_tree`, the
#: commands' ``--mode``): ``executor`` (as :mod:`treecoll.collectives.execute` runs it: one isend/irecv
#: from Python per message, :class:`ExecutorCost` each; the default, and what the planner's cost model
#: prices) or ``in-kernel`` (the same tree run inside the communication library: NCCL's protocols and
#: pipelining, simulated)
MODES = ("executor", "in-kernel")


@dataclass(frozen=True)
class ExecutorCost:
    """What one message of treecoll's executor costs on a backend, and the backend's own collectives.

    ``step_s``: seconds a rank spends per send or receive it issues (post, wait, the executor's
    bookkeeping), serially, on top of the links' latency and bandwidth. ``native_step_s``:
    seconds per step of the backend's own ring allreduce (``torch.distributed.all_reduce``),
    on top of the links; None where the backend's allreduce has its own model (NCCL:
    :func:`treecoll.collectives.sim.nccl_model.nccl_predict`). ``gather_step_s``: the same per
    step of the backend's own all-gather (None: ``native_step_s``; gloo's all-gather is its own
    algorithm, not the allreduce's ring steps). ``source``: where the numbers come from.

    ``call_s``, ``native_call_s``, ``gather_call_s``: seconds one call of the executor, of the
    backend's allreduce and of its all-gather costs once on top of its steps when the ranks come
    to it apart, as a decode step's combine does (the ranks wait asleep for the last one, and
    every step of a ring then waits for ranks to be woken): each fitted on calls of its own kind,
    charged where methods differ in their calls (the decode combines, :mod:`treecoll.attention.cost`),
    not in one call's schedule. None: ``call_s``.

    ``by_nranks``: the same fitted on each process count alone, rows ``(P, step_s, native_step_s,
    call_s[, native_call_s, gather_step_s, gather_call_s])`` in increasing ``P`` (empty: none; a
    row of four leaves the last three to their defaults); :meth:`for_nranks` picks one. The costs
    at ``P`` include the machine's sharing of its cores among ``P`` processes (fitted there).

    >>> c = ExecutorCost("x", 1.0, 2.0, "by hand", by_nranks=((2, 3.0, 1.0, 0.5), (4, 1.0, 5.0, 1.5)))
    >>> [(c.for_nranks(n).step_s, c.for_nranks(n).native_step_s, c.for_nranks(n).call_s) for n in (1, 3, 4, 8)]
    [(3.0, 1.0, 0.5), (2.0, 3.0, 1.0), (1.0, 5.0, 1.5), (1.0, 5.0, 1.5)]
    >>> c = ExecutorCost("x", 1.0, 2.0, "by hand", by_nranks=((2, 3.0, 1.0, 0.5, 0.7, 4.0, 0.9),))
    >>> k = c.for_nranks(2)
    >>> k.native_call_s, k.gather_step_s, k.gather_call_s, ExecutorCost("y", 1.0, 2.0, "").gather_call_s
    (0.7, 4.0, 0.9, 0.0)
    """

    backend: str
    step_s: float
    native_step_s: float | None
    source: str
    by_nranks: tuple[tuple[float, ...], ...] = ()
    call_s: float = 0.0
    native_call_s: float | None = None
    gather_step_s: float | None = None
    gather_call_s: float | None = None

    def __post_init__(self) -> None:
        """The defaults named in the class docstring filled in (a frozen dataclass: set once)."""
        row = (
            0,
            self.step_s,
            self.native_step_s,
            self.call_s,
            self.native_call_s,
            self.gather_step_s,
            self.gather_call_s,
        )
        _, _, _, _, native_call, gather, gather_call = _full_row(row)
        object.__setattr__(self, "native_call_s", native_call)
        object.__setattr__(self, "gather_step_s", gather)
        object.__setattr__(self, "gather_call_s", gather_call)

    def for_nranks(self, nranks: int) -> ExecutorCost:
        """The costs at ``nranks`` processes from :attr:`by_nranks`: a fitted count's own; between two
        fitted counts, linear in the count between theirs; below the smallest or above the largest
        fitted count, that count's (held, not extrapolated: how many cores the processes share there
        is not known). ``self`` without per-count rows. Once processes outnumber cores the costs
        change in kind (each step of the backend's ring needs every rank running at once, one of the
        executor's messages only its two ends), so one fit over several counts can order them wrongly
        at every count."""
        if not self.by_nranks:
            return self
        step, native, call, native_call, gather, gather_call = row_for_nranks(
            [_full_row(r) for r in self.by_nranks], nranks
        )
        return replace(
            self,
            step_s=step,
            native_step_s=native,
            call_s=call,
            native_call_s=native_call,
            gather_step_s=gather,
            gather_call_s=gather_call,
            by_nranks=(),
        )


def row_for_nranks(rows: list[tuple[float, ...]], nranks: int) -> tuple[float, ...]:
    """The values (all but the first column) of per-process-count rows ``(P, v1, v2, ...)`` at ``nranks``:
    a fitted count's own; between two fitted counts, linear in the count between theirs; below the smallest
    or above the largest, that count's (held, not extrapolated). ``rows``: non-empty, any order.

    >>> row_for_nranks([(2, 1.0, 10.0), (6, 3.0, 30.0)], 3), row_for_nranks([(2, 1.0, 10.0)], 8)
    ((1.5, 15.0), (1.0, 10.0))
    """
    lo = max((r for r in rows if r[0] <= nranks), default=min(rows, key=lambda r: r[0]), key=lambda r: r[0])
    hi = min((r for r in rows if r[0] >= nranks), default=max(rows, key=lambda r: r[0]), key=lambda r: r[0])
    w = (nranks - lo[0]) / (hi[0] - lo[0]) if hi[0] != lo[0] else 0.0
    return tuple((1 - w) * a + w * b for a, b in zip(lo[1:], hi[1:]))


def _full_row(row: tuple[float | None, ...]) -> tuple[float | None, ...]:
    """A :attr:`ExecutorCost.by_nranks` row with its optional columns (absent or None) filled in by the
    class docstring's defaults: ``(P, step, native step, call, native call, gather step, gather call)``."""
    p, step, native, call, native_call, gather, gather_call = (*row, None, None, None)[:7]
    native_call = call if native_call is None else native_call
    gather = native if gather is None else gather
    gather_call = native_call if gather_call is None else gather_call
    return (p, step, native, call, native_call, gather, gather_call)


#: Fitted on this project's 2-core machine (AMD EPYC, idle) over gloo (torch.distributed, 127.0.0.1,
#: 2, 4 and 6 processes): ``python -m treecoll.tools.fit_executor_cost --procs 2 4 6 --reps 30``
#: (latency-bound allreduces of 8 B .. 16.5 kB, timed back to back in rounds; each time divided by the
#: messages in a row of its schedule, as :mod:`treecoll.collectives.sim.executor` counts them); the
#: median of three runs on 2026-11-26 (GLOO_STEP_S 135.3 .. 139.0 us, GLOO_NATIVE_STEP_S 771.5 .. 801.2 us;
#: PYTHON_STEP_S 54.1 .. 57.0 us in these, 56.3 .. 81.5 us in earlier runs: kept at 57.4). One fit over
#: every count; the per-count rows below are what the model uses. Re-run it on the machine you predict for.
GLOO_STEP_S = 135.7e-6
GLOO_NATIVE_STEP_S = 782.8e-6
#: The executor's own Python cost per message, without a network library (the same command,
#: with the in-process transport of :mod:`treecoll.collectives.local`) ...
PYTHON_STEP_S = 57.4e-6
#: ... plus one NCCL point-to-point operation: nccl-tests' sendrecv reports about 3 µs for
#: small messages between two H100 over NVLink (https://github.com/NVIDIA/nccl/issues/1487);
#: the links' own latency (NVLink, NIC) comes from the topology.
NCCL_P2P_S = 3e-6
#: ``(P, step, native step, call, native call, gather step, gather call)`` (:attr:`ExecutorCost.by_nranks`)
#: fitted on each process count alone: ``python -m treecoll.tools.fit_executor_cost --procs 2 4 6 --reps 30``
#: (its ``GLOO_BY_NRANKS``), the median of three runs on the idle machine, 2026-11-26; the ranges, in us:
#: 2 processes 118.1 .. 134.5, 107.4 .. 152.5, 118.3 .. 234.4, 71.3 .. 133.0, 176.6 .. 242.1, 56.6 .. 148.8;
#: 4 processes 127.8 .. 133.9, 446.1 .. 535.2, 666.5 .. 737.3, 1890.8 .. 2468.7, 579.0 .. 803.2,
#: 1845.0 .. 1985.0; 6 processes 137.8 .. 141.2, 917.8 .. 932.5, 1846.4 .. 2252.5, 4775.5 .. 5320.5,
#: 1049.4 .. 1153.2, 2273.3 .. 3681.0. With a core per process gloo's own ring step is about the executor's
#: message; with two or three processes per core each step of gloo's rings waits for every rank to run
#: (3.8x and 6.6x the executor's message), and a call of gloo's allreduce or all-gather that the ranks reach
#: apart costs milliseconds (the calls grow with the machine's load too: re-fit on the machine you predict for).
GLOO_BY_NRANKS = (
    (2, 119.4e-6, 136.3e-6, 132.1e-6, 112.1e-6, 200.9e-6, 128.1e-6),
    (4, 132.3e-6, 501.1e-6, 725.5e-6, 2186.8e-6, 631.3e-6, 1943.5e-6),
    (6, 139.0e-6, 924.0e-6, 2041.7e-6, 5046.7e-6, 1075.1e-6, 3537.3e-6),
)
EXECUTOR_COSTS = {
    "gloo": ExecutorCost(
        "gloo",
        GLOO_STEP_S,
        GLOO_NATIVE_STEP_S,
        "fitted: python -m treecoll.tools.fit_executor_cost --procs 2 4 6 --reps 30",
        GLOO_BY_NRANKS,
    ),
    "nccl": ExecutorCost(
        "nccl",
        PYTHON_STEP_S + NCCL_P2P_S,
        None,
        "the executor's Python cost per message (fitted with the in-process transport) + "
        "NCCL sendrecv small-message time ~3 us (https://github.com/NVIDIA/nccl/issues/1487)",
    ),
}


def backend_of(placement: Placement) -> str:
    """The backend a placement's collectives are planned for: ``gloo`` for CPU process slots or
    no topology, ``nccl`` for GPUs (from the topology alone, so that plans cached per placement
    stay valid; the executor knows its group's backend when it runs)."""
    if placement.topology is None:
        return "gloo"
    from treecoll.topo.discover import CPU_SLOT_MODEL

    nodes = placement.topology.graph._node  # networkx's node dict: its view costs more per GPU than the work
    return "gloo" if any(nodes[g].get("model") == CPU_SLOT_MODEL for g in placement.gpus) else "nccl"


def executor_cost(placement: Placement, backend: str | None = None) -> ExecutorCost:
    """The :class:`ExecutorCost` of ``backend`` (None: :func:`backend_of` the placement) at the
    placement's process count (:meth:`ExecutorCost.for_nranks`): what the planner, the executor
    simulation and the decode model all charge.

    >>> from treecoll.collectives.placement import Placement
    >>> c = executor_cost(Placement(ranks=2))
    >>> c.backend, c.step_s == GLOO_BY_NRANKS[0][1], c.native_step_s == GLOO_BY_NRANKS[0][2]
    ('gloo', True, True)
    """
    name = backend or backend_of(placement)
    if name not in EXECUTOR_COSTS:
        raise TreeError(f"executor cost: backend expected one of {sorted(EXECUTOR_COSTS)}, got {name!r}")
    return EXECUTOR_COSTS[name].for_nranks(placement.nranks)
