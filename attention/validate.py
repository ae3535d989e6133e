"""Input checks shared by every decode backend (one place, one set of messages).

>>> import torch
>>> q, k = torch.zeros(2, 8, 64), torch.zeros(2, 100, 2, 64)   # 8 query heads over 2 KV heads
>>> lengths, scale = check_decode_inputs(q, k, k, [100, 30], None, "demo")
>>> lengths.tolist(), lengths.dtype, scale                      # the default scale is 1/sqrt(64)
([100, 30], torch.int32, 0.125)
>>> check_decode_inputs(q, k, k, [100, 101], None, "demo")
Traceback (most recent call last):
...
treecoll.topo.errors.AttentionError: demo: kv_len: expected values in [0, seq=100], got min 100 and max 101
>>> check_decode_inputs(torch.zeros(2, 7, 64), k, k, None, None, "demo")
Traceback (most recent call last):
...
treecoll.topo.errors.AttentionError: demo: q_heads: expected a multiple of kv_heads=2, got 7
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from treecoll.topo.errors import AttentionError

__all__ = ["KV_DTYPES", "KvLen", "check_decode_inputs"]

#: dtypes the decode kernels accept for q, k and v.
KV_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: valid keys per sequence as callers give them: one int for every sequence, one per sequence, or a tensor [batch]
KvLen = int | Sequence[int] | torch.Tensor


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def check_decode_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_len: KvLen | None,
    scale: float | None,
    where: str,
    dtypes: tuple[torch.dtype, ...] = KV_DTYPES + (torch.float64,),
    block_table: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """Validate a decode call and return ``(lengths, scale)``.

    Contiguous cache: ``k``/``v`` ``[batch, seq, kv_heads, head_dim]``.  Paged cache
    (``block_table`` given): ``k``/``v`` ``[num_pages, page_size, kv_heads, head_dim]``
    and ``block_table`` integer ``[batch, max_pages]``; then ``seq`` means
    ``max_pages * page_size`` and the page ids a sequence uses must be in
    ``[0, num_pages)`` (checked for CPU tensors).

    ``lengths``: int32 ``[batch]`` on ``q.device``.  Values outside ``[0, seq]`` are
    rejected for CPU tensors; for CUDA tensors they are not read back (that would
    force a device sync) and the kernels clamp them to ``[0, seq]``.
    ``scale``: float, default ``1/sqrt(head_dim)``.
    """
    cache_dims = (
        "[batch, seq, kv_heads, head_dim]" if block_table is None else "[num_pages, page_size, kv_heads, head_dim]"
    )
    for name, x, ndim, dims in (
        ("q", q, 3, "[batch, q_heads, head_dim]"),
        ("k", k, 4, cache_dims),
        ("v", v, 4, cache_dims),
    ):
        if not isinstance(x, torch.Tensor) or x.dim() != ndim:
            raise AttentionError(f"{where}: {name}: expected a tensor {dims}, got {_shape(x)}")
        if x.dtype not in dtypes:
            raise AttentionError(f"{where}: {name}: expected dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
        if x.device != q.device:
            raise AttentionError(f"{where}: {name}: expected device {q.device} (that of q), got {x.device}")
    if k.shape != v.shape:
        raise AttentionError(f"{where}: v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    batch, q_heads, head_dim = q.shape
    _, seq, kv_heads, _ = k.shape
    if block_table is not None:
        seq = _check_block_table(block_table, batch, k.shape[0], seq, q.device, where)
    elif k.shape[0] != batch:
        raise AttentionError(
            f"{where}: k: expected [batch={batch}, seq, kv_heads, head_dim={head_dim}] to match q, got {tuple(k.shape)}"
        )
    if k.shape[3] != head_dim:
        raise AttentionError(
            f"{where}: k: expected [batch={batch}, seq, kv_heads, head_dim={head_dim}] to match q, got {tuple(k.shape)}"
        )
    if kv_heads == 0 or q_heads % kv_heads:
        raise AttentionError(f"{where}: q_heads: expected a multiple of kv_heads={kv_heads}, got {q_heads}")
    if head_dim == 0:
        raise AttentionError(f"{where}: head_dim: expected at least 1, got 0")
    lengths = _lengths(kv_len, batch, seq, q.device, where)
    if block_table is not None and block_table.device.type == "cpu" and batch:
        _check_pages_in_use(block_table, lengths, k.shape[0], k.shape[1], where)
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise AttentionError(f"{where}: scale: expected a finite float, got {scale!r}")
    return lengths, float(scale)


def _lengths(kv_len, batch: int, seq: int, device, where: str) -> torch.Tensor:
    if kv_len is None:
        return torch.full((batch,), seq, dtype=torch.int32, device=device)
    if isinstance(kv_len, int) and not isinstance(kv_len, bool):
        kv_len = torch.full((batch,), kv_len, dtype=torch.int64)
    elif isinstance(kv_len, (list, tuple)):
        kv_len = torch.tensor(kv_len, dtype=torch.int64)
    if (
        not isinstance(kv_len, torch.Tensor)
        or kv_len.dtype.is_floating_point
        or kv_len.dtype == torch.bool
        or kv_len.is_complex()
        or tuple(kv_len.shape) != (batch,)
    ):
        got = f"{kv_len.dtype} {_shape(kv_len)}" if isinstance(kv_len, torch.Tensor) else repr(kv_len)
        raise AttentionError(f"{where}: kv_len: expected integers of shape [batch={batch}], got {got}")
    if kv_len.device.type == "cpu" and kv_len.numel():
        lo, hi = int(kv_len.min()), int(kv_len.max())
        if lo < 0 or hi > seq:
            raise AttentionError(f"{where}: kv_len: expected values in [0, seq={seq}], got min {lo} and max {hi}")
    return kv_len.to(device=device, dtype=torch.int32)


def _check_block_table(block_table, batch: int, num_pages: int, page_size: int, device, where: str) -> int:
    """Shape/dtype checks of a block table; returns the capacity in tokens per sequence."""
    if (
        not isinstance(block_table, torch.Tensor)
        or block_table.dim() != 2
        or block_table.shape[0] != batch
        or block_table.dtype.is_floating_point
        or block_table.dtype == torch.bool
    ):
        got = (
            f"{block_table.dtype} {_shape(block_table)}"
            if isinstance(block_table, torch.Tensor)
            else type(block_table).__name__
        )
        raise AttentionError(f"{where}: block_table: expected integers of shape [batch={batch}, max_pages], got {got}")
    if block_table.device != device:
        raise AttentionError(f"{where}: block_table: expected device {device} (that of q), got {block_table.device}")
    if page_size == 0:
        raise AttentionError(
            f"{where}: k: expected page_size >= 1 in [num_pages, page_size, kv_heads, head_dim], got 0"
        )
    return block_table.shape[1] * page_size


def _check_pages_in_use(block_table, lengths, num_pages: int, page_size: int, where: str) -> None:
    used = torch.arange(block_table.shape[1])[None, :] < (lengths.long()[:, None] + page_size - 1) // page_size
    ids = block_table[used]
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_pages):
        bad = ids[(ids < 0) | (ids >= num_pages)][0].item()
        raise AttentionError(
            f"{where}: block_table: expected page ids in [0, num_pages={num_pages}) for the pages "
            f"within kv_len, got {bad}"
        )
