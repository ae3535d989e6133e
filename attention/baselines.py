"""Baselines for distributed decoding, with :func:`treecoll.attention.tree_decode`'s signature.

Both are implemented as their authors run them, so that comparisons are fair:

* :func:`ring_decode`: Ring Attention decoding (the paper's baseline, as in
  ``flash_attn_jax.ring_attention.ring_fwd`` and ring-flash-attention): the
  query is replicated; each rank's K/V shard travels around the ring in
  ``P - 1`` steps (one ``batch_isend_irecv`` per step: send to rank+1, receive
  from rank-1); each step's
  transfer is overlapped with the attention on the shard in hand, whose state
  is merged (float32) into the running state.  Every rank attends to all keys
  and every rank gets the output.  Only the valid prefix of each shard
  (``max(kv_len)`` positions) is sent, and K/V travel in the cache dtype with
  the KV heads unexpanded (unlike the reference code, which expands GQA heads
  first).  Shard lengths are learned from one small all-gather per call.
  Receive buffers are double-buffered: peak extra memory is two shards.
* :func:`allreduce3_decode`: the paper's Algorithm 3 and its reference code
  (Zyphra/tree_attention, lucidrains' ``tree_attn_decode``): ``m =
  all_reduce(lse, MAX)``, then ``all_reduce(out * exp(lse - m), SUM)`` (the
  numerator), then ``all_reduce(exp(lse - m), SUM)`` (the denominator), out =
  numerator / denominator.  In float32 (the reference code uses the input
  dtype), with the ``-inf`` guards and the NaN/inf policy of
  :mod:`treecoll.attention.state` (empty shards are exact identities).

``tree``, ``topology`` and ``root_only`` are accepted for signature
compatibility and ignored (both baselines give every rank the output).

In one process (no process group) every method is the local decode over the
whole cache:

>>> import torch
>>> from treecoll.attention.decode import decode_partial
>>> g = torch.Generator().manual_seed(0)
>>> q = torch.randn(1, 4, 8, generator=g)
>>> k, v = torch.randn(1, 50, 2, 8, generator=g), torch.randn(1, 50, 2, 8, generator=g)
>>> out = ring_decode(q, k, v)
>>> torch.equal(out, decode_partial(q, k, v)[0]), torch.equal(allreduce3_decode(q, k, v), out)
(True, True)
>>> [method(name).__name__ for name in METHODS]
['tree_decode', 'tree_only_decode', 'gather_decode', 'ring_decode', 'allreduce3_decode']
>>> method("flash")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
treecoll.topo.errors.AttentionError: decode method: unknown name 'flash'; valid: ['auto', 'tree', 'gather', ...]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from treecoll.attention.decode import decode_partial
from treecoll.attention.dist import agree_on_inputs
from treecoll.attention.state import empty_state, merge
from treecoll.attention.tree_decode import allreduce3_combine, tree_decode
from treecoll.attention.validate import check_decode_inputs
from treecoll.collectives.group import group_info
from treecoll.collectives.placement import Placement
from treecoll.topo.errors import AttentionError

__all__ = [
    "METHODS",
    "allreduce3_combine",
    "allreduce3_decode",
    "gather_decode",
    "method",
    "ring_decode",
    "tree_only_decode",
]


def _group_of(placement: Placement | None, group: Any) -> Any:
    """The process group of a call: the placement's, or ``group`` (not both)."""
    if placement is None:
        return group
    if group is not None:
        raise AttentionError("placement: got a placement and a group; pass the group inside the Placement")
    return placement.group


