"""Compile trees, rings and direct exchanges to :class:`~collectives.schedule.Schedule`.

Public API (stable; the executor and the simulator consume it)::

    compile_reduce(plan, nchunks=1, *, root=None) -> Schedule
    compile_broadcast(plan, nchunks=1, *, root=None) -> Schedule
    compile_allreduce(plan, nchunks=1) -> Schedule              # tree reduce then broadcast, pipelined
    compile_ring_allreduce(nranks, nchunks=None, *, order=None) -> Schedule   # reduce-scatter + all-gather
    compile_rsag_allreduce(nranks, nchunks=None) -> Schedule    # direct reduce-scatter + all-gather
    compile_direct_allreduce(nranks, nchunks=1) -> Schedule     # everyone sends everything: one round
    compile_reduce_scatter(nranks, nchunks=None) / compile_allgather(nranks, nchunks=None) -> Schedule
    compile_plan(plan, collective, nchunks=1, *, root=None, algo="tree") -> Schedule  # dispatch
    merge_schedules(schedules, shares=None) -> Schedule         # side by side on shares (rings per channel)

``plan`` is a :class:`~collectives.tree.Tree` or a
:class:`~collectives.tree.MultiTree`. With a multitree, ``nchunks`` is per
tree: tree t carries chunks ``t*nchunks .. (t+1)*nchunks - 1`` whose shares sum
to the tree's share. ``root`` (default: the tree's root) may differ from the
tree's root: a reduce then ends with one extra hop tree root -> ``root``, a
broadcast starts with one hop ``root`` -> tree root.

Ordering within a chunk keeps a non-commutative operator in rank order on an
order-preserving tree: rank r combines ``own op child_0 op child_1 ...``
(``right=True``) in its children's order. The ring requires a commutative
operator (its partial sums wrap around); ``rsag`` keeps rank order (the owner
of a segment folds higher ranks on the right, lower ranks on the left).

Step order (what an in-order executor issues): a rank posts receives a few
chunks ahead (``LOOKAHEAD``), then per chunk reduces and sends; in an
allreduce, rank r's broadcast of chunk c is placed at pipeline time
``c + height + depth(r)`` between its reduce steps (time ``c + subtree
height``), so both phases stream; an inner rank posts that chunk's receive
there and forwards it to its children ``FORWARD_LAG`` steps later. A
receive into the buffer (slot 0) of a chunk this rank sent earlier depends
on that send (no overwrite in flight).

>>> from treecoll.collectives.tree import Tree
>>> s = compile_allreduce(Tree.from_parents([-1, 0, 0]), nchunks=2)
>>> [st.kind for st in s.steps[1]]
['send', 'send', 'recv', 'recv']
>>> s.bytes_sent(0, 1000), s.bytes_received(0, 1000)
(2000, 2000)
"""

from __future__ import annotations

from collections.abc import Sequence

from treecoll.topo.errors import ScheduleError

from .schedule import Schedule, Step, trusted_step
from .tree import MultiTree, Tree, as_multi

__all__ = [
    "compile_reduce",
    "compile_broadcast",
    "compile_allreduce",
    "compile_ring_allreduce",
    "compile_rsag_allreduce",
    "compile_direct_allreduce",
    "compile_reduce_scatter",
    "compile_allgather",
    "compile_plan",
    "merge_schedules",
    "LOOKAHEAD",
    "FORWARD_LAG",
    "ALGOS",
]

#: chunks whose receives a rank posts ahead of the one it is reducing
LOOKAHEAD = 4
#: pipeline steps between an inner rank's posting of a broadcast receive and its forwarding
#: of that chunk to its children: an in-order executor blocks on the forward, so the chunk
#: gets the time of a round trip to arrive (on gloo the receive's request and the data
#: share TCP connections with the other direction's traffic; measured on an emulated
#: 1 Gbit/s cluster: two_level 64 MiB 990 -> 590 ms, docs/benchmarks.md)
FORWARD_LAG = 2
ALGOS = ("tree", "ring", "rsag", "direct")


