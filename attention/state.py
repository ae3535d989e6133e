"""Attention states, the operator that merges them, and the NaN/inf policy.

An *attention state* is the pair ``(out, lse)`` computed by softmax attention of
one query against one set of keys ``I``:

* ``out``: float32 ``[..., head_dim]`` (usually ``[batch, heads, head_dim]``),
  already normalised: ``out = sum_i softmax(s)_i * v_i`` over ``i`` in ``I``;
* ``lse``: float32 ``[...]`` (usually ``[batch, heads]``), the **natural-log**
  log-sum-exp of the scaled scores ``s_i = scale * q . k_i`` over ``I``.

The merge ``a (+) b`` is the state of ``I_a u I_b`` (``I_a``, ``I_b`` disjoint)::

    lse = log(exp(lse_a) + exp(lse_b))
    out = (exp(lse_a) * out_a + exp(lse_b) * out_b) / exp(lse)

computed shifted by ``m = max(lse_a, lse_b)`` (the shift is ``0`` when
``m == -inf``, so no ``-inf - -inf`` arises).  Commutative (bit-exact) and
associative (within float32 rounding).

NaN/inf policy
--------------
Every decode backend (``torch``, ``native``, ``triton``), the float64
:func:`treecoll.attention.reference` and every merge (:func:`merge`,
:func:`merge_states`, :class:`MergeOp`, and so :func:`treecoll.attention.tree_decode`,
:func:`attention.tree_combine` and the baselines) follow ONE policy: IEEE
arithmetic of plain softmax attention, as torch's
``scaled_dot_product_attention`` computes it (its math path; torch 2.13)::

    s_i = scale * q . k_i                      (NaN if q or k_i holds NaN, or 0 * inf)
    m = max_i s_i;  shift = 0 if m == -inf else m
    p_i = exp(s_i - shift);  l = sum_i p_i
    out = sum_i p_i * v_i / l   (sum_i p_i * v_i when l == 0);  lse = shift + log(l)

What that gives for one (batch, query head), by where a bad value sits among
the valid keys (positions past ``kv_len`` are never read):

* NaN in ``q`` or in a key row: ``out`` and ``lse`` NaN (the whole row).
* ``+-inf`` in ``q`` or in a key row giving a score of ``+inf`` or NaN
  (``0 * inf``, ``inf - inf``): ``out`` and ``lse`` NaN.
* ``+-inf`` giving a score of ``-inf``: that token's weight is exactly 0 (a
  mask, as in SDPA); ``out`` stays finite if that token's ``v`` is finite.
* NaN in ``v`` at column ``d``: ``out[..., d]`` NaN, other columns and ``lse``
  as without the NaN (also for a token of weight 0: ``0 * NaN`` is NaN).
* ``+-inf`` in ``v`` at column ``d``: ``out[..., d]`` is ``+-inf`` (NaN where
  both signs meet, or for a token of weight 0); ``lse`` finite.
* No keys, or every score ``-inf``: ``(0, -inf)`` (``out`` is ``sum_i 0 * v_i``:
  NaN in a column where some ``v_i`` is NaN or inf).

A score of ``-inf`` is a weight of exactly ``0``: that token contributes
``0 * v``, as in SDPA, so the answer is finite only when its ``v`` is.  A NaN
or ``+inf`` anywhere in a key row therefore never gives a finite answer that
left that token out.  (torch's fused CPU flash kernel returns 0 instead of NaN
for a NaN query; the policy follows the math path.)

Merges apply the same arithmetic to states: a ``-inf`` lse is the identity
(weight exactly 0, never NaN from ``-inf`` alone: ``(0, -inf) (+) x == x``
bit-exact, and all-empty gives ``(0, -inf)``); a NaN or ``+inf`` lse in any
input makes that row's ``out`` and ``lse`` NaN; NaN or ``inf`` in an input's
``out`` reaches the same columns of the result (``0 * NaN`` is NaN, so this
holds for an input whose weight is 0, empty states included: an empty state
is ``(0, -inf)``, not ``(anything, -inf)``).  So merging the states of any
partition of the keys gives the state of the whole, NaN where the whole is NaN.

FlashAttention-2 returns ``+inf`` as the lse of rows without keys; such states
must be mapped to ``(0, -inf)`` before merging, else they read as NaN.

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
>>> bad = (torch.ones(1, 2, 4), torch.tensor([[0.0, float("nan")]]))
>>> merge(a, bad)[1].tolist()
[[0.6931471824645996, nan]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from treecoll.topo.errors import AttentionError

__all__ = [
    "MergeOp",
    "State",
    "empty_state",
    "merge",
    "merge_packed",
    "merge_states",
    "online_to_state",
    "pack_state",
    "unpack_state",
]

State = tuple[torch.Tensor, torch.Tensor]
_NEG_INF = float("-inf")
_MERGE_BACKENDS = ("auto", "torch", "triton")


def _check_pair(out: torch.Tensor, lse: torch.Tensor, name: str) -> None:
    if not isinstance(out, torch.Tensor) or not isinstance(lse, torch.Tensor):
        raise AttentionError(
            f"{name}: expected a state (out, lse) of two tensors, got ({type(out).__name__}, {type(lse).__name__})"
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


def empty_state(batch: int, heads: int, head_dim: int, *, device: torch.device | str | None = None) -> State:
    """The identity of :func:`merge`: ``out`` zeros float32 ``[batch, heads, head_dim]``,
    ``lse`` ``-inf`` float32 ``[batch, heads]``."""
    return (
        torch.zeros(batch, heads, head_dim, dtype=torch.float32, device=device),
        torch.full((batch, heads), _NEG_INF, dtype=torch.float32, device=device),
    )


def merge(a: State, b: State) -> State:
    """Merge two attention states: ``a (+) b``.

    ``a``, ``b``: tuples ``(out, lse)``, ``out`` ``[..., head_dim]`` and ``lse``
    ``[...]`` (same leading shape in both states), any float dtype, natural-log LSE.
    Returns ``(out, lse)`` in float32 with the same shapes.  ``(0, -inf)`` is the
    identity; all-empty gives ``(0, -inf)``; NaN and inf follow the module's
    NaN/inf policy (never NaN from ``-inf`` alone).
    """
    out_a, lse_a = _as_state(a, "merge: state a")
    out_b, lse_b = _as_state(b, "merge: state b")
    if out_a.shape != out_b.shape:
        raise AttentionError(
            f"merge: expected states of the same shape, got out {tuple(out_a.shape)} "
            f"for a and {tuple(out_b.shape)} for b"
        )
    lse_a = lse_a.float()
    lse_b = lse_b.float()
    shift = _shift(torch.maximum(lse_a, lse_b))  # torch.maximum propagates NaN
    w_a = torch.exp(lse_a - shift)
    w_b = torch.exp(lse_b - shift)
    return _normalise(out_a.float() * w_a.unsqueeze(-1) + out_b.float() * w_b.unsqueeze(-1), shift, w_a + w_b)


def _shift(m: torch.Tensor) -> torch.Tensor:
    """The max-shift of the policy: ``m``, or ``0`` where ``m == -inf`` (NaN and +inf kept)."""
    return torch.where(m == _NEG_INF, torch.zeros_like(m), m)


def _normalise(num: torch.Tensor, shift: torch.Tensor, den: torch.Tensor) -> State:
    """``(num / den, shift + log(den))``, ``num`` kept where ``den == 0`` (all weights 0):
    ``(0, -inf)`` for empty rows, NaN wherever ``num`` or ``den`` carries it."""
    out = num / torch.where(den == 0, torch.ones_like(den), den).unsqueeze(-1)
    return out, shift + torch.log(den)


def online_to_state(acc: torch.Tensor, m: torch.Tensor, l_sum: torch.Tensor) -> State:
    """The state of a key range from online-softmax accumulators (the kernels' epilogue).

    ``acc`` float32 ``[..., head_dim]``: ``sum_i exp(s_i - shift) * v_i``; ``m`` and
    ``l_sum`` float32 ``[...]``: the running max of the scores and
    ``sum_i exp(s_i - shift)``, where ``shift`` is ``m``, or ``0`` where ``m == -inf``.
    Returns float32 ``(out, lse)`` by the module's NaN/inf policy (``(0, -inf)``
    for an empty range).
    """
    return _normalise(acc, _shift(m), l_sum)


def merge_states(
    outs: torch.Tensor | Sequence[torch.Tensor],
    lses: torch.Tensor | Sequence[torch.Tensor],
    dim: int = 0,
    *,
    backend: str = "auto",
) -> State:
    """Merge many attention states along one dimension.

    ``outs``: float ``[..., S, ..., head_dim]`` with the S states at ``dim`` (or a
    sequence of S tensors ``[..., head_dim]``, stacked at ``dim``); ``lses``: the
    matching ``[..., S, ...]`` (natural log).  ``dim`` indexes the LSE dims
    (negative values count from the end of ``lses``).  Returns ``(out, lse)``
    float32 without the state dim.  ``S == 0`` gives ``(0, -inf)``; NaN and inf
    follow the module's NaN/inf policy.
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
    if backend == "triton" or (backend == "auto" and outs.is_cuda and _triton_available()):
        from treecoll.attention.decode_triton import merge_states_triton

        return merge_states_triton(outs, lses, dim)
    lses = lses.float()
    m = lses.amax(dim, keepdim=True) if lses.shape[dim] else torch.full_like(lses.sum(dim, keepdim=True), _NEG_INF)
    shift = _shift(m)  # amax propagates NaN
    w = torch.exp(lses - shift)
    return _normalise((outs.float() * w.unsqueeze(-1)).sum(dim), shift.squeeze(dim), w.sum(dim))


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
        got = f"{buf.dtype} tensor of shape {tuple(buf.shape)}" if isinstance(buf, torch.Tensor) else type(buf).__name__
        raise AttentionError(
            f"unpack_state: expected a 1-D float32 buffer of {expected} elements "
            f"(batch={batch}, heads={heads}, head_dim={head_dim}), got {got}"
        )
    return buf[:n_out].view(batch, heads, head_dim), buf[n_out:].view(batch, heads)


