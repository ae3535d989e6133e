"""The route table of a :class:`~treecoll.topo.model.Topology`: every route it was asked for, kept.

A :class:`RouteTable` finds routes the way :mod:`treecoll.topo.paths` describes
(NCCL's order: path class, then bandwidth, then hops) and keeps what it found:
the routes asked for, the PCIe routes inside hosts, each GPU's nearest NIC,
and the network's switch distances. ``Topology.routes`` is the one table of a
topology, made on first use; :meth:`RouteTable.clear` drops what it holds.

Size: the pairs asked for are kept up to ``max_routes`` (the oldest are dropped
first beyond it, and found again when asked); the rest is bounded by the
topology: a PCIe route per pair of endpoints of one host, a NIC per GPU, and
per network switch its distance from every other switch.

Hosts built alike (the same local nodes, attributes and links: the hosts of one
template in a compact file) share their routes: the routes inside such a host
and its GPUs' nearest NICs are the first such host's, renamed, so a cluster of
12,500 identical hosts searches one host, not 12,500.

>>> from treecoll import topo
>>> t = topo.default()
>>> t.routes.path("h0/gpu0", "h1/gpu0").nccl, len(t.routes)
('NET', 1)
>>> t.routes.clear(); len(t.routes)
0
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping

import networkx as nx

from .errors import TopologyError
from .paths import LOC_BW, NCCL_CLASSES, Path

__all__ = ["RouteTable", "MAX_ROUTES", "rename_node"]

#: pairs a :class:`RouteTable` keeps by default: a route and its share of the tables behind it take
#: about 860 bytes (an 8192-GPU ring and two_level allreduce: 147,440 routes, 127 MB)
MAX_ROUTES = 1 << 19

_PCI_NODE_KINDS = frozenset({"pcie_switch", "cpu"})
_PCI_LINK_KINDS = frozenset({"pcie", "smp", "c2c"})


class RouteTable:
    """The routes of one frozen graph (a :class:`~treecoll.topo.model.Topology`'s), found on first use and kept.

    ``graph``: the topology's frozen ``networkx.DiGraph``; ``name``: the topology's name, for
    messages; ``max_routes``: the endpoint pairs kept (:data:`MAX_ROUTES`); ``alike``: routes inside
    a host built like an earlier host are that host's, renamed (:meth:`_rep_host`; False: every
    host searched on its own, the same routes); ``host_groups``: ``{host: key}`` from a loader that
    built the hosts of one key alike (the hosts of one template): the first host asked about of a
    key is compared, the others of that key take its answer (see :meth:`_rep_host`).
    """

    def __init__(
        self,
        graph: nx.DiGraph,
        name: str = "",
        *,
        max_routes: int = MAX_ROUTES,
        alike: bool = True,
        host_groups: Mapping[str, Hashable] | None = None,
    ):
        if max_routes < 1:
            raise TopologyError(f"route table: max_routes expected >= 1, got {max_routes}")
        self.graph = graph
        self.name = name
        self.max_routes = max_routes
        self.alike = alike
        self._routes: dict[tuple[str, str], Path] = {}  # (a, b) -> the route, oldest first
        self._pci: dict[tuple[str, str], Path | None] = {}  # (a, b) in one host -> PCIe route or None
        self._nic: dict[str, str | None] = {}  # endpoint -> its nearest NIC
        self._switch_dist: dict[str, dict[str, int]] = {}  # switch -> hops to it from every switch
        self._leaf_dist: dict[tuple[str, ...], dict[str, int]] = {}  # a NIC's leaves -> hops to the NIC
        self._nodes: dict[str, tuple[str, str | None]] | None = None  # node -> (kind, host)
        self._switch_preds: dict[str, frozenset[str]] | None = None
        self._nics: dict[str | None, list[str]] | None = None
        self._class_of: dict[str | None, str | None] = {}  # host -> the first host built alike (None: itself)
        self._sealed: dict[str | None, bool] = {}  # host -> compared (its links leave it only from NICs)
        self._switch_succ: dict[str, list[str]] = {}  # switch -> the switches it links to
        self._order: dict[str, dict[str, int]] = {}  # switch -> its successors' positions
        self._rep_of_sig: dict[tuple, str] = {}
        self._host_nodes: dict[str | None, list[str]] | None = None
        self._groups = host_groups or {}
        self._group_first: dict[Hashable, str | None] = {}  # group -> the first host of its class (None: apart)

    def __len__(self) -> int:
        """The endpoint pairs whose route is kept."""
        return len(self._routes)

    def clear(self) -> None:
        """Drop every route and table kept; they are found again when asked for."""
        self._routes.clear()
        self._pci.clear()
        self._nic.clear()
        self._switch_dist.clear()
        self._leaf_dist.clear()
        self._nodes = self._switch_preds = self._nics = self._host_nodes = None
        self._class_of.clear()
        self._sealed.clear()
        self._switch_succ.clear()
        self._order.clear()
        self._rep_of_sig.clear()
        self._group_first.clear()

    # ------------------------------------------------------------------ queries
    def path(self, a: str, b: str) -> Path:
        """The route between endpoints ``a`` and ``b`` (GPUs, NICs or CPUs)."""
        key = (a, b)
        p = self._routes.get(key)
        if p is None:
            p = self._route(a, b)
            if len(self._routes) >= self.max_routes:
                del self._routes[next(iter(self._routes))]  # the oldest
            self._routes[key] = p
        return p

    def nearest_nic(self, gpu: str) -> str | None:
        """The NIC of ``gpu``'s host with the best (class, bandwidth, hops); None if none.

        Ties (e.g. two NICs PXB to a GPU pair on a DGX A100, or PIX on an HGX B200)
        are spread over the GPUs the way NCCL does (``ncclTopoGetLocalNet``,
        src/graph/search.cc): the tied NIC number ``mirrorBits(dev, n) % n`` for a
        power-of-two ``n`` tied NICs, ``dev % n`` otherwise, ``dev`` the GPU's local index.
        """
        if gpu in self._nic:
            return self._nic[gpu]
        host = self._node(gpu)[1]
        rep = self._rep_host(host)
        if rep is not None:  # a host built like an earlier one: that host's answer, renamed
            nic = self.nearest_nic(rename_node(gpu, host, rep))
            out = None if nic is None else rename_node(nic, rep, host)
            self._nic[gpu] = out
            return out
        nics = self._host_nics(host)
        best: list[str] = []
        best_key = None
        self._pci_routes_from(gpu, nics)
        for nic in nics:
            p = self._pci_route(gpu, nic)
            if p is None:
                continue
            key = (NCCL_CLASSES.index(p.nccl), -p.bw, p.hops)
            if best_key is None or key < best_key:
                best, best_key = [nic], key
            elif key == best_key:
                best.append(nic)
        out = None
        if best:
            d = self.graph.nodes[gpu]
            dev = d.get("index", 0) if d["kind"] == "gpu" else 0
            out = best[_mirror_bits(dev, len(best)) % len(best)]
        self._nic[gpu] = out
        return out

    def host_class(self, host: str | None) -> str | None:
        """The host that stands for ``host``'s class: the first host asked about that is built exactly
        like it (see :meth:`_rep_host`), or ``host`` itself. Hosts of one class have the same routes
        inside them and the same NICs, renamed: a question about a host's own routes is answered
        once per class.

        >>> from treecoll import topo
        >>> t = topo.resolve("dgx-h100-x16")
        >>> t.routes.host_class("h0"), t.routes.host_class("h5")
        ('h0', 'h0')
        """
        rep = self._rep_host(host)
        return host if rep is None else rep

    # ------------------------------------------------------------------ node facts
    @property
    def _table(self) -> dict[str, tuple[str, str | None]]:
        """``{node: (kind, host)}`` for every node: route searches test these for every node they visit."""
        if self._nodes is None:
            self._nodes = {n: (d["kind"], d.get("host")) for n, d in self.graph._node.items()}
        return self._nodes

    def _node(self, n: str) -> tuple[str, str | None]:
        """``(kind, host)`` of node ``n``; an unknown node is a :class:`TopologyError`."""
        try:
            return self._table[n]
        except KeyError:
            raise TopologyError(f"node {n!r}: not in topology {self.name!r}") from None

    def _host_nics(self, host: str | None) -> list[str]:
        """The NICs of ``host``, in the graph's node order."""
        if self._nics is None:
            self._nics = {}
            for n, (kind, h) in self._table.items():
                if kind == "nic":
                    self._nics.setdefault(h, []).append(n)
        return self._nics.get(host, [])

    # ------------------------------------------------------------------ searches
    def _route(self, a: str, b: str) -> Path:
        for n in (a, b):
            kind = self._node(n)[0]
            if kind not in ("gpu", "nic", "cpu"):
                raise TopologyError(f"path endpoint {n!r}: expected a gpu, nic or cpu, got a {kind}")
        if a == b:
            return Path(a, b, (a,), (), LOC_BW, 0.0, "LOC", "X", (((a,), 1.0),))
        table = self._table
        (ka, ha), (kb, hb) = table[a], table[b]
        if ha == hb and ha is not None:
            rep = self._rep_host(ha)
            if rep is not None:
                return _rename_path(self.path(rename_node(a, ha, rep), rename_node(b, ha, rep)), rep, ha)
        nv = None
        # NVLink may cross hosts (GB200 trays of one NVL72 domain), but not out of a host whose links
        # leave it only from its NICs (:meth:`_rep_host` compared it)
        if ka == "gpu" and kb == "gpu" and (ha == hb or not self._is_sealed(ha)):
            nv = self._nvlink_route(a, b)
            if nv is not None and nv.nccl == "NVL":
                return nv
        if ha == hb:
            pci = self._pci_route(a, b)
            if nv is not None:  # NVB: NCCL takes it; nvidia-smi still shows the PCIe class
                return Path(a, b, nv.nodes, nv.kinds, nv.bw, nv.lat, "NVB", pci.smi if pci else None, nv.routes)
            if pci is None:
                raise TopologyError(f"path {a!r} -> {b!r}: no PCIe/NVLink route inside host {ha!r}")
            return pci
        return self._net_route(a, b)

    def _nvlink_route(self, a: str, b: str) -> Path | None:
        g = self.graph
        succ, table = g._succ, self._table
        d = succ[a].get(b)
        if d is not None and d["kind"] == "nvlink":
            return Path(
                a, b, (a, b), ("nvlink",), d["bw"], d.get("lat", 0.0), "NVL", f"NV{d.get('count', 1)}", (((a, b), 1.0),)
            )
        # parallel one-switch routes: a -> s -> b for every NVSwitch s adjacent to both
        hops = [
            (s, up, succ[s][b])
            for s, up in succ[a].items()
            if table[s][0] == "nvswitch" and up["kind"] == "nvlink" and b in succ[s] and succ[s][b]["kind"] == "nvlink"
        ]
        if hops:
            sw = [s for s, _, _ in hops]
            caps = [min(up["bw"], down["bw"]) for _, up, down in hops]
            total = sum(caps)
            routes = tuple(((a, s, b), c / total) for s, c in zip(sw, caps))
            best = max(range(len(sw)), key=lambda i: caps[i])
            lat = max(up.get("lat", 0.0) + down.get("lat", 0.0) for _, up, down in hops)
            links = sum(up.get("count", 1) for _, up, _ in hops)
            return Path(a, b, (a, sw[best], b), ("nvlink", "nvlink"), total, lat, "NVL", f"NV{links}", routes)
        # multi-hop NVLink (switch-to-switch fabrics, or through other GPUs: NVB)
        nodes = _bfs(g, a, b, lambda n: table[n][0] in ("nvswitch", "gpu"), frozenset({"nvlink"}))
        if nodes is None:
            return None
        kinds, bw, lat = _chain(g, nodes)
        through_gpu = any(g.nodes[n]["kind"] == "gpu" for n in nodes[1:-1])
        cls = "NVB" if through_gpu else "NVL"
        smi = None if through_gpu else f"NV{g.edges[a, nodes[1]].get('count', 1)}"
        return Path(a, b, nodes, kinds, bw, lat, cls, smi, ((nodes, 1.0),))

    def _pci_route(self, a: str, b: str) -> Path | None:
        """The PCIe/SMP/C2C route inside one host (kept: the route of a GPU to its NIC serves
        :meth:`nearest_nic` and every network route of that GPU)."""
        key = (a, b)
        if key not in self._pci:
            host = self._table[a][1]
            rep = self._rep_host(host) if host is not None and self._table[b][1] == host else None
            if rep is not None:
                p = self._pci_route(rename_node(a, host, rep), rename_node(b, host, rep))
                self._pci[key] = None if p is None else _rename_path(p, rep, host)
            else:
                self._pci[key] = self._pci_search(a, b)
        return self._pci[key]

    def _pci_routes_from(self, a: str, targets: Iterable[str]) -> None:
        """Find the PCIe routes from ``a`` to every node of ``targets`` with ONE breadth-first
        search (the routes equal :meth:`_pci_search`'s one-target searches: same visiting order; a
        target that is a switch or CPU of the host is still crossed on the way to others)."""
        cache = self._pci
        want = {t for t in targets if (a, t) not in cache and t != a}
        if not want:
            return
        if self._rep_host(self._table[a][1]) is not None:  # renamed from the host built alike
            for t in want:
                self._pci_route(a, t)
            return
        g, table = self.graph, self._table
        succ, host = g._succ, table[a][1]
        prev: dict[str, str | None] = {a: None}
        q = deque([a])
        while q:
            u = q.popleft()
            for v, d in succ[u].items():
                if v in prev or d["kind"] not in _PCI_LINK_KINDS:
                    continue
                kind, h = table[v]
                passable = kind in _PCI_NODE_KINDS and h == host
                if v in want or passable:
                    prev[v] = u
                if passable:  # a target CPU is still crossed on the way to other targets
                    q.append(v)
        for t in want:
            if t not in prev:
                cache[(a, t)] = None
                continue
            nodes = _back(prev, t)
            kinds, bw, lat = _chain(g, nodes)
            nccl, smi = _classify_pci(g, nodes, kinds)
            cache[(a, t)] = Path(a, t, nodes, kinds, bw, lat, nccl, smi, ((nodes, 1.0),))

    def _pci_nodes(self, a: str, b: str) -> tuple[str, ...]:
        """The nodes of the PCIe route from ``a`` to ``b`` inside one host (``(a,)`` when they are one)."""
        if a == b:
            return (a,)
        p = self._pci_route(a, b)
        if p is None:
            raise TopologyError(f"path {a!r} -> {b!r}: no PCIe route inside host {self._table[a][1]!r}")
        return p.nodes

    def _pci_search(self, a: str, b: str) -> Path | None:
        g, table = self.graph, self._table
        host = table[a][1]

        def inside(n: str) -> bool:
            kind, h = table[n]
            return kind in _PCI_NODE_KINDS and h == host

        nodes = _bfs(g, a, b, inside, _PCI_LINK_KINDS)
        if nodes is None:
            return None
        kinds, bw, lat = _chain(g, nodes)
        nccl, smi = _classify_pci(g, nodes, kinds)
        return Path(a, b, nodes, kinds, bw, lat, nccl, smi, ((nodes, 1.0),))

    def _net_route(self, a: str, b: str) -> Path:
        g, table = self.graph, self._table
        na = a if table[a][0] == "nic" else self.nearest_nic(a)
        nb = b if table[b][0] == "nic" else self.nearest_nic(b)
        if na is None or nb is None:
            lonely = a if na is None else b
            raise TopologyError(f"path {a!r} -> {b!r}: host {self._table[lonely][1]!r} has no NIC to reach other hosts")
        mid = self._ecmp_route(na, nb)
        if mid is None:
            raise TopologyError(f"path {a!r} -> {b!r}: NICs {na!r} and {nb!r} are not connected by the network")
        nodes = self._pci_nodes(a, na)[:-1] + mid + self._pci_nodes(nb, b)[1:]
        kinds, bw, lat = _chain(g, nodes)
        return Path(a, b, nodes, kinds, bw, lat, "NET", None, ((nodes, 1.0),))

    # ------------------------------------------------------------------ hosts built alike
    def _rep_host(self, host: str | None) -> str | None:
        """The first host asked about that is built exactly like ``host``, None when that is ``host`` itself
        or the host cannot be compared (a node not named ``<host>/<local>``, a link from inside the
        host to a node outside it other than a NIC's network link).

        Built alike: the same local node names, kinds and attributes (but ``host``, ``rank``,
        ``uuid`` and ``pci``), in the same order, with the same links (kinds, attributes, order)
        among them. Every route inside such a host and its GPUs' nearest NICs are the first host's,
        renamed: the searches visit the same nodes in the same order. 12,500 DGX H100 hosts ask for
        one host's routes, not 12,500. Hosts of one ``host_groups`` key are built alike by their
        loader: the first of them asked about is compared, the others are of its class.
        """
        if host is None or not self.alike:
            return None
        if host in self._class_of:
            return self._class_of[host]
        group = self._groups.get(host)
        if group is not None and group in self._group_first:
            first = self._group_first[group]
        else:
            sig = self._signature(host)
            first = None if sig is None else self._rep_of_sig.setdefault(sig, host)
            if group is not None:
                self._group_first[group] = first
        self._sealed[host] = first is not None
        rep = None if first is None or first == host else first
        self._class_of[host] = rep
        return rep

    def _is_sealed(self, host: str | None) -> bool:
        """Whether every link out of ``host`` (its nodes named ``<host>/<local>``) stays inside it but
        the NICs' network links: what :meth:`_rep_host` compares hosts by (False when it does not)."""
        if host not in self._sealed:
            self._rep_host(host)
        return self._sealed.get(host, False)

    def _signature(self, host: str) -> tuple | None:
        """What the routes inside ``host`` depend on, with the host's name left out (see :meth:`_rep_host`)."""
        if self._host_nodes is None:
            self._host_nodes = {}
            for n, (_, h) in self._table.items():
                self._host_nodes.setdefault(h, []).append(n)
        prefix = host + "/"
        k = len(prefix)
        node, succ, table = self.graph._node, self.graph._succ, self._table
        skip = _PER_HOST_ATTRS
        sig: list = []
        for n in self._host_nodes.get(host, ()):
            if not n.startswith(prefix):
                return None
            out = []
            for v, d in succ[n].items():
                if v.startswith(prefix) and table[v][1] == host:
                    out.append((v[k:], tuple(d.items())))
                elif d.get("kind") == "net" and table[n][0] == "nic":
                    out.append((None, "net"))
                else:
                    return None
            sig.append((n[k:], tuple([kv for kv in node[n].items() if kv[0] not in skip]), tuple(out)))
        key = tuple(sig)
        try:
            hash(key)
        except TypeError:  # an attribute that is a list or a dict: not compared, the host stands alone
            return None
        return key

    # ------------------------------------------------------------------ the network
    def _preds(self) -> dict[str, frozenset[str]]:
        """Per network switch, the switches with a ``net`` link into it."""
        if self._switch_preds is None:
            table, pred = self._table, self.graph._pred  # no view objects: a spine has thousands of leaves
            self._switch_preds = {
                s: frozenset(v for v, d in pred[s].items() if table[v][0] == "net_switch" and d["kind"] == "net")
                for s, (kind, _) in table.items()
                if kind == "net_switch"
            }
        return self._switch_preds

    def _dist_to_switch(self, target: str) -> dict[str, int]:
        """Hops from every network switch to ``target`` through switches only (a breadth-first search
        level by level, each level's new switches found with set operations; kept per target)."""
        dist = self._switch_dist.get(target)
        if dist is None:
            preds = self._preds()
            dist = {target: 0}
            level, hops = {target}, 0
            while level:
                hops += 1
                reach: set[str] = set()
                for u in level:
                    reach |= preds[u]
                level = reach.difference(dist)
                dist.update(dict.fromkeys(level, hops))
            self._switch_dist[target] = dist
        return dist

    def _dist_to_leaves(self, leaves: tuple[str, ...]) -> dict[str, int]:
        """Hops from every network switch to a NIC whose switches into it are ``leaves`` (one more
        than to the nearest of them); kept per tuple of leaves, which the NICs of a leaf share."""
        out = self._leaf_dist.get(leaves)
        if out is None:
            out = {}
            for s in leaves:
                for v, hops in self._dist_to_switch(s).items():
                    if hops + 1 < out.get(v, 1 << 30):
                        out[v] = hops + 1
            self._leaf_dist[leaves] = out
        return out

    def _net_switches_after(self, u: str) -> list[str]:
        """The network switches ``u`` has a ``net`` link to, in the graph's order (kept per node)."""
        after = self._switch_succ.get(u)
        if after is None:
            table = self._table
            after = self._switch_succ[u] = [
                v for v, d in self.graph._succ[u].items() if d["kind"] == "net" and table[v][0] == "net_switch"
            ]
        return after

    def _succ_order(self, u: str) -> dict[str, int]:
        """The position of each of ``u``'s successors in the graph's order (kept per node)."""
        order = self._order.get(u)
        if order is None:
            order = self._order[u] = {v: i for i, v in enumerate(self.graph._succ[u])}
        return order

    def _ecmp_route(self, na: str, nb: str) -> tuple[str, ...] | None:
        """Shortest route through net switches; equal-cost next hops picked by a hash of (na, nb).

        Distances to ``nb`` come from per-switch BFS tables shared by all routes
        (an 8192-GPU fabric has a few hundred switches), so a route costs its hops.
        """
        g = self.graph
        succ, table = g._succ, self._table
        leaves = tuple(s for s, d in g._pred[nb].items() if table[s][0] == "net_switch" and d["kind"] == "net")
        dist = self._dist_to_leaves(leaves)  # hops to nb from every switch (nb itself: 0)

        def hops_to(v: str) -> int:
            return 0 if v == nb else dist.get(v, -1) if table[v][0] == "net_switch" else -1

        best = None
        for v, d in succ[na].items():
            if d["kind"] == "net" and hops_to(v) >= 0:
                best = hops_to(v) + 1 if best is None else min(best, hops_to(v) + 1)
        if best is None:
            return None
        h = zlib.crc32(f"{na}|{nb}".encode())
        out = [na]
        while out[-1] != nb:
            u = out[-1]
            if u == na:
                nxt = [v for v, d in succ[u].items() if d["kind"] == "net" and hops_to(v) == best - 1]
            elif dist[u] == 1:  # a leaf: down to the NIC
                nxt = [nb]
            elif dist[u] == 2:  # the NIC's leaves that u links to, in the graph's order
                order = self._succ_order(u)
                nxt = sorted((v for v in leaves if v in order and succ[u][v]["kind"] == "net"), key=order.__getitem__)
            else:  # the switches one hop nearer, in the graph's order
                nearer = dist[u] - 1
                nxt = [v for v in self._net_switches_after(u) if dist.get(v, -1) == nearer]
            out.append(nxt[h % len(nxt)])
            h //= max(len(nxt), 1)
            h = h or zlib.crc32(f"{u}|{nb}".encode())
        return tuple(out)