class _Prog:
    """Per-rank step lists with named dependencies."""

    def __init__(self, n: int):
        self.steps: list[list[Step]] = [[] for _ in range(n)]
        self.last_send: dict[tuple[int, int], int] = {}  # (rank, chunk) -> index of its last send

    def add(
        self, r: int, kind: str, chunk: int, peer: int = -1, slot: int = 0, deps=(), right=True, lane: int = 0
    ) -> int:
        lst = self.steps[r]
        i = len(lst)
        if deps:
            deps = [d for d in deps if d is not None]
        if kind == "send":
            self.last_send[(r, chunk)] = i
        elif kind == "recv" and slot == 0:
            last = self.last_send.get((r, chunk))
            if last is not None:
                deps = [*deps, last]
        n = len(deps)
        lst.append(
            trusted_step(
                kind,
                chunk,
                peer,
                slot,
                () if n == 0 else (deps[0],) if n == 1 else tuple(sorted(set(deps))),
                right,
                lane,
            )
        )
        return i


def _check(plan, nchunks: int) -> MultiTree:
    multi = as_multi(plan)
    if not isinstance(nchunks, int) or nchunks < 1:
        raise ScheduleError(f"compile: nchunks expected an integer >= 1, got {nchunks!r}")
    return multi


def _shares(multi: MultiTree, k: int) -> tuple[float, ...]:
    out = [s / k for s in multi.shares for _ in range(k)]
    out[-1] += 1.0 - sum(out)
    return tuple(out)


def _subheight(t: Tree) -> list[int]:
    h = [0] * t.size
    for r in t.postorder():
        for c in t.children[r]:
            h[r] = max(h[r], h[c] + 1)
    return h


def _depths(t: Tree) -> list[int]:
    """Depth of every rank in one pass from the root (O(P))."""
    depth = [0] * t.size
    stack = [t.root]
    while stack:
        u = stack.pop()
        for c in t.children[u]:
            depth[c] = depth[u] + 1
            stack.append(c)
    return depth


def _events(multi: MultiTree, k: int, phases: tuple[str, ...], forward_lag: int = FORWARD_LAG):
    """Per rank, sorted (time, order, tree, chunk, phase) events."""
    ev = [[] for _ in range(multi.size)]
    up, down = "up" in phases, "down" in phases
    for ti, t in enumerate(multi.trees):
        sub = _subheight(t)
        depth = _depths(t)
        height = max(depth)
        for j in range(k):
            c = ti * k + j
            for r in range(t.size):
                if up:
                    ev[r].append((j + sub[r], 0, ti, c, "up"))
                if down:
                    at = j + height + depth[r]
                    if t.parents[r] != -1 and t.children[r]:
                        ev[r].append((at, 1, ti, c, "fetch"))
                        at += forward_lag
                    ev[r].append((at, 1, ti, c, "down"))
    for lst in ev:
        lst.sort(key=lambda e: (e[0], e[1], e[3]))
    return ev


