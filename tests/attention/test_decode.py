"""decode_partial: validation, dispatch, and splitting a sequence anywhere."""
import doctest
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attention.decode as decode_mod
from attention import decode_partial, merge, merge_states, reference
from topo.errors import AttentionError


def test_doctests():
    assert doctest.testmod(decode_mod).failed == 0


def test_import_is_light():
    code = "import sys, attention; print('triton' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_auto_backend_on_cpu_is_torch(monkeypatch, make_inputs):
    calls = []
    monkeypatch.setitem(decode_mod.DECODE_BACKENDS, "torch", lambda *a: calls.append(a) or "torch-result")
    q, k, v = make_inputs(1, 2, 1, 8, 4, torch.float32)
    assert decode_partial(q, k, v) == "torch-result" and len(calls) == 1


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
        (dict(k=torch.zeros(2, 5, 2, 9), v=torch.zeros(2, 5, 2, 9)), r"k: expected \[batch=2, seq, kv_heads, head_dim=8\] to match q, got \(2, 5, 2, 9\)"),
        (dict(v=torch.zeros(2, 6, 2, 8)), r"v: expected the shape of k \(2, 5, 2, 8\), got \(2, 6, 2, 8\)"),
        (dict(q=torch.zeros(2, 3, 8)), r"q_heads: expected a multiple of kv_heads=2, got 3"),
        (dict(q=torch.zeros(2, 4, 8, dtype=torch.float64)), r"q: expected dtype in .*, got torch.float64"),
        (dict(v=torch.zeros(2, 5, 2, 8, dtype=torch.bfloat16)), r"v: expected the dtype of k \(torch.float32\), got torch.bfloat16"),
        (dict(kv_len=[1, 6]), r"kv_len: expected values in \[0, seq=5\], got min 1 and max 6"),
        (dict(kv_len=torch.zeros(3, dtype=torch.int32)), r"kv_len: expected integers of shape \[batch=2\], got torch.int32 \(3,\)"),
        (dict(kv_len=torch.zeros(2)), r"kv_len: expected integers of shape \[batch=2\], got torch.float32"),
        (dict(scale=float("nan")), r"scale: expected a finite float, got nan"),
        (dict(num_splits=0), r"num_splits: expected a positive int or None, got 0"),
        (dict(backend="cuda"), r"unknown backend 'cuda'; valid: \['auto', 'torch', 'triton'\]"),
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
