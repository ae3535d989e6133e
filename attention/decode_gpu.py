"""Planning of the GPU (Triton) decode without a GPU: splits, block sizes, bytes, an H100 estimate, self-check cases.

Plain Python (no torch, no triton), so that plans and estimates can be printed
anywhere.  :mod:`treecoll.attention.decode_triton` takes its split count and block size
from here.

Split count (flash-decoding).  Stage 1 runs one program per (sequence, KV head,
split), the GQA group packed into the program.  :func:`choose_num_splits` is
FlashAttention-2's ``num_splits_heuristic`` (Dao-AILab/flash-attention,
``csrc/flash_attn/flash_api.cpp``; the split-KV path of ``flash_attn_with_kvcache``,
which packs the group the same way): no split once ``batch * kv_heads`` programs
fill 80% of the SMs; otherwise, among the split counts that change the number
of blocks per split, the smallest whose wave efficiency
``w / ceil(w)`` (``w = programs * splits / SMs``) is at least 85% of the best,
with at most 128 splits (FlashAttention-2's cap), one block per split at least,
and, as FlashInfer's decode planner does (``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``
in ``include/flashinfer/attention/scheduler.cuh``, lower bound
``max(128 / page_size, 1)`` pages), at least 128 tokens per split.

Block size.  :func:`block_n` keeps ``BLOCK_N * head_dim = 8192`` elements per
K (and V) block: 128 tokens for head_dim <= 64, 64 for 128, 32 for 256, the same
direction as FlashAttention-2's split-KV kernels (256 / 128 / 64 tokens for
head_dim <= 64 / <= 160 / larger on sm80-sm90, ``flash_api.cpp``), with a
block of a constant byte size.  Compiled for sm_90 with a group of 4, stage 1
then takes 22 / 22 / 25 KiB of shared memory in bf16 and 76 / 76 / 82 KiB in
float32 (two stages) at head_dim 64 / 128 / 256: within the 100 KiB of the
smallest sm_8x/sm_9x parts (tests/attention/test_decode_triton.py compiles it).

Estimate.  Decode reads every K/V byte once; its time on a GPU is at least
``bytes / HBM rate``.  :func:`estimate` counts the bytes of one call (K and V up
to ``tokens``, the query, the split partial states written by stage 1 and read
by stage 2, the final state) and divides by the rate.  With the defaults this is
an **estimate for an H100 SXM** (3.35 TB/s, 132 SMs) and a lower bound: no
kernel reads at the peak rate (the Flash-Decoding post,
https://pytorch.org/blog/flash-decoding/, reports 106.6 us for the 134 MB of a
B = 1, 128k-token, 2-KV-head cache on an A100, about 1.26 TB/s).

>>> choose_num_splits(1, 8, 131072, 132)
15
>>> block_n(64), block_n(128), block_n(256)
(128, 64, 32)
>>> round(estimate(batch=1, q_heads=32, kv_heads=8, head_dim=128, tokens=131072, itemsize=2)["seconds"] * 1e6, 1)
160.4
"""

from __future__ import annotations

import math

__all__ = [
    "H100_SXM_HBM_GBPS",
    "H100_SXM_SMS",
    "MAX_SPLITS",
    "MIN_SPLIT_TOKENS",
    "block_n",
    "choose_num_splits",
    "decode_bytes",
    "estimate",
    "selfcheck_cases",
]

#: HBM3 rate of an H100 SXM, GB/s: NVIDIA H100 Tensor Core GPU datasheet ("GPU memory
#: bandwidth 3.35TB/s", H100 SXM), https://www.nvidia.com/en-us/data-center/h100/
H100_SXM_HBM_GBPS = 3350.0
#: Streaming multiprocessors of an H100 SXM5: NVIDIA H100 Tensor Core GPU Architecture
#: whitepaper (2022), "132 SMs".
H100_SXM_SMS = 132
#: Upper bound on splits (FlashAttention-2's num_splits cap for the KV-cache path).
MAX_SPLITS = 128
#: Fewest tokens per split (FlashInfer's decode planner: at least 128 tokens per chunk).
MIN_SPLIT_TOKENS = 128
#: Elements of one K (or V) block of stage 1: BLOCK_N * head_dim.
BLOCK_ELEMENTS = 8192


