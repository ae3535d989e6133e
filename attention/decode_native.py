"""The 'native' CPU decode backend: a fused C kernel, compiled on first use.

``attention/csrc/decode_cpu.c`` computes the attention states of a whole batch in
one call: the keys of every sequence are cut into blocks (and the KV heads into
slices when there are few blocks), the calling thread and a persistent pool of
C threads take the (sequence, block, slice) tasks, and the blocks' states are
merged in token order at the end (the result does not depend on the thread
count's scheduling, only on the block size).  bf16/fp16 -> float32 conversion
happens in registers inside the dot products, so each K/V element is read from
memory once and nothing is materialised; all arithmetic is float32.  ``ctypes``
releases the GIL during the call.

Instruction sets: the library is compiled for the baseline of the machine's
architecture, with AVX-512 BF16, AVX-512 and AVX2 variants selected at run time
(chosen once per process from the CPU; :func:`native_status` reports which).
``fast_bf16=True`` (AVX-512 BF16 CPUs, bf16 caches; ``native_status()['fast_bf16']``)
multiplies with ``vdpbf16ps`` on the raw bf16 keys and values, as GPU kernels do
with their bf16 matrix units: the scores with the query rounded to bfloat16, the
values with the softmax weights rounded to bfloat16 (the running max and sum stay
float32).  Each rounding is at most ``2**-8`` relative, so a score changes by up to
``2**-8 * sum_d |q_d k_d| * scale``, beyond the float32 tolerance: off by default.

Build (:mod:`treecoll.collectives.native`): the system C compiler (``$CC``, else ``cc``) with ``-O3``, once per source /
compiler / machine, into ``$TREECOLL_CACHE_DIR`` (default
``$XDG_CACHE_HOME/treecoll`` or ``~/.cache/treecoll``); the file is written under a
temporary name and renamed, so concurrent processes never load a half-written
library.  Without a compiler, or with ``TREECOLL_NATIVE=0``, :func:`native_status`
says why and ``backend='auto'`` uses the torch path.

One query against two keys with scores ``[1, 0]`` (``scale=1``): the weights are ``e / (e + 1)`` and
``1 / (e + 1)``, so ``out = (e * [1, 2] + [3, 4]) / (e + 1)`` and ``lse = log(e + 1)`` (where the kernel
cannot be built, the float64 reference stands in, so the example reads the same):

>>> import torch
>>> from treecoll.attention.reference import reference
>>> q = torch.tensor([[[1.0, 0.0]]])                       # [batch 1, q_heads 1, head_dim 2]
>>> k = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]])      # [batch 1, seq 2, kv_heads 1, head_dim 2]
>>> v = torch.tensor([[[[1.0, 2.0]], [[3.0, 4.0]]]])
>>> status = native_status()
>>> sorted(status), status["isa"] in NATIVE_ISAS + (None,)
(['available', 'fast_bf16', 'isa', 'library', 'reason'], True)
>>> built = status["available"]
>>> out, lse = decode_native(q, k, v, torch.tensor([2]), 1.0) if built else reference(q, k, v, scale=1.0)
>>> [round(x, 5) for x in out.flatten().tolist()], round(lse.item(), 5)
([1.53788, 2.53788], 1.31326)
>>> read_sum(torch.ones(4096)) if built else 4096.0        # a pure read of memory (bench_decode's rate)
4096.0
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from treecoll.attention.kv_cache import in_huge_pages
from treecoll.collectives.native import NativeUnavailable, load_library
from treecoll.topo.errors import AttentionError

__all__ = ["NATIVE_DTYPES", "NATIVE_ISAS", "decode_native", "native_status", "read_in_kernel_order", "read_sum"]

SOURCE = Path(__file__).with_name("csrc") / "decode_cpu.c"
#: KV (and query) dtypes the kernel reads, with the code the C source expects.
NATIVE_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
#: Instruction-set tiers of the kernel, lowest first (``isa=`` of :func:`decode_native`).
NATIVE_ISAS = ("portable", "avx2", "avx512", "avx512_bf16")
# The second set when the compiler rejects the x86 target attributes of the first.
_FLAG_SETS = (["-O3", "-pthread"], ["-O3", "-pthread", "-DTREECOLL_PORTABLE_ONLY"])
_FLAG_FAST_BF16 = 1
_FLAG_STREAM_ONLY = 2
_FLAG_HUGE_PAGES = 4

_STATE: dict = {}


def _declare(lib) -> None:
    lib.treecoll_decode.argtypes = [ctypes.POINTER(_Args)]
    lib.treecoll_decode.restype = ctypes.c_int
    lib.treecoll_decode_isa.restype = ctypes.c_char_p
    lib.treecoll_read_sum.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.treecoll_read_sum.restype = ctypes.c_double


def _load():
    """The loaded library, or raise AttentionError saying why there is none (cached in ``_STATE``;
    built by :func:`treecoll.collectives.native.load_library`)."""
    try:
        return load_library(SOURCE, _FLAG_SETS, _STATE, _declare)
    except NativeUnavailable as exc:
        raise AttentionError(f"decode backend 'native': unavailable: {exc}; use backend='torch'") from None


def native_status() -> dict:
    """``{'available': bool, 'isa': one of NATIVE_ISAS or None, 'fast_bf16': bool, 'library': path,
    'reason': str}`` (builds the kernel on first call; ``isa`` is the tier chosen for this CPU;
    ``fast_bf16``: whether ``fast_bf16=True`` has its ``vdpbf16ps`` path here)."""
    try:
        lib = _load()
    except AttentionError as exc:
        return {"available": False, "isa": None, "fast_bf16": False, "library": None, "reason": str(exc)}
    isa = lib.treecoll_decode_isa().decode()
    return {
        "available": True,
        "isa": isa,
        "fast_bf16": isa == "avx512_bf16",
        "library": str(_STATE["path"]),
        "reason": "",
    }


def supports(q, k, v) -> bool:
    """Whether the kernel can read these inputs in place (CPU, a known dtype,
    ``head_dim`` of stride 1); otherwise the caller uses the torch path."""
    return (
        q.device.type == "cpu"
        and k.device.type == "cpu"
        and k.dtype in NATIVE_DTYPES
        and v.dtype == k.dtype
        and q.dtype in NATIVE_DTYPES
        and k.stride(-1) == 1
        and v.stride(-1) == 1
    )


class _Args(ctypes.Structure):
    """``treecoll_decode_args`` of csrc/decode_cpu.c (field for field)."""

    _fields_ = (
        [("q", ctypes.c_void_p)]
        + [(n, ctypes.c_int64) for n in ("q_dtype", "q_b", "q_h", "q_d")]
        + [("k", ctypes.c_void_p), ("v", ctypes.c_void_p)]
        + [
            (n, ctypes.c_int64)
            for n in ("kv_dtype", "batch", "kv_heads", "group", "head_dim", "k_b", "k_t", "k_h", "v_b", "v_t", "v_h")
        ]
        + [
            ("lengths", ctypes.c_void_p),
            ("pages", ctypes.c_void_p),
            ("pages_b", ctypes.c_int64),
            ("page_size", ctypes.c_int64),
            ("out", ctypes.c_void_p),
        ]
        + [(n, ctypes.c_int64) for n in ("out_b", "out_h", "out_d")]
        + [("lse", ctypes.c_void_p), ("lse_b", ctypes.c_int64), ("lse_h", ctypes.c_int64), ("scale", ctypes.c_double)]
        + [(n, ctypes.c_int64) for n in ("threads", "isa", "flags", "block_tokens")]
    )


def decode_native(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
    *,
    num_splits: int = 1,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
    block_table: torch.Tensor | None = None,
    isa: str | None = None,
    fast_bf16: bool = False,
    threads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial decode attention with the fused C kernel (validated CPU inputs; see
    :func:`treecoll.attention.decode_partial` for shapes and the contract).

    ``q`` [batch, q_heads, head_dim] (any strides); ``k``/``v`` [batch, seq, kv_heads,
    head_dim] with any strides but ``head_dim``'s = 1, or paged [num_pages, page_size,
    kv_heads, head_dim] with ``block_table`` int [batch, max_pages]; float32, bfloat16
    or float16.  ``lengths`` int [batch].  ``num_splits > 1`` cuts each sequence into
    at least that many blocks (the kernel chooses otherwise); ``threads`` defaults to
    ``torch.get_num_threads()``.  ``isa`` caps the instruction set (one of
    :data:`NATIVE_ISAS`, for tests and comparisons; default: the best the CPU has).
    ``fast_bf16``: scores and values by ``vdpbf16ps``, the query and the softmax
    weights rounded to bfloat16 (bf16 caches on AVX-512 BF16 CPUs; elsewhere
    ignored): up to 2**-8 relative error in each of them.  Returns ``(out, lse)``:
    float32 [batch, q_heads, head_dim] and [batch, q_heads], natural log; ``(0, -inf)``
    for no keys.
    """
    flags = _FLAG_FAST_BF16 if fast_bf16 else 0
    return _run(q, k, v, lengths, scale, num_splits, out, block_table, isa, flags, threads)


