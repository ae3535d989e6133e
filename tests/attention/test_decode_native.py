"""The fused C decode kernel ('native' backend) against the float64 reference, on every
instruction-set tier this CPU can run (portable C, AVX2, AVX-512, AVX-512 BF16)."""

import re

import pytest
import torch
from treecoll.attention import decode_native as native_mod
from treecoll.attention import decode_partial, reference
from treecoll.attention.validate import check_decode_inputs
from treecoll.topo.errors import AttentionError

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
TILE = 32  # the kernel's token tile (csrc/decode_cpu.c): lengths around it exercise partial tiles

STATUS = native_mod.native_status()
needs_native = pytest.mark.skipif(not STATUS["available"], reason=f"native kernel unavailable: {STATUS['reason']}")
#: the tiers this CPU runs: every tier up to the one chosen for it
ISAS = list(native_mod.NATIVE_ISAS[: native_mod.NATIVE_ISAS.index(STATUS["isa"]) + 1]) if STATUS["available"] else []


def _native(q, k, v, lengths, *, isa=None, num_splits=1, block_table=None, out=None, threads=1, fast_bf16=False):
    lens, scale = check_decode_inputs(q, k, v, lengths, None, "test", block_table=block_table)
    return native_mod.decode_native(
        q,
        k,
        v,
        lens,
        scale,
        isa=isa,
        num_splits=num_splits,
        block_table=block_table,
        out=out,
        threads=threads,
        fast_bf16=fast_bf16,
    )


@needs_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group,head_dim", [(1, 64), (2, 256), (3, 40), (4, 128), (5, 7), (6, 33), (7, 96), (8, 16)])
def test_matches_reference(isa, dtype, group, head_dim, make_inputs, poisoned, check_state):
    """GQA groups 1-8, head_dim 7-256 (partial 32-element chunks), lengths 0, 1, a tile,
    a tile + 1 and an odd total; the out buffers start as NaN and must be written."""
    kv_heads, seq = 2, 3 * TILE + 5
    q, k, v = make_inputs(5, kv_heads * group, kv_heads, head_dim, seq, dtype, seed=group + head_dim)
    lengths = [0, 1, TILE, TILE + 1, seq]
    out = poisoned(5, kv_heads * group, head_dim)
    res = _native(q, k, v, lengths, isa=isa, out=out, num_splits=2)
    assert res[0] is out[0] and res[1] is out[1]
    # K/V are read exactly (float32 arithmetic only): fp32's tolerance holds for every dtype
    check_state(*out, *reference(q, k, v, kv_len=lengths), 1e-5)


@needs_native
@pytest.mark.parametrize("isa", ISAS)
def test_sharp_softmax_extreme_scores(isa, make_inputs, check_state):
    # scores of std ~40: exp underflows for all but a few keys in every tile
    q, k, v = make_inputs(2, 8, 2, 128, 500, torch.float32, seed=11)
    q = q * 4
    lens, _ = check_decode_inputs(q, k, v, [500, 77], None, "test")
    out, lse = native_mod.decode_native(q, k, v, lens, 1.0, isa=isa)
    check_state(out, lse, *reference(q, k, v, kv_len=[500, 77], scale=1.0), 1e-5)


@needs_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("splits", [1, 2, 7])
def test_splits_and_strided_cache(isa, splits, make_inputs, check_state):
    # k and v interleaved in one buffer with spare capacity: neither is contiguous
    q, _, _ = make_inputs(2, 8, 2, 32, 1, torch.bfloat16, seed=5)
    kv = torch.randn(2, 400, 2, 2, 32).bfloat16()  # [batch, capacity, k/v, kv_heads, head_dim]
    k, v = kv[:, :300, 0], kv[:, :300, 1]
    assert not k.is_contiguous()
    out, lse = _native(q, k, v, [300, 129], isa=isa, num_splits=splits)
    check_state(out, lse, *reference(q, k, v, kv_len=[300, 129]), 1e-5)


