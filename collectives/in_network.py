"""In-network reduction: where the switches of a topology add up what the GPUs send.

NVLink SHARP (NVLS): NVSwitches of Hopper-generation systems and later reduce
and multicast, and NCCL then offers its NVLS and NVLSTree algorithms. The
cost model's lower bounds (:meth:`treecoll.collectives.cost.CostModel.in_network_reduction`)
and the simulator's NVLS model (:mod:`treecoll.collectives.sim.nvls`,
:mod:`treecoll.collectives.sim.nccl_model`) ask the same question here.

>>> from treecoll import topo
>>> [len(d) for d in nvls_domains(topo.resolve("dgx-h100-x2"), topo.resolve("dgx-h100-x2").rank_gpus())]
[8, 8]
>>> nvls_domains(topo.resolve("dgx-a100"), topo.resolve("dgx-a100").rank_gpus())
Traceback (most recent call last):
  ...
treecoll.topo.errors.TreeError: NVLS: needs compute capability 9.0 or later on every GPU, got sm 80
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from treecoll.topo import Topology
from treecoll.topo.errors import TreeError

__all__ = ["min_sm", "nvls_domains"]


#: the last answers per (question, topology object, GPUs): the simulator, the NCCL model and the cost
#: model ask them of one rank list several times (100,000 GPUs: a walk over every GPU each time)
_ANSWERS: dict[tuple, tuple[Topology, Any]] = {}
_KEPT_ANSWERS = 8


def _kept(question: str, topology: Topology, gpus: Sequence[str], answer: Callable[[], Any]) -> Any:
    """``answer()``, kept for ``question`` about ``topology`` (the object: it is immutable) and ``gpus``."""
    key = (question, id(topology), tuple(gpus))
    hit = _ANSWERS.get(key)
    if hit is not None and hit[0] is topology:
        return hit[1]
    value = answer()
    while len(_ANSWERS) >= _KEPT_ANSWERS:
        del _ANSWERS[next(iter(_ANSWERS))]
    _ANSWERS[key] = (topology, value)
    return value


def min_sm(topology: Topology, gpus: Sequence[str]) -> int:
    """The smallest compute capability (``sm``) among the GPUs; GPUs without ``sm`` count as Hopper (90)."""
    node = topology.graph._node  # networkx's node dict: the NodeView's lookups cost more than the work
    return _kept("min_sm", topology, gpus, lambda: min(int(node[x].get("sm") or 90) for x in gpus))


def nvls_domains(topology: Topology, gpus: Sequence[str]) -> list[list[str]]:
    """The GPUs grouped by NVLink domain (GPUs on the same NVSwitches), in rank order, where NCCL runs NVLS.

    NCCL offers NVLS (NVLink SHARP: the NVSwitches reduce and multicast) when the
    GPUs reach NVSwitch nodes (search.cc), all have compute capability 9.0 or
    later (GPUs without ``sm`` count as Hopper) and CUDA reports multicast
    support (nvls.cc; a switch with ``multicast: false``, such as one standing
    in for direct NVLinks, has none), with at least 2 GPUs per domain (nvls.cc).
    A domain is a host, or a rack-level NVLink domain (NVL72: NCCL's MNNVL
    clique is one node). Raises :class:`~topo.errors.TreeError` saying why NVLS
    cannot run; domains of unequal size are refused too.
    """
    if min_sm(topology, gpus) < 90:
        raise TreeError(f"NVLS: needs compute capability 9.0 or later on every GPU, got sm {min_sm(topology, gpus)}")
    found = _kept("nvls_domains", topology, gpus, lambda: _nvls_domains(topology, gpus))
    if isinstance(found, str):
        raise TreeError(found)
    return [list(d) for d in found]


def _nvls_domains(topology: Topology, gpus: Sequence[str]) -> list[list[str]] | str:
    """:func:`nvls_domains` computed: the domains, or the message saying why NVLS cannot run."""
    try:
        return _domains(topology, gpus)
    except TreeError as e:
        return str(e)


def _domains(topology: Topology, gpus: Sequence[str]) -> list[list[str]]:
    g = topology.graph
    domains: dict[frozenset, list[str]] = {}
    node, succ = g._node, g._succ  # networkx's dicts: 100,000 GPUs, the views' lookups cost more than the work
    for x in gpus:
        sw = frozenset(v for v in succ[x] if node[v].get("kind") == "nvswitch")
        if not sw:
            raise TreeError(f"NVLS: GPU {x!r} has no NVSwitch (NVLS needs GPUs on NVSwitches)")
        if any(node[v].get("multicast") is False for v in sw):
            raise TreeError(f"NVLS: the NVSwitches of GPU {x!r} have multicast: false")
        domains.setdefault(sw, []).append(x)
    sizes = sorted({len(d) for d in domains.values()})
    if sizes[0] < 2:
        raise TreeError("NVLS: needs at least 2 GPUs per NVLink domain, got a domain with 1")
    if len(sizes) > 1:
        raise TreeError(f"NVLS: NVLink domains with different GPU counts {sizes}; give the same number per domain")
    return list(domains.values())
