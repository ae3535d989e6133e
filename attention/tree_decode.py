"""Tree Attention decoding: one tree reduction of the packed attention state.

Every rank of a process group holds a slice of each sequence's keys and values
(any split along the sequence, any lengths, possibly none).  One decode step:

1. ``decode_partial`` on the local shard gives the local state ``(out, lse)``
   (float32 ``[batch, q_heads, head_dim]`` and ``[batch, q_heads]``, natural log);
   a rank with no keys for a sequence contributes ``(0, -inf)``, the identity.
2. The state is packed into ONE contiguous float32 buffer
   (:func:`attention.pack_state`: ``batch*q_heads*(head_dim+1)`` elements) and
   reduced up a :class:`collectives.Tree` with :class:`attention.MergeOp` (the
   associative, commutative attention merge, in float32) through
   :func:`collectives.reduce`: one message per tree edge, whatever the context
   length.
3. The root's merged state is broadcast down the same tree (the reduction and
   the broadcast run as one compiled schedule, ``collectives.allreduce(algo="tree")``),
   so every rank returns the same output.  With
   ``root_only=True`` the broadcast is skipped: only the tree root's return
   value is the attention output; the other ranks return their partially
   merged subtree state (meaningless to callers).  :func:`tree_root` tells which
   rank is the root.

``tree="auto"`` builds the two-level tree (``treecoll.collectives.builders.build
("two_level", topology, range(P), rails=False)``: one tree, since the packed
state is merged whole, never split over rails) for the group's topology: ``topology`` if
given; else :func:`topo.discover_cluster` over the group when that function
exists; else a CPU-local topology of the group (one host, ``P`` rank slots:
:func:`treecoll.topo.discover.cpu_only_host`), which is what a gloo group on one machine
is.  The tree is built once per (group, topology) and cached.  ``tree`` may also
be a :class:`collectives.Tree` over ``P`` ranks (built, imported or hand-made)
or another builder name of the ``treecoll.collectives.builders`` registry.

Compared with the paper's Algorithm 3 (all-reduce max, then numerator, then
denominator; :func:`treecoll.attention.baselines.allreduce3_decode`) this sends one
packed message per edge instead of three collectives, keeps the LSE exact (the
merge is the float32 max-shifted log-sum-exp), and follows the topology.
"""
from __future__ import annotations

import hashlib

import torch
from treecoll.attention.decode import decode_partial
from treecoll.attention.dist import agree_on_inputs, group_info
from treecoll.attention.state import MergeOp, pack_state, unpack_state
from treecoll.topo.errors import AttentionError

__all__ = ["group_topology", "resolve_tree", "tree_combine", "tree_decode", "tree_root"]

#: how :func:`tree_combine` returns the merged state to every rank
BCAST_MODES = ("tree", "separate", "native")
_TREE_CACHE: dict = {}
_TOPO_CACHE: dict = {}


def _group_key(group):
    """Cache key of a process group: the group object (the default group's
    current object when None), so a re-initialised default group misses."""
    _, size = group_info(group)
    if size == 1:
        return ("single",)
    import torch.distributed as dist

    pg = group if group is not None else dist.group.WORLD
    return (id(pg), size, dist.get_rank(group))


def group_topology(group=None, topology=None):
    """The topology ``tree="auto"`` uses for ``group``: ``topology`` if given;
    ``topo.discover_cluster(group)`` if the topo package provides it (a collective:
    every rank calls it; cached per group, so it runs on the first call only); else a
    CPU-local topology: one host ``"local"`` with one NUMA domain and ``P`` rank
    slots (kind ``gpu``, model ``"cpu"``), as :func:`treecoll.topo.discover.cpu_only_host`
    builds for a GPU-less machine.  The fallback is right for a gloo group on one
    machine; for a group spanning hosts pass ``topology`` (or use discovery).
    A given topology's rank ``r`` (:meth:`topo.Topology.rank_gpus`) is taken to be
    group rank ``r``: for a subgroup, pass a topology whose ranks are mapped so."""
    if topology is not None:
        return topology
    from treecoll import topo

    key = _group_key(group)
    hit = _TOPO_CACHE.get(key)
    if hit is not None:
        return hit[1]
    discover_cluster = getattr(topo, "discover_cluster", None)
    if discover_cluster is not None and group_info(group)[1] > 1:
        found = discover_cluster(group)
        _TOPO_CACHE[key] = (group if group is not None else _world(), found)
        return found
    from treecoll.topo import Topology
    from treecoll.topo.discover import cpu_only_host

    size = group_info(group)[1]
    local = Topology(cpu_only_host("local", {0: ""}, size), name="local-cpu",
                     meta={"source": "treecoll.attention.tree_decode: CPU-local fallback, one host with "
                                     f"{size} rank slots"})
    _TOPO_CACHE[key] = (group if group is not None else _world(), local)
    return local