@needs_native
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_paged_cache(isa, dtype, page_size, make_inputs, check_state):
    from tests.attention.test_decode import to_paged

    lengths = [0, 1, 37, 70]
    q, k, v = make_inputs(4, 8, 2, 24, 70, dtype, seed=page_size)
    kp, vp, table = to_paged(k, v, lengths, page_size, seed=page_size)  # unused slots hold NaN
    for splits in (1, 3):
        out, lse = _native(q, kp, vp, lengths, isa=isa, block_table=table, num_splits=splits, threads=2)
        check_state(out, lse, *reference(q, k, v, kv_len=lengths), 1e-5)


@needs_native
def test_thread_count_does_not_change_the_result(make_inputs, check_state):
    """Blocks depend on the lengths only and are merged in token order: bit-identical
    results for 1, 2 and 3 threads (the kernel's pool), head slices included."""
    q, k, v = make_inputs(3, 8, 2, 64, 5000, torch.bfloat16, seed=9)
    lengths = [5000, 2049, 3]
    results = [_native(q, k, v, lengths, threads=t) for t in (1, 2, 3)]
    check_state(*results[0], *reference(q, k, v, kv_len=lengths), 1e-5)
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])
    short = [_native(q, k[:, :40], v[:, :40], [40, 3, 0], threads=t) for t in (1, 3)]  # head slices
    assert torch.equal(short[0][0], short[1][0]) and torch.equal(short[0][1], short[1][1])


@needs_native
def test_default_threads_follow_torch(make_inputs, check_state):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = make_inputs(2, 8, 2, 32, 3000, torch.float32, seed=4)
        out, lse = decode_partial(q, k, v, kv_len=[3000, 1000], backend="native")
        check_state(out, lse, *reference(q, k, v, kv_len=[3000, 1000]), 1e-5)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


needs_fast = pytest.mark.skipif(not STATUS["available"] or not STATUS["fast_bf16"], reason="no AVX512_BF16")
# bf16 keeps 8 significant bits: rounding to nearest moves a value by at most half a unit, 2**-8 of it
BF16_UNIT = 2.0**-8


def _fast_bf16_bounds(q, k, v, lengths, scale):
    """Per (sequence, query head) bounds on |out - ref| (largest element) and |lse - ref| of the
    fast_bf16 path, derived from its two roundings (float64, from the inputs):

    * the scaled query rounded to bf16 changes score t by at most d = 2**-8 sum_d |scale q_d k_td|;
      the softmax weights then change by a factor within exp(+-2 D), D = max_t d, so the
      weights move by at most expm1(2 D) in sum, and lse by at most D;
    * each weight rounded to bf16 (the sum they are divided by is not rounded) adds at most
      2**-8 of itself;

    so |out - ref| <= (expm1(2 D) + 2**-8) max_t |v_t| per row.  float32 arithmetic adds
    about 1e-6 relative; 1e-5 of slack covers it."""
    batch, q_heads, _ = q.shape
    group = q_heads // k.shape[2]
    out_bound = torch.zeros(batch, q_heads, dtype=torch.float64)
    lse_bound = torch.zeros(batch, q_heads, dtype=torch.float64)
    for b, n in enumerate(lengths):
        if n == 0:
            continue
        kb = k[b, :n].double().repeat_interleave(group, dim=1)  # [n, q_heads, D]
        vb = v[b, :n].double().repeat_interleave(group, dim=1)
        drift = BF16_UNIT * (scale * q[b].double().abs() * kb.abs()).sum(-1).max(0).values  # [q_heads]
        vmax = vb.abs().amax(dim=(0, 2))
        out_bound[b] = (torch.expm1(2 * drift) + BF16_UNIT) * vmax + 1e-5 * vmax
        lse_bound[b] = drift + 1e-5 * (1 + drift)
    return out_bound, lse_bound


