"""decode_partial: validation, dispatch, and splitting a sequence anywhere."""

import subprocess
import sys

import pytest
import torch
import treecoll.attention.decode as decode_mod
from hypothesis import given, settings
from hypothesis import strategies as st
from treecoll.attention import decode_partial, merge, merge_states, reference
from treecoll.topo.errors import AttentionError


def test_import_is_light():
    code = "import sys, attention; print('triton' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


@pytest.mark.parametrize("native_ok", [True, False])
def test_auto_backend_on_cpu_is_native_when_available_else_torch(native_ok, monkeypatch, make_inputs):
    from treecoll.attention import decode_native

    calls = []
    for name in ("torch", "native"):
        monkeypatch.setitem(decode_mod.DECODE_BACKENDS, name, lambda *a, name=name: calls.append(name) or name)
    monkeypatch.setattr(decode_native, "native_status", lambda: {"available": native_ok})
    q, k, v = make_inputs(1, 2, 1, 8, 4, torch.float32)
    expected = "native" if native_ok else "torch"
    assert decode_partial(q, k, v) == expected and calls == [expected]
    kt = torch.randn(1, 8, 4, 1).permute(0, 2, 3, 1)  # [1, 4, 1, 8] with head_dim stride 4
    assert kt.stride(-1) != 1
    assert decode_partial(q, kt, kt) == "torch"  # the C kernel reads head_dim with stride 1 only


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 60), st.lists(st.integers(0, 60), max_size=4), st.integers(0, 100))
def test_split_anywhere_and_merge_equals_whole(length, cuts, seed):
    """Attention over [0, L) equals the merge of attention over any partition of it."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, 8, generator=g)
    k, v = torch.randn(2, 60, 2, 8, generator=g), torch.randn(2, 60, 2, 8, generator=g)
    bounds = sorted({0, length, *[min(c, length) for c in cuts]})
    states = [decode_partial(q, k[:, a:b], v[:, a:b]) for a, b in zip(bounds, bounds[1:])]
    whole = decode_partial(q, k, v, kv_len=length)
    if not states:  # length 0: the whole is the empty state
        assert torch.isneginf(whole[1]).all() and (whole[0] == 0).all()
        return
    acc = states[0]
    for s in states[1:]:
        acc = merge(acc, s)
    for out, lse in (acc, merge_states([s[0] for s in states], [s[1] for s in states], 0)):
        torch.testing.assert_close(out, whole[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse, whole[1], rtol=1e-6, atol=1e-6)
    ref = reference(q, k, v, kv_len=length)
    torch.testing.assert_close(whole[0].double(), ref[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(q=torch.zeros(2, 4)), r"decode_partial: q: expected a tensor \[batch, q_heads, head_dim\], got \(2, 4\)"),
        (
            dict(k=torch.zeros(2, 5, 2, 9), v=torch.zeros(2, 5, 2, 9)),
            r"k: expected \[batch=2, seq, kv_heads, head_dim=8\] to match q, got \(2, 5, 2, 9\)",
        ),
        (dict(v=torch.zeros(2, 6, 2, 8)), r"v: expected the shape of k \(2, 5, 2, 8\), got \(2, 6, 2, 8\)"),
        (dict(q=torch.zeros(2, 3, 8)), r"q_heads: expected a multiple of kv_heads=2, got 3"),
        (dict(q=torch.zeros(2, 4, 8, dtype=torch.float64)), r"q: expected dtype in .*, got torch.float64"),
        (
            dict(v=torch.zeros(2, 5, 2, 8, dtype=torch.bfloat16)),
            r"v: expected the dtype of k \(torch.float32\), got torch.bfloat16",
        ),
        (dict(kv_len=[1, 6]), r"kv_len: expected values in \[0, seq=5\], got min 1 and max 6"),
        (
            dict(kv_len=torch.zeros(3, dtype=torch.int32)),
            r"kv_len: expected integers of shape \[batch=2\], got torch.int32 \(3,\)",
        ),
        (dict(kv_len=torch.zeros(2)), r"kv_len: expected integers of shape \[batch=2\], got torch.float32"),
        (dict(scale=float("nan")), r"scale: expected a finite float, got nan"),
        (dict(num_splits=0), r"num_splits: expected a positive int or None, got 0"),
        (dict(backend="cuda"), r"unknown backend 'cuda'; valid: \['auto', 'native', 'torch', 'triton'\]"),
        (dict(out=(torch.zeros(2, 4, 8), torch.zeros(2, 5))), r"out: expected float32 tensors of shapes"),
    ],
)
def test_invalid_inputs_are_rejected(change, message):
    args = dict(q=torch.zeros(2, 4, 8), k=torch.zeros(2, 5, 2, 8), v=torch.zeros(2, 5, 2, 8))
    args.update(change)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(AttentionError, match=message):
        decode_partial(q, k, v, **args)


def test_mixed_query_dtype_is_accepted(make_inputs, check_state):
    q, k, v = make_inputs(2, 4, 2, 16, 30, torch.bfloat16, seed=2)
    out, lse = decode_partial(q.float(), k, v, kv_len=[30, 0])
    check_state(out, lse, *reference(q.float(), k, v, kv_len=[30, 0]), 1e-2)


# ---- paged cache ---------------------------------------------------------------------------------


def to_paged(k, v, lengths, page_size, *, seed=0):
    """Scatter a contiguous cache into shuffled pages; unused slots hold NaN and
    table entries past each length are -1, so reading either would show."""
    batch, seq, kv_heads, head_dim = k.shape
    max_pages = -(-seq // page_size)
    num_pages = batch * max_pages + 3
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_pages, generator=g)
    kp = torch.full((num_pages, page_size, kv_heads, head_dim), float("nan"), dtype=k.dtype)
    vp = kp.clone()
    table = torch.full((batch, max_pages), -1, dtype=torch.int32)
    for b in range(batch):
        for p in range(-(-lengths[b] // page_size)):
            page = int(perm[b * max_pages + p])
            table[b, p] = page
            n = min(page_size, lengths[b] - p * page_size)
            kp[page, :n] = k[b, p * page_size : p * page_size + n]
            vp[page, :n] = v[b, p * page_size : p * page_size + n]
    return kp, vp, table


@pytest.mark.parametrize("backend", ["torch", "native", "triton"])
@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_paged_cache_equals_contiguous(backend, page_size, make_inputs, check_state):
    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "native":
        from treecoll.attention.decode_native import native_status

        if not native_status()["available"]:
            pytest.skip(native_status()["reason"])
    lengths = [0, 1, 37, 70]
    q, k, v = make_inputs(4, 8, 2, 16, 70, torch.bfloat16, seed=page_size)
    kp, vp, table = to_paged(k, v, lengths, page_size, seed=page_size)
    for splits in (1, 3):
        out, lse = decode_partial(q, kp, vp, kv_len=lengths, block_table=table, backend=backend, num_splits=splits)
        check_state(out, lse, *reference(q, k, v, kv_len=lengths), 1e-2)
    if backend == "torch":  # several blocks per sequence, blocks not aligned to pages after a split
        from treecoll.attention.decode_cpu import decode_torch
        from treecoll.attention.validate import check_decode_inputs

        lens, scale = check_decode_inputs(q, kp, vp, lengths, None, "test", block_table=table)
        out, lse = decode_torch(q, kp, vp, lens, scale, num_splits=2, block_size=2 * page_size, block_table=table)
        check_state(out, lse, *reference(q, k, v, kv_len=lengths), 1e-2)


def test_paged_cache_validation():
    q, kp = torch.zeros(2, 4, 8), torch.zeros(6, 4, 2, 8)
    table = torch.tensor([[0, 1], [2, 7]], dtype=torch.int32)
    with pytest.raises(
        AttentionError,
        match=r"block_table: expected page ids in \[0, num_pages=6\) "
        r"for the pages within kv_len, got 7",
    ):
        decode_partial(q, kp, kp, kv_len=[8, 5], block_table=table)
    decode_partial(q, kp, kp, kv_len=[8, 4], block_table=table)  # page 7 lies past kv_len: fine
    with pytest.raises(AttentionError, match=r"kv_len: expected values in \[0, seq=8\], got min 8 and max 9"):
        decode_partial(q, kp, kp, kv_len=[8, 9], block_table=table)
    with pytest.raises(
        AttentionError,
        match=r"block_table: expected integers of shape \[batch=2, max_pages\], "
        r"got torch.float32 \(2, 2\)",
    ):
        decode_partial(q, kp, kp, kv_len=[1, 1], block_table=table.float())
