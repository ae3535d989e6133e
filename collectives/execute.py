"""Run schedules over point-to-point transfers: ``reduce``, ``broadcast``, ``allreduce``.

Public API (tensor first, then keyword options, as ``torch.distributed``)::

    allreduce(x, *, op="sum", tree=None, placement=None, group=None, out=None, options=None) -> value
    reduce(x, *, root=0, op="sum", tree=None, placement=None, group=None, out=None, options=None) -> value | None
    broadcast(x, *, root=0, tree=None, placement=None, group=None, out=None, options=None) -> value
    CollectiveOptions(algo="auto", nchunks=None, timeout=None, check=True)
    run_schedule(schedule, layout, buf, op, transport, *, timeout, what, tag_base, scratch) -> None

``x`` is a tensor of any dtype and shape or a tuple of tensors (one device);
the result has the same structure. **In place by default**, as
``torch.distributed.all_reduce`` / ``broadcast`` / ``reduce``: the result is
written into ``x`` and ``x`` is returned (no copy for a single contiguous
tensor; a non-contiguous ``x`` gets one copy in and out; an ``x`` whose
elements share memory, e.g. ``expand()``, is refused). ``out=`` writes the
result there instead and leaves ``x`` unmodified. ``reduce`` returns the result
on ``root`` and None elsewhere, where ``x`` (and ``out``) are left unmodified.
``op``: a name in :data:`treecoll.collectives.ops.OPS`, an
:class:`~treecoll.collectives.ops.Op`, or a callable ``op(a, b)``
(associative; declare commutativity or an operator that must not be split
with ``resolve_op(fn, commutative=True, chunkable=False)`` or attributes on
the callable, see :mod:`treecoll.collectives.ops`). Collectives run under
``torch.no_grad()``.

``placement``: a :class:`~treecoll.collectives.placement.Placement` (topology,
the GPU of every group rank, the process group); ``group``: a process group
when there is no placement (None: the default group). Plans are built for the
placement's topology; without one, for ``P`` GPUs on a uniform switch.
``options``: a :class:`CollectiveOptions` for the rest (algorithm, chunks,
timeout, cross-rank check).

``tree``: a :class:`Tree` / :class:`MultiTree`, a loaded tree file
(:class:`~collectives.tree_io.TreeFile`, one tree or several with shares), a
tree file path (``"tree.yaml"``, ``pathlib.Path``; read again when the file
changes), a builder name (``"binomial"``, ``"kary:4"``, ``"two_level"``, ...;
:func:`treecoll.collectives.tree_io.resolve_tree_arg` tells names from paths) or None /
``"auto"`` (least predicted
time for this size on ``topology``, or on a uniform switch when no topology is
given). ``options.algo`` (allreduce): ``"tree"``, ``"ring"`` (reduce-scatter +
all-gather on a ring, commutative operators), ``"rsag"`` (direct
reduce-scatter + all-gather: every rank sends and receives ``2 (P-1)/P`` of
the message, bandwidth optimal, for large messages), or ``"auto"`` (default):
the tree when one is given; else, for two ranks, ``"direct"`` (one
exchange, both fold in rank order) below :data:`AUTO_P2_RSAG_BYTES` and
``rsag`` from there (each rank then folds half the bytes); for more ranks
the tree below :data:`AUTO_RSAG_BYTES` and ``rsag`` from there (also ``"direct"``: every rank sends its whole value to
every other, one round). Plans, compiled schedules and scratch buffers
are kept by the :class:`~treecoll.collectives.planner.Planner` (bounded,
clearable), so a repeated call costs the transfers only.

Non-commutative operators keep rank order (``x_0 op x_1 op ... op x_{P-1}``):
a tree chosen by treecoll (None, "auto") is then restricted to
order-preserving trees rooted at rank 0; an explicit tree (object or builder
name) that is not order preserving raises :class:`TreeError` (no silent
reshaping of a tree the user asked for); ``algo="ring"`` raises too.

Safety: before the first use of a (schedule, value layout, operator) in a
group, ranks exchange a fingerprint of all three (one small all_gather,
kept per group and fingerprint) and raise :class:`CollectiveError` naming
the ranks that disagree (a different tree, shape or dtype) instead of
hanging; every wait is bounded by ``options.timeout`` (seconds; default
:data:`~treecoll.collectives.group.DEFAULT_TIMEOUT`) and a peer that dies or
never arrives gives a :class:`CollectiveError` naming the collective, the
chunk and the peer. A rank that has already cached an agreement skips the
exchange; if another rank then arrives with a different layout, both sides
fail on the timeout, with the same error naming the peer (``options.check="always"``
exchanges on every call: such a mismatch then fails at once, for one small
all_gather per call). Messages carry a tag derived from the call's
fingerprint, so the transfers of two different call shapes never match each
other on backends that honour tags (gloo): a mismatch waits for the timeout,
never mixes data (NCCL ignores tags). ``options.check=False`` skips the exchange.

A group in which a collective failed (a peer died or timed out, an operator
raised) is unusable: transfers of the failed call may still be posted and
would match later ones. Every later call on it raises at once a
:class:`CollectiveError` saying so, with the first failure; destroy the
process group and create a new one (see :mod:`treecoll.collectives.group`).

A user operator is probed once per (operator, value layout) when ``check``
is on: ``(a op b) op c`` against ``a op (b op c)`` on three small random
values of the value's structure (the first two rows); a clear difference
raises :class:`CollectiveError` (a non-associative operator would give a
result that depends on the tree). An operator that raises on random values is
not probed; ``fn.associative = True`` on the callable skips the probe.

Executor: scratch buffers (one message-sized buffer per scratch slot) are
kept between calls with the same layout (by the planner, per group), so a
repeated collective allocates nothing. Steps start in list order; a step first waits for its
dependencies (and for any send still reading, or receive still writing, the
chunk it touches); sends and receives are non-blocking ``isend``/``irecv``
with ``tag = tag base + chunk`` (the base: a hash of the call's fingerprint).
Reductions run in place on whole chunks (one call per chunk: no per-element
Python work).

In place, or into ``out=`` (three in-process ranks, :mod:`treecoll.collectives.local`):

>>> import torch
>>> from treecoll.collectives.local import run_ranks
>>> xs = [torch.tensor([1.0, 2.0]) * (r + 1) for r in range(3)]
>>> res = run_ranks(3, lambda r, t: allreduce(xs[r], tree="chain", _transport=t))
>>> xs[2].tolist(), res[2] is xs[2]
([6.0, 12.0], True)
>>> ys = [torch.ones(2) for _ in range(3)]
>>> opts = CollectiveOptions(nchunks=1, timeout=10.0)
>>> outs = run_ranks(3, lambda r, t: allreduce(ys[r], out=torch.zeros(2), options=opts, _transport=t))
>>> ys[0].tolist(), outs[0].tolist()
([1.0, 1.0], [3.0, 3.0])

Backends: tested on gloo (CPU). On NCCL every ``isend``/``irecv`` is its own
operation on the process group's stream; the schedules post receives before
the sends that depend on them and wait on a send only before overwriting its
buffer, but this path has not been run on GPUs here. NCCL matches a pair's
messages in the order they are posted and ignores tags: a schedule whose
sender posts a pair's chunks in another order than its receiver (several
trees sharing a pair, :meth:`Schedule.pair_order_conflict`) would put chunks in
the wrong place there, so on such a backend (``transport.matches_tags`` false)
``auto`` runs the first tree of such a multitree alone and an explicit one
raises :class:`CollectiveError` naming the pair, before any message.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from treecoll.topo.errors import CollectiveError, PlacementError, TreecollError

from .group import DEFAULT_TIMEOUT, TorchTransport, check_usable, mark_broken
from .layout import Layout
from .ops import Op, resolve_op
from .placement import Placement
from .planner import ALGOS, AUTO_P2_RSAG_BYTES, AUTO_RSAG_BYTES, LRU, Planner, default_planner
from .schedule import Schedule
from .tree import MultiTree, Tree
from .tree_io import resolve_tree_arg

if TYPE_CHECKING:
    import torch

    #: a collective's value: a tensor or a tuple of tensors (one device)
    Value = torch.Tensor | tuple[torch.Tensor, ...]

__all__ = [
    "reduce",
    "broadcast",
    "allreduce",
    "CollectiveOptions",
    "run_schedule",
    "AUTO_RSAG_BYTES",
    "AUTO_P2_RSAG_BYTES",
    "FINGERPRINT_BYTES",
]

#: what ``op=`` takes: a registered name, an :class:`Op` or a callable ``op(a, b)``
OpArg = str | Op | Callable[[Any, Any], Any]

#: bytes per rank in the fingerprint all_gather
FINGERPRINT_BYTES = 512


@dataclass(frozen=True)
class CollectiveOptions:
    """The less common knobs of a collective call, validated when built (one-line errors).

    * ``algo``: ``"auto"`` (default), ``"tree"``, ``"ring"``, ``"rsag"`` or ``"direct"``
      (allreduce; reduce and broadcast run trees): see the module docstring;
    * ``nchunks``: pipeline chunks per tree (None: the planner's chunking policy,
      :func:`treecoll.collectives.cost.nchunks_for`);
    * ``timeout``: seconds any single wait may take (None:
      :data:`~treecoll.collectives.group.DEFAULT_TIMEOUT`);
    * ``check``: True (ranks agree on the call once per call shape, and a user
      operator is probed for associativity), ``"always"`` (agree on every call) or
      False (neither).

    >>> CollectiveOptions(nchunks=4).timeout_s
    300.0
    >>> CollectiveOptions(nchunks=0)
    Traceback (most recent call last):
    ...
    treecoll.topo.errors.CollectiveError: options: nchunks expected a positive integer or None (chosen per size), got 0
    """

    algo: str = "auto"
    nchunks: int | None = None
    timeout: float | None = None
    check: bool | Literal["always"] = True

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise CollectiveError(f"options: algo expected one of {list(ALGOS)}, got {self.algo!r}")
        k = self.nchunks
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise CollectiveError(f"options: nchunks expected a positive integer or None (chosen per size), got {k!r}")
        if self.check not in (True, False, "always"):
            raise CollectiveError(f"options: check expected True, False or 'always', got {self.check!r}")
        t = self.timeout
        if t is not None and (
            isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0 or not math.isfinite(t)
        ):
            raise CollectiveError(f"options: timeout expected a positive number of seconds, got {t!r}")

    @property
    def timeout_s(self) -> float:
        """The timeout in seconds (the default when None)."""
        return DEFAULT_TIMEOUT if self.timeout is None else float(self.timeout)


_DEFAULTS = CollectiveOptions()


# ---------------------------------------------------------------------- the executor
def _brief(err: BaseException) -> str:
    """The first line of a backend error without its C++ source location prefix."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text)


