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
   the broadcast run as one compiled schedule, ``collectives.allreduce`` with
   ``algo="tree"``), so every rank returns the same output.  With
   ``root_only=True`` the broadcast is skipped: only the tree root's return
   value is the attention output; the other ranks return their partially
   merged subtree state (meaningless to callers).  :func:`tree_root` tells which
   rank is the root.

Where the ranks run is a :class:`~treecoll.collectives.placement.Placement`
(``placement=``); without one, :func:`group_placement` makes it from ``group``
and ``topology``: the given topology (group rank r on its r-th GPU), else
:func:`topo.discover_cluster` over the group (a collective: every rank calls
it; the planner keeps its result while the group lives), else a CPU-local
topology of the group (one host, ``P`` rank slots:
:func:`treecoll.topo.discover.cpu_only_host`), which is what a gloo group on one
machine is.

``tree`` takes what the executor's ``tree=`` takes (through the same
:meth:`~treecoll.collectives.planner.Planner.plan_for`): a
:class:`collectives.Tree` over the group, a multitree of one tree, a loaded tree
file, a tree file path, a builder name, or ``"auto"``: the two-level builder
without rails (``two_level`` with ``rails=False``: one tree, since the packed
state is merged whole, never split over rails; an explicit ``"two_level"`` is
built so too).  Trees are kept by the planner per (placement, tree).

Combine methods (``combine=``), side by side with the same arguments and result:

* ``"tree"``: the tree reduction and broadcast above;
* ``"gather"``: one ``torch.distributed`` all-gather (``all_gather_single``) of the ``P`` packed
  states, then every rank merges the ``P`` states locally
  (:func:`treecoll.attention.merge_states`), as vLLM's decode context parallelism
  does (it all-gathers the LSEs, https://github.com/vllm-project/vllm
  ``vllm/attention/ops/common.py``): one collective, ``P - 1`` states received
  per rank, the backend's own algorithm, topology-blind;
* ``"allreduce3"``: the paper's three all-reduces (:func:`allreduce3_combine`);
* ``"auto"`` (the default): the fastest of ``tree``, ``gather`` and ``allreduce3`` by
  the cost model (:func:`treecoll.attention.cost.choose_combine`: simulated on the
  placement's topology for this state size, as the group's backend runs them,
  NCCL's or gloo's; deterministic, so every rank picks the same; kept per
  placement and shape), so that the default is never slower, by the model, than
  the backend's own collectives; a ``tree`` other than ``"auto"``, ``root_only`` or
  a ``bcast`` other than ``"tree"`` (options of the tree alone) make it the tree.

Every method merges in float32 and follows the NaN/inf policy of
:mod:`treecoll.attention.state`.  Ring Attention, which moves the K/V shards instead
of states, is :func:`treecoll.attention.ring_decode`; every decode method by name:
:func:`treecoll.attention.baselines.method`.

Compared with the paper's Algorithm 3 (all-reduce max, then numerator, then
denominator; :func:`treecoll.attention.baselines.allreduce3_decode`) this sends one
packed message per edge instead of three collectives, keeps the LSE exact (the
merge is the float32 max-shifted log-sum-exp), and follows the topology.

>>> from treecoll.collectives import Placement
>>> resolve_tree("kary:3", placement=Placement(ranks=7)).children[0]
(1, 3, 5)
>>> resolve_tree("double_binary", placement=Placement(ranks=4))
Traceback (most recent call last):
...
treecoll.topo.errors.AttentionError: tree: 'double_binary' is a MultiTree of 2 trees (...), expected one Tree: ...
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from treecoll.attention.decode import decode_partial
from treecoll.attention.dist import agree_on_inputs
from treecoll.attention.state import MergeOp, online_to_state, pack_state, unpack_state
from treecoll.collectives.execute import CollectiveOptions
from treecoll.collectives.group import group_info, resolve_group
from treecoll.collectives.placement import Placement, as_placement
from treecoll.collectives.planner import LRU, default_planner
from treecoll.collectives.tree import MultiTree, Tree
from treecoll.topo import Topology
from treecoll.topo.errors import AttentionError

