"""The NaN/inf policy of attention.state, on every backend and in every merge.

One table of cases (a bad value in q, K or V, placed where torch's SDPA turns
it into NaN, into inf, or into a weight of 0).  The ground truth of each case
is torch's ``scaled_dot_product_attention`` (math backend) on the same values,
per sequence over its valid keys; the lse is checked against the float64
reference.  Every decode backend runs the same table, whole and split; the
states of three parts of the keys, merged by every merge, must equal the whole.
"""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from treecoll.attention import (
    MergeOp,
    decode_partial,
    merge,
    merge_states,
    pack_state,
    reference,
    unpack_state,
)
from treecoll.attention.decode_native import native_status

NAN, INF = math.nan, math.inf
B, HQ, HKV, D, N = 2, 4, 2, 8, 150
LENGTHS = [N, 120]
T = 100  # the poisoned token of sequence 0 (in the second 64-token tile / Triton block)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-5, torch.float16: 1e-5}  # inputs exact in fp32: fp32 rounding only


def _base(dtype):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, HQ, D, generator=g)
    q[0, 2:4, 0] = q[0, 2:4, 0].abs() + 0.5  # heads 2, 3 (KV head 1) have q[..., 0] > 0
    k = torch.randn(B, N, HKV, D, generator=g)
    v = torch.randn(B, N, HKV, D, generator=g)
    k[1, 130, 0] = NAN  # past sequence 1's length: never read
    v[1, 140, 1] = INF
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _poison(name, q, k, v):
    """Apply case ``name`` in place (a bad value of sequence 0, token T, KV head 1 unless said)."""
    if name == "nan_k":
        k[0, T, 1, 3] = NAN
    elif name == "k_pinf_score":
        k[0, T, 1, 0] = INF  # q[..., 0] > 0: score +inf
    elif name == "k_ninf_score":
        k[0, T, 1, 0] = -INF  # score -inf: the token's weight is exactly 0
    elif name == "k_inf_times_zero_q":
        q[0, 2, 0] = 0.0  # head 2: 0 * inf = NaN; head 3: score -inf
        k[0, T, 1, 0] = -INF
    elif name == "k_inf_both_signs":
        k[0, T, 1, :2] = torch.tensor([INF, -INF])  # inf - inf or a +inf score per head
    elif name == "nan_v":
        v[0, T, 1, 5] = NAN
    elif name == "pinf_v":
        v[0, T, 1, 5] = INF
    elif name == "ninf_v":
        v[0, T, 1, 5] = -INF
    elif name == "nan_q":
        q[0, 1, 4] = NAN
    elif name == "pinf_q":
        q[0, 1, 4] = INF
    elif name == "all_scores_ninf":
        k[0, :, 1, 0] = -INF  # heads 2, 3: every score -inf, as SDPA: out 0
    elif name == "ninf_score_nan_v":
        k[0, T, 1, 0] = -INF
        v[0, T, 1, 5] = NAN  # weight 0 times NaN is NaN
    elif name != "clean":
        raise KeyError(name)


CASES = [
    "clean",
    "nan_k",
    "k_pinf_score",
    "k_ninf_score",
    "k_inf_times_zero_q",
    "k_inf_both_signs",
    "nan_v",
    "pinf_v",
    "ninf_v",
    "nan_q",
    "pinf_q",
    "all_scores_ninf",
    "ninf_score_nan_v",
]
#: (batch, head) rows whose out and lse are NaN in each case (independently derived from the
#: arithmetic in the comments of _poison; test_sdpa_agrees checks SDPA says the same for out)
NAN_ROWS = {
    "nan_k": [(0, 2), (0, 3)],
    "k_pinf_score": [(0, 2), (0, 3)],
    "k_inf_times_zero_q": [(0, 2)],
    "k_inf_both_signs": [(0, 2), (0, 3)],
    "nan_q": [(0, 1)],
    "pinf_q": [(0, 1)],
}


