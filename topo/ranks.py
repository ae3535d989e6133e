"""The one rank-resolution rule: which GPU each group rank runs on.

Every function of treecoll that takes ``ranks`` with a topology (the
placement, the tree builders, the cost model, the simulator,
:meth:`Topology.with_ranks`) resolves it here, with one meaning:

* ``None``: every GPU of the topology, in rank order (:meth:`Topology.rank_gpus`);
* an ``int`` N: a COUNT, the first N GPUs in rank order (``1 <= N <= GPUs``);
* a sequence: element ``r`` names group rank r's GPU, by id (``"h1/gpu0"``) or
  by topology rank (an ``int`` ``i``: ``topology.rank_gpus()[i]``); each GPU
  at most once.

>>> from treecoll import topo
>>> t = topo.resolve("dgx-h100-x2")                    # 2 hosts x 8 GPUs
>>> resolve_gpus(t, 2)                                 # a count: the first two ranks
('h0/gpu0', 'h0/gpu1')
>>> resolve_gpus(t, [8, "h0/gpu3"])                    # topology rank 8, then a GPU by id
('h1/gpu0', 'h0/gpu3')
>>> resolve_gpus(t, 17)
Traceback (most recent call last):
...
treecoll.topo.errors.PlacementError: ranks: expected a count in 1..16 (the GPUs of topology 'dgx-h100-x2'), got 17; ...
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from .errors import PlacementError

__all__ = ["RanksArg", "resolve_gpus"]

#: what a ``ranks=`` argument may be: None, a count, or one GPU (id or topology rank) per group rank
RanksArg = int | Iterable[str | int] | None


class RankedGraph(Protocol):
    """What the rule reads of a :class:`~treecoll.topo.model.Topology` (the model imports this module)."""

    name: str
    graph: Any

    def rank_gpus(self) -> Sequence[str]: ...


def resolve_gpus(topology: RankedGraph, ranks: RanksArg = None) -> tuple[str, ...]:
    """The GPU id of each group rank (``result[r]`` is rank r's GPU) under the rule above.

    Raises :class:`~treecoll.topo.errors.PlacementError` naming the offending entry.
    """
    order = topology.rank_gpus()
    if ranks is None:
        return tuple(order)
    if isinstance(ranks, (bool, str, bytes)) or not isinstance(ranks, (int, Iterable)):
        raise PlacementError(
            f"ranks: expected None, a count or a sequence of GPU ids / topology ranks, "
            f"got {type(ranks).__name__} {ranks!r}"
        )
    if isinstance(ranks, int):
        if not 1 <= ranks <= len(order):
            raise PlacementError(
                f"ranks: expected a count in 1..{len(order)} (the GPUs of topology "
                f"{topology.name!r}), got {ranks}; pass fewer ranks or a larger topology"
            )
        return tuple(order[:ranks])
    nodes = topology.graph.nodes
    out: list[str] = []
    first: dict[str, int] = {}
    for r, g in enumerate(ranks):
        if isinstance(g, int) and not isinstance(g, bool):
            if not 0 <= g < len(order):
                raise PlacementError(
                    f"ranks[{r}]: expected a topology rank in 0..{len(order) - 1} of topology "
                    f"{topology.name!r}, got {g}"
                )
            g = order[g]
        elif not isinstance(g, str) or g not in nodes or nodes[g].get("kind") != "gpu":
            raise PlacementError(
                f"ranks[{r}]: expected a GPU of topology {topology.name!r} (an id like "
                f"{order[0]!r} or a topology rank), got {g!r}"
            )
        if g in first:
            raise PlacementError(f"ranks[{r}]: GPU {g!r} is already rank {first[g]}; each GPU takes one rank")
        first[g] = r
        out.append(g)
    if not out:
        raise PlacementError("ranks: expected at least one GPU, got an empty sequence")
    return tuple(out)
