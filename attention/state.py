"""Attention states and the operator that merges them.

An *attention state* is the pair ``(out, lse)`` computed by softmax attention of
one query against one set of keys ``I``:

* ``out``: float32 ``[..., head_dim]`` (usually ``[batch, heads, head_dim]``),
  already normalised: ``out = sum_i softmax(s)_i * v_i`` over ``i`` in ``I``;
* ``lse``: float32 ``[...]`` (usually ``[batch, heads]``), the **natural-log**
  log-sum-exp of the scaled scores ``s_i = scale * q . k_i`` over ``I``.

The merge ``a (+) b`` is the state of ``I_a u I_b`` (``I_a``, ``I_b`` disjoint)::

    lse = log(exp(lse_a) + exp(lse_b))
    out = (exp(lse_a) * out_a + exp(lse_b) * out_b) / exp(lse)

It is computed shifted by ``m = max(lse_a, lse_b)`` with two guards, so that
the empty state ``(0, -inf)`` is an exact identity and nothing produces NaN
(the numerics contract is in the :mod:`attention` package docstring):

* the shift is ``0`` when ``m == -inf`` (no ``-inf - -inf``);
* a state whose weight ``exp(lse - m)`` is ``0`` contributes exactly ``0``
  (whatever its ``out`` holds), and an all-empty merge gives ``(0, -inf)``.

Commutative (bit-exact) and associative (within float32 rounding).
``+inf``/NaN LSEs raise; FlashAttention-2's ``+inf`` for rows without keys must
be mapped to ``-inf`` by the caller.

For the wire, :func:`pack_state` lays a state out as ONE contiguous float32
buffer (``out`` flattened, then ``lse`` flattened); :class:`MergeOp` is the
associative operator on such buffers (and on ``(out, lse)`` tuples) that the
tree reduction carries.

>>> import torch
>>> a = (torch.ones(1, 2, 4), torch.zeros(1, 2))
>>> empty = (torch.zeros(1, 2, 4), torch.full((1, 2), float("-inf")))
>>> out, lse = merge(a, empty)
>>> bool(torch.equal(out, a[0]) and torch.equal(lse, a[1]))
True
>>> merge(empty, empty)[1].tolist()
[[-inf, -inf]]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Tuple

import torch

from topo.errors import AttentionError

__all__ = [
    "LOG2E",
    "LN2",
    "State",
    "check_lse",
    "empty_state",
    "merge",
    "merge_states",
    "pack_state",
    "unpack_state",
    "merge_packed",
    "MergeOp",
    "to_natural_log",
    "to_base2",
]

#: log2(e): multiply a natural-log quantity by this to get base 2.
LOG2E = 1.4426950408889634
#: ln(2): multiply a base-2 quantity by this to get natural log.
LN2 = 0.6931471805599453

State = Tuple[torch.Tensor, torch.Tensor]
_NEG_INF = float("-inf")
_MERGE_BACKENDS = ("auto", "torch", "triton")


def check_lse(lse: torch.Tensor, name: str) -> None:
    """Raise :class:`AttentionError` if ``lse`` holds ``+inf`` or NaN.

    ``lse``: any shape, any floating dtype, natural log; ``-inf`` (empty) is valid.
    ``name`` names the input in the message.
    """
    bad = torch.isnan(lse) | (lse == math.inf)
    if bool(bad.any()):
        raise AttentionError(
            f"{name}: expected finite log-sum-exp values or -inf (empty state), "
            f"got {int(bad.sum())} entries that are +inf or NaN; map a library's "
            f"+inf for rows without keys (FlashAttention-2) to -inf before merging"
        )


def _check_pair(out: torch.Tensor, lse: torch.Tensor, name: str) -> None:
    if not isinstance(out, torch.Tensor) or not isinstance(lse, torch.Tensor):
        raise AttentionError(
            f"{name}: expected a state (out, lse) of two tensors, got "
            f"({type(out).__name__}, {type(lse).__name__})"
        )
    if out.shape[:-1] != lse.shape or out.dim() != lse.dim() + 1:
        raise AttentionError(
            f"{name}: expected out [..., head_dim] and lse [...] with the same leading "
            f"shape, got out {tuple(out.shape)} and lse {tuple(lse.shape)}"
        )


def _as_state(x, name: str) -> State:
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise AttentionError(
            f"{name}: expected a state tuple (out, lse), got {type(x).__name__}"
            + (f" of length {len(x)}" if isinstance(x, (tuple, list)) else "")
        )
    out, lse = x
    _check_pair(out, lse, name)
    return out, lse


def empty_state(batch: int, heads: int, head_dim: int, *, device=None) -> State:
    """The identity of :func:`merge`: ``out`` zeros float32 ``[batch, heads, head_dim]``,
    ``lse`` ``-inf`` float32 ``[batch, heads]``."""
    return (
        torch.zeros(batch, heads, head_dim, dtype=torch.float32, device=device),
        torch.full((batch, heads), _NEG_INF, dtype=torch.float32, device=device),
    )


def merge(a: State, b: State, *, check: bool = True) -> State:
    """Merge two attention states: ``a (+) b``.

    ``a``, ``b``: tuples ``(out, lse)``, ``out`` ``[..., head_dim]`` and ``lse``
    ``[...]`` (same leading shape in both states), any float dtype, natural-log LSE.
    Returns ``(out, lse)`` in float32 with the same shapes.  ``(0, -inf)`` is the
    identity; all-empty gives ``(0, -inf)``; never NaN.  ``check=False`` skips the
    +inf/NaN scan of the LSEs (one device sync each on CUDA).
    """
    out_a, lse_a = _as_state(a, "merge: state a")
    out_b, lse_b = _as_state(b, "merge: state b")
    if out_a.shape != out_b.shape:
        raise AttentionError(
            f"merge: expected states of the same shape, got out {tuple(out_a.shape)} "
            f"for a and {tuple(out_b.shape)} for b"
        )
    if check:
        check_lse(lse_a, "merge: lse of state a")
        check_lse(lse_b, "merge: lse of state b")
    lse_a = lse_a.float()
    lse_b = lse_b.float()
    m = torch.maximum(lse_a, lse_b)
    shift = torch.where(m == _NEG_INF, torch.zeros_like(m), m)
    w_a = torch.exp(lse_a - shift)
    w_b = torch.exp(lse_b - shift)
    den = w_a + w_b
    num = _weighted(out_a, w_a) + _weighted(out_b, w_b)
    nonempty = den > 0
    out = num / torch.where(nonempty, den, torch.ones_like(den)).unsqueeze(-1)
    lse = torch.where(nonempty, shift + torch.log(den), torch.full_like(den, _NEG_INF))
    return out, lse


def _weighted(out: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``out * w`` in float32, exactly 0 where the weight is 0 (even if out is NaN)."""
    w = w.unsqueeze(-1)
    return torch.where(w > 0, out.float() * w, torch.zeros((), dtype=torch.float32, device=out.device))


