"""Tree builders in a named registry (deterministic for equal inputs).

Public API (stable; the simulator and the CLI use it)::

    build(name, placement=None, ranks=None, *, nranks=None, **opts) -> Tree | MultiTree
    BUILDERS: dict name -> builder(topology, gpus, nranks, **opts)
    leader_of(topology, gpus, members) -> int

``placement`` is a :class:`~treecoll.collectives.placement.Placement` (or a
topology with ``ranks``: the GPU of each group rank, under the one rank rule
of :func:`treecoll.topo.ranks.resolve_gpus`); builders that ignore the topology
(``chain``, ``binomial``, ``kary``, ``star``, ``double_binary``) only need
``nranks``. ``name`` may carry one argument after a colon: ``"kary:4"``.

Builders
--------
``chain``      rank ``root`` -> next -> ... (order preserving for root 0).
``binomial``   rank r's parent is r with its lowest set bit cleared (root 0;
               other roots rotate the labels). Order preserving for root 0.
``kary``       fan-out ``k`` (default 2): ranks split into ``k`` consecutive
               ranges under the root, recursively. Order preserving for root 0.
``star``       ``kary`` with ``k = P - 1``: everybody sends to the root.
``double_binary`` NCCL's two complementary binary trees (src/graph/trees.cc
               ``ncclGetBtree``/``ncclGetDtree``: mirror for even P, shift for
               odd P), half the message each; a :class:`MultiTree`.
``two_level``  per host an intra-host tree over its fast links, rooted at a
               leader near a NIC; an inter-host tree over the leaders keeping
               hosts under the same leaf switches together, slow hosts (a
               slow NIC link, as ``treecoll topo probe`` measures them) at
               its leaves (see :func:`two_level`); per NIC rail one such tree (a
               :class:`MultiTree`) when the cost model predicts it faster for the
               message size.
``auto``       the candidate with the least predicted time under
               :class:`~collectives.cost.CostModel` for ``nbytes``, refined by
               local search for small groups (see :func:`auto`).

>>> build("binomial", nranks=8).parents
(-1, 0, 0, 2, 0, 4, 4, 6)
>>> build("kary:3", nranks=7).children[0]
(1, 3, 5)
>>> build("nope", nranks=2)
Traceback (most recent call last):
...
treecoll.topo.errors.TreeError: builder 'nope': unknown; valid names are ['auto', 'binomial', 'chain', ...]
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from treecoll.topo import NCCL_CLASSES, Topology
from treecoll.topo.errors import TreeError
from treecoll.topo.ranks import RanksArg
from treecoll.topo.routes import rename_node

from .cost import CostModel
from .placement import Placement, as_placement
from .tree import MultiTree, Tree

__all__ = [
    "BUILDERS",
    "build",
    "chain",
    "binomial",
    "kary",
    "star",
    "double_binary",
    "two_level",
    "auto",
    "leader_of",
    "nccl_btree_parents",
    "INTRA_KINDS",
    "INTER_KINDS",
]

INTRA_KINDS = ("auto", "star", "chain", "binomial", "kary", "links")
INTER_KINDS = ("binomial", "chain", "kary", "star")


# ---------------------------------------------------------------------- shapes over 0..n-1
def _chain_parents(n: int) -> list[int]:
    return [i - 1 for i in range(n)]


def _binomial_parents(n: int) -> list[int]:
    return [-1] + [r & (r - 1) for r in range(1, n)]


def _kary_parents(n: int, k: int) -> list[int]:
    if k < 1:
        raise TreeError(f"kary: fan-out k expected >= 1, got {k}")
    parents = [-1] * n
    stack = [(0, n)]  # subtree of ranks lo..hi-1 rooted at lo
    while stack:
        lo, hi = stack.pop()
        rest = hi - lo - 1
        start = lo + 1
        for j in range(min(k, rest)):
            size = rest // k + (1 if j < rest % k else 0)
            if size == 0:
                continue
            parents[start] = lo
            stack.append((start, start + size))
            start += size
    return parents


@functools.lru_cache(maxsize=64)
def _shape(kind: str, n: int, k: int | None = None) -> tuple[int, ...]:
    """Parents over positions 0..n-1 (position 0 the root) for an inter/intra shape name (kept: every
    host of a cluster asks for the same few)."""
    if kind == "chain":
        return tuple(_chain_parents(n))
    if kind == "binomial":
        return tuple(_binomial_parents(n))
    if kind == "star":
        return tuple(_kary_parents(n, max(n - 1, 1)))
    if kind == "kary":
        return tuple(_kary_parents(n, k or 2))
    raise TreeError(f"tree shape {kind!r}: expected one of ['binomial', 'chain', 'kary', 'star']")


def _rooted(parents: list[int], root: int, name: str) -> Tree:
    """Tree over ranks with position i -> rank (i + root) % n (root 0: the shape itself)."""
    n = len(parents)
    if not 0 <= root < n:
        raise TreeError(f"{name}: root expected a rank in 0..{n - 1}, got {root}")
    t = Tree.from_parents(parents, name=name)
    return t if root == 0 else t.relabel([(i + root) % n for i in range(n)])


# ---------------------------------------------------------------------- topology-free builders
def chain(topology: Topology | None, gpus: Sequence[str] | None, nranks: int, *, root: int = 0) -> Tree:
    """Chain root -> root+1 -> ... (wrapping)."""
    return _rooted(_chain_parents(nranks), root, "chain")


def binomial(topology: Topology | None, gpus: Sequence[str] | None, nranks: int, *, root: int = 0) -> Tree:
    """Binomial tree: parent(r) = r & (r - 1), depth ceil(log2 P)."""
    return _rooted(_binomial_parents(nranks), root, "binomial")


def kary(topology: Topology | None, gpus: Sequence[str] | None, nranks: int, *, k: int = 2, root: int = 0) -> Tree:
    """Fan-out ``k`` tree over consecutive rank ranges, depth about log_k P."""
    t = _rooted(_kary_parents(nranks, int(k)), root, f"kary:{int(k)}")
    return t


def star(topology: Topology | None, gpus: Sequence[str] | None, nranks: int, *, root: int = 0) -> Tree:
    """Every rank's parent is the root."""
    return _rooted(_kary_parents(nranks, max(nranks - 1, 1)), root, "star")