__all__ = [
    "COMBINES",
    "all_gather_single",
    "allreduce3_combine",
    "choose_combine",
    "gather_combine",
    "group_placement",
    "resolve_tree",
    "tree_combine",
    "tree_decode",
    "tree_root",
]

#: how :func:`tree_combine` returns the merged state to every rank
BCAST_MODES = ("tree", "separate", "native")
#: the ``combine=`` methods of :func:`tree_combine` and :func:`tree_decode`
COMBINES = ("tree", "gather", "allreduce3", "auto")
#: (placement, batch, heads, head_dim, tree) -> the method "auto" picked
_CHOSEN = LRU(256)
#: the reduction and the broadcast down the same tree, one compiled schedule
_TREE_ALLREDUCE = CollectiveOptions(algo="tree")


def group_placement(
    group: Any = None, topology: Topology | None = None, *, placement: Placement | None = None
) -> Placement:
    """The placement a decode call runs on: ``placement`` if given (``group`` and
    ``topology`` must then be None), else one made from the loose arguments (see the
    module docstring): ``topology`` if given, else the group's discovered topology, else
    a CPU-local one; group rank r on the topology's r-th GPU (for a subgroup, pass a
    topology whose ranks are mapped so).  A process without torch.distributed is a
    group of one."""
    if placement is not None:
        if topology is not None:
            raise AttentionError("placement: got a placement and a topology; pass the topology inside the Placement")
        return as_placement(placement, group=group)
    size = group_info(group, single_process=True).size
    if topology is None:
        topology = _discovered(group, size)
    return Placement(topology, size, group=group)


def _discovered(group: Any, size: int) -> Topology:
    """What ``tree="auto"`` plans on without a topology (kept per group by the planner)."""
    from treecoll import topo

    if size == 1:
        return _cpu_local(1)
    discover_cluster = getattr(topo, "discover_cluster", None)
    make = (lambda: discover_cluster(group)) if discover_cluster is not None else (lambda: _cpu_local(size))
    return default_planner().group_topology(resolve_group(group), make)


def _cpu_local(size: int) -> Topology:
    from treecoll.topo.discover import cpu_only_host

    return Topology(
        cpu_only_host("local", {0: ""}, size),
        name="local-cpu",
        meta={"source": f"treecoll.attention.tree_decode: CPU-local fallback, one host with {size} rank slots"},
    )


def resolve_tree(
    tree: Any = "auto", *, placement: Placement | None = None, group: Any = None, topology: Topology | None = None
) -> Tree:
    """The :class:`collectives.Tree` a call with these arguments reduces over.

    ``tree``: anything the executor's ``tree=`` takes, or ``"auto"`` (module docstring);
    it must be ONE tree over the placement's ranks (:class:`AttentionError` for a
    multitree of several, :class:`~treecoll.topo.errors.TreeError` for another size).
    Kept by the planner per (placement, tree).
    """
    p = group_placement(group, topology, placement=placement)
    name = "two_level" if tree == "auto" else tree
    opts = {"rails": False} if isinstance(name, str) and name.partition(":")[0] == "two_level" else None
    plan = default_planner().plan_for(name, collective="allreduce", nbytes=0, placement=p, builder_opts=opts)
    if isinstance(plan, MultiTree):
        if len(plan.trees) != 1:
            label = f"{tree!r}" if isinstance(tree, str) else "the tree given"
            raise AttentionError(
                f"tree: {label} is a MultiTree of {len(plan.trees)} trees (a message split over "
                f"several trees), expected one Tree: the packed attention state is merged whole; "
                f"pick a single-tree builder or tree file"
            )
        plan = plan.trees[0]
    return plan


def tree_root(
    tree: Any = "auto", *, placement: Placement | None = None, group: Any = None, topology: Topology | None = None
) -> int:
    """Group-local rank of the tree root (where ``root_only`` results are valid).

    >>> from treecoll.collectives import Placement
    >>> tree_root("chain", placement=Placement(ranks=3))
    0
    """
    return resolve_tree(tree, placement=placement, group=group, topology=topology).root


def _fingerprint_int(t: Tree) -> int:
    return int(hashlib.sha256(t.fingerprint().encode()).hexdigest()[:15], 16)


