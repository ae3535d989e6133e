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

from collections import defaultdict
from collections.abc import Sequence

from treecoll.topo.errors import ScheduleError

from .schedule import Schedule, Step, trusted_step, with_peers
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


def _depth_and_height(t: Tree) -> tuple[list[int], list[int]]:
    """(depth, subtree height) of every rank of ``t``, in two passes over the ranks from the root."""
    depth, height = [0] * t.size, [0] * t.size
    order = [t.root]
    children = t.children
    for u in order:  # grows as it goes: every rank after its parent
        for c in children[u]:
            depth[c] = depth[u] + 1
            order.append(c)
    parents = t.parents
    for u in reversed(order):  # every rank before its parent
        p = parents[u]
        if p >= 0 and height[u] >= height[p]:
            height[p] = height[u] + 1
    return depth, height


def _levels(multi: MultiTree) -> list[tuple[list[int], list[int], int]]:
    """Per tree: (subtree height, depth of every rank, the tree's height)."""
    out = []
    for t in multi.trees:
        depth, height = _depth_and_height(t)
        out.append((height, depth, max(depth)))
    return out


def _rank_events(multi: MultiTree, levels, r: int, k: int, phases: tuple[str, ...], forward_lag: int) -> list:
    """Rank ``r``'s sorted (time, order, tree, chunk, phase) events (``levels``: :func:`_levels`)."""
    ev = []
    up, down = "up" in phases, "down" in phases
    for ti, (t, (sub, depth, height)) in enumerate(zip(multi.trees, levels)):
        forwards = t.parents[r] != -1 and bool(t.children[r])
        for j in range(k):
            c = ti * k + j
            if up:
                ev.append((j + sub[r], 0, ti, c, "up"))
            if down:
                at = j + height + depth[r]
                if forwards:
                    ev.append((at, 1, ti, c, "fetch"))
                    at += forward_lag
                ev.append((at, 1, ti, c, "down"))
    ev.sort(key=lambda e: (e[0], e[1], e[3]))
    return ev


def _events(multi: MultiTree, k: int, phases: tuple[str, ...], forward_lag: int = FORWARD_LAG):
    """Per rank, sorted (time, order, tree, chunk, phase) events."""
    levels = _levels(multi)
    return [_rank_events(multi, levels, r, k, phases, forward_lag) for r in range(multi.size)]


class _Peers:
    """One rank's parent and children in every tree of a plan, as :func:`_rank_steps` reads them:
    the rank's own (``symbolic`` False), or stand-ins ``base + i`` for the i-th entry of the rank's
    peer list (every tree's parent, then its children), so that one rank's steps serve every rank
    whose trees look alike from where it stands (:func:`_emit`)."""

    def __init__(self, multi: MultiTree, r: int, symbolic: bool = False) -> None:
        self.parents, self.children, self.table = [], [], _peer_table(multi, r)
        at = multi.size
        for t in multi.trees:
            p, kids = t.parents[r], t.children[r]
            if symbolic:
                self.parents.append(-1 if p == -1 else at)
                self.children.append(tuple(range(at + 1, at + 1 + len(kids))))
                at += 1 + len(kids)
            else:
                self.parents.append(p)
                self.children.append(kids)


def _peer_table(multi: MultiTree, r: int) -> list[int]:
    """Rank ``r``'s peer list: in every tree its parent (-1 for the root), then its children."""
    table = []
    for t in multi.trees:
        table.append(t.parents[r])
        table.extend(t.children[r])
    return table