def nccl_btree_parents(n: int) -> list[int]:
    """NCCL's ``ncclGetBtree`` parent of every rank (in-order binary tree, root 0 with one child)."""
    parents = [-1] * n
    for rank in range(1, n):
        bit = 1
        while bit < n and not bit & rank:
            bit <<= 1
        up = (rank ^ bit) | (bit << 1)
        if up >= n:
            up = rank ^ bit
        parents[rank] = up
    return parents


def double_binary(topology: Topology | None, gpus: Sequence[str] | None, nranks: int) -> MultiTree | Tree:
    """NCCL's double binary tree: the btree and its mirror (even P) or shift (odd P)."""
    n = nranks
    first = nccl_btree_parents(n)
    t0 = Tree.from_parents(first, name="double_binary/0")
    if n == 1:
        return t0
    if n % 2 == 0:  # mirror: rank' = n-1-rank
        order = [n - 1 - i for i in range(n)]
    else:  # shift: rank' = (rank+1) % n
        order = [(i + 1) % n for i in range(n)]
    t1 = Tree.from_parents(first).relabel(order)
    t1 = Tree.from_parents(t1.parents, name="double_binary/1")
    return MultiTree((t0, t1), (0.5, 0.5), name="double_binary")


# ---------------------------------------------------------------------- two-level
def _in_class(topology: Topology, nodes: Sequence[str], memo: dict | None = None) -> tuple[str, ...]:
    """``nodes`` of one host as the same nodes of the host standing for its class
    (:meth:`~treecoll.topo.routes.RouteTable.host_class`): the same routes among them, renamed, so
    what depends on those routes is asked once per class of hosts built alike. ``memo``: a dict
    keeping the answers across the calls of one builder call (a host's GPUs are asked for every rail)."""
    if memo is not None:
        key = ("in_class", tuple(nodes))
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = _in_class(topology, nodes)
        return hit
    node = topology.graph._node  # networkx's node dicts: no view objects on every GPU of every rail
    host = node[nodes[0]].get("host")
    rep = topology.routes.host_class(host) if host is not None else None
    if rep is None or rep == host or any(node[n].get("host") != host for n in nodes):
        return tuple(nodes)
    return tuple(rename_node(n, host, rep) for n in nodes)


