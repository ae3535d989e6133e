"""Decode attention for Tree Attention: partial states, their merge, decode kernels.

Numerics contract (every function in this package follows it):

* An attention state is ``(out, lse)``: ``out`` float32 ``[batch, heads, head_dim]``,
  already normalised; ``lse`` float32 ``[batch, heads]``, the **natural-log**
  log-sum-exp of the scaled scores ``scale * q . k``.  Base-2 LSEs (FlashInfer,
  the Triton tutorial) are converted at the boundary with :func:`to_natural_log`
  and :func:`to_base2`.
* A shard with no keys is ``(0, -inf)``; it is the identity of :func:`merge`, and
  no mix of empty states produces NaN.  NaN and inf in inputs and states follow
  ONE policy on every backend and in every merge, torch's SDPA arithmetic: see
  "NaN/inf policy" in :mod:`treecoll.attention.state`.
* Kernels read fp16 / bf16 / fp32 inputs and accumulate in float32; the merge
  runs in float32 whatever the input dtype.  Tests check every kernel against
  the float64 :func:`reference` (relative error <= 1e-5 for fp32 inputs,
  <= 1e-2 for bf16/fp16).
* KV cache layout ``[batch, seq, kv_heads, head_dim]``; GQA/MQA with
  ``q_heads % kv_heads == 0``; per-sequence valid lengths ``kv_len [batch]``.

``import treecoll.attention`` imports torch but not triton (loaded on first Triton use).

One query against two keys with scores ``[1, 0]`` (``scale=1``): the state of both
keys is ``out = (e * v_0 + v_1) / (e + 1)``, ``lse = log(e + 1)``, and merging the
one-key states ``(v_0, 1)`` and ``(v_1, 0)`` gives the same state:

>>> import torch
>>> from treecoll import attention
>>> q = torch.tensor([[[1.0, 0.0]]])                       # [batch 1, heads 1, head_dim 2]
>>> k = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]])      # [batch 1, seq 2, kv_heads 1, head_dim 2]
>>> v = torch.tensor([[[[1.0, 2.0]], [[3.0, 4.0]]]])
>>> out, lse = attention.decode_partial(q, k, v, scale=1.0)
>>> [round(x, 4) for x in out.flatten().tolist()], round(lse.item(), 4)
([1.5379, 2.5379], 1.3133)
>>> first = attention.decode_partial(q, k[:, :1], v[:, :1], scale=1.0)
>>> second = attention.decode_partial(q, k[:, 1:], v[:, 1:], scale=1.0)
>>> first[0].flatten().tolist(), first[1].item(), second[0].flatten().tolist(), second[1].item()
([1.0, 2.0], 1.0, [3.0, 4.0], 0.0)
>>> merged_out, merged_lse = attention.merge(first, second)
>>> torch.allclose(merged_out, out), torch.allclose(merged_lse, lse)
(True, True)
>>> empty = attention.empty_state(1, 1, 2)                # (0, -inf): the identity of the merge
>>> torch.equal(attention.merge(empty, first)[0], first[0])
True
"""

from treecoll.attention.decode import DECODE_BACKENDS, decode_partial
from treecoll.attention.lse import LN2, LOG2E, to_base2, to_natural_log
from treecoll.attention.reference import reference
from treecoll.attention.state import (
    MergeOp,
    empty_state,
    merge,
    merge_packed,
    merge_states,
    online_to_state,
    pack_state,
    unpack_state,
)

__all__ = [
    "DECODE_BACKENDS",
    "LN2",
    "LOG2E",
    "MergeOp",
    "decode_partial",
    "empty_state",
    "merge",
    "merge_packed",
    "merge_states",
    "online_to_state",
    "pack_state",
    "reference",
    "to_base2",
    "to_natural_log",
    "unpack_state",
]

# --- distributed decoding (tree attention, baselines, sharded KV cache, model) ---
from treecoll.attention.baselines import allreduce3_decode, gather_decode, ring_decode  # noqa: E402
from treecoll.attention.kv_cache import ShardedKVCache  # noqa: E402
from treecoll.attention.model import LlamaConfig, LlamaModel  # noqa: E402
from treecoll.attention.tree_decode import tree_combine, tree_decode  # noqa: E402

__all__ += [
    "tree_decode",
    "tree_combine",
    "gather_decode",
    "ring_decode",
    "allreduce3_decode",
    "ShardedKVCache",
    "LlamaConfig",
    "LlamaModel",
]