def _emit(
    multi: MultiTree,
    k: int,
    phases: tuple[str, ...],
    root: int | None,
    name: str,
    collective: str,
    forward_lag: int = FORWARD_LAG,
) -> Schedule:
    n = multi.size
    if root is not None and not 0 <= root < n:
        raise ScheduleError(f"compile {collective}: root expected a rank in 0..{n - 1}, got {root}")
    if collective in ("reduce", "broadcast") and root is None and len(set(multi.roots)) > 1:
        raise ScheduleError(f"compile {collective}: the trees have different roots {list(multi.roots)}; pass root=")
    prog = _Prog(n)
    if not (isinstance(forward_lag, int) and forward_lag >= 0):
        raise ScheduleError(f"compile {collective}: forward_lag expected an integer >= 0, got {forward_lag!r}")
    ev = _events(multi, k, phases, forward_lag)
    nph = len(phases)

    # one in-order stream (lane) per (tree, phase): NCCL runs each tree on its own channels and a tree
    # allreduce's reduce-up and broadcast-down in separate thread groups (collectives.schedule)
    up_lane = [ti * nph for ti in range(len(multi.trees))]
    down_lane = [ti * nph + (1 if nph == 2 else 0) for ti in range(len(multi.trees))]

    posted: dict[tuple[int, int, str], list[int]] = {}  # (rank, chunk, phase) -> recv indices
    last: dict[tuple[int, int], int] = {}  # (rank, chunk) -> index of the step completing it

    def post(r: int, ti: int, c: int, phase: str) -> None:
        t = multi.trees[ti]
        key = (r, c, phase)
        if key in posted:
            return
        if phase == "up":
            posted[key] = [
                prog.add(r, "recv", c, peer=ch, slot=i + 1, lane=up_lane[ti]) for i, ch in enumerate(t.children[r])
            ]
        else:
            src = t.parents[r]
            if phase == "down" and root is not None and collective == "broadcast" and r == root:
                posted[key] = []
            elif src == -1:
                if root is not None and root != r and collective == "broadcast":
                    posted[key] = [prog.add(r, "recv", c, peer=root, lane=down_lane[ti])]
                else:
                    posted[key] = []
            else:
                posted[key] = [prog.add(r, "recv", c, peer=src, lane=down_lane[ti])]

    for r in range(n):
        lst = ev[r]
        steps_ahead = [e for e in lst if e[4] != "fetch"]
        idx = 0
        ahead = 0  # the up events before this index in steps_ahead have posted their receives
        for _, _, ti, c, phase in lst:
            if phase == "fetch":  # the broadcast's receive, forward_lag steps before its use
                post(r, ti, c, "down")
                continue
            # post receives of the next LOOKAHEAD events (same phase kind) ahead of time (those of
            # the events before ``ahead`` are posted already)
            if phase == "up":
                for _, _, tj, cj, ph in steps_ahead[max(ahead, idx) : idx + LOOKAHEAD]:
                    if ph == "up":
                        post(r, tj, cj, ph)
                ahead = idx + LOOKAHEAD
            else:
                post(r, ti, c, phase)
            idx += 1
            t = multi.trees[ti]
            if phase == "up":
                prev = None
                for i, rv in enumerate(posted[(r, c, "up")]):  # one receive per child
                    prev = prog.add(r, "reduce", c, slot=i + 1, deps=(rv, prev), lane=up_lane[ti])
                last[(r, c)] = prev
                if t.parents[r] != -1:
                    prog.add(r, "send", c, peer=t.parents[r], deps=(prev,), lane=up_lane[ti])
                elif collective == "reduce" and root is not None and root != r:
                    prog.add(r, "send", c, peer=root, deps=(prev,), lane=up_lane[ti])
            else:
                rv = posted[(r, c, "down")]
                dep = rv[0] if rv else last.get((r, c))
                if collective == "broadcast" and root is not None and r == root and t.root != root:
                    prog.add(r, "send", c, peer=t.root, lane=down_lane[ti])
                for ch in t.children[r]:
                    if collective == "broadcast" and root is not None and ch == root:
                        continue
                    prog.add(r, "send", c, peer=ch, deps=(dep,), lane=down_lane[ti])
        if collective == "reduce" and root is not None:
            for ti, t in enumerate(multi.trees):
                if r == root and t.root != root:
                    for j in range(k):
                        c = ti * k + j
                        prog.add(r, "recv", c, peer=t.root, lane=up_lane[ti])
    sched_root = root if root is not None else multi.trees[0].root
    return Schedule(
        collective,
        n,
        k * len(multi.trees),
        tuple(tuple(s) for s in prog.steps),
        root=sched_root if collective != "allreduce" else -1,
        shares=_shares(multi, k),
        name=name,
    )


def _name(multi: MultiTree, what: str) -> str:
    return f"{multi.name or 'tree'}/{what}"


def compile_reduce(plan: Tree | MultiTree, nchunks: int = 1, *, root: int | None = None) -> Schedule:
    """Tree reduce to ``root`` (default the tree's root), chunks pipelined leaf to root."""
    multi = _check(plan, nchunks)
    return _emit(multi, nchunks, ("up",), root, _name(multi, "reduce"), "reduce")


