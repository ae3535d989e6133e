"""treecoll's own schedules as treecoll's executor runs them: the ``executor`` prediction mode.

:func:`treecoll.collectives.execute.run_schedule` issues a rank's steps one
after another from Python: each send and each receive is an ``isend`` /
``irecv`` of the backend, posted and later waited on by the one Python thread
of the rank. Every such message costs the rank a serial software time ``o``
(the backend's :class:`~treecoll.collectives.executor_cost.ExecutorCost`), which
NCCL's own kernels do not pay. :class:`ExecutorEngine` is the flow engine
(:class:`~treecoll.collectives.sim.engine.FlowEngine`) with that cost: a rank's
send or receive takes effect ``o`` after the later of the moment it may start
and the end of the rank's previous step (the rank's CPU is busy meanwhile); a
reduce also waits for the CPU and holds it until it ends. Links, latencies and
sharing are the topology's as written (the ``ideal`` profile: the executor adds
no protocol of its own), and messages between a pair of ranks go in order with
a rendezvous, as the backends' point-to-point transfers do.

:func:`predict_schedule` is THE prediction of what ``collectives.allreduce`` /
``reduce`` / ``broadcast`` cost with the planner's schedule (the same plan and
chunks). ``in-kernel`` mode (the same tree run inside the communication library,
NCCL's protocol constants) is :func:`treecoll.collectives.sim.simulator.simulate_algorithm`.

>>> from treecoll import topo
>>> from treecoll.collectives.placement import Placement
>>> r = predict_schedule(Placement(topo.default(), 2), "chain", 8, step_cost=10e-6)
>>> round(r.time * 1e6, 1)    # rank 1 sends while rank 0 posts its receive, then back: 2 x (10 + 0.6 us NVLink)
21.2
"""

from __future__ import annotations

import dataclasses
import heapq
import time as _time
from typing import Any

from treecoll.topo.errors import CollectiveError
from treecoll.topo.gcpause import gc_paused
from treecoll.topo.ranks import RanksArg

from ..placement import Placement, as_placement
from ..schedule import Schedule, Step
from .engine import FlowEngine, Network
from .profiles import get_profile
from .result import (
    EXECUTOR_RUN,
    SimResult,
    check_size,
    engine_stats,
    mem_bw_of,
    placed,
    schedule_result,
)

__all__ = [
    "ExecutorEngine",
    "simulate_executor_schedule",
    "predict_schedule",
    "predict_tree",
    "EXECUTOR_RUN",
]

_ARRIVAL, _ISSUE = 0, 2  # event kind: a send or receive whose software cost has elapsed takes effect