def _world():
    import torch.distributed as dist

    return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None


def resolve_tree(tree="auto", *, group=None, topology=None):
    """The :class:`collectives.Tree` a call with these arguments reduces over.

    ``tree``: a ``Tree`` (its size must equal the group's), ``"auto"`` (the
    two-level builder on :func:`group_topology`) or a builder name of
    ``treecoll.collectives.builders``.  Cached per (group, tree, topology fingerprint).
    """
    from treecoll.collectives import Tree

    _, size = group_info(group)
    if isinstance(tree, Tree):
        if tree.size != size:
            raise AttentionError(
                f"tree: expected a Tree over the group's {size} ranks, got one over {tree.size} ranks; "
                f"build it for the group size"
            )
        return tree
    if not isinstance(tree, str):
        raise AttentionError(f"tree: expected 'auto', a builder name or a collectives.Tree, got {type(tree).__name__}")
    topology = group_topology(group, topology)
    key = (_group_key(group), tree, topology.fingerprint())
    hit = _TREE_CACHE.get(key)
    if hit is not None:
        return hit[1]
    from treecoll.collectives import builders

    name = "two_level" if tree == "auto" else tree
    opts = {"rails": False} if name == "two_level" else {}
    built = builders.build(name, topology, list(range(size)), **opts)
    if not isinstance(built, Tree):
        raise AttentionError(
            f"tree: the {name!r} builder returned a {type(built).__name__} (a message split over several "
            f"trees), expected one Tree: the packed attention state is merged whole; pick a single-tree builder"
        )
    if built.size != size:
        raise AttentionError(
            f"tree: the {name!r} builder returned a tree over {built.size} ranks, expected {size} "
            f"(the group's size); the topology {topology.name!r} has {len(topology.gpus())} GPUs"
        )
    _TREE_CACHE[key] = (group if group is not None else _world(), built)
    return built


def tree_root(tree="auto", *, group=None, topology=None) -> int:
    """Group-local rank of the tree root (where ``root_only`` results are valid)."""
    return resolve_tree(tree, group=group, topology=topology).root


def _fingerprint_int(t) -> int:
    return int(hashlib.sha256(t.fingerprint().encode()).hexdigest()[:15], 16)


def _merge_op(batch: int, heads: int, head_dim: int):
    """:class:`attention.MergeOp` as a collectives operator: commutative, and never
    split into chunks (the packed buffer is ``out`` then ``lse``: a chunk of it is
    not a state)."""
    from treecoll.collectives.ops import resolve_op

    return resolve_op(MergeOp(batch=batch, heads=heads, head_dim=head_dim),
                      commutative=True, chunkable=False)


