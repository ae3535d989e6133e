"""Attention-state merge: identity, no NaN, commutativity, associativity, packing, LSE base."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from treecoll.attention import (
    MergeOp,
    empty_state,
    merge,
    merge_packed,
    merge_states,
    pack_state,
    to_base2,
    to_natural_log,
    unpack_state,
)
from treecoll.topo.errors import AttentionError

from treecoll import attention

NEG_INF = float("-inf")


def random_state(shape, head_dim, *, seed, empty_mask=None, spread=10.0):
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(*shape, head_dim, generator=g)
    lse = (torch.rand(*shape, generator=g) - 0.5) * 2 * spread
    if empty_mask is not None:
        out = out.masked_fill(empty_mask.unsqueeze(-1), 0.0)
        lse = lse.masked_fill(empty_mask, NEG_INF)
    return out, lse


def merge64(states):
    """The merge formula in float64 (the ground truth of the tests)."""
    outs = torch.stack([s[0].double() for s in states])
    lses = torch.stack([s[1].double() for s in states])
    lse = torch.logsumexp(lses, 0)
    w = torch.exp(lses - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse))
    return (outs * w.unsqueeze(-1)).sum(0), lse


def test_empty_is_exact_identity():
    x = random_state((2, 3), 8, seed=1)
    e = empty_state(2, 3, 8)
    for a, b in ((x, e), (e, x)):
        out, lse = merge(a, b)
        assert torch.equal(out, x[0]) and torch.equal(lse, x[1])


def test_all_empty_gives_empty_state():
    e = empty_state(1, 4, 5)
    out, lse = merge(e, e)
    assert torch.equal(out, torch.zeros(1, 4, 5))
    assert torch.isneginf(lse).all()
    out, lse = merge_states(torch.zeros(7, 1, 4, 5), torch.full((7, 1, 4), NEG_INF), 0)
    assert torch.equal(out, torch.zeros(1, 4, 5)) and torch.isneginf(lse).all()


def test_commutative_bit_exact():
    a, b = random_state((3, 4), 16, seed=2), random_state((3, 4), 16, seed=3)
    ab, ba = merge(a, b), merge(b, a)
    assert torch.equal(ab[0], ba[0]) and torch.equal(ab[1], ba[1])


def test_merge_matches_float64_formula_with_extreme_spread():
    # |lse_a - lse_b| up to 400 (> 88, where exp overflows/underflows in fp32)
    a = random_state((4, 8), 32, seed=4, spread=200.0)
    b = random_state((4, 8), 32, seed=5, spread=200.0)
    out, lse = merge(a, b)
    ref_out, ref_lse = merge64([a, b])
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-5)


def test_merge_is_fp32_for_low_precision_inputs():
    a = random_state((2, 2), 8, seed=6)
    b = random_state((2, 2), 8, seed=7)
    a16 = (a[0].bfloat16(), a[1].bfloat16())
    b16 = (b[0].half(), b[1].half())
    out, lse = merge(a16, b16)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    ref_out, ref_lse = merge64([a16, b16])  # exact inputs, merged in float64
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_bad_lse_propagates_to_its_row_only(bad):
    """A +inf or NaN lse makes its row NaN in every merge (the policy of
    attention.state; the full table is in test_nan_policy.py); other rows are exact."""
    a = random_state((1, 2), 4, seed=8)
    b = random_state((1, 2), 4, seed=9)
    b[1][0, 1] = bad
    want = merge64([(a[0][:, :1], a[1][:, :1]), (b[0][:, :1], b[1][:, :1])])
    op = MergeOp(batch=1, heads=2, head_dim=4)
    results = [
        merge(a, b),
        merge_states(torch.stack([a[0], b[0]]), torch.stack([a[1], b[1]]), 0),
        unpack_state(op(pack_state(*a), pack_state(*b)), 1, 2, 4),
    ]
    for out, lse in results:
        assert torch.isnan(out[0, 1]).all() and torch.isnan(lse[0, 1])
        torch.testing.assert_close(out[:, :1].double(), want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse[:, :1].double(), want[1], rtol=1e-6, atol=1e-6)


def test_malformed_states_rejected():
    with pytest.raises(AttentionError, match=r"merge: state a: expected a state tuple \(out, lse\), got Tensor"):
        merge(torch.zeros(3), (torch.zeros(1, 2), torch.zeros(1)))
    with pytest.raises(AttentionError, match=r"expected out \[..., head_dim\] and lse \[...\]"):
        merge((torch.zeros(2, 3), torch.zeros(3)), (torch.zeros(2, 3), torch.zeros(2)))
    with pytest.raises(AttentionError, match="expected states of the same shape"):
        merge((torch.zeros(2, 3), torch.zeros(2)), (torch.zeros(1, 3), torch.zeros(1)))
    with pytest.raises(AttentionError, match=r"expected dim in \[-2, 1\]"):
        merge_states(torch.zeros(2, 3, 4), torch.zeros(2, 3), 2)
    with pytest.raises(AttentionError, match="unknown backend 'cuda'; valid"):
        merge_states(torch.zeros(2, 3, 4), torch.zeros(2, 3), 0, backend="cuda")
    with pytest.raises(AttentionError, match="expected at least one state"):
        merge_states([], [], 0)


# ---- associativity and order independence -------------------------------------------------


@st.composite
def merge_plans(draw):
    """A list of states (some rows empty, some states all empty) and a random bracketing."""
    n = draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    shape, head_dim = (2, 3), 4
    spread = draw(st.sampled_from([1.0, 30.0, 120.0]))
    states = []
    for i in range(n):
        mode = draw(st.sampled_from(["full", "partial", "empty"]))
        mask = {
            "full": torch.zeros(shape, dtype=torch.bool),
            "partial": torch.rand(shape, generator=g) < 0.5,
            "empty": torch.ones(shape, dtype=torch.bool),
        }[mode]
        states.append(random_state(shape, head_dim, seed=seed * 8 + i, empty_mask=mask, spread=spread))
    order = draw(st.permutations(range(n)))
    # a bracketing: repeatedly merge two neighbours picked by the drawn indices
    picks = [draw(st.integers(0, n - 2 - j)) for j in range(n - 1)]
    return states, order, picks


def merge_bracketed(states, order, picks):
    items = [states[i] for i in order]
    for p in picks:
        items[p : p + 2] = [merge(items[p], items[p + 1])]
    return items[0]


@settings(max_examples=60, deadline=None)
@given(merge_plans())
def test_any_bracketing_and_order_gives_the_same_state(plan):
    states, order, picks = plan
    out, lse = merge_bracketed(states, order, picks)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    ref_out, ref_lse = merge64(states)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse.double()[finite], ref_lse[finite], rtol=1e-6, atol=1e-5)
    # all at once (both backends' shared torch path) agrees as well
    out_n, lse_n = merge_states([s[0] for s in states], [s[1] for s in states], 0, backend="torch")
    torch.testing.assert_close(out_n, out, rtol=1e-5, atol=1e-5)
    assert torch.equal(torch.isneginf(lse_n), torch.isneginf(lse))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=6), st.integers(0, 1000))
def test_no_nan_for_any_mix_of_empty_states(empties, seed):
    states = [random_state((3,), 2, seed=seed + i, empty_mask=torch.full((3,), e)) for i, e in enumerate(empties)]
    acc = states[0]
    for s in states[1:]:
        acc = merge(acc, s)
    stacked = merge_states([s[0] for s in states], [s[1] for s in states], -1)
    for out, lse in (acc, stacked):
        assert not torch.isnan(out).any() and not torch.isnan(lse).any()
        assert bool(torch.isneginf(lse).all()) == all(empties)
        if all(empties):
            assert (out == 0).all()


def test_merge_states_dims_and_sequences():
    states = [random_state((2, 3), 4, seed=20 + i) for i in range(5)]
    ref_out, ref_lse = merge64(states)
    outs = torch.stack([s[0] for s in states], 1)  # [2, S, 3, 4]
    lses = torch.stack([s[1] for s in states], 1)  # [2, S, 3]
    for dim in (1, -2):
        out, lse = merge_states(outs, lses, dim)
        assert out.shape == (2, 3, 4) and lse.shape == (2, 3)
        torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-6, atol=1e-6)
    out, lse = merge_states([s[0] for s in states], [s[1] for s in states], -1)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-6)
    out, lse = merge_states(torch.zeros(0, 2, 3, 4), torch.zeros(0, 2, 3), 0)
    assert torch.equal(out, torch.zeros(2, 3, 4)) and torch.isneginf(lse).all()


# ---- packing -----------------------------------------------------------------------------------


def test_pack_unpack_round_trip_and_views():
    out, lse = random_state((2, 3), 5, seed=30)
    buf = pack_state(out, lse)
    assert buf.shape == (2 * 3 * 6,) and buf.dtype == torch.float32 and buf.is_contiguous()
    assert torch.equal(buf[: 2 * 3 * 5], out.reshape(-1)) and torch.equal(buf[2 * 3 * 5 :], lse.reshape(-1))
    o2, l2 = unpack_state(buf, 2, 3, 5)
    assert torch.equal(o2, out) and torch.equal(l2, lse)
    o2.zero_()
    assert (buf[:30] == 0).all()  # views, not copies
    with pytest.raises(
        AttentionError,
        match=r"unpack_state: expected a 1-D float32 buffer of 36 elements "
        r"\(batch=2, heads=3, head_dim=5\), "
        r"got torch.float32 tensor of shape \(35,\)",
    ):
        unpack_state(buf[:35], 2, 3, 5)


def test_merge_packed_and_merge_op_match_merge():
    a = random_state((2, 3), 5, seed=31)
    b = random_state((2, 3), 5, seed=32, empty_mask=torch.tensor([[True, False, False], [False, False, True]]))
    ref = merge(a, b)
    op = MergeOp(batch=2, heads=3, head_dim=5)
    packed = merge_packed(pack_state(*a), pack_state(*b), batch=2, heads=3, head_dim=5)
    assert torch.equal(packed, pack_state(*ref))
    assert torch.equal(op(pack_state(*a), pack_state(*b)), packed)
    tup = op(a, b)
    assert isinstance(tup, tuple) and torch.equal(tup[0], ref[0])
    assert torch.equal(op(op.identity(), pack_state(*a)), pack_state(*a))
    assert op.numel == 36 and op.commutative and hash(op) == hash(MergeOp(2, 3, 5))
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.batch = 3  # type: ignore[misc]
    with pytest.raises(AttentionError, match=r"MergeOp.heads: expected a positive int, got 0"):
        MergeOp(batch=1, heads=0, head_dim=4)


# ---- LSE base ----------------------------------------------------------------------------------


def test_lse_base_conversion_round_trip_and_meaning():
    g = torch.Generator().manual_seed(40)
    scores = torch.randn(3, 4, 50, generator=g, dtype=torch.float64) * 5
    scores[0, 0] = NEG_INF  # an empty row
    lse_e = torch.logsumexp(scores, -1).float()
    lse_2 = torch.log2(torch.exp2(scores * attention.LOG2E).sum(-1)).float()  # what base-2 libraries return
    torch.testing.assert_close(to_base2(lse_e), lse_2, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(to_natural_log(lse_2), lse_e, rtol=1e-6, atol=1e-6)
    rt = to_natural_log(to_base2(lse_e))
    assert torch.isneginf(rt[0, 0]) and torch.isneginf(to_base2(lse_e)[0, 0])
    torch.testing.assert_close(rt, lse_e, rtol=2e-7, atol=0.0)
    assert abs(attention.LOG2E * attention.LN2 - 1.0) < 1e-15
