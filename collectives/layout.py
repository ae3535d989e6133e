"""How a collective's value (a tensor or a tuple of tensors) becomes one buffer split into chunks.

Two layouts, chosen from the operator (see :mod:`treecoll.collectives.ops`):

``flat``  element-wise operator (sum, max, min, prod) and every part of one
          dtype: the buffer is the 1-D concatenation of the parts (the tensor
          itself, no copy, for one contiguous tensor); chunks are element
          ranges, split anywhere.
``rows``  any other operator: every part is split along its first dimension
          (rows) consistently, so the operator always sees whole rows of every
          part. One part: the buffer is the tensor itself (no copy) and a chunk is
          a contiguous range of rows. Several parts: the buffer is a tuple of
          contiguous ``[rows, width]`` tensors (the parts themselves in place,
          else one copy each), and a chunk moves as one message per part (no
          packing copies).
``packed`` rows of several parts totalling at most :data:`PACK_BYTES`: one byte
          buffer packed chunk by chunk (a chunk holds its rows of part 0, then
          part 1, ..., each segment 16-byte aligned), so a chunk is one message;
          packing costs a copy in and out, cheaper than a message per part for
          small values. Parts whose first dimensions differ, 0-d parts, and
          operators declared ``chunkable=False`` give one unsplittable row.

Chunk ``c`` covers the fraction ``shares[c]`` of the rows (or elements),
rounded; a chunk may be empty (it is then neither sent nor reduced, the same
way on every rank since layouts agree).

>>> import torch
>>> from treecoll.collectives.ops import resolve_op
>>> lay = Layout.of(torch.zeros(10), resolve_op("sum"), (0.5, 0.5))
>>> lay.mode, lay.bounds
('flat', (0, 5, 10))
>>> lay = Layout.of((torch.zeros(4, 3), torch.zeros(4)), resolve_op(lambda a, b: a), (0.25, 0.75))
>>> lay.mode, lay.bounds, lay.max_chunks
('packed', (0, 1, 4), 4)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from treecoll.topo.errors import CollectiveError

from .ops import Op

if TYPE_CHECKING:
    import torch

    #: a collective's value, and a layout's buffer or chunk: one tensor or a tuple of tensors
    Tensors = torch.Tensor | tuple[torch.Tensor, ...]

__all__ = ["Layout", "PACK_BYTES", "ALIGN"]

#: tuples up to this many bytes are packed into one byte buffer, chunk by chunk, so a chunk is
#: one message (a copy in and out costs less than a message per part for small values)
PACK_BYTES = 64 << 10
#: byte alignment of every part segment inside a packed buffer
ALIGN = 16


def _torch():
    import torch

    return torch


def _split(total: int, shares: Sequence[float]) -> tuple[int, ...]:
    out, acc = [0], 0.0
    for s in shares[:-1]:
        acc += s
        out.append(min(total, max(out[-1], int(round(acc * total)))))
    out.append(total)
    return tuple(out)


@dataclass(frozen=True)
class Layout:
    """Shapes, dtypes and chunk bounds of one collective's value (identical on every rank).

    ``bounds[c]..bounds[c+1]`` is chunk c in elements (flat) or rows (rows).
    """

    mode: str
    is_tuple: bool
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    device: Any
    rows: int
    bounds: tuple[int, ...]
    split: bool = True

    # ------------------------------------------------------------------ construction
    @staticmethod
    def parts_of(value: Tensors) -> tuple[bool, tuple[torch.Tensor, ...]]:
        torch = _torch()
        if isinstance(value, torch.Tensor):
            return False, (value,)
        if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
            return True, tuple(value)
        raise CollectiveError(f"value: expected a tensor or a non-empty tuple of tensors, got {type(value).__name__}")

    @classmethod
    def of(cls, value: Tensors, op: Op, shares: Sequence[float]) -> Layout:
        is_tuple, parts = cls.parts_of(value)
        devs = {p.device for p in parts}
        if len(devs) != 1:
            raise CollectiveError(f"value: expected every part on one device, got {sorted(map(str, devs))}")
        if next(iter(devs)).type == "meta":
            raise CollectiveError("value: expected tensors holding data, got tensors on device 'meta'")
        dtypes = tuple(p.dtype for p in parts)
        shapes = tuple(tuple(p.shape) for p in parts)
        if op.elementwise and len(set(dtypes)) == 1:
            mode, rows = "flat", sum(p.numel() for p in parts)
        else:
            mode = "rows"
            firsts = {s[0] if len(s) else None for s in shapes}
            rows = firsts.pop() if len(firsts) == 1 and None not in firsts else None
            if len(parts) > 1 and sum(p.numel() * p.element_size() for p in parts) <= PACK_BYTES:
                mode = "packed"
            if rows is None or (not op.chunkable and rows > 1):
                return cls(
                    mode,
                    is_tuple,
                    shapes,
                    dtypes,
                    next(iter(devs)),
                    1,
                    _split(1, [1.0] + [0.0] * (len(shares) - 1)),
                    split=False,
                )
        return cls(mode, is_tuple, shapes, dtypes, next(iter(devs)), rows, _split(rows, shares))

    @property
    def max_chunks(self) -> int:
        """Most chunks this value can be split into (rows, elements; 1 when unsplittable)."""
        return max(1, self.rows)

    @property
    def direct(self) -> bool:
        """True when the buffer is the (single, contiguous) tensor itself."""
        return len(self.shapes) == 1

    def descriptor(self) -> str:
        """What ranks compare: layout mode, shapes and dtypes of every part, chunk bounds."""
        parts = ",".join(f"{str(d).replace('torch.', '')}{list(s)}" for s, d in zip(self.shapes, self.dtypes))
        return f"{self.mode}:{'tuple' if self.is_tuple else 'tensor'}({parts})/{len(self.bounds) - 1}"

    # ------------------------------------------------------------------ buffers
    def _elem(self, i: int) -> int:
        torch = _torch()
        return torch.empty((), dtype=self.dtypes[i]).element_size()

    def _row_width(self, i: int) -> int:
        n = 1
        for d in self.shapes[i][1:] if self.split else self.shapes[i]:
            n *= d
        return n

    def _segments(self):
        """Packed mode, per chunk: (byte offset, byte length, [(offset, bytes) per part])."""
        cache = self.__dict__.get("_seg")
        if cache is None:
            out, off = [], 0
            for c in range(len(self.bounds) - 1):
                a, b = self.bounds[c], self.bounds[c + 1]
                start, segs = off, []
                for i in range(len(self.shapes)):
                    nb = (b - a) * self._row_width(i) * self._elem(i)
                    segs.append((off, nb))
                    off += -(-nb // ALIGN) * ALIGN
                out.append((start, off - start, segs))
            cache = (tuple(out), off)
            object.__setattr__(self, "_seg", cache)
        return cache

    def _part_rows(self, parts, c: int):
        a, b = self.bounds[c], self.bounds[c + 1]
        return [self._view(p.reshape(self._rows_shape(i))[a:b], i, b - a) for i, p in enumerate(parts)]

    def new_buffer(self) -> Tensors:
        """An uninitialised buffer of this layout (scratch)."""
        torch = _torch()
        if self.mode == "flat":
            return torch.empty(self.rows, dtype=self.dtypes[0], device=self.device)
        if self.mode == "packed":
            return torch.empty(self._segments()[1], dtype=torch.uint8, device=self.device)
        bufs = tuple(torch.empty(self._rows_shape(i), dtype=d, device=self.device) for i, d in enumerate(self.dtypes))
        return bufs[0] if self.direct else bufs

    def _rows_shape(self, i: int) -> tuple[int, ...]:
        return (self.rows, self._row_width(i))

    def pack(self, value: Tensors, *, reuse: bool) -> Tensors:
        """The buffer holding ``value``; ``reuse`` lets a single contiguous tensor be the
        buffer itself (in place), otherwise the value is copied."""
        torch = _torch()
        _, parts = self.parts_of(value)
        if self.direct:
            p = parts[0]
            if reuse and p.is_contiguous():
                return p.view(-1) if self.mode == "flat" else p.view(self._rows_shape(0))
            buf = self.new_buffer()
            if p.numel():
                buf.view(p.shape).copy_(p)
            return buf
        if self.mode == "flat":
            return torch.cat([p.reshape(-1) for p in parts])
        if self.mode == "packed":
            buf = self.new_buffer()
            for c in range(len(self.bounds) - 1):
                if not self.empty(c):
                    for dst, src in zip(self.values(buf, c), self._part_rows(parts, c)):
                        dst.copy_(src)
            return buf
        if reuse and all(p.is_contiguous() for p in parts):
            return tuple(p.view(self._rows_shape(i)) for i, p in enumerate(parts))
        bufs = self.new_buffer()
        for b, p in zip(bufs, parts):
            if p.numel():
                b.view(p.shape).copy_(p)
        return bufs

    def unpack(self, buf: Tensors, out: Tensors | None = None) -> Tensors:
        """The value held by ``buf`` (views into it when possible), copied into ``out`` if given."""
        if self.direct:
            v = buf.view(self.shapes[0])
            if out is not None:
                o = out[0] if self.is_tuple else out
                if o.data_ptr() != v.data_ptr():
                    o.copy_(v)
                return out
            return (v,) if self.is_tuple else v
        torch = _torch()
        if out is None and self.mode in ("flat", "packed"):
            outs = tuple(torch.empty(s, dtype=d, device=self.device) for s, d in zip(self.shapes, self.dtypes))
        elif out is None:
            outs = None
        else:
            outs = tuple(out) if self.is_tuple else (out,)
        if self.mode == "flat":
            off = 0
            for o in outs:
                o.view(-1).copy_(buf[off : off + o.numel()])
                off += o.numel()
        elif self.mode == "packed":
            for c in range(len(self.bounds) - 1):
                if not self.empty(c):
                    for dst, src in zip(self._part_rows(outs, c), self.values(buf, c)):
                        dst.copy_(src)
        else:
            views = tuple(b.view(s) for b, s in zip(buf, self.shapes))
            if out is None:
                return views
            for o, v in zip(outs, views):
                if o.data_ptr() != v.data_ptr():
                    o.copy_(v)
        if out is not None:
            return out
        return outs if self.is_tuple else outs[0]

    # ------------------------------------------------------------------ chunks
    def empty(self, c: int) -> bool:
        return self.bounds[c] == self.bounds[c + 1]

    def chunk(self, buf: Tensors, c: int) -> Tensors:
        """Chunk c of ``buf`` as what is sent and received: one contiguous tensor, or for
        several parts a tuple of contiguous tensors (each part's rows of the chunk)."""
        a, b = self.bounds[c], self.bounds[c + 1]
        if self.mode == "flat" or self.direct:
            return buf[a:b]
        if self.mode == "packed":
            start, length, _ = self._segments()[0][c]
            return buf[start : start + length]
        return tuple(x[a:b] for x in buf)

    def values(self, buf: Tensors, c: int) -> Tensors:
        """Chunk c of ``buf`` as the operator sees it: a flat slice (flat), else the part
        rows (a tensor, or a tuple for a tuple value), each shaped ``[rows_c, *shape[1:]]``."""
        a, b = self.bounds[c], self.bounds[c + 1]
        if self.mode == "flat":
            return buf[a:b]
        if self.direct:
            v = self._view(buf[a:b], 0, b - a)
            return (v,) if self.is_tuple else v
        if self.mode == "packed":
            vals = tuple(
                self._view(buf[off : off + nb].view(self.dtypes[i]), i, b - a)
                for i, (off, nb) in enumerate(self._segments()[0][c][2])
            )
        else:
            vals = tuple(self._view(x[a:b], i, b - a) for i, x in enumerate(buf))
        return vals if self.is_tuple else vals[0]

    def _tail(self, i: int) -> tuple[int, ...]:
        return tuple(self.shapes[i][1:])

    def _view(self, t, i: int, nrows: int):
        return t.view((nrows,) + self._tail(i)) if self.split else t.view(self.shapes[i])
