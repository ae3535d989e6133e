"""Tree timing in closed form: a pipelined (multi)tree collective's seconds from its edges' rates.

Units: bytes in, seconds out; link rates in bytes/s (:mod:`treecoll.collectives.link_sharing`),
latencies in seconds, memory bandwidths in GB/s, the per-message cost ``o`` in seconds.

What :meth:`~treecoll.collectives.cost.CostModel.tree_times` uses without ``step_through`` (``auto``'s
search), and past :data:`~treecoll.collectives.cost.STEP_BUDGET` steps (thousands of ranks), in the executor's
step order. With ``K`` chunks of ``m = share * n / K`` bytes, the first chunk goes up the tree:
a rank posts its children's receives first (``c * min(K, LOOKAHEAD) * o``), a child's chunk
arrives ``o + lat + m / rate`` after the child finished (its send, the path, the bytes), and the
rank combines (:func:`reduce_time` of ``m`` per child); then down, a parent sending to its
children one after another (the i-th after ``(i + 1) o`` and the earlier children's bytes). For
this first chunk a link is shared only by the edges busy at the same time (up: children whose
subtrees have the same height; down: the same depth and sibling position). The other chunks
follow one *stage* apart, the larger of a rank's messages per chunk (``o`` each) plus its
combines, and a link's time per chunk with every edge of every tree busy (steady state):
``time = L + (K - 1) * stage``. Several trees (a :class:`~treecoll.collectives.tree.MultiTree`)
run concurrently, but a rank issues the messages of all its trees from one thread: an inner rank
pays, on average, half of its other trees' messages between two of this tree's, and no tree ends
before every rank has issued all of its messages.

>>> from treecoll.collectives.cost import uniform_topology
>>> from treecoll.collectives.tree import Tree, as_multi
>>> t = uniform_topology(4)                     # 4 ports of 12 GB/s on one switch, 0.5 us per link
>>> timing = TreeTiming(Links(t, t.rank_gpus(), 0.0), msg_overhead=1e-6, mem_bw=(0.0,) * 4)
>>> chain = as_multi(Tree.from_parents([-1, 0, 1, 2]))
>>> one, four = timing.closed_form_times(chain, 12e6, "broadcast", (1, 4))   # seconds
>>> round(one * 1e3, 3)           # ms: 3 edges of 1 ms (12 MB at 12 GB/s) + 1 us o + 1 us latency
3.006
>>> round(four * 1e3, 3)          # 4 chunks: the first down the chain, then 3 stages of 0.25 ms
1.506
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from .compile import LOOKAHEAD, _depth_and_height
from .link_sharing import Links
from .tree import MultiTree, Tree

__all__ = ["TreeTiming", "COLLECTIVE_PHASES", "ARRAY_CLOSED_FORM", "reduce_time", "plan_key"]

#: the phases of each tree collective: up the tree (reduce), down (broadcast)
COLLECTIVE_PHASES = {"reduce": ("up",), "broadcast": ("down",), "allreduce": ("up", "down")}
#: ranks x trees from which :meth:`TreeTiming.closed_form` works on arrays, a tree level at a time
ARRAY_CLOSED_FORM = 256


def reduce_time(mem_bw_gbps: float, nbytes: float) -> float:
    """Seconds to combine two ``nbytes`` operands into one: read 2, write 1 (``mem_bw_gbps`` 0:
    unknown, free as in the simulator)."""
    return 3.0 * nbytes / (mem_bw_gbps * 1e9) if mem_bw_gbps > 0 else 0.0


def plan_key(multi: MultiTree) -> tuple:
    """What a tree time depends on of a plan: every tree's parents and child order, the shares."""
    return tuple((t.parents, t.children) for t in multi.trees), multi.shares


def _rate_groups(multi: MultiTree, up: bool, down: bool, by_level: bool) -> list[list[tuple[int, int]]]:
    """The tree edges (rank i -> rank j) busy at once (:meth:`TreeTiming.tree_rates`): all of them, or
    with ``by_level`` going up those whose child's subtree has one height, going down those whose
    child has one depth and one place among its siblings."""
    groups: dict = defaultdict(list)
    for t in multi.trees:
        depth, height = _depth_and_height(t) if by_level else (None, None)
        place = t.sibling_places()
        for c, p in t.edges():
            if up:  # a child sends up once its subtree is done: its height says when
                groups[("up", height[c]) if by_level else 0].append((c, p))
            if down:  # a parent forwards down once the chunk reached it (its depth says when), to
                # one child after another
                groups[("down", depth[c], place[c]) if by_level else 0].append((p, c))
    return list(groups.values())


