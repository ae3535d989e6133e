"""Float64 reference for decode attention (plain softmax; for tests, not speed).

It materialises all scores and repeats K/V over the GQA group, so it is only
meant for the small shapes of tests and sanity checks.
"""
from __future__ import annotations

import math

import torch

from attention.validate import check_decode_inputs

__all__ = ["reference"]


def reference(q, k, v, *, kv_len=None, scale=None):
    """Plain softmax attention of one query per sequence, in float64.

    ``q`` ``[batch, q_heads, head_dim]``, ``k``/``v`` ``[batch, seq, kv_heads, head_dim]``
    (``q_heads`` a multiple of ``kv_heads``; query head ``h`` reads KV head
    ``h // (q_heads // kv_heads)``), ``kv_len`` ``[batch]`` valid lengths (default
    ``seq``), ``scale`` default ``1/sqrt(head_dim)``.
    Returns ``(out, lse)``: float64 ``[batch, q_heads, head_dim]`` and float64
    ``[batch, q_heads]`` natural log; a sequence without keys gives ``(0, -inf)``.
    """
    lengths, scale = check_decode_inputs(q, k, v, kv_len, scale, "reference")
    batch, q_heads, head_dim = q.shape
    group = q_heads // k.shape[2]
    k64 = k.double().repeat_interleave(group, dim=2)  # [B, N, Hq, D]
    v64 = v.double().repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,bnhd->bhn", q.double(), k64) * scale  # [B, Hq, N]
    positions = torch.arange(k.shape[1], device=k.device)
    valid = positions[None, None, :] < lengths.to(k.device)[:, None, None]
    scores = scores.masked_fill(~valid, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # -inf where no keys
    p = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    out = torch.einsum("bhn,bnhd->bhd", p, v64)
    return out, lse
