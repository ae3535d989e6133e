"""Child ordering: every rank's children in the order that ends a tree's broadcast phase first.

Units: bytes in; latencies and the per-message cost ``o`` in seconds, rates in bytes/s (those of
:meth:`~treecoll.collectives.tree_timing.TreeTiming.tree_rates`).

A rank forwards a chunk to its children one after another (each send costs it the overhead
``o``), so the i-th child (from 0) holds it after ``(i + 1) o + lat + m / rate`` and its subtree
``tail`` later. Sending to the child with the longest ``lat + m / rate + tail`` first minimises
the last arrival (Jackson's rule; exact here because every send costs the same ``o``). Ties keep
the given order. The reduce phase does not depend on child order under this model, but a
non-commutative reduction does: reorder only trees reduced with a commutative operator.
:meth:`~treecoll.collectives.cost.CostModel.order_children` applies it at a model's best chunk
count.

>>> from treecoll.collectives.cost import uniform_topology
>>> from treecoll.collectives.link_sharing import Links
>>> t = uniform_topology(4)                     # 4 ports of 12 GB/s on one switch
>>> timing = TreeTiming(Links(t, t.rank_gpus(), 0.0), msg_overhead=1e-6, mem_bw=(0.0,) * 4)
>>> plan = Tree.from_children([[1, 2], [], [3], []])
>>> order_children(timing, plan, 8, "broadcast", 1).children[0]      # the deeper subtree first
(2, 1)
"""

from __future__ import annotations

from .tree import MultiTree, Tree, as_multi
from .tree_timing import COLLECTIVE_PHASES, TreeTiming

__all__ = ["order_children"]


def order_children(
    timing: TreeTiming, plan: Tree | MultiTree, nbytes: float, collective: str, nchunks: int
) -> Tree | MultiTree:
    """``plan`` with every rank's children in Jackson's order (module docstring) for ``collective``
    (one with a broadcast phase) on ``nbytes`` bytes split in ``nchunks`` chunks per tree, with the
    rates, latencies and per-message cost of ``timing``."""
    multi = as_multi(plan)
    links = timing.links
    rate = timing.tree_rates(multi, "up" in COLLECTIVE_PHASES[collective], True)
    o = timing.msg_overhead
    trees = []
    for t, share in zip(multi.trees, multi.shares):
        m = nbytes * share / nchunks
        tail = [0.0] * t.size
        kids: list[tuple[int, ...]] = [()] * t.size
        for r in t.postorder():
            lead = {
                c: (links.pairs.get((r, c)) or links.pair(r, c))[0] + m / rate[(r, c)] + tail[c] for c in t.children[r]
            }
            kids[r] = tuple(sorted(t.children[r], key=lambda c: -lead[c]))
            tail[r] = max(((i + 1) * o + lead[c] for i, c in enumerate(kids[r])), default=0.0)
        trees.append(Tree(t.parents, tuple(kids), name=t.name))
    if isinstance(plan, Tree):
        return trees[0]
    return MultiTree(tuple(trees), multi.shares, name=plan.name)