def merge_states(outs, lses, dim: int = 0, *, check: bool = True, backend: str = "auto") -> State:
    """Merge many attention states along one dimension.

    ``outs``: float ``[..., S, ..., head_dim]`` with the S states at ``dim`` (or a
    sequence of S tensors ``[..., head_dim]``, stacked at ``dim``); ``lses``: the
    matching ``[..., S, ...]`` (natural log).  ``dim`` indexes the LSE dims
    (negative values count from the end of ``lses``).  Returns ``(out, lse)``
    float32 without the state dim.  ``S == 0`` gives ``(0, -inf)``.
    ``backend``: ``'auto'`` (Triton kernel for CUDA tensors when triton is
    installed, torch otherwise), ``'torch'`` or ``'triton'``.
    """
    if isinstance(outs, (list, tuple)) or isinstance(lses, (list, tuple)):
        if not isinstance(outs, (list, tuple)) or not isinstance(lses, (list, tuple)) or len(outs) != len(lses):
            raise AttentionError(
                "merge_states: expected outs and lses as two tensors or two sequences of "
                f"the same length, got {type(outs).__name__} and {type(lses).__name__}"
            )
        if not outs:
            raise AttentionError(
                "merge_states: expected at least one state in the sequences, got 0; "
                "pass stacked tensors with a size-0 state dim to get the empty state"
            )
        d = dim if dim >= 0 else dim + lses[0].dim() + 1
        outs, lses = torch.stack(list(outs), d), torch.stack(list(lses), d)
    _check_pair(outs, lses, "merge_states: (outs, lses)")
    if not -lses.dim() <= dim < lses.dim():
        raise AttentionError(
            f"merge_states: expected dim in [{-lses.dim()}, {lses.dim() - 1}] for lses of "
            f"shape {tuple(lses.shape)}, got {dim}"
        )
    dim = dim % lses.dim()
    if backend not in _MERGE_BACKENDS:
        raise AttentionError(f"merge_states: unknown backend {backend!r}; valid: {list(_MERGE_BACKENDS)}")
    if check:
        check_lse(lses, "merge_states: lses")
    if backend == "triton" or (backend == "auto" and outs.is_cuda and _triton_available()):
        from attention.decode_triton import merge_states_triton

        return merge_states_triton(outs, lses, dim)
    lses = lses.float()
    m = lses.amax(dim, keepdim=True) if lses.shape[dim] else torch.full_like(lses.sum(dim, keepdim=True), _NEG_INF)
    shift = torch.where(m == _NEG_INF, torch.zeros_like(m), m)
    w = torch.exp(lses - shift)
    den = w.sum(dim)
    num = _weighted(outs, w).sum(dim)
    nonempty = den > 0
    out = num / torch.where(nonempty, den, torch.ones_like(den)).unsqueeze(-1)
    lse = torch.where(nonempty, shift.squeeze(dim) + torch.log(den), torch.full_like(den, _NEG_INF))
    return out, lse


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def pack_state(out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """One contiguous float32 1-D buffer: ``out`` flattened, then ``lse`` flattened.

    ``out`` ``[batch, heads, head_dim]``, ``lse`` ``[batch, heads]`` (natural log);
    the buffer has ``batch*heads*(head_dim + 1)`` elements.
    """
    _check_pair(out, lse, "pack_state")
    return torch.cat([out.reshape(-1).float(), lse.reshape(-1).float()])


def unpack_state(buf: torch.Tensor, batch: int, heads: int, head_dim: int) -> State:
    """Views ``(out [batch, heads, head_dim], lse [batch, heads])`` into a packed
    float32 buffer (no copy; writes to the views write the buffer)."""
    n_out = batch * heads * head_dim
    expected = n_out + batch * heads
    if not isinstance(buf, torch.Tensor) or buf.dim() != 1 or buf.numel() != expected or buf.dtype != torch.float32:
        got = (
            f"{buf.dtype} tensor of shape {tuple(buf.shape)}" if isinstance(buf, torch.Tensor) else type(buf).__name__
        )
        raise AttentionError(
            f"unpack_state: expected a 1-D float32 buffer of {expected} elements "
            f"(batch={batch}, heads={heads}, head_dim={head_dim}), got {got}"
        )
    return buf[:n_out].view(batch, heads, head_dim), buf[n_out:].view(batch, heads)


def merge_packed(
    a: torch.Tensor, b: torch.Tensor, *, batch: int, heads: int, head_dim: int, check: bool = True
) -> torch.Tensor:
    """:func:`merge` on two packed buffers (see :func:`pack_state`); returns a new
    packed float32 buffer."""
    sa = unpack_state(a, batch, heads, head_dim)
    sb = unpack_state(b, batch, heads, head_dim)
    return pack_state(*merge(sa, sb, check=check))


@dataclass(frozen=True)
class MergeOp:
    """The attention-state merge as a plain associative operator ``op(a, b)``.

    Works on packed float32 buffers ``[batch*heads*(head_dim+1)]`` (returns a
    packed buffer) and on ``(out, lse)`` tuples (returns a tuple).
    Commutative; identity :meth:`identity` (``out`` 0, ``lse`` -inf).

    >>> import torch
    >>> op = MergeOp(batch=1, heads=2, head_dim=3)
    >>> x = pack_state(torch.ones(1, 2, 3), torch.zeros(1, 2))
    >>> bool(torch.equal(op(x, op.identity()), x))
    True
    """

    batch: int
    heads: int
    head_dim: int
    check: bool = True
    name = "attention_merge"
    commutative = True

    def __post_init__(self):
        for field in ("batch", "heads", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AttentionError(f"MergeOp.{field}: expected a positive int, got {value!r}")

    @property
    def numel(self) -> int:
        """Elements of one packed state."""
        return self.batch * self.heads * (self.head_dim + 1)

    def identity(self, device=None) -> torch.Tensor:
        """The packed empty state: zeros then ``-inf``."""
        return pack_state(*empty_state(self.batch, self.heads, self.head_dim, device=device))

    def __call__(self, a, b):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return merge_packed(
                a, b, batch=self.batch, heads=self.heads, head_dim=self.head_dim, check=self.check
            )
        return merge(a, b, check=self.check)


def to_natural_log(lse_base2: torch.Tensor) -> torch.Tensor:
    """Convert a base-2 LSE (FlashInfer, Triton tutorial) to natural log (float32);
    ``-inf`` stays ``-inf``."""
    return lse_base2.float() * LN2


def to_base2(lse: torch.Tensor) -> torch.Tensor:
    """Convert a natural-log LSE to base 2 (float32); ``-inf`` stays ``-inf``."""
    return lse.float() * LOG2E