def _fail(what: str, s, r: int, err: BaseException, timeout: float, elapsed: float) -> CollectiveError:
    verb = {"recv": "receiving", "send": "sending"}.get(s.kind, "waiting for")
    direction = "from" if s.kind == "recv" else "to"
    when = f"within {timeout:g} s" if elapsed >= 0.9 * timeout else f"after {elapsed:.2g} s (timeout {timeout:g} s)"
    return CollectiveError(
        f"{what}: rank {r} failed {verb} chunk {s.chunk} {direction} rank {s.peer} "
        f"{when}: {_brief(err)}; "
        f"the peer may have died, timed out, or called a different collective "
        f"(another tree, shape, dtype or op)"
    )


def run_schedule(
    schedule: Schedule,
    layout: Layout,
    buf: Any,
    op: Op,
    transport: Any,
    *,
    timeout: float,
    what: str = "",
    tag_base: int = 0,
    scratch: LRU | None = None,
) -> None:
    """Run this rank's steps of ``schedule`` on ``buf`` (a buffer of ``layout``); the
    message of chunk c carries tag ``tag_base + c``. ``scratch``: where scratch buffers
    are kept between calls (the planner's, per group; None: new ones). An operator's
    exception other than a :class:`~treecoll.topo.errors.TreecollError` becomes a
    :class:`CollectiveError` naming it."""
    r = transport.rank
    what = what or schedule.name or schedule.collective
    steps = schedule.steps[r]
    works: dict[int, Any] = {}
    done: set[int] = set()
    sends = defaultdict(list)  # chunk -> step indices of sends in flight (reading buf[chunk])
    writes: dict[tuple[int, int], int] = {}  # (chunk, slot) -> recv step writing it
    slots: dict[int, Any] = {}

    def wait(i: int) -> None:
        if i in done:
            return
        w = works.get(i)
        if w is not None:
            t0 = time.monotonic()
            try:
                for x in w if isinstance(w, list) else (w,):
                    transport.wait(x, timeout)
            except Exception as e:  # noqa: BLE001 - backend errors are RuntimeError, DistBackendError, ...
                raise _fail(what, steps[i], r, e, timeout, time.monotonic() - t0) from e
        done.add(i)

    sig = (r, layout.mode, layout.shapes, layout.dtypes, str(layout.device), layout.bounds)

    def slot_buf(slot: int):
        if slot == 0:
            return buf
        if slot not in slots:
            t = scratch.get(sig + (slot,)) if scratch is not None else None
            if t is None:
                t = layout.new_buffer()
                if scratch is not None:
                    scratch[sig + (slot,)] = t
            slots[slot] = t
        return slots[slot]

    reduce_fn = op.inplace if layout.mode == "flat" else None
    for i, s in enumerate(steps):
        c = s.chunk
        if layout.empty(c):
            done.add(i)
            continue
        for d in s.deps:
            wait(d)
        if s.kind == "send":
            if (c, 0) in writes:
                wait(writes.pop((c, 0)))
            works[i] = _post(transport.isend, layout.chunk(buf, c), s.peer, tag_base + c)
            sends[c].append(i)
        elif s.kind == "recv":
            if s.slot == 0:
                for j in sends.pop(c, ()):
                    wait(j)
            if (c, s.slot) in writes:
                wait(writes.pop((c, s.slot)))
            works[i] = _post(transport.irecv, layout.chunk(slot_buf(s.slot), c), s.peer, tag_base + c)
            writes[(c, s.slot)] = i
        else:  # reduce
            if (c, s.slot) in writes:
                wait(writes.pop((c, s.slot)))
            if (c, 0) in writes:
                wait(writes.pop((c, 0)))
            for j in sends.pop(c, ()):
                wait(j)
            _reduce_chunk(layout, buf, slot_buf(s.slot), c, s.right, op, reduce_fn, what, r)
            done.add(i)
    for i in list(works):
        wait(i)