def _chain(g: nx.DiGraph, nodes: tuple[str, ...]) -> tuple[tuple[str, ...], float, float]:
    succ = g._succ  # the frozen graph's adjacency dicts: attribute lookups without view objects
    attrs = [succ[u][v] for u, v in zip(nodes, nodes[1:])]
    return tuple(d["kind"] for d in attrs), min(d["bw"] for d in attrs), sum(d.get("lat", 0.0) for d in attrs)


def _bfs(
    g: nx.DiGraph, a: str, b: str, node_ok: Callable[[str], bool], link_kinds: frozenset[str]
) -> tuple[str, ...] | None:
    """Fewest-hop route a -> b whose intermediate nodes satisfy node_ok; deterministic."""
    succ = g._succ
    prev: dict[str, str | None] = {a: None}
    q = deque([a])
    while q:
        u = q.popleft()
        for v, d in succ[u].items():
            if v in prev or d["kind"] not in link_kinds:
                continue
            if v != b and not node_ok(v):
                continue
            prev[v] = u
            if v == b:
                return _back(prev, b)
            q.append(v)
    return None


def _back(prev: dict[str, str | None], end: str) -> tuple[str, ...]:
    """The route to ``end`` that a breadth-first search recorded in ``prev`` (each node's predecessor,
    None at the start), from the start."""
    out = [end]
    u = prev[end]
    while u is not None:
        out.append(u)
        u = prev[u]
    return tuple(reversed(out))


