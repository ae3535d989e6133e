"""Triton split-KV decode (flash-decoding) and the many-state merge kernel.

Two kernels:

* ``_decode_split_kernel`` (stage 1), grid ``(batch, kv_heads, num_splits)``.  One
  program owns one KV head of one sequence and one contiguous chunk of its keys
  (the split count and the block size: :mod:`treecoll.attention.decode_gpu`).
  It loads each K/V block ONCE for all ``group = q_heads // kv_heads`` query
  heads (the group is the M dimension of ``tl.dot``, padded to 16), runs an
  online softmax in base 2 (``exp2`` with ``scale * log2(e)`` folded into the
  scores) with float32 accumulators, and writes the chunk's partial state in
  float32: ``out`` normalised and ``lse`` converted to natural log.  An empty
  chunk (length 0, or a split past the end) writes ``(0, -inf)``.
* ``_merge_states_kernel`` (stage 2, also :func:`merge_states_triton`), grid
  ``(rows,)``: merges ``S`` states per row with the guarded max shift (see
  :mod:`treecoll.attention.state`).  Stage 2 is skipped when there is one split.

Both follow the NaN/inf policy of :mod:`treecoll.attention.state` (IEEE softmax, as
torch's SDPA math path): the running max keeps NaN (:func:`_max_keep_nan`),
the shift is 0 while it is ``-inf``, and no weight is masked after the fact.

Pseudo-code of stage 1 for program ``(b, h, s)``::

    L = clamp(kv_len[b], 0, seq); chunk = ceil(ceil(L / S) / BLOCK_N) * BLOCK_N
    m = -inf; l = 0; acc = 0                    # per query head of the group
    for n in [s*chunk, min((s+1)*chunk, L)) step BLOCK_N:
        x = (q @ K[n:n+BLOCK_N].T) * scale*log2e   # masked columns -> -inf
        m' = max(m, rowmax(x)) (NaN kept); c = 0 if m' == -inf else m'
        p = exp2(x - c); a = exp2(m - c)
        l = a*l + rowsum(p); acc = a*acc + p @ V[n:n+BLOCK_N]; m = m'
    out = acc / l (acc if l == 0); lse = (c + log2(l)) * ln2 (-inf if l == 0)

A paged cache (``[num_pages, page_size, kv_heads, head_dim]`` plus a block
table ``[batch, max_pages]``, any page size) is read through the table per
token (vLLM's ``kv_loc`` scheme); ``PAGE_SIZE = 0`` means a contiguous cache.

The kernels run on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1``
(the variable must be set before this module is imported).  The Triton 3.9
interpreter computes ``tl.dot`` on bfloat16 operands wrongly (errors ~1e10 on
16x16 inputs), so under the interpreter, and for float32 inputs, the operands
are upcast to float32 and multiplied with ``input_precision="ieee"``; on GPUs
fp16/bf16 go to the tensor cores with float32 accumulation.

The block size per head_dim and the split count (Llama-3.1-8B, one sequence of 128k
tokens on an H100's 132 SMs):

>>> BLOCK_N, block_n(256), choose_num_splits(1, 8, 131072, 132)
(64, 32, 15)
"""

from __future__ import annotations

import math
import os

import torch
from treecoll.attention.decode_gpu import MAX_SPLITS, block_n, choose_num_splits
from treecoll.attention.lse import LOG2E
from treecoll.topo.errors import AttentionError, MissingDependency

try:
    import triton
    import triton.language as tl
except ImportError as err:  # pragma: no cover - triton is a dev dependency
    raise MissingDependency("triton", "attention Triton kernels", "triton") from err

__all__ = [
    "BLOCK_N",
    "MAX_SPLITS",
    "choose_num_splits",
    "decode_stage1",
    "decode_triton",
    "merge_states_triton",
    "num_sms",
]

#: Keys per block of stage 1 at head_dim 128 (the N dimension of both tl.dot calls); other
#: head dims: :func:`treecoll.attention.decode_gpu.block_n` (8192 elements per K/V block).
BLOCK_N = block_n(128)
#: Software-pipeline stages of stage 1.  Compiled for sm_80 with head_dim 128:
#: fp32 K/V take 143 KiB of shared memory at 3 stages, 76 KiB at 2 (fits every
#: GPU from sm_80 on, including 100 KiB consumer parts); bf16/fp16 take 22 KiB at 3.
STAGES_FP32, STAGES_HALF = 2, 3