def _reduce_chunk(layout: Layout, buf, other, c: int, right: bool, op: Op, reduce_fn, what: str, r: int) -> None:
    """``buf[c] = buf[c] op other[c]`` (``right``) or ``other[c] op buf[c]``."""
    a = layout.values(buf, c)
    b = layout.values(other, c)
    try:
        if reduce_fn is not None:
            if right or op.commutative:
                reduce_fn(a, b)
            else:
                reduce_fn(b, a)
                a.copy_(b)
        else:
            res = op.fn(a, b) if right else op.fn(b, a)
            _store(a, res, what, op)
    except TreecollError:
        raise
    except Exception as e:  # the user's operator may raise anything
        raise CollectiveError(
            f"{what}: op {op.name!r} raised {type(e).__name__} on rank {r} (chunk {c}): "
            f"{str(e).splitlines()[0] if str(e) else ''}"
        ) from e


def _post(fn, t, peer: int, tag: int):
    if isinstance(t, tuple):
        return [fn(x, peer, tag) for x in t if x.numel()]
    return fn(t, peer, tag)


def _store(dst, res, what: str, op: Op) -> None:
    import torch

    if isinstance(dst, tuple):
        if not isinstance(res, (tuple, list)) or len(res) != len(dst):
            raise CollectiveError(
                f"{what}: op {op.name!r} expected to return a tuple of {len(dst)} tensors, got {type(res).__name__}"
            )
        for d, v in zip(dst, res):
            if d.data_ptr() != v.data_ptr():
                d.copy_(v)
        return
    if not isinstance(res, torch.Tensor):
        raise CollectiveError(f"{what}: op {op.name!r} expected to return a tensor, got {type(res).__name__}")
    if res.data_ptr() != dst.data_ptr():
        if res.shape != dst.shape:
            raise CollectiveError(
                f"{what}: op {op.name!r} returned shape {tuple(res.shape)}, "
                f"expected {tuple(dst.shape)} (the operands' shape)"
            )
        dst.copy_(res)