@needs_native
@needs_fast
@pytest.mark.parametrize("group,head_dim", [(1, 64), (2, 256), (3, 40), (4, 128), (5, 7), (8, 33)])
def test_fast_bf16_within_its_rounding_bound(group, head_dim, make_inputs):
    """fast_bf16 (vdpbf16ps scores with the query rounded to bf16, vdpbf16ps values with the
    weights rounded to bf16) against the float64 reference, every row within the bound its
    roundings allow (_fast_bf16_bounds); GQA groups 1-8, head_dim 7-256, lengths 0, 1, a
    tile, a tile + 1 and odd (the values take tokens in pairs), and several blocks."""
    kv_heads, seq = 2, 3 * TILE + 5
    q, k, v = make_inputs(5, kv_heads * group, kv_heads, head_dim, seq, torch.bfloat16, seed=3 * group + head_dim)
    qf = q.float() + torch.randn(q.shape, generator=torch.Generator().manual_seed(1)) * 1e-2  # not bf16-exact
    lengths = [0, 1, TILE, TILE + 1, seq]
    scale = head_dim**-0.5
    ref_out, ref_lse = reference(qf, k, v, kv_len=lengths)
    out_bound, lse_bound = _fast_bf16_bounds(qf, k, v, lengths, scale)
    for splits in (1, 3):
        out, lse = _native(qf, k, v, lengths, num_splits=splits, threads=2, fast_bf16=True)
        empty = torch.tensor(lengths) == 0
        assert (out[empty] == 0).all() and torch.isneginf(lse[empty]).all()
        out_err = (out.double() - ref_out).abs().amax(-1)
        lse_err = (lse.double() - ref_lse).abs()
        assert (out_err[~empty] <= out_bound[~empty]).all(), (out_err - out_bound).max()
        assert (lse_err[~empty] <= lse_bound[~empty]).all(), (lse_err - lse_bound).max()


@needs_native
@needs_fast
def test_fast_bf16_is_a_precision_change_only_for_bf16_caches(make_inputs, check_state):
    """The roundings show (beyond float32's tolerance) with bf16 caches; float32 and float16
    caches, and a CPU tier without AVX512_BF16, ignore the option (float32 arithmetic)."""
    q, k, v = make_inputs(3, 8, 2, 128, 200, torch.bfloat16, seed=21)
    lengths = [200, 65, 0]
    qf = q.float() + torch.randn(q.shape, generator=torch.Generator().manual_seed(1)) * 1e-3
    ref = reference(qf, k, v, kv_len=lengths)
    out, _ = _native(qf, k, v, lengths, fast_bf16=True)
    err = (out.double() - ref[0]).abs().max().item() / ref[0].abs().max().item()
    assert err > 1e-5
    check_state(*_native(qf, k, v, lengths), *ref, 1e-5)
    check_state(*_native(qf, k, v, lengths, isa="avx512", fast_bf16=True), *ref, 1e-5)
    for dtype in (torch.float32, torch.float16):
        kd, vd = k.to(dtype), v.to(dtype)
        check_state(*_native(qf, kd, vd, lengths, fast_bf16=True), *reference(qf, kd, vd, kv_len=lengths), 1e-5)


@needs_native
def test_isa_names_and_status():
    assert STATUS["isa"] in native_mod.NATIVE_ISAS
    q, k, v = torch.zeros(1, 2, 8), torch.zeros(1, 3, 1, 8), torch.zeros(1, 3, 1, 8)
    lens, scale = check_decode_inputs(q, k, v, None, None, "test")
    with pytest.raises(
        AttentionError,
        match=r"decode_native: isa: expected one of \['portable', 'avx2', 'avx512', "
        r"'avx512_bf16'\] or None, got 'sse'",
    ):
        native_mod.decode_native(q, k, v, lens, scale, isa="sse")


@needs_native
def test_read_sum():
    x = torch.arange(4096, dtype=torch.float32) % 7
    assert native_mod.read_sum(x, threads=2) == float(x.sum())
    with pytest.raises(AttentionError, match="read_sum: expected a contiguous 64-byte aligned float32 CPU tensor"):
        native_mod.read_sum(x[1:])


@needs_native
@pytest.mark.parametrize("dtype,head_dim", [(torch.bfloat16, 128), (torch.float32, 7), (torch.float16, 33)])
def test_read_in_kernel_order_reads_without_changing_anything(dtype, head_dim, make_inputs):
    """The benchmark's probe runs the kernel's reads (partial tiles, odd head_dim, an empty sequence)
    and leaves its inputs as they were."""
    q, k, v = make_inputs(3, 8, 2, head_dim, 2 * TILE + 5, dtype, seed=3)
    lens = torch.tensor([2 * TILE + 5, 0, TILE - 1])
    before = [t.clone() for t in (q, k, v, lens)]
    assert native_mod.read_in_kernel_order(q, k, v, lens, threads=2) is None
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v, lens)))
    with pytest.raises(AttentionError, match="decode backend 'native': expected CPU"):
        native_mod.read_in_kernel_order(q, k.to(torch.int32), v, lens)