def _merge_op(batch: int, heads: int, head_dim: int):
    """:class:`attention.MergeOp` as a collectives operator: commutative, and never
    split into chunks (the packed buffer is ``out`` then ``lse``: a chunk of it is
    not a state)."""
    from treecoll.collectives.ops import resolve_op

    return resolve_op(MergeOp(batch=batch, heads=heads, head_dim=head_dim), commutative=True, chunkable=False)


def tree_combine(
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    placement: Placement | None = None,
    group: Any = None,
    tree: Any = "auto",
    topology: Topology | None = None,
    root_only: bool = False,
    bcast: str = "tree",
    combine: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge every rank's state through the tree (the communication part of
    :func:`tree_decode`, for states already computed).

    ``out`` float32 ``[batch, heads, head_dim]``, ``lse`` float32 ``[batch, heads]``
    (natural log).  Returns the merged ``(out, lse)`` (float32, same shapes) on
    every rank, or only on the tree root with ``root_only``.  NaN and inf follow
    the policy of :mod:`treecoll.attention.state`: a rank's NaN or ``+inf`` lse makes that
    row NaN on every rank; the other rows keep every rank's contribution.  The callers check
    that ranks agree on shapes (:func:`tree_decode` does, with ``check``).
    ``placement`` (or ``group`` and ``topology``) and ``tree``: see the module docstring.
    ``bcast``: how the result goes back down the tree: ``"tree"`` (the default:
    the reduction and the broadcast down the same tree compiled as ONE schedule,
    ``collectives.allreduce`` with ``algo="tree"``, so a rank forwards the merged state
    to its children as soon as it has it, without a second collective call),
    ``"separate"`` (``collectives.reduce`` then ``collectives.broadcast``: the
    same messages in two calls) or ``"native"`` (``collectives.reduce``, then
    ``torch.distributed.broadcast`` from the root: the backend's own
    algorithm).  ``root_only`` runs the reduction alone.  The three were
    measured side by side: docs/benchmarks.md "Tree attention".
    ``combine``: ``"auto"`` (the default), ``"tree"`` (the above), ``"gather"`` or ``"allreduce3"``
    (module docstring); ``bcast``, ``root_only`` and a given ``tree`` apply to ``"tree"``, and with
    ``"auto"`` choose it (the others give every rank the result).
    """
    if bcast not in BCAST_MODES:
        raise AttentionError(f"bcast: expected one of {list(BCAST_MODES)}, got {bcast!r}")
    _check_combine(combine)
    batch, heads, head_dim = out.shape
    p = group_placement(group, topology, placement=placement)
    if p.nranks == 1:
        return out, lse
    if combine == "auto":
        combine = _auto(batch, heads, head_dim, p, tree, root_only, bcast)
    if combine == "gather":
        return gather_combine(out, lse, group=p.group)
    if combine == "allreduce3":
        return allreduce3_combine(out, lse, group=p.group)
    t = resolve_tree(tree, placement=p)
    from treecoll import collectives

    buf = pack_state(out, lse)
    op = _merge_op(batch, heads, head_dim)
    if not root_only and bcast == "tree":
        collectives.allreduce(buf, op=op, tree=t, placement=p, out=buf, options=_TREE_ALLREDUCE)
        return unpack_state(buf, batch, heads, head_dim)
    # in place on the packed buffer: the root ends with the merged state, the
    # other ranks with their subtree's partial state (overwritten by the broadcast)
    collectives.reduce(buf, root=t.root, op=op, tree=t, placement=p, out=buf)
    if not root_only and bcast == "native":
        import torch.distributed as dist

        dist.broadcast(buf, group_info(p.group).to_global(t.root), group=p.group)
    elif not root_only:
        collectives.broadcast(buf, root=t.root, tree=t, placement=p, out=buf)
    return unpack_state(buf, batch, heads, head_dim)


def _auto(batch: int, heads: int, head_dim: int, p: Placement, tree: Any, root_only: bool, bcast: str) -> str:
    """What ``combine="auto"`` runs: the tree when the call asks for one of its own options
    (a tree other than ``"auto"``, ``root_only``, a ``bcast`` other than ``"tree"``), else
    :func:`choose_combine`'s pick."""
    if root_only or bcast != "tree" or not (isinstance(tree, str) and tree == "auto"):
        return "tree"
    return choose_combine(batch, heads, head_dim, placement=p, tree=tree)