# ---------------------------------------------------------------------- agreement
def _agree(transport: Any, text: str, what: str, timeout: float, agreed: LRU, *, cached: bool = True) -> None:
    """Compare ``text`` across ranks (once per text in ``agreed``, the group's, when ``cached``);
    raise naming who differs."""
    if cached and text in agreed:
        return
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    payload = json.dumps({"h": digest, "d": text}).encode()
    if len(payload) > FINGERPRINT_BYTES:
        payload = json.dumps({"h": digest, "d": text[: FINGERPRINT_BYTES - 64] + "..."}).encode()
    t0 = time.monotonic()
    try:
        got = transport.all_gather_bytes(payload, FINGERPRINT_BYTES, timeout)
    except Exception as e:  # noqa: BLE001
        elapsed = time.monotonic() - t0
        when = f"within {timeout:g} s" if elapsed >= 0.9 * timeout else f"after {elapsed:.2g} s"
        err = CollectiveError(
            f"{what}: fingerprint exchange failed {when}: {_brief(e)}; a rank may have died, "
            f"or ranks called different collectives"
        )
        mark_broken(getattr(transport, "comm", None), str(err))
        raise err from e
    entries = []
    for g in got:
        try:
            entries.append(json.loads(g.decode()))
        except ValueError:
            entries.append({"h": "?", "d": repr(g[:40])})
    hashes = [e["h"] for e in entries]
    if len(set(hashes)) > 1:
        mine = hashes[transport.rank]
        odd = [r for r, h in enumerate(hashes) if h != mine]
        detail = "; ".join(f"rank {r}: {entries[r]['d']}" for r in sorted(set([transport.rank] + odd))[:4])
        raise CollectiveError(
            f"{what}: ranks disagree on the collective (tree, shapes, dtypes, op): "
            f"ranks {odd} differ from rank {transport.rank}; {detail}"
        )
    agreed[text] = True