def test_unavailable_native_falls_back_and_explains(monkeypatch, make_inputs, check_state):
    q, k, v = make_inputs(2, 4, 2, 16, 30, torch.float32, seed=1)
    for env, reason in (
        ({"TREECOLL_NATIVE": "0"}, r"disabled by TREECOLL_NATIVE=0"),
        ({"CC": "/nonexistent/cc"}, r"no C compiler: '/nonexistent/cc' is not on PATH"),
    ):
        with monkeypatch.context() as mp:
            mp.setattr(native_mod, "_STATE", {})  # forget the loaded library
            for name, value in env.items():
                mp.setenv(name, value)
            status = native_mod.native_status()
            assert not status["available"] and re.search(reason, status["reason"])
            with pytest.raises(AttentionError, match="decode backend 'native': unavailable: " + reason):
                decode_partial(q, k, v, backend="native")
            out, lse = decode_partial(q, k, v)  # 'auto' takes the torch path
            check_state(out, lse, *reference(q, k, v), 1e-5)


def test_compiler_errors_are_reported_not_raised(monkeypatch, tmp_path):
    fake_cc = tmp_path / "cc"
    fake_cc.write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\necho 'cc: fatal error: broken' >&2\nexit 1\n")
    fake_cc.chmod(0o755)
    monkeypatch.setattr(native_mod, "_STATE", {})
    monkeypatch.setenv("CC", str(fake_cc))
    monkeypatch.setenv("TREECOLL_CACHE_DIR", str(tmp_path / "cache"))
    status = native_mod.native_status()
    assert not status["available"]
    assert "building decode_cpu.c failed" in status["reason"] and "cc: fatal error: broken" in status["reason"]
    assert not list((tmp_path / "cache").glob("*.tmp"))  # no half-written library left behind