def _classify_pci(g: nx.DiGraph, nodes: tuple[str, ...], kinds: tuple[str, ...]) -> tuple[str, str]:
    if "smp" in kinds:
        return "SYS", "SYS"
    mids = nodes[1:-1]
    cpus = [i for i, n in enumerate(nodes) if 0 < i < len(nodes) - 1 and g.nodes[n]["kind"] == "cpu"]
    if "c2c" in kinds:
        # nvidia-smi finds no common PCIe ancestor for a GPU attached over NVLink-C2C: a GB200 tray
        # shows its NICs as SYS (https://github.com/sgl-project/sglang/issues/11208); NCCL says C2C / P2C
        return ("P2C", "SYS") if "pcie" in kinds else ("C2C", "SYS")
    if cpus:
        i = cpus[0]
        below, above = g.nodes[nodes[i - 1]], g.nodes[nodes[i + 1]]
        q_in, q_out = below.get("quadrant"), above.get("quadrant")
        if q_in is not None and q_out is not None and q_in != q_out:
            return "PHB", "SYS"  # two root-complex groups of one NUMA domain (see the module doc)
        return "PHB", ("PHB" if below.get("host_bridge") == above.get("host_bridge") else "NODE")
    switches = sum(1 for n in mids if g.nodes[n]["kind"] == "pcie_switch")
    return ("PIX", "PIX") if switches <= 1 else ("PXB", "PXB")