# ---------------------------------------------------------------------- public collectives
def _nbytes(value) -> int:
    _, parts = Layout.parts_of(value)
    return sum(p.numel() * p.element_size() for p in parts)


def _value_sig(x) -> tuple:
    _, parts = Layout.parts_of(x)
    return (isinstance(x, (tuple, list)),) + tuple((tuple(p.shape), p.dtype, p.device) for p in parts)


def _label(collective: str, root: Any) -> str:
    """The collective's name in messages: ``allreduce``, ``reduce(root=1)``."""
    return collective if root is None else f"{collective}(root={root!r})"


def _check_root(root: Any, what: str) -> None:
    if root is not None and (isinstance(root, bool) or not isinstance(root, int)):
        raise CollectiveError(f"{what}: root expected an integer group rank, got {type(root).__name__} {root!r}")


def _run(
    collective: str,
    x: Any,
    *,
    op: OpArg,
    tree: Any,
    root: int | None,
    placement: Placement | None,
    group: Any,
    out: Any,
    options: CollectiveOptions | None,
    transport: Any,
) -> Any:
    what = _label(collective, root)
    _check_root(root, what)
    opts = _DEFAULTS if options is None else options
    if not isinstance(opts, CollectiveOptions):
        raise CollectiveError(f"{what}: options expected a CollectiveOptions or None, got {type(opts).__name__}")
    if placement is not None and not isinstance(placement, Placement):
        raise PlacementError(f"{what}: placement expected a Placement or None, got {type(placement).__name__}")
    if placement is not None and group is not None:
        raise PlacementError(
            f"{what}: got a placement and a group; pass the group inside the placement "
            f"(Placement(topology, ranks, group=group))"
        )
    planner = default_planner()
    if transport is None:
        transport = TorchTransport(placement.group if placement is not None else group)
    comm = getattr(transport, "comm", None)
    check_usable(comm, what)
    if placement is not None and placement.nranks != transport.size:
        raise PlacementError(
            f"{what}: the placement maps {placement.nranks} ranks, the group has {transport.size}; "
            f"build the placement for the group (Placement(topology, {transport.size}) or "
            f"group=...)"
        )
    if not (tree is None or isinstance(tree, (Tree, MultiTree))):
        tree = resolve_tree_arg(tree, files=planner.tree_files)  # a path: read again only when the file changed
    # fast path: the same call shape again (a decode loop) skips planning, layout and probing
    fkey = (
        collective,
        opts.algo,
        root,
        opts.nchunks,
        _ident(op),
        tree if isinstance(tree, str) else id(tree),
        placement.plan_key if placement is not None else None,
        transport.rank,
        transport.size,
        bool(opts.check),
        _value_sig(x),
    )
    hit = planner.calls.get(fkey)
    if hit is not None and (hit[0] is op or isinstance(op, (str, Op))) and (hit[1] is tree or isinstance(tree, str)):
        prep = hit[2]
    else:
        # no placement: the group's P ranks without a topology
        prep = _prepare(
            collective,
            x,
            op=op,
            tree=tree,
            root=root,
            options=opts,
            transport=transport,
            placement=placement if placement is not None else Placement(ranks=transport.size),
            planner=planner,
        )
        planner.calls[fkey] = (op, tree, prep)
    opx, sched, layout, what, text, tag_base, problem = prep
    me = transport.rank
    inplace = out is None or _same(out, x)
    if inplace:
        _check_writable(x, what)
    else:
        _check_out(out, x, what)
    cache = planner.comm_cache(comm)
    timeout = opts.timeout_s
    if opts.check:
        _agree(transport, text, what, timeout, cache.agreed, cached=opts.check != "always")
    if problem:
        raise CollectiveError(f"{what}: {problem}")
    import torch

    if sched is None:  # the backend's own allreduce is predicted faster (or as fast)
        with torch.no_grad():
            dst = x if inplace else out.copy_(x)
            try:
                transport.native_allreduce(dst, opx, timeout)
            except BaseException as e:
                mark_broken(comm, str(e).splitlines()[0] if str(e) else type(e).__name__)
                raise
        return dst
    with torch.no_grad():
        keep_x = not inplace or (collective == "reduce" and me != root and _writes_own(sched, me))
        buf = layout.pack(x, reuse=not keep_x)
        try:
            run_schedule(
                sched, layout, buf, opx, transport, timeout=timeout, what=what, tag_base=tag_base, scratch=cache.scratch
            )
        except BaseException as e:
            mark_broken(comm, str(e).splitlines()[0] if str(e) else type(e).__name__)
            raise
        if collective == "reduce" and me != root:
            return None
        return layout.unpack(buf, x if inplace else out)


