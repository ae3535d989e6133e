"""Exhaustive search over spanning trees: the yardstick for ``auto`` on small groups.

:func:`rooted_trees` enumerates every rooted spanning tree over ranks
``0..P-1`` (labeled trees from Prüfer sequences, ``P^(P-2)`` of them, times
``P`` roots); :func:`shapes` enumerates one rooted tree per isomorphism class
(networkx's non-isomorphic free trees times every root), which is complete up
to relabeling and therefore exhaustive on topologies where every rank is
equivalent (one NVSwitch fabric). Children are in ascending rank order; :func:`brute_force` scores each
at its best child order (:meth:`CostModel.best_ordered`), so the search covers
every child order too.

:func:`brute_force` returns the least predicted time over a set of trees under
a :class:`~collectives.cost.CostModel` (each tree at its best chunk count),
the same score ``auto`` minimises. The command line runs it against ``auto``:

    treecoll tree bruteforce --topology pcie-8gpu --sizes 8,16MiB

>>> sum(1 for _ in rooted_trees(4))   # 4^2 labeled trees x 4 roots
64
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Iterator

from treecoll.topo.errors import TreeError

from .cost import CostModel
from .tree import MultiTree, Tree

__all__ = [
    "prufer_edges",
    "rooted_trees",
    "shapes",
    "brute_force",
    "is_symmetric",
    "rank_automorphisms",
    "trees_up_to_symmetry",
]


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


def _labeled_trees(n: int) -> Iterator[list[list[int]]]:
    """Every labeled (unrooted) tree over ``n >= 3`` nodes as adjacency lists, one per Prüfer sequence
    in lexicographic order (``n^(n-2)`` trees)."""
    for seq in itertools.product(range(n), repeat=n - 2):
        adj: list[list[int]] = [[] for _ in range(n)]
        for a, b in prufer_edges(seq, n):
            adj[a].append(b)
            adj[b].append(a)
        yield adj


def rooted_trees(n: int) -> Iterator[Tree]:
    """Every rooted labeled spanning tree over ``n`` ranks (``n^(n-1)`` trees)."""
    if n == 1:
        yield Tree.from_parents([-1])
        return
    if n == 2:
        yield Tree.from_parents([-1, 0])
        yield Tree.from_parents([1, -1])
        return
    for adj in _labeled_trees(n):
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


_NODE_KEYS = ("kind", "model", "mem_bw", "sm")
_EDGE_KEYS = ("kind", "bw", "lat", "count")


#: graph automorphisms :func:`rank_automorphisms` looks at: a topology with interchangeable parts
#: (NVSwitches, spines, NICs) has too many to list (16 spines alone: 16!), and any subset of the
#: automorphisms keeps :func:`trees_up_to_symmetry` exhaustive, only less reduced
MAX_AUTOMORPHISMS = 1024


def _route_set(model: CostModel, i: int, j: int, rename: dict | None = None) -> frozenset:
    """The routes (node tuples, shares) of the path from rank i to rank j, nodes renamed by ``rename``."""
    return frozenset(
        (tuple(nodes if rename is None else (rename[x] for x in nodes)), round(share, 12))
        for nodes, share in model.path(i, j).routes
    )


def rank_automorphisms(model: CostModel, limit: int = MAX_AUTOMORPHISMS) -> list[tuple[int, ...]]:
    """Rank permutations induced by automorphisms of the group's part of the topology graph.

    The part is the group's GPUs and every node on a route between two of them. An
    automorphism maps GPUs to GPUs, switches to switches and links to links of the same
    kind, bandwidth and latency; one is kept only when it maps the group's GPUs onto
    themselves and every route between ranks i and j onto the routes between their images,
    so relabeling a tree's ranks by ``perm`` (rank ``r`` becomes ``perm[r]``) never changes
    its cost. At most ``limit`` automorphisms are looked at (:data:`MAX_AUTOMORPHISMS`). The
    identity is first.
    """
    from networkx.algorithms.isomorphism import DiGraphMatcher

    n = model.nranks
    index = {gpu: r for r, gpu in enumerate(model.gpus)}
    part = set(model.gpus)
    routes = {}
    for i in range(n):
        for j in range(n):
            if i != j:
                routes[i, j] = _route_set(model, i, j)
                part.update(x for nodes, _ in routes[i, j] for x in nodes)
    g = model.topology.graph.subgraph(part)

    def node_match(a, b):
        return all(a.get(k) == b.get(k) for k in _NODE_KEYS)

    def edge_match(a, b):
        return all(a.get(k) == b.get(k) for k in _EDGE_KEYS)

    ident = tuple(range(n))
    perms = {ident}
    matcher = DiGraphMatcher(g, g, node_match=node_match, edge_match=edge_match)
    for iso in itertools.islice(matcher.isomorphisms_iter(), limit):
        if not all(iso[gpu] in index for gpu in model.gpus):
            continue
        perm = tuple(index[iso[gpu]] for gpu in model.gpus)
        if perm not in perms and all(routes[perm[i], perm[j]] == _route_set(model, i, j, iso) for i, j in routes):
            perms.add(perm)
    return [ident] + sorted(perms - {ident})


def _relabel_parents(parents: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    out = [0] * len(parents)
    for v, p in enumerate(parents):
        out[perm[v]] = -1 if p < 0 else perm[p]
    return tuple(out)


def trees_up_to_symmetry(model: CostModel) -> Iterator[Tree]:
    """Every rooted spanning tree up to the topology's symmetry (see :func:`rank_automorphisms`).

    Roots are taken one per orbit of the automorphism group; for each root,
    a labeled tree is kept only when its parent tuple is the least among its
    images under the root's stabiliser. Every rooted tree is the image of a
    kept one under some automorphism, so the least cost over these trees is
    the least cost over all ``P^(P-1)`` of them.
    """
    n = model.nranks
    perms = rank_automorphisms(model)
    roots: list[int] = []
    covered: set[int] = set()
    for r in range(n):
        if r not in covered:
            roots.append(r)
            covered.update(p[r] for p in perms)
    if n <= 2:
        yield from (t for t in rooted_trees(n) if t.root in roots)
        return
    for root in roots:
        stab = [p for p in perms[1:] if p[root] == root]
        for adj in _labeled_trees(n):
            t = _orient(adj, root)
            if all(t.parents <= _relabel_parents(t.parents, p) for p in stab):
                yield t


def brute_force(
    model: CostModel, nbytes: int, collective: str = "allreduce", trees: Iterable[Tree] | None = None
) -> tuple[float, Tree | MultiTree]:
    """(least predicted seconds, a tree reaching it, the first of equals) over ``trees`` (default:
    every rooted tree), each at its best child order and chunk count (:meth:`CostModel.best_ordered`)."""
    best: tuple[float, Tree | MultiTree] | None = None
    for t in rooted_trees(model.nranks) if trees is None else trees:
        ordered, _, s = model.best_ordered(t, nbytes, collective)
        if best is None or s < best[0]:
            best = (s, ordered)
    if best is None:
        raise TreeError("brute force: expected trees to score, got none")
    return best
