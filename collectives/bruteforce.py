"""Exhaustive search over spanning trees: the yardstick for ``auto`` on small groups.

:func:`rooted_trees` enumerates every rooted spanning tree over ranks
``0..P-1`` (labeled trees from Prüfer sequences, ``P^(P-2)`` of them, times
``P`` roots); :func:`shapes` enumerates one rooted tree per isomorphism class
(networkx's non-isomorphic free trees times every root), which is complete up
to relabeling and therefore exhaustive on topologies where every rank is
equivalent (one NVSwitch fabric). Children are in ascending rank order (the
cost model does not depend on their order).

:func:`brute_force` returns the least predicted time over a set of trees under
a :class:`~collectives.cost.CostModel` (each tree at its best chunk count),
the same score ``auto`` minimises.

    python -m collectives.bruteforce --topology pcie-8gpu --ranks 6 --bytes 16777216

>>> sum(1 for _ in rooted_trees(4))   # 4^2 labeled trees x 4 roots
64
"""
from __future__ import annotations

import argparse
import heapq
import itertools
import sys
from typing import Iterator

from .cost import CostModel
from .tree import Tree

__all__ = ["prufer_edges", "rooted_trees", "shapes", "brute_force", "is_symmetric"]


def prufer_edges(seq: tuple[int, ...], n: int) -> list[tuple[int, int]]:
    """Edges of the labeled tree with Prüfer sequence ``seq`` over ``n`` nodes."""
    degree = [1] * n
    for x in seq:
        degree[x] += 1
    leaves = [i for i in range(n) if degree[i] == 1]
    heapq.heapify(leaves)
    edges = []
    for x in seq:
        leaf = heapq.heappop(leaves)
        edges.append((leaf, x))
        degree[x] -= 1
        if degree[x] == 1:
            heapq.heappush(leaves, x)
    edges.append((heapq.heappop(leaves), heapq.heappop(leaves)))
    return edges


def _orient(adj: list[list[int]], root: int) -> Tree:
    n = len(adj)
    parents = [-1] * n
    seen = [False] * n
    seen[root] = True
    stack = [root]
    while stack:
        u = stack.pop()
        for v in adj[u]:
            if not seen[v]:
                seen[v] = True
                parents[v] = u
                stack.append(v)
    return Tree.from_parents(parents)


def rooted_trees(n: int) -> Iterator[Tree]:
    """Every rooted labeled spanning tree over ``n`` ranks (``n^(n-1)`` trees)."""
    if n == 1:
        yield Tree.from_parents([-1])
        return
    if n == 2:
        yield Tree.from_parents([-1, 0])
        yield Tree.from_parents([1, -1])
        return
    for seq in itertools.product(range(n), repeat=n - 2):
        adj: list[list[int]] = [[] for _ in range(n)]
        for a, b in prufer_edges(seq, n):
            adj[a].append(b)
            adj[b].append(a)
        for root in range(n):
            yield _orient(adj, root)


def shapes(n: int) -> Iterator[Tree]:
    """One rooted tree per isomorphism class of rooted trees (and a few duplicates)."""
    import networkx as nx
    if n <= 2:
        yield from rooted_trees(n)
        return
    for free in nx.nonisomorphic_trees(n):
        adj = [sorted(free.neighbors(i)) for i in range(n)]
        for root in range(n):
            yield _orient(adj, root)


def is_symmetric(model: CostModel) -> bool:
    """True when every ordered pair of ranks has the same path latency, bandwidth and
    route structure through shared nodes (so relabeling ranks never changes a cost)."""
    sig = set()
    for i in range(model.nranks):
        for j in range(model.nranks):
            if i != j:
                p = model.path(i, j)
                mids = tuple(sorted((tuple(nodes[1:-1]), round(s, 9)) for nodes, s in p.routes))
                sig.add((round(p.bw, 9), round(p.lat, 9), mids))
    return len(sig) == 1


def brute_force(model: CostModel, nbytes: int, collective: str = "allreduce", trees=None) -> tuple[float, Tree]:
    """(least predicted seconds, a tree reaching it) over ``trees`` (default: every rooted tree)."""
    best_t, best = None, None
    for t in (rooted_trees(model.nranks) if trees is None else trees):
        s = model.best_nchunks(t, nbytes, collective)[1]
        if best_t is None or s < best_t:
            best_t, best = s, t
    return best_t, best


def main(argv=None) -> int:  # pragma: no cover - a measurement tool
    import time

    import topo

    from .builders import build
    ap = argparse.ArgumentParser(description="auto versus every spanning tree under the cost model")
    ap.add_argument("--topology", required=True)
    ap.add_argument("--ranks", type=int, default=None)
    ap.add_argument("--bytes", type=int, nargs="+", default=[8, 1 << 20, 16 << 20])
    ap.add_argument("--shapes", action="store_true", help="enumerate shapes only (symmetric topologies)")
    args = ap.parse_args(argv)
    t = topo.resolve(args.topology)
    gpus = t.rank_gpus()[: args.ranks] if args.ranks else t.rank_gpus()
    model = CostModel(t, gpus)
    for nb in args.bytes:
        t0 = time.time()
        trees = shapes(len(gpus)) if args.shapes else None
        best_t, best = brute_force(model, nb, trees=trees)
        a = build("auto", t, gpus, nbytes=nb, model=model)
        a_t = model.best_nchunks(a, nb)[1]
        print(f"{t.name} P={len(gpus)} {nb} B: brute force {best_t * 1e6:.3f} us {best.parents}; "
              f"auto {a_t * 1e6:.3f} us ({a.name}); ratio {a_t / best_t:.4f}; {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