def _ident(op: Any) -> Any:
    """A fast-path key for ``op``: names and (hashable) :class:`Op` values stand for themselves,
    anything else for its identity (checked on a hit)."""
    if isinstance(op, str):
        return op
    if isinstance(op, Op):
        try:
            hash(op)
            return op
        except TypeError:
            pass
    return ("id", id(op))


def _writes_own(sched: Schedule, rank: int) -> bool:
    """True when ``rank``'s steps write its own buffer (a reduce, or a receive into slot 0)."""
    return any(s.kind == "reduce" or (s.kind == "recv" and s.slot == 0) for s in sched.steps[rank])


def _check_writable(x, what: str) -> None:
    for i, p in enumerate(Layout.parts_of(x)[1]):
        if not p.is_contiguous() and any(st == 0 and n > 1 for st, n in zip(p.stride(), p.shape)):
            where = f"x[{i}]" if isinstance(x, (tuple, list)) else "x"
            raise CollectiveError(
                f"{what}: {where} cannot take the result in place: elements share memory "
                f"(shape {tuple(p.shape)}, stride {tuple(p.stride())}, e.g. from expand()); "
                f"pass out= or a clone()"
            )


def _check_out(out, x, what: str) -> None:
    _, oparts = Layout.parts_of(out)
    _, xparts = Layout.parts_of(x)
    if len(oparts) != len(xparts):
        raise CollectiveError(f"{what}: out expected {len(xparts)} tensors like x, got {len(oparts)}")
    for o, p in zip(oparts, xparts):
        if o.shape != p.shape or o.dtype != p.dtype or o.device != p.device:
            raise CollectiveError(
                f"{what}: out expected shape {tuple(p.shape)}, dtype {p.dtype} and device "
                f"{p.device}, got {tuple(o.shape)}, {o.dtype} and {o.device}"
            )
    _check_writable(out, what)


def _prepare(
    collective: str,
    x: Any,
    *,
    op: OpArg,
    tree: Any,
    root: int | None,
    placement: Placement,
    options: CollectiveOptions,
    transport: Any,
    planner: Planner,
) -> tuple:
    """(op, schedule, layout, label, agreement text, tag base, problem) for a call (kept by the caller);
    ``problem`` is what the associativity probe found ('' when nothing)."""
    opx = resolve_op(op)
    n = transport.size
    what = _label(collective, root)
    if root is not None and not 0 <= root < n:
        raise CollectiveError(f"{what}: root expected a group rank in 0..{n - 1}, got {root}")
    backend = _native_backend(collective, x, opx, tree, options, transport)
    if backend and planner.prefer_native(nbytes=_nbytes(x), placement=placement, backend=backend):
        layout = Layout.of(x, opx, [1.0])
        text = f"native:{backend}|{layout.descriptor()}|{opx.key()}"
        return opx, None, layout, what, text, 0, ""
    probe = Layout.of(x, opx, [1.0])

    def plan_call(tree: Any) -> tuple:
        return planner.schedule_for(
            tree,
            collective=collective,
            nbytes=_nbytes(x),
            placement=placement,
            op=opx,
            algo=options.algo if collective == "allreduce" else "tree",
            root=root,
            nchunks=options.nchunks,
            max_chunks=probe.max_chunks,
        )

    plan, sched = plan_call(tree)
    if not getattr(transport, "matches_tags", True):
        clash = sched.pair_order_conflict()
        if clash is not None and (tree is None or tree == "auto") and isinstance(plan, MultiTree):
            plan, sched = plan_call(plan.trees[0])  # auto's own choice: its first tree alone runs in order
            clash = sched.pair_order_conflict()
        if clash is not None:
            raise _pair_order_error(sched, clash, what, transport)
    layout = Layout.of(x, opx, sched.shares)
    problem = _associativity_problem(opx, layout, planner.probes) if options.check else ""
    ident = plan.fingerprint() if plan is not None else sched.name.partition("/")[0]
    text = f"{sched.name}#{ident}/{sched.nchunks}/r{root}|{layout.descriptor()}|{opx.key()}|a{int(not problem)}"
    digest = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    tag_base = ((digest & 0x7FFF) << TAG_CHUNK_BITS) if sched.nchunks < (1 << TAG_CHUNK_BITS) else 0
    return opx, sched, layout, what, text, tag_base, problem


