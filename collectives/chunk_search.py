"""Chunk-count search: the number of pipeline chunks per tree, and the child order, with the least
predicted time.

Units: bytes in, seconds out (the times of :meth:`~treecoll.collectives.cost.CostModel.tree_times`).

:class:`ChunkSearch` holds the searches of :class:`~treecoll.collectives.cost.CostModel` (it is
one of its bases; every method reads the model's ``chunk_candidates`` and calls its
``tree_time``, ``steps_through``, ``cpu_bound``, ``order_children``, ``_checked`` and
``_timing``). Within the step budget the candidates are stepped through in increasing order and
the search stops once a rank's own work (:meth:`~treecoll.collectives.cost.CostModel.cpu_bound`)
reaches the best time found; past it every count's closed form
(:mod:`treecoll.collectives.tree_timing`) comes from one call.

>>> from treecoll.collectives.cost import CostModel
>>> from treecoll.collectives.tree import Tree
>>> cm = CostModel(nranks=4)
>>> chain = Tree.from_parents([-1, 0, 1, 2])
>>> cm.best_nchunks(chain, 4096)[0], cm.best_nchunks(chain, 1 << 26)[0]   # large messages pipeline
(1, 16)
"""

from __future__ import annotations

from collections.abc import Sequence

from .tree import MultiTree, Tree, as_multi
from .tree_timing import plan_key

__all__ = ["ChunkSearch", "CHUNK_CANDIDATES", "SEARCH_CHUNKS"]

#: chunk counts tried by :meth:`ChunkSearch.best_nchunks`
CHUNK_CANDIDATES = (1, 2, 4, 8, 16, 32, 64, 128)
#: the chunk count whose schedule must be within :data:`~treecoll.collectives.cost.STEP_BUDGET` for
#: :meth:`ChunkSearch.best_nchunks` to step through its candidates (larger ones stop the search); else
#: the closed form ranks them all
SEARCH_CHUNKS = 8


class ChunkSearch:
    """The chunk-count and child-order searches of a :class:`~treecoll.collectives.cost.CostModel`
    (module docstring)."""

    def best_ordered(
        self,
        plan: Tree | MultiTree,
        nbytes: float,
        collective: str = "allreduce",
    ) -> tuple[Tree | MultiTree, int, float]:
        """(plan with its best child order, nchunks, seconds): for every candidate chunk count, the
        children ordered by :meth:`~treecoll.collectives.cost.CostModel.order_children` for that
        count (stepping through schedules: or as given, when that is faster; there counts whose
        :meth:`~treecoll.collectives.cost.CostModel.cpu_bound` exceeds the best time found are not
        tried); the least time wins (ties: fewer chunks, the reordered plan). The least predicted
        time of ``plan``'s edges over every child order and chunk count."""
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
            same.setdefault(plan_key(as_multi(ordered[k])), []).append(k)
        secs: dict[int, float] = {}
        for group in same.values():
            multi = self._checked(ordered[group[0]], collective, group)
            secs.update(zip(group, self._timing().closed_form_times(multi, nbytes, collective, group)))
        best = None
        for k in ks:
            if best is None or secs[k] < best[2]:
                best = (ordered[k], k, secs[k])
        return best

    def _search_time(self, plan: Tree | MultiTree, nbytes: float, collective: str, k: int, stepped: bool) -> float:
        """:meth:`~treecoll.collectives.cost.CostModel.tree_time` in a search: stepped through, or all in
        the closed form."""
        if stepped:
            return self.tree_time(plan, nbytes, collective, k)
        return self._timing().closed_form_times(self._checked(plan, collective, (k,)), nbytes, collective, (k,))[0]

    def _search_ends(self, plan: Tree | MultiTree, nbytes: float, collective: str, k: int, best: float) -> bool:
        """Whether a search over chunk counts stepping through schedules stops before ``k``: a
        rank's thread handles every message and reduce of its own, so once
        :meth:`~treecoll.collectives.cost.CostModel.cpu_bound` reaches the best time found no larger
        count wins (the bound grows with ``k``); and a schedule past
        :data:`~treecoll.collectives.cost.STEP_BUDGET` steps is not stepped through (nor compared
        with ones that are)."""
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
            times = self._timing().closed_form_times(self._checked(plan, collective, ks), nbytes, collective, ks)
            i = min(range(len(ks)), key=lambda j: (times[j], j))  # ties: fewer chunks
            return ks[i], times[i]
        for k in ks:
            if best is not None and stepped and self._search_ends(plan, nbytes, collective, k, best[1]):
                break
            secs = self._search_time(plan, nbytes, collective, k, stepped)
            if best is None or secs < best[1]:
                best = (k, secs)
        return best