def _rank_steps(
    multi: MultiTree,
    r: int,
    peers: _Peers,
    ev: list,
    k: int,
    nph: int,
    root: int | None,
    collective: str,
) -> list[Step]:
    """Rank ``r``'s steps from its sorted events ``ev`` (:func:`_rank_events`), its parents and
    children read from ``peers``."""
    prog = _Prog(1)
    # one in-order stream (lane) per (tree, phase): NCCL runs each tree on its own channels and a tree
    # allreduce's reduce-up and broadcast-down in separate thread groups (collectives.schedule)
    up_lane = [ti * nph for ti in range(len(multi.trees))]
    down_lane = [ti * nph + (1 if nph == 2 else 0) for ti in range(len(multi.trees))]

    posted: dict[tuple[int, str], list[int]] = {}  # (chunk, phase) -> recv indices
    last: dict[int, int] = {}  # chunk -> index of the step completing it

    def post(ti: int, c: int, phase: str) -> None:
        key = (c, phase)
        if key in posted:
            return
        if phase == "up":
            posted[key] = [
                prog.add(0, "recv", c, peer=ch, slot=i + 1, lane=up_lane[ti]) for i, ch in enumerate(peers.children[ti])
            ]
        else:
            src = peers.parents[ti]
            if phase == "down" and root is not None and collective == "broadcast" and r == root:
                posted[key] = []
            elif src == -1:
                if root is not None and root != r and collective == "broadcast":
                    posted[key] = [prog.add(0, "recv", c, peer=root, lane=down_lane[ti])]
                else:
                    posted[key] = []
            else:
                posted[key] = [prog.add(0, "recv", c, peer=src, lane=down_lane[ti])]

    steps_ahead = [e for e in ev if e[4] != "fetch"]
    idx = 0
    ahead = 0  # the up events before this index in steps_ahead have posted their receives
    for _, _, ti, c, phase in ev:
        if phase == "fetch":  # the broadcast's receive, forward_lag steps before its use
            post(ti, c, "down")
            continue
        # post receives of the next LOOKAHEAD events (same phase kind) ahead of time (those of
        # the events before ``ahead`` are posted already)
        if phase == "up":
            for _, _, tj, cj, ph in steps_ahead[max(ahead, idx) : idx + LOOKAHEAD]:
                if ph == "up":
                    post(tj, cj, ph)
            ahead = idx + LOOKAHEAD
        else:
            post(ti, c, phase)
        idx += 1
        parent = peers.parents[ti]
        if phase == "up":
            prev = None
            for i, rv in enumerate(posted[(c, "up")]):  # one receive per child
                prev = prog.add(0, "reduce", c, slot=i + 1, deps=(rv, prev), lane=up_lane[ti])
            last[c] = prev
            if parent != -1:
                prog.add(0, "send", c, peer=parent, deps=(prev,), lane=up_lane[ti])
            elif collective == "reduce" and root is not None and root != r:
                prog.add(0, "send", c, peer=root, deps=(prev,), lane=up_lane[ti])
        else:
            rv = posted[(c, "down")]
            dep = rv[0] if rv else last.get(c)
            tree_root = multi.trees[ti].root
            if collective == "broadcast" and root is not None and r == root and tree_root != root:
                prog.add(0, "send", c, peer=tree_root, lane=down_lane[ti])
            for ch in peers.children[ti]:
                if collective == "broadcast" and root is not None and ch == root:
                    continue
                prog.add(0, "send", c, peer=ch, deps=(dep,), lane=down_lane[ti])
    if collective == "reduce" and root is not None:
        for ti, t in enumerate(multi.trees):
            if r == root and t.root != root:
                for j in range(k):
                    prog.add(0, "recv", ti * k + j, peer=t.root, lane=up_lane[ti])
    return prog.steps[0]


def _look(multi: MultiTree, levels, r: int) -> tuple:
    """What rank ``r``'s steps depend on besides its peers' names: per tree its children, whether it
    has a parent, its subtree height and its depth."""
    return tuple(
        (len(t.children[r]), t.parents[r] != -1, sub[r], depth[r]) for t, (sub, depth, _) in zip(multi.trees, levels)
    )


