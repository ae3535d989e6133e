"""Shared setup for the attention tests.

The Triton kernels run on CPU tensors under the Triton interpreter (the
repository's conftest.py sets TRITON_INTERPRET before any test imports them).
"""

import pytest
import torch

#: Tolerances of the numerics contract (treecoll.attention): relative error against the float64 reference.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| / max |ref| (float64), 0 when both are all zero."""
    err = (x.double() - ref.double()).abs().max().item() if x.numel() else 0.0
    scale = ref.double().abs().max().item() if ref.numel() else 0.0
    return err / scale if scale > 0 else err


def _check_state(out, lse, ref_out, ref_lse, tol):
    """Assert a decode state matches the float64 reference within ``tol``.

    Empty rows must be exactly (0, -inf); every element must have been written
    (no NaN survives from a poisoned buffer).
    """
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), empty)
    assert (lse[empty] < 0).all()
    assert (out[empty] == 0).all()
    assert _rel_err(out, ref_out) <= tol, _rel_err(out, ref_out)
    if (~empty).any():
        lse_err = (lse[~empty].double() - ref_lse[~empty]).abs().max().item()
        assert lse_err <= tol * max(1.0, ref_lse[~empty].abs().max().item()), lse_err


@pytest.fixture
def check_state():
    return _check_state


def _check_policy(x, ref, tol, what):
    """``x`` equals ``ref`` under the NaN/inf policy: NaN exactly where ``ref`` is
    NaN, the same infinities (with signs), finite values within ``tol`` (relative
    to the largest finite ``|ref|``)."""
    x, ref = x.double(), ref.double()
    assert torch.equal(torch.isnan(x), torch.isnan(ref)), (what, x, ref)
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(x), inf) and torch.equal(x[inf], ref[inf]), (what, x, ref)
    finite = torch.isfinite(ref)
    if finite.any():
        assert _rel_err(x[finite], ref[finite]) <= tol, (what, _rel_err(x[finite], ref[finite]))


@pytest.fixture
def check_policy():
    return _check_policy


@pytest.fixture
def rel_err():
    return _rel_err


def _make_inputs(batch, q_heads, kv_heads, head_dim, seq, dtype, *, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_heads, head_dim, generator=g).to(dtype)
    k = torch.randn(batch, seq, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(batch, seq, kv_heads, head_dim, generator=g).to(dtype)
    return q, k, v


@pytest.fixture
def make_inputs():
    return _make_inputs


def _poisoned(batch, q_heads, head_dim):
    return (
        torch.full((batch, q_heads, head_dim), float("nan")),
        torch.full((batch, q_heads), float("nan")),
    )


@pytest.fixture
def poisoned():
    return _poisoned