def block_n(head_dim: int) -> int:
    """Tokens per block of stage 1 for ``head_dim`` (padded to a power of two, at least 64):
    ``8192 // that``, between 16 and 128."""
    padded = max(64, 1 << max(0, head_dim - 1).bit_length())
    return max(16, min(128, BLOCK_ELEMENTS // padded))


def choose_num_splits(batch: int, kv_heads: int, max_len: int, sms: int, *, block: int = 64) -> int:
    """Splits per sequence for ``batch * kv_heads`` stage-1 programs on ``sms`` SMs, keys of
    up to ``max_len`` tokens walked in blocks of ``block`` (FlashAttention-2's heuristic with
    FlashInfer's 128-token floor; see the module docstring).

    >>> choose_num_splits(64, 8, 4096, 132), choose_num_splits(1, 8, 0, 132), choose_num_splits(1, 8, 100, 132)
    (1, 1, 1)
    """
    programs = batch * kv_heads
    if max_len <= 0 or programs <= 0 or programs >= 0.8 * sms:
        return 1
    n_blocks = -(-max_len // block)
    limit = min(MAX_SPLITS, sms, n_blocks, -(-max_len // MIN_SPLIT_TOKENS))

    def eligible(s: int) -> bool:  # a split count that changes the blocks per split
        return s == 1 or -(-n_blocks // s) != -(-n_blocks // (s - 1))

    def efficiency(s: int) -> float:
        waves = programs * s / sms
        return waves / math.ceil(waves)

    candidates = [s for s in range(1, limit + 1) if eligible(s)]
    best = max(efficiency(s) for s in candidates)
    return next(s for s in candidates if efficiency(s) >= 0.85 * best)


def decode_bytes(
    *, batch: int, q_heads: int, kv_heads: int, head_dim: int, tokens: int, itemsize: int, splits: int = 1
) -> dict:
    """Bytes one decode call moves through device memory: ``kv`` (K and V, ``2 * batch *
    tokens * kv_heads * head_dim * itemsize``), ``q`` (read once), ``partials`` (the split
    states, float32 ``[splits, batch, q_heads, head_dim + 1]``, written and read back; 0
    for one split), ``out`` (the float32 state written) and ``total``."""
    state = batch * q_heads * (head_dim + 1) * 4
    parts = {
        "kv": 2 * batch * tokens * kv_heads * head_dim * itemsize,
        "q": batch * q_heads * head_dim * itemsize,
        "partials": 2 * splits * state if splits > 1 else 0,
        "out": state,
    }
    parts["total"] = sum(parts.values())
    return parts


def estimate(
    *,
    batch: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    tokens: int,
    itemsize: int,
    hbm_gbps: float = H100_SXM_HBM_GBPS,
    sms: int = H100_SXM_SMS,
) -> dict:
    """The time of one decode call at the full HBM rate (a lower bound; an H100 SXM by
    default): the split count :func:`choose_num_splits` picks for ``sms``, the bytes of
    :func:`decode_bytes`, and ``seconds = total bytes / (hbm_gbps * 1e9)``."""
    splits = choose_num_splits(batch, kv_heads, tokens, sms, block=block_n(head_dim))
    moved = decode_bytes(
        batch=batch,
        q_heads=q_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        tokens=tokens,
        itemsize=itemsize,
        splits=splits,
    )
    return {
        "splits": splits,
        "block_n": block_n(head_dim),
        "bytes": moved,
        "hbm_gbps": hbm_gbps,
        "seconds": moved["total"] / (hbm_gbps * 1e9),
        "formula": "seconds >= (K/V + q + split partials + out bytes) / HBM rate",
    }


#: The shapes a GPU self-check times: Llama-3.1-8B (32/8/128) and Llama-3.1-70B (64/8/128)
#: attention, as in FlashInfer's traces and benchmark lists, plus head_dim 64 and 256.
_SELFCHECK_SHAPES = (
    # name, batch, q_heads, kv_heads, head_dim, tokens, dtype, page_size
    ("llama8b-b1-8k", 1, 32, 8, 128, 8192, "bfloat16", 0),
    ("llama8b-b1-32k", 1, 32, 8, 128, 32768, "bfloat16", 0),
    ("llama8b-b1-128k", 1, 32, 8, 128, 131072, "bfloat16", 0),
    ("llama8b-b16-4k-paged16", 16, 32, 8, 128, 4096, "bfloat16", 16),
    ("llama8b-b64-4k", 64, 32, 8, 128, 4096, "bfloat16", 0),
    ("llama70b-b1-128k", 1, 64, 8, 128, 131072, "bfloat16", 0),
    ("llama70b-b16-8k-paged16", 16, 64, 8, 128, 8192, "bfloat16", 16),
    ("hd64-b4-32k", 4, 16, 4, 64, 32768, "bfloat16", 0),
    ("hd256-b2-32k", 2, 16, 2, 256, 32768, "bfloat16", 0),
    ("llama8b-b1-32k-fp16", 1, 32, 8, 128, 32768, "float16", 0),
    ("llama8b-b1-32k-fp32", 1, 32, 8, 128, 32768, "float32", 0),
)
_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


def selfcheck_cases(*, hbm_gbps: float = H100_SXM_HBM_GBPS, sms: int = H100_SXM_SMS) -> list[dict]:
    """The decode calls a GPU self-check times, as plain data, one dict per case:
    ``name``, ``batch``, ``q_heads``, ``kv_heads``, ``head_dim``, ``tokens`` (every sequence
    full), ``dtype`` (torch dtype name), ``page_size`` (0: contiguous cache
    ``[batch, tokens, kv_heads, head_dim]``; else a paged cache with this page size), and the
    :func:`estimate` for ``hbm_gbps`` / ``sms`` (an H100 SXM by default): ``splits``,
    ``bytes`` (KV bytes read), ``estimate_s``.  The self-check measures the time and reports
    ``bytes / time`` against the device's HBM rate, and checks the result against
    :func:`treecoll.attention.reference` on a cut-down copy.

    >>> [c["name"] for c in selfcheck_cases()][:2]
    ['llama8b-b1-8k', 'llama8b-b1-32k']
    """
    cases = []
    for name, batch, hq, hkv, dim, tokens, dtype, page in _SELFCHECK_SHAPES:
        est = estimate(
            batch=batch,
            q_heads=hq,
            kv_heads=hkv,
            head_dim=dim,
            tokens=tokens,
            itemsize=_ITEMSIZE[dtype],
            hbm_gbps=hbm_gbps,
            sms=sms,
        )
        cases.append(
            {
                "name": name,
                "batch": batch,
                "q_heads": hq,
                "kv_heads": hkv,
                "head_dim": dim,
                "tokens": tokens,
                "dtype": dtype,
                "page_size": page,
                "splits": est["splits"],
                "bytes": est["bytes"]["kv"],
                "estimate_s": est["seconds"],
            }
        )
    return cases