def ring_decode(
    q: torch.Tensor,
    k_shard: torch.Tensor,
    v_shard: torch.Tensor,
    *,
    kv_len: Any = None,
    placement: Placement | None = None,
    group: Any = None,
    tree: Any = "auto",
    topology: Any = None,
    root_only: bool = False,
    scale: float | None = None,
    check: bool = True,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Ring Attention decoding; same parameters and result as :func:`treecoll.attention.tree_decode`
    (of a ``placement``, only its process group matters here).

    ``check`` is accepted for symmetry: the ring always all-gathers every rank's
    shipped prefix length (it sizes the receive buffers with them), and that
    gather also checks that ranks agree on shapes and dtypes.  Each shard
    travels with its per-sequence lengths (int32 [batch], a third message).
    """
    del tree, topology, root_only, check
    group = _group_of(placement, group)
    info = group_info(group, single_process=True)
    rank, size = info.rank, info.size
    if size == 1:
        out, lse = decode_partial(q, k_shard, v_shard, kv_len=kv_len, scale=scale)
        return (out, lse) if return_lse else out
    prefix = 0
    try:
        lengths, _ = check_decode_inputs(q, k_shard, v_shard, kv_len, scale, "ring_decode")
        prefix = int(lengths.max()) if lengths.numel() else 0
    except AttentionError:
        pass  # agree_on_inputs raises it on this rank and a matching error on the others
    lengths, scale, table = agree_on_inputs(
        "ring_decode",
        group,
        q,
        k_shard,
        v_shard,
        kv_len,
        scale,
        extra=(prefix,),
        extra_names=("prefix",),
        allow_differ=("prefix",),
    )
    import torch.distributed as dist

    prefixes = table[:, -2].tolist()  # valid positions each rank ships (max of its kv_len)
    _, _, kv_heads, head_dim = k_shard.shape
    batch, q_heads, _ = q.shape
    nxt, prv = info.to_global((rank + 1) % size), info.to_global((rank - 1) % size)
    per_token = batch * kv_heads * head_dim
    cap = max(prefixes) * per_token
    # double-buffered receive space; the shard in hand is sent while the next one arrives
    dev = k_shard.device
    bufs = [
        (
            torch.empty(cap, dtype=k_shard.dtype, device=dev),
            torch.empty(cap, dtype=k_shard.dtype, device=dev),
            torch.empty(batch, dtype=torch.int32, device=dev),
        )
        for _ in range(2)
    ]

    def view(flat, n):
        return flat[: n * per_token].view(batch, n, kv_heads, head_dim)

    k_cur = k_shard[:, :prefix].contiguous()
    v_cur = v_shard[:, :prefix].contiguous()
    len_cur = lengths.to(device=dev, dtype=torch.int32).contiguous()
    state = empty_state(batch, q_heads, head_dim, device=dev)
    for s in range(size):
        src = (rank - s) % size  # owner of the shard in hand
        reqs = []
        if s < size - 1:
            n_in = prefixes[(rank - s - 1) % size]
            k_buf, v_buf, len_in = bufs[s % 2]
            k_in, v_in = view(k_buf, n_in), view(v_buf, n_in)
            # one batch (NCCL runs it as one group, so the sends to rank+1 and the receives from
            # rank-1 cannot wait for each other); per direction the same order on both ends:
            # lengths, K, V
            ops = [
                dist.P2POp(dist.isend, len_cur, nxt, group=group, tag=2),
                dist.P2POp(dist.irecv, len_in, prv, group=group, tag=2),
            ]
            if prefixes[src] > 0:
                ops += [
                    dist.P2POp(dist.isend, k_cur, nxt, group=group, tag=0),
                    dist.P2POp(dist.isend, v_cur, nxt, group=group, tag=1),
                ]
            if n_in > 0:
                ops += [
                    dist.P2POp(dist.irecv, k_in, prv, group=group, tag=0),
                    dist.P2POp(dist.irecv, v_in, prv, group=group, tag=1),
                ]
            reqs = dist.batch_isend_irecv(ops)
        if prefixes[src] > 0:
            part = decode_partial(q, k_cur, v_cur, kv_len=len_cur, scale=scale)
            state = merge(state, part)
        for r in reqs:
            r.wait()
        if s < size - 1:
            k_cur, v_cur, len_cur = k_in, v_in, len_in
    out, lse = state
    return (out, lse) if return_lse else out


def allreduce3_decode(
    q: torch.Tensor,
    k_shard: torch.Tensor,
    v_shard: torch.Tensor,
    *,
    kv_len: Any = None,
    placement: Placement | None = None,
    group: Any = None,
    tree: Any = "auto",
    topology: Any = None,
    root_only: bool = False,
    scale: float | None = None,
    check: bool = True,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The paper's three all-reduces (max, numerator, denominator); same
    parameters and result as :func:`treecoll.attention.tree_decode` (of a ``placement``,
    only its process group matters here)."""
    del tree, topology, root_only
    group = _group_of(placement, group)
    size = group_info(group, single_process=True).size
    if check and size > 1:
        agree_on_inputs("allreduce3_decode", group, q, k_shard, v_shard, kv_len, scale)
    out, lse = decode_partial(q, k_shard, v_shard, kv_len=kv_len, scale=scale)
    if size == 1:
        return (out, lse) if return_lse else out
    out, lse = allreduce3_combine(out, lse, group=group)
    return (out, lse) if return_lse else out


def tree_only_decode(
    q: torch.Tensor, k_shard: torch.Tensor, v_shard: torch.Tensor, **kwargs: Any
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`treecoll.attention.tree_decode` with ``combine="tree"`` (the tree reduction and broadcast,
    whatever ``auto`` would pick); same parameters and result."""
    return tree_decode(q, k_shard, v_shard, combine="tree", **kwargs)


def gather_decode(
    q: torch.Tensor, k_shard: torch.Tensor, v_shard: torch.Tensor, **kwargs: Any
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`treecoll.attention.tree_decode` with ``combine="gather"`` (one all-gather of the packed
    states, then a local merge; vLLM's decode context parallelism); same parameters and result."""
    return tree_decode(q, k_shard, v_shard, combine="gather", **kwargs)


def _methods():
    return {
        "auto": tree_decode,
        "tree": tree_only_decode,
        "gather": gather_decode,
        "ring": ring_decode,
        "allreduce3": allreduce3_decode,
    }


#: the decode methods by name: :func:`method` gives each. ``auto`` is :func:`treecoll.attention.tree_decode`
#: as it runs by default (the combine the cost model picks: the tree, the gather or the three
#: all-reduces); ``tree`` and ``gather`` are its combines forced; ``ring`` and ``allreduce3`` the baselines.
METHODS = ("auto", "tree", "gather", "ring", "allreduce3")


def method(name: str) -> Callable[..., Any]:
    """The decode function named ``name`` (one of :data:`METHODS`)."""
    table = _methods()
    if name not in table:
        raise AttentionError(f"decode method: unknown name {name!r}; valid: {list(METHODS)}")
    return table[name]