def _nic_key(topology: Topology, gpu: str, nic: str | None = None):
    """(path class, -bandwidth, hops) of ``gpu``'s route to ``nic`` (None: its nearest NIC)."""
    nic = nic or topology.nearest_nic(gpu)
    if nic is None:
        return (len(NCCL_CLASSES), 0.0, 0)
    p = topology.path(gpu, nic)
    return (NCCL_CLASSES.index(p.nccl), -p.bw, p.hops)


def leader_of(
    topology: Topology, gpus: Sequence[str], members: Sequence[int], nic: str | None = None, keys: dict | None = None
) -> int:
    """The member rank whose GPU is nearest a NIC (``nic``, else its nearest): best NCCL
    path class, then bandwidth, then hops, then lowest rank. The GPUs are asked as those of the
    host standing for their host's class (:func:`_in_class`: the same answer on every host built
    alike); ``keys``: a dict keeping those answers across calls (one per builder call)."""
    keys = {} if keys is None else keys
    named = _in_class(topology, [gpus[r] for r in members] + ([nic] if nic else []), keys)
    there = named[-1] if nic else None

    def key(i: int) -> tuple:
        k = keys.get((named[i], there))
        if k is None:
            k = keys[(named[i], there)] = _nic_key(topology, named[i], there)
        return (k, members[i])

    return members[min(range(len(members)), key=key)]


def _host_is_switched(topology: Topology, gpus: Sequence[str]) -> bool:
    """Whether every pair of ``gpus`` (of one host) is joined over NVLink through an NVSwitch."""
    g = topology.graph
    for a in gpus:
        for b in gpus:
            if a != b:
                p = topology.path(a, b)
                if p.nccl != "NVL" or not any(g.nodes[x]["kind"] == "nvswitch" for x in p.nodes[1:-1]):
                    return False
    return True


def _links_tree(topology: Topology, gpus: Sequence[str], members: Sequence[int], leader: int) -> dict[int, int]:
    """Prim's tree grown from the leader: attach next the (outside, inside) pair with the best
    NCCL path class, then bandwidth, latency, shallower attachment point, lower ranks.
    NVLink pairs come before PCIe, a PCIe switch's GPUs before the host bridge, a socket's
    GPUs before the SMP link: subtrees follow links, switches and sockets."""
    parent = {leader: -1}
    depth = {leader: 0}
    rest = [r for r in members if r != leader]

    def key(uv: tuple[int, int]) -> tuple:
        u, v = uv
        p = topology.path(gpus[v], gpus[u])
        return (NCCL_CLASSES.index(p.nccl), -p.bw, p.lat, depth[u], u, v)

    while rest:
        u, v = min(((u, v) for v in rest for u in parent), key=key)  # keys differ: (u, v) end them
        parent[v] = u
        depth[v] = depth[u] + 1
        rest.remove(v)
    return parent