def compile_broadcast(
    plan: Tree | MultiTree, nchunks: int = 1, *, root: int | None = None, forward_lag: int = FORWARD_LAG
) -> Schedule:
    """Tree broadcast from ``root`` (default the tree's root), chunks pipelined root to leaves."""
    multi = _check(plan, nchunks)
    return _emit(multi, nchunks, ("down",), root, _name(multi, "broadcast"), "broadcast", forward_lag)


def compile_allreduce(plan: Tree | MultiTree, nchunks: int = 1, *, forward_lag: int = FORWARD_LAG) -> Schedule:
    """Tree allreduce: reduce to the tree's root then broadcast, both pipelined by chunks;
    several trees run concurrently on their shares of the message. ``forward_lag``: see
    :data:`FORWARD_LAG` (0: forward each chunk at once, as NCCL's tree kernels do)."""
    multi = _check(plan, nchunks)
    return _emit(multi, nchunks, ("up", "down"), None, _name(multi, "allreduce"), "allreduce", forward_lag)


def _seg_chunks(nranks: int, nchunks: int | None, what: str) -> int:
    k = 1 if nchunks is None else nchunks
    if nchunks is not None:
        if nchunks < nranks or nchunks % nranks:
            raise ScheduleError(f"compile {what}: nchunks expected a multiple of nranks {nranks}, got {nchunks}")
        k = nchunks // nranks
    return k


def compile_ring_allreduce(nranks: int, nchunks: int | None = None, *, order: Sequence[int] | None = None) -> Schedule:
    """Ring allreduce along ``order`` (default 0..P-1): reduce-scatter then all-gather,
    ``2 (P - 1)`` steps of ``1/P`` of the message. ``nchunks`` (a multiple of P,
    default P) splits each of the P segments into ``nchunks / P`` pieces that
    run one after the other. Requires a commutative operator."""
    n = nranks
    order = list(range(n)) if order is None else list(order)
    if sorted(order) != list(range(n)):
        raise ScheduleError(f"compile ring: order expected a permutation of 0..{n - 1}, got {order[:8]}")
    k = _seg_chunks(n, nchunks, "ring")
    prog = _Prog(n)
    pos = {r: i for i, r in enumerate(order)}
    if n > 1:
        for j in range(k):

            def ch(seg: int, j: int = j) -> int:  # chunk j of segment seg
                return (seg % n) * k + j

            for r in range(n):
                i = pos[r]
                nxt, prv = order[(i + 1) % n], order[(i - 1) % n]
                dep = None
                for t in range(n - 1):  # reduce-scatter
                    prog.add(r, "send", ch(i - t), peer=nxt, deps=(dep,))
                    rv = prog.add(r, "recv", ch(i - t - 1), peer=prv, slot=1)
                    dep = prog.add(r, "reduce", ch(i - t - 1), slot=1, deps=(rv,))
                for t in range(n - 1):  # all-gather
                    prog.add(r, "send", ch(i + 1 - t), peer=nxt, deps=(dep,))
                    dep = prog.add(r, "recv", ch(i - t), peer=prv)
    return Schedule("allreduce", n, n * k, tuple(tuple(s) for s in prog.steps), name="ring/allreduce")


def _slot(q: int, r: int) -> int:
    """Scratch slot at owner r for the piece from rank q (1..P-1)."""
    return q + 1 if q < r else q


def _rs(prog: _Prog, n: int, k: int, *, then_ag: bool = False) -> None:
    """Direct reduce-scatter (and the all-gather after it). Every rank first issues
    all its sends (they read only its input), then posts every receive, then
    reduces its segment chunk by chunk (rank order: higher ranks on the right,
    lower on the left) and, with ``then_ag``, sends each finished chunk to all."""
    for r in range(n):
        for j in range(k):
            for d in range(1, n):
                s = (r + d) % n
                prog.add(r, "send", s * k + j, peer=s)
        rv = {}
        for j in range(k):
            for d in range(1, n):
                q = (r - d) % n
                rv[(q, j)] = prog.add(r, "recv", r * k + j, peer=q, slot=_slot(q, r))
        if then_ag:
            for j in range(k):
                for d in range(1, n):
                    q = (r - d) % n
                    prog.add(r, "recv", q * k + j, peer=q)
        for j in range(k):
            prev = None
            for q in list(range(r + 1, n)) + list(range(r - 1, -1, -1)):
                prev = prog.add(r, "reduce", r * k + j, slot=_slot(q, r), deps=(rv[(q, j)], prev), right=q > r)
            if then_ag:
                for d in range(1, n):
                    prog.add(r, "send", r * k + j, peer=(r + d) % n, deps=(prev,))


