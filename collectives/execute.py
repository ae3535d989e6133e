"""Run schedules over point-to-point transfers: ``reduce``, ``broadcast``, ``allreduce``.

Public API::

    reduce(x, *, root=0, op="sum", tree=None, group=None, out=None, nchunks=None, ...) -> value | None
    broadcast(x, *, root=0, tree=None, group=None, out=None, nchunks=None, ...) -> value
    allreduce(x, *, op="sum", tree=None, algo="auto", group=None, out=None, nchunks=None, ...) -> value
    run_schedule(schedule, layout, buf, op, transport, *, timeout, what, tag_base) -> None

``x`` is a tensor of any dtype and shape or a tuple of tensors (one device);
the result has the same structure. **In place by default**, as
``torch.distributed.all_reduce`` / ``broadcast`` / ``reduce``: the result is
written into ``x`` and ``x`` is returned (no copy for a single contiguous
tensor; a non-contiguous ``x`` gets one copy in and out; an ``x`` whose
elements share memory, e.g. ``expand()``, is refused). ``out=`` writes the
result there instead and leaves ``x`` unmodified. ``reduce`` returns the result
on ``root`` and None elsewhere, where ``x`` (and ``out``) are left unmodified.
``op``: a name in :data:`treecoll.collectives.ops.OPS`
or a callable ``op(a, b)`` (associative; ``commutative=`` declares more, see
:mod:`treecoll.collectives.ops`). Collectives run under ``torch.no_grad()``.

``tree``: a :class:`Tree` / :class:`MultiTree`, a loaded tree file
(:class:`~collectives.tree_io.TreeFile`, one tree or several with shares), a
tree file path (``"tree.yaml"``, ``pathlib.Path``; read again when the file
changes), a builder name (``"binomial"``, ``"kary:4"``, ``"two_level"``, ...;
:func:`treecoll.collectives.tree_io.resolve_tree_arg` tells names from paths) or None /
``"auto"`` (least predicted
time for this size on ``topology``, or on a uniform switch when no topology is
given). ``algo`` (allreduce): ``"tree"``, ``"ring"`` (reduce-scatter +
all-gather on a ring, commutative operators), ``"rsag"`` (direct
reduce-scatter + all-gather: every rank sends and receives ``2 (P-1)/P`` of
the message, bandwidth optimal, for large messages), or ``"auto"`` (default):
the tree when one is given; else, for two ranks, ``"direct"`` (one
exchange, both fold in rank order) below :data:`AUTO_P2_RSAG_BYTES` and
``rsag`` from there (each rank then folds half the bytes); for more ranks
the tree below :data:`AUTO_RSAG_BYTES` and ``rsag`` from there (also ``"direct"``: every rank sends its whole value to
every other, one round). Plans and compiled schedules
are cached per (tree, sizes), so a repeated call costs the transfers only.

Non-commutative operators keep rank order (``x_0 op x_1 op ... op x_{P-1}``):
a tree chosen by treecoll (None, "auto") is then restricted to
order-preserving trees rooted at rank 0; an explicit tree (object or builder
name) that is not order preserving raises :class:`TreeError` (no silent
reshaping of a tree the user asked for); ``algo="ring"`` raises too.

Safety: before the first use of a (schedule, value layout, operator) in a
group, ranks exchange a fingerprint of all three (one small all_gather,
cached per group and fingerprint) and raise :class:`CollectiveError` naming
the ranks that disagree (a different tree, shape or dtype) instead of
hanging; every wait is bounded by ``timeout`` (seconds; default the
module's :data:`~collectives.group.DEFAULT_TIMEOUT`) and a peer that dies or
never arrives gives a :class:`CollectiveError` naming the collective, the
chunk and the peer. A rank that has already cached an agreement skips the
exchange; if another rank then arrives with a different layout, both sides
fail on the timeout, with the same error naming the peer (``check="always"``
exchanges on every call: such a mismatch then fails at once, for one small
all_gather per call). Messages carry a tag derived from the call's
fingerprint, so the transfers of two different call shapes never match each
other on backends that honour tags (gloo): a mismatch waits for the timeout,
never mixes data (NCCL ignores tags). ``check=False`` skips the exchange.

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
kept between calls with the same layout (at most :data:`MAX_SCRATCH`), so a
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
>>> res = run_ranks(3, lambda r, t: allreduce(xs[r], tree="chain", transport=t))
>>> xs[2].tolist(), res[2] is xs[2]
([6.0, 12.0], True)
>>> ys = [torch.ones(2) for _ in range(3)]
>>> outs = run_ranks(3, lambda r, t: allreduce(ys[r], out=torch.zeros(2), transport=t))
>>> ys[0].tolist(), outs[0].tolist()
([1.0, 1.0], [3.0, 3.0])

Backends: tested on gloo (CPU). On NCCL every ``isend``/``irecv`` is its own
operation on the process group's stream; the schedules post receives before
the sends that depend on them and wait on a send only before overwriting its
buffer, but this path has not been run on GPUs here.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections import defaultdict
from typing import Any

from treecoll.topo.errors import CollectiveError, TreecollError, TreeError

from .builders import build
from .compile import compile_plan
from .group import DEFAULT_TIMEOUT, TorchTransport, check_usable, group_info, mark_broken
from .layout import Layout
from .ops import Op, resolve_op
from .schedule import Schedule
from .tree import MultiTree, Tree, as_multi
from .tree_io import TreeFile, resolve_tree_arg

__all__ = ["reduce", "broadcast", "allreduce", "run_schedule", "plan_for", "default_nchunks", "nchunks_for",
           "AUTO_RSAG_BYTES", "AUTO_P2_RSAG_BYTES",
           "CHUNK_BYTES", "MAX_CHUNKS", "FINGERPRINT_BYTES"]

#: ``algo="auto"``: from this many bytes an allreduce without an explicit tree runs ``rsag``
AUTO_RSAG_BYTES = 256 << 10
#: two ranks: ``direct`` below this many bytes, ``rsag`` from here (measured on gloo,
#: docs/benchmarks.md "Collectives": at 16-64 MiB rsag 0.94-0.98x gloo, direct 1.13-1.30x).
AUTO_P2_RSAG_BYTES = 4 << 20
#: target bytes per chunk when ``nchunks`` is not given
CHUNK_BYTES = 1 << 20
#: most chunks used when ``nchunks`` is not given
MAX_CHUNKS = 16
#: bytes per rank in the fingerprint all_gather
FINGERPRINT_BYTES = 512

_PLANS: dict[Any, Any] = {}
#: scratch buffers kept between calls: (transport key, rank, layout signature, slot) -> tensor
_SCRATCH: dict[Any, Any] = {}
#: most scratch buffers kept (oldest dropped first)
MAX_SCRATCH = 64
_SCHEDULES: dict[Any, Schedule] = {}
#: per call shape: (op, tree, topology, resolved op, schedule, layout, label)
_FAST: dict[Any, tuple] = {}
MAX_FAST = 256
_AGREED: set = set()


def default_nchunks(nbytes: int) -> int:
    """Chunks for a tree collective on ``nbytes`` when the caller gives none: about
    :data:`CHUNK_BYTES` each (pipelining through the tree's levels), at most
    :data:`MAX_CHUNKS`. Ring and rsag use one chunk per segment (P chunks)."""
    return max(1, min(MAX_CHUNKS, nbytes // CHUNK_BYTES))


_NCHUNKS: dict = {}
#: smallest chunk :func:`nchunks_for` picks from the cost model: below it the
#: per-message cost of the transport (tens of µs with gloo, not in the model)
#: outweighs pipelining (NCCL's own tree chunks are of this order)
MIN_MODEL_CHUNK = 256 << 10


def nchunks_for(plan, collective: str, nbytes: int, *, topology=None, ranks=None) -> int:
    """Chunks for a tree collective when the caller gives none. With a topology:
    the count with the least time under the cost model
    (:meth:`treecoll.collectives.cost.CostModel.best_nchunks`: slow links want small
    chunks so that the pipeline fills fast, fast links fewer messages), cached
    per (plan, size, topology); without one, :func:`default_nchunks`."""
    if topology is None:
        return default_nchunks(nbytes)
    key = (plan.fingerprint(), collective, nbytes, topology.fingerprint(), tuple(ranks or ()))
    k = _NCHUNKS.get(key)
    if k is None:
        from .cost import CostModel
        gpus = list(ranks) if ranks else list(topology.rank_gpus())[:as_multi(plan).size]
        k = CostModel(topology, gpus).best_nchunks(plan, nbytes, collective, min_chunk_bytes=MIN_MODEL_CHUNK)[0]
        _NCHUNKS[key] = k
    return k


# ---------------------------------------------------------------------- the executor
def _brief(err: BaseException) -> str:
    """The first line of a backend error without its C++ source location prefix."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text)


def _fail(what: str, s, r: int, err: BaseException, timeout: float, elapsed: float) -> CollectiveError:
    verb = {"recv": "receiving", "send": "sending"}.get(s.kind, "waiting for")
    direction = "from" if s.kind == "recv" else "to"
    when = f"within {timeout:g} s" if elapsed >= 0.9 * timeout else f"after {elapsed:.2g} s (timeout {timeout:g} s)"
    return CollectiveError(f"{what}: rank {r} failed {verb} chunk {s.chunk} {direction} rank {s.peer} "
                           f"{when}: {_brief(err)}; "
                           f"the peer may have died, timed out, or called a different collective "
                           f"(another tree, shape, dtype or op)")


def run_schedule(schedule: Schedule, layout: Layout, buf, op: Op, transport, *, timeout: float,
                 what: str = "", tag_base: int = 0) -> None:
    """Run this rank's steps of ``schedule`` on ``buf`` (a buffer of ``layout``); the
    message of chunk c carries tag ``tag_base + c``. An operator's exception other than
    a :class:`~topo.errors.TreecollError` becomes a :class:`CollectiveError` naming it."""
    r = transport.rank
    what = what or schedule.name or schedule.collective
    steps = schedule.steps[r]
    works: dict[int, Any] = {}
    done: set[int] = set()
    sends = defaultdict(list)       # chunk -> step indices of sends in flight (reading buf[chunk])
    writes: dict[tuple[int, int], int] = {}   # (chunk, slot) -> recv step writing it
    scratch: dict[int, Any] = {}

    def wait(i: int) -> None:
        if i in done:
            return
        w = works.get(i)
        if w is not None:
            t0 = time.monotonic()
            try:
                for x in (w if isinstance(w, list) else (w,)):
                    transport.wait(x, timeout)
            except Exception as e:  # noqa: BLE001 - backend errors are RuntimeError, DistBackendError, ...
                raise _fail(what, steps[i], r, e, timeout, time.monotonic() - t0) from e
        done.add(i)

    sig = (getattr(transport, "group_key", None), r, layout.mode, layout.shapes, layout.dtypes, str(layout.device),
           layout.bounds)

    def slot_buf(slot: int):
        if slot == 0:
            return buf
        if slot not in scratch:
            key = sig + (slot,)
            t = _SCRATCH.get(key)
            if t is None:
                t = layout.new_buffer()
                if len(_SCRATCH) >= MAX_SCRATCH:
                    _SCRATCH.pop(next(iter(_SCRATCH)))
                _SCRATCH[key] = t
            scratch[slot] = t
        return scratch[slot]

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
        raise CollectiveError(f"{what}: op {op.name!r} raised {type(e).__name__} on rank {r} (chunk {c}): "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from e


def _post(fn, t, peer: int, tag: int):
    if isinstance(t, tuple):
        return [fn(x, peer, tag) for x in t if x.numel()]
    return fn(t, peer, tag)


def _store(dst, res, what: str, op: Op) -> None:
    import torch
    if isinstance(dst, tuple):
        if not isinstance(res, (tuple, list)) or len(res) != len(dst):
            raise CollectiveError(f"{what}: op {op.name!r} expected to return a tuple of {len(dst)} tensors, "
                                  f"got {type(res).__name__}")
        for d, v in zip(dst, res):
            if d.data_ptr() != v.data_ptr():
                d.copy_(v)
        return
    if not isinstance(res, torch.Tensor):
        raise CollectiveError(f"{what}: op {op.name!r} expected to return a tensor, got {type(res).__name__}")
    if res.data_ptr() != dst.data_ptr():
        if res.shape != dst.shape:
            raise CollectiveError(f"{what}: op {op.name!r} returned shape {tuple(res.shape)}, "
                                  f"expected {tuple(dst.shape)} (the operands' shape)")
        dst.copy_(res)


# ---------------------------------------------------------------------- plans and agreement
def plan_for(tree, *, collective: str, nbytes: int, nranks: int, op: Op, root: int | None = None,
             topology=None, ranks=None):
    """The Tree/MultiTree to use (cached): see the module docstring for the rules.
    ``tree`` is anything :func:`~collectives.tree_io.resolve_tree_arg` takes."""
    tree = resolve_tree_arg(tree)
    explicit = tree is not None and tree != "auto"
    label = ""
    if isinstance(tree, TreeFile):
        plan, label = tree.plan, f"{tree.source or 'tree file'}: "
        if tree.hosts is not None and topology is not None and tree.plan.size == nranks:
            from .cost import resolve_ranks
            tree.check_hosts(topology, resolve_ranks(topology, ranks, nranks)[1])
    elif isinstance(tree, (Tree, MultiTree)):
        plan = tree
    else:
        name = tree or "auto"
        key = (name, topology.fingerprint() if topology is not None else None, tuple(ranks or ()), nranks,
               nbytes if name in ("auto", "two_level") else None, collective,
               root if op.commutative else None, op.commutative)
        plan = _PLANS.get(key)
        if plan is None:
            opts: dict = {}
            if name == "auto":
                opts = {"nbytes": nbytes, "op": op, "collective": collective,
                        "root": root if op.commutative and collective != "allreduce" else None}
            elif name.partition(":")[0] == "two_level":
                opts = {"nbytes": nbytes, "collective": collective}
            if (root is not None and op.commutative and collective != "allreduce"
                    and name.partition(":")[0] in ("chain", "binomial", "kary", "star", "two_level")):
                opts["root"] = root      # rooted where the result goes: no extra hop
            plan = build(name, topology, ranks, nranks=None if topology is not None else nranks, **opts)
            _PLANS[key] = plan
    if as_multi(plan).size != nranks:
        raise TreeError(f"{label}tree {getattr(plan, 'name', '') or 'given'!r}: spans {as_multi(plan).size} ranks, "
                        f"the group has {nranks}; build it for {nranks} ranks")
    if not op.commutative and not plan.is_order_preserving():
        if explicit:
            raise TreeError(f"{label}tree {plan.name or 'given'!r}: op {op.name!r} is not commutative, so the tree "
                            f"must be order preserving (every subtree a consecutive rank range, children ascending); "
                            f"use chain, binomial or kary, or declare commutative=True")
        raise TreeError(f"op {op.name!r}: no order-preserving tree found")  # pragma: no cover
    return plan


def _agree(transport, text: str, what: str, timeout: float, *, cached: bool = True) -> None:
    """Compare ``text`` across ranks (once per (group, text) when ``cached``); raise naming who differs."""
    full = (getattr(transport, "group_key", None), text)
    if cached and full in _AGREED:
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
        err = CollectiveError(f"{what}: fingerprint exchange failed {when}: {_brief(e)}; a rank may have died, "
                              f"or ranks called different collectives")
        mark_broken(getattr(transport, "group_key", None), str(err))
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
        raise CollectiveError(f"{what}: ranks disagree on the collective (tree, shapes, dtypes, op): "
                        f"ranks {odd} differ from rank {transport.rank}; {detail}")
    _AGREED.add(full)


# ---------------------------------------------------------------------- public collectives
def _nbytes(value) -> int:
    _, parts = Layout.parts_of(value)
    return sum(p.numel() * p.element_size() for p in parts)


def _value_sig(x) -> tuple:
    _, parts = Layout.parts_of(x)
    return (isinstance(x, (tuple, list)),) + tuple((tuple(p.shape), p.dtype, p.device) for p in parts)


def _check_args(collective: str, root, nchunks, timeout, check) -> float:
    """Validate the plain arguments (before any cache); the timeout in seconds."""
    what = collective if root is None else f"{collective}(root={root!r})"
    if root is not None and (isinstance(root, bool) or not isinstance(root, int)):
        raise CollectiveError(f"{what}: root expected an integer group rank, got {type(root).__name__} {root!r}")
    if nchunks is not None and (isinstance(nchunks, bool) or not isinstance(nchunks, int) or nchunks < 1):
        raise CollectiveError(f"{what}: nchunks expected a positive integer or None (chosen per size), got {nchunks!r}")
    if check not in (True, False, "always"):
        raise CollectiveError(f"{what}: check expected True, False or 'always', got {check!r}")
    t = DEFAULT_TIMEOUT if timeout is None else timeout
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t > 0 and math.isfinite(t)):
        raise CollectiveError(f"{what}: timeout expected a positive number of seconds, got {timeout!r}")
    return float(t)


def _run(collective: str, x, *, op, tree, algo: str, root: int | None, group, out, nchunks, topology, ranks,
         commutative, chunkable, timeout, check, transport):
    timeout = _check_args(collective, root, nchunks, timeout, check)
    if transport is None:
        info = group_info(group)
        transport = TorchTransport(info)
        transport.group_key = info.key
    gkey = getattr(transport, "group_key", None)
    check_usable(gkey, collective if root is None else f"{collective}(root={root})")
    if not (tree is None or isinstance(tree, (Tree, MultiTree))):
        tree = resolve_tree_arg(tree)     # a path: read again only when the file changed
    # fast path: the same call shape again (a decode loop) skips planning, layout and probing
    fkey = (collective, algo, root, nchunks, op if isinstance(op, str) else id(op), commutative, chunkable,
            tree if isinstance(tree, str) else id(tree), id(topology), tuple(ranks) if ranks is not None else None,
            gkey, transport.rank, transport.size, bool(check), _value_sig(x))
    hit = _FAST.get(fkey)
    if (hit is not None and (hit[0] is op or isinstance(op, str)) and (hit[1] is tree or isinstance(tree, str))
            and hit[2] is topology):
        prep = hit[3]
    else:
        prep = _prepare(collective, x, op=op, tree=tree, algo=algo, root=root, nchunks=nchunks, topology=topology,
                        ranks=ranks, commutative=commutative, chunkable=chunkable, check=check, transport=transport)
        if len(_FAST) >= MAX_FAST:
            _FAST.pop(next(iter(_FAST)))
        _FAST[fkey] = (op, tree, topology, prep)
    opx, sched, layout, what, text, tag_base, problem = prep
    me = transport.rank
    inplace = out is None or _same(out, x)
    if inplace:
        _check_writable(x, what)
    else:
        _check_out(out, x, what)
    if check:
        _agree(transport, text, what, timeout, cached=check != "always")
    if problem:
        raise CollectiveError(f"{what}: {problem}")
    import torch
    with torch.no_grad():
        keep_x = not inplace or (collective == "reduce" and me != root and _writes_own(sched, me))
        buf = layout.pack(x, reuse=not keep_x)
        try:
            run_schedule(sched, layout, buf, opx, transport, timeout=timeout, what=what, tag_base=tag_base)
        except BaseException as e:
            mark_broken(gkey, str(e).splitlines()[0] if str(e) else type(e).__name__)
            raise
        if collective == "reduce" and me != root:
            return None
        return layout.unpack(buf, x if inplace else out)


def _writes_own(sched: Schedule, rank: int) -> bool:
    """True when ``rank``'s steps write its own buffer (a reduce, or a receive into slot 0)."""
    return any(s.kind == "reduce" or (s.kind == "recv" and s.slot == 0) for s in sched.steps[rank])


def _check_writable(x, what: str) -> None:
    for i, p in enumerate(Layout.parts_of(x)[1]):
        if not p.is_contiguous() and any(st == 0 and n > 1 for st, n in zip(p.stride(), p.shape)):
            where = f"x[{i}]" if isinstance(x, (tuple, list)) else "x"
            raise CollectiveError(f"{what}: {where} cannot take the result in place: elements share memory "
                                  f"(shape {tuple(p.shape)}, stride {tuple(p.stride())}, e.g. from expand()); "
                                  f"pass out= or a clone()")


def _check_out(out, x, what: str) -> None:
    _, oparts = Layout.parts_of(out)
    _, xparts = Layout.parts_of(x)
    if len(oparts) != len(xparts):
        raise CollectiveError(f"{what}: out expected {len(xparts)} tensors like x, got {len(oparts)}")
    for o, p in zip(oparts, xparts):
        if o.shape != p.shape or o.dtype != p.dtype or o.device != p.device:
            raise CollectiveError(f"{what}: out expected shape {tuple(p.shape)}, dtype {p.dtype} and device "
                                  f"{p.device}, got {tuple(o.shape)}, {o.dtype} and {o.device}")
    _check_writable(out, what)


def _prepare(collective: str, x, *, op, tree, algo, root, nchunks, topology, ranks, commutative, chunkable,
             check, transport):
    """(op, schedule, layout, label, agreement text, tag base, problem) for a call (cached by the caller);
    ``problem`` is what the associativity probe found ('' when nothing)."""
    opx = resolve_op(op, commutative=commutative, chunkable=chunkable)
    n = transport.size
    what = f"{collective}" if root is None else f"{collective}(root={root})"
    if root is not None and not 0 <= root < n:
        raise CollectiveError(f"{what}: root expected a group rank in 0..{n - 1}, got {root}")
    nbytes = _nbytes(x)
    if algo == "auto":
        explicit = tree is not None and tree != "auto"
        if collective == "allreduce" and not explicit and n == 2 and nbytes < AUTO_P2_RSAG_BYTES:
            algo = "direct"    # two ranks: one exchange, both fold in rank order (one round, n bytes each way)
        else:
            algo = "rsag" if collective == "allreduce" and not explicit and nbytes >= AUTO_RSAG_BYTES else "tree"
    if algo not in ("tree", "ring", "rsag", "direct"):
        raise CollectiveError(f"{what}: algo expected one of ['auto', 'tree', 'ring', 'rsag', 'direct'], "
                              f"got {algo!r}")
    if algo != "tree":
        if collective != "allreduce":
            raise CollectiveError(f"{what}: algo {algo!r} implements allreduce only; use algo='tree'")
        if algo == "ring" and not opx.commutative:
            raise CollectiveError(f"{what}: algo 'ring' needs a commutative op, got {opx.name!r}; "
                                  f"use algo='rsag' or 'tree', or declare commutative=True")
        plan = None
    else:
        plan = plan_for(tree, collective=collective, nbytes=nbytes, nranks=n, op=opx, root=root,
                        topology=topology, ranks=ranks)
    if nchunks is not None:
        k = int(nchunks)
    elif algo == "direct":
        k = 1
    elif plan is None:   # ring / rsag: one chunk per segment (more messages only add overhead there)
        k = n
    else:
        k = nchunks_for(plan, collective, nbytes, topology=topology, ranks=ranks)
    ntrees = len(as_multi(plan)) if plan is not None else (1 if algo == "direct" else n)
    probe = Layout.of(x, opx, [1.0])
    per = max(1, min(k, probe.max_chunks // max(ntrees, 1)))
    key = (plan.fingerprint() if plan is not None else algo, collective, per, root, algo, n)
    sched = _SCHEDULES.get(key)
    if sched is None:
        sched = compile_plan(plan, collective, per, root=root, algo=algo, nranks=n)
        _SCHEDULES[key] = sched
    layout = Layout.of(x, opx, sched.shares)
    problem = _associativity_problem(opx, layout) if check else ""
    text = f"{sched.name}#{key[0]}/{sched.nchunks}/r{root}|{layout.descriptor()}|{opx.key()}|a{int(not problem)}"
    digest = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    tag_base = ((digest & 0x7FFF) << TAG_CHUNK_BITS) if sched.nchunks < (1 << TAG_CHUNK_BITS) else 0
    return opx, sched, layout, what, text, tag_base, problem


#: low bits of a message tag that carry the chunk; the bits above carry a hash of the call's fingerprint
TAG_CHUNK_BITS = 16
#: operators probed for associativity: (operator identity, value layout) -> problem ('' when none)
_PROBED: dict[Any, str] = {}
#: most elements of one probe operand (larger rows are not probed)
PROBE_ELEMENTS = 1 << 14


def _associativity_problem(op: Op, layout: Layout) -> str:
    """'' when ``op`` is built in, declares ``associative = True``, or gives ``(a op b) op c``
    equal to ``a op (b op c)`` (to the dtype's precision) on three seeded random values of
    the structure the executor passes it (the first two rows of every part); else what
    differed. An operator that raises on such values is not judged ('')."""
    if op.elementwise or getattr(op.fn, "associative", None) is True:
        return ""
    try:
        ident = hash(op.fn)
    except TypeError:
        ident = id(op.fn)
    key = (ident, layout.shapes, layout.dtypes, layout.split)
    hit = _PROBED.get(key)
    if hit is None:
        hit = _probe(op, layout)
        if len(_PROBED) >= 256:
            _PROBED.pop(next(iter(_PROBED)))
        _PROBED[key] = hit
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
            return (f"op {op.name!r} is not associative: (a op b) op c and a op (b op c) differ by {worst:.3g} "
                    f"(relative) on random values of the value's structure, so the result would depend on "
                    f"the tree; use an associative operator (e.g. carry sums and counts instead of averages), "
                    f"or set fn.associative = True to skip this probe")
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


def allreduce(x, *, op="sum", tree=None, algo: str = "auto", group=None, out=None, nchunks: int | None = None,
              topology=None, ranks=None, commutative: bool | None = None, chunkable: bool | None = None,
              timeout: float | None = None, check: bool | str = True, transport=None):
    """Every rank gets ``x_0 op x_1 op ... op x_{P-1}``: writes the result into `x` in place and returns it.

    ``out=``: the result goes there and ``x`` is left unmodified. ``tree``: a Tree,
    MultiTree, loaded tree file, tree file path or builder name. See the module docstring.
    """
    return _run("allreduce", x, op=op, tree=tree, algo=algo, root=None, group=group, out=out, nchunks=nchunks,
                topology=topology, ranks=ranks, commutative=commutative, chunkable=chunkable, timeout=timeout,
                check=check, transport=transport)


def reduce(x, *, root: int = 0, op="sum", tree=None, group=None, out=None, nchunks: int | None = None,
           topology=None, ranks=None, commutative: bool | None = None, chunkable: bool | None = None,
           timeout: float | None = None, check: bool | str = True, transport=None):
    """Rank ``root`` gets ``x_0 op ... op x_{P-1}``: writes the result into `x` in place and returns it (on ``root``).

    Other ranks return None and their ``x`` is left unmodified. ``out=``: the result goes
    there on ``root`` and ``x`` is left unmodified. See the module docstring.
    """
    return _run("reduce", x, op=op, tree=tree, algo="tree", root=root, group=group, out=out, nchunks=nchunks,
                topology=topology, ranks=ranks, commutative=commutative, chunkable=chunkable, timeout=timeout,
                check=check, transport=transport)


def broadcast(x, *, root: int = 0, tree=None, group=None, out=None, nchunks: int | None = None, topology=None,
              ranks=None, timeout: float | None = None, check: bool | str = True, transport=None):
    """Every rank gets group rank ``root``'s ``x``: writes the result into `x` in place and returns it.

    ``x`` needs the same shapes and dtypes on every rank. ``out=``: the result goes there
    and ``x`` is left unmodified. See the module docstring.
    """
    return _run("broadcast", x, op="sum", tree=tree, algo="tree", root=root, group=group, out=out,
                nchunks=nchunks, topology=topology, ranks=ranks, commutative=None, chunkable=None,
                timeout=timeout, check=check, transport=transport)