def _parse_kind(spec: str, allowed: Sequence[str], what: str) -> tuple[str, int | None]:
    kind, _, arg = str(spec).partition(":")
    if kind not in allowed:
        raise TreeError(f"two_level: {what} expected one of {list(allowed)} (kary:K for fan-out K), got {spec!r}")
    k = None
    if arg:
        try:
            k = int(arg)
        except ValueError:
            raise TreeError(f"two_level: {what} fan-out expected an integer after ':', got {spec!r}") from None
        if kind != "kary" or k < 1:
            raise TreeError(f"two_level: {what} expected kary:K with a fan-out K >= 1, got {spec!r}")
    return kind, k


def _intra(topology, gpus, members: list[int], leader: int, spec: str, switched: dict | None = None) -> dict[int, int]:
    """Intra-host tree under ``leader``; ``switched`` caches :func:`_host_is_switched` per member GPUs
    (as GPUs of their host's class, :func:`_in_class`) across the hosts and rails of one
    :func:`two_level` call."""
    kind, k = _parse_kind(spec, INTRA_KINDS, "intra")
    if kind == "auto":
        if switched is None:
            switched = {}
        key = _in_class(topology, [gpus[r] for r in members], switched)
        if key not in switched:
            switched[key] = len(members) > 1 and _host_is_switched(topology, key)
        kind = "star" if switched[key] else "links"
    if kind == "links":
        return _links_tree(topology, gpus, members, leader)
    order = [leader] + [r for r in members if r != leader]
    shape = _shape(kind, len(order), k)
    return {order[i]: (-1 if p == -1 else order[p]) for i, p in enumerate(shape)}


def _host_groups(topology: Topology, gpus: Sequence[str]) -> dict[str, list[int]]:
    hosts: dict[str, list[int]] = {}
    for r, x in enumerate(gpus):
        hosts.setdefault(topology.host_of(x), []).append(r)
    return hosts


def _network_bw(topology: Topology, gpu: str) -> float:
    """GB/s between a GPU and the network: the slowest of its route to its nearest NIC (asked of the
    host standing for its host's class, :func:`_in_class`) and that NIC's links to and from network
    switches (inf without a NIC)."""
    nic = topology.nearest_nic(gpu)
    if nic is None:
        return math.inf
    g = topology.graph
    node = g._node  # networkx's dicts: no view objects for every host of every rail
    bws = [topology.path(*_in_class(topology, (gpu, nic))).bw]
    bws += [d["bw"] for nb, d in g._succ[nic].items() if node[nb]["kind"] == "net_switch"]
    bws += [d["bw"] for nb, d in g._pred[nic].items() if node[nb]["kind"] == "net_switch"]
    return min(bws)


def _speed_levels(bws: dict[str, float]) -> dict[str, int]:
    """0 for the hosts within a factor sqrt(2) of the fastest, 1 for the next half octave, ...
    (measured bandwidths differ by noise; a slow NIC by far more)."""
    best = max(bws.values(), default=math.inf)
    if not math.isfinite(best):
        return {h: 0 for h in bws}
    return {h: max(0, math.floor(2 * math.log2(best / bw))) for h, bw in bws.items()}


def _slow_to_leaves(order: list[str], shape: list[int], level: dict[str, int], keep_first: bool) -> list[str]:
    """``order`` (host at each position of ``shape``) with the slowest hosts moved to leaf positions.

    Position 0 keeps its host when ``keep_first`` (the root's host), else takes the fastest
    (first on ties). The interior positions go to the fastest hosts, preferring those already
    interior on ties, each group in its original order: equal hosts keep the original tree.
    """
    if len({level[h] for h in order}) < 2:
        return order
    if not keep_first:
        head = min(range(len(order)), key=lambda i: (level[order[i]], i))
        order = [order[head]] + order[:head] + order[head + 1 :]
    n = len(order)
    inner = [False] * n
    for p in shape:
        if p != -1:
            inner[p] = True
    slots = sum(inner[1:])
    ranked = sorted(range(1, n), key=lambda i: (level[order[i]], not inner[i], i))
    chosen = set(ranked[:slots])
    fast = [order[i] for i in range(1, n) if i in chosen]
    slow = [order[i] for i in range(1, n) if i not in chosen]
    return [order[0]] + [fast.pop(0) if inner[i] else slow.pop(0) for i in range(1, n)]


