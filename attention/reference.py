"""Float64 reference for decode attention (plain softmax; for tests, not speed).

It materialises all scores and repeats K/V over the GQA group, so it is only
meant for the small shapes of tests and sanity checks.

One query against two keys with scores ``[1, 0]`` (``scale=1``): the weights are
``e / (e + 1)`` and ``1 / (e + 1)``, so ``out = (e * [1, 2] + [3, 4]) / (e + 1)`` and
``lse = log(e + 1)``; with no valid key the state is ``(0, -inf)``:

>>> import torch
>>> q = torch.tensor([[[1.0, 0.0]]])                       # [batch 1, heads 1, head_dim 2]
>>> k = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]])      # [batch 1, seq 2, kv_heads 1, head_dim 2]
>>> v = torch.tensor([[[[1.0, 2.0]], [[3.0, 4.0]]]])
>>> out, lse = reference(q, k, v, scale=1.0)
>>> out.dtype, [round(x, 6) for x in out.flatten().tolist()], round(lse.item(), 6)
(torch.float64, [1.537883, 2.537883], 1.313262)
>>> reference(q, k, v, kv_len=[0])
(tensor([[[0., 0.]]], dtype=torch.float64), tensor([[-inf]], dtype=torch.float64))
"""

from __future__ import annotations

import math

import torch
from treecoll.attention.validate import KvLen, check_decode_inputs

__all__ = ["reference"]


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, kv_len: KvLen | None = None, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention of one query per sequence, in float64.

    ``q`` ``[batch, q_heads, head_dim]``, ``k``/``v`` ``[batch, seq, kv_heads, head_dim]``
    (``q_heads`` a multiple of ``kv_heads``; query head ``h`` reads KV head
    ``h // (q_heads // kv_heads)``), ``kv_len`` ``[batch]`` valid lengths (default
    ``seq``), ``scale`` default ``1/sqrt(head_dim)``.
    Returns ``(out, lse)``: float64 ``[batch, q_heads, head_dim]`` and float64
    ``[batch, q_heads]`` natural log; a sequence without keys gives ``(0, -inf)``.
    NaN and inf follow the policy of :mod:`treecoll.attention.state` (plain IEEE softmax, as
    torch's SDPA math path); positions past ``kv_len`` are masked out, never read
    into the result.
    """
    lengths, scale = check_decode_inputs(q, k, v, kv_len, scale, "reference")
    batch, q_heads, _ = q.shape
    group = q_heads // k.shape[2]
    positions = torch.arange(k.shape[1], device=k.device)
    valid = positions[None, :] < lengths.to(k.device)[:, None]  # [B, N]
    mask = valid[:, :, None, None]
    k64 = k.double().masked_fill(~mask, 0.0).repeat_interleave(group, dim=2)  # [B, N, Hq, D]
    v64 = v.double().masked_fill(~mask, 0.0).repeat_interleave(group, dim=2)
    scores = torch.einsum("bhd,bnhd->bhn", q.double(), k64) * scale  # [B, Hq, N]
    scores = scores.masked_fill(~valid[:, None, :], -math.inf)
    m = (
        scores.amax(-1, keepdim=True)
        if scores.shape[-1]
        else torch.full((batch, q_heads, 1), -math.inf, dtype=torch.float64, device=k.device)
    )
    shift = torch.where(m == -math.inf, 0.0, m)  # amax keeps NaN and +inf
    p = torch.exp(scores - shift)
    den = p.sum(-1)
    out = torch.einsum("bhn,bnhd->bhd", p, v64) / torch.where(den == 0, 1.0, den)[..., None]
    return out, shift.squeeze(-1) + torch.log(den)