def read_in_kernel_order(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, *, threads: int | None = None
) -> None:
    """A benchmark's probe, not attention: read the K/V rows :func:`decode_native` would read (same
    inputs), in its task and tile order with its software prefetches and threads, but without the
    arithmetic, so that the time against the kernel's says whether the kernel waits for this access
    stream or for its arithmetic.  Only on the AVX-512 tiers (``native_status()['isa']`` starting
    with ``avx512``); elsewhere it runs the kernel itself."""
    _run(q, k, v, lengths, 1.0, 1, None, None, None, _FLAG_STREAM_ONLY, threads)


def _run(q, k, v, lengths, scale, num_splits, out, block_table, isa, flags, threads):
    """:func:`decode_native`'s call of the kernel with the flags word of csrc/decode_cpu.c."""
    lib = _load()
    if not supports(q, k, v):
        raise AttentionError(
            f"decode backend 'native': expected CPU float32/bfloat16/float16 q, K and V with head_dim stride 1, "
            f"got {k.device} q {q.dtype}, K/V {k.dtype}/{v.dtype} with strides {tuple(k.stride())}/"
            f"{tuple(v.stride())}; use backend='torch'"
        )
    if isa is not None and isa not in NATIVE_ISAS:
        raise AttentionError(f"decode_native: isa: expected one of {list(NATIVE_ISAS)} or None, got {isa!r}")
    batch, q_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    if out is None:
        out = (
            torch.empty(batch, q_heads, head_dim, dtype=torch.float32),
            torch.empty(batch, q_heads, dtype=torch.float32),
        )
    out_buf, lse_buf = out
    if batch == 0 or q_heads == 0:
        return out_buf, lse_buf
    if in_huge_pages(k) and in_huge_pages(v):  # the page walks ahead of the prefetches step by 2 MiB
        flags |= _FLAG_HUGE_PAGES
    lens = lengths if lengths.dtype == torch.int64 and lengths.is_contiguous() else lengths.to(torch.int64).contiguous()
    args = _Args(
        q=q.data_ptr(),
        q_dtype=NATIVE_DTYPES[q.dtype],
        q_b=q.stride(0),
        q_h=q.stride(1),
        q_d=q.stride(2),
        k=k.data_ptr(),
        v=v.data_ptr(),
        kv_dtype=NATIVE_DTYPES[k.dtype],
        batch=batch,
        kv_heads=kv_heads,
        group=q_heads // kv_heads,
        head_dim=head_dim,
        lengths=lens.data_ptr(),
        out=out_buf.data_ptr(),
        out_b=out_buf.stride(0),
        out_h=out_buf.stride(1),
        out_d=out_buf.stride(2),
        lse=lse_buf.data_ptr(),
        lse_b=lse_buf.stride(0),
        lse_h=lse_buf.stride(1),
        scale=float(scale),
        threads=threads or torch.get_num_threads(),
        isa=-1 if isa is None else NATIVE_ISAS.index(isa),
        flags=flags,
    )
    itemsize = k.element_size()
    args.k_b, args.k_t, args.k_h = (s * itemsize for s in k.stride()[:3])
    args.v_b, args.v_t, args.v_h = (s * itemsize for s in v.stride()[:3])
    if block_table is not None:
        table = (
            block_table
            if block_table.dtype == torch.int64 and block_table.is_contiguous()
            else block_table.to(torch.int64).contiguous()
        )
        args.pages, args.pages_b, args.page_size = table.data_ptr(), table.stride(0), k.shape[1]
    if num_splits > 1 and batch:
        args.block_tokens = max(1, -(-int(lens.max()) // num_splits))
    rc = lib.treecoll_decode(ctypes.byref(args))
    if rc != 0:
        raise AttentionError(
            f"decode backend 'native': kernel failed with code {rc} "
            f"({'out of memory' if rc == -2 else 'bad arguments'})"
        )
    return out_buf, lse_buf


def read_sum(x: torch.Tensor, threads: int | None = None) -> float:
    """Sum of a contiguous, 64-byte aligned float32 CPU tensor (its first ``numel // 64 * 64``
    elements) by ``threads`` kernel threads (default ``torch.get_num_threads()``): a pure
    read of memory, with which tools/bench_decode measures the read-only rate."""
    lib = _load()
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous() or x.data_ptr() % 64:
        raise AttentionError(
            f"read_sum: expected a contiguous 64-byte aligned float32 CPU tensor, got {x.dtype} on {x.device}"
        )
    return lib.treecoll_read_sum(x.data_ptr(), x.numel(), threads or torch.get_num_threads())
