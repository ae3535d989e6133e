"""Process groups: the ONE place where group-local ranks become global ranks.

Inside treecoll every rank is group-local (``0..P-1``). :func:`group_info`
looks a ``torch.distributed`` process group up (``None`` = the default group)
and returns its :class:`GroupInfo`: this process's group rank, the size, and
the translation of a group rank to the global rank that ``isend``/``irecv``
take (and back). The executor and the attention decoders all use it.

What treecoll remembers about a group (its :class:`GroupInfo`, a failed
collective) is kept in weak mappings keyed on the group object: it goes with
the group and never keeps a destroyed group alive.

A group in which a collective failed is unusable (transfers of the failed
call may still be posted and would match later ones): :func:`mark_broken`
records the first failure per communicator and :func:`check_usable` raises it
at once on every later call, saying what to do:

>>> from treecoll.collectives.local import LocalFabric
>>> fabric = LocalFabric(2)
>>> mark_broken(fabric, "allreduce: rank 0 failed receiving chunk 0 from rank 1 after 0.01 s: closed")
>>> check_usable(fabric, "reduce(root=0)")
Traceback (most recent call last):
...
treecoll.topo.errors.CollectiveError: reduce(root=0): the process group is unusable: ...; destroy it ...
>>> check_usable(LocalFabric(2), "reduce(root=0)")    # another communicator: fine
>>> GroupInfo(1, 3, (4, 5, 6), "gloo").to_global(2), GroupInfo(1, 3, (4, 5, 6), "gloo").to_local(4)
(6, 0)

A :class:`Transport` moves chunk tensors between group ranks: the real one
is :class:`TorchTransport` (``torch.distributed.isend``/``irecv``: gloo,
NCCL, any backend); tests use an in-process one (see
:mod:`treecoll.collectives.local`) with the same interface: ``rank``,
``size``, ``comm`` (the communicator object that per-group state is keyed on,
or None), ``isend``, ``irecv``, ``wait`` and ``all_gather_bytes``.
"""

from __future__ import annotations

import datetime
import weakref
from dataclasses import dataclass
from typing import Any

from treecoll.topo.errors import CollectiveError, MissingDependency

__all__ = [
    "GroupInfo",
    "group_info",
    "resolve_group",
    "TorchTransport",
    "DEFAULT_TIMEOUT",
    "mark_broken",
    "check_usable",
]

#: seconds any single wait may take when neither the call nor the group says otherwise
DEFAULT_TIMEOUT = 300.0


def _dist():
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        raise MissingDependency("torch", "collectives over torch.distributed") from None
    return dist


@dataclass(frozen=True)
class GroupInfo:
    """A process group seen from this process: ``rank`` (group-local), ``size``,
    ``global_ranks[r]`` (global rank of group rank r) and the ``backend`` name."""

    rank: int
    size: int
    global_ranks: tuple[int, ...]
    backend: str

    def to_global(self, r: int) -> int:
        """Global rank of group rank ``r``; a rank outside ``0..size-1`` raises :class:`CollectiveError`."""
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.size:
            raise CollectiveError(
                f"group rank {r!r}: expected an integer in 0..{self.size - 1} (the group's size is {self.size})"
            )
        return self.global_ranks[r]

    def to_local(self, g: int) -> int:
        """Group rank of global rank ``g``; a process outside the group raises :class:`CollectiveError`."""
        try:
            return self.global_ranks.index(g)
        except ValueError:
            raise CollectiveError(
                f"global rank {g!r}: not a member of the group (its global ranks are "
                f"{list(self.global_ranks[:8])}{'...' if self.size > 8 else ''})"
            ) from None


#: one process without torch.distributed: the group of one that the attention decoders accept
SINGLE = GroupInfo(0, 1, (0,), "none")

#: group object -> its GroupInfo (weak: the entry goes with the group)
_INFO: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: communicator -> the first failure of a collective on it (the group is unusable)
_BROKEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def resolve_group(group: Any = None) -> Any:
    """The process group object ``group`` names: ``group`` itself, or the default group's
    current object for None (so a re-initialised default group is a new group)."""
    dist = _dist()
    if not dist.is_available() or not dist.is_initialized():
        raise CollectiveError(
            "process group: torch.distributed is not initialised; call torch.distributed.init_process_group first"
        )
    return group if group is not None else dist.group.WORLD


