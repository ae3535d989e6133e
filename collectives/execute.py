"""Run schedules over point-to-point transfers: ``reduce``, ``broadcast``, ``allreduce``.

Public API::

    reduce(x, *, root=0, op="sum", tree=None, group=None, out=None, nchunks=None, ...) -> value | None
    broadcast(x, *, root=0, tree=None, group=None, out=None, nchunks=None, ...) -> value
    allreduce(x, *, op="sum", tree=None, algo="auto", group=None, out=None, nchunks=None, ...) -> value
    run_schedule(schedule, layout, buf, op, transport, *, timeout, what) -> None

``x`` is a tensor of any dtype and shape or a tuple of tensors (one device);
the result has the same structure. Out of place by default (``x`` is left
untouched and a new value returned); ``out=`` receives the result (``out=x``
works in place, without copies for a single contiguous tensor). ``reduce``
returns the result on ``root`` and None elsewhere (``out`` on non-roots then
holds unspecified partial results). ``op``: a name in :data:`collectives.ops.OPS`
or a callable ``op(a, b)`` (associative; ``commutative=`` declares more, see
:mod:`collectives.ops`).

``tree``: a :class:`Tree` / :class:`MultiTree`, a builder name (``"binomial"``,
``"kary:4"``, ``"two_level"``, ...) or None / ``"auto"`` (least predicted
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
fail on the timeout, with the same error naming the peer.

Executor: scratch buffers (one message-sized buffer per scratch slot) are
kept between calls with the same layout (at most :data:`MAX_SCRATCH`), so a
repeated collective allocates nothing. Steps start in list order; a step first waits for its
dependencies (and for any send still reading, or receive still writing, the
chunk it touches); sends and receives are non-blocking ``isend``/``irecv``
with ``tag = chunk``. Reductions run in place on whole chunks (one call per
chunk: no per-element Python work).

Backends: tested on gloo (CPU). On NCCL every ``isend``/``irecv`` is its own
operation on the process group's stream; the schedules post receives before
the sends that depend on them and wait on a send only before overwriting its
buffer, but this path has not been run on GPUs here.
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

from topo.errors import CollectiveError, TreeError

from .builders import build
from .compile import compile_plan
from .layout import Layout
from .ops import Op, resolve_op
from .schedule import Schedule
from .tree import MultiTree, Tree, as_multi

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
    (:meth:`collectives.cost.CostModel.best_nchunks`: slow links want small
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
def _fail(what: str, s, r: int, err: BaseException, timeout: float) -> CollectiveError:
    verb = {"recv": "receiving", "send": "sending"}.get(s.kind, "waiting for")
    direction = "from" if s.kind == "recv" else "to"
    return CollectiveError(f"{what}: rank {r} failed {verb} chunk {s.chunk} {direction} rank {s.peer} "
                           f"within {timeout:g} s: {str(err).splitlines()[0] if str(err) else type(err).__name__}; "
                           f"the peer may have died, timed out, or called a different collective")


def run_schedule(schedule: Schedule, layout: Layout, buf, op: Op, transport, *, timeout: float,
                 what: str = "") -> None:
    """Run this rank's steps of ``schedule`` on ``buf`` (a buffer of ``layout``)."""
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
            try:
                for x in (w if isinstance(w, list) else (w,)):
                    transport.wait(x, timeout)
            except Exception as e:  # noqa: BLE001 - backend errors are RuntimeError, DistBackendError, ...
                raise _fail(what, steps[i], r, e, timeout) from e
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
            works[i] = _post(transport.isend, layout.chunk(buf, c), s.peer, c)
            sends[c].append(i)
        elif s.kind == "recv":
            if s.slot == 0:
                for j in sends.pop(c, ()):
                    wait(j)
            if (c, s.slot) in writes:
                wait(writes.pop((c, s.slot)))
            works[i] = _post(transport.irecv, layout.chunk(slot_buf(s.slot), c), s.peer, c)
            writes[(c, s.slot)] = i
        else:  # reduce
            if (c, s.slot) in writes:
                wait(writes.pop((c, s.slot)))
            if (c, 0) in writes:
                wait(writes.pop((c, 0)))
            for j in sends.pop(c, ()):
                wait(j)
            a = layout.values(buf, c)
            b = layout.values(slot_buf(s.slot), c)
            if reduce_fn is not None:
                if s.right or op.commutative:
                    reduce_fn(a, b)
                else:
                    reduce_fn(b, a)
                    a.copy_(b)
            else:
                res = op.fn(a, b) if s.right else op.fn(b, a)
                _store(a, res, what, op)
            done.add(i)
    for i in list(works):
        wait(i)


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
    """The Tree/MultiTree to use (cached): see the module docstring for the rules."""
    explicit = tree is not None and tree != "auto"
    if isinstance(tree, (Tree, MultiTree)):
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
                opts = {"nbytes": nbytes}
            if (root is not None and op.commutative and collective != "allreduce"
                    and name.partition(":")[0] in ("chain", "binomial", "kary", "star", "two_level")):
                opts["root"] = root      # rooted where the result goes: no extra hop
            plan = build(name, topology, ranks, nranks=None if topology is not None else nranks, **opts)
            _PLANS[key] = plan
    if as_multi(plan).size != nranks:
        raise TreeError(f"tree {getattr(plan, 'name', '')!r}: spans {as_multi(plan).size} ranks, "
                        f"the group has {nranks}")
    if not op.commutative and not plan.is_order_preserving():
        if explicit:
            raise TreeError(f"tree {plan.name or 'given'!r}: op {op.name!r} is not commutative, so the tree must "
                            f"be order preserving (every subtree a consecutive rank range, children ascending); "
                            f"use chain, binomial or kary, or declare commutative=True")
        raise TreeError(f"op {op.name!r}: no order-preserving tree found")  # pragma: no cover
    return plan