class ExecutorEngine(FlowEngine):
    """:class:`FlowEngine` whose ranks issue steps from one thread, paying ``step_cost`` seconds
    per send and per receive (module docstring)."""

    issues_from_cpu = True

    def __init__(self, *args: Any, step_cost: float = 0.0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.step_cost = float(step_cost)
        self.cpu_free = [0.0] * self.nranks

    def _issue(self, r: int, i: int, s: Step, t: float, start) -> None:
        at = max(t, self.cpu_free[r]) + self.step_cost
        self.cpu_free[r] = at
        if at <= t:
            start(self, r, i, s, t)
        else:
            self._push(at, _ISSUE, r, i)

    def _start_send(self, r: int, i: int, s: Step, t: float) -> None:
        self._issue(r, i, s, t, FlowEngine._start_send)

    def _post_recv(self, r: int, i: int, s: Step, t: float) -> None:
        self._issue(r, i, s, t, FlowEngine._post_recv)

    def _start_reduce(self, r: int, i: int, s: Step, t: float) -> None:
        begin = max(t, self.cpu_free[r], self.compute_free[r])
        if begin > t:  # the CPU is still posting earlier steps: start then
            self.compute_free[r] = begin
        super()._start_reduce(r, i, s, t)
        self.cpu_free[r] = max(self.cpu_free[r], self.compute_free[r])

    def _pop_due_events(self) -> None:
        """:meth:`FlowEngine._pop_due_events` with the deferred sends and receives (kind ``_ISSUE``)."""
        heap, now = self.heap, self.now
        until = now + (now * 1e-9 + 1e-15)
        pop, steps, x_info, advance, ready = heapq.heappop, self.steps, self.x_info, self._advance, self.ready
        send, post = FlowEngine._start_send, FlowEngine._post_recv
        while heap and heap[0][0] <= until:
            _, _, kind, a, b = pop(heap)
            if kind == _ISSUE:
                s = steps[a][b]
                (send if s.kind == "send" else post)(self, a, b, s, now)
                if ready[a]:
                    advance(a, now)
            elif kind == _ARRIVAL:
                self._deliver(x_info[a][2], now)
            else:
                self._complete(a, b, now)
                if ready[a]:
                    advance(a, now)


@gc_paused()
def simulate_executor_schedule(
    placement: Placement | Any,
    schedule: Schedule,
    nbytes: int,
    *,
    step_cost: float,
    dtype: str = "float32",
    ranks: RanksArg = None,
    top: int = 10,
) -> SimResult:
    """Simulate ``schedule`` on ``nbytes`` as treecoll's executor runs it, each send and receive costing
    its rank ``step_cost`` seconds (module docstring)."""
    check_size(nbytes, dtype)
    prof = get_profile("ideal")
    topology, gpus = placed(placement, ranks, nranks=schedule.nranks)
    net = Network(topology, prof)
    mem = mem_bw_of(topology, gpus)
    t0 = _time.perf_counter()
    raw = ExecutorEngine(
        net, schedule, schedule.chunk_bytes(nbytes), gpus, mem, step_cost=step_cost, **EXECUTOR_RUN
    ).run()
    stats = {**engine_stats("events (executor)", raw, _time.perf_counter() - t0), "step_cost_s": step_cost}
    return schedule_result(net, schedule, nbytes, raw, prof, dtype, stats, top)


def predict_schedule(
    placement: Placement | Any,
    tree: Any,
    nbytes: int,
    *,
    collective: str = "allreduce",
    ranks: RanksArg = None,
    algo: str = "tree",
    root: int | None = None,
    nchunks: int | None = None,
    backend: str | None = None,
    step_cost: float | None = None,
    dtype: str = "float32",
    top: int = 10,
) -> SimResult:
    """What treecoll's executor takes for ``collective`` of ``nbytes`` with ``tree`` (a builder name,
    Tree, MultiTree or tree file, as the collectives take it) and ``algo`` (``tree``, ``ring``,
    ``rsag``, ``direct``): the planner's schedule (its plan and chunks), simulated with
    :class:`ExecutorEngine`. ``step_cost``: seconds per message (default: the ``backend``'s,
    :func:`treecoll.collectives.executor_cost.executor_cost`). ``stats``: ``chunks`` per tree, ``mode``
    ``executor``, ``backend`` and ``step_cost_s``.
    """
    from ..executor_cost import executor_cost
    from .simulator import executor_schedule

    check_size(nbytes, dtype)
    p = as_placement(placement, ranks, what="executor prediction")
    cost = executor_cost(p, backend)
    o = cost.step_s if step_cost is None else float(step_cost)
    sched, per = executor_schedule(
        p, tree, nbytes, collective=collective, algo=algo, root=root, nchunks=nchunks, dtype=dtype
    )
    r = simulate_executor_schedule(p, sched, nbytes, step_cost=o, dtype=dtype, top=top)
    return dataclasses.replace(
        r, profile=f"executor ({cost.backend})", stats=dict(r.stats, chunks=per, mode="executor", backend=cost.backend)
    )


def predict_tree(
    placement: Placement | Any,
    plan: Any,
    nbytes: int,
    *,
    collective: str = "allreduce",
    mode: str = "executor",
    backend: str | None = None,
    ranks: RanksArg = None,
    root: int | None = None,
    dtype: str = "float32",
    top: int = 10,
    profile: Any = "auto",
    nchunks: int | None = None,
) -> SimResult:
    """THE prediction of a treecoll tree (a Tree, MultiTree or builder name) that every command
    prints: ``mode`` ``executor`` (:func:`predict_schedule`: as ``collectives.allreduce`` runs it)
    or ``in-kernel`` (the same tree inside the communication library, NCCL's protocols and
    pipelining: :func:`treecoll.collectives.sim.simulator.simulate_algorithm`, with its ``profile``,
    default the fastest NCCL protocol, and ``nchunks``, default NCCL's pipeline steps). ``root``: where
    a reduce ends or a broadcast starts (default: the tree's root). ``stats["mode"]`` says which."""

    from ..executor_cost import MODES

    if mode not in MODES:
        raise CollectiveError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    p = as_placement(placement, ranks, what="prediction")
    if mode == "executor":
        if profile not in (None, "auto") or nchunks is not None:
            raise CollectiveError(
                "prediction: profile and nchunks apply to mode 'in-kernel' (the executor runs the "
                "planner's chunks over the backend's own transport); drop them or pass mode='in-kernel'"
            )
        return predict_schedule(
            p, plan, nbytes, collective=collective, backend=backend, root=root, dtype=dtype, top=top
        )
    from ..tree import as_multi
    from .simulator import simulate_algorithm

    if root is None and collective != "allreduce" and not isinstance(plan, str):
        root = as_multi(plan).roots[0]
    r = simulate_algorithm(
        p,
        plan,
        nbytes,
        collective=collective,
        dtype=dtype,
        top=top,
        root=0 if root is None else root,
        profile=profile or "auto",
        nchunks=nchunks,
    )
    return dataclasses.replace(r, stats=dict(r.stats, mode="in-kernel", backend="nccl"))