def _check_combine(combine: Any) -> None:
    if combine not in COMBINES:
        hint = (
            "; ring moves the K/V shards, not states: call treecoll.attention.ring_decode" if combine == "ring" else ""
        )
        raise AttentionError(f"combine: expected one of {list(COMBINES)}, got {combine!r}{hint}")


def choose_combine(
    batch: int,
    heads: int,
    head_dim: int,
    *,
    placement: Placement | None = None,
    group: Any = None,
    topology: Topology | None = None,
    tree: Any = "auto",
) -> str:
    """The method ``combine="auto"`` runs for states ``[batch, heads, head_dim]`` on this placement:
    the fastest of ``tree``, ``gather`` and ``allreduce3`` by
    :func:`treecoll.attention.cost.choose_combine` (the tree given when it is a builder name, else
    the two-level builder); kept per (placement, shape, tree).

    >>> from treecoll.collectives import Placement
    >>> choose_combine(1, 32, 128, placement=Placement(ranks=1))
    'tree'
    """
    p = group_placement(group, topology, placement=placement)
    if p.nranks == 1:
        return "tree"
    name = (
        tree
        if isinstance(tree, str)
        and tree != "auto"
        and "/" not in tree
        and not tree.endswith((".yaml", ".yml", ".json"))
        else "two_level"
    )
    backend = _backend(p.group)
    key = (p.plan_key, batch, heads, head_dim, name, backend)  # never the group: it may be destroyed
    got = _CHOSEN.get(key)
    if got is None:
        from treecoll.attention.cost import choose_combine as model_choice

        got = model_choice(p, batch, heads, head_dim, tree=name, backend=backend)
        _CHOSEN[key] = got
    return got


def _backend(group: Any) -> str:
    """The cost model's name of the group's backend: ``"nccl"`` when NCCL carries it, else ``"gloo"``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return "gloo"
    return "nccl" if "nccl" in str(dist.get_backend(group)).lower() else "gloo"


def gather_combine(out: torch.Tensor, lse: torch.Tensor, *, group: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge every rank's state by one all-gather of the packed states and a local merge.

    ``out`` float32 ``[batch, heads, head_dim]``, ``lse`` float32 ``[batch, heads]`` (natural
    log), on the device the group's backend uses. Returns the merged ``(out, lse)``
    (float32, same shapes) on every rank: :func:`treecoll.attention.merge_states` over the
    ``P`` gathered states (NaN/inf as :mod:`treecoll.attention.state` says). One collective,
    ``(P - 1) * 4 * batch * heads * (head_dim + 1)`` bytes received per rank.
    """
    from treecoll.attention.state import merge_states

    batch, heads, head_dim = out.shape
    size = group_info(group, single_process=True).size
    if size == 1:
        return out, lse
    buf = pack_state(out, lse)
    gathered = torch.empty(size * buf.numel(), dtype=buf.dtype, device=buf.device)
    all_gather_single(gathered, buf, group=group)
    gathered = gathered.view(size, buf.numel())
    n_out = batch * heads * head_dim
    outs = gathered[:, :n_out].view(size, batch, heads, head_dim)
    lses = gathered[:, n_out:].view(size, batch, heads)
    return merge_states(outs, lses, dim=0)


def all_gather_single(out: torch.Tensor, x: torch.Tensor, *, group: Any = None) -> None:
    """``torch.distributed``'s all-gather of every rank's ``x`` into ``out`` (``P * x.numel()``
    elements, rank order), the one collective of the ``gather`` combine. torch >= 2.13 names it
    ``all_gather_single``; ``all_gather_into_tensor`` is its deprecated name."""
    import torch.distributed as dist

    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, x, group=group)