def merge_packed(a: torch.Tensor, b: torch.Tensor, *, batch: int, heads: int, head_dim: int) -> torch.Tensor:
    """:func:`merge` on two packed buffers (see :func:`pack_state`); returns a new
    packed float32 buffer."""
    sa = unpack_state(a, batch, heads, head_dim)
    sb = unpack_state(b, batch, heads, head_dim)
    return pack_state(*merge(sa, sb))


@dataclass(frozen=True)
class MergeOp:
    """The attention-state merge as a plain associative operator ``op(a, b)``.

    Works on packed float32 buffers ``[batch*heads*(head_dim+1)]`` (returns a
    packed buffer) and on ``(out, lse)`` tuples (returns a tuple).
    Commutative; identity :meth:`identity` (``out`` 0, ``lse`` -inf); NaN and
    inf follow the module's NaN/inf policy.

    >>> import torch
    >>> op = MergeOp(batch=1, heads=2, head_dim=3)
    >>> x = pack_state(torch.ones(1, 2, 3), torch.zeros(1, 2))
    >>> bool(torch.equal(op(x, op.identity()), x))
    True
    """

    batch: int
    heads: int
    head_dim: int
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

    def identity(self, device: torch.device | str | None = None) -> torch.Tensor:
        """The packed empty state: zeros then ``-inf``."""
        return pack_state(*empty_state(self.batch, self.heads, self.head_dim, device=device))

    def __call__(self, a: torch.Tensor | State, b: torch.Tensor | State) -> torch.Tensor | State:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return merge_packed(a, b, batch=self.batch, heads=self.heads, head_dim=self.head_dim)
        return merge(a, b)