def tree_combine(out: torch.Tensor, lse: torch.Tensor, *, group=None, tree="auto", topology=None,
                 root_only: bool = False, bcast: str = "tree"):
    """Merge every rank's state through the tree (the communication part of
    :func:`tree_decode`, for states already computed).

    ``out`` float32 ``[batch, heads, head_dim]``, ``lse`` float32 ``[batch, heads]``
    (natural log).  Returns the merged ``(out, lse)`` (float32, same shapes) on
    every rank, or only on the tree root with ``root_only``.  NaN and inf follow
    the policy of :mod:`treecoll.attention.state`: a rank's NaN or ``+inf`` lse makes that
    row NaN on every rank; the other rows keep every rank's contribution.  The callers check
    that ranks agree on shapes (:func:`tree_decode` does, with ``check``).
    ``bcast``: how the result goes back down the tree: ``"tree"`` (the default:
    the reduction and the broadcast down the same tree compiled as ONE schedule,
    ``collectives.allreduce(algo="tree")``, so a rank forwards the merged state
    to its children as soon as it has it, without a second collective call),
    ``"separate"`` (``collectives.reduce`` then ``collectives.broadcast``: the
    same messages in two calls) or ``"native"`` (``collectives.reduce``, then
    ``torch.distributed.broadcast`` from the root: the backend's own
    algorithm).  ``root_only`` runs the reduction alone.  The three were
    measured side by side: docs/benchmarks.md "Tree attention".
    """
    if bcast not in BCAST_MODES:
        raise AttentionError(f"bcast: expected one of {list(BCAST_MODES)}, got {bcast!r}")
    batch, heads, head_dim = out.shape
    _, size = group_info(group)
    if size == 1:
        return out, lse
    t = resolve_tree(tree, group=group, topology=topology)
    from treecoll import collectives

    buf = pack_state(out, lse)
    op = _merge_op(batch, heads, head_dim)
    if not root_only and bcast == "tree":
        collectives.allreduce(buf, op=op, tree=t, algo="tree", group=group, out=buf)
        return unpack_state(buf, batch, heads, head_dim)
    # in place on the packed buffer: the root ends with the merged state, the
    # other ranks with their subtree's partial state (overwritten by the broadcast)
    collectives.reduce(buf, root=t.root, op=op, tree=t, group=group, out=buf)
    if not root_only and bcast == "native":
        import torch.distributed as dist
        from treecoll.attention.dist import to_global

        dist.broadcast(buf, to_global(group, t.root), group=group)
    elif not root_only:
        collectives.broadcast(buf, root=t.root, tree=t, group=group, out=buf)
    return unpack_state(buf, batch, heads, head_dim)


def tree_decode(q, k_shard, v_shard, *, kv_len=None, group=None, tree="auto", topology=None,
                root_only: bool = False, scale=None, check: bool = True, return_lse: bool = False,
                bcast: str = "tree"):
    """Decode attention over a KV cache sharded along the sequence, combined by one tree reduction.

    Parameters
    ----------
    q : Tensor [batch, q_heads, head_dim] (fp16/bf16/fp32), the same on every rank.
    k_shard, v_shard : Tensor [batch, seq_local, kv_heads, head_dim]: this rank's
        keys/values (any split of each sequence over the ranks; ``seq_local`` may
        differ between ranks and be 0).
    kv_len : valid local keys per sequence, int or [batch] (default ``seq_local``);
        0 means this rank holds nothing of that sequence.
    group : torch.distributed process group (default: the default group; a
        process without torch.distributed initialised is a group of one).
    tree : ``"auto"``, a builder name, or a :class:`collectives.Tree` over the group.
    topology : :class:`topo.Topology` for ``"auto"`` (see :func:`group_topology`).
    root_only : skip the broadcast; only the root rank's output is meaningful.
    scale : score scale, default ``1/sqrt(head_dim)``.
    check : all-gather a small signature first (batch, heads, head_dim, dtypes,
        tree fingerprint) so that ranks that disagree raise
        :class:`~topo.errors.AttentionError` instead of hanging; one extra tiny
        collective, so a decode loop checks its first step and then passes False.
    return_lse : also return the merged LSE float32 [batch, q_heads].
    bcast : ``"tree"`` (default), ``"separate"`` or ``"native"``: see :func:`tree_combine`.

    Returns
    -------
    out : float32 [batch, q_heads, head_dim], equal to attention over the
        concatenation of all shards (within the kernels' tolerances); with
        ``return_lse``, ``(out, lse)``.
    """
    _, size = group_info(group)
    t = resolve_tree(tree, group=group, topology=topology) if size > 1 else None
    if check and size > 1:
        agree_on_inputs("tree_decode", group, q, k_shard, v_shard, kv_len, scale,
                        extra=(_fingerprint_int(t), int(root_only)), extra_names=("tree fingerprint", "root_only"))
    out, lse = decode_partial(q, k_shard, v_shard, kv_len=kv_len, scale=scale)
    if size > 1:
        out, lse = tree_combine(out, lse, group=group, tree=t, root_only=root_only, bcast=bcast)
    return (out, lse) if return_lse else out