def allreduce3_combine(out: torch.Tensor, lse: torch.Tensor, *, group: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's three all-reduces (the communication part of
    :func:`treecoll.attention.baselines.allreduce3_decode`) for states already computed:
    ``out`` float32 [batch, heads, head_dim], ``lse`` [batch, heads]
    (natural log) -> the merged ``(out, lse)`` on every rank."""
    import torch.distributed as dist

    # NaN as +inf for the MAX (gloo's max of NaN depends on the order): the shift is
    # then +inf, a NaN or +inf lse gets the weight exp(NaN) = NaN and the finite ones
    # exp(-inf) = 0, so the row is NaN on every rank (the policy of attention.state).
    m = torch.where(torch.isnan(lse), float("inf"), lse)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    shift = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    den = torch.exp(lse - shift)  # 0 for an empty shard
    num = out * den.unsqueeze(-1)
    dist.all_reduce(num, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(den, op=dist.ReduceOp.SUM, group=group)
    return online_to_state(num, m, den)


def tree_decode(
    q: torch.Tensor,
    k_shard: torch.Tensor,
    v_shard: torch.Tensor,
    *,
    kv_len: Any = None,
    placement: Placement | None = None,
    group: Any = None,
    tree: Any = "auto",
    topology: Topology | None = None,
    root_only: bool = False,
    scale: float | None = None,
    check: bool = True,
    return_lse: bool = False,
    bcast: str = "tree",
    combine: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Decode attention over a KV cache sharded along the sequence: the local partial states combined over the
    group (by default the cost model's fastest of the tree reduction, one all-gather and three all-reduces).

    Parameters
    ----------
    q : Tensor [batch, q_heads, head_dim] (fp16/bf16/fp32), the same on every rank.
    k_shard, v_shard : Tensor [batch, seq_local, kv_heads, head_dim]: this rank's
        keys/values (any split of each sequence over the ranks; ``seq_local`` may
        differ between ranks and be 0).
    kv_len : valid local keys per sequence, int or [batch] (default ``seq_local``);
        0 means this rank holds nothing of that sequence.
    placement : :class:`~treecoll.collectives.placement.Placement` of the group's ranks
        (its process group; its topology for ``"auto"``).  Without one:
    group : torch.distributed process group (default: the default group; a
        process without torch.distributed initialised is a group of one), and
    topology : :class:`topo.Topology` for ``"auto"`` (see :func:`group_placement`).
    tree : ``"auto"``, a builder name, a :class:`collectives.Tree` over the group, a
        tree file or its path (module docstring).
    root_only : skip the broadcast; only the root rank's output is meaningful.
    scale : score scale, default ``1/sqrt(head_dim)``.
    check : all-gather a small signature first (batch, heads, head_dim, dtypes,
        tree fingerprint) so that ranks that disagree raise
        :class:`~topo.errors.AttentionError` instead of hanging; one extra tiny
        collective, so a decode loop checks its first step and then passes False.
    return_lse : also return the merged LSE float32 [batch, q_heads].
    bcast : ``"tree"`` (default), ``"separate"`` or ``"native"``: see :func:`tree_combine`.
    combine : ``"auto"`` (default), ``"tree"``, ``"gather"`` or ``"allreduce3"`` (module docstring).

    Returns
    -------
    out : float32 [batch, q_heads, head_dim], equal to attention over the
        concatenation of all shards (within the kernels' tolerances); with
        ``return_lse``, ``(out, lse)``.
    """
    p = group_placement(group, topology, placement=placement)
    _check_combine(combine)
    size = p.nranks
    t = resolve_tree(tree, placement=p) if size > 1 else None
    if check and size > 1:
        agree_on_inputs(
            "tree_decode",
            p.group,
            q,
            k_shard,
            v_shard,
            kv_len,
            scale,
            extra=(_fingerprint_int(t), int(root_only), COMBINES.index(combine)),
            extra_names=("tree fingerprint", "root_only", "combine method"),
        )
    out, lse = decode_partial(q, k_shard, v_shard, kv_len=kv_len, scale=scale)
    if size > 1:
        if combine == "auto":
            combine = _auto(q.shape[0], q.shape[1], q.shape[2], p, tree, root_only, bcast)
        out, lse = tree_combine(out, lse, placement=p, tree=t, root_only=root_only, bcast=bcast, combine=combine)
    return (out, lse) if return_lse else out