def _agree(transport, key: tuple, text: str, what: str, timeout: float) -> None:
    """Compare ``text`` across ranks once per (group, key); raise naming who differs."""
    full = (getattr(transport, "group_key", None), key)
    if full in _AGREED:
        return
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    payload = json.dumps({"h": digest, "d": text}).encode()
    if len(payload) > FINGERPRINT_BYTES:
        payload = json.dumps({"h": digest, "d": text[: FINGERPRINT_BYTES - 64] + "..."}).encode()
    try:
        got = transport.all_gather_bytes(payload, FINGERPRINT_BYTES, timeout)
    except Exception as e:  # noqa: BLE001
        raise CollectiveError(f"{what}: fingerprint exchange failed within {timeout:g} s: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}; a rank may have died, "
                              f"or ranks called different collectives") from e
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


def _run(collective: str, x, *, op, tree, algo: str, root: int | None, group, out, nchunks, topology, ranks,
         commutative, chunkable, timeout, check, transport):
    from .group import DEFAULT_TIMEOUT, TorchTransport, group_info
    if transport is None:
        info = group_info(group)
        transport = TorchTransport(info)
        transport.group_key = info.key
    timeout = float(timeout if timeout is not None else DEFAULT_TIMEOUT)
    # fast path: the same call shape again (a decode loop) skips planning, layout and agreement
    fkey = (collective, algo, root, nchunks, op if isinstance(op, str) else id(op), commutative, chunkable, tree if isinstance(tree, str) else id(tree),
            id(topology), tuple(ranks) if ranks is not None else None, getattr(transport, "group_key", None),
            transport.rank, transport.size, bool(check), _value_sig(x))
    hit = _FAST.get(fkey)
    if (hit is not None and (hit[0] is op or isinstance(op, str)) and (hit[1] is tree or isinstance(tree, str))
            and hit[2] is topology):
        opx, sched, layout, what = hit[3:]
    else:
        opx, sched, layout, what = _prepare(collective, x, op=op, tree=tree, algo=algo, root=root, nchunks=nchunks,
                                            topology=topology, ranks=ranks, commutative=commutative,
                                            chunkable=chunkable, timeout=timeout, check=check, transport=transport)
        if len(_FAST) >= MAX_FAST:
            _FAST.pop(next(iter(_FAST)))
        _FAST[fkey] = (op, tree, topology, opx, sched, layout, what)
    me = transport.rank
    inplace = out is not None and _same(out, x)
    if out is not None and not inplace:
        _, oparts = Layout.parts_of(out)
        for o, p in zip(oparts, Layout.parts_of(x)[1]):
            if o.shape != p.shape or o.dtype != p.dtype:
                raise CollectiveError(f"{what}: out expected shape {tuple(p.shape)} and dtype {p.dtype}, "
                                      f"got {tuple(o.shape)} and {o.dtype}")
    buf = layout.pack(x, reuse=inplace)
    run_schedule(sched, layout, buf, opx, transport, timeout=timeout, what=what)
    if collective == "reduce" and me != root:
        if out is not None and not inplace:
            layout.unpack(buf, out)
        return None
    if inplace and layout.direct and buf.data_ptr() == Layout.parts_of(x)[1][0].data_ptr():
        return x
    if inplace and isinstance(buf, tuple) and all(b.data_ptr() == p.data_ptr()
                                                  for b, p in zip(buf, Layout.parts_of(x)[1])):
        return x
    return layout.unpack(buf, out if out is not None else None)


def _prepare(collective: str, x, *, op, tree, algo, root, nchunks, topology, ranks, commutative, chunkable,
             timeout, check, transport):
    """(op, schedule, layout, label) for a call, after the ranks agreed on them (cached by the caller)."""
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
    if check:
        text = f"{sched.name}#{key[0]}/{sched.nchunks}/r{root}|{layout.descriptor()}|{opx.key()}"
        _agree(transport, ("v1", text), text, what, timeout)
    return opx, sched, layout, what


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
              timeout: float | None = None, check: bool = True, transport=None):
    """Every rank gets ``x_0 op x_1 op ... op x_{P-1}`` (group ranks). See the module docstring."""
    return _run("allreduce", x, op=op, tree=tree, algo=algo, root=None, group=group, out=out, nchunks=nchunks,
                topology=topology, ranks=ranks, commutative=commutative, chunkable=chunkable, timeout=timeout,
                check=check, transport=transport)


def reduce(x, *, root: int = 0, op="sum", tree=None, group=None, out=None, nchunks: int | None = None,
           topology=None, ranks=None, commutative: bool | None = None, chunkable: bool | None = None,
           timeout: float | None = None, check: bool = True, transport=None):
    """Group rank ``root`` gets ``x_0 op ... op x_{P-1}`` (returned there; None elsewhere)."""
    return _run("reduce", x, op=op, tree=tree, algo="tree", root=root, group=group, out=out, nchunks=nchunks,
                topology=topology, ranks=ranks, commutative=commutative, chunkable=chunkable, timeout=timeout,
                check=check, transport=transport)


def broadcast(x, *, root: int = 0, tree=None, group=None, out=None, nchunks: int | None = None, topology=None,
              ranks=None, timeout: float | None = None, check: bool = True, transport=None):
    """Every rank gets group rank ``root``'s ``x`` (same shapes and dtypes on every rank)."""
    return _run("broadcast", x, op="sum", tree=tree, algo="tree", root=root, group=group, out=out,
                nchunks=nchunks, topology=topology, ranks=ranks, commutative=None, chunkable=None,
                timeout=timeout, check=check, transport=transport)
