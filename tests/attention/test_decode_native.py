"""The fused C decode kernel ('native' backend) against the float64 reference."""
import re

import pytest
import torch
from treecoll.attention import decode_native as native_mod
from treecoll.attention import decode_partial, reference
from treecoll.attention.validate import check_decode_inputs
from treecoll.topo.errors import AttentionError

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
TILE = 64  # the kernel's token tile (csrc/decode_cpu.c): lengths around it exercise partial tiles

STATUS = native_mod.native_status()
needs_native = pytest.mark.skipif(not STATUS["available"], reason=f"native kernel unavailable: {STATUS['reason']}")


def _native(q, k, v, lengths, *, portable, num_splits=1, block_table=None, out=None):
    lens, scale = check_decode_inputs(q, k, v, lengths, None, "test", block_table=block_table)
    return native_mod.decode_native(q, k, v, lens, scale, portable=portable, num_splits=num_splits,
                                    block_table=block_table, out=out)


@needs_native
@pytest.mark.parametrize("portable", [False, True], ids=["isa", "portable"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group,head_dim", [(1, 64), (3, 40), (4, 128), (8, 16), (5, 7)])
def test_matches_reference(portable, dtype, group, head_dim, make_inputs, poisoned, check_state):
    kv_heads, seq = 2, 3 * TILE + 5
    q, k, v = make_inputs(5, kv_heads * group, kv_heads, head_dim, seq, dtype, seed=group + head_dim)
    lengths = [0, 1, TILE, TILE + 1, seq]
    out = poisoned(5, kv_heads * group, head_dim)
    res = _native(q, k, v, lengths, portable=portable, out=out)
    assert res[0] is out[0] and res[1] is out[1]
    check_state(*out, *reference(q, k, v, kv_len=lengths), TOL[dtype])


@needs_native
@pytest.mark.parametrize("portable", [False, True], ids=["isa", "portable"])
def test_sharp_softmax_extreme_scores(portable, make_inputs, check_state):
    # scores of std ~40: exp underflows for all but a few keys in every tile
    q, k, v = make_inputs(2, 8, 2, 128, 500, torch.float32, seed=11)
    q = q * 4
    lens, _ = check_decode_inputs(q, k, v, [500, 77], None, "test")
    out, lse = native_mod.decode_native(q, k, v, lens, 1.0, portable=portable)
    check_state(out, lse, *reference(q, k, v, kv_len=[500, 77], scale=1.0), 1e-5)


@needs_native
@pytest.mark.parametrize("splits", [1, 2, 7])
def test_splits_and_strided_cache(splits, make_inputs, check_state):
    # k and v interleaved in one buffer with spare capacity: neither is contiguous
    q, _, _ = make_inputs(2, 8, 2, 32, 1, torch.bfloat16, seed=5)
    kv = torch.randn(2, 400, 2, 2, 32).bfloat16()  # [batch, capacity, k/v, kv_heads, head_dim]
    k, v = kv[:, :300, 0], kv[:, :300, 1]
    assert not k.is_contiguous()
    out, lse = _native(q, k, v, [300, 129], portable=False, num_splits=splits)
    check_state(out, lse, *reference(q, k, v, kv_len=[300, 129]), 1e-2)


@needs_native
def test_worker_threads_give_the_single_thread_result(make_inputs, check_state):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = make_inputs(3, 8, 2, 64, 5000, torch.bfloat16, seed=9)
        lengths = [5000, 2049, 3]  # the first two are split over the worker threads
        out2, lse2 = decode_partial(q, k, v, kv_len=lengths, backend="native")
        torch.set_num_threads(1)
        out1, lse1 = decode_partial(q, k, v, kv_len=lengths, backend="native")
    finally:
        torch.set_num_threads(threads)
    check_state(out2, lse2, *reference(q, k, v, kv_len=lengths), 1e-2)
    torch.testing.assert_close(out2, out1, rtol=1e-5, atol=1e-6)


def test_unavailable_native_falls_back_and_explains(monkeypatch, make_inputs, check_state):
    q, k, v = make_inputs(2, 4, 2, 16, 30, torch.float32, seed=1)
    for env, reason in ((dict(TREECOLL_NATIVE="0"), r"disabled by TREECOLL_NATIVE=0"),
                        (dict(CC="/nonexistent/cc"), r"no C compiler: '/nonexistent/cc' is not on PATH")):
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
def test_library_is_cached_per_source_and_cpu(monkeypatch, tmp_path):
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
def test_half_precision_conversion_edge_values():
    # fp16 subnormals, the largest finite values, and negative zero, one key each: the
    # kernel's conversion (portable and ISA paths) must agree with torch's exactly
    vals = torch.tensor([6e-8, -6e-8, 3e-5, 65504.0, -65504.0, -0.0, 1.0, 0.5], dtype=torch.float16)
    k = torch.zeros(1, 8, 1, 8, dtype=torch.float16)
    v = torch.diag_embed(vals).view(1, 8, 1, 8).contiguous()
    q = torch.zeros(1, 1, 8)  # uniform softmax: out = mean of the values rows
    for portable in (False, True):
        out, lse = _native(q, k, v, [8], portable=portable)
        torch.testing.assert_close(out[0, 0], vals.float() / 8, rtol=0, atol=0)