def _pair_order_error(sched: Schedule, clash: tuple[int, int, int, int], what: str, transport: Any) -> CollectiveError:
    """The error for a pair of ranks that would post its messages in different orders
    (``clash``: :meth:`Schedule.pair_order_conflict`) on a transport that matches them in
    posting order (every rank raises the same)."""
    a, b, sent, got = clash
    backend = getattr(getattr(transport, "info", None), "backend", "")
    who = f"the {backend} backend" if backend else "this transport"
    return CollectiveError(
        f"{what}: schedule {sched.name!r} ({sched.nchunks} chunks): rank {a} sends rank {b} chunk {sent} "
        f"where rank {b} receives chunk {got}; {who} matches a pair's messages in the "
        f"order they are posted, not by tag, so the chunk would land in the wrong place; pass a "
        f"single-tree plan (e.g. tree='binary' or a two_level tree without rails)"
    )


def _native_backend(collective: str, x: Any, op: Op, tree: Any, options: CollectiveOptions, transport: Any) -> str:
    """The backend whose own allreduce may run this call ('' when it may not): an allreduce with
    ``algo="auto"``, no tree asked for, a built-in operator (sum, prod, max, min), one tensor,
    over a process group of a backend with a model (:data:`treecoll.collectives.executor_cost.EXECUTOR_COSTS`)."""
    from .executor_cost import EXECUTOR_COSTS

    if collective != "allreduce" or options.algo != "auto" or (tree is not None and tree != "auto"):
        return ""
    if not op.torch_name or isinstance(x, (tuple, list)) or not hasattr(transport, "native_allreduce"):
        return ""
    if not x.is_contiguous():
        return ""
    backend = str(getattr(getattr(transport, "info", None), "backend", "")).lower()
    if backend == "gloo" and str(x.dtype).removeprefix("torch.") not in GLOO_NATIVE_DTYPES:
        return ""
    return backend if backend in EXECUTOR_COSTS else ""


#: dtypes the executor hands to gloo's own allreduce (others run treecoll's schedules)
GLOO_NATIVE_DTYPES = ("float32", "float64", "int32", "int64")


#: low bits of a message tag that carry the chunk; the bits above carry a hash of the call's fingerprint
TAG_CHUNK_BITS = 16
#: most elements of one probe operand (larger rows are not probed)
PROBE_ELEMENTS = 1 << 14


def _associativity_problem(op: Op, layout: Layout, probes: LRU) -> str:
    """'' when ``op`` is built in, declares ``associative = True``, or gives ``(a op b) op c``
    equal to ``a op (b op c)`` (to the dtype's precision) on three seeded random values of
    the structure the executor passes it (the first two rows of every part); else what
    differed. An operator that raises on such values is not judged (''). Kept in ``probes``
    per (operator, value layout)."""
    if op.elementwise or getattr(op.fn, "associative", None) is True:
        return ""
    try:
        ident = hash(op.fn)
    except TypeError:
        ident = id(op.fn)
    key = (ident, layout.shapes, layout.dtypes, layout.split)
    hit = probes.get(key)
    if hit is None:
        hit = probes[key] = _probe(op, layout)
    return hit