# %%
# The NaN/inf policy of attention.state: a NaN score or LSE makes the running max
# NaN (tl.max and tl.maximum drop NaN on GPUs by default), +inf stays +inf.
@triton.jit
def _max_keep_nan(m, x):
    """max(m, row max of x [rows, cols]) per row, NaN if any operand is NaN."""
    row_nan = tl.max((x != x).to(tl.int32), 1) > 0  # noqa: PLR0124 (the NaN test)
    m_x = tl.where(row_nan, float("nan"), tl.max(x, 1))
    return tl.maximum(m, m_x, propagate_nan=tl.PropagateNan.ALL)


# %%
# Stage 1: one program per (sequence, KV head, split).
@triton.jit
def _decode_split_kernel(
    # Pointers
    Q,
    K,
    V,
    KV_LEN,
    OUT,
    LSE,
    BLOCK_TABLE,
    # Strides (the last dim of every tensor has stride 1); for a paged cache the
    # K/V "batch" strides step over pages and the "n" strides within a page
    stride_qb,
    stride_qh,
    stride_tb,
    stride_kb,
    stride_kn,
    stride_kh,
    stride_vb,
    stride_vn,
    stride_vh,
    stride_os,
    stride_ob,
    stride_oh,
    stride_ls,
    stride_lb,
    stride_lh,
    # Sizes and numerics
    seq,
    num_splits,
    qk_scale,
    # Meta-parameters
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UPCAST: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
):
    tl.static_assert(BLOCK_G >= GROUP)
    tl.static_assert(BLOCK_D >= HEAD_DIM)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # ---- this program's chunk of keys [start, end)
    length = tl.minimum(tl.maximum(tl.load(KV_LEN + b), 0), seq)
    per_split = tl.cdiv(tl.cdiv(length, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, length)

    offs_g = tl.arange(0, BLOCK_G)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < GROUP
    mask_d = offs_d < HEAD_DIM

    # ---- the query heads of this KV head's group: [BLOCK_G, BLOCK_D]
    q_ptrs = Q + b * stride_qb + (kv_head * GROUP + offs_g)[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    else:
        q = q.to(K.dtype.element_ty)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    k_base = K + kv_head * stride_kh
    v_base = V + kv_head * stride_vh

    # ---- online softmax over the chunk, base 2
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + offs_n
        mask_n = cols < end
        kv_mask = mask_n[:, None] & mask_d[None, :]
        if PAGE_SIZE > 0:  # paged: token -> (page id from the block table, slot in the page)
            page = tl.load(BLOCK_TABLE + b * stride_tb + cols // PAGE_SIZE, mask=mask_n, other=0).to(tl.int64)
            k_rows = page * stride_kb + (cols % PAGE_SIZE) * stride_kn
            v_rows = page * stride_vb + (cols % PAGE_SIZE) * stride_vn
        else:
            k_rows = b.to(tl.int64) * stride_kb + cols * stride_kn
            v_rows = b.to(tl.int64) * stride_vb + cols * stride_vn
        k = tl.load(k_base + k_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + v_rows[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            x = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            x = tl.dot(q, tl.trans(k))
        x = tl.where(mask_n[None, :], x * qk_scale, float("-inf"))
        m_new = _max_keep_nan(m_i, x)
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # no -inf - -inf while all scores are -inf
        p = tl.exp2(x - shift[:, None])
        alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        if UPCAST:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(V.dtype.element_ty), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    # ---- epilogue: normalised out, natural-log LSE; empty chunk -> (0, -inf), NaN kept
    empty = l_i == 0  # (NaN is not 0: it reaches out and lse)
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    heads = kv_head * GROUP + offs_g
    o_ptrs = OUT + split * stride_os + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out, mask=mask_g[:, None] & mask_d[None, :])
    tl.store(LSE + split * stride_ls + b * stride_lb + heads * stride_lh, lse, mask=mask_g)


# %%
# Stage 2 / many-state merge: one program per row, states walked in blocks.
@triton.jit
def _merge_states_kernel(
    OUT_IN,
    LSE_IN,
    OUT,
    LSE,
    num_states,
    stride_os,
    stride_or,
    stride_ls,
    stride_lr,
    stride_out_r,
    stride_lse_r,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    # ---- pass 1: the max LSE of the row (-inf if every state is empty, NaN kept)
    m = tl.full([1], float("-inf"), tl.float32)  # loop-carried
    for s0 in range(0, num_states, BLOCK_S):
        rows_s = s0 + offs_s
        lse = tl.load(LSE_IN + rows_s * stride_ls + row * stride_lr, mask=rows_s < num_states, other=float("-inf"))
        m = _max_keep_nan(m, lse[None, :])
    shift = tl.where(m == float("-inf"), 0.0, m)

    # ---- pass 2: weights exp(lse - shift): 0 for empty states, NaN for NaN / +inf
    acc = tl.zeros([1, BLOCK_D], tl.float32)
    den = tl.zeros([1], tl.float32)
    for s0 in range(0, num_states, BLOCK_S):
        rows_s = s0 + offs_s
        mask_s = rows_s < num_states
        lse = tl.load(LSE_IN + rows_s * stride_ls + row * stride_lr, mask=mask_s, other=float("-inf"))
        w = tl.exp2((lse - shift) * 1.4426950408889634)
        o = tl.load(
            OUT_IN + rows_s[:, None] * stride_os + row * stride_or + offs_d[None, :],
            mask=mask_s[:, None] & mask_d[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(o * w[:, None], 0)[None, :]
        den += tl.sum(w, 0)

    empty = den == 0
    out = tl.reshape(acc / tl.where(empty, 1.0, den)[:, None], [BLOCK_D])
    lse_out = tl.where(empty, float("-inf"), shift + tl.log(tl.where(empty, 1.0, den)))
    tl.store(OUT + row * stride_out_r + offs_d, out, mask=mask_d)
    tl.store(LSE + row * stride_lse_r + tl.arange(0, 1), lse_out)


# %%
# Host side: (1) check what the kernels assume; (2) allocate; (3) launch.
#: Whether the kernels above were built for the interpreter (decided when the
#: module was imported, as triton.jit decides it then).
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _check_launchable(t: torch.Tensor, where: str) -> None:
    if t.device.type == "cpu" and not _INTERPRETED:
        raise AttentionError(
            f"{where}: expected CUDA tensors, got CPU tensors; set TRITON_INTERPRET=1 before "
            "importing attention.decode_triton to run the kernels on CPU, or use backend='torch'"
        )


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; on CPU the torch thread count
    (the parallelism the interpreter or the CPU stands in for)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, torch.get_num_threads())


def _next_pow2(n: int, floor: int) -> int:
    return max(floor, triton.next_power_of_2(n))


def decode_stage1(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    block_table: torch.Tensor | None = None,
) -> None:
    """Launch stage 1: write one partial state per split.

    ``k``/``v`` [batch, seq, kv_heads, head_dim], or paged [num_pages, page_size,
    kv_heads, head_dim] with ``block_table`` int [batch, max_pages].

    ``part_out`` float32 [splits, batch, q_heads, head_dim] and ``part_lse`` float32
    [splits, batch, q_heads] (natural log) are written completely, including empty
    splits as ``(0, -inf)``.
    """
    _check_launchable(q, "decode_stage1")
    batch, q_heads, head_dim = q.shape
    _, seq, kv_heads, _ = k.shape
    page_size = 0
    if block_table is not None:
        page_size, seq = k.shape[1], block_table.shape[1] * k.shape[1]
    else:
        block_table = lengths  # unused by the kernel; any tensor pointer
    for name, t in (("q", q), ("k", k), ("v", v), ("part_out", part_out)):
        if t.stride(-1) != 1:
            raise AttentionError(
                f"decode_stage1: {name}: expected stride 1 in the last dim (head_dim), got "
                f"stride {t.stride(-1)}; pass a tensor with contiguous head_dim"
            )
    group = q_heads // kv_heads
    splits = part_out.shape[0]
    grid = (batch, kv_heads, splits)
    _decode_split_kernel[grid](
        q,
        k,
        v,
        lengths,
        part_out,
        part_lse,
        block_table,
        q.stride(0),
        q.stride(1),
        block_table.stride(0),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        part_out.stride(0),
        part_out.stride(1),
        part_out.stride(2),
        part_lse.stride(0),
        part_lse.stride(1),
        part_lse.stride(2),
        seq,
        splits,
        scale * LOG2E,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_G=_next_pow2(group, 16),
        BLOCK_N=block_n(head_dim),
        BLOCK_D=_next_pow2(head_dim, 16),
        UPCAST=_INTERPRETED or k.dtype == torch.float32,
        PAGE_SIZE=page_size,
        num_stages=STAGES_FP32 if k.dtype == torch.float32 else STAGES_HALF,
    )


def decode_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    *,
    num_splits: int | None = None,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial decode attention with the Triton kernels (validated inputs; see
    :func:`treecoll.attention.decode_partial`).  Returns ``(out, lse)`` float32
    [batch, q_heads, head_dim] and [batch, q_heads], natural log.

    No host synchronisation on CUDA: the lengths and the block table stay on the
    device (the split count comes from the cache capacity and the SM count), the
    partial states come from the caching allocator, and the merge is launched on
    the same stream right after stage 1."""
    batch, q_heads, head_dim = q.shape
    seq, kv_heads = k.shape[1], k.shape[2]
    q = q.contiguous()  # tiny; k and v are never copied
    if block_table is not None:
        seq = block_table.shape[1] * k.shape[1]
    if num_splits is None:  # on CUDA from the capacity: reading the lengths would wait for the device
        max_len = int(lengths.max()) if (lengths.device.type == "cpu" and batch) else seq
        num_splits = choose_num_splits(batch, kv_heads, max_len, num_sms(q.device), block=block_n(head_dim))
    if out is None:
        out = (
            torch.empty(batch, q_heads, head_dim, dtype=torch.float32, device=q.device),
            torch.empty(batch, q_heads, dtype=torch.float32, device=q.device),
        )
    out_buf, lse_buf = out
    if batch == 0 or q_heads == 0:
        return out_buf, lse_buf
    if num_splits == 1:  # stage 1 writes the final state directly
        decode_stage1(q, k, v, lengths, scale, out_buf.unsqueeze(0), lse_buf.unsqueeze(0), block_table)
        return out_buf, lse_buf
    part_out = torch.empty(num_splits, batch, q_heads, head_dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(num_splits, batch, q_heads, dtype=torch.float32, device=q.device)
    decode_stage1(q, k, v, lengths, scale, part_out, part_lse, block_table)
    dense = out_buf.is_contiguous() and lse_buf.is_contiguous()
    final_out, final_lse = (out_buf, lse_buf) if dense else (torch.empty_like(out_buf), torch.empty_like(lse_buf))
    _launch_merge(
        part_out.view(num_splits, batch * q_heads, head_dim),
        part_lse.view(num_splits, batch * q_heads),
        final_out.view(batch * q_heads, head_dim),
        final_lse.view(batch * q_heads),
    )
    if not dense:
        out_buf.copy_(final_out)
        lse_buf.copy_(final_lse)
    return out_buf, lse_buf


def _launch_merge(outs, lses, out, lse) -> None:
    """outs [S, R, D], lses [S, R] -> out [R, D], lse [R] (all float32 except outs)."""
    num_states, rows, head_dim = outs.shape
    if rows == 0:
        return
    _merge_states_kernel[(rows,)](
        outs,
        lses,
        out,
        lse,
        num_states,
        outs.stride(0),
        outs.stride(1),
        lses.stride(0),
        lses.stride(1),
        out.stride(0),
        lse.stride(0),
        HEAD_DIM=head_dim,
        BLOCK_S=min(16, _next_pow2(max(num_states, 1), 1)),
        BLOCK_D=_next_pow2(head_dim, 16),
    )


def merge_states_triton(outs: torch.Tensor, lses: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`treecoll.attention.merge_states` with the Triton kernel (validated inputs;
    ``dim`` non-negative).  Returns float32 ``(out, lse)`` without the state dim."""
    _check_launchable(outs, "merge_states")
    outs = outs.movedim(dim, 0)
    lses = lses.movedim(dim, 0)
    lead = lses.shape[1:]
    head_dim = outs.shape[-1]
    rows = lses[0].numel() if lses.shape[0] else math.prod(lead)
    outs3 = outs.reshape(outs.shape[0], rows, head_dim)
    if outs3.stride(-1) != 1:
        outs3 = outs3.contiguous()
    lses2 = lses.float().reshape(lses.shape[0], rows)
    out = torch.empty(rows, head_dim, dtype=torch.float32, device=outs.device)
    lse = torch.empty(rows, dtype=torch.float32, device=outs.device)
    _launch_merge(outs3, lses2, out, lse)
    return out.view(*lead, head_dim), lse.view(lead)