def _one_two_level(
    topology,
    gpus,
    hosts: dict[str, list[int]],
    leaders: dict[str, int],
    root_host: str,
    intra: str,
    inter: str,
    name: str,
    switched: dict | None = None,
) -> Tree:
    n = len(gpus)
    parents = [-1] * n
    for h, members in hosts.items():
        for r, p in _intra(topology, gpus, members, leaders[h], intra, switched).items():
            parents[r] = p
    # inter-host: groups of hosts under the same leaf switches stay together
    groups = []
    for grp in topology.leaf_groups():
        hs = [h for h in grp if h in hosts]
        if hs:
            groups.append(hs)
    groups.sort(key=lambda hs: root_host not in hs)  # stable: the root's group first
    groups = [sorted(hs, key=lambda h: h != root_host) for hs in groups]
    kind, k = _parse_kind(inter, INTER_KINDS, "inter")
    level = _speed_levels({h: _network_bw(topology, gpus[leaders[h]]) for h in hosts}) if len(hosts) > 2 else {}

    def link(order: list[str], keep_first: bool) -> list[str]:
        shape = _shape(kind, len(order), k)
        if level:
            order = _slow_to_leaves(order, shape, level, keep_first)
        for i, p in enumerate(shape):
            if p != -1:
                parents[leaders[order[i]]] = leaders[order[p]]
        return order

    heads = [link(hs, root_host in hs)[0] for hs in groups]
    link(heads, True)
    return Tree.from_parents(parents, name=name)