def _probe(op: Op, layout: Layout) -> str:
    import torch

    shapes = [((min(2, s[0]),) + tuple(s[1:])) if layout.split and s else tuple(s) for s in layout.shapes]
    if any(math.prod(s) > PROBE_ELEMENTS or math.prod(s) == 0 for s in shapes):
        return ""
    gen = torch.Generator().manual_seed(12345)

    def value():
        parts = []
        for s, d in zip(shapes, layout.dtypes):
            if d.is_floating_point or d.is_complex:
                parts.append(torch.randn(s, generator=gen, dtype=torch.float64).to(d))
            elif d == torch.bool:
                parts.append(torch.randint(0, 2, s, generator=gen).bool())
            else:
                parts.append(torch.randint(-3, 4, s, generator=gen).to(d))
        return tuple(parts) if layout.is_tuple else parts[0]

    def clone(v):
        return tuple(t.clone() for t in v) if isinstance(v, tuple) else v.clone()

    a, b, c = value(), value(), value()
    try:
        with torch.no_grad():
            left = op.fn(op.fn(clone(a), clone(b)), clone(c))
            right = op.fn(clone(a), op.fn(clone(b), clone(c)))
        lparts, rparts = Layout.parts_of(left)[1], Layout.parts_of(right)[1]
    except Exception:  # noqa: BLE001 - an operator that does not take random values is not judged
        return ""
    worst = 0.0
    for lt, rt in zip(lparts, rparts):
        if lt.shape != rt.shape:
            return ""
        if lt.dtype.is_complex:
            lt, rt = torch.view_as_real(lt), torch.view_as_real(rt)
        lf, rf = lt.double(), rt.double()
        same = (lf == rf) | (torch.isnan(lf) & torch.isnan(rf))
        diff = torch.where(same, torch.zeros_like(lf), (lf - rf).abs().nan_to_num(float("inf")))
        scale = max(1.0, float(torch.where(same, 0.0, lf.abs().nan_to_num(0.0, 0.0, 0.0)).max()) if lf.numel() else 1.0)
        worst = max(worst, float(diff.max()) / scale if diff.numel() else 0.0)
        eps = torch.finfo(lt.dtype).eps if lt.dtype.is_floating_point else 0.0
        if worst > max(1e-4, 64 * eps):
            return (
                f"op {op.name!r} is not associative: (a op b) op c and a op (b op c) differ by {worst:.3g} "
                f"(relative) on random values of the value's structure, so the result would depend on "
                f"the tree; use an associative operator (e.g. carry sums and counts instead of averages), "
                f"or set fn.associative = True to skip this probe"
            )
    return ""


def _same(out, x) -> bool:
    if out is x:
        return True
    try:
        _, a = Layout.parts_of(out)
        _, b = Layout.parts_of(x)
    except CollectiveError:
        return False
    return len(a) == len(b) and all(p is q for p, q in zip(a, b))


def allreduce(
    x: Value,
    *,
    op: OpArg = "sum",
    tree: Any = None,
    placement: Placement | None = None,
    group: Any = None,
    out: Value | None = None,
    options: CollectiveOptions | None = None,
    _transport: Any = None,
) -> Value:
    """Every rank gets ``x_0 op x_1 op ... op x_{P-1}``: writes the result into `x` in place and returns it.

    ``out=``: the result goes there and ``x`` is left unmodified. ``tree``: a Tree,
    MultiTree, loaded tree file, tree file path or builder name. ``placement`` (or
    ``group``), ``options``: see the module docstring. ``_transport``: an in-process
    transport (:mod:`treecoll.collectives.local`) in place of the process group.
    """
    return _run(
        "allreduce",
        x,
        op=op,
        tree=tree,
        root=None,
        placement=placement,
        group=group,
        out=out,
        options=options,
        transport=_transport,
    )


def reduce(
    x: Value,
    *,
    root: int = 0,
    op: OpArg = "sum",
    tree: Any = None,
    placement: Placement | None = None,
    group: Any = None,
    out: Value | None = None,
    options: CollectiveOptions | None = None,
    _transport: Any = None,
) -> Value | None:
    """Rank ``root`` gets ``x_0 op ... op x_{P-1}``: writes the result into `x` in place and returns it (on ``root``).

    Other ranks return None and their ``x`` is left unmodified. ``out=``: the result goes
    there on ``root`` and ``x`` is left unmodified. ``root`` is a group rank. See the
    module docstring (``options.algo`` does not apply: reduce runs a tree).
    """
    return _run(
        "reduce",
        x,
        op=op,
        tree=tree,
        root=root,
        placement=placement,
        group=group,
        out=out,
        options=options,
        transport=_transport,
    )


def broadcast(
    x: Value,
    *,
    root: int = 0,
    tree: Any = None,
    placement: Placement | None = None,
    group: Any = None,
    out: Value | None = None,
    options: CollectiveOptions | None = None,
    _transport: Any = None,
) -> Value:
    """Every rank gets group rank ``root``'s ``x``: writes the result into `x` in place and returns it.

    ``x`` needs the same shapes and dtypes on every rank. ``out=``: the result goes there
    and ``x`` is left unmodified. See the module docstring (``options.algo`` does not
    apply: broadcast runs a tree).
    """
    return _run(
        "broadcast",
        x,
        op="sum",
        tree=tree,
        root=root,
        placement=placement,
        group=group,
        out=out,
        options=options,
        transport=_transport,
    )