def _ag(prog: _Prog, n: int, k: int) -> None:
    for r in range(n):
        for j in range(k):
            for d in range(1, n):
                q = (r - d) % n
                prog.add(r, "recv", q * k + j, peer=q)
        for j in range(k):
            for d in range(1, n):
                prog.add(r, "send", r * k + j, peer=(r + d) % n)


def compile_rsag_allreduce(nranks: int, nchunks: int | None = None) -> Schedule:
    """Direct reduce-scatter (rank s owns segment s and folds the others' pieces in rank
    order) then direct all-gather: each rank sends and receives ``2 (P-1)/P`` of the
    message, in two rounds (bandwidth optimal, for large messages). ``nchunks`` is a
    multiple of P (default P). Keeps a non-commutative operator in rank order."""
    n = nranks
    k = _seg_chunks(n, nchunks, "rsag")
    prog = _Prog(n)
    if n > 1:
        _rs(prog, n, k, then_ag=True)
    return Schedule("allreduce", n, n * k, tuple(tuple(s) for s in prog.steps), name="rsag/allreduce")


def compile_direct_allreduce(nranks: int, nchunks: int = 1) -> Schedule:
    """Direct allreduce for small messages: every rank sends its whole value to every
    other rank and folds the P-1 values it receives in rank order (higher ranks on
    the right, lower on the left): one round of messages, the least latency, at
    ``P - 1`` times the bytes of a tree. Keeps a non-commutative operator in rank order."""
    n, k = nranks, nchunks
    if k < 1:
        raise ScheduleError(f"compile direct: nchunks expected >= 1, got {k}")
    prog = _Prog(n)
    if n > 1:
        for r in range(n):
            for j in range(k):
                for d in range(1, n):
                    prog.add(r, "send", j, peer=(r + d) % n)
            rv = {}
            for j in range(k):
                for d in range(1, n):
                    q = (r - d) % n
                    rv[(q, j)] = prog.add(r, "recv", j, peer=q, slot=_slot(q, r))
            for j in range(k):
                prev = None
                for q in list(range(r + 1, n)) + list(range(r - 1, -1, -1)):
                    prev = prog.add(r, "reduce", j, slot=_slot(q, r), deps=(rv[(q, j)], prev), right=q > r)
    return Schedule("allreduce", n, k, tuple(tuple(s) for s in prog.steps), name="direct/allreduce")


