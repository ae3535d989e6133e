"""treecoll's own schedules as treecoll's executor runs them: the ``executor`` prediction mode.

:func:`treecoll.collectives.execute.run_schedule` issues a rank's steps one
after another from Python: each send and each receive is an ``isend`` /
``irecv`` of the backend, posted and later waited on by the one Python thread
of the rank. Every such message costs the rank a serial software time ``o``
(the backend's :class:`~treecoll.collectives.cost.ExecutorCost`), which
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
from collections import deque
from collections.abc import Sequence
from typing import Any

from treecoll.topo.errors import CollectiveError
from treecoll.topo.ranks import RanksArg

from ..placement import Placement, as_placement
from ..schedule import Schedule, Step
from .engine import FlowEngine, Network, gc_paused
from .profiles import get_profile
from .result import DTYPE_SIZES, SimResult, check_size, mem_bw_of, placed, schedule_result

__all__ = [
    "ExecutorEngine",
    "simulate_executor_schedule",
    "estimate_executor_schedule",
    "predict_schedule",
    "predict_tree",
    "EXECUTOR_RUN",
]

#: how the backends move treecoll's point-to-point messages: in order per pair of ranks, each once
#: its receive is posted
EXECUTOR_RUN = {"ordered_pairs": True, "rendezvous": True}
_ARRIVAL, _ISSUE = 0, 2  # event kind: a send or receive whose software cost has elapsed takes effect


class ExecutorEngine(FlowEngine):
    """:class:`FlowEngine` whose ranks issue steps from one thread, paying ``step_cost`` seconds
    per send and per receive (module docstring)."""

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
        tol_t = now * 1e-9 + 1e-15
        while heap and heap[0][0] <= now + tol_t:
            _, _, kind, a, b = heapq.heappop(heap)
            if kind == _ISSUE:
                s = self.steps[a][b]
                (FlowEngine._start_send if s.kind == "send" else FlowEngine._post_recv)(self, a, b, s, now)
                self._advance(a, now)
            elif kind == _ARRIVAL:
                self._deliver(self.x_info[a][2], now)
            else:
                self._complete(a, b, now)
                self._advance(a, now)


_DONE, _DRAINED, _ARRIVED, _ISSUED, _SUBFLOW = 0, 1, 2, 3, 4  # event kinds of estimate_executor_schedule


def estimate_executor_schedule(
    net: Network,
    schedule: Schedule,
    chunk_bytes: Sequence[float],
    rank_gpus: Sequence[str],
    mem_bw: Sequence[float],
    *,
    step_cost: float,
    extra_lat: float = 0.0,
) -> float:
    """Seconds :class:`ExecutorEngine` takes for ``schedule``, without rate recomputations: the
    planner's cost model (:meth:`treecoll.collectives.cost.CostModel.tree_times`).

    Everything is the engine's (the ranks' step order and dependencies, ``step_cost`` per send and
    receive on the rank's one thread, reduces holding it, in-order connections, rendezvous, the
    routes' subflows, latencies and link capacities from ``net``) except how links are shared:
    a subflow runs at the least, over its links, of the link's capacity divided by the subflows
    crossing it (max-min sharing's first level, without handing capacity a subflow cannot use to
    the others), updated for the subflows of a link where one starts or ends. Where flows meet
    at one bottleneck that is max-min sharing; where a flow is held back elsewhere, its share of
    a link is left unused, so the estimate can only be slower than the engine there.
    ``extra_lat``: seconds added to every message's route latency. ``chunk_bytes``,
    ``rank_gpus`` and ``mem_bw`` (B/s, 0: free reduces) as
    :class:`~treecoll.collectives.sim.engine.FlowEngine` takes them.

    >>> from treecoll import topo
    >>> from treecoll.collectives.compile import compile_allreduce
    >>> from treecoll.collectives.tree import Tree
    >>> t = topo.default()
    >>> s = compile_allreduce(Tree.from_parents([-1, 0]))
    >>> net = Network(t, get_profile("ideal"))
    >>> est = estimate_executor_schedule(net, s, s.chunk_bytes(8), t.rank_gpus()[:2], [0.0, 0.0], step_cost=10e-6)
    >>> round(est * 1e6, 1)     # as the engine: 2 x (10 + 0.6 us NVLink)
    21.2
    """
    P, steps, o = schedule.nranks, schedule.steps, float(step_cost)
    routes: dict[tuple[int, int], tuple] = {}
    for r in range(P):
        for s in steps[r]:
            if s.kind == "send" and (r, s.peer) not in routes:
                rt = net.route(rank_gpus[r], rank_gpus[s.peer])
                subs = [([int(x) for x in ids], float(share)) for ids, share in rt.subroutes if share > 0]
                routes[(r, s.peer)] = (subs, rt.lat + extra_lat)
    cap = net.cap.tolist()
    crossing: list[set[int]] = [set() for _ in cap]  # the subflows on each link
    fair = list(cap)  # each link's capacity over the subflows crossing it
    flows: dict[int, list] = {}  # subflow -> [links, bytes left, rate, as of, version, transfer]
    xfers: list[list] = []  # transfer -> [subflows left, rank, step, message, latency]
    done: list[list[float | None]] = [[None] * len(st) for st in steps]
    pos, cpu, gpu = [0] * P, [0.0] * P, [0.0] * P
    recv_k = []  # the k-th recv of (sender, chunk) matches the k-th send of it
    for r in range(P):
        seen: dict[tuple[int, int], int] = {}
        ks = []
        for s in steps[r]:
            k = -1
            if s.kind == "recv":
                k = seen.get((s.peer, s.chunk), 0)
                seen[(s.peer, s.chunk)] = k + 1
            ks.append(k)
        recv_k.append(ks)
    send_count: dict[tuple, int] = {}
    conns: dict[tuple[int, int], deque] = {}  # busy connections and the messages waiting for them
    posted: set = set()
    held: dict = {}
    arrived: dict = {}
    waiting: dict = {}
    blocked: set = set()
    heap: list = []
    seq = 0
    flows_made: list[int] = []

    def push(t: float, kind: int, a: Any, b: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, a, b))

    def reshare(affected: set[int], t: float) -> None:
        """New rates for the subflows of links whose count changed; a new drain event for those whose
        rate did (the older one is stale: its version is behind)."""
        for f in affected:
            st = flows[f]
            rate = min(map(fair.__getitem__, st[0]))
            if rate != st[2]:
                st[1] -= st[2] * (t - st[3])
                st[2], st[3], st[4] = rate, t, st[4] + 1
                push(t + max(st[1], 0.0) / rate, _SUBFLOW, f, st[4])

    def transmit(r: int, i: int, peer: int, chunk: int, key: tuple, t: float) -> None:
        n = chunk_bytes[chunk]
        subs, lat = routes[(r, peer)]
        if n <= 0 or not subs:
            push(t, _DRAINED, r, i)
            push(t + lat, _ARRIVED, key, None)
            return
        xfers.append([len(subs), r, i, key, lat])
        affected: set[int] = set()
        for links, share in subs:
            f = len(flows_made)
            flows_made.append(f)
            flows[f] = [links, n * share, 0.0, t, 0, len(xfers) - 1]
            for lk in links:
                on = crossing[lk]
                on.add(f)
                fair[lk] = cap[lk] / len(on)
                affected |= on
        reshare(affected, t)

    def subflow_drained(f: int, t: float) -> None:
        links, _, _, _, _, x = flows.pop(f)
        affected: set[int] = set()
        for lk in links:
            on = crossing[lk]
            on.discard(f)
            fair[lk] = cap[lk] / len(on) if on else cap[lk]
            affected |= on
        reshare(affected, t)
        xf = xfers[x]
        xf[0] -= 1
        if xf[0] == 0:  # the transfer has left its sender
            push(t, _DRAINED, xf[1], xf[2])
            push(t + xf[4], _ARRIVED, xf[3], None)

    def send_when_posted(r: int, i: int, peer: int, chunk: int, key: tuple, t: float) -> None:
        if key not in posted and chunk_bytes[chunk] > 0:
            held[key] = (r, i, peer, chunk)
        else:
            transmit(r, i, peer, chunk, key, t)

    def start_send(r: int, i: int, s: Step, t: float) -> None:
        k = send_count.get((r, s.peer, s.chunk), 0)
        send_count[(r, s.peer, s.chunk)] = k + 1
        key = (r, s.peer, s.chunk, k)
        if chunk_bytes[s.chunk] > 0:
            q = conns.get((r, s.peer))
            if q is not None:  # the connection is busy: after its earlier messages
                q.append((i, s.peer, s.chunk, key))
                return
            conns[(r, s.peer)] = deque()
        send_when_posted(r, i, s.peer, s.chunk, key, t)

    def post_recv(r: int, i: int, s: Step, t: float) -> None:
        key = (s.peer, r, s.chunk, recv_k[r][i])
        posted.add(key)
        h = held.pop(key, None)
        if h is not None:
            transmit(*h, key, t)
        a = arrived.pop(key, None)
        if a is None:
            waiting[key] = (r, i)
        else:
            complete(r, i, max(t, a))

    def complete(r: int, i: int, t: float) -> None:
        done[r][i] = t
        if (r, i) in blocked:
            blocked.discard((r, i))
            advance(r, t)

    def advance(r: int, t: float) -> None:
        lst, dn = steps[r], done[r]
        while pos[r] < len(lst):
            i = pos[r]
            s = lst[i]
            for d in s.deps:
                if dn[d] is None:
                    blocked.add((r, d))
                    return
            pos[r] = i + 1
            if s.kind == "reduce":
                dur = 3.0 * chunk_bytes[s.chunk] / mem_bw[r] if mem_bw[r] > 0 else 0.0
                end = max(t, cpu[r], gpu[r]) + dur
                gpu[r] = end
                cpu[r] = max(cpu[r], end)
                if end <= t:
                    dn[i] = t
                else:
                    push(end, _DONE, r, i)
            else:
                at = max(t, cpu[r]) + o
                cpu[r] = at
                if at <= t:
                    (start_send if s.kind == "send" else post_recv)(r, i, s, t)
                else:
                    push(at, _ISSUED, r, i)

    for r in range(P):
        advance(r, 0.0)
    while heap:
        now, _, kind, a, b = heapq.heappop(heap)
        if kind == _ISSUED:
            s = steps[a][b]
            (start_send if s.kind == "send" else post_recv)(a, b, s, now)
        elif kind == _SUBFLOW:
            if a in flows and flows[a][4] == b:  # not stale
                subflow_drained(a, now)
        elif kind == _ARRIVED:
            w = waiting.pop(a, None)
            if w is None:
                arrived[a] = now
            else:
                complete(*w, now)
        else:
            complete(a, b, now)
            if kind == _DRAINED:  # the send's connection takes its next message
                conn = (a, steps[a][b].peer)
                q = conns.get(conn)
                if q:
                    i, peer, chunk, key = q.popleft()
                    send_when_posted(a, i, peer, chunk, key, now)
                elif q is not None:
                    del conns[conn]
    for r in range(P):
        if None in done[r]:
            raise CollectiveError(
                f"estimate: rank {r} never completed step {done[r].index(None)}; the schedule cannot progress"
            )
    return max((max(d) for d in done if d), default=0.0)


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
    stats = {
        "engine": "events (executor)",
        "transfers": raw.transfers,
        "subflows": raw.subflows,
        "rate_updates": raw.recomputes,
        "wall_s": _time.perf_counter() - t0,
        "step_cost_s": step_cost,
    }
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
    :func:`treecoll.collectives.cost.executor_cost`). ``stats``: ``chunks`` per tree, ``mode``
    ``executor``, ``backend`` and ``step_cost_s``.
    """
    from ..cost import executor_cost
    from ..planner import default_planner
    from ..tree import as_multi

    check_size(nbytes, dtype)
    p = as_placement(placement, ranks, what="executor prediction")
    cost = executor_cost(p, backend)
    o = cost.step_s if step_cost is None else float(step_cost)
    plan, sched = default_planner().schedule_for(
        tree,
        collective=collective,
        nbytes=nbytes,
        placement=p,
        algo=algo if collective == "allreduce" else "tree",
        root=root,
        nchunks=nchunks,
        max_chunks=max(1, nbytes // DTYPE_SIZES[dtype]),
    )
    r = simulate_executor_schedule(p, sched, nbytes, step_cost=o, dtype=dtype, top=top)
    per = sched.nchunks // (len(as_multi(plan)) if plan is not None else 1)
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
) -> SimResult:
    """THE prediction of a treecoll tree (a Tree, MultiTree or builder name) that every command
    prints: ``mode`` ``executor`` (:func:`predict_schedule`: as ``collectives.allreduce`` runs it)
    or ``in-kernel`` (the same tree inside the communication library, NCCL's protocols and
    pipelining: :func:`treecoll.collectives.sim.simulator.simulate_algorithm`). ``root``: where a
    reduce ends or a broadcast starts (default: the tree's root). ``stats["mode"]`` says which."""

    from ..cost import MODES

    if mode not in MODES:
        raise CollectiveError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    p = as_placement(placement, ranks, what="prediction")
    if mode == "executor":
        return predict_schedule(
            p, plan, nbytes, collective=collective, backend=backend, root=root, dtype=dtype, top=top
        )
    from ..tree import as_multi
    from .simulator import simulate_algorithm

    if root is None and collective != "allreduce" and not isinstance(plan, str):
        root = as_multi(plan).roots[0]
    r = simulate_algorithm(
        p, plan, nbytes, collective=collective, dtype=dtype, top=top, root=0 if root is None else root
    )
    return dataclasses.replace(r, stats=dict(r.stats, mode="in-kernel", backend="nccl"))
