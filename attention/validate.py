"""Input checks shared by every decode backend (one place, one set of messages)."""
from __future__ import annotations

import math

import torch

from topo.errors import AttentionError

__all__ = ["KV_DTYPES", "check_decode_inputs"]

#: dtypes the decode kernels accept for q, k and v.
KV_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _shape(x) -> str:
    return str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__


def check_decode_inputs(q, k, v, kv_len, scale, where: str, dtypes=KV_DTYPES + (torch.float64,)):
    """Validate a decode call and return ``(lengths, scale)``.

    ``lengths``: int32 ``[batch]`` on ``q.device``.  Values outside ``[0, seq]`` are
    rejected for CPU tensors; for CUDA tensors they are not read back (that would
    force a device sync) and the kernels clamp them to ``[0, seq]``.
    ``scale``: float, default ``1/sqrt(head_dim)``.
    """
    for name, x, ndim, dims in (
        ("q", q, 3, "[batch, q_heads, head_dim]"),
        ("k", k, 4, "[batch, seq, kv_heads, head_dim]"),
        ("v", v, 4, "[batch, seq, kv_heads, head_dim]"),
    ):
        if not isinstance(x, torch.Tensor) or x.dim() != ndim:
            raise AttentionError(f"{where}: {name}: expected a tensor {dims}, got {_shape(x)}")
        if x.dtype not in dtypes:
            raise AttentionError(
                f"{where}: {name}: expected dtype in {[str(d) for d in dtypes]}, got {x.dtype}"
            )
        if x.device != q.device:
            raise AttentionError(f"{where}: {name}: expected device {q.device} (that of q), got {x.device}")
    if k.shape != v.shape:
        raise AttentionError(f"{where}: v: expected the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    batch, q_heads, head_dim = q.shape
    _, seq, kv_heads, _ = k.shape
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise AttentionError(
            f"{where}: k: expected [batch={batch}, seq, kv_heads, head_dim={head_dim}] to match q, "
            f"got {tuple(k.shape)}"
        )
    if kv_heads == 0 or q_heads % kv_heads:
        raise AttentionError(
            f"{where}: q_heads: expected a multiple of kv_heads={kv_heads}, got {q_heads}"
        )
    if head_dim == 0:
        raise AttentionError(f"{where}: head_dim: expected at least 1, got 0")
    lengths = _lengths(kv_len, batch, seq, q.device, where)
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
    if not isinstance(kv_len, torch.Tensor) or kv_len.dtype.is_floating_point or kv_len.dtype == torch.bool \
            or kv_len.is_complex() or tuple(kv_len.shape) != (batch,):
        got = f"{kv_len.dtype} {_shape(kv_len)}" if isinstance(kv_len, torch.Tensor) else repr(kv_len)
        raise AttentionError(f"{where}: kv_len: expected integers of shape [batch={batch}], got {got}")
    if kv_len.device.type == "cpu" and kv_len.numel():
        lo, hi = int(kv_len.min()), int(kv_len.max())
        if lo < 0 or hi > seq:
            raise AttentionError(
                f"{where}: kv_len: expected values in [0, seq={seq}], got min {lo} and max {hi}"
            )
    return kv_len.to(device=device, dtype=torch.int32)
