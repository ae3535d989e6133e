"""The planner's fast estimate of a schedule as treecoll's executor runs it.

:func:`estimate_executor_schedule` steps through a compiled
:class:`~treecoll.collectives.schedule.Schedule` with the rules of
:class:`~treecoll.collectives.sim.executor.ExecutorEngine` (one thread per
rank paying a software cost per message, in-order connections, rendezvous,
the routes' latencies and capacities) and shares links by each link's
capacity over the subflows crossing it instead of recomputing max-min rates.
:class:`~treecoll.collectives.cost.CostModel` prices trees with it; it
imports nothing of the planner, so the cost model and the simulator depend
on it one way.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from typing import Any

from treecoll.topo.errors import CollectiveError

from ..schedule import Schedule, Step
from .engine import Network

__all__ = ["estimate_executor_schedule"]

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
    >>> from treecoll.collectives.sim.profiles import get_profile
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
