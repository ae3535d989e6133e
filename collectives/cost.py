"""Alpha-beta cost model over a :class:`~topo.Topology`, with link sharing.

Units: bytes in, seconds out (GB/s = 1e9 B/s, µs in topology latencies).

* Point to point: ``time = Path.lat [µs] * 1e-6 + n / (Path.bw * 1e9)``.
* Link sharing: transfers that run at the same time share each directed link
  they cross, each route getting its share of every link's bandwidth
  (:mod:`treecoll.collectives.link_sharing`). Without contention a transfer
  gets exactly ``Path.bw``.
* Reduction compute: combining n bytes reads two operands and writes one,
  ``3 n / mem_bw`` with the GPU's ``mem_bw`` (GB/s); free when the topology
  gives none (as in the simulator, :func:`treecoll.collectives.sim.result.mem_bw_of`).
* Per-message cost ``o``: treecoll's executor issues every send and receive
  from Python, one after another on each rank (``mode="executor"``, the
  default: ``o`` is the backend's :class:`~treecoll.collectives.executor_cost.ExecutorCost`
  at the group's process count, :func:`~treecoll.collectives.executor_cost.executor_cost`:
  fitted on gloo per count, and for NCCL the Python cost plus NCCL's published
  point-to-point time);
  ``mode="in-kernel"`` is the same tree inside the communication library
  (``o`` = :data:`MSG_OVERHEAD`).
* Trees in ``executor`` mode (:meth:`CostModel.tree_times`), as the executor runs them: the plan is
  compiled to the schedule the executor runs
  (:func:`~treecoll.collectives.compile.compile_plan`, the same chunks and
  step order) and stepped through as the flow simulation of the executor
  (:mod:`treecoll.collectives.sim.executor`, what the commands print) runs it:
  the same per-message cost, rendezvous, in-order connections, route
  latencies and link capacities
  (:func:`~treecoll.collectives.sim.estimate.estimate_executor_schedule`).
  Only link sharing is simpler (a subflow gets its tightest link's capacity
  divided by the subflows crossing it, no max-min redistribution), so the
  two cannot drift apart; a test holds them within 10% for every builder on
  every shipped topology at four sizes.
* Trees in ``in-kernel`` mode, and past :data:`STEP_BUDGET` steps (thousands of
  ranks): a closed form, pipelined, in the executor's step order. With ``K`` chunks of
  ``m = share * n / K`` bytes, the first chunk goes up the tree: a
  rank posts its children's receives first (``c * min(K, LOOKAHEAD) * o``),
  a child's chunk arrives ``o + lat + m / rate`` after the child finished
  (its send, the path, the bytes), and the rank combines (``reduce(m)`` per
  child); then down, a parent sending to its children one after another
  (the i-th after ``(i + 1) o`` and the earlier children's bytes). For this
  first chunk a link is shared only by the edges busy at the same time (up:
  children whose subtrees have the same height; down: the same depth and
  sibling position). The other chunks follow one *stage* apart, the larger
  of a rank's messages per chunk (``o`` each) plus its combines, and a
  link's time per chunk with every edge of every tree busy (steady state):
  ``time = L + (K - 1) * stage``. Several trees (a
  :class:`~collectives.tree.MultiTree`) run concurrently, but a rank issues
  the messages of all its trees from one thread: an inner rank pays, on
  average, half of its other trees' messages between two of this tree's, and
  no tree ends before every rank has issued all of its messages.
* Ring allreduce: ``2 (P - 1)`` steps of ``n / P`` bytes, all ring edges busy.
  ``rsag`` (direct reduce-scatter + all-gather): two rounds in which every
  rank exchanges ``n / P`` bytes with every other rank at once.

Without a topology, :func:`uniform_topology` stands in: P GPUs on one switch
(one port per rank), so fan-in still costs bandwidth.

>>> cm = CostModel(nranks=4)
>>> from treecoll.collectives.tree import Tree
>>> chain, star = Tree.from_parents([-1, 0, 1, 2]), Tree.from_parents([-1, 0, 0, 0])
>>> cm.tree_time(star, 8, "reduce") < cm.tree_time(chain, 8, "reduce")      # latency bound: shallow wins
True
>>> cm.tree_time(chain, 1 << 26, "reduce", nchunks=64) < cm.tree_time(star, 1 << 26, "reduce", nchunks=64)
True
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import networkx as nx
import numpy as np
from treecoll.topo import Path, Topology
from treecoll.topo.errors import CollectiveError, TreeError
from treecoll.topo.ranks import RanksArg

from .compile import LOOKAHEAD, _depth_and_height
from .executor_cost import executor_cost
from .in_network import nvls_domains
from .link_sharing import Links, links_of
from .placement import Placement, as_placement
from .schedule import Schedule
from .tree import MultiTree, Tree, as_multi

__all__ = [
    "CostModel",
    "uniform_topology",
    "placed_gpus",
    "nchunks_for",
    "p2p_time",
    "reduce_time",
    "MODES",
    "DEFAULT_MODE",
    "MSG_OVERHEAD",
    "UNIFORM_BW",
    "UNIFORM_LAT",
    "CHUNK_CANDIDATES",
    "STEP_BUDGET",
    "SEARCH_CHUNKS",
    "CHUNK_BYTES",
    "MAX_CHUNKS",
    "MIN_CHUNK_BYTES",
]

#: GB/s per direction of each rank's port in :func:`uniform_topology` (assumed: NCCL's NET_BW 12.0
#: for a 100 Gb/s NIC, src/graph/topo.h of NCCL 2.30.7).
UNIFORM_BW = 12.0
#: µs per link of :func:`uniform_topology` (assumed: NCCL's PCI hop latency 1.0 µs split over 2 links).
UNIFORM_LAT = 0.5
#: seconds a rank spends per message it sends or receives, serially (assumed: the order of NCCL's
#: NCCL_NET_OVERHEAD default of 1.0 µs on Intel x86, src/graph/tuning.cc of NCCL 2.30.7)
MSG_OVERHEAD = 1.0e-6
#: most steps (ranks x trees x chunks x steps per edge) of a schedule that :meth:`CostModel.tree_times`
#: steps through as the executor runs it; larger schedules get the closed form
STEP_BUDGET = 50_000
#: the chunk count whose schedule must be within :data:`STEP_BUDGET` for :meth:`CostModel.best_nchunks`
#: to step through its candidates (larger ones stop the search); else the closed form ranks them all
SEARCH_CHUNKS = 8
#: chunk counts tried by :meth:`CostModel.best_nchunks`
CHUNK_CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128)
#: :func:`nchunks_for` without a topology: target bytes per chunk ...
CHUNK_BYTES = 1 << 20
#: ... and most chunks per tree
MAX_CHUNKS = 16
#: smallest chunk :func:`nchunks_for` picks from the model: below it the per-message cost of the
#: transport (tens of µs with gloo, not in the model) outweighs pipelining (NCCL's own tree chunks
#: are of this order)
MIN_CHUNK_BYTES = 256 << 10

#: prediction modes of treecoll's own schedules: ``executor`` (as :mod:`treecoll.collectives.execute`
#: runs them: one isend/irecv from Python per message,
#: :class:`~treecoll.collectives.executor_cost.ExecutorCost` each) and ``in-kernel`` (the same tree run
#: inside the communication library: NCCL's per-message overhead and protocols)
MODES = ("executor", "in-kernel")
DEFAULT_MODE = "executor"

COLLECTIVE_PHASES = {"reduce": ("up",), "broadcast": ("down",), "allreduce": ("up", "down")}


def uniform_topology(nranks: int, *, bw: float = UNIFORM_BW, lat: float = UNIFORM_LAT) -> Topology:
    """P GPUs on one host joined by one switch (per-port ``bw`` GB/s, ``lat`` µs per link)."""
    if nranks < 1:
        raise TreeError(f"uniform topology: nranks expected >= 1, got {nranks}")
    g = nx.DiGraph()
    g.add_node("u/nvswitch0", kind="nvswitch", host="u")
    for i in range(nranks):
        gid = f"u/gpu{i}"
        g.add_node(gid, kind="gpu", host="u", index=i)
        for a, b in ((gid, "u/nvswitch0"), ("u/nvswitch0", gid)):
            g.add_edge(a, b, kind="nvlink", bw=float(bw), lat=float(lat), count=1)
    return Topology(g, name=f"uniform-{nranks}")


def p2p_time(topology: Topology, src: str, dst: str, nbytes: float) -> float:
    """Seconds to move ``nbytes`` from GPU ``src`` to GPU ``dst`` alone on the path."""
    p = topology.path(src, dst)
    return p.lat * 1e-6 + nbytes / (p.bw * 1e9)


def reduce_time(mem_bw_gbps: float, nbytes: float) -> float:
    """Seconds to combine two ``nbytes`` operands into one: read 2, write 1 (``mem_bw_gbps`` 0:
    unknown, free as in the simulator)."""
    return 3.0 * nbytes / (mem_bw_gbps * 1e9) if mem_bw_gbps > 0 else 0.0


def placed_gpus(placement: Placement) -> tuple[Topology, tuple[str, ...]]:
    """The topology and the GPU of every rank that the models use for ``placement``: its
    own, or :func:`uniform_topology` (P GPUs on one switch) when it has none."""
    if placement.topology is None:
        topology = uniform_topology(placement.nranks)
        return topology, topology.rank_gpus()
    return placement.topology, placement.gpus


def nchunks_for(
    plan: Tree | MultiTree,
    collective: str,
    nbytes: int,
    placement: Placement,
    *,
    compiler: Callable[..., Schedule] | None = None,
) -> int:
    """THE chunking policy: pipeline chunks per tree for a tree ``collective`` of ``nbytes``
    bytes on ``placement``. The executor and the simulator both call it, so what is
    simulated pipelines as what runs.

    With a topology: the count with the least predicted time under this model
    (:meth:`CostModel.best_nchunks` over :data:`CHUNK_CANDIDATES`: slow links want small
    chunks so that the pipeline fills fast, fast links fewer messages), no chunk below
    :data:`MIN_CHUNK_BYTES`. Without one (nothing to model): chunks of about
    :data:`CHUNK_BYTES`, at most :data:`MAX_CHUNKS`. Ring and rsag schedules take one
    chunk per segment and ``direct`` one chunk: they do not ask. ``compiler``: as
    :class:`CostModel` takes it.

    >>> from treecoll.collectives.placement import Placement
    >>> nchunks_for(Tree.from_parents([-1, 0, 1]), "allreduce", 8 << 20, Placement(ranks=3))
    8
    """
    if placement.topology is None:
        return max(1, min(MAX_CHUNKS, nbytes // CHUNK_BYTES))
    model = CostModel(placement, step_through=True, compiler=compiler)
    return model.best_nchunks(plan, nbytes, collective, min_chunk_bytes=MIN_CHUNK_BYTES)[0]


def _plan_key(multi: MultiTree) -> tuple:
    """What a tree time depends on of a plan: every tree's parents and child order, the shares."""
    return tuple((t.parents, t.children) for t in multi.trees), multi.shares