def case_inputs(name, dtype=torch.float32):
    q, k, v = _base(torch.float32)
    _poison(name, q, k, v)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def sdpa_math(q, k, v, lengths):
    """torch SDPA (math backend), per sequence over its valid keys: out float64 [B, HQ, D]."""
    outs = []
    with sdpa_kernel([SDPBackend.MATH]):
        for b, n in enumerate(lengths):
            qb = q[b].double()[:, None, :]  # [HQ, 1, D]
            kb = k[b, :n].double().transpose(0, 1).repeat_interleave(HQ // HKV, 0)  # [HQ, n, D]
            vb = v[b, :n].double().transpose(0, 1).repeat_interleave(HQ // HKV, 0)
            outs.append(F.scaled_dot_product_attention(qb, kb, vb)[:, 0])
    return torch.stack(outs)


@pytest.mark.parametrize("case", CASES)
def test_sdpa_agrees_with_the_table_and_the_reference(case, check_policy):
    """The expected NaN rows are what SDPA gives; the float64 reference gives SDPA's out."""
    q, k, v = case_inputs(case)
    want = sdpa_math(q, k, v, LENGTHS)
    nan_rows = torch.isnan(want).all(-1)
    assert sorted(map(tuple, nan_rows.nonzero().tolist())) == NAN_ROWS.get(case, [])
    out, lse = reference(q, k, v, kv_len=LENGTHS)
    check_policy(out, want, 1e-12, "reference out")
    assert torch.equal(torch.isnan(lse), nan_rows)
    if case == "k_ninf_score":  # weight 0 == the token left out, exactly what SDPA computes
        keep = [i for i in range(N) if i != T]
        without = sdpa_math(q, k[:, keep], v[:, keep], [N - 1, LENGTHS[1] - 1])
        check_policy(out[0, 2:], without[0, 2:], 1e-12, "weight 0")  # heads of KV head 1
    if case == "all_scores_ninf":
        assert (out[0, 2:] == 0).all() and torch.isneginf(lse[0, 2:]).all()


def _backends():
    """torch, native at every instruction-set tier this CPU runs, triton (interpreted on CPU)."""
    from treecoll.attention.decode_native import NATIVE_ISAS

    status = native_status()
    tiers = NATIVE_ISAS[: NATIVE_ISAS.index(status["isa"]) + 1] if status["available"] else ("portable",)
    out = ["torch", *[f"native-{isa}" for isa in tiers]]
    if status["available"] and status["fast_bf16"]:
        out.append("native-fast_bf16")  # vdpbf16ps scores and values (bf16 caches; fp32 ignores it)
    try:
        import triton  # noqa: F401

        out.append("triton")
    except ImportError:
        pass
    return out


def _decode(backend, q, k, v, lengths, splits):
    if backend.startswith("native"):
        if not native_status()["available"]:
            pytest.skip(native_status()["reason"])
        from treecoll.attention.decode_native import decode_native
        from treecoll.attention.validate import check_decode_inputs

        lens, scale = check_decode_inputs(q, k, v, lengths, None, "test")
        if backend == "native-fast_bf16":
            return decode_native(q, k, v, lens, scale, num_splits=splits, fast_bf16=True, threads=2)
        return decode_native(q, k, v, lens, scale, num_splits=splits, isa=backend.split("-", 1)[1], threads=2)
    return decode_partial(q, k, v, kv_len=lengths, backend=backend, num_splits=splits)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_backend_follows_sdpa(backend, dtype, case, check_policy):
    q, k, v = case_inputs(case, dtype)
    want = sdpa_math(q, k, v, LENGTHS)
    _, ref_lse = reference(q, k, v, kv_len=LENGTHS)
    # fast_bf16 rounds the query and the weights to bf16: the contract's bf16 tolerance (its
    # precision is held to a bound derived from the rounding in test_decode_native)
    tol = 1e-2 if backend == "native-fast_bf16" and dtype == torch.bfloat16 else TOL[dtype]
    for splits in (1, 3):
        out, lse = _decode(backend, q, k, v, LENGTHS, splits)
        check_policy(out, want, tol, f"{backend} out, {splits} splits")
        check_policy(lse, ref_lse, tol, f"{backend} lse, {splits} splits")


def _merges():
    def pairwise(states):
        acc = states[0]
        for s in states[1:]:
            acc = merge(acc, s)
        return acc

    def packed(states):
        b, h, d = states[0][0].shape
        op = MergeOp(batch=b, heads=h, head_dim=d)
        buf = op.identity()
        for s in states:
            buf = op(buf, pack_state(*s))
        return unpack_state(buf, b, h, d)

    def stacked(backend):
        return lambda states: merge_states([s[0] for s in states], [s[1] for s in states], 0, backend=backend)

    merges = {"merge": pairwise, "merge_op_packed": packed, "merge_states_torch": stacked("torch")}
    if "triton" in _backends():
        merges["merge_states_triton"] = stacked("triton")
    return merges


@pytest.mark.parametrize("how", list(_merges()))
@pytest.mark.parametrize("case", CASES)
def test_merged_parts_equal_the_whole(how, case, check_policy):
    """States of [0, 40), [40, T+1) and [T+1, N) (one of them holds the bad token) merged
    by every merge give the whole's state: NaN where SDPA gives NaN, nothing left out."""
    q, k, v = case_inputs(case)
    want = sdpa_math(q, k, v, LENGTHS)
    _, ref_lse = reference(q, k, v, kv_len=LENGTHS)
    bounds = [0, 40, T + 1, N]
    parts = []
    for s, e in itertools.pairwise(bounds):
        local = [max(0, min(n, e) - s) for n in LENGTHS]
        parts.append(decode_partial(q, k[:, s:e], v[:, s:e], kv_len=local, backend="torch"))
    out, lse = _merges()[how](parts)
    check_policy(out, want, 1e-5, f"{how} out")
    check_policy(lse, ref_lse, 1e-5, f"{how} lse")


# ---- the merge's own table: lse and out of the inputs -------------------------------------------

#: (lse of each of three states per row, expected: "nan" | "empty" | "finite")
MERGE_ROWS = [
    ((0.5, -1.0, 2.0), "finite"),
    ((0.5, NAN, 2.0), "nan"),
    ((0.5, INF, 2.0), "nan"),
    ((-INF, INF, -INF), "nan"),
    ((-INF, NAN, -INF), "nan"),
    ((INF, INF, INF), "nan"),
    ((-INF, 1.0, -INF), "finite"),  # identities around one state: that state, bit-exact
    ((-INF, -INF, -INF), "empty"),
]


def _merge_inputs():
    g = torch.Generator().manual_seed(5)
    lses = torch.tensor([row for row, _ in MERGE_ROWS]).T.reshape(3, 1, len(MERGE_ROWS))  # [S, B=1, H]
    outs = torch.randn(3, 1, len(MERGE_ROWS), 4, generator=g)
    outs = outs.masked_fill(torch.isneginf(lses).unsqueeze(-1), 0.0)  # empty states are (0, -inf)
    return outs, lses


@pytest.mark.parametrize("how", list(_merges()))
def test_merge_table(how):
    outs, lses = _merge_inputs()
    out, lse = _merges()[how]([(outs[i], lses[i]) for i in range(3)])
    for h, (row, kind) in enumerate(MERGE_ROWS):
        o, s = out[0, h], lse[0, h]
        if kind == "nan":
            assert torch.isnan(o).all() and torch.isnan(s), (how, row, o, s)
        elif kind == "empty":
            assert (o == 0).all() and torch.isneginf(s), (how, row, o, s)
        else:
            w = torch.tensor(row, dtype=torch.float64).softmax(0)
            want = (outs[:, 0, h].double() * w[:, None]).sum(0)
            torch.testing.assert_close(o.double(), want, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(
                s.double(), torch.tensor(row, dtype=torch.float64).logsumexp(0), rtol=1e-6, atol=1e-6
            )
    single = next(h for h, (row, _) in enumerate(MERGE_ROWS) if row == (-INF, 1.0, -INF))
    assert torch.equal(out[0, single], outs[1, 0, single]) and lse[0, single] == 1.0  # exact identity


@pytest.mark.parametrize("how", list(_merges()))
def test_bad_out_reaches_its_column(how):
    """NaN / inf in one state's out reach the same column of the merge, whatever that
    state's weight (0 * NaN is NaN), also from a state whose lse is -inf."""
    outs, lses = _merge_inputs()
    rows = [0, 6]  # a finite row, and a row with two empty states
    outs[0, 0, rows[0], 1] = NAN  # weight > 0
    outs[2, 0, rows[0], 2] = INF
    outs[0, 0, rows[1], 3] = NAN  # an empty state (lse -inf) that is not (0, -inf)
    out, lse = _merges()[how]([(outs[i], lses[i]) for i in range(3)])
    assert torch.isnan(out[0, rows[0], 1]) and torch.isposinf(out[0, rows[0], 2])
    assert torch.isfinite(out[0, rows[0], [0, 3]]).all() and torch.isfinite(lse[0, rows[0]])
    assert torch.isnan(out[0, rows[1], 3]) and torch.isfinite(out[0, rows[1], :3]).all()
    assert lse[0, rows[1]] == 1.0
