"""Split-KV decode with torch ops (the CPU path): block-wise matmuls in float32.

For each sequence the keys are walked in blocks of ``block_size`` tokens with an
online softmax (natural exp), so at most one block of scores
``[kv_heads, group, block]`` exists at a time.  GQA is handled without copying
K/V: the query is viewed as ``[kv_heads, group, head_dim]`` and multiplied by
strided views of the cache (``k[b, s:e].permute(1, 2, 0)`` is
``[kv_heads, head_dim, block]``), so each K/V element is read from memory once
for the whole group.  fp16/bf16 blocks are converted to float32 one block at a
time (the block stays in cache), because the CPU matmuls on half types either
round the scores to the input dtype or are slow.  Long sequences are split
over ``torch.get_num_threads()`` worker threads, each running single-threaded
torch ops, and the splits are merged with :func:`attention.merge_states`.  The same code runs on CUDA
tensors with ``backend='torch'`` (a fallback; the Triton kernels are the CUDA path).

One query against two keys with scores ``[1, 0]`` (``scale=1``): the weights are ``e / (e + 1)`` and
``1 / (e + 1)``, so ``out = (e * [1, 2] + [3, 4]) / (e + 1)`` and ``lse = log(e + 1)``, whether the keys
are one block or two splits of one key each, merged:

>>> import torch
>>> q = torch.tensor([[[1.0, 0.0]]])                       # [batch 1, q_heads 1, head_dim 2]
>>> k = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]])      # [batch 1, seq 2, kv_heads 1, head_dim 2]
>>> v = torch.tensor([[[[1.0, 2.0]], [[3.0, 4.0]]]])
>>> out, lse = decode_torch(q, k, v, torch.tensor([2]), 1.0)
>>> [round(x, 5) for x in out.flatten().tolist()], round(lse.item(), 5)
([1.53788, 2.53788], 1.31326)
>>> out2, lse2 = decode_torch(q, k, v, torch.tensor([2]), 1.0, num_splits=2, block_size=1)
>>> torch.allclose(out2, out), torch.allclose(lse2, lse)
(True, True)
>>> decode_torch(q, k, v, torch.tensor([0]), 1.0)           # no keys: the merge identity
(tensor([[[0., 0.]]]), tensor([[-inf]]))
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

__all__ = ["DEFAULT_BLOCK_SIZE", "decode_torch", "run_splits"]

#: ``attend(qg, b, start, end, work) -> (acc, m, l)``: one range of one sequence (see :func:`run_splits`)
Attend = Callable[[torch.Tensor, int, int, int, dict[str, Any]], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

#: Tokens per block.  Measured with tools/bench_decode.py on the 2-core Sapphire
#: Rapids VM (Llama-3.1-8B shapes, 128k tokens): 256..4096 are within noise of
#: each other for fp32 and bf16; 1024 amortises the ~10 Python-level ops per block.
DEFAULT_BLOCK_SIZE = 1024


def _split_bounds(length: int, num_splits: int) -> list[tuple[int, int]]:
    """``num_splits`` contiguous ranges covering ``[0, length)`` (some may be empty)."""
    per = -(-length // num_splits) if length else 0
    return [(min(i * per, length), min((i + 1) * per, length)) for i in range(num_splits)]


def _contiguous_fetch(kb, vb):
    """Blocks of one sequence of a contiguous cache: views ``kb[s:e]``, ``vb[s:e]``."""
    return lambda s, e, work: (kb[s:e], vb[s:e])


def _paged_fetch(k, v, pages, block: int):
    """Blocks of one sequence of a paged cache ``[num_pages, page_size, kv_heads, head_dim]``
    whose logical pages are ``pages`` (1-D ids): the pages covering ``[s, e)`` are
    gathered into reused buffers (one block at a time) and sliced to ``[s, e)``."""
    page_size = k.shape[1]

    def fetch(s: int, e: int, work: dict):
        p0, p1 = s // page_size, -(-e // page_size)
        if "pk" not in work:
            shape = (block // page_size + 2, page_size) + tuple(k.shape[2:])
            work["pk"] = torch.empty(shape, dtype=k.dtype, device=k.device)
            work["pv"] = torch.empty(shape, dtype=v.dtype, device=v.device)
        ids = pages[p0:p1]
        kk = torch.index_select(k, 0, ids, out=work["pk"][: p1 - p0]).flatten(0, 1)
        vv = torch.index_select(v, 0, ids, out=work["pv"][: p1 - p0]).flatten(0, 1)
        return kk[s - p0 * page_size : e - p0 * page_size], vv[s - p0 * page_size : e - p0 * page_size]

    return fetch


def _attend_range(qg, fetch, start: int, end: int, block: int, work: dict):
    """State of query groups ``qg`` [kv_heads, group, head_dim] (float32, already
    scaled) over tokens ``[start, end)`` of one sequence; ``fetch(s, e, work)``
    returns that sequence's keys and values ``[e - s, kv_heads, head_dim]``.

    ``work`` caches per-call float32 buffers (block conversions, scores), so the
    loop allocates nothing: fresh multi-MiB tensors would be new pages from the
    OS (page faults and zeroing) on every block.
    Returns ``(acc, m, l)``: float32 ``[kv_heads, group, head_dim]`` unnormalised
    output, running max and running sum ``[kv_heads, group, 1]``.
    """
    kv_heads, group, head_dim = qg.shape
    f32 = {"dtype": torch.float32, "device": qg.device}
    m = torch.full((kv_heads, group, 1), -math.inf, **f32)
    l_sum = torch.zeros((kv_heads, group, 1), **f32)
    acc = torch.zeros((kv_heads, group, head_dim), **f32)
    for s in range(start, end, block):
        e = min(s + block, end)
        n = e - s
        kk, vv = fetch(s, e, work)  # [n, kv_heads, head_dim]
        if kk.dtype != torch.float32:  # convert one block into cached buffers
            if "k" not in work:
                work["k"] = torch.empty(block, kv_heads, head_dim, **f32)
                work["v"] = torch.empty(block, kv_heads, head_dim, **f32)
            kk = work["k"][:n].copy_(kk)
            vv = work["v"][:n].copy_(vv)
        if n == block:
            scores = work.get("scores")
            if scores is None:
                scores = work["scores"] = torch.empty(kv_heads, group, block, **f32)
            torch.bmm(qg, kk.permute(1, 2, 0), out=scores)  # [kv_heads, group, n]
        else:
            scores = torch.bmm(qg, kk.permute(1, 2, 0))
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))  # NaN and +inf propagate
        shift = torch.where(m_new == -math.inf, 0.0, m_new)  # all -inf so far: no -inf - -inf
        p = scores.sub_(shift).exp_()
        alpha = torch.exp(m - shift)  # 0 on the first block (m = -inf)
        l_sum.mul_(alpha).add_(p.sum(-1, keepdim=True))
        acc.mul_(alpha).baddbmm_(p, vv.transpose(0, 1))  # [kv_heads, n, head_dim] view
        m = m_new
    return acc, m, l_sum


_POOL: dict = {}
_POOL_LOCK = threading.Lock()


def _thread_pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads, each running torch ops on one
    thread (``torch.set_num_threads(1)`` is per thread: the caller's is unchanged)."""
    key = (os.getpid(), workers)  # a forked child has the dict but not the threads
    with _POOL_LOCK:
        if key not in _POOL:
            _POOL[key] = ThreadPoolExecutor(
                max_workers=workers,
                thread_name_prefix="treecoll-decode",
                initializer=torch.set_num_threads,
                initargs=(1,),
            )
        return _POOL[key]