def _emit(
    multi: MultiTree,
    k: int,
    phases: tuple[str, ...],
    root: int | None,
    name: str,
    collective: str,
    forward_lag: int = FORWARD_LAG,
    *,
    alike: bool = True,
) -> Schedule:
    """The schedule of ``multi`` (``compile_reduce``, ``compile_broadcast``, ``compile_allreduce``).

    ``alike`` (without ``root``): a rank's steps are those of the first rank whose trees look alike
    from where it stands (:func:`_look`), with its own peers; what is checked is each such rank
    program and the messages of every tree edge (:class:`_Programs`), not every step again
    (:meth:`Schedule.trusted`). False, or with ``root``: every rank's steps made and checked on their
    own (the same steps)."""
    n = multi.size
    if root is not None and not 0 <= root < n:
        raise ScheduleError(f"compile {collective}: root expected a rank in 0..{n - 1}, got {root}")
    if collective in ("reduce", "broadcast") and root is None and len(set(multi.roots)) > 1:
        raise ScheduleError(f"compile {collective}: the trees have different roots {list(multi.roots)}; pass root=")
    if not (isinstance(forward_lag, int) and forward_lag >= 0):
        raise ScheduleError(f"compile {collective}: forward_lag expected an integer >= 0, got {forward_lag!r}")
    levels = _levels(multi)
    nph = len(phases)
    nchunks = k * len(multi.trees)
    fields = {"root": (root if root is not None else multi.trees[0].root) if collective != "allreduce" else -1}
    fields.update(shares=_shares(multi, k), name=name)
    if not alike or root is not None:
        steps = []
        for r in range(n):
            ev = _rank_events(multi, levels, r, k, phases, forward_lag)
            steps.append(tuple(_rank_steps(multi, r, _Peers(multi, r), ev, k, nph, root, collective)))
        return Schedule(collective, n, nchunks, tuple(steps), **fields)
    programs = _Programs(multi, levels, nchunks)
    for r in range(n):
        look = _look(multi, levels, r)
        if look not in programs.steps:
            ev = _rank_events(multi, levels, r, k, phases, forward_lag)
            programs.add(look, _rank_steps(multi, r, _Peers(multi, r, True), ev, k, nph, root, collective))
        programs.ranks.append(look)
    programs.check(f"compile {name}")
    steps = tuple(with_peers(programs.steps[look], _peer_table(multi, r), n) for r, look in enumerate(programs.ranks))
    return Schedule.trusted(collective, n, nchunks, steps, **fields)


class _Programs:
    """The distinct rank programs of a tree schedule (steps with stand-in peers, :class:`_Peers`) and
    the program of every rank, with the check that replaces checking every step: each program's steps
    are well formed, and over every tree edge the chunks one end sends are the chunks the other end
    receives."""

    def __init__(self, multi: MultiTree, levels, nchunks: int) -> None:
        self.multi, self.levels, self.nchunks = multi, levels, nchunks
        self.steps: dict[tuple, list[Step]] = {}  # look -> steps
        self.sent: dict[tuple, dict[int, tuple]] = {}  # look -> peer entry -> chunks sent (sorted)
        self.got: dict[tuple, dict[int, tuple]] = {}  # look -> peer entry -> chunks received (sorted)
        self.ranks: list[tuple] = []  # rank -> its look

    def add(self, look: tuple, steps: list[Step]) -> None:
        """Keep the program of ``look``, its steps' fields checked."""
        base, npeers = self.multi.size, sum(1 + c for c, _, _, _ in look)
        sent: dict[int, list[int]] = defaultdict(list)
        got: dict[int, list[int]] = defaultdict(list)
        for i, s in enumerate(steps):
            bad = not 0 <= s.chunk < self.nchunks or any(not 0 <= d < i for d in s.deps)
            if s.kind == "reduce":
                bad = bad or s.slot < 1
            else:
                bad = bad or s.slot < 0 or not base <= s.peer < base + npeers
                (sent if s.kind == "send" else got)[s.peer - base].append(s.chunk)
            if bad:
                raise ScheduleError(f"compile: a rank program's step {i} is malformed: {s}")  # pragma: no cover
        self.steps[look] = steps
        self.sent[look] = {e: tuple(sorted(c)) for e, c in sent.items()}
        self.got[look] = {e: tuple(sorted(c)) for e, c in got.items()}

    def check(self, what: str) -> None:
        """Over every tree edge, what the child sends its parent the parent receives from that child,
        and the other way round."""
        entry = [0] * len(self.ranks)  # where each rank's parent of the current tree sits in its peer list
        for ti, t in enumerate(self.multi.trees):
            place = t.sibling_places()
            for c, p in t.edges():
                up_at, down_at = entry[c], entry[p] + 1 + place[c]
                lc, lp = self.ranks[c], self.ranks[p]
                if self.sent[lc].get(up_at, ()) != self.got[lp].get(down_at, ()) or self.got[lc].get(
                    up_at, ()
                ) != self.sent[lp].get(down_at, ()):
                    raise ScheduleError(f"{what}: the messages of rank {c} and rank {p} in tree {ti} do not match")
            for r in range(t.size):
                entry[r] += 1 + len(t.children[r])


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
