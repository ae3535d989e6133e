"""The cluster graph: :class:`Topology`, an immutable wrapper over a ``networkx.DiGraph``.

Vocabulary
----------
Nodes have an id (a string, unique in the cluster; by convention ``"<host>/<local>"``
for nodes inside a host) and a ``kind``:

==============  ==========================================================
kind            meaning and attributes
==============  ==========================================================
``gpu``         a GPU (or, on CPU-only hosts, a process that acts as a rank).
                ``host``, ``index`` (local), ``pci``, ``uuid``, ``model``,
                ``mem_bw`` (GB/s), ``mem_gb`` (memory capacity, 1 GB = 1e9 B),
                ``numa``, and ``rank`` once ranks are mapped.
``nvswitch``    an NVSwitch chip; ``host`` when inside a host, none for
                rack-level NVLink switch trays (GB200 NVL72).
``pcie_switch`` a PCIe switch/bridge; optional ``host_bridge`` (an id): two
                branches that meet at a CPU through different host bridges
                are ``NODE`` in nvidia-smi's legend, through the same one
                (or none given) ``PHB``; optional ``quadrant`` (an integer):
                the group of root complexes the host bridge belongs to (an
                AMD EPYC I/O-die quadrant): branches of one NUMA domain in
                different quadrants are ``SYS`` to nvidia-smi (NCCL: PHB).
``cpu``         a NUMA domain; ``numa`` (its id), optional ``affinity``.
``nic``         a network adapter port; ``bw`` (GB/s), optional ``name``, ``rail``.
``net_switch``  a network switch; ``tier`` (0 = leaf, 1 = spine, ...).
==============  ==========================================================

Edges are directed with both directions present; attributes ``kind`` in
``nvlink``, ``c2c``, ``pcie``, ``smp``, ``net``; ``bw`` in GB/s per direction
(effective, 1 GB = 1e9 B, already multiplied by ``count``; finite and > 0);
``lat`` in microseconds (finite, >= 0); ``count`` bonded links (>= 1).

Ranks are group-local integers ``0..P-1``. A topology may carry explicit
``rank`` attributes on its GPUs; otherwise :meth:`Topology.rank_gpus` numbers
GPUs host by host, by local index.

>>> import networkx as nx
>>> g = nx.DiGraph()
>>> g.add_node("h0/gpu0", kind="gpu", host="h0", index=0)
>>> g.add_node("h0/gpu1", kind="gpu", host="h0", index=1)
>>> g.add_edge("h0/gpu0", "h0/gpu1", kind="nvlink", bw=41.2, lat=0.6, count=2)
>>> g.add_edge("h0/gpu1", "h0/gpu0", kind="nvlink", bw=41.2, lat=0.6, count=2)
>>> t = Topology(g, name="two")
>>> t.hosts(), t.gpus()
(('h0',), ('h0/gpu0', 'h0/gpu1'))
>>> p = t.path("h0/gpu0", "h0/gpu1")
>>> p.nccl, p.smi, p.bw
('NVL', 'NV2', 41.2)
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import networkx as nx

from .errors import TopologyError
from .paths import Path
from .ranks import resolve_gpus
from .routes import RouteTable

__all__ = ["Topology", "NODE_KINDS", "LINK_KINDS"]

NODE_KINDS = ("gpu", "nvswitch", "pcie_switch", "cpu", "nic", "net_switch")
LINK_KINDS = ("nvlink", "c2c", "pcie", "smp", "net")
#: node kinds that must carry ``host``
HOSTED_KINDS = ("gpu", "pcie_switch", "cpu", "nic")


class Topology:
    """An immutable cluster graph with path queries.

    Parameters
    ----------
    graph:
        A ``networkx.DiGraph`` following the vocabulary of this module. It is
        copied and frozen; validation errors are :class:`TopologyError`.
    name:
        A label (the YAML ``name``), shown by the CLI.
    meta:
        Free-form plain data kept with the topology (YAML ``meta``, source
        notes); it does not take part in equality.
    """

    __slots__ = ("_g", "name", "meta", "__dict__")

    def __init__(self, graph: nx.DiGraph, *, name: str = "", meta: Mapping[str, Any] | None = None):
        if not isinstance(graph, nx.DiGraph):
            raise TopologyError(f"graph: expected a networkx.DiGraph, got {type(graph).__name__}")
        g = nx.DiGraph(graph)  # copies nodes, edges and attribute dicts (shallow)
        _validate(g)
        self._g = nx.freeze(g)
        self.name = name
        self.meta = dict(meta or {})
        self._host_groups: Mapping[str, Any] | None = None

    @classmethod
    def _adopt(
        cls,
        graph: nx.DiGraph,
        *,
        name: str = "",
        meta: Mapping[str, Any] | None = None,
        host_groups: Mapping[str, Any] | None = None,
    ) -> Topology:
        """Like the constructor, but takes ownership of ``graph`` instead of copying it.

        For loaders that built the graph themselves and drop it afterwards
        (topo.yaml_io): same validation, no copy (half the construction time
        of an 8192-GPU cluster). ``host_groups``: ``{host: key}`` for hosts the
        loader built alike (the hosts of one template, their links leaving them
        only from their NICs into the network), the same key for hosts built
        alike: the route table compares one host per key with the others, not
        every host (:class:`~treecoll.topo.routes.RouteTable`).
        """
        if not isinstance(graph, nx.DiGraph):
            raise TopologyError(f"graph: expected a networkx.DiGraph, got {type(graph).__name__}")
        _validate(graph)
        self = cls.__new__(cls)
        self._g = nx.freeze(graph)
        self.name = name
        self.meta = dict(meta or {})
        self._host_groups = host_groups
        return self

    # ------------------------------------------------------------------ basics
    @property
    def graph(self) -> nx.DiGraph:
        """The frozen graph. Do not mutate attribute dicts; build a new Topology."""
        return self._g

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return self.fingerprint() == other.fingerprint()

    def __hash__(self) -> int:
        return hash(self.fingerprint())

    def __repr__(self) -> str:
        return (
            f"Topology(name={self.name!r}, hosts={len(self.hosts())}, gpus={len(self.gpus())}, "
            f"nodes={self._g.number_of_nodes()}, links={self._g.number_of_edges()})"
        )

    @functools.cached_property
    def _fingerprint(self) -> str:
        node, succ = self._g._node, self._g._succ  # networkx's dicts: no view objects on 100k nodes
        nodes = [[n, node[n]] for n in sorted(node)]
        edges = [[a, b, d] for a in sorted(succ) for b, d in sorted(succ[a].items(), key=_first)]
        text = json.dumps([nodes, edges], sort_keys=True, default=str)  # one C-level call: fast on 100k edges
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def fingerprint(self) -> str:
        """A short hash of nodes, edges and attributes (equal graphs, equal prints)."""
        return self._fingerprint

    def node(self, node_id: str) -> Mapping[str, Any]:
        """The attributes of one node, read-only. Unknown ids raise TopologyError."""
        try:
            return MappingProxyType(self._g.nodes[node_id])
        except KeyError:
            raise TopologyError(f"node {node_id!r}: not in topology {self.name!r}") from None

    def link(self, a: str, b: str) -> Mapping[str, Any]:
        """The attributes of the directed link a -> b."""
        try:
            return MappingProxyType(self._g._adj[a][b])  # the edge's attribute dict (networkx adjacency)
        except KeyError:
            raise TopologyError(f"link {a!r} -> {b!r}: not in topology {self.name!r}") from None

    def nodes(self, kind: str | None = None, host: str | None = None) -> tuple[str, ...]:
        """Node ids in insertion order, optionally filtered by kind and host."""
        return self._node_index.get((kind, host), ())

    @functools.cached_property
    def _node_index(self) -> dict[tuple[str | None, str | None], tuple[str, ...]]:
        by_kind: dict[str, list[str]] = defaultdict(list)
        by_host: dict[str, list[str]] = defaultdict(list)
        by_both: dict[tuple[str, str], list[str]] = defaultdict(list)
        for n, d in self._g._node.items():
            kind = d["kind"]
            by_kind[kind].append(n)
            h = d.get("host")
            if h is not None:
                by_host[h].append(n)
                by_both[kind, h].append(n)
        idx: dict[tuple[str | None, str | None], tuple[str, ...]] = {(None, None): tuple(self._g._node)}
        idx.update(((k, None), tuple(v)) for k, v in by_kind.items())
        idx.update(((None, h), tuple(v)) for h, v in by_host.items())
        idx.update((k, tuple(v)) for k, v in by_both.items())
        return idx

    def links(self, kind: str | None = None) -> tuple[tuple[str, str], ...]:
        """Directed links (a, b), optionally filtered by link kind."""
        return tuple((a, b) for a, b, d in self._g.edges(data=True) if kind is None or d["kind"] == kind)

    # ------------------------------------------------------------------ hosts and ranks
    @functools.cached_property
    def _hosts(self) -> tuple[str, ...]:
        return tuple(h for kind, h in self._node_index if kind is None and h is not None)

    def hosts(self) -> tuple[str, ...]:
        """Host names in the order they first appear."""
        return self._hosts

    @functools.cached_property
    def _gpus_by_host(self) -> dict[str, tuple[str, ...]]:
        node = self._g._node

        def order(gpus: tuple[str, ...]) -> tuple[str, ...]:
            key = [(node[n].get("index", 0), n) for n in gpus]
            return gpus if key == sorted(key) else tuple(n for _, n in sorted(key))

        return {h: order(self.nodes("gpu", h)) for h in self._hosts}

    def gpus(self, host: str | None = None) -> tuple[str, ...]:
        """GPU ids, host by host, each host's by local ``index``."""
        if host is not None:
            if host not in self._gpus_by_host:
                raise TopologyError(f"host {host!r}: not in topology; hosts are {list(self._hosts)[:8]}")
            return self._gpus_by_host[host]
        return tuple(g for h in self._hosts for g in self._gpus_by_host[h])

    def gpus_per_host(self) -> dict[str, int]:
        """Number of GPUs (rank slots) on each host."""
        return {h: len(v) for h, v in self._gpus_by_host.items()}

    def nics(self, host: str | None = None) -> tuple[str, ...]:
        """NIC ids, optionally of one host."""
        return self.nodes("nic", host)

    @functools.cached_property
    def _rank_gpus(self) -> tuple[str, ...]:
        gpus = self.gpus()
        node = self._g._node  # networkx's node dict: its view costs more per GPU than the work
        ranked = {node[g]["rank"]: g for g in gpus if "rank" in node[g]}
        if not ranked:
            return gpus
        return tuple(ranked[r] for r in range(len(ranked)))

    def rank_gpus(self) -> tuple[str, ...]:
        """The GPU of each rank: ``rank_gpus()[r]`` is rank r's GPU id.

        Uses the GPUs' ``rank`` attributes when present (they must be 0..P-1,
        checked at construction), else numbers GPUs host by host by index.
        """
        return self._rank_gpus

    def gpu_of_rank(self, rank: int) -> str:
        """GPU id of one rank; out of range raises TopologyError naming the rank."""
        r = self._rank_gpus
        if not isinstance(rank, int) or not 0 <= rank < len(r):
            raise TopologyError(f"rank {rank!r}: expected an integer in 0..{len(r) - 1}")
        return r[rank]

    def host_of(self, node_id: str) -> str | None:
        """The host of a node (None for network and rack-level switches)."""
        return self.node(node_id).get("host")

    def with_ranks(self, ranks: int | Iterable[str | int] | None) -> Topology:
        """A new Topology where rank r's GPU carries ``rank = r`` (others none).

        ``ranks`` follows the one rank rule (:func:`treecoll.topo.ranks.resolve_gpus`): a count,
        or GPU ids / topology ranks per new rank.
        """
        order = resolve_gpus(self, ranks)
        g = nx.DiGraph(self._g)
        for n in g.nodes:
            g.nodes[n].pop("rank", None)
        for r, n in enumerate(order):
            g.nodes[n]["rank"] = r
        out = Topology(g, name=self.name, meta=self.meta)
        out._host_groups = getattr(self, "_host_groups", None)  # ranks leave the hosts built alike as they were
        return out

    # ------------------------------------------------------------------ network structure
    @functools.cached_property
    def _leaf_of_host(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, set[str]] = {h: set() for h in self._hosts}
        node, succ = self._g._node, self._g._succ  # networkx's dicts: 100,000 NICs, the views cost more
        for nic in self.nodes("nic"):
            leaves = [nb for nb in succ[nic] if node[nb]["kind"] == "net_switch"]
            if leaves:
                out[node[nic]["host"]].update(leaves)
        return {h: tuple(sorted(v)) for h, v in out.items()}

    def leaves_of(self, host: str) -> tuple[str, ...]:
        """The network switches the host's NICs plug into (its leaf switches)."""
        return self._leaf_of_host[host]

    def leaf_groups(self) -> tuple[tuple[str, ...], ...]:
        """Hosts grouped by the set of leaf switches they plug into.

        Hosts in one group are one switch hop apart on every rail (a scalable
        unit of a rail-optimized fat tree, or everything under one leaf).
        Groups are in host order.
        """
        groups: dict[tuple[str, ...], list[str]] = {}
        for h in self._hosts:
            groups.setdefault(self._leaf_of_host[h], []).append(h)
        return tuple(tuple(v) for v in groups.values())

    # ------------------------------------------------------------------ paths
    @functools.cached_property
    def routes(self) -> RouteTable:
        """This topology's route table: the routes asked for, found on first use and kept
        (bounded; ``routes.clear()`` drops them). See :mod:`treecoll.topo.routes`."""
        return RouteTable(self._g, self.name, host_groups=getattr(self, "_host_groups", None))

    def path(self, a: str, b: str) -> Path:
        """The route between two GPUs, or a GPU and a NIC: see :class:`treecoll.topo.paths.Path`."""
        return self.routes.path(a, b)

    def nearest_nic(self, gpu: str) -> str | None:
        """The NIC of the GPU's host with the best path class, then bandwidth, then hops.

        None on a host without NICs.
        """
        return self.routes.nearest_nic(gpu)

    # ------------------------------------------------------------------ plain data
    def to_dict(self) -> dict[str, Any]:
        """Explicit form as plain data: ``{name, meta, nodes: [...], links: [...]}``.

        Each undirected pair appears once when both directions carry equal
        attributes, otherwise each direction is listed with ``directed: true``.
        """
        nodes = [{"id": n, **_canon(d)} for n, d in self._g.nodes(data=True)]
        links = []
        listed: set[tuple[str, str]] = set()
        for a, b, d in self._g.edges(data=True):
            if self._g.edges.get((b, a)) == d:
                if (b, a) in listed:
                    continue
                listed.add((a, b))
                links.append({"a": a, "b": b, **_canon(d)})
            else:
                links.append({"a": a, "b": b, "directed": True, **_canon(d)})
        out: dict[str, Any] = {"name": self.name}
        if self.meta:
            out["meta"] = dict(self.meta)
        out["nodes"] = nodes
        out["links"] = links
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        """Inverse of :meth:`to_dict` (no file context; YAML loading adds it)."""
        g = nx.DiGraph()
        for nd in data.get("nodes", []):
            nd = dict(nd)
            g.add_node(nd.pop("id"), **nd)
        for ld in data.get("links", []):
            ld = dict(ld)
            a, b = ld.pop("a"), ld.pop("b")
            directed = ld.pop("directed", False)
            g.add_edge(a, b, **ld)
            if not directed:
                g.add_edge(b, a, **dict(ld))
        return cls(g, name=data.get("name", ""), meta=data.get("meta"))