def decode_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    *,
    num_splits: int = 1,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_size: int | None = None,
    block_table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial decode attention with torch ops (validated inputs; see
    :func:`attention.decode_partial` for the contract).

    ``q`` [batch, q_heads, head_dim], ``k``/``v`` [batch, seq, kv_heads, head_dim],
    (or paged ``[num_pages, page_size, kv_heads, head_dim]`` with ``block_table``
    int [batch, max_pages]; the block size is then rounded to whole pages),
    ``lengths`` int [batch], ``num_splits`` contiguous chunks per sequence merged with
    :func:`attention.merge_states`.  On CPU with ``torch.get_num_threads() = T > 1``
    and sequences of at least two blocks, at least ``T`` splits run on ``T`` worker
    threads whose torch ops are single-threaded: no OpenMP barrier per small op
    (those stall whenever a core is busy elsewhere).
    Writes and returns ``(out, lse)``: float32 [batch, q_heads, head_dim] and
    float32 [batch, q_heads], natural log.
    """
    block = int(block_size or DEFAULT_BLOCK_SIZE)
    if block_table is not None:
        block = max(1, block // k.shape[1]) * k.shape[1]
    fetches = [
        _contiguous_fetch(k[b], v[b]) if block_table is None else _paged_fetch(k, v, block_table[b].long(), block)
        for b in range(k.shape[0] if block_table is None else block_table.shape[0])
    ]

    def attend(qg, b, s0, s1, work):
        return _attend_range(qg, fetches[b], s0, s1, block, work)

    return run_splits(q, k.shape[2], lengths, scale, attend, num_splits=num_splits, out=out, min_split_tokens=2 * block)


def run_splits(
    q: torch.Tensor,
    kv_heads: int,
    lengths: torch.Tensor,
    scale: float,
    attend: Attend,
    *,
    num_splits: int = 1,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    min_split_tokens: int = 2 * DEFAULT_BLOCK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV driver of the torch path: scales and groups ``q``, cuts every
    sequence into ``num_splits`` contiguous ranges (at least ``torch.get_num_threads()``
    when a sequence has ``min_split_tokens`` or more, run on that many worker threads),
    calls ``attend(qg, b, start, end, work)`` per range and merges the ranges.

    ``attend`` gets ``qg`` float32 [kv_heads, group, head_dim] (scaled) and a dict it
    may cache buffers in (one per thread when single-threaded), and returns
    ``(acc, m, l)``: float32 [kv_heads, group, head_dim] unnormalised output and
    [kv_heads, group, 1] running max and sum, as :func:`treecoll.attention.state.online_to_state`
    reads them (``m = -inf``, ``l = 0`` when empty).
    Writes and returns ``(out, lse)`` as :func:`decode_torch`.
    """
    from treecoll.attention.state import merge_states, online_to_state

    batch, q_heads, head_dim = q.shape
    group = q_heads // kv_heads
    if out is None:
        out = (
            torch.empty(batch, q_heads, head_dim, dtype=torch.float32, device=q.device),
            torch.empty(batch, q_heads, dtype=torch.float32, device=q.device),
        )
    out_buf, lse_buf = out
    qs = (q.float() * scale).view(batch, kv_heads, group, head_dim)
    lens = lengths.tolist()
    workers = torch.get_num_threads() if q.device.type == "cpu" else 1
    if workers > 1 and max(lens, default=0) >= min_split_tokens:
        num_splits = max(num_splits, workers)
    tasks = [(b, s0, s1) for b in range(batch) for s0, s1 in _split_bounds(lens[b], num_splits)]

    def run(task):
        b, s0, s1 = task
        return attend(qs[b], b, s0, s1, {})

    if workers > 1 and num_splits > 1:
        results = list(_thread_pool(workers).map(run, tasks))
    else:
        work: dict = {}
        results = [attend(qs[b], b, s0, s1, work) for b, s0, s1 in tasks]
    for b in range(batch):
        outs, lses = [], []
        for acc, m, l_sum in results[b * num_splits : (b + 1) * num_splits]:
            o, s = online_to_state(acc, m.squeeze(-1), l_sum.squeeze(-1))
            outs.append(o)
            lses.append(s)
        if num_splits == 1:
            o, s = outs[0], lses[0]
        else:
            o, s = merge_states(outs, lses, 0, backend="torch")
        out_buf[b].copy_(o.reshape(q_heads, head_dim))
        lse_buf[b].copy_(s.reshape(q_heads))
    return out_buf, lse_buf
