"""Process groups: the ONE place where group-local ranks become global ranks.

Inside treecoll every rank is group-local (``0..P-1``). :class:`GroupInfo`
wraps a ``torch.distributed`` process group (``None`` = the default group)
and turns a group rank into the global rank that ``isend``/``irecv`` take.
It also knows the timeout to apply to every wait (the ``timeout=`` of a
collective call, else :data:`DEFAULT_TIMEOUT`, never longer than the
process group's own).

A group in which a collective failed is unusable (transfers of the failed
call may still be posted and would match later ones): :func:`mark_broken`
records the first failure per group and :func:`check_usable` raises it at
once on every later call, saying what to do:

>>> mark_broken(("doc", 1), "allreduce: rank 0 failed receiving chunk 0 from rank 1 after 0.01 s: closed")
>>> check_usable(("doc", 1), "reduce(root=0)")
Traceback (most recent call last):
...
treecoll.topo.errors.CollectiveError: reduce(root=0): the process group is unusable: ... failed (allreduce: ...); destroy it ...
>>> check_usable(("doc", 2), "reduce(root=0)")    # another group: fine

A :class:`Transport` moves chunk tensors between group ranks: the real one
is :class:`TorchTransport` (``torch.distributed.isend``/``irecv``: gloo,
NCCL, any backend); tests use an in-process one (see
:mod:`treecoll.collectives.local`) with the same interface.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from treecoll.topo.errors import CollectiveError, MissingDependency

__all__ = ["GroupInfo", "group_info", "TorchTransport", "DEFAULT_TIMEOUT", "mark_broken", "check_usable"]

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
    ``global_ranks[r]`` (global rank of group rank r), ``key`` (identity for caches)."""

    group: Any
    rank: int
    size: int
    global_ranks: tuple[int, ...]
    key: tuple
    backend: str

    def to_global(self, r: int) -> int:
        """Global rank of group rank ``r``."""
        return self.global_ranks[r]


_GROUPS: dict[int, tuple[Any, GroupInfo]] = {}
#: group key -> the first failure of a collective on it (the group is unusable)
_BROKEN: dict[Any, str] = {}


def mark_broken(key, reason: str) -> None:
    """Record that a collective failed on the group ``key`` (the first reason is kept).
    ``key`` None (a transport without identity) records nothing."""
    if key is not None:
        _BROKEN.setdefault(key, reason)


def check_usable(key, what: str) -> None:
    """Raise :class:`CollectiveError` at once when a collective already failed on group ``key``."""
    reason = _BROKEN.get(key) if key is not None else None
    if reason is not None:
        raise CollectiveError(f"{what}: the process group is unusable: an earlier collective on it failed "
                              f"({reason}); destroy it (torch.distributed.destroy_process_group(group)) and create "
                              f"a new one (init_process_group, or new_group for a subgroup) on every rank before "
                              f"the next collective")


def group_info(group=None) -> GroupInfo:
    """The :class:`GroupInfo` of ``group`` (None: the default group); cached per group."""
    dist = _dist()
    if not dist.is_available() or not dist.is_initialized():
        raise CollectiveError("process group: torch.distributed is not initialised; "
                              "call torch.distributed.init_process_group first")
    g = group if group is not None else dist.group.WORLD
    hit = _GROUPS.get(id(g))
    if hit is not None and hit[0] is g:
        return hit[1]
    rank = dist.get_rank(g)
    if rank < 0:
        raise CollectiveError("process group: this process is not a member of the group it was given")
    size = dist.get_world_size(g)
    granks = tuple(dist.get_global_rank(g, r) for r in range(size)) if group is not None else tuple(range(size))
    info = GroupInfo(group, rank, size, granks, (id(g), granks), str(dist.get_backend(g)))
    _GROUPS[id(g)] = (g, info)
    return info


class TorchTransport:
    """Point-to-point over torch.distributed; peers are group ranks, translated here."""

    def __init__(self, info: GroupInfo):
        self.info = info
        self.rank = info.rank
        self.size = info.size
        self._dist = _dist()

    def isend(self, tensor, peer: int, tag: int):
        return self._dist.isend(tensor, dst=self.info.to_global(peer), group=self.info.group, tag=tag)

    def irecv(self, tensor, peer: int, tag: int):
        return self._dist.irecv(tensor, src=self.info.to_global(peer), group=self.info.group, tag=tag)

    @staticmethod
    def wait(work, timeout: float) -> None:
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
        work = self._dist.all_gather(outs, data, group=self.info.group, async_op=True)
        work.wait(timeout=datetime.timedelta(seconds=timeout))
        return [bytes(o.cpu().numpy().tobytes()).rstrip(b"\0") for o in outs]
