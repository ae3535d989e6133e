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
  from Python, one after another on each rank: ``o`` is the backend's
  :class:`~treecoll.collectives.executor_cost.ExecutorCost` at the group's process count
  (:func:`~treecoll.collectives.executor_cost.executor_cost`: fitted on gloo per count, and for NCCL the
  Python cost plus NCCL's published point-to-point time), or ``msg_overhead`` when given. The model
  prices what treecoll runs; the same tree run inside the communication library (NCCL's protocols and
  pipelining, the ``in-kernel`` mode of :data:`~treecoll.collectives.executor_cost.MODES`) is predicted
  by the simulator only (:func:`treecoll.collectives.sim.executor.predict_tree`).
* Trees (:meth:`CostModel.tree_times`) with ``step_through``, as the executor runs them: the plan is
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
* Trees without ``step_through`` (what ``auto``'s search scores), and past :data:`STEP_BUDGET` steps
  (thousands of ranks): a closed form, pipelined, in the executor's step order, every edge at
  its rate under link sharing (:mod:`treecoll.collectives.tree_timing`).
* Ring allreduce: ``2 (P - 1)`` steps of ``n / P`` bytes, all ring edges busy.
  ``rsag`` (direct reduce-scatter + all-gather): two rounds in which every
  rank exchanges ``n / P`` bytes with every other rank at once.
* Chunk counts (:meth:`CostModel.best_nchunks`, and :func:`nchunks_for`, the
  policy the executor and the simulator follow) and child orders
  (:meth:`CostModel.best_ordered`): the least predicted time over
  :data:`CHUNK_CANDIDATES` (:mod:`treecoll.collectives.chunk_search`), each
  rank's children in Jackson's order (:mod:`treecoll.collectives.child_order`).
* Lower bounds on any algorithm's time (:meth:`CostModel.lower_bound`: GPU
  ports, host cuts, latency; :mod:`treecoll.collectives.bounds`).

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
from treecoll.topo import Path, Topology
from treecoll.topo.errors import CollectiveError, TreeError
from treecoll.topo.ranks import RanksArg

from . import bounds
from .child_order import order_children
from .chunk_search import CHUNK_CANDIDATES, SEARCH_CHUNKS, ChunkSearch
from .executor_cost import executor_cost
from .link_sharing import Links, links_of
from .placement import Placement, as_placement
from .schedule import Schedule
from .tree import MultiTree, Tree, as_multi
from .tree_timing import COLLECTIVE_PHASES, TreeTiming, plan_key, reduce_time

__all__ = [
    "CostModel",
    "uniform_topology",
    "placed_gpus",
    "nchunks_for",
    "p2p_time",
    "reduce_time",
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
#: :func:`nchunks_for` without a topology: target bytes per chunk ...
CHUNK_BYTES = 1 << 20
#: ... and most chunks per tree
MAX_CHUNKS = 16
#: smallest chunk :func:`nchunks_for` picks from the model: below it the per-message cost of the
#: transport (tens of µs with gloo, not in the model) outweighs pipelining (NCCL's own tree chunks
#: are of this order)
MIN_CHUNK_BYTES = 256 << 10


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


class CostModel(ChunkSearch):
    """Predicts collective times for the group ranks of a placement.

    Parameters: ``placement`` (a :class:`~treecoll.collectives.placement.Placement`,
    or a Topology / None with ``ranks`` and ``nranks`` as
    :func:`~treecoll.collectives.placement.as_placement` takes them; without a
    topology: :func:`uniform_topology`), ``step_overhead`` (seconds added to every message's latency, e.g. a
    software transport's fixed cost; 0 by default), ``backend`` (``gloo`` or ``nccl``; None:
    :func:`~treecoll.collectives.executor_cost.backend_of`), ``msg_overhead`` (seconds a rank spends per message
    it handles, serially; None: the backend's
    :attr:`~treecoll.collectives.executor_cost.ExecutorCost.step_s`, as treecoll's executor pays it;
    :data:`MSG_OVERHEAD`: the trees' links without the executor's cost), ``chunk_candidates`` (chunk counts
    :meth:`best_nchunks` tries by default), ``step_through`` (trees: step
    through the compiled schedule as the executor simulation does, what the planner's chunk and
    backend choices use; False: the closed form, cheaper, what ``auto``'s tree search scores),
    ``compiler`` (what compiles a plan to step through, called as
    ``compiler(plan, collective, nchunks, root=root)``; default
    :func:`~treecoll.collectives.compile.compile_plan`; the planner passes its cached one, so the
    schedule the chosen count steps through is the one the executor gets).

    >>> from treecoll.collectives.executor_cost import EXECUTOR_COSTS
    >>> CostModel(nranks=4).msg_overhead == EXECUTOR_COSTS["gloo"].for_nranks(4).step_s
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
        backend: str | None = None,
        chunk_candidates: Sequence[int] = CHUNK_CANDIDATES,
        step_through: bool = False,
        compiler: Callable[..., Schedule] | None = None,
    ) -> None:
        self.placement = as_placement(placement, ranks, nranks=nranks, what="cost model")
        self.executor = executor_cost(self.placement, backend)
        self.backend = self.executor.backend
        if msg_overhead is None:
            msg_overhead = self.executor.step_s
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
        model of them (:func:`~treecoll.collectives.link_sharing.links_of`)."""
        links = self._links
        if links is None:
            links = self._links = links_of(self.placement, self.topology, self.gpus, self.step_overhead)
        return links

    def _timing(self) -> TreeTiming:
        """The closed form of this model's tree times (:mod:`treecoll.collectives.tree_timing`)."""
        return TreeTiming(self._shared(), self.msg_overhead, self._mem_bw)

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
        or, past :data:`STEP_BUDGET` steps, the closed form (:mod:`treecoll.collectives.tree_timing`)."""
        multi = self._checked(plan, collective, chunk_counts)
        big = [k for k in chunk_counts if not self.steps_through(multi, collective, k)]
        closed = dict(zip(big, self._timing().closed_form_times(multi, nbytes, collective, big))) if big else {}
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
        per tree as the executor runs it (``step_through`` set, at most :data:`STEP_BUDGET` steps)
        rather than use the closed form."""
        if not self.step_through:
            return False
        multi = as_multi(plan)
        per_edge = 5 if collective == "allreduce" else 3  # send, recv (and reduce) per edge and phase
        return len(multi) * nchunks * per_edge * (multi.size - 1) <= STEP_BUDGET

    def _stepped_time(self, plan: Tree | MultiTree, nbytes: float, collective: str, k: int) -> float:
        from .compile import compile_plan
        from .sim.estimate import estimate_executor_schedule

        multi = as_multi(plan)
        key = ("stepped", plan_key(multi), nbytes, collective, self.msg_overhead, k)
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

    def order_children(
        self, plan: Tree | MultiTree, nbytes: float, collective: str = "allreduce", nchunks: int | None = None
    ) -> Tree | MultiTree:
        """``plan`` with every rank's children reordered so its broadcast phase ends first
        (Jackson's rule, :func:`treecoll.collectives.child_order.order_children`): unchanged for a
        collective without one. ``nchunks`` defaults to the best count.

        >>> cm = CostModel(nranks=4)
        >>> t = Tree.from_children([[1, 2], [], [3], []])
        >>> cm.order_children(t, 8).children[0]       # the deeper subtree first
        (2, 1)
        """
        as_multi(plan)  # what is not a plan is refused, whatever the collective
        if "down" not in COLLECTIVE_PHASES.get(collective, ()):
            return plan
        k = nchunks or self.best_nchunks(plan, nbytes, collective)[0]
        return order_children(self._timing(), plan, nbytes, collective, k)

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
        its NVLS algorithm (:func:`treecoll.collectives.bounds.in_network_reduction`)."""
        return bounds.in_network_reduction(self.topology, self.gpus)

    def lower_bound(self, nbytes: float, collective: str = "allreduce", *, in_network: bool | None = None) -> float:
        """A lower bound (seconds) on the time of any algorithm for ``collective`` on ``nbytes``
        over this model's ranks (:func:`treecoll.collectives.bounds.lower_bound`: GPU ports, host
        cuts, latency). The per-message cost is :attr:`msg_overhead`, at most :data:`MSG_OVERHEAD`:
        a bound on the backend's own collectives too, which skip the executor's per-message cost.
        ``in_network`` False gives the bound of point-to-point algorithms only (trees and rings,
        what the executor runs) where the switches could reduce; None detects it.

        >>> cm = CostModel(nranks=4)       # 4 ports of 12 GB/s on one (NVLS-capable) switch
        >>> cm.in_network_reduction(), cm.lower_bound(12e9)      # seconds: n / 12 GB/s
        (True, 1.0)
        >>> cm.lower_bound(12e9, in_network=False)              # trees, rings: 2 (P-1)/P n / 12 GB/s
        1.5
        """
        o = min(self.msg_overhead, MSG_OVERHEAD)  # the communication library's own collectives pay less
        return bounds.lower_bound(self.topology, self.gpus, nbytes, collective, msg_overhead=o, in_network=in_network)
