"""Process-group plumbing shared by the distributed decoders (tree, ring, 3 all-reduces).

* group-local rank and size, and the translation of a group rank to the global
  rank that ``torch.distributed``'s point-to-point calls take, come from the one
  place treecoll has them: :func:`treecoll.collectives.group.group_info` (the
  decoders pass ``single_process=True``: a process without an initialised
  default group is a group of one).
* :func:`check_same_signature`: one small ``all_gather`` of integer signatures
  so that ranks that disagree on shapes or dtypes raise
  :class:`~topo.errors.AttentionError` (naming every rank's value) instead of
  hanging in a mismatched exchange.
* :func:`count_traffic`: counts the bytes handed to ``torch.distributed``
  (point-to-point sends, all-reduce, all-gather, broadcast) while it is active.
* :func:`peak_tensor_bytes`: the peak of live tensor bytes allocated while a
  callable runs (torch profiler memory events).

Processes are started by :mod:`treecoll.collectives.launch`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from treecoll.collectives.group import group_info
from treecoll.topo.errors import AttentionError

__all__ = [
    "check_same_signature",
    "Traffic",
    "count_traffic",
    "peak_tensor_bytes",
]

T = TypeVar("T")


def _dist():
    import torch.distributed as dist

    return dist


def check_same_signature(
    values: Sequence[int], names: Sequence[str], where: str, group: Any = None, *, allow_differ: Collection[str] = ()
) -> torch.Tensor:
    """All-gather one int64 vector per rank and raise if ranks disagree.

    ``values``: ints (one per ``names`` entry); ``allow_differ``: names whose
    values may differ between ranks (e.g. local sequence lengths).  Returns the
    gathered int64 ``[P, len(values)]`` (row r = rank r's values) so callers can
    reuse it (the ring decoder reads every rank's shard length from it).
    Raises :class:`AttentionError` on every rank: ``"<where>: ranks disagree on
    <name>: expected the same value on every rank, got rank 0: x, rank 1: y"``.
    """
    size = group_info(group, single_process=True).size
    mine = torch.tensor([int(v) for v in values], dtype=torch.int64)
    if size == 1:
        return mine.unsqueeze(0)
    dist = _dist()
    out = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(out, mine, group=group)
    table = torch.stack(out)
    for j, name in enumerate(names):
        if name in allow_differ:
            continue
        col = table[:, j]
        if bool((col != col[0]).any()):
            got = ", ".join(f"rank {r}: {int(v)}" for r, v in enumerate(col.tolist()))
            raise AttentionError(
                f"{where}: ranks disagree on {name}: expected the same value on every rank, got {got}; "
                f"every rank must call with the same batch, heads, head_dim and dtypes"
            )
    return table


DTYPE_CODES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}


# --------------------------------------------------------------------------- traffic


@dataclass
class Traffic:
    """Bytes this process handed to torch.distributed while counting.

    ``p2p_sent``/``p2p_recv``: bytes of tensors passed to send/isend and
    recv/irecv (exactly what crosses the wire for them); ``collective``: bytes of
    the tensors passed to all_reduce / all_gather / broadcast (the caller's
    buffer, counted once per call; what the backend's algorithm puts on the wire
    differs: a ring all-reduce sends 2(P-1)/P of it); ``calls``: per function.
    ``sent`` = ``p2p_sent + collective`` is what the tools report as "bytes sent".
    """

    p2p_sent: int = 0
    p2p_recv: int = 0
    collective: int = 0
    calls: dict = field(default_factory=dict)
    collective_bytes: dict = field(default_factory=dict)  # function name -> bytes passed

    @property
    def sent(self) -> int:
        return self.p2p_sent + self.collective

    def wire_estimate(self, nranks: int) -> float:
        """Bytes this rank puts on the wire if the collectives run the bandwidth-optimal
        ring algorithms: all_reduce ``2(P-1)/P`` of its buffer, all_gather ``P-1``
        times its piece, broadcast/reduce once; point-to-point sends exactly."""
        p = max(int(nranks), 1)
        factor = {
            "all_reduce": 2 * (p - 1) / p,
            "all_gather": p - 1,
            "all_gather_into_tensor": (p - 1) / p,
            "broadcast": 1.0,
            "reduce": 1.0,
        }
        return self.p2p_sent + sum(factor.get(k, 1.0) * v for k, v in self.collective_bytes.items())

    def as_dict(self, nranks: int | None = None) -> dict:
        d = {
            "sent": self.sent,
            "p2p_sent": self.p2p_sent,
            "p2p_recv": self.p2p_recv,
            "collective": self.collective,
            "calls": dict(self.calls),
            "collective_bytes": dict(self.collective_bytes),
        }
        if nranks is not None:
            d["wire_estimate"] = self.wire_estimate(nranks)
        return d


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


_P2P = {"send": "p2p_sent", "isend": "p2p_sent", "recv": "p2p_recv", "irecv": "p2p_recv"}
_COLL = {
    "all_reduce": 0,
    "broadcast": 0,
    "all_gather": 1,
    "all_gather_into_tensor": 1,
    "all_gather_single": 1,
    "reduce": 0,
}


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Count bytes passed to torch.distributed calls inside the block; yields a
    :class:`Traffic`.

    Patches the functions in both ``torch.distributed`` and its
    ``distributed_c10d`` module (``batch_isend_irecv`` goes through the patched
    ``isend``/``irecv``), so it sees calls made by any library that looks them
    up at call time.  Not thread-safe; restores the originals on exit.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    traffic = Traffic()
    saved = {}
    depth = [0]  # torch implements some calls through others (send -> isend): count the outer one

    def wrap(name, fn):
        def counted(*args, **kwargs):
            if depth[0]:
                return fn(*args, **kwargs)
            traffic.calls[name] = traffic.calls.get(name, 0) + 1
            if name in _P2P:
                tensor = args[0] if args else kwargs.get("tensor")
                setattr(traffic, _P2P[name], getattr(traffic, _P2P[name]) + _nbytes(tensor))
            else:
                idx = _COLL[name]
                tensor = args[idx] if len(args) > idx else kwargs.get("tensor")
                nb = _nbytes(tensor)
                traffic.collective += nb
                traffic.collective_bytes[name] = traffic.collective_bytes.get(name, 0) + nb
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1

        counted.__name__ = name
        return counted

    for name in list(_P2P) + list(_COLL):
        orig = getattr(c10d, name, None)
        if orig is None:  # a name this torch does not have (all_gather_single before 2.13)
            continue
        saved[name] = (orig, getattr(dist, name, None))
        w = wrap(name, orig)
        setattr(c10d, name, w)
        setattr(dist, name, w)
    try:
        yield traffic
    finally:
        for name, (orig, top) in saved.items():
            setattr(c10d, name, orig)
            if top is not None:
                setattr(dist, name, top)


@contextlib.contextmanager
def _stderr_silenced():
    import sys

    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no file descriptor 2
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def peak_tensor_bytes(fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, int]:
    """Run ``fn(*args, **kwargs)`` under the torch profiler and return
    ``(result, peak)``: ``peak`` is the largest total of tensor bytes allocated
    during the call and alive at the same time (allocation events in time
    order; tensors that existed before the call, such as the KV cache, are not
    counted).  Slow: measure in a separate, untimed call.  The process's file
    descriptor 2 (stderr) is sent to /dev/null during the call: the profiler
    prints its stage lines there; errors still raise."""
    from torch.profiler import ProfilerActivity, profile

    with _stderr_silenced():  # the profiler (kineto) prints stage lines on file descriptor 2
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = fn(*args, **kwargs)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    cur = peak = 0
    for e in events:
        cur += e.nbytes()
        peak = max(peak, cur)
    return result, peak


def decode_signature(q, k, extra=(), extra_names=()):
    """``(values, names)`` for :func:`check_same_signature` of a decode call:
    batch, q_heads, head_dim, kv_heads and the dtypes of q and k (-1 where an
    input is not a tensor of the expected rank), plus ``extra``."""
    qs = tuple(q.shape) if isinstance(q, torch.Tensor) and q.dim() == 3 else (-1, -1, -1)
    kv_heads = k.shape[2] if isinstance(k, torch.Tensor) and k.dim() == 4 else -1
    codes = [DTYPE_CODES.get(getattr(x, "dtype", None), 0) for x in (q, k)]
    values = [*qs, kv_heads, *codes, *extra]
    names = ["batch", "q_heads", "head_dim", "kv_heads", "q dtype", "kv dtype", *extra_names]
    return values, names


def agree_on_inputs(where: str, group, q, k, v, kv_len, scale, *, extra=(), extra_names=(), allow_differ=()):
    """Validate a decode call locally and make every rank agree before any exchange.

    One all-gather of :func:`decode_signature` (plus ``extra``) and a flag saying
    whether this rank's inputs passed :func:`treecoll.attention.validate.check_decode_inputs`.
    Every rank raises :class:`AttentionError` if any rank's inputs are invalid
    or the ranks disagree, so no rank is left waiting in a later exchange.
    Returns ``(lengths int32 [batch], scale, table int64 [P, n])``.
    """
    from treecoll.attention.validate import check_decode_inputs

    err, lengths = None, None
    try:
        lengths, scale = check_decode_inputs(q, k, v, kv_len, scale, where)
    except AttentionError as e:
        err = e
    values, names = decode_signature(q, k, extra, extra_names)
    table = check_same_signature(
        values + [int(err is not None)],
        names + ["invalid inputs"],
        where,
        group,
        allow_differ=tuple(allow_differ) + ("invalid inputs",),
    )
    if err is not None:
        raise err
    bad = [r for r, f in enumerate(table[:, -1].tolist()) if f]
    if bad:
        raise AttentionError(
            f"{where}: expected valid inputs on every rank, got invalid inputs on rank(s) {bad} "
            f"(see the error raised there)"
        )
    return lengths, scale, table