class _TreeArrays:
    """One tree's ranks as arrays for :meth:`TreeTiming.closed_form_arrays`: children per rank
    (``nkids``), messages per chunk and phase (``own``), the inner ranks, the ranks grouped by
    subtree height (going up) and by depth (going down), and the latency (s) of every rank's edge
    to its parent (``lat_up``) and from it (``lat_down``), indexed by the child."""

    def __init__(self, t: Tree, latency: Callable[[int, int], float]) -> None:
        self.tree = t
        depth, height = _depth_and_height(t)
        self.nkids = np.array([len(c) for c in t.children], dtype=np.int64)
        self.own = self.nkids + (np.array(t.parents) >= 0)
        inner = [r for r in range(t.size) if t.children[r]]
        self.inner = np.array(inner, dtype=np.intp)
        by_height: dict[int, list[int]] = defaultdict(list)
        by_depth: dict[int, list[int]] = defaultdict(list)
        for r in inner:
            by_height[height[r]].append(r)
            by_depth[depth[r]].append(r)
        self.heights = [by_height[h] for h in sorted(by_height)]
        # at one depth the ranks with the most children first: those with an i-th child are a prefix
        self.depths = [sorted(by_depth[d], key=lambda r: -len(t.children[r])) for d in sorted(by_depth)]
        self.lat_up, self.lat_down = np.zeros(t.size), np.zeros(t.size)
        for c, p in t.edges():
            self.lat_up[c], self.lat_down[c] = latency(c, p), latency(p, c)

    def up_finish(self, rate: np.ndarray, m, o_r, lookahead, red) -> np.ndarray:
        """Per chunk count, when the root has combined the first chunk (the reduce of
        :meth:`TreeTiming.closed_form_ranks`; ``rate``: B/s of every rank's edge to its parent;
        ``o_r``: a rank's cost per message, a leaf's ``o``)."""
        children = self.tree.children
        finish = np.zeros((self.tree.size, len(m)))
        for ranks in self.heights:
            kids = [c for r in ranks for c in children[r]]
            at = np.array(ranks, dtype=np.intp)
            nk = self.nkids[at]
            starts = np.zeros(len(ranks), dtype=np.intp)
            np.cumsum(nk[:-1], out=starts[1:])
            inv = 1.0 / rate[kids]
            arrive = np.maximum.reduceat(
                finish[kids] + o_r[kids][:, None] + self.lat_up[kids][:, None] + m * inv[:, None], starts, axis=0
            )
            finish[at] = np.maximum((nk[:, None] * lookahead) * o_r[at][:, None], arrive) + (nk * red[at])[:, None] * m
        return finish[self.tree.root]

    def down_reach(self, rate: np.ndarray, m, o_r) -> np.ndarray:
        """Per rank and chunk count, when the first chunk reaches it going down (the broadcast of
        :meth:`TreeTiming.closed_form_ranks`; ``rate``: B/s of every rank's edge from its parent): a
        parent sends to its children one after another."""
        children = self.tree.children
        reach = np.zeros((self.tree.size, len(m)))
        for ranks in self.depths:
            at = np.array(ranks, dtype=np.intp)
            base = reach[at]
            free = base.copy()
            counts = self.nkids[at]  # descending
            for i in range(int(counts[0])):
                j = int(np.count_nonzero(counts > i))
                kid = [children[r][i] for r in ranks[:j]]
                inv = 1.0 / rate[kid]
                free[:j] = np.maximum(free[:j], base[:j] + (i + 1) * o_r[at[:j]][:, None]) + m * inv[:, None]
                reach[kid] = free[:j] + self.lat_down[kid][:, None]
        return reach

    def slowest(self, ups: np.ndarray | None, downs: np.ndarray | None) -> np.ndarray:
        """Per inner rank, the largest inverse rate (s/B) of its edges to and from its children
        (``ups``, ``downs``: B/s of every rank's edge to and from its parent, None: not run)."""
        kids = np.flatnonzero(np.array(self.tree.parents) >= 0)
        parents = np.array(self.tree.parents, dtype=np.intp)[kids]
        most = np.full(self.tree.size, -np.inf)
        for rate in (ups, downs):
            if rate is not None:
                np.maximum.at(most, parents, 1.0 / rate[kids])
        return most[self.inner]