def _mirror_bits(val: int, n: int) -> int:
    """NCCL's mirrorBits: reverse the low log2(n) bits of ``val`` when n is a power of two."""
    if n < 2 or n & (n - 1):
        return val
    bits = n.bit_length() - 1
    out = 0
    for i in range(bits):
        if val & (1 << i):
            out |= 1 << (bits - 1 - i)
    return out


#: node attributes that differ between hosts built alike without changing a route inside them
_PER_HOST_ATTRS = frozenset({"host", "rank", "uuid", "pci"})


def rename_node(n: str, host: str, to: str) -> str:
    """Node ``n`` of ``host`` (named ``<host>/<local>``) as the same local node of host ``to``: how the
    routes inside hosts built alike (:meth:`RouteTable.host_class`) map onto each other.

    >>> rename_node("h5/gpu3", "h5", "h0")
    'h0/gpu3'
    """
    return to + n[len(host) :]


def _rename_path(p: Path, host: str, to: str) -> Path:
    """Path ``p`` inside ``host`` as the same path inside host ``to`` (built alike)."""
    k = len(host)

    def nodes(ns: tuple[str, ...]) -> tuple[str, ...]:
        return tuple([to + n[k:] for n in ns])  # rename_node of each

    primary = nodes(p.nodes)  # most paths' one route is their primary route: renamed once
    return Path(
        rename_node(p.src, host, to),
        rename_node(p.dst, host, to),
        primary,
        p.kinds,
        p.bw,
        p.lat,
        p.nccl,
        p.smi,
        tuple((primary if ns is p.nodes else nodes(ns), share) for ns, share in p.routes),
    )
