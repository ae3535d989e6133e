"""Split-KV decode on CPU tensors: block-wise torch matmuls in float32.

For each sequence the keys are walked in blocks of ``block_size`` tokens with an
online softmax (natural exp), so at most one block of scores
``[kv_heads, group, block]`` exists at a time.  GQA is handled without copying
K/V: the query is viewed as ``[kv_heads, group, head_dim]`` and multiplied by
strided views of the cache (``k[b, s:e].permute(1, 2, 0)`` is
``[kv_heads, head_dim, block]``), so each K/V element is read from memory once
for the whole group.  fp16/bf16 blocks are converted to float32 one block at a
time (the block stays in cache), because the CPU matmuls on half types either
round the scores to the input dtype or are slow.
"""
from __future__ import annotations

import math

import torch

__all__ = ["decode_torch", "DEFAULT_BLOCK_SIZE"]

#: Tokens per block.  Measured with tools/bench_decode.py on the 2-core Sapphire
#: Rapids VM (Llama-3.1-8B shapes, 128k tokens): 256..4096 are within noise of
#: each other for fp32 and bf16; 1024 amortises the ~10 Python-level ops per block.
DEFAULT_BLOCK_SIZE = 1024


def _split_bounds(length: int, num_splits: int) -> list[tuple[int, int]]:
    """``num_splits`` contiguous ranges covering ``[0, length)`` (some may be empty)."""
    per = -(-length // num_splits) if length else 0
    return [(min(i * per, length), min((i + 1) * per, length)) for i in range(num_splits)]


def _attend_range(qg, kb, vb, start: int, end: int, block: int, work: dict):
    """State of query groups ``qg`` [kv_heads, group, head_dim] (float32, already
    scaled) over tokens ``[start, end)`` of ``kb``/``vb`` [seq, kv_heads, head_dim].

    ``work`` caches per-call float32 buffers (block conversions, scores), so the
    loop allocates nothing: fresh multi-MiB tensors would be new pages from the
    OS (page faults and zeroing) on every block.
    Returns ``(acc, m, l)``: float32 ``[kv_heads, group, head_dim]`` unnormalised
    output, running max and running sum ``[kv_heads, group, 1]``.
    """
    kv_heads, group, head_dim = qg.shape
    m = torch.full((kv_heads, group, 1), -math.inf, dtype=torch.float32)
    l = torch.zeros((kv_heads, group, 1), dtype=torch.float32)
    acc = torch.zeros((kv_heads, group, head_dim), dtype=torch.float32)
    for s in range(start, end, block):
        e = min(s + block, end)
        n = e - s
        kk, vv = kb[s:e], vb[s:e]  # [n, kv_heads, head_dim] views
        if kk.dtype != torch.float32:  # convert one block into cached buffers
            if "k" not in work:
                work["k"] = torch.empty(block, kv_heads, head_dim, dtype=torch.float32)
                work["v"] = torch.empty(block, kv_heads, head_dim, dtype=torch.float32)
            kk = work["k"][:n].copy_(kk)
            vv = work["v"][:n].copy_(vv)
        if n == block:
            scores = work.get("scores")
            if scores is None:
                scores = work["scores"] = torch.empty(kv_heads, group, block, dtype=torch.float32)
            torch.bmm(qg, kk.permute(1, 2, 0), out=scores)  # [kv_heads, group, n]
        else:
            scores = torch.bmm(qg, kk.permute(1, 2, 0))
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))  # finite: block not empty
        p = scores.sub_(m_new).exp_()
        alpha = torch.exp(m - m_new)  # 0 on the first block (m = -inf)
        l.mul_(alpha).add_(p.sum(-1, keepdim=True))
        acc.mul_(alpha).baddbmm_(p, vv.transpose(0, 1))  # [kv_heads, n, head_dim] view
        m = m_new
    return acc, m, l


def decode_torch(q, k, v, lengths, scale: float, *, num_splits: int = 1, out=None, block_size=None):
    """Partial decode attention with torch ops (validated inputs; see
    :func:`attention.decode_partial` for the contract).

    ``q`` [batch, q_heads, head_dim], ``k``/``v`` [batch, seq, kv_heads, head_dim],
    ``lengths`` int [batch], ``num_splits`` contiguous chunks per sequence merged with
    :func:`attention.merge_states` (1 on CPU: the matmuls are already multi-threaded).
    Writes and returns ``(out, lse)``: float32 [batch, q_heads, head_dim] and
    float32 [batch, q_heads], natural log.
    """
    from attention.state import merge_states

    batch, q_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = q_heads // kv_heads
    block = int(block_size or DEFAULT_BLOCK_SIZE)
    if out is None:
        out = (
            torch.empty(batch, q_heads, head_dim, dtype=torch.float32, device=q.device),
            torch.empty(batch, q_heads, dtype=torch.float32, device=q.device),
        )
    out_buf, lse_buf = out
    qs = (q.float() * scale).view(batch, kv_heads, group, head_dim)
    work: dict = {}
    for b, length in enumerate(lengths.tolist()):
        parts = [
            _attend_range(qs[b], k[b], v[b], s0, s1, block, work) for s0, s1 in _split_bounds(length, num_splits)
        ]
        outs, lses = [], []
        for acc, m, l in parts:
            nonempty = l > 0
            outs.append(acc / torch.where(nonempty, l, torch.ones_like(l)))
            lses.append(torch.where(nonempty, m + torch.log(l), torch.full_like(l, -math.inf)).squeeze(-1))
        if len(parts) == 1:
            o, s = outs[0], lses[0]
        else:
            o, s = merge_states(outs, lses, 0, check=False, backend="torch")
        out_buf[b].copy_(o.reshape(q_heads, head_dim))
        lse_buf[b].copy_(s.reshape(q_heads))
    return out_buf, lse_buf