def _first(item: tuple) -> Any:
    return item[0]


def _canon(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: d[k] for k in sorted(d)}


def _validate(g: nx.DiGraph) -> None:
    """Structural checks; linear in nodes + edges."""
    ranks: dict[int, str] = {}
    for n, d in g._node.items():
        if not isinstance(n, str) or not n:
            raise TopologyError(f"node id {n!r}: expected a non-empty string")
        kind = d.get("kind")
        if kind not in NODE_KINDS:
            raise TopologyError(f"node {n!r}: kind expected one of {list(NODE_KINDS)}, got {kind!r}")
        if kind in HOSTED_KINDS and not d.get("host"):
            raise TopologyError(f"node {n!r}: a {kind} must carry 'host'")
        if "rank" in d:
            r = d["rank"]
            if not isinstance(r, int) or isinstance(r, bool) or r < 0:
                raise TopologyError(f"node {n!r}: rank expected a non-negative integer, got {r!r}")
            if kind != "gpu":
                raise TopologyError(f"node {n!r}: only GPUs carry a rank, got a {kind}")
            if r in ranks:
                raise TopologyError(f"rank {r}: mapped to two GPUs, {ranks[r]!r} and {n!r}")
            ranks[r] = n
        if kind == "nic" and "bw" in d:
            bw = d["bw"]
            if type(bw) is not float or not 0 < bw < math.inf:
                _positive(bw, f"node {n!r}: bw")
    if ranks and sorted(ranks) != list(range(len(ranks))):
        missing = sorted(set(range(len(ranks))) - set(ranks))
        raise TopologyError(f"ranks: expected 0..{len(ranks) - 1} each once, missing {missing[:8]}")
    succ, pred = g._succ, g._pred
    checked: set[int] = set()  # attribute dicts already checked (the hosts of a template share theirs)
    for a, nbrs in succ.items():
        # at once (C loops): no link to itself, every link's reverse there (a node's successors are its
        # predecessors), every attribute dict checked before; link by link only where one fails
        if a not in nbrs and nbrs.keys() == pred[a].keys() and checked.issuperset(map(id, nbrs.values())):
            continue
        for b, d in nbrs.items():
            if a == b:
                raise TopologyError(f"link {a!r} -> {b!r}: a link cannot join a node to itself")
            if id(d) not in checked:
                _check_link(a, b, d)
                checked.add(id(d))
            if a not in succ[b]:
                raise TopologyError(f"link {a!r} -> {b!r}: the reverse direction is missing; links are bidirectional")


