"""Triton kernels against the float64 reference (under TRITON_INTERPRET=1 on CPU; small shapes)."""

import pytest
import torch

pytest.importorskip("triton", reason="the Triton kernels need triton (pip install 'treecoll[triton]')")

import treecoll.attention.decode_triton as dt  # noqa: E402  (after conftest set TRITON_INTERPRET)
from treecoll.attention import decode_partial, merge_states, reference  # noqa: E402
from treecoll.attention.validate import check_decode_inputs  # noqa: E402
from treecoll.topo.errors import AttentionError  # noqa: E402

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HEAD_DIM = 24  # not a power of two
BLOCK = dt.block_n(HEAD_DIM)
SEQ = 2 * BLOCK + 19  # lengths below cover 0, 1, one block exactly, non-multiples
LENGTHS = [0, 1, BLOCK, BLOCK + 1, SEQ]


def _to(device, *ts):
    return [t.to(device) for t in ts]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("splits", [1, 3])
def test_matches_reference(dtype, group, splits, make_inputs, poisoned, check_state):
    batch, kv_heads, head_dim = len(LENGTHS), 2, HEAD_DIM
    q, k, v = make_inputs(batch, kv_heads * group, kv_heads, head_dim, SEQ, dtype, seed=group + splits)
    ref = reference(q, k, v, kv_len=LENGTHS)
    q, k, v = _to(DEVICE, q, k, v)
    out = tuple(_to(DEVICE, *poisoned(batch, kv_heads * group, head_dim)))
    decode_partial(q, k, v, kv_len=torch.tensor(LENGTHS, device=DEVICE), num_splits=splits, backend="triton", out=out)
    check_state(out[0].cpu(), out[1].cpu(), *ref, TOL[dtype])


