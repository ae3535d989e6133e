"""Reduction operators: a registry (sum, max, min, prod) plus any associative callable.

An :class:`Op` combines two values of the same structure, ``a op b``, where
a value is a tensor or a tuple of tensors (the structure of the collective's
input). Associativity is required, commutativity is *declared*:

* built-ins ``sum``, ``max``, ``min``, ``prod`` are element-wise and commutative
  (identities 0, -inf, +inf, 1); they run in place on flat buffers, so a
  message may be split anywhere (``elementwise=True``);
* a user callable ``fn(a, b) -> value`` is taken as non-commutative unless
  declared (``commutative=True`` to :func:`resolve_op`, or an attribute
  ``fn.commutative = True`` on the callable, which is how an operator such as
  the attention-state merge can carry its own declaration). It receives chunk
  views of every part of the value and returns a new value (or writes into
  and returns ``a``).

Chunking (splitting a message so it pipelines through a tree) never cuts
inside an element the operator needs whole: element-wise operators split a
flat buffer anywhere; other operators see every part split along its first
dimension (rows) only, consistently across the parts of a tuple (all parts
must share that first dimension, else the message is not split); an operator
declaring ``chunkable=False`` (argument or attribute) is never split.

>>> import torch
>>> resolve_op("sum").commutative, resolve_op("max").elementwise
(True, True)
>>> mm = resolve_op(lambda a, b: a @ b)
>>> mm.commutative, mm.elementwise, mm.chunkable
(False, False, True)
>>> resolve_op("avg")  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
treecoll.topo.errors.CollectiveError: op 'avg': unknown; valid names are ['max', 'min', 'prod', 'sum'],
or pass a callable op(a, b)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from treecoll.topo.errors import CollectiveError

__all__ = ["Op", "OPS", "resolve_op", "register_op"]


def _lazy_torch():
    import torch

    return torch


@dataclass(frozen=True)
class Op:
    """A reduction operator.

    ``fn(a, b)`` returns ``a op b`` for values (tensor or tuple of tensors);
    ``inplace(a, b)``, when given, writes ``a op b`` into the flat tensor ``a``
    (built-ins). ``torch_name`` names the equivalent ``torch.distributed.ReduceOp``.
    """

    name: str
    fn: Callable[[Any, Any], Any]
    commutative: bool = False
    elementwise: bool = False
    chunkable: bool = True
    inplace: Callable[[Any, Any], Any] | None = field(default=None, compare=False)
    torch_name: str | None = None

    def __post_init__(self):
        if not callable(self.fn):
            raise CollectiveError(f"op {self.name!r}: fn expected a callable op(a, b), got {type(self.fn).__name__}")
        if self.elementwise and self.inplace is None:
            raise CollectiveError(f"op {self.name!r}: an element-wise op needs inplace(a, b)")

    def __call__(self, a: Any, b: Any) -> Any:
        return self.fn(a, b)

    def key(self) -> str:
        """What ranks compare before a collective: name and declared properties."""
        return f"{self.name}/c{int(self.commutative)}e{int(self.elementwise)}k{int(self.chunkable)}"


def _builtin(name: str, binary: str, torch_name: str) -> Op:
    def fn(a, b):
        torch = _lazy_torch()
        f = getattr(torch, binary)
        if isinstance(a, (tuple, list)):
            return tuple(f(x, y) for x, y in zip(a, b))
        return f(a, b)

    def inplace(a, b):
        torch = _lazy_torch()
        return getattr(torch, binary)(a, b, out=a)

    fn.__name__ = name
    return Op(name, fn, commutative=True, elementwise=True, chunkable=True, inplace=inplace, torch_name=torch_name)


OPS: dict[str, Op] = {
    "sum": _builtin("sum", "add", "SUM"),
    "prod": _builtin("prod", "mul", "PRODUCT"),
    "max": _builtin("max", "maximum", "MAX"),
    "min": _builtin("min", "minimum", "MIN"),
}


def register_op(name: str, fn: Callable, *, commutative: bool = False, chunkable: bool = True) -> Op:
    """Add a named operator to :data:`OPS` (callable ``fn(a, b)``, associative)."""
    if name in OPS:
        raise CollectiveError(f"op {name!r}: already registered; pick another name")
    op = Op(name, fn, commutative=bool(commutative), chunkable=bool(chunkable))
    OPS[name] = op
    return op


def resolve_op(op: str | Op | Callable, *, commutative: bool | None = None, chunkable: bool | None = None) -> Op:
    """An :class:`Op` from a registry name, an :class:`Op`, or a callable ``op(a, b)``.

    For callables, ``commutative``/``chunkable`` default to the callable's own
    attributes of those names, else False/True.
    """
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        try:
            return OPS[op]
        except KeyError:
            raise CollectiveError(
                f"op {op!r}: unknown; valid names are {sorted(OPS)}, or pass a callable op(a, b)"
            ) from None
    if callable(op):
        comm = getattr(op, "commutative", False) if commutative is None else commutative
        chunk = getattr(op, "chunkable", True) if chunkable is None else chunkable
        name = getattr(op, "__qualname__", None) or getattr(op, "__name__", None) or type(op).__name__
        mod = getattr(op, "__module__", "") or ""
        return Op(f"{mod}.{name}" if mod else name, op, commutative=bool(comm), chunkable=bool(chunk))
    raise CollectiveError(
        f"op: expected a name in {sorted(OPS)}, an Op or a callable op(a, b), got {type(op).__name__}"
    )