class TreeTiming:
    """The closed form of a model's tree times (module docstring): the links and rates of its
    topology and ranks (``links``, :func:`~treecoll.collectives.link_sharing.links_of`), the seconds a
    rank spends per message it handles (``msg_overhead``) and every rank's GPU memory bandwidth in
    GB/s (``mem_bw``, 0: unknown, combining free)."""

    def __init__(self, links: Links, msg_overhead: float, mem_bw: Sequence[float]) -> None:
        self.links, self.msg_overhead, self.mem_bw = links, float(msg_overhead), tuple(mem_bw)

    def closed_form_times(
        self, multi: MultiTree, nbytes: float, collective: str, chunk_counts: Sequence[int]
    ) -> list[float]:
        """The closed form of :meth:`~treecoll.collectives.cost.CostModel.tree_times` (module docstring);
        kept for every model of this topology and ranks (a builder's choice, then the chunk count)."""
        links = self.links
        base = ("closed", plan_key(multi), nbytes, collective, self.msg_overhead)
        found = {k: links.times.get(base + (k,)) for k in chunk_counts}
        missing = [k for k, v in found.items() if v is None]
        if missing:
            for k, v in zip(missing, self.closed_form(multi, nbytes, collective, missing)):
                found[k] = links.remember(base + (k,), v)
        return [found[k] for k in chunk_counts]

    def closed_form(self, multi: MultiTree, nbytes: float, collective: str, chunk_counts: Sequence[int]) -> list[float]:
        """:meth:`closed_form_times` computed: on arrays a tree level at a time
        (:meth:`closed_form_arrays`) from :data:`ARRAY_CLOSED_FORM` ranks x trees, else rank by rank
        (:meth:`closed_form_ranks`); the same operations in the same order, so the same numbers."""
        if multi.size * len(multi.trees) >= ARRAY_CLOSED_FORM:
            return self.closed_form_arrays(multi, nbytes, collective, chunk_counts)
        return self.closed_form_ranks(multi, nbytes, collective, chunk_counts)

    def closed_form_arrays(
        self, multi: MultiTree, nbytes: float, collective: str, chunk_counts: Sequence[int]
    ) -> list[float]:
        """:meth:`closed_form_ranks` with every chunk count at once and every rank of one tree level
        at once (numpy arrays ranks x chunk counts): the ranks whose subtrees have one height go up
        together, those at one depth send down to their i-th child together."""
        phases = COLLECTIVE_PHASES[collective]
        up, down = "up" in phases, "down" in phases
        o, n = self.msg_overhead, multi.size
        ks = np.array(chunk_counts, dtype=np.int64)
        first = self.tree_rate_arrays(multi, up, down, True)
        steady = self.tree_rate_arrays(multi, up, down, False) if (ks > 1).any() else None
        mem_bw = np.array(self.mem_bw)
        red = np.array([reduce_time(b, 1.0) for b in self.mem_bw])  # combine seconds per byte
        shape = [_TreeArrays(t, self.links.latency) for t in multi.trees]
        busy = sum(s.own for s in shape)
        per_phase = int(up) + int(down)
        worst = np.zeros(len(ks))
        for ti, (share, s) in enumerate(zip(multi.shares, shape)):
            m = nbytes * share / ks  # bytes per chunk, per chunk count
            o_r = np.full(n, o)  # a leaf's cost for its send up; an inner rank's per message, interleaved
            o_r[s.inner] = o * (busy[s.inner] + s.own[s.inner]) / (2 * s.own[s.inner])
            total = np.zeros(len(ks))
            ups, downs = first[ti]
            if up:
                total += s.up_finish(ups, m, o_r, np.minimum(ks, LOOKAHEAD), red)
            if down:
                total += s.down_reach(downs, m, o_r).max(axis=0)
            stage = np.zeros(len(ks))
            if steady is not None and len(s.inner):
                slowest = s.slowest(*steady[ti])
                nk = s.nkids[s.inner]
                cpu = (s.own[s.inner] * per_phase * o)[:, None] + ((nk * red[s.inner])[:, None] * m if up else 0.0)
                stage = np.maximum(np.maximum(cpu.max(axis=0), (slowest[:, None] * m).max(axis=0)), 0.0)
                stage[ks == 1] = 0.0
            worst = np.maximum(worst, total + (ks - 1) * stage)
        if len(multi.trees) > 1:  # every rank issues the messages of all trees from one thread
            load = np.zeros((n, len(ks)))
            for share, s in zip(multi.shares, shape):
                m = nbytes * share / ks
                combine = 0.0
                if up:  # a rank's combines of m bytes (free where the GPU's memory bandwidth is unknown)
                    with np.errstate(divide="ignore"):
                        rt = np.where((mem_bw > 0)[:, None], 3.0 * m / (mem_bw * 1e9)[:, None], 0.0)
                    combine = s.nkids[:, None] * rt
                load += ks * ((s.own * per_phase * o)[:, None] + combine)
            worst = np.maximum(worst, load.max(axis=0))
        return worst.tolist()

    def closed_form_ranks(
        self, multi: MultiTree, nbytes: float, collective: str, chunk_counts: Sequence[int]
    ) -> list[float]:
        """:meth:`closed_form` rank by rank (small trees, and the reference of the array form)."""
        phases = COLLECTIVE_PHASES[collective]
        up, down = "up" in phases, "down" in phases
        o = self.msg_overhead
        prepared_by: dict[bool, list] = {}

        links = self.links
        pairs, pair = links.pairs, links.pair  # (i, j) -> its entry, latency first (made if missing)

        def prepare(by_level: bool) -> list:
            rate = self.tree_rates(multi, up, down, by_level)
            prepared = []
            msgs = [[len(t.children[r]) + (t.parents[r] >= 0) for r in range(t.size)] for t in multi.trees]
            busy = [sum(m[r] for m in msgs) for r in range(multi.size)]
            for t, share, own in zip(multi.trees, multi.shares, msgs):
                nodes = []
                for r in t.postorder():
                    kids = t.children[r]
                    if kids:
                        ups = (
                            [(c, (pairs.get((c, r)) or pair(c, r))[0], 1.0 / rate[(c, r)]) for c in kids]
                            if up
                            else None
                        )
                        downs = (
                            [(c, (pairs.get((r, c)) or pair(r, c))[0], 1.0 / rate[(r, c)]) for c in kids]
                            if down
                            else None
                        )
                        # an inner rank also issues its messages of the other trees, interleaved: on
                        # average half of them before a given message of this tree
                        nodes.append(
                            (r, ups, downs, reduce_time(self.mem_bw[r], 1.0), o * (busy[r] + own[r]) / (2 * own[r]))
                        )
                prepared.append((t, share, nodes))
            return prepared

        per_phase = int(up) + int(down)
        mem_bw = self.mem_bw
        # per tree, every rank's (children, messages per chunk): what its thread handles
        handled = [
            [(r, len(t.children[r]), (len(t.children[r]) + (t.parents[r] >= 0)) * per_phase) for r in range(t.size)]
            for t in multi.trees
        ]
        steady: list = []  # per tree, every inner rank's (children, messages, reduce s per byte, largest 1/rate)
        out = []
        for k in chunk_counts:
            worst = 0.0
            # the first chunk meets only its own tree level on the links; the pipeline's steady
            # state has every edge busy
            if True not in prepared_by:
                prepared_by[True] = prepare(True)
            if k > 1 and False not in prepared_by:
                prepared_by[False] = prepare(False)
                steady = [
                    [
                        (
                            len(ups or downs),
                            (len(ups or downs) + (t.parents[r] >= 0)) * per_phase,
                            red,
                            max(inv for _, _, inv in (ups or []) + (downs or [])),
                        )
                        for r, ups, downs, red, _ in nodes
                    ]
                    for t, _, nodes in prepared_by[False]
                ]
            prepared = prepared_by[True]
            for ti, (t, share, nodes) in enumerate(prepared):
                m = nbytes * share / k
                total = 0.0
                if up:
                    finish = [0.0] * t.size
                    sends = [o] * t.size  # a rank's cost for its send up
                    for r, ups, _, red, o_r in nodes:
                        arrive = max(finish[c] + sends[c] + lat + m * inv for c, lat, inv in ups)
                        finish[r] = max(len(ups) * min(k, LOOKAHEAD) * o_r, arrive) + len(ups) * red * m
                        sends[r] = o_r
                    total += finish[t.root]
                if down:
                    reach = [0.0] * t.size
                    for r, _, downs, _, o_r in reversed(nodes):
                        free = reach[r]  # the parent sends to its children one after another
                        for i, (c, lat, inv) in enumerate(downs):
                            free = max(free, reach[r] + (i + 1) * o_r) + m * inv
                            reach[c] = free + lat
                    total += max(reach)
                # steady state: per chunk a rank handles its messages one after another (CPU)
                # while its links carry the chunk
                stage = 0.0
                for c, msgs, red, slowest in steady[ti] if k > 1 else ():
                    cpu = msgs * o + (c * red * m if up else 0.0)
                    stage = max(stage, cpu, m * slowest)  # m * the largest 1/rate: the largest m / rate
                worst = max(worst, total + (k - 1) * stage)
            # every rank issues the messages of all trees from one thread: a multitree's trees
            # share each rank's time
            if len(prepared) > 1:
                busy = [0.0] * len(self.mem_bw)
                for (_, share, _), per_rank in zip(prepared, handled):
                    m = nbytes * share / k
                    for r, c, msgs in per_rank:
                        busy[r] += k * (msgs * o + (c * reduce_time(mem_bw[r], m) if up else 0.0))
                worst = max(worst, max(busy))
            out.append(worst)
        return out

    def tree_rates(
        self, multi: MultiTree, up: bool, down: bool, by_level: bool = False
    ) -> dict[tuple[int, int], float]:
        """Rates of the tree edges (both ways for an allreduce). All edges of all trees share the
        links at once (a pipeline in steady state), or with ``by_level`` only the edges that are
        busy at the same time with one chunk: going up, those whose child's subtree has the same
        height; going down, those whose child has the same depth."""
        key = (tuple(t.parents for t in multi.trees), up, down, by_level)  # rates depend on edges only

        def least() -> dict[tuple[int, int], float]:
            rate: dict[tuple[int, int], float] = {}
            for flows in _rate_groups(multi, up, down, by_level):
                for f, v in self.links.rates(list(flows)).items():
                    rate[f] = min(v, rate.get(f, v))
            return rate

        return self.links.kept_rates(key, least)

    def tree_rate_arrays(self, multi: MultiTree, up: bool, down: bool, by_level: bool) -> list[tuple]:
        """:meth:`tree_rates` per tree as arrays indexed by child rank: (child -> parent rates, parent ->
        child rates), B/s (the root's entry 0; None for a phase not run)."""
        key = ("arrays", tuple(t.parents for t in multi.trees), up, down, by_level)
        return self.links.kept_rates(key, lambda: self._tree_rate_arrays_of(multi, up, down, by_level))

    def _tree_rate_arrays_of(self, multi: MultiTree, up: bool, down: bool, by_level: bool) -> list[tuple]:
        """:meth:`tree_rate_arrays` computed."""
        n = multi.size
        codes, values = [], []
        for flows in _rate_groups(multi, up, down, by_level):
            got = self.links.rates_array(flows)
            values.append(np.array([got[f] for f in flows]) if isinstance(got, dict) else got)
            codes.append(np.array(flows, dtype=np.int64) @ np.array([n, 1], dtype=np.int64))
        # a flow busy in several groups gets its least rate
        known, where = np.unique(np.concatenate(codes), return_inverse=True)
        least = np.full(len(known), np.inf)
        np.minimum.at(least, where, np.concatenate(values))
        out = []
        for t in multi.trees:
            kids = np.flatnonzero(np.array(t.parents) >= 0)
            parents = np.array(t.parents, dtype=np.int64)[kids]
            ups = downs = None
            if up:
                ups = np.zeros(n)
                ups[kids] = least[np.searchsorted(known, kids * n + parents)]
            if down:
                downs = np.zeros(n)
                downs[kids] = least[np.searchsorted(known, parents * n + kids)]
            out.append((ups, downs))
        return out