def _rate_groups(multi: MultiTree, up: bool, down: bool, by_level: bool) -> list[list[tuple[int, int]]]:
    """The tree edges (rank i -> rank j) busy at once (:meth:`CostModel._tree_rates`): all of them, or
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
    """One tree's ranks as arrays for :meth:`CostModel._closed_form_arrays`: children per rank
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
        :meth:`CostModel._closed_form_ranks`; ``rate``: B/s of every rank's edge to its parent;
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
        :meth:`CostModel._closed_form_ranks`; ``rate``: B/s of every rank's edge from its parent): a
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


#: ranks x trees from which :meth:`CostModel._closed_form` works on arrays, a tree level at a time
ARRAY_CLOSED_FORM = 256


class CostModel:
    """Predicts collective times for the group ranks of a placement.

    Parameters: ``placement`` (a :class:`~treecoll.collectives.placement.Placement`,
    or a Topology / None with ``ranks`` and ``nranks`` as
    :func:`~treecoll.collectives.placement.as_placement` takes them; without a
    topology: :func:`uniform_topology`), ``step_overhead`` (seconds added to every message's latency, e.g. a
    software transport's fixed cost; 0 by default), ``mode`` (:data:`MODES`: ``executor``, the
    default, predicts treecoll's executor, every message costing its rank the backend's
    :attr:`~treecoll.collectives.executor_cost.ExecutorCost.step_s`; ``in-kernel`` the same tree inside the
    communication library, :data:`MSG_OVERHEAD` per message), ``backend`` (``gloo`` or ``nccl``; None:
    :func:`~treecoll.collectives.executor_cost.backend_of`), ``msg_overhead`` (seconds a rank spends per message
    it handles, serially; None: what ``mode`` says), ``chunk_candidates`` (chunk counts
    :meth:`best_nchunks` tries by default), ``step_through`` (trees in ``executor`` mode: step
    through the compiled schedule as the executor simulation does, what the planner's chunk and
    backend choices use; False: the closed form, cheaper, what ``auto``'s tree search scores),
    ``compiler`` (what compiles a plan to step through, called as
    ``compiler(plan, collective, nchunks, root=root)``; default
    :func:`~treecoll.collectives.compile.compile_plan`; the planner passes its cached one, so the
    schedule the chosen count steps through is the one the executor gets).

    >>> from treecoll.collectives.executor_cost import EXECUTOR_COSTS
    >>> CostModel(nranks=4).msg_overhead == EXECUTOR_COSTS["gloo"].for_nranks(4).step_s
    True
    >>> CostModel(nranks=4, mode="in-kernel").msg_overhead == MSG_OVERHEAD
    True
    """

    def __init__(
        self,
        placement: Placement | Topology | None = None,
        ranks: RanksArg = None,
        *,
        nranks: int | None = None,
        step_overhead: float = 0.0,
        msg_overhead: float | None = None,
        mode: str = DEFAULT_MODE,
        backend: str | None = None,
        chunk_candidates: Sequence[int] = CHUNK_CANDIDATES,
        step_through: bool = False,
        compiler: Callable[..., Schedule] | None = None,
    ) -> None:
        if mode not in MODES:
            raise TreeError(f"cost model: mode expected one of {list(MODES)}, got {mode!r}")
        self.placement = as_placement(placement, ranks, nranks=nranks, what="cost model")
        self.mode = mode
        self.executor = executor_cost(self.placement, backend)
        self.backend = self.executor.backend
        if msg_overhead is None:
            msg_overhead = self.executor.step_s if mode == "executor" else MSG_OVERHEAD
        self.msg_overhead = float(msg_overhead)
        self.chunk_candidates = tuple(chunk_candidates)
        self.step_through = bool(step_through)
        self._compiler = compiler
        self.topology, self.gpus = placed_gpus(self.placement)
        self.nranks = len(self.gpus)
        self.step_overhead = float(step_overhead)
        self._links: Links | None = None  # found on first use (:meth:`_shared`)
        node = self.topology.graph._node  # networkx's node dict: its view costs more per GPU than the work
        self._mem_bw = tuple(float(node[x].get("mem_bw") or 0.0) for x in self.gpus)

    # ------------------------------------------------------------------ pairs and flows
    def path(self, i: int, j: int) -> Path:
        """The topology path between group ranks i and j."""
        return self.topology.path(self.gpus[i], self.gpus[j])

    def _shared(self) -> Links:
        """The routes and link rates of this model's topology and ranks, shared with every other
        model of them (:func:`links_of`)."""
        links = self._links
        if links is None:
            links = self._links = links_of(self.placement, self.topology, self.gpus, self.step_overhead)
        return links

    def _pair(self, i: int, j: int) -> tuple:
        """(latency s with :attr:`step_overhead`, link ids, route share per link, links per route,
        path bandwidth GB/s) of the path from rank i to rank j."""
        pairs = self._shared().pairs
        hit = pairs.get((i, j))
        return hit if hit is not None else self._shared().pair(i, j)

    def p2p(self, i: int, j: int, nbytes: float) -> float:
        """Seconds for ``nbytes`` from rank i to rank j alone."""
        pair = self._pair(i, j)
        return pair[0] + nbytes / (pair[4] * 1e9)

    def loads(self, flows: Iterable[tuple[int, int]]) -> dict:
        """Load (sum of route shares) on each directed link ``(node, node)`` for concurrent flows (i, j)."""
        links = self._shared()
        load: dict = defaultdict(float)
        for i, j in flows:
            _, ids, shares, _, _ = self._pair(i, j)
            for lk, share in zip(ids, shares):
                load[links.ends[lk]] += share
        return load

    def rates(self, flows: Sequence[tuple[int, int]]) -> dict[tuple[int, int], float]:
        """Bytes/s of each of the concurrent flows (duplicates count as separate flows)."""
        return self._shared().rates(list(flows))

    def _memo_rates(self, key: tuple, flows: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
        """:meth:`rates` of ``flows``, kept under ``key`` (which must name the flows) for every model
        of this topology and ranks."""
        return self._shared().kept_rates(key, lambda: self.rates(flows))

    def reduce_cost(self, rank: int, nbytes: float) -> float:
        """Seconds for rank ``rank`` to combine two ``nbytes`` operands."""
        return reduce_time(self._mem_bw[rank], nbytes)

    # ------------------------------------------------------------------ trees
    def tree_time(
        self, plan: Tree | MultiTree, nbytes: float, collective: str = "allreduce", nchunks: int = 1
    ) -> float:
        """Predicted seconds of a (multi)tree ``collective`` on ``nbytes`` split in ``nchunks``
        chunks per tree (see the module docstring for the model)."""
        return self.tree_times(plan, nbytes, collective, (nchunks,))[0]

    def tree_times(
        self, plan: Tree | MultiTree, nbytes: float, collective: str = "allreduce", chunk_counts: Sequence[int] = (1,)
    ) -> list[float]:
        """:meth:`tree_time` for several chunk counts: the compiled schedule stepped through as the
        executor runs it (:func:`~treecoll.collectives.sim.estimate.estimate_executor_schedule`),
        or, past :data:`STEP_BUDGET` steps, the closed form (module docstring)."""
        multi = self._checked(plan, collective, chunk_counts)
        big = [k for k in chunk_counts if not self.steps_through(multi, collective, k)]
        closed = dict(zip(big, self._closed_form_times(multi, nbytes, collective, big))) if big else {}
        return [closed[k] if k in closed else self._stepped_time(plan, nbytes, collective, k) for k in chunk_counts]

    def _checked(self, plan: Tree | MultiTree, collective: str, chunk_counts: Sequence[int]) -> MultiTree:
        """``plan`` as a MultiTree, once its size, the collective and the chunk counts are valid."""
        multi = as_multi(plan)
        if multi.size != self.nranks:
            raise TreeError(f"cost: tree has {multi.size} ranks, the model {self.nranks}")
        if collective not in COLLECTIVE_PHASES:
            raise TreeError(f"cost: collective expected one of {list(COLLECTIVE_PHASES)}, got {collective!r}")
        if any(k < 1 for k in chunk_counts):
            raise TreeError(f"cost: nchunks expected >= 1, got {list(chunk_counts)}")
        return multi

    def steps_through(self, plan: Tree | MultiTree, collective: str, nchunks: int) -> bool:
        """Whether :meth:`tree_times` steps through the schedule of ``plan`` with ``nchunks`` chunks
        per tree as the executor runs it (``step_through`` set, ``executor`` mode, at most
        :data:`STEP_BUDGET` steps) rather than use the closed form (``in-kernel`` mode: the tree
        inside the communication library, no executor to step through)."""
        if not self.step_through or self.mode != "executor":
            return False
        multi = as_multi(plan)
        per_edge = 5 if collective == "allreduce" else 3  # send, recv (and reduce) per edge and phase
        return len(multi) * nchunks * per_edge * (multi.size - 1) <= STEP_BUDGET

    def _stepped_time(self, plan: Tree | MultiTree, nbytes: float, collective: str, k: int) -> float:
        from .compile import compile_plan
        from .sim.estimate import estimate_executor_schedule

        multi = as_multi(plan)
        key = ("stepped", _plan_key(multi), nbytes, collective, self.msg_overhead, k)
        links = self._shared()
        hit = links.times.get(key)
        if hit is None:
            # a reduce or broadcast of trees with different roots ends (starts) at the first tree's root
            root = multi.roots[0] if collective != "allreduce" and len(set(multi.roots)) > 1 else None
            sched = (self._compiler or compile_plan)(plan, collective, k, root=root)
            try:
                hit = estimate_executor_schedule(
                    self._network(),
                    sched,
                    sched.chunk_bytes(int(round(nbytes))),
                    self.gpus,
                    [b * 1e9 for b in self._mem_bw],
                    step_cost=self.msg_overhead,
                    extra_lat=self.step_overhead,
                )
            except CollectiveError:  # the executor would wait forever (in-order connections): never pick it
                hit = math.inf
            links.remember(key, hit)
        return hit

    def _network(self) -> Any:
        """The simulator's view of the links: a :class:`~treecoll.collectives.sim.engine.Network` of the
        ``ideal`` profile (the topology as written, the NIC's own latency on its routes)."""
        links = self._shared()
        if links.net is None:
            from .sim.engine import Network
            from .sim.profiles import get_profile

            links.net = Network(links.topology, get_profile("ideal"))
        return links.net

    def cpu_bound(self, plan: Tree | MultiTree, nbytes: float, collective: str, nchunks: int) -> float:
        """Seconds the busiest rank's one thread spends on ``plan`` with ``nchunks`` chunks per tree:
        :attr:`msg_overhead` per send and receive and its reduces, a lower bound on the time."""
        multi = as_multi(plan)
        phases = COLLECTIVE_PHASES[collective]
        busy = [0.0] * multi.size
        for t, share in zip(multi.trees, multi.shares):
            for r in range(t.size):
                c = len(t.children[r])
                msgs = (c + (t.parents[r] >= 0)) * len(phases)
                red = c * self.reduce_cost(r, nbytes * share) if "up" in phases else 0.0
                busy[r] += nchunks * msgs * self.msg_overhead + red
        return max(busy)

    def _closed_form_times(
        self, multi: MultiTree, nbytes: float, collective: str, chunk_counts: Sequence[int]
    ) -> list[float]:
        """The closed form of :meth:`tree_times` (module docstring), for schedules past the budget;
        kept for every model of this topology and ranks (a builder's choice, then the chunk count)."""
        links = self._shared()
        base = ("closed", _plan_key(multi), nbytes, collective, self.msg_overhead)
        found = {k: links.times.get(base + (k,)) for k in chunk_counts}
        missing = [k for k, v in found.items() if v is None]
        if missing:
            for k, v in zip(missing, self._closed_form(multi, nbytes, collective, missing)):
                found[k] = links.remember(base + (k,), v)
        return [found[k] for k in chunk_counts]

    def _closed_form(
        self, multi: MultiTree, nbytes: float, collective: str, chunk_counts: Sequence[int]
    ) -> list[float]:
        """:meth:`_closed_form_times` computed: on arrays a tree level at a time
        (:meth:`_closed_form_arrays`) from :data:`ARRAY_CLOSED_FORM` ranks x trees, else rank by rank
        (:meth:`_closed_form_ranks`); the same operations in the same order, so the same numbers."""
        if multi.size * len(multi.trees) >= ARRAY_CLOSED_FORM:
            return self._closed_form_arrays(multi, nbytes, collective, chunk_counts)
        return self._closed_form_ranks(multi, nbytes, collective, chunk_counts)

    def _closed_form_arrays(
        self, multi: MultiTree, nbytes: float, collective: str, chunk_counts: Sequence[int]
    ) -> list[float]:
        """:meth:`_closed_form_ranks` with every chunk count at once and every rank of one tree level
        at once (numpy arrays ranks x chunk counts): the ranks whose subtrees have one height go up
        together, those at one depth send down to their i-th child together."""
        phases = COLLECTIVE_PHASES[collective]
        up, down = "up" in phases, "down" in phases
        o, n = self.msg_overhead, multi.size
        ks = np.array(chunk_counts, dtype=np.int64)
        first = self._tree_rate_arrays(multi, up, down, True)
        steady = self._tree_rate_arrays(multi, up, down, False) if (ks > 1).any() else None
        mem_bw = np.array(self._mem_bw)
        red = np.array([reduce_time(b, 1.0) for b in self._mem_bw])  # combine seconds per byte
        shape = [_TreeArrays(t, self._shared().latency) for t in multi.trees]
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

    def _closed_form_ranks(
        self, multi: MultiTree, nbytes: float, collective: str, chunk_counts: Sequence[int]
    ) -> list[float]:
        """:meth:`_closed_form` rank by rank (small trees, and the reference of the array form)."""
        phases = COLLECTIVE_PHASES[collective]
        up, down = "up" in phases, "down" in phases
        o = self.msg_overhead
        prepared_by: dict[bool, list] = {}

        links = self._shared()
        pairs, pair = links.pairs, links.pair  # (i, j) -> its entry, latency first (made if missing)

        def prepare(by_level: bool) -> list:
            rate = self._tree_rates(multi, up, down, by_level)
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
                            (r, ups, downs, reduce_time(self._mem_bw[r], 1.0), o * (busy[r] + own[r]) / (2 * own[r]))
                        )
                prepared.append((t, share, nodes))
            return prepared

        per_phase = int(up) + int(down)
        mem_bw = self._mem_bw
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
                busy = [0.0] * self.nranks
                for (_, share, _), per_rank in zip(prepared, handled):
                    m = nbytes * share / k
                    for r, c, msgs in per_rank:
                        busy[r] += k * (msgs * o + (c * reduce_time(mem_bw[r], m) if up else 0.0))
                worst = max(worst, max(busy))
            out.append(worst)
        return out

    def _tree_rates(
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
                for f, v in self.rates(flows).items():
                    rate[f] = min(v, rate.get(f, v))
            return rate

        return self._shared().kept_rates(key, least)

    def _tree_rate_arrays(self, multi: MultiTree, up: bool, down: bool, by_level: bool) -> list[tuple]:
        """:meth:`_tree_rates` per tree as arrays indexed by child rank: (child -> parent rates, parent ->
        child rates), B/s (the root's entry 0; None for a phase not run)."""
        key = ("arrays", tuple(t.parents for t in multi.trees), up, down, by_level)
        return self._shared().kept_rates(key, lambda: self._tree_rate_arrays_of(multi, up, down, by_level))

    def _tree_rate_arrays_of(self, multi: MultiTree, up: bool, down: bool, by_level: bool) -> list[tuple]:
        """:meth:`_tree_rate_arrays` computed."""
        n = multi.size
        codes, values = [], []
        for flows in _rate_groups(multi, up, down, by_level):
            got = self._shared().rates_array(flows)
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

    def order_children(
        self, plan: Tree | MultiTree, nbytes: float, collective: str = "allreduce", nchunks: int | None = None
    ) -> Tree | MultiTree:
        """``plan`` with every rank's children reordered so its broadcast phase ends first.

        A rank forwards a chunk to its children one after another (each send costs
        it the overhead ``o``), so the i-th child (from 0) holds it after
        ``(i + 1) o + lat + m / rate`` and its subtree ``tail`` later. Sending to the
        child with the longest ``lat + m / rate + tail`` first minimises the last
        arrival (Jackson's rule; exact here because every send costs the same ``o``).
        Ties keep the given order. The reduce phase does not depend on child order
        under this model, but a non-commutative reduction does: reorder only trees
        reduced with a commutative operator. ``nchunks`` defaults to the best count.

        >>> cm = CostModel(nranks=4)
        >>> t = Tree.from_children([[1, 2], [], [3], []])
        >>> cm.order_children(t, 8).children[0]       # the deeper subtree first
        (2, 1)
        """
        multi = as_multi(plan)
        if "down" not in COLLECTIVE_PHASES.get(collective, ()):
            return plan
        k = nchunks or self.best_nchunks(plan, nbytes, collective)[0]
        rate = self._tree_rates(multi, "up" in COLLECTIVE_PHASES[collective], True)
        o = self.msg_overhead
        trees = []
        for t, share in zip(multi.trees, multi.shares):
            m = nbytes * share / k
            tail = [0.0] * t.size
            kids: list[tuple[int, ...]] = [()] * t.size
            for r in t.postorder():
                lead = {c: self._pair(r, c)[0] + m / rate[(r, c)] + tail[c] for c in t.children[r]}
                kids[r] = tuple(sorted(t.children[r], key=lambda c: -lead[c]))
                tail[r] = max(((i + 1) * o + lead[c] for i, c in enumerate(kids[r])), default=0.0)
            trees.append(Tree(t.parents, tuple(kids), name=t.name))
        if isinstance(plan, Tree):
            return trees[0]
        return MultiTree(tuple(trees), multi.shares, name=plan.name)

    def best_ordered(
        self,
        plan: Tree | MultiTree,
        nbytes: float,
        collective: str = "allreduce",
    ) -> tuple[Tree | MultiTree, int, float]:
        """(plan with its best child order, nchunks, seconds): for every candidate chunk
        count, the children ordered by :meth:`order_children` for that count (stepping
        through schedules: or as given, when that is faster; there counts whose
        :meth:`cpu_bound` exceeds the best time found are not tried); the least time wins
        (ties: fewer chunks, the reordered plan). The least predicted time of ``plan``'s
        edges over every child order and chunk count."""
        best = None
        stepped = self.steps_through(plan, collective, SEARCH_CHUNKS)
        if not stepped:
            return self._best_ordered_closed(plan, nbytes, collective)
        for k in sorted(self._chunk_counts(nbytes)):
            if best is not None and self._search_ends(plan, nbytes, collective, k, best[2]):
                break
            ordered = self.order_children(plan, nbytes, collective, k)
            # the order rule is exact in the closed form, a heuristic for the stepped schedule
            for p in (ordered, plan) if stepped and ordered != plan else (ordered,):
                secs = self._search_time(p, nbytes, collective, k, stepped)
                if best is None or secs < best[2]:
                    best = (p, k, secs)
        return best

    def _best_ordered_closed(
        self, plan: Tree | MultiTree, nbytes: float, collective: str
    ) -> tuple[Tree | MultiTree, int, float]:
        """:meth:`best_ordered` all in the closed form: the counts whose child orders are the same
        priced in one call (its per-rank tables built once)."""
        ks = sorted(self._chunk_counts(nbytes))
        ordered = {k: self.order_children(plan, nbytes, collective, k) for k in ks}
        same: dict[tuple, list[int]] = {}
        for k in ks:
            same.setdefault(_plan_key(as_multi(ordered[k])), []).append(k)
        secs: dict[int, float] = {}
        for group in same.values():
            multi = self._checked(ordered[group[0]], collective, group)
            secs.update(zip(group, self._closed_form_times(multi, nbytes, collective, group)))
        best = None
        for k in ks:
            if best is None or secs[k] < best[2]:
                best = (ordered[k], k, secs[k])
        return best

    def _search_time(self, plan: Tree | MultiTree, nbytes: float, collective: str, k: int, stepped: bool) -> float:
        """:meth:`tree_time` in a search: stepped through, or all in the closed form."""
        if stepped:
            return self.tree_time(plan, nbytes, collective, k)
        return self._closed_form_times(self._checked(plan, collective, (k,)), nbytes, collective, (k,))[0]

    def _search_ends(self, plan: Tree | MultiTree, nbytes: float, collective: str, k: int, best: float) -> bool:
        """Whether a search over chunk counts stepping through schedules stops before ``k``: a
        rank's thread handles every message and reduce of its own, so once :meth:`cpu_bound`
        reaches the best time found no larger count wins (the bound grows with ``k``); and a
        schedule past :data:`STEP_BUDGET` steps is not stepped through (nor compared with ones that are)."""
        return self.cpu_bound(plan, nbytes, collective, k) >= best or not self.steps_through(plan, collective, k)

    def _chunk_counts(
        self, nbytes: float, candidates: Sequence[int] | None = None, min_chunk_bytes: int = 4096
    ) -> list[int]:
        ks = [
            k
            for k in (self.chunk_candidates if candidates is None else candidates)
            if k == 1 or nbytes / k >= min_chunk_bytes
        ]
        return ks or [1]

    def best_nchunks(
        self,
        plan: Tree | MultiTree,
        nbytes: float,
        collective: str = "allreduce",
        *,
        candidates: Sequence[int] | None = None,
        min_chunk_bytes: int = 4096,
    ) -> tuple[int, float]:
        """(nchunks, seconds) with the least predicted time; chunks stay >= ``min_chunk_bytes``.
        Past the step budget every count's closed form comes from one call, which builds its
        per-rank tables (latencies and inverse rates of every tree edge) once."""
        best: tuple[int, float] | None = None
        stepped = self.steps_through(plan, collective, SEARCH_CHUNKS)
        ks = sorted(self._chunk_counts(nbytes, candidates, min_chunk_bytes))
        if not stepped:
            times = self._closed_form_times(self._checked(plan, collective, ks), nbytes, collective, ks)
            i = min(range(len(ks)), key=lambda j: (times[j], j))  # ties: fewer chunks
            return ks[i], times[i]
        for k in ks:
            if best is not None and stepped and self._search_ends(plan, nbytes, collective, k, best[1]):
                break
            secs = self._search_time(plan, nbytes, collective, k, stepped)
            if best is None or secs < best[1]:
                best = (k, secs)
        return best

    # ------------------------------------------------------------------ ring and rsag
    def ring_time(self, nbytes: float, order: Sequence[int] | None = None, *, overhead: float | None = None) -> float:
        """Ring allreduce (reduce-scatter then all-gather) along ``order`` (default 0..P-1); every
        step costs a rank ``2 overhead`` (a send and a receive; default :attr:`msg_overhead`)."""
        o = self.msg_overhead if overhead is None else overhead
        order = list(range(self.nranks)) if order is None else list(order)
        n = len(order)
        if n == 1:
            return 0.0
        flows = [(order[i], order[(i + 1) % n]) for i in range(n)]
        rate = self._memo_rates(("ring", tuple(order)), flows)
        m = nbytes / n
        step = max(self._pair(*f)[0] + m / rate[f] for f in flows) + 2 * o
        red = max(self.reduce_cost(r, m) for r in order)
        return (n - 1) * (step + red) + (n - 1) * step

    def rsag_time(self, nbytes: float) -> float:
        """Direct reduce-scatter + all-gather: every rank exchanges ``n / P`` with every other."""
        n = self.nranks
        if n == 1:
            return 0.0
        flows = [(i, j) for i in range(n) for j in range(n) if i != j]
        rate = self._memo_rates(("rsag",), flows)
        m = nbytes / n
        step = max(self._pair(*f)[0] + m / rate[f] for f in flows) + 2 * (n - 1) * self.msg_overhead
        red = max((n - 1) * self.reduce_cost(r, m) for r in range(n))
        return 2 * step + red

    # ------------------------------------------------------------------ bounds
    def in_network_reduction(self) -> bool:
        """True when the switches can reduce for these GPUs: NVLink SHARP, where NCCL offers
        its NVLS algorithm (:func:`treecoll.collectives.in_network.nvls_domains`)."""
        try:
            nvls_domains(self.topology, self.gpus)
        except TreeError:
            return False
        return True

    def lower_bound(self, nbytes: float, collective: str = "allreduce", *, in_network: bool | None = None) -> float:
        """A lower bound (seconds) on the time of any algorithm for ``collective`` on
        ``nbytes``: the largest of the bounds below, each valid for every algorithm
        (point to point, trees, rings, and reductions inside the switches).

        * GPU port (allreduce). With point-to-point transfers only, every rank
          sends and receives at least ``2 (P-1)/P n`` bytes (Patarasuk & Yuan,
          "Bandwidth optimal all-reduce algorithms for clusters of workstations",
          J. Parallel Distrib. Comput. 69(2), 2009), through its own links
          (their summed bandwidth ``B``, the smaller direction): ``2 (P-1)/P n / B``.
          When the switches reduce (:meth:`in_network_reduction`: NVLink SHARP,
          NCCL's NVLS, NCCL 2.17+; SHARP in InfiniBand switches, Graham et al.,
          "Scalable Hierarchical Aggregation Protocol (SHArP)", COMHPC 2016), a
          GPU only has to send its ``n`` bytes once and receive the ``n``-byte
          result once (NCCL's own count for CollNet: ``S`` per GPU across nodes,
          https://github.com/NVIDIA/nccl/issues/457): ``n / B``. Reduce and broadcast: the root
          receives (sends) ``n`` bytes: ``n / B``. ``in_network`` False gives the
          bound of point-to-point algorithms only (trees and rings, what the
          executor runs) where the switches could reduce; None detects it.
        * Host cut (several hosts): each host's inputs must leave it and the
          result enter it, ``n`` bytes each way, however the network reduces,
          through the links that cross the host's boundary (its NICs' network
          links; NVLink to switches outside the host in a rack-scale NVLink
          domain): ``n / (their summed bandwidth, the smaller direction)``.
        * Latency: rank 0's data must reach every rank: the largest
          shortest-path latency (over the graph's links) from rank 0, plus one
          message overhead ``o`` (:data:`MSG_OVERHEAD`, or less: a bound on the backend's
          own collectives too, which skip the executor's per-message cost); and, as a rank handles one message per ``o``
          (so holds at most ``2^t`` combined values after ``t o``),
          ``o * ceil(log2 P)``.

        >>> cm = CostModel(nranks=4)       # 4 ports of 12 GB/s on one (NVLS-capable) switch
        >>> cm.in_network_reduction(), cm.lower_bound(12e9)      # seconds: n / 12 GB/s
        (True, 1.0)
        >>> cm.lower_bound(12e9, in_network=False)              # trees, rings: 2 (P-1)/P n / 12 GB/s
        1.5
        """
        n = self.nranks
        if n == 1:
            return 0.0
        g = self.topology.graph
        out_bw = [sum(g.edges[e]["bw"] for e in g.out_edges(x)) for x in self.gpus]
        in_bw = [sum(g.edges[e]["bw"] for e in g.in_edges(x)) for x in self.gpus]
        if in_network is None:
            in_network = self.in_network_reduction()
        if collective == "allreduce" and not in_network:
            vol = 2 * (n - 1) / n * nbytes
        else:
            vol = nbytes
        bw_lb = max(vol / (min(out_bw[i], in_bw[i]) * 1e9) for i in range(n))
        hosts = {self.topology.host_of(x) for x in self.gpus}
        if len(hosts) > 1:
            out_cut: dict = defaultdict(float)
            in_cut: dict = defaultdict(float)
            for u, v, d in g.edges(data=True):
                hu, hv = g.nodes[u].get("host"), g.nodes[v].get("host")
                if hu != hv:
                    out_cut[hu] += d["bw"]
                    in_cut[hv] += d["bw"]
            for h in hosts:
                cut = min(out_cut[h], in_cut[h])
                if cut > 0:
                    bw_lb = max(bw_lb, nbytes / (cut * 1e9))
        dist = nx.single_source_dijkstra_path_length(g, self.gpus[0], weight=lambda u, v, d: d.get("lat", 0.0))
        o = min(self.msg_overhead, MSG_OVERHEAD)  # the communication library's own collectives pay less
        lat = max(dist.get(x, 0.0) for x in self.gpus) * 1e-6 + o
        # a rank merges at most one more message per overhead o: after t*o it holds <= 2^t values
        lat = max(lat, o * math.ceil(math.log2(n)))
        return max(bw_lb, lat) if math.isfinite(bw_lb) else lat