@needs_native
def test_library_is_cached_per_source_and_compiler(monkeypatch, tmp_path):
    monkeypatch.setenv("TREECOLL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native_mod, "_STATE", {})
    first = native_mod.native_status()
    assert first["available"] and first["library"].startswith(str(tmp_path))
    stamp = (tmp_path / first["library"].rsplit("/", 1)[1]).stat().st_mtime_ns
    monkeypatch.setattr(native_mod, "_STATE", {})
    second = native_mod.native_status()
    assert second["library"] == first["library"]
    assert (tmp_path / second["library"].rsplit("/", 1)[1]).stat().st_mtime_ns == stamp  # reused, not rebuilt


@needs_native
@pytest.mark.parametrize("isa", ISAS)
def test_half_precision_conversion_edge_values(isa):
    # fp16 subnormals, the largest finite values, and negative zero, one key each: the
    # kernel's conversion must agree with torch's exactly
    vals = torch.tensor([6e-8, -6e-8, 3e-5, 65504.0, -65504.0, -0.0, 1.0, 0.5], dtype=torch.float16)
    k = torch.zeros(1, 8, 1, 8, dtype=torch.float16)
    v = torch.diag_embed(vals).view(1, 8, 1, 8).contiguous()
    q = torch.zeros(1, 1, 8)  # uniform softmax: out = mean of the values rows
    out, _ = _native(q, k, v, [8], isa=isa)
    torch.testing.assert_close(out[0, 0], vals.float() / 8, rtol=0, atol=0)


@needs_native
def test_decode_partial_passes_fast_bf16(make_inputs):
    """decode_partial(fast_bf16=True) runs the native kernel's option (the same bits), the torch
    path ignores it; a non-bool is refused by name."""
    q, k, v = make_inputs(2, 8, 2, 64, 90, torch.bfloat16, seed=2)
    lens, scale = check_decode_inputs(q, k, v, [90, 33], None, "test")
    fast = decode_partial(q, k, v, kv_len=[90, 33], backend="native", fast_bf16=True)
    direct = native_mod.decode_native(q, k, v, lens, scale, fast_bf16=True)
    assert torch.equal(fast[0], direct[0]) and torch.equal(fast[1], direct[1])
    plain = decode_partial(q, k, v, kv_len=[90, 33], backend="torch")
    same = decode_partial(q, k, v, kv_len=[90, 33], backend="torch", fast_bf16=True)
    assert torch.equal(plain[0], same[0]) and torch.equal(plain[1], same[1])
    assert STATUS["fast_bf16"] == (STATUS["isa"] == "avx512_bf16")
    with pytest.raises(AttentionError, match=r"decode_partial: fast_bf16: expected a bool, got 1"):
        decode_partial(q, k, v, fast_bf16=1)


@needs_native
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("layout", ["heads_apart", "paged"])
def test_heads_apart_and_paged_caches(fast, layout, make_inputs, check_state):
    """A cache stored [batch, kv_heads, seq, head_dim] and read through a transposed view (a head's
    rows adjacent, the heads of a token far apart: the prefetch walks each head's rows), and a
    paged cache, with and without fast_bf16 (held to its rounding bound)."""
    from tests.attention.test_decode import to_paged

    if fast and not STATUS["fast_bf16"]:
        pytest.skip("no AVX512_BF16")
    lengths = [3 * TILE + 7, 1, 50]
    q, k, v = make_inputs(3, 8, 2, 96, 3 * TILE + 7, torch.bfloat16, seed=17)
    q = q.float()
    if layout == "heads_apart":
        kc, vc = k.transpose(1, 2).contiguous().transpose(1, 2), v.transpose(1, 2).contiguous().transpose(1, 2)
        assert kc.stride(2) == kc.shape[1] * kc.shape[3]
        out, lse = _native(q, kc, vc, lengths, num_splits=2, threads=2, fast_bf16=fast)
    else:
        kp, vp, table = to_paged(k, v, lengths, 5, seed=3)
        out, lse = _native(q, kp, vp, lengths, block_table=table, num_splits=2, threads=2, fast_bf16=fast)
    ref = reference(q, k, v, kv_len=lengths)
    if not fast:
        check_state(out, lse, *ref, 1e-5)
        return
    out_bound, lse_bound = _fast_bf16_bounds(q, k, v, lengths, 96**-0.5)
    assert ((out.double() - ref[0]).abs().amax(-1) <= out_bound).all()
    assert ((lse.double() - ref[1]).abs() <= lse_bound).all()


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fast", [False, True])
def test_cache_in_huge_pages(dtype, fast, make_inputs, check_state, monkeypatch):
    """A cache from alloc_kv in 2 MiB pages (the kernel's page walks then step by 2 MiB): the same
    result, bit for bit, as the same cache in ordinary memory, and the reference's within tolerance
    (5 MiB of K and V: the rows of a tile cross the 2 MiB pages' boundaries)."""
    from treecoll.attention.kv_cache import alloc_kv, in_huge_pages, thp_mode

    if thp_mode() not in ("always", "madvise"):
        pytest.skip(f"the kernel gives no transparent huge pages here (mode {thp_mode()})")
    batch, kv_heads, group, head_dim, seq = 2, 4, 4, 128, 2560 if dtype == torch.float32 else 5120
    q, k, v = make_inputs(batch, kv_heads * group, kv_heads, head_dim, seq, dtype, seed=11)
    hk = alloc_kv(k.shape, dtype, pages="2m").copy_(k)
    hv = alloc_kv(v.shape, dtype, pages="2m").copy_(v)
    flags = []  # the flags word of every kernel call

    class Spy:
        def __init__(self, lib):
            self.lib = lib

        def __getattr__(self, name):
            return getattr(self.lib, name)

        def treecoll_decode(self, args):
            flags.append(args._obj.flags)
            return self.lib.treecoll_decode(args)

    monkeypatch.setitem(native_mod._STATE, "lib", Spy(native_mod._load()))
    lengths = [seq - 37, seq]
    plain = _native(q, k, v, lengths, threads=2, fast_bf16=fast)
    huge = _native(q, hk, hv, lengths, threads=2, fast_bf16=fast)
    assert in_huge_pages(hk) and not in_huge_pages(k)
    assert [f & native_mod._FLAG_HUGE_PAGES for f in flags] == [0, native_mod._FLAG_HUGE_PAGES]
    assert torch.equal(plain[0], huge[0]) and torch.equal(plain[1], huge[1])
    if not fast:
        check_state(*huge, *reference(q, k, v, kv_len=lengths), 1e-5)