def two_level(
    topology: Topology | None,
    gpus: Sequence[str] | None,
    nranks: int,
    *,
    intra: str = "auto",
    inter: str = "binomial",
    rails: bool | str = "auto",
    nbytes: int | None = None,
    root: int | None = None,
    collective: str = "allreduce",
    model: CostModel | None = None,
) -> Tree | MultiTree:
    """Intra-host trees under leaders near a NIC, an inter-host tree over the leaders.

    * ``intra``: ``auto`` (NVSwitch hosts: ``star``, shallow and wide; other
      hosts: ``links``, Prim's tree over path class and bandwidth, which follows
      NVLink meshes, PCIe switches and keeps each socket's GPUs together), or a
      shape ``star``, ``chain``, ``binomial``, ``kary:K`` under the leader.
    * ``inter``: ``binomial`` (default), ``chain``, ``star``, ``kary:K`` over
      the leaders of each leaf-switch group (:meth:`Topology.leaf_groups`),
      then the same shape over the groups' first hosts.
    * leaders: the root's host is led by ``root`` when given; every other host
      by its GPU nearest a NIC (path class, bandwidth, hops).
    * slow hosts: with three hosts or more, hosts whose network bandwidth (the
      leader's route to its NIC and the NIC's switch links) is more than a factor
      sqrt(2) below the fastest take the leaf positions of the inter-host shapes
      (and never lead a leaf group or, without ``root``, the tree); hosts within
      that factor keep the order above.
    * ``rails``: True builds one tree per NIC rail k (leader = the GPU nearest
      NIC k of its host; shares proportional to NIC bandwidth) so every NIC
      carries a share; ``"auto"``: with several hosts, more than one NIC on
      every host, ``nbytes`` given and no ``root``, whichever of the two the
      cost model (``model``, default :class:`CostModel` on ``gpus``) predicts
      faster for ``collective`` on ``nbytes`` bytes, each at its best chunk
      count (ties: one tree); else one tree.
    """
    if topology is None or gpus is None:
        raise TreeError("two_level: needs a topology (hosts, links and NICs) and the GPU of each rank; got none")
    hosts = _host_groups(topology, gpus)
    root_host = topology.host_of(gpus[root if root is not None else 0])
    if root is None and len(hosts) > 2:  # no rank the result must reach: root at a fast host
        keys0: dict = {}
        level = _speed_levels(
            {h: _network_bw(topology, gpus[leader_of(topology, gpus, m, keys=keys0)]) for h, m in hosts.items()}
        )
        if level[root_host] > min(level.values()):
            root_host = next(h for h in hosts if level[h] == min(level.values()))
    nic_counts = [len(topology.nics(h)) for h in hosts]
    if rails == "auto":
        if nbytes is None or root is not None or not rails_possible(topology, gpus):
            rails = False
        else:
            one = two_level(
                topology, gpus, nranks, intra=intra, inter=inter, rails=False, nbytes=nbytes, collective=collective
            )
            per_rail = two_level(
                topology, gpus, nranks, intra=intra, inter=inter, rails=True, nbytes=nbytes, collective=collective
            )
            model = model or CostModel(topology, gpus)
            t_rails = model.best_nchunks(per_rail, nbytes, collective)[1]
            return per_rail if t_rails < model.best_nchunks(one, nbytes, collective)[1] else one
    if rails not in (True, False):
        raise TreeError(f"two_level: rails expected True, False or 'auto', got {rails!r}")
    label = f"two_level(intra={intra},inter={inter}"
    switched: dict = {}  # host members -> NVSwitch-connected (computed once for all rails)
    keys: dict = {}  # a GPU of a class's host (and a NIC) -> leader_of's key
    if not rails:
        leaders = {h: leader_of(topology, gpus, m, keys=keys) for h, m in hosts.items()}
        if root is not None:
            leaders[root_host] = root
        elif len(hosts) == 1:
            leaders[root_host] = hosts[root_host][0]
        return _one_two_level(topology, gpus, hosts, leaders, root_host, intra, inter, label + ")", switched)
    nrails = min(nic_counts)
    if nrails < 1:
        raise TreeError("two_level: rails=True needs NICs on every host; a host has none")
    trees, bws = [], []
    for k in range(nrails):
        leaders = {h: leader_of(topology, gpus, m, topology.nics(h)[k], keys) for h, m in hosts.items()}
        trees.append(
            _one_two_level(topology, gpus, hosts, leaders, root_host, intra, inter, f"{label},rail={k})", switched)
        )
        bws.append(min(float(topology.node(topology.nics(h)[k]).get("bw") or 1.0) for h in hosts))
    if len(trees) == 1:
        return trees[0]
    return MultiTree(tuple(trees), tuple(b / sum(bws) for b in bws), name=label + ",rails)")


def rails_possible(topology: Topology, gpus: Sequence[str]) -> bool:
    """Whether per-rail trees differ from one tree: two hosts or more, each with two NICs or more."""
    hosts = _host_groups(topology, gpus)
    return len(hosts) >= 2 and min(len(topology.nics(h)) for h in hosts) >= 2


# ---------------------------------------------------------------------- auto
def _reroot(t: Tree, v: int) -> Tree:
    parents = list(t.parents)
    prev, cur = -1, v
    while cur != -1:
        nxt = parents[cur]
        parents[cur] = prev
        prev, cur = cur, nxt
    return Tree.from_parents(parents, name=t.name)


def _candidates(
    topology: Topology | None, gpus: Sequence[str] | None, n: int, nbytes: int, root: int | None
) -> list[Tree | MultiTree]:
    r = 0 if root is None else root
    out: list[Tree | MultiTree] = [
        chain(None, gpus, n, root=r),
        binomial(None, gpus, n, root=r),
        star(None, gpus, n, root=r),
    ]
    out += [kary(None, gpus, n, k=k, root=r) for k in range(2, min(n - 1, 8))]
    if root is None and n > 2:
        out.append(double_binary(None, gpus, n))
    if topology is not None:
        for intra in ("auto", "star", "chain", "binomial", "links"):
            for inter in ("binomial", "chain", "kary:2"):
                for rails in (False, True):
                    try:
                        out.append(
                            two_level(
                                topology, gpus, n, intra=intra, inter=inter, rails=rails, nbytes=nbytes, root=root
                            )
                        )
                    except TreeError:
                        pass
    seen, uniq = set(), []
    for c in out:
        if c.fingerprint() not in seen:
            seen.add(c.fingerprint())
            uniq.append(c)
    return uniq