def group_info(group: Any = None, *, single_process: bool = False) -> GroupInfo:
    """The :class:`GroupInfo` of ``group`` (None: the default group).

    Without an initialised default group this raises :class:`CollectiveError`,
    unless ``single_process`` is True and ``group`` is None: then the process is a
    group of one (:data:`SINGLE`; the attention decoders run without
    torch.distributed that way). A process outside ``group`` raises too.
    """
    if single_process and group is None:
        dist = _dist()
        if not dist.is_available() or not dist.is_initialized():
            return SINGLE
    g = resolve_group(group)
    info = _INFO.get(g)
    if info is not None:
        return info
    dist = _dist()
    rank = dist.get_rank(g)
    if rank < 0:
        raise CollectiveError("process group: this process is not a member of the group it was given")
    size = dist.get_world_size(g)
    granks = tuple(dist.get_global_rank(g, r) for r in range(size)) if group is not None else tuple(range(size))
    info = GroupInfo(rank, size, granks, str(dist.get_backend(g)))
    _INFO[g] = info
    return info


def mark_broken(comm: Any, reason: str) -> None:
    """Record that a collective failed on the communicator ``comm`` (a process group, an
    in-process fabric; the first reason is kept). ``comm`` None records nothing."""
    if comm is not None and comm not in _BROKEN:
        _BROKEN[comm] = reason


def check_usable(comm: Any, what: str) -> None:
    """Raise :class:`CollectiveError` at once when a collective already failed on ``comm``."""
    reason = _BROKEN.get(comm) if comm is not None else None
    if reason is not None:
        raise CollectiveError(
            f"{what}: the process group is unusable: an earlier collective on it failed "
            f"({reason}); destroy it (torch.distributed.destroy_process_group(group)) and create "
            f"a new one (init_process_group, or new_group for a subgroup) on every rank before "
            f"the next collective"
        )


#: torch.distributed backends that match point-to-point messages by tag
TAG_MATCHING_BACKENDS = ("gloo", "mpi")


class TorchTransport:
    """Point-to-point over torch.distributed on ``group`` (None: the default group); peers
    are group ranks, translated to global ranks by :meth:`GroupInfo.to_global`. Holds the
    group for one call only (the executor makes one per call)."""

    def __init__(self, group: Any = None):
        self.comm = resolve_group(group)
        self._group = group
        self.info = group_info(group)
        self.rank = self.info.rank
        self.size = self.info.size
        self._dist = _dist()

    @property
    def matches_tags(self) -> bool:
        """Whether the backend matches a pair's messages by tag (gloo, MPI); NCCL matches them in
        the order they are posted and ignores tags."""
        return self.info.backend.lower() in TAG_MATCHING_BACKENDS

    def isend(self, tensor: Any, peer: int, tag: int) -> Any:
        return self._dist.isend(tensor, dst=self.info.to_global(peer), group=self._group, tag=tag)

    def irecv(self, tensor: Any, peer: int, tag: int) -> Any:
        return self._dist.irecv(tensor, src=self.info.to_global(peer), group=self._group, tag=tag)

    @staticmethod
    def wait(work: Any, timeout: float) -> None:
        work.wait(timeout=datetime.timedelta(seconds=timeout))

    def native_allreduce(self, tensor: Any, op: Any, timeout: float) -> None:
        """The backend's own allreduce of ``tensor`` in place (``op``: an Op with a ``torch_name``)."""
        work = self._dist.all_reduce(
            tensor, op=getattr(self._dist.ReduceOp, op.torch_name), group=self._group, async_op=True
        )
        work.wait(timeout=datetime.timedelta(seconds=timeout))

    def all_gather_bytes(self, payload: bytes, length: int, timeout: float) -> list[bytes]:
        """Every rank's ``payload`` (padded to ``length`` bytes): one all_gather."""
        import torch

        data = torch.zeros(length, dtype=torch.uint8)
        raw = payload[:length]
        data[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        outs = [torch.empty(length, dtype=torch.uint8) for _ in range(self.size)]
        backend = self.info.backend.lower()
        if "nccl" in backend:
            dev = torch.device("cuda", torch.cuda.current_device())
            data, outs = data.to(dev), [o.to(dev) for o in outs]
        work = self._dist.all_gather(outs, data, group=self._group, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=timeout))
        return [bytes(o.cpu().numpy().tobytes()).rstrip(b"\0") for o in outs]