def compile_reduce_scatter(nranks: int, nchunks: int | None = None) -> Schedule:
    """Direct reduce-scatter: segment s (chunks ``s*k .. s*k+k-1``) ends reduced on rank s."""
    k = _seg_chunks(nranks, nchunks, "reduce_scatter")
    prog = _Prog(nranks)
    if nranks > 1:
        _rs(prog, nranks, k)
    owners = tuple(c // k for c in range(nranks * k))
    return Schedule(
        "reduce_scatter",
        nranks,
        nranks * k,
        tuple(tuple(s) for s in prog.steps),
        name="direct/reduce_scatter",
        owners=owners,
    )


def compile_allgather(nranks: int, nchunks: int | None = None) -> Schedule:
    """Direct all-gather: rank s's segment goes to every other rank."""
    k = _seg_chunks(nranks, nchunks, "allgather")
    prog = _Prog(nranks)
    if nranks > 1:
        _ag(prog, nranks, k)
    return Schedule("allgather", nranks, nranks * k, tuple(tuple(s) for s in prog.steps), name="direct/allgather")


def compile_plan(
    plan: Tree | MultiTree | None,
    collective: str,
    nchunks: int = 1,
    *,
    root: int | None = None,
    algo: str = "tree",
    nranks: int | None = None,
    forward_lag: int = FORWARD_LAG,
) -> Schedule:
    """Dispatch: ``algo="tree"`` compiles ``plan`` for ``collective``; ``"ring"`` and
    ``"rsag"`` (allreduce only) need ``nranks`` (or a plan to take it from) and round
    ``nchunks`` up to a multiple of P. ``forward_lag`` applies to tree broadcasts and
    allreduces."""
    if algo not in ALGOS:
        raise ScheduleError(f"compile: algo expected one of {list(ALGOS)}, got {algo!r}")
    if algo == "tree":
        if plan is None:
            raise ScheduleError("compile: algo 'tree' needs a tree, got None")
        if collective == "reduce":
            return compile_reduce(plan, nchunks, root=root)
        if collective == "broadcast":
            return compile_broadcast(plan, nchunks, root=root, forward_lag=forward_lag)
        if collective == "allreduce":
            return compile_allreduce(plan, nchunks, forward_lag=forward_lag)
        raise ScheduleError(f"compile: collective expected reduce, broadcast or allreduce, got {collective!r}")
    if collective != "allreduce":
        raise ScheduleError(f"compile: algo {algo!r} implements allreduce only, got {collective!r}")
    n = nranks if nranks is not None else as_multi(plan).size
    if algo == "direct":
        return compile_direct_allreduce(n, nchunks)
    k = max(1, -(-nchunks // n))
    return (compile_ring_allreduce if algo == "ring" else compile_rsag_allreduce)(n, n * k)


def merge_schedules(
    schedules: Sequence[Schedule], shares: Sequence[float] | None = None, *, name: str = ""
) -> Schedule:
    """Run several schedules of one collective side by side on shares of the message
    (e.g. one ring per NCCL channel): chunk ids are renumbered (schedule i's chunks
    follow schedule i-1's), each chunk's share scaled by the schedule's share (equal
    by default), and every rank's steps interleaved round-robin (dependencies kept)."""
    schedules = list(schedules)
    if not schedules:
        raise ScheduleError("merge: expected at least one schedule")
    first = schedules[0]
    for s in schedules:
        if s.collective != first.collective or s.nranks != first.nranks or s.root != first.root:
            raise ScheduleError(
                f"merge: schedules must share collective, nranks and root; got "
                f"{s.collective}/{s.nranks}/{s.root} and "
                f"{first.collective}/{first.nranks}/{first.root}"
            )
    shares = list(shares) if shares is not None else [1.0 / len(schedules)] * len(schedules)
    if len(shares) != len(schedules):
        raise ScheduleError(f"merge: expected {len(schedules)} shares, got {len(shares)}")
    offsets, off = [], 0
    for s in schedules:
        offsets.append(off)
        off += s.nchunks
    all_shares = [sh * x for s, sh in zip(schedules, shares) for x in s.shares]
    all_shares[-1] += 1.0 - sum(all_shares)
    steps = []
    for r in range(first.nranks):
        out: list[Step] = []
        index: dict[tuple[int, int], int] = {}
        lists = [s.steps[r] for s in schedules]
        for j in range(max((len(lst) for lst in lists), default=0)):
            for si, lst in enumerate(lists):
                if j < len(lst):
                    st = lst[j]
                    index[(si, j)] = len(out)
                    out.append(
                        Step(
                            st.kind,
                            st.chunk + offsets[si],
                            peer=st.peer,
                            slot=st.slot,
                            deps=tuple(index[(si, d)] for d in st.deps),
                            right=st.right,
                            lane=st.lane,
                        )
                    )
        steps.append(tuple(out))
    owners = tuple(o for s in schedules for o in s.owners)
    return Schedule(
        first.collective,
        first.nranks,
        off,
        tuple(steps),
        root=first.root,
        shares=tuple(all_shares),
        name=name or "+".join(s.name for s in schedules)[:80],
        owners=owners,
    )