def auto(
    topology: Topology | None,
    gpus: Sequence[str] | None,
    nranks: int,
    *,
    nbytes: int = 1 << 20,
    op: Any = None,
    collective: str = "allreduce",
    root: int | None = None,
    search: bool = True,
    search_limit: int = 8,
    starts: int = 4,
    kicks: int = 16,
    exact_limit: int = 5,
    model: CostModel | None = None,
) -> Tree | MultiTree:
    """The tree with the least predicted time for ``collective`` on ``nbytes``.

    Candidates: chain, binomial, star, kary k = 2..7, double_binary and (with a
    topology) two_level over intra x inter shapes, with and without rails;
    each is scored at its best chunk count (:meth:`CostModel.best_nchunks`).
    Small groups then search single trees: up to ``exact_limit`` ranks every
    rooted spanning tree is scored (exact); up to ``search_limit`` ranks the
    ``starts`` best single-tree candidates are improved by local search (move
    one rank with its subtree under another parent, swap two ranks, re-root)
    until no move lowers the predicted time, then ``kicks`` random double
    moves from the best tree each followed by local search (iterated local
    search, seeded: deterministic). A multitree candidate stays when no single
    tree beats it. A non-commutative ``op``
    (``op.commutative`` False, or a plain callable) restricts the search to
    order-preserving trees rooted at 0. With a commutative operator every tree is
    scored, and returned, with its children in their best broadcast order
    (:meth:`CostModel.best_ordered`). Ties keep the earlier candidate, so the
    result is deterministic.
    """
    from .ops import resolve_op

    commutative = resolve_op(op).commutative if op is not None else True
    if not commutative and root not in (None, 0):
        raise TreeError(f"auto: a non-commutative operator needs an order-preserving tree rooted at 0, got root {root}")
    model = model or CostModel(topology, gpus, nranks=nranks if gpus is None else None)

    memo: dict = {}

    def score(t) -> float:
        key = (t.parents, t.children) if isinstance(t, Tree) else t.fingerprint()
        if key not in memo:
            memo[key] = (
                model.best_ordered(t, nbytes, collective)[2]
                if commutative
                else model.best_nchunks(t, nbytes, collective)[1]
            )
        return memo[key]

    def finish(t):
        """The chosen plan, children in their best broadcast order (commutative ops only)."""
        if not commutative:
            return t
        ordered = model.best_ordered(t, nbytes, collective)[0]
        return ordered if isinstance(ordered, MultiTree) else Tree(ordered.parents, ordered.children, name=t.name)

    cands = _candidates(topology, gpus, nranks, nbytes, root)
    if not commutative:
        cands = [c for c in cands if c.is_order_preserving()]
    best, best_t = cands[0], score(cands[0])
    for c in cands[1:]:
        s = score(c)
        if s < best_t * (1 - 1e-12):
            best, best_t = c, s
    if not search or nranks > search_limit or nranks < 3:
        return finish(best)
    singles = sorted((c for c in cands if isinstance(c, Tree)), key=score)[:starts]
    if isinstance(best, MultiTree):
        singles.append(min(best.trees, key=score))
    if nranks <= exact_limit and commutative:
        from .bruteforce import rooted_trees

        singles.extend(t for t in rooted_trees(nranks) if root is None or t.root == root)
        cur_t, cur = min(((score(t), t) for t in singles), key=lambda x: x[0])
    else:
        cur, cur_t = _local_search(singles[0], score, root=root, commutative=commutative)
        for start in singles[1:]:
            c, c_t = _local_search(start, score, root=root, commutative=commutative)
            if c_t < cur_t * (1 - 1e-9):
                cur, cur_t = c, c_t
        rng = random.Random(nranks)  # iterated local search: deterministic kicks
        for _ in range(kicks):
            p = list(cur.parents)
            for _ in range(2):
                kicked = _random_move(Tree.from_parents(p), rng, root)
                p = list(kicked.parents)
            k = Tree.from_parents(p)
            if not commutative and not k.is_order_preserving():
                continue
            c, c_t = _local_search(k, score, root=root, commutative=commutative)
            if c_t < cur_t * (1 - 1e-9):
                cur, cur_t = c, c_t
    if cur_t < best_t * (1 - 1e-9):
        best, best_t = Tree(cur.parents, cur.children, name="auto"), cur_t
    return finish(best)


