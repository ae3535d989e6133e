"""The planner: what the collectives reuse between calls, owned by one object.

A :class:`Planner` turns a call's arguments (a ``tree=`` argument, the size,
the :class:`~treecoll.collectives.placement.Placement`, the operator) into the
plan and the compiled :class:`~treecoll.collectives.schedule.Schedule` the
executor runs, and keeps them so that a repeated call (a decode loop) costs
the transfers only. Every cache is bounded (least recently used entries go
first) and :meth:`Planner.clear` empties them all:

==================  =====================================================  ==========
cache               key                                                    default size
==================  =====================================================  ==========
plans               builder name, placement, size class, collective, root  256
chunk counts        plan, collective, size, placement                      1024
native choices      size, placement, backend                               1024
schedules           plan, collective, chunks, root, algorithm, ranks       256
calls               a call's shape (the executor's fast path)              256
probes              operator, value layout (associativity probe)           256
tree files          path, mtime, size, inode                               16
agreements          per communicator: the fingerprints ranks agreed on     256
scratch buffers     per communicator: rank, value layout, slot             64
group topologies    per process group: what ``tree_decode`` discovered     (one each)
==================  =====================================================  ==========

Keys never hold a process group: plans are keyed on
:attr:`Placement.plan_key <treecoll.collectives.placement.Placement.plan_key>`, and
what is kept per communicator (agreements, scratch buffers, a discovered
topology) sits in weak mappings keyed on the communicator object, so it goes
with the group and never keeps a destroyed group alive.

The collectives use the process-wide :func:`default_planner`.

>>> from treecoll.collectives.placement import Placement
>>> planner = Planner()
>>> plan, sched = planner.schedule_for("binomial", collective="allreduce", nbytes=4 << 20,
...                                    placement=Placement(ranks=4), algo="tree")
>>> plan.parents, sched.nchunks                       # 4 MiB without a topology: 1 MiB chunks
((-1, 0, 0, 2), 4)
>>> planner.schedule_for("binomial", collective="allreduce", nbytes=4 << 20,
...                      placement=Placement(ranks=4), algo="tree")[1] is sched     # cached
True
>>> planner.clear(); len(planner)
0
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from treecoll.topo import Topology
from treecoll.topo.errors import CollectiveError, TreeError

from .builders import build
from .compile import compile_plan
from .cost import nchunks_for
from .ops import Op
from .placement import Placement
from .schedule import Schedule
from .tree import MultiTree, Tree, as_multi
from .tree_io import TreeFile, resolve_tree_arg

__all__ = [
    "LRU",
    "Planner",
    "default_planner",
    "native_allreduce_time",
    "AUTO_RSAG_BYTES",
    "AUTO_P2_RSAG_BYTES",
    "ALGOS",
]

#: ``algo="auto"``: from this many bytes an allreduce without an explicit tree runs ``rsag``
AUTO_RSAG_BYTES = 256 << 10
#: two ranks: ``direct`` below this many bytes, ``rsag`` from here (measured on gloo,
#: docs/benchmarks.md "Collectives": at 16-64 MiB rsag 0.94-0.98x gloo, direct 1.13-1.30x).
AUTO_P2_RSAG_BYTES = 4 << 20
#: what ``algo=`` may name
ALGOS = ("auto", "tree", "ring", "rsag", "direct")
#: builders that take the rank the result goes to as their root
_ROOTED = ("chain", "binomial", "kary", "star", "two_level")


_MISSING = object()


class LRU:
    """A mapping of at most ``maxsize`` entries; the least recently used goes first.
    Safe to share between threads (the in-process ranks of :mod:`treecoll.collectives.local`).

    >>> c = LRU(2); c["a"] = 1; c["b"] = 2; c.get("a"); c["c"] = 3
    1
    >>> sorted(c.keys())
    ['a', 'c']
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise CollectiveError(f"cache: maxsize expected >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of ``key`` (now the most recently used), or ``default``."""
        value = self._d.get(key, _MISSING)  # one atomic lookup: no lock on the hot path
        if value is _MISSING:
            return default
        try:
            self._d.move_to_end(key)
        except KeyError:  # dropped by another thread in between: still a hit
            pass
        return value

    def __setitem__(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            while len(self._d) > self.maxsize:
                self._d.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def keys(self) -> list:
        """The keys, least recently used first."""
        with self._lock:
            return list(self._d)

    def values(self) -> list:
        """The values, least recently used first."""
        with self._lock:
            return list(self._d.values())

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._d.clear()


class _CommCache:
    """What one planner keeps per communicator: agreed fingerprints and scratch buffers."""

    __slots__ = ("agreed", "scratch", "__weakref__")

    def __init__(self, max_agreed: int, max_scratch: int) -> None:
        self.agreed = LRU(max_agreed)
        self.scratch = LRU(max_scratch)


class Planner:
    """Plans, chunk counts, schedules and per-call state, in bounded caches (module docstring).

    ``max_entries``: the size of each keyed cache (the chunk counts get four times as
    many, tree files 16); ``max_scratch``: scratch buffers kept per communicator (each
    one message in size).
    """

    def __init__(self, *, max_entries: int = 256, max_scratch: int = 64) -> None:
        self.plans = LRU(max_entries)
        self.chunks = LRU(4 * max_entries)
        self.schedules = LRU(max_entries)
        self.calls = LRU(max_entries)
        self.probes = LRU(max_entries)
        self.tree_files = LRU(16)
        self.native = LRU(4 * max_entries)
        self._max_entries, self._max_scratch = max_entries, max_scratch
        self._comms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._topologies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Entries held in all caches (per-communicator ones included)."""
        per_comm = sum(len(c.agreed) + len(c.scratch) for c in list(self._comms.values()))
        return (
            len(self.plans)
            + len(self.chunks)
            + len(self.schedules)
            + len(self.calls)
            + len(self.probes)
            + len(self.tree_files)
            + len(self.native)
            + per_comm
            + len(self._topologies)
        )

    def clear(self) -> None:
        """Empty every cache (scratch buffers are freed once no call uses them)."""
        for c in (self.plans, self.chunks, self.schedules, self.calls, self.probes, self.tree_files, self.native):
            c.clear()
        self._comms.clear()
        self._topologies.clear()

    # ------------------------------------------------------------------ per communicator
    def comm_cache(self, comm: Any) -> _CommCache:
        """Agreements and scratch buffers of the communicator ``comm`` (a process group or an
        in-process fabric; kept while it lives). ``comm`` None: a fresh, unkept one."""
        if comm is None:
            return _CommCache(self._max_entries, self._max_scratch)
        hit = self._comms.get(comm)
        if hit is None:
            with self._lock:
                hit = self._comms.get(comm)
                if hit is None:
                    hit = self._comms[comm] = _CommCache(self._max_entries, self._max_scratch)
        return hit

    def group_topology(self, group: Any, make: Callable[[], Topology]) -> Topology:
        """``make()`` once per process group object (kept while the group lives): what
        ``tree_decode`` discovered for a group it was given without a topology."""
        hit = self._topologies.get(group)
        if hit is None:
            hit = self._topologies[group] = make()
        return hit

    # ------------------------------------------------------------------ plans and schedules
    def plan_for(
        self,
        tree: Any,
        *,
        collective: str,
        nbytes: int,
        placement: Placement,
        op: Op | None = None,
        root: int | None = None,
        builder_opts: Mapping[str, Any] | None = None,
    ) -> Tree | MultiTree:
        """The Tree or MultiTree a collective with these arguments runs on (cached).

        ``tree``: anything :func:`~treecoll.collectives.tree_io.resolve_tree_arg` takes (a
        Tree, a MultiTree, a loaded tree file, a tree file path, a builder name, or None /
        ``"auto"``: the least predicted time for ``nbytes`` on the placement). ``op``: the
        operator (None: a commutative one); a non-commutative ``op`` needs an order-preserving
        tree (an explicit one that is not raises :class:`TreeError`). ``builder_opts`` go to
        the builder of a name. The plan must span ``placement.nranks`` ranks.
        """
        tree = resolve_tree_arg(tree, files=self.tree_files)
        explicit = tree is not None and tree != "auto"
        commutative = op is None or op.commutative
        n = placement.nranks
        label = ""
        if isinstance(tree, TreeFile):
            plan, label = tree.plan, f"{tree.source or 'tree file'}: "
            if tree.hosts is not None and placement.topology is not None and tree.plan.size == n:
                tree.check_hosts(placement.topology, placement.gpus)
        elif isinstance(tree, (Tree, MultiTree)):
            plan = tree
        else:
            plan = self._built(tree or "auto", collective, nbytes, placement, op, root, commutative, builder_opts)
        if as_multi(plan).size != n:
            raise TreeError(
                f"{label}tree {getattr(plan, 'name', '') or 'given'!r}: spans {as_multi(plan).size} "
                f"ranks, the group has {n}; build it for {n} ranks"
            )
        if not commutative and not plan.is_order_preserving():
            if explicit:
                raise TreeError(
                    f"{label}tree {plan.name or 'given'!r}: op {op.name!r} is not commutative, so the "
                    f"tree must be order preserving (every subtree a consecutive rank range, children "
                    f"ascending); use chain, binomial or kary, or declare commutative=True"
                )
            raise TreeError(f"op {op.name!r}: no order-preserving tree found")  # pragma: no cover
        return plan

    def _built(
        self,
        name: str,
        collective: str,
        nbytes: int,
        placement: Placement,
        op: Op | None,
        root: int | None,
        commutative: bool,
        builder_opts: Mapping[str, Any] | None,
    ) -> Tree | MultiTree:
        base = name.partition(":")[0]
        extra = tuple(sorted(builder_opts.items())) if builder_opts else ()
        key = (
            name,
            placement.plan_key,
            nbytes if base in ("auto", "two_level") else None,
            collective,
            root if commutative else None,
            commutative,
            extra,
        )
        plan = self.plans.get(key)
        if plan is None:
            opts: dict[str, Any] = {}
            if base == "auto":
                opts = {
                    "nbytes": nbytes,
                    "op": op,
                    "collective": collective,
                    "root": root if commutative and collective != "allreduce" else None,
                }
            elif base == "two_level":
                opts = {"nbytes": nbytes, "collective": collective}
            if root is not None and commutative and collective != "allreduce" and base in _ROOTED:
                opts["root"] = root  # rooted where the result goes: no extra hop
            opts.update(builder_opts or {})
            plan = build(name, placement, **opts)
            self.plans[key] = plan
        return plan

    def nchunks_for(self, plan: Tree | MultiTree, collective: str, nbytes: int, placement: Placement) -> int:
        """:func:`treecoll.collectives.cost.nchunks_for` (the one chunking policy), cached."""
        key = (plan.fingerprint(), collective, nbytes, placement.plan_key)
        k = self.chunks.get(key)
        if k is None:
            k = self.chunks[key] = nchunks_for(plan, collective, nbytes, placement, compiler=self.compiled)
        return k

    def schedule_for(
        self,
        tree: Any,
        *,
        collective: str,
        nbytes: int,
        placement: Placement,
        op: Op | None = None,
        algo: str = "auto",
        root: int | None = None,
        nchunks: int | None = None,
        max_chunks: int | None = None,
    ) -> tuple[Tree | MultiTree | None, Schedule]:
        """``(plan, schedule)`` the executor runs for a call with these arguments: the plan
        (None for ring, rsag and direct) and its compiled schedule (cached).

        ``algo="auto"``: the tree when ``tree`` names one; else, for two ranks, ``direct``
        below :data:`AUTO_P2_RSAG_BYTES` and ``rsag`` from there; for more ranks the tree
        below :data:`AUTO_RSAG_BYTES` and ``rsag`` from there (allreduce; reduce and broadcast
        always run trees). ``nchunks`` per tree (None: :meth:`nchunks_for`; ring and rsag
        one per segment, direct one), at most ``max_chunks`` in all (the value's limit).
        """
        algo, plan, per = self._plan_and_chunks(
            tree, collective, nbytes, placement, op, algo, root, nchunks, max_chunks
        )
        return plan, self.compiled(plan, collective, per, root=root, algo=algo, nranks=placement.nranks)

    def _plan_and_chunks(self, tree, collective, nbytes, placement, op, algo, root, nchunks, max_chunks) -> tuple:
        """``(algorithm, plan, chunks per tree)`` of :meth:`schedule_for`'s schedule (its arguments, in
        order), without compiling it."""
        n = placement.nranks
        what = collective if root is None else f"{collective}(root={root})"
        if algo not in ALGOS:
            raise CollectiveError(f"{what}: algo expected one of {list(ALGOS)}, got {algo!r}")
        if algo == "auto":
            explicit = tree is not None and tree != "auto"
            if collective == "allreduce" and not explicit and n == 2 and nbytes < AUTO_P2_RSAG_BYTES:
                algo = "direct"  # two ranks: one exchange, both fold in rank order (one round, n bytes each way)
            else:
                algo = "rsag" if collective == "allreduce" and not explicit and nbytes >= AUTO_RSAG_BYTES else "tree"
        plan = None
        if algo != "tree":
            if collective != "allreduce":
                raise CollectiveError(f"{what}: algo {algo!r} implements allreduce only; use algo='tree'")
            if algo == "ring" and op is not None and not op.commutative:
                raise CollectiveError(
                    f"{what}: algo 'ring' needs a commutative op, got {op.name!r}; "
                    f"use algo='rsag' or 'tree', or declare commutative=True"
                )
            k = nchunks if nchunks is not None else (1 if algo == "direct" else n)
            ntrees = 1 if algo == "direct" else n
        else:
            plan = self.plan_for(tree, collective=collective, nbytes=nbytes, placement=placement, op=op, root=root)
            k = nchunks if nchunks is not None else self.nchunks_for(plan, collective, nbytes, placement)
            ntrees = len(as_multi(plan))
        per = max(1, min(k, max_chunks // max(ntrees, 1))) if max_chunks is not None else max(1, k)
        return algo, plan, per

    def compiled(
        self,
        plan: Tree | MultiTree | None,
        collective: str,
        nchunks: int,
        *,
        root: int | None = None,
        algo: str = "tree",
        nranks: int | None = None,
    ) -> Schedule:
        """:func:`~treecoll.collectives.compile.compile_plan` of these arguments, cached: what the executor
        runs, and what the cost model steps through to choose the chunk count (:meth:`nchunks_for`)."""
        n = nranks if nranks is not None else as_multi(plan).size
        key = (plan.fingerprint() if plan is not None else algo, collective, nchunks, root, algo, n)
        sched = self.schedules.get(key)
        if sched is None:
            sched = self.schedules[key] = compile_plan(plan, collective, nchunks, root=root, algo=algo, nranks=n)
        return sched

    def prefer_native(self, *, nbytes: int, placement: Placement, backend: str) -> bool:
        """Whether the backend's own allreduce (``torch.distributed.all_reduce``) of ``nbytes`` is
        predicted at most as long as what ``algo="auto"`` would run here (cached): the
        executor-mode cost model (:class:`~treecoll.collectives.cost.CostModel`, the
        ``backend``'s per-message cost) against
        :func:`native_allreduce_time`."""
        key = (nbytes, placement.plan_key, backend)
        hit = self.native.get(key)
        if hit is None:
            hit = self.native[key] = self._native_faster(nbytes, placement, backend)
        return hit

    def _native_faster(self, nbytes: int, placement: Placement, backend: str) -> bool:
        from .cost import CostModel

        if placement.nranks < 2:
            return False
        model = CostModel(placement, backend=backend, step_through=True, compiler=self.compiled)
        _, plan, per = self._plan_and_chunks(None, "allreduce", nbytes, placement, None, "auto", None, None, None)
        if plan is not None:
            ours = model.tree_time(plan, nbytes, "allreduce", per)
        else:
            ours = model.rsag_time(nbytes)
        return native_allreduce_time(model, nbytes) <= ours


def native_allreduce_time(model: Any, nbytes: float) -> float:
    """Seconds of the backend's own allreduce (``torch.distributed.all_reduce``) of ``nbytes`` on
    ``model``'s placement (a :class:`~treecoll.collectives.cost.CostModel`): NCCL's fastest
    algorithm under its own model (:func:`treecoll.collectives.sim.nccl_model.nccl_predict`), gloo's
    ring with :attr:`~treecoll.collectives.executor_cost.ExecutorCost.native_step_s` per step.

    >>> from treecoll.collectives.cost import CostModel
    >>> from treecoll.collectives.executor_cost import EXECUTOR_COSTS
    >>> t = native_allreduce_time(CostModel(nranks=2), 8)      # 2 ring steps on gloo, ~8 B each
    >>> round(t / EXECUTOR_COSTS["gloo"].for_nranks(2).native_step_s, 1)
    2.0
    """
    if model.nranks == 1:
        return 0.0
    if model.executor.native_step_s is None:
        from .sim.nccl_model import nccl_algos, nccl_predict

        return min(
            nccl_predict(model.placement, None, int(nbytes), a)["time"] for a in nccl_algos(model.topology, model.gpus)
        )
    return model.ring_time(nbytes, overhead=model.executor.native_step_s / 2)


_DEFAULT = Planner()


def default_planner() -> Planner:
    """The process-wide :class:`Planner` the collectives and ``tree_decode`` use."""
    return _DEFAULT