def _check_link(a: str, b: str, d: Mapping[str, Any]) -> None:
    """The attributes of link ``a -> b``: a known kind, a positive bw, a finite lat >= 0, a count >= 1."""
    kind = d.get("kind")
    if kind not in LINK_KINDS:
        raise TopologyError(f"link {a!r} -> {b!r}: kind expected one of {list(LINK_KINDS)}, got {kind!r}")
    bw = d.get("bw")
    if type(bw) is not float or not 0 < bw < math.inf:
        _positive(bw, f"link {a!r} -> {b!r}: bw")
    lat = d.get("lat", 0.0)
    if type(lat) is not float or not 0 <= lat < math.inf:
        if not isinstance(lat, (int, float)) or isinstance(lat, bool) or not 0 <= lat < math.inf:
            raise TopologyError(f"link {a!r} -> {b!r}: lat expected a non-negative number of µs, got {lat!r}")
    c = d.get("count", 1)
    if type(c) is not int or c < 1:
        if not isinstance(c, int) or isinstance(c, bool) or c < 1:
            raise TopologyError(f"link {a!r} -> {b!r}: count expected a positive integer, got {c!r}")


def _positive(v: Any, what: str) -> None:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < math.inf:
        raise TopologyError(f"{what}: expected a positive number (GB/s), got {v!r}")