def _random_move(t: Tree, rng: random.Random, root: int | None) -> Tree:
    moves = list(_moves(t, root))
    return moves[rng.randrange(len(moves))] if moves else t


def _moves(t: Tree, root: int | None):
    """Neighbours of ``t``: one rank under another parent, two ranks swapped, a new root."""
    n = t.size
    for v in range(n):
        if v == t.root:
            continue
        sub = set(t.subtree(v))
        for u in range(n):
            if u not in sub and u != t.parents[v]:
                p = list(t.parents)
                p[v] = u
                yield Tree.from_parents(p)
    for a in range(n):
        for b in range(a + 1, n):
            if root is not None and root in (a, b):
                continue
            order = list(range(n))
            order[a], order[b] = b, a
            yield t.relabel(order)
    if root is None:
        for v in range(n):
            if v != t.root:
                yield _reroot(t, v)


def _local_search(start: Tree, score, *, root: int | None, commutative: bool) -> tuple[Tree, float]:
    """First-improvement descent over :func:`_moves` until no move lowers ``score``."""
    cur, cur_t = start, score(start)
    improved = True
    while improved:
        improved = False
        for m in _moves(cur, root):
            if not commutative and not m.is_order_preserving():
                continue
            s = score(m)
            if s < cur_t * (1 - 1e-9):
                cur, cur_t, improved = m, s, True
                break
    return cur, cur_t


# ---------------------------------------------------------------------- registry
BUILDERS: dict[str, Callable] = {
    "chain": chain,
    "binomial": binomial,
    "kary": kary,
    "star": star,
    "double_binary": double_binary,
    "two_level": two_level,
    "auto": auto,
}


def build(
    name: str,
    placement: Placement | Topology | None = None,
    ranks: RanksArg = None,
    *,
    nranks: int | None = None,
    **opts: Any,
) -> Tree | MultiTree:
    """Build the tree ``name`` (``"kary:4"`` passes k=4) over group ranks 0..P-1.

    ``placement``: a :class:`~treecoll.collectives.placement.Placement`, or a Topology /
    None with ``ranks`` (a count, or a GPU id / topology rank per group rank) and
    ``nranks`` as :func:`~treecoll.collectives.placement.as_placement` takes them.
    Without a topology only the rank count matters and topology-aware builders fail.
    """
    base, _, arg = str(name).partition(":")
    if base not in BUILDERS:
        raise TreeError(f"builder {name!r}: unknown; valid names are {sorted(BUILDERS)}")
    if arg:
        if base != "kary":
            raise TreeError(f"builder {name!r}: only 'kary:K' takes an argument")
        try:
            opts["k"] = int(arg)
        except ValueError:
            raise TreeError(f"builder {name!r}: expected an integer fan-out after ':'") from None
    if placement is None and ranks is None and nranks is None:
        raise TreeError(f"builder {name!r}: expected a topology, ranks or nranks >= 1, got none")
    p = as_placement(placement, ranks, nranks=nranks, what=f"builder {name!r}")
    return BUILDERS[base](p.topology, p.gpus, p.nranks, **opts)