def test_stage1_writes_every_partial_including_empty_splits(make_inputs):
    q, k, v = make_inputs(3, 4, 1, 128, 100, torch.float32, seed=7)
    assert dt.block_n(128) == 64
    lengths, scale = check_decode_inputs(q, k, v, [100, 3, 0], None, "test")
    splits = 4  # chunks of ceil(ceil(100/4)/64)*64 = 64 keys: splits 2 and 3 lie past the end
    part_out = torch.full((splits, 3, 4, 128), float("nan"))
    part_lse = torch.full((splits, 3, 4), float("nan"))
    dt.decode_stage1(q, k, v, lengths, scale, part_out, part_lse)
    assert not torch.isnan(part_out).any() and not torch.isnan(part_lse).any()
    assert torch.isfinite(part_lse[:2, 0]).all() and torch.isneginf(part_lse[2:, 0]).all()
    assert (part_out[2:, 0] == 0).all()
    assert torch.isfinite(part_lse[0, 1]).all() and torch.isneginf(part_lse[1:, 1]).all()
    assert torch.isneginf(part_lse[:, 2]).all() and (part_out[:, 2] == 0).all()
    # each split is the attention over its own chunk
    ref0 = reference(q[:1], k[:1, :64], v[:1, :64])
    torch.testing.assert_close(part_out[0, 0].double(), ref0[0][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(part_lse[0, 0].double(), ref0[1][0], rtol=1e-6, atol=1e-6)


def test_split_anywhere_equals_whole(make_inputs):
    q, k, v = make_inputs(1, 4, 2, 16, 90, torch.float32, seed=8)
    whole = decode_partial(q, k, v, backend="triton")
    for cut in (0, 1, 37, 64, 89, 90):
        left = decode_partial(q, k[:, :cut], v[:, :cut], backend="triton")
        right = decode_partial(q, k[:, cut:], v[:, cut:], backend="triton")
        out, lse = merge_states([left[0], right[0]], [left[1], right[1]], 0, backend="triton")
        torch.testing.assert_close(out, whole[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse, whole[1], rtol=1e-6, atol=1e-6)


def test_merge_kernel_matches_torch_merge():
    g = torch.Generator().manual_seed(9)
    num_states = 21  # more than one BLOCK_S of 16
    outs = torch.randn(3, num_states, 5, 20, generator=g)
    lses = torch.randn(3, num_states, 5, generator=g) * 50
    empty = torch.rand(3, num_states, 5, generator=g) < 0.4
    empty[0, :, 0] = True  # an all-empty row
    lses = lses.masked_fill(empty, float("-inf"))
    outs = outs.masked_fill(empty.unsqueeze(-1), 0.0)  # empty states are (0, -inf)
    tri = merge_states(outs, lses, 1, backend="triton")
    ref = merge_states(outs, lses, 1, backend="torch")
    assert not torch.isnan(tri[0]).any() and not torch.isnan(tri[1]).any()
    assert torch.isneginf(tri[1][0, 0]) and (tri[0][0, 0] == 0).all()
    torch.testing.assert_close(tri[0], ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tri[1], ref[1], rtol=1e-6, atol=1e-6)
    out, lse = merge_states(torch.zeros(0, 2, 3), torch.zeros(0, 2), 0, backend="triton")
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_num_splits_heuristic():
    """FlashAttention-2's rule (attention.decode_gpu), values worked out by hand: 8 programs on
    132 SMs fill w = 8s/132 waves; the best efficiency over s <= 128 is 1.0 (s = 33, 66...),
    and s = 15 is the first with w / ceil(w) >= 0.85 (120/132 = 0.91; s = 14 gives 0.848)."""
    assert dt.choose_num_splits(1, 8, 131072, 132) == 15
    assert dt.choose_num_splits(1, 8, 0, 132) == 1
    assert dt.choose_num_splits(16, 8, 1 << 20, 132) == 1  # 128 programs >= 0.8 * 132
    assert dt.choose_num_splits(1, 8, 100, 132) == 1  # under 2 x 128 tokens: no split
    assert dt.choose_num_splits(1, 8, 256, 132) == 2  # 128 tokens per split at most 2
    # one program on 10,000 SMs: efficiency s / 10000, best at s = 128 (the cap); 85% of it is 108.8
    assert dt.choose_num_splits(1, 1, 1 << 30, 10_000) == 109
    # 4 programs on 13 SMs, 4 blocks: 3 splits would leave ceil(4/3) = 2 blocks per split, as 2
    # splits do, so 3 is not eligible (else its 12/13 waves would win); among 1, 2, 4 (efficiency
    # 4/13, 8/13, 16/13 / 2 = 8/13) the first within 85% of the best is 2
    assert dt.choose_num_splits(1, 4, 512, 13, block=128) == 2


def test_cpu_tensors_need_the_interpreter(monkeypatch, make_inputs):
    q, k, v = make_inputs(1, 2, 1, 16, 8, torch.float32)
    monkeypatch.setattr(dt, "_INTERPRETED", False)
    with pytest.raises(
        AttentionError, match="decode_stage1: expected CUDA tensors, got CPU tensors; set TRITON_INTERPRET=1"
    ):
        decode_partial(q, k, v, backend="triton")


def test_head_dim_must_be_contiguous(make_inputs):
    q, k, v = make_inputs(1, 2, 1, 16, 8, torch.float32)
    k_t = k.transpose(1, 3).contiguous().transpose(1, 3)  # same values, head_dim stride != 1
    with pytest.raises(AttentionError, match=r"decode_stage1: k: expected stride 1 in the last dim \(head_dim\)"):
        decode_partial(q, k_t, v, backend="triton")


_COMPILE_SCRIPT = r"""
import os, sys, json
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import treecoll.attention.decode_triton as dt

def compile_kernel(fn, pointers, ints, floats, consts, arch, stages):
    sig = dict(pointers)
    sig.update({n: "i32" for n in ints})
    sig.update({n: "fp32" for n in floats})
    sig.update({n: "constexpr" for n in consts})
    src = ASTSource(fn=fn, signature=sig, constexprs={(list(sig).index(n),): v for n, v in consts.items()})
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_stages": stages}).metadata.shared

strides = ["stride_qb", "stride_qh", "stride_tb", "stride_kb", "stride_kn", "stride_kh", "stride_vb", "stride_vn",
           "stride_vh", "stride_os", "stride_ob", "stride_oh", "stride_ls", "stride_lb", "stride_lh", "seq",
           "num_splits"]
shared = {}
for dtype, arch, page in (("bf16", 90, 0), ("fp32", 80, 16)):
    for head_dim in (64, 128, 256):
        ptrs = {"Q": "*" + dtype, "K": "*" + dtype, "V": "*" + dtype, "KV_LEN": "*i32", "OUT": "*fp32", "LSE": "*fp32",
                "BLOCK_TABLE": "*i32"}
        consts = dict(GROUP=4, HEAD_DIM=head_dim, BLOCK_G=16, BLOCK_N=dt.block_n(head_dim), BLOCK_D=head_dim,
                      UPCAST=dtype == "fp32", PAGE_SIZE=page)
        stages = dt.STAGES_FP32 if dtype == "fp32" else dt.STAGES_HALF
        shared[f"{dtype}-{head_dim}"] = compile_kernel(dt._decode_split_kernel, ptrs, strides, ["qk_scale"], consts,
                                                       arch, stages)
shared["merge"] = compile_kernel(
    dt._merge_states_kernel, {"OUT_IN": "*fp32", "LSE_IN": "*fp32", "OUT": "*fp32", "LSE": "*fp32"},
    ["num_states", "stride_os", "stride_or", "stride_ls", "stride_lr", "stride_out_r", "stride_lse_r"], [],
    dict(HEAD_DIM=128, BLOCK_S=16, BLOCK_D=128), 80, 3)
print(json.dumps(shared))
"""


def test_kernels_compile_for_gpu_targets():
    """The interpreter does not apply the GPU compiler's rules; compile (no GPU
    needed) for sm_80/sm_90 at head_dim 64, 128 and 256 with their block sizes and check
    the shared memory fits the 100 KiB of the smallest sm_8x/sm_9x parts."""
    import json
    import subprocess
    import sys

    from triton.backends import backends

    if "nvidia" not in backends:
        pytest.skip("triton has no NVIDIA backend here")
    res = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )
    assert res.returncode == 0, res.stderr[-3000:]
    shared = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(shared) == {f"{d}-{h}" for d in ("bf16", "fp32") for h in (64, 128, 256)} | {"merge"}
    assert all(v <= 100 * 1024 for v in shared.values()), shared  # bytes of shared memory


def test_strided_query_and_output_buffers(make_inputs, check_state):
    q, k, v = make_inputs(2, 4, 2, 16, 70, torch.float32, seed=11)
    q_strided = torch.stack([q, q], -1).flatten(-2)[..., ::2]  # same values, head_dim stride 2
    assert torch.equal(q_strided, q)
    big_out = torch.full((2, 4, 32), float("nan"))
    big_lse = torch.full((2, 8), float("nan"))
    out = (big_out[..., ::2], big_lse[:, ::2])  # non-contiguous destinations
    decode_partial(q_strided, k, v, kv_len=[70, 3], backend="triton", num_splits=2, out=out)
    check_state(out[0], out[1], *reference(q, k, v, kv_len=[70, 3]), 1e-5)
    assert torch.isnan(big_out[..., 1::2]).all() and torch.isnan(big_lse[:, 1::2]).all()  # nothing else written


@pytest.mark.parametrize("head_dim", [7, 64, 256])
def test_block_sizes_per_head_dim(head_dim, make_inputs, check_state):
    """Blocks of 128 / 128 / 32 tokens (attention.decode_gpu.block_n): partial blocks, a
    split boundary inside a block, GQA group 4, fp16."""
    block = dt.block_n(head_dim)
    assert block == {7: 128, 64: 128, 256: 32}[head_dim]
    lengths = [1, block, 2 * block + 3]
    q, k, v = make_inputs(3, 8, 2, head_dim, 2 * block + 3, torch.float16, seed=head_dim)
    ref = reference(q, k, v, kv_len=lengths)
    q, k, v = _to(DEVICE, q, k, v)
    for splits in (1, 2):
        out, lse = decode_partial(
            q, k, v, kv_len=torch.tensor(lengths, device=DEVICE), num_splits=splits, backend="triton"
        )
        check_state(out.cpu(), lse.cpu(), *ref, 1e-2)


def test_h100_estimate_and_selfcheck_cases():
    """The estimate is bytes / HBM rate with the bytes counted by hand: Llama-3.1-8B, 128k
    bf16 tokens, 15 splits: K+V 2*131072*8*128*2, q 32*128*2, partials 2*15*32*129*4,
    out 32*129*4; at 3350 GB/s."""
    from treecoll.attention import decode_gpu as gpu

    est = gpu.estimate(batch=1, q_heads=32, kv_heads=8, head_dim=128, tokens=131072, itemsize=2)
    kv, q, state = 2 * 131072 * 8 * 128 * 2, 32 * 128 * 2, 32 * 129 * 4
    assert est["splits"] == 15 and est["bytes"]["kv"] == kv
    assert est["bytes"]["total"] == kv + q + 2 * 15 * state + state
    assert est["seconds"] == (kv + q + 2 * 15 * state + state) / 3350e9
    cases = gpu.selfcheck_cases()
    assert len({c["name"] for c in cases}) == len(cases) >= 8
    for c in cases:
        assert c["q_heads"] % c["kv_heads"] == 0 and c["dtype"] in ("bfloat16", "float16", "float32")
        item = 4 if c["dtype"] == "float32" else 2
        assert c["bytes"] == 2 * c["batch"] * c["tokens"] * c["kv_heads"] * c["head_dim"] * item
        assert c["estimate_s"] > c["bytes"] / 3350e9
    assert {c["head_dim"] for c in cases} == {64, 128, 256} and any(c["page_size"] for c in cases)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host synchronisation is a CUDA matter")
def test_no_host_sync_between_split_kernel_and_merge(make_inputs):
    q, k, v = _to("cuda", *make_inputs(2, 8, 2, 128, 4096, torch.bfloat16))
    lengths = torch.tensor([4096, 1000], device="cuda", dtype=torch.int32)
    decode_partial(q, k, v, kv_len=lengths, backend="triton")  # compile first
    torch.cuda.set_sync_debug_mode("error")
    try:
        dt.decode_triton(q, k, v, lengths, 0.088, num_splits=4)
        dt.decode_triton(q, k, v, lengths, 0.088)
    finally:
        torch.cuda.set_sync_debug_mode("default")
