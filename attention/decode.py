"""``decode_partial``: the partial attention state of one decode step on a local KV shard."""

from __future__ import annotations

import torch
from treecoll.attention.validate import KV_DTYPES, KvLen, check_decode_inputs
from treecoll.topo.errors import AttentionError

__all__ = ["DECODE_BACKENDS", "decode_partial"]


def _torch_backend(q, k, v, lengths, scale, num_splits, out, block_table, fast_bf16=False):
    from treecoll.attention.decode_cpu import decode_torch

    return decode_torch(q, k, v, lengths, scale, num_splits=num_splits or 1, out=out, block_table=block_table)


def _native_backend(q, k, v, lengths, scale, num_splits, out, block_table, fast_bf16=False):
    from treecoll.attention.decode_native import decode_native

    return decode_native(
        q, k, v, lengths, scale, num_splits=num_splits or 1, out=out, block_table=block_table, fast_bf16=fast_bf16
    )


def _auto_cpu_backend(q, k, v) -> str:
    """'native' when the C kernel is built (or can be) and reads these inputs in place, else 'torch'."""
    from treecoll.attention.decode_native import native_status, supports

    if supports(q, k, v) and native_status()["available"]:
        return "native"
    return "torch"


def _triton_backend(q, k, v, lengths, scale, num_splits, out, block_table, fast_bf16=False):
    from treecoll.attention.decode_triton import decode_triton

    return decode_triton(q, k, v, lengths, scale, num_splits=num_splits, out=out, block_table=block_table)


#: Named decode backends; 'auto' picks 'triton' for CUDA tensors, on CPU 'native' when
#: its C kernel can be built and read the inputs, else 'torch'.
DECODE_BACKENDS = {"native": _native_backend, "torch": _torch_backend, "triton": _triton_backend}


def decode_partial(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kv_len: KvLen | None = None,
    scale: float | None = None,
    num_splits: int | None = None,
    backend: str = "auto",
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_table: torch.Tensor | None = None,
    fast_bf16: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one query per sequence against its local keys, as a mergeable state.

    Parameters
    ----------
    q : Tensor [batch, q_heads, head_dim], float16 / bfloat16 / float32
    k, v : Tensor [batch, seq, kv_heads, head_dim], float16 / bfloat16 / float32
        The KV cache (same dtype for k and v; may differ from q's).  ``q_heads``
        is a multiple of ``kv_heads`` (GQA; MQA when ``kv_heads == 1``): query head
        ``h`` reads KV head ``h // (q_heads // kv_heads)``.  ``head_dim`` must have
        stride 1 for the Triton backend.  With ``block_table``: a paged cache
        ``[num_pages, page_size, kv_heads, head_dim]`` (any page size).
    kv_len : int, sequence of int, or integer Tensor [batch], optional
        Valid keys per sequence (positions ``0 .. kv_len[b]-1``); default ``seq``.
    scale : float, optional
        Score scale, default ``1/sqrt(head_dim)``.
    num_splits : int, optional
        Contiguous key chunks per sequence computed independently and merged
        (flash-decoding).  Default: from the length and the SM count on CUDA
        (:func:`treecoll.attention.decode_gpu.choose_num_splits`); for 'torch' on CPU
        at least ``torch.get_num_threads()`` for sequences of two blocks or more
        (one split per worker thread), else 1; for 'native' the kernel cuts the
        keys into blocks from the total length (``num_splits`` sets a minimum)
        and runs them on ``torch.get_num_threads()`` threads of its own.
    backend : {'auto', 'native', 'torch', 'triton'}
        'auto' takes 'triton' for CUDA tensors; on CPU 'native' (the fused C kernel
        of :mod:`treecoll.attention.decode_native`, built on first use with the system C
        compiler, AVX-512 / AVX2 / portable chosen at run time) when it is
        available and ``head_dim`` has stride 1, else 'torch' (block-wise float32
        matmuls).  'triton' on CPU tensors needs
        ``TRITON_INTERPRET=1`` before the kernels are imported.
    block_table : integer Tensor [batch, max_pages], optional
        Paged cache: token ``n`` of sequence ``b`` is
        ``k[block_table[b, n // page_size], n % page_size]``; ``seq`` is then
        ``max_pages * page_size``.  Entries past ``kv_len`` are never read.
    out : (Tensor, Tensor), optional
        Preallocated float32 ``[batch, q_heads, head_dim]`` and ``[batch, q_heads]``.
    fast_bf16 : bool
        Allow bf16 products for bfloat16 caches where the backend has them: 'native'
        on CPUs with AVX512_BF16 (``native_status()['fast_bf16']``) then multiplies
        with ``vdpbf16ps``, the query rounded to bf16 for the scores and the softmax
        weights rounded to bf16 for the values, as GPU kernels do (each rounding at
        most 2**-8 relative; about half the instructions).  Elsewhere, and for other
        cache dtypes, the arithmetic stays float32 and the option changes nothing.

    Returns
    -------
    (out, lse) : float32 [batch, q_heads, head_dim] (normalised) and float32
        [batch, q_heads], natural-log LSE of the scaled scores.  A sequence with
        no keys gives ``out = 0`` and ``lse = -inf`` (the merge identity).

    Examples
    --------
    >>> import torch
    >>> q, k = torch.randn(1, 4, 8), torch.randn(1, 5, 2, 8)
    >>> out, lse = decode_partial(q, k, k, kv_len=[0])
    >>> out.abs().max().item(), lse.tolist()
    (0.0, [[-inf, -inf, -inf, -inf]])
    """
    lengths, scale = check_decode_inputs(
        q, k, v, kv_len, scale, "decode_partial", dtypes=KV_DTYPES, block_table=block_table
    )
    if k.dtype != v.dtype:
        raise AttentionError(f"decode_partial: v: expected the dtype of k ({k.dtype}), got {v.dtype}")
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise AttentionError(f"decode_partial: num_splits: expected a positive int or None, got {num_splits!r}")
    if backend == "auto":
        backend = "triton" if q.is_cuda else _auto_cpu_backend(q, k, v)
    if backend not in DECODE_BACKENDS:
        raise AttentionError(
            f"decode_partial: unknown backend {backend!r}; valid: {['auto'] + sorted(DECODE_BACKENDS)}"
        )
    if out is not None:
        _check_out(out, q)
    if not isinstance(fast_bf16, bool):
        raise AttentionError(f"decode_partial: fast_bf16: expected a bool, got {fast_bf16!r}")
    extra = {"fast_bf16": True} if fast_bf16 else {}  # backends' positional signature unchanged by default
    return DECODE_BACKENDS[backend](q, k, v, lengths, scale, num_splits, out, block_table, **extra)


def _check_out(out, q) -> None:
    batch, q_heads, head_dim = q.shape
    expected = ((batch, q_heads, head_dim), (batch, q_heads))
    ok = (
        isinstance(out, (tuple, list))
        and len(out) == 2
        and all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device == q.device for t in out)
        and tuple(tuple(t.shape) for t in out) == expected
    )
    if not ok:
        got = tuple(
            (tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else type(t).__name__
            for t in (out if isinstance(out, (tuple, list)) else [out])
        )
        raise AttentionError(
            f"decode_partial: out: expected float32 tensors of shapes {expected} on {q.device}, got {got}"
        )
