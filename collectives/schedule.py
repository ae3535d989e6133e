"""Schedules: what a tree, a ring or an imported algorithm compiles to.

A :class:`Schedule` lists, for every rank, an ordered tuple of :class:`Step`.
The executor (:mod:`treecoll.collectives.execute`) runs it over torch.distributed
point-to-point operations and the simulator (:mod:`treecoll.collectives.sim`) predicts
it on a topology, so what is simulated is what runs.

Data model
----------
The message (a tensor, or the flat concatenation of a tuple of tensors) is
split into ``nchunks`` chunks; chunk ``c`` carries ``shares[c]`` of the bytes
(equal shares by default). Each rank owns a *buffer* holding its own value of
every chunk, and per chunk numbered *scratch slots* (``slot >= 1``), each
holding one received copy of that chunk until it is reduced (an executor
allocates them lazily and may reuse their memory once reduced; the simulator
reports the peak).

Steps (``kind``):

* ``send``: send the buffer's chunk ``chunk`` to ``peer``.
* ``recv``: receive chunk ``chunk`` from ``peer``; ``slot == 0`` overwrites the
  buffer's chunk (broadcast, all-gather), ``slot >= 1`` lands in scratch slot
  ``slot`` of that chunk (to be reduced).
* ``reduce``: ``buf[chunk] = buf[chunk] op scratch[slot]`` when ``right`` (the
  received operand on the right), else ``scratch[slot] op buf[chunk]``.

``deps`` are indices of earlier steps of the same rank that must be complete
before the step starts. Sends are non-blocking and a recv completes once the
matching send has been issued: the k-th send from r to p of chunk c matches
the k-th recv at p from r of chunk c. Steps of one rank start in list order
as soon as their dependencies allow (an executor may overlap independent
steps, never reorder dependent ones). ``lane`` splits a rank's steps into
independent in-order streams: a compiled tree allreduce puts tree ``t``'s
reduce-up in lane ``2 t`` and its broadcast-down in lane ``2 t + 1``, as
NCCL runs each tree on its own channels and the two phases in separate
thread groups (``runTreeSplit``, src/device/all_reduce.h). treecoll's executor runs all lanes in list order
(one valid interleaving); the simulator can run lanes concurrently.

>>> s = Schedule("reduce", 2, 1, ((Step("recv", 0, peer=1, slot=1), Step("reduce", 0, slot=1, deps=(0,))),
...                              (Step("send", 0, peer=0),)), root=0)
>>> s.bytes_sent(1, 1024), s.bytes_sent(0, 1024)
(1024, 0)
>>> Schedule("reduce", 2, 1, ((Step("recv", 0, peer=1, slot=1),), ()), root=0)
Traceback (most recent call last):
...
treecoll.topo.errors.ScheduleError: schedule 'reduce': rank 0 step 0 recv of chunk 0 from rank 1 has no matching send
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from treecoll.topo.errors import ScheduleError

__all__ = ["Step", "Schedule", "COLLECTIVES", "STEP_KINDS", "trusted_step", "with_peers"]

COLLECTIVES = ("reduce", "broadcast", "allreduce", "reduce_scatter", "allgather")
STEP_KINDS = ("send", "recv", "reduce")


@dataclass(frozen=True)
class Step:
    """One step of one rank; see the module docstring for the semantics."""

    kind: str
    chunk: int
    peer: int = -1
    slot: int = 0
    deps: tuple[int, ...] = ()
    right: bool = True
    lane: int = 0

    def __post_init__(self):
        if self.kind not in STEP_KINDS:
            raise ScheduleError(f"step kind: expected one of {list(STEP_KINDS)}, got {self.kind!r}")
        if isinstance(self.lane, bool) or not isinstance(self.lane, int) or self.lane < 0:
            raise ScheduleError(f"step lane: expected an integer >= 0, got {self.lane!r}")
        object.__setattr__(self, "deps", tuple(self.deps))


_new_object = object.__new__
_set_attr = object.__setattr__


def trusted_step(kind: str, chunk: int, peer: int, slot: int, deps: tuple[int, ...], right: bool, lane: int) -> Step:
    """A :class:`Step` equal to ``Step(kind, chunk, peer, slot, deps, right, lane)`` built without
    :meth:`Step.__post_init__`'s checks (about 2.5x faster): for compilers whose steps are valid by
    construction (``kind`` one of :data:`STEP_KINDS`, ``lane`` an int >= 0, ``deps`` a tuple). The
    :class:`Schedule` that holds it still checks every step.

    >>> trusted_step("send", 0, 1, 0, (), True, 0) == Step("send", 0, peer=1)
    True
    """
    s = _new_object(Step)
    _set_attr(
        s,
        "__dict__",
        {"kind": kind, "chunk": chunk, "peer": peer, "slot": slot, "deps": deps, "right": right, "lane": lane},
    )
    return s


def with_peers(template: Sequence[Step], table: Sequence[int], base: int) -> list[Step]:
    """``template`` with every peer ``p >= base`` (a stand-in) replaced by ``table[p - base]``, built as
    :func:`trusted_step` builds steps (the template's steps are valid, the table's peers ranks); the
    steps without a stand-in are the template's own objects (steps are immutable).

    >>> steps = with_peers([Step("recv", 0, peer=5, slot=1), Step("reduce", 0, slot=1, deps=(0,))], [2], 5)
    >>> [(s.kind, s.peer) for s in steps]
    [('recv', 2), ('reduce', -1)]
    """
    out = []
    put = out.append
    for s in template:
        p = s.peer
        if p < base:
            put(s)
            continue
        fields = s.__dict__.copy()
        fields["peer"] = table[p - base]
        step = _new_object(Step)
        _set_attr(step, "__dict__", fields)
        put(step)
    return out


@dataclass(frozen=True)
class Schedule:
    """Per-rank step lists for one collective; validated when built.

    Attributes
    ----------
    collective: one of ``reduce``, ``broadcast``, ``allreduce``,
        ``reduce_scatter``, ``allgather``.
    nranks: P.
    nchunks: number of chunks the message is split into.
    steps: ``steps[r]`` is rank r's ordered steps.
    root: the root rank for reduce/broadcast, ``-1`` otherwise.
    shares: fraction of the message in each chunk (sums to 1); equal by default.
    name: what it was compiled from (e.g. ``"two_level/reduce"``).
    owners: for ``reduce_scatter``, ``owners[c]`` is the rank holding the
        reduced chunk c at the end (empty otherwise).
    """

    collective: str
    nranks: int
    nchunks: int
    steps: tuple[tuple[Step, ...], ...]
    root: int = -1
    shares: tuple[float, ...] = ()
    name: str = field(default="", compare=False)
    owners: tuple[int, ...] = ()

    def __post_init__(self):
        what = self._check_header()
        self._check_steps(what)
        self._check_progress(what)

    @classmethod
    def trusted(
        cls,
        collective: str,
        nranks: int,
        nchunks: int,
        steps: tuple[tuple[Step, ...], ...],
        *,
        root: int = -1,
        shares: tuple[float, ...] = (),
        name: str = "",
        owners: tuple[int, ...] = (),
    ) -> Schedule:
        """A :class:`Schedule` equal to ``Schedule(...)`` of the same arguments whose fields are checked
        but not its steps (their fields, the matching of sends and receives, progress): for a
        compiler that checks what it builds itself, more cheaply than step by step
        (:func:`treecoll.collectives.compile.compile_allreduce` checks each distinct rank program
        and each tree edge's messages). ``steps``: a tuple of tuples, as the fields keep it.

        >>> s = Schedule.trusted("broadcast", 2, 1, ((Step("send", 0, peer=1),), (Step("recv", 0, peer=0),)), root=0)
        >>> s == Schedule("broadcast", 2, 1, ((Step("send", 0, peer=1),), (Step("recv", 0, peer=0),)), root=0)
        True
        """
        self = object.__new__(cls)
        for key, value in (
            ("collective", collective),
            ("nranks", nranks),
            ("nchunks", nchunks),
            ("steps", steps),
            ("root", root),
            ("shares", shares),
            ("name", name),
            ("owners", owners),
        ):
            object.__setattr__(self, key, value)
        self._check_header()
        return self

    def _check_header(self) -> str:
        """Check every field but the steps' contents (normalised: ``steps`` tuples, default ``shares``);
        the name of the schedule for messages."""
        steps = self.steps if isinstance(self.steps, tuple) else tuple(tuple(s) for s in self.steps)
        if not all(type(lst) is tuple for lst in steps):
            steps = tuple(tuple(s) for s in steps)
        object.__setattr__(self, "steps", steps)
        what = f"schedule {self.name or self.collective!r}"
        if self.collective not in COLLECTIVES:
            raise ScheduleError(f"{what}: collective expected one of {list(COLLECTIVES)}, got {self.collective!r}")
        if self.nranks < 1 or len(steps) != self.nranks:
            raise ScheduleError(f"{what}: expected step lists for {self.nranks} ranks, got {len(steps)}")
        if self.nchunks < 1:
            raise ScheduleError(f"{what}: nchunks expected >= 1, got {self.nchunks}")
        shares = tuple(self.shares) or tuple([1.0 / self.nchunks] * self.nchunks)
        if len(shares) != self.nchunks or any(s < 0 for s in shares) or abs(sum(shares) - 1.0) > 1e-9:
            raise ScheduleError(
                f"{what}: shares expected {self.nchunks} non-negative fractions summing to 1, got {list(shares)[:8]}"
            )
        object.__setattr__(self, "shares", shares)
        if self.collective in ("reduce", "broadcast") and not 0 <= self.root < self.nranks:
            raise ScheduleError(f"{what}: a {self.collective} needs a root in 0..{self.nranks - 1}, got {self.root}")
        return what

    # ------------------------------------------------------------------ validation
    def _check_steps(self, what: str) -> None:
        """Every step's fields in range and every send matched by one recv: a fast pass that only
        counts; on any fault :meth:`_explain_steps` finds the first and names it."""
        sends: dict[tuple[int, int, int], int] = {}
        recvs: dict[tuple[int, int, int], int] = {}
        nchunks, nranks = self.nchunks, self.nranks
        ok = True
        for r, lst in enumerate(self.steps):
            for i, s in enumerate(lst):
                c, slot, kind = s.chunk, s.slot, s.kind
                if not 0 <= c < nchunks or slot < 0:
                    ok = False
                for d in s.deps:
                    if not 0 <= d < i:
                        ok = False
                if kind == "reduce":
                    if slot == 0:
                        ok = False
                    continue
                p = s.peer
                if not 0 <= p < nranks or p == r:
                    ok = False
                elif kind == "send":
                    key = (r, p, c)
                    sends[key] = sends.get(key, 0) + 1
                else:
                    key = (p, r, c)
                    recvs[key] = recvs.get(key, 0) + 1
            if not ok:
                break
        if not ok or sends != recvs:
            self._explain_steps(what)

    def _explain_steps(self, what: str) -> None:
        """Raise the :class:`ScheduleError` of the first faulty step or unmatched message."""
        sends: dict[tuple[int, int, int], int] = defaultdict(int)
        recvs: dict[tuple[int, int, int], list[tuple[int, int]]] = defaultdict(list)
        nchunks, nranks = self.nchunks, self.nranks
        for r, lst in enumerate(self.steps):
            for i, s in enumerate(lst):
                if not 0 <= s.chunk < nchunks:
                    raise ScheduleError(f"{what}: rank {r} step {i}: chunk expected 0..{nchunks - 1}, got {s.chunk}")
                for d in s.deps:
                    if not 0 <= d < i:
                        raise ScheduleError(
                            f"{what}: rank {r} step {i}: dependency {d} must be an earlier step (0..{i - 1})"
                        )
                kind = s.kind
                if kind != "reduce":
                    if not 0 <= s.peer < nranks or s.peer == r:
                        raise ScheduleError(
                            f"{what}: rank {r} step {i}: peer expected another rank in 0..{nranks - 1}, got {s.peer}"
                        )
                    if kind == "send":
                        sends[(r, s.peer, s.chunk)] += 1
                    else:
                        recvs[(s.peer, r, s.chunk)].append((r, i))
                if s.slot < 0 or (kind == "reduce" and s.slot == 0):
                    raise ScheduleError(
                        f"{what}: rank {r} step {i}: a {kind} slot must be "
                        f"{'>= 1' if kind == 'reduce' else '>= 0'}, got {s.slot}"
                    )
        for key, lst in recvs.items():
            if len(lst) > sends.get(key, 0):
                r, i = lst[sends.get(key, 0)]
                raise ScheduleError(
                    f"{what}: rank {r} step {i} recv of chunk {key[2]} from rank {key[0]} has no matching send"
                )
        for key, n in sends.items():
            if n > len(recvs.get(key, ())):
                raise ScheduleError(
                    f"{what}: rank {key[0]} sends chunk {key[2]} to rank {key[1]} {n} time(s) "
                    f"but rank {key[1]} receives it {len(recvs.get(key, ()))} time(s)"
                )

    def _check_progress(self, what: str) -> None:
        """Every step completes (no circular wait) under the executor's rules: a rank
        starts its steps in list order, each once its dependencies are complete;
        sends and reduces complete when started (eager sends); the k-th recv of a
        chunk from a peer completes once the peer has started its k-th send of it."""
        ordinal: list[list[int]] = []  # per step: k for the k-th recv of its (peer, rank, chunk), else -1
        nrecv: dict[tuple[int, int, int], int] = {}
        for r, lst in enumerate(self.steps):
            o: list[int] = []
            put = o.append
            for s in lst:
                if s.kind == "recv":
                    key = (s.peer, r, s.chunk)
                    k = nrecv.get(key, 0)
                    put(k)
                    nrecv[key] = k + 1
                else:
                    put(-1)
            ordinal.append(o)
        started = [0] * self.nranks
        issued: dict[tuple[int, int, int], int] = defaultdict(int)

        def complete(r: int, i: int) -> bool:
            s = self.steps[r][i]
            return s.kind != "recv" or issued[(s.peer, r, s.chunk)] > ordinal[r][i]

        # worklist: a rank runs until a dependency is an incomplete recv, then waits on that
        # (peer, rank, chunk) key until the peer issues a send of it (linear in the steps)
        waiters: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        todo = list(range(self.nranks - 1, -1, -1))
        while todo:
            r = todo.pop()
            lst = self.steps[r]
            o = ordinal[r]
            i = started[r]
            while i < len(lst):
                s = lst[i]
                blocked = None
                for d in s.deps:
                    sd = lst[d]
                    if sd.kind == "recv" and issued[(sd.peer, r, sd.chunk)] <= o[d]:
                        blocked = (sd.peer, r, sd.chunk)
                        break
                if blocked is not None:
                    waiters[blocked].append(r)
                    break
                if s.kind == "send":
                    key = (r, s.peer, s.chunk)
                    issued[key] += 1
                    w = waiters.pop(key, None)
                    if w:
                        todo.extend(w)
                i += 1
            started[r] = i
        if all(started[r] == len(lst) for r, lst in enumerate(self.steps)):
            # every step started, so every send issued: each recv's k-th send exists (_check_steps
            # matched the counts), so every recv completes
            return
        waiting = [
            (r, i)
            for r in range(self.nranks)
            for i in range(len(self.steps[r]))
            if i >= started[r] or not complete(r, i)
        ]
        if waiting:
            r, i = waiting[0]
            s = self.steps[r][i]
            if i < started[r]:
                i2, s2 = i, s
            else:
                i2 = next(d for d in s.deps if not complete(r, d))
                s2 = self.steps[r][i2]
            raise ScheduleError(
                f"{what}: deadlock: rank {r} waits forever at step {i2} "
                f"({s2.kind} chunk {s2.chunk} from rank {s2.peer})"
            )

    # ------------------------------------------------------------------ accounting
    def chunk_bytes(self, nbytes: int) -> tuple[int, ...]:
        """Bytes in each chunk for a message of ``nbytes`` (integer split, sums to nbytes)."""
        sizes = [int(nbytes * s) for s in self.shares]
        sizes[-1] += nbytes - sum(sizes)
        return tuple(sizes)

    def bytes_sent(self, rank: int, nbytes: int) -> int:
        """Bytes rank ``rank`` sends for a message of ``nbytes``."""
        cb = self.chunk_bytes(nbytes)
        return sum(cb[s.chunk] for s in self.steps[rank] if s.kind == "send")

    def bytes_received(self, rank: int, nbytes: int) -> int:
        """Bytes rank ``rank`` receives for a message of ``nbytes``."""
        cb = self.chunk_bytes(nbytes)
        return sum(cb[s.chunk] for s in self.steps[rank] if s.kind == "recv")

    def max_slots(self, rank: int) -> int:
        """Number of distinct scratch slots rank ``rank`` uses."""
        return len({s.slot for s in self.steps[rank] if s.kind == "recv" and s.slot > 0})

    def pair_order_conflict(self) -> tuple[int, int, int, int] | None:
        """The first ``(sender, receiver, sent chunk, received chunk)`` where the chunks ``sender``
        sends to ``receiver``, in its step order, differ from the chunks ``receiver`` receives from
        ``sender``, in its; None when every pair agrees. A transport that matches a pair's messages
        in the order they are posted and ignores tags (NCCL) runs only a schedule without such a
        conflict; one that matches by tag (gloo, MPI) runs both.

        >>> s = Schedule("allgather", 2, 2, ((Step("send", 0, peer=1), Step("send", 1, peer=1)),
        ...     (Step("recv", 1, peer=0), Step("recv", 0, peer=0))))
        >>> s.pair_order_conflict()
        (0, 1, 0, 1)
        """
        sends: dict[tuple[int, int], list[int]] = defaultdict(list)
        recvs: dict[tuple[int, int], list[int]] = defaultdict(list)
        for r, lst in enumerate(self.steps):
            for st in lst:
                if st.kind == "send":
                    sends[(r, st.peer)].append(st.chunk)
                elif st.kind == "recv":
                    recvs[(st.peer, r)].append(st.chunk)
        for pair in sorted(sends):
            a, b = sends[pair], recvs[pair]
            if a != b:
                i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
                return pair[0], pair[1], a[i], b[i]
        return None

    def as_dict(self) -> dict:
        """Plain data (JSON-able)."""
        return {
            "name": self.name,
            "collective": self.collective,
            "nranks": self.nranks,
            "nchunks": self.nchunks,
            "root": self.root,
            "shares": list(self.shares),
            "owners": list(self.owners),
            "steps": [
                [
                    {
                        "kind": s.kind,
                        "chunk": s.chunk,
                        "peer": s.peer,
                        "slot": s.slot,
                        "deps": list(s.deps),
                        "right": s.right,
                        "lane": s.lane,
                    }
                    for s in lst
                ]
                for lst in self.steps
            ],
        }
