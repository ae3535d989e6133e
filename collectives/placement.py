"""One placement object: where the ranks of a collective run.

A :class:`Placement` is what torch's ``DeviceMesh`` is to its collectives: the
topology, the GPU of every group rank and the process group, built and checked
once, then passed to the tree builders, the planner and executor
(:func:`~treecoll.collectives.execute.allreduce`, ``reduce``, ``broadcast``),
the cost model, the simulator and Tree Attention's ``tree_decode``.

* ``topology``: a :class:`~treecoll.topo.Topology`, or None when it is not
  known (planning then assumes ``nranks`` GPUs on one switch:
  :func:`treecoll.collectives.cost.uniform_topology`).
* ``gpus``: ``gpus[r]`` is group rank r's GPU id (None without a topology),
  resolved by the one rank rule :func:`treecoll.topo.ranks.resolve_gpus`: a
  count is the first N GPUs in rank order, a sequence names the GPUs.
* ``nranks``: the number of group ranks (``len(gpus)``).
* ``group``: the ``torch.distributed`` process group the collectives run on;
  None means the default group at call time (as in torch.distributed), and is
  all planning and simulation need.

Equality and hash: two placements are equal when their topologies have the
same fingerprint, they map ranks to the same GPUs and they name the same
process group: the same group *object* (or both None). Two groups over the
same ranks are different communicators (messages on one never match the
other, destroying one leaves the other), so they are not equal. A placement
holds its group (like a ``DeviceMesh``); treecoll's caches never hold a
placement, only its :attr:`~Placement.plan_key` (topology, GPUs, size), so a
destroyed group is freed once the user drops the placements naming it.

>>> from treecoll import topo
>>> t = topo.resolve("dgx-h100-x2")
>>> p = Placement(t, 4)                      # the first four ranks of a 16-GPU topology
>>> p.nranks, p.gpus[-1], p == Placement(t, ["h0/gpu0", "h0/gpu1", "h0/gpu2", "h0/gpu3"])
(4, 'h0/gpu3', True)
>>> Placement(ranks=8).topology is None      # planning without a topology: 8 ranks
True
>>> Placement(t, ["h0/gpu0", "h9/gpu0"])
Traceback (most recent call last):
...
treecoll.topo.errors.PlacementError: ranks[1]: expected a GPU of topology 'dgx-h100-x2' (...), got 'h9/gpu0'
"""

from __future__ import annotations

from typing import Any

from treecoll.topo import Topology
from treecoll.topo.errors import PlacementError
from treecoll.topo.ranks import RanksArg, resolve_gpus

__all__ = ["Placement", "as_placement"]


class Placement:
    """Topology + rank -> GPU map + process group; frozen and hashable (see the module docstring).

    ``Placement(topology=None, ranks=None, *, group=None)`` is the one builder:

    * ``ranks`` None: with a ``group``, as many ranks as the group has (the
      first GPUs in rank order); else every GPU of ``topology``;
    * ``ranks`` an int: a count; a sequence: one GPU (id or topology rank) per rank;
    * without a topology, ``ranks`` must be a count (or come from the group).

    A ``group`` whose size differs from the ranks mapped raises
    :class:`~treecoll.topo.errors.PlacementError` (asking torch.distributed its
    size needs it initialised).
    """

    __slots__ = ("topology", "gpus", "nranks", "group", "_key", "_hash")

    topology: Topology | None
    gpus: tuple[str, ...] | None
    nranks: int
    group: Any

    def __init__(self, topology: Topology | None = None, ranks: RanksArg = None, *, group: Any = None) -> None:
        if topology is not None and not isinstance(topology, Topology):
            raise PlacementError(f"placement: topology expected a Topology or None, got {type(topology).__name__}")
        group_size = None
        if group is not None:
            from .group import group_info

            group_size = group_info(group).size
        if ranks is None and group_size is not None:
            ranks = group_size
        if topology is not None:
            gpus: tuple[str, ...] | None = resolve_gpus(topology, ranks)
            n = len(gpus)
        else:
            gpus = None
            if ranks is None:
                raise PlacementError(
                    "placement: expected a topology, a rank count or a process group, got none of them"
                )
            if isinstance(ranks, bool) or not isinstance(ranks, int):
                raise PlacementError(
                    f"placement: without a topology ranks expected a count, got "
                    f"{type(ranks).__name__} {ranks!r}; pass the topology the GPU names belong to"
                )
            if ranks < 1:
                raise PlacementError(f"placement: ranks expected a count >= 1, got {ranks}")
            n = ranks
        if group_size is not None and group_size != n:
            raise PlacementError(
                f"placement: the process group has {group_size} ranks, the placement maps {n}; "
                f"pass ranks={group_size} (or that many GPUs)"
            )
        for name, value in (
            ("topology", topology),
            ("gpus", gpus),
            ("nranks", n),
            ("group", group),
            ("_key", None),
            ("_hash", None),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Placement is frozen: cannot set {name!r}; build a new Placement")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Placement is frozen: cannot delete {name!r}")

    @property
    def plan_key(self) -> tuple:
        """What plans depend on: (topology fingerprint or None, GPUs, nranks); never the group.
        Made on first use (a 100,000-GPU topology's fingerprint takes seconds; the analytic
        engine never asks for it)."""
        key = self._key
        if key is None:
            key = (self.topology.fingerprint() if self.topology is not None else None, self.gpus, self.nranks)
            object.__setattr__(self, "_key", key)
        return key

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Placement):
            return NotImplemented
        return self.plan_key == other.plan_key and self.group is other.group

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = hash((self.plan_key, id(self.group) if self.group is not None else None))
            object.__setattr__(self, "_hash", h)
        return h

    def __repr__(self) -> str:
        where = f"topology={self.topology.name!r}, " if self.topology is not None else ""
        span = "" if self.gpus is None else f" ({self.gpus[0]}..{self.gpus[-1]})"
        group = "default" if self.group is None else f"{type(self.group).__name__}@{id(self.group):#x}"
        return f"Placement({where}nranks={self.nranks}{span}, group={group})"


def as_placement(
    placement: Placement | Topology | None = None,
    ranks: RanksArg = None,
    *,
    group: Any = None,
    nranks: int | None = None,
    what: str = "placement",
) -> Placement:
    """The boundary where loose arguments become a :class:`Placement` (the one conversion).

    ``placement``: a Placement (returned as is; ``ranks`` and ``group`` must then be
    None), a Topology or None (then ``Placement(placement, ranks, group=group)``).
    ``nranks``: the rank count the caller needs (a schedule's, a tree's): used as the
    count when ``ranks`` is None, else checked against the placement.

    >>> as_placement(None, nranks=4).nranks
    4
    >>> as_placement(Placement(ranks=4), nranks=3)
    Traceback (most recent call last):
    ...
    treecoll.topo.errors.PlacementError: placement: maps 4 ranks, expected 3; build the placement for 3 ranks
    """
    if isinstance(placement, Placement):
        if ranks is not None or group is not None:
            raise PlacementError(
                f"{what}: got a Placement and loose ranks/group; pass the ranks and the group inside the Placement"
            )
        p = placement
    else:
        if ranks is None and group is None:
            ranks = nranks
        p = Placement(placement, ranks, group=group)
    if nranks is not None and p.nranks != nranks:
        raise PlacementError(
            f"{what}: maps {p.nranks} ranks, expected {nranks}; build the placement for {nranks} ranks"
        )
    return p
