"""Routes between two endpoints of a :class:`~topo.model.Topology` and their classes.

A route is chosen the way NCCL chooses (``ncclTopoSetPaths`` in src/graph/paths.cc and the path
types of src/include/graph.h, NCCL 2.30.7): the best path class first (NVLink before
PCIe before the SMP interconnect before the network), then bandwidth, then
hops. Classes:

* NCCL path class (strings, never NCCL's version-dependent integers):
  ``LOC`` (same node), ``NVL`` (NVLink, directly or through NVSwitches),
  ``NVB`` (NVLink through an intermediate GPU), ``C2C``, ``PIX`` (at most one
  PCIe switch), ``PXB`` (several PCIe switches, no host bridge), ``P2C`` (C2C
  then PCIe), ``PHB`` (through a CPU's host bridge), ``SYS`` (across the SMP
  interconnect between NUMA domains), ``NET`` (between hosts over the network).
* nvidia-smi code (``nvidia-smi topo -m``): ``X``, ``NV#`` (direct bonded
  NVLinks or through NVSwitches, # = the links of the source GPU on that
  route), ``PIX``, ``PXB``, ``PHB``, ``NODE`` (through two host bridges of one
  NUMA domain), ``SYS`` (across the SMP interconnect, or between two
  ``quadrant`` s of one NUMA domain, see below); ``None`` between hosts
  (nvidia-smi shows one host).

  nvidia-smi also says ``SYS`` between devices of one NUMA domain whose PCIe
  root complexes are far apart inside the processor: with several root
  complexes in one socket, "connections between devices may effectively flow
  over a 'SMP' connection, which is the tool's way of saying that it is flowing
  from one root complex to another root complex" (NVIDIA's answer on
  https://forums.developer.nvidia.com/t/strange-output-by-nvidia-smi-topo/68452,
  a one-socket Skylake host). AMD EPYC 7002/7003 packages are divided into four
  I/O-die quadrants, and in the default NPS1 mode the whole socket is one NUMA
  domain (Dell, "NUMA Configuration settings on AMD EPYC 2nd Generation",
  https://infohub.delltechnologies.com/en-us/p/numa-configuration-settings-on-amd-epyc-2nd-generation/).
  Real matrices show it: the four GPUs of each NUMA node of an 8x RTX 4090 box
  are all SYS apart (https://github.com/NVIDIA/go-gpuallocator/issues/17). The
  model says which root complexes are apart with the ``quadrant`` of the top
  PCIe switches (host bridges): two branches that meet at a CPU through
  different quadrants are ``SYS`` (NCCL, which only knows NUMA domains, still
  says ``PHB``).
  Unlike NCCL, nvidia-smi never reports NVB: it shows the PCIe class instead.

NVSwitch fabrics keep each switch as a node (an H100 reaches its 4 switches
with 5/5/4/4 links); a GPU-to-GPU route through them is the set of parallel
one-switch routes, listed in :attr:`Path.routes` with the share of the traffic
each carries (proportional to its bottleneck bandwidth), and :attr:`Path.bw`
is their sum. Between hosts, a GPU uses its nearest NIC (NCCL's default) and
the network route is a shortest route through the switches, with ties between
equal-cost switches broken by a hash of the two NICs (deterministic ECMP).

>>> from treecoll import topo
>>> t = topo.default()                      # two DGX H100 on a rail-optimized fabric
>>> p = t.path("h0/gpu0", "h0/nic0")        # the NIC behind the GPU's own PCIe switch
>>> p.nodes, p.nccl, p.smi
(('h0/gpu0', 'h0/pcisw0', 'h0/nic0'), 'PIX', 'PIX')
>>> p = t.path("h0/gpu0", "h0/gpu1")        # 5 + 5 + 4 + 4 NVLinks of 20.6 GB/s over four NVSwitches
>>> p.smi, len(p.routes), round(p.bw, 1)
('NV18', 4, 370.8)
>>> q = t.path("h0/gpu0", "h1/gpu0")
>>> q.nccl, q.smi, q.nodes[3], t.nearest_nic("h0/gpu3")
('NET', None, 'rail0/leaf0', 'h0/nic3')
"""
from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import TopologyError

if TYPE_CHECKING:
    from .model import Topology

__all__ = ["Path", "route", "nearest_nic", "NCCL_CLASSES", "SMI_CODES", "LOC_BW"]

#: NCCL path classes from best to worst (src/include/graph.h, NCCL 2.30)
NCCL_CLASSES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS")
SMI_CODES = ("X", "NV#", "PIX", "PXB", "PHB", "NODE", "SYS")
#: bandwidth of a node to itself, GB/s: NCCL's LOC_BW (src/graph/topo.h)
LOC_BW = 5000.0

_PCI_NODE_KINDS = frozenset({"pcie_switch", "cpu"})
_PCI_LINK_KINDS = frozenset({"pcie", "smp", "c2c"})


@dataclass(frozen=True)
class Path:
    """A route between two endpoints.

    Attributes
    ----------
    src, dst: endpoint node ids.
    nodes: the primary route, ``src`` ... ``dst``.
    kinds: link kind of each hop of ``nodes`` (len = hops).
    bw: bottleneck bandwidth in GB/s per direction; over parallel NVSwitch
        routes, the sum of their bottlenecks.
    lat: summed link latency of the primary route, µs.
    nccl: NCCL path class (see module doc).
    smi: nvidia-smi code, or None between hosts.
    routes: ``((nodes, share), ...)`` parallel routes and the fraction of the
        traffic each carries (shares sum to 1); one route for most paths.
    """

    src: str
    dst: str
    nodes: tuple[str, ...]
    kinds: tuple[str, ...]
    bw: float
    lat: float
    nccl: str
    smi: str | None
    routes: tuple[tuple[tuple[str, ...], float], ...]

    @property
    def hops(self) -> int:
        """Number of links on the primary route."""
        return len(self.nodes) - 1

    def as_dict(self) -> dict:
        """Plain data for ``--json``."""
        return {"src": self.src, "dst": self.dst, "nodes": list(self.nodes), "kinds": list(self.kinds),
                "hops": self.hops, "bw_GBps": self.bw, "lat_us": self.lat, "nccl": self.nccl,
                "smi": self.smi, "routes": [[list(n), s] for n, s in self.routes]}


def route(topo: Topology, a: str, b: str) -> Path:
    """The route between endpoints ``a`` and ``b`` (GPUs, NICs or CPUs); cached per topology."""
    cache = topo.__dict__.setdefault("_route_cache", {})
    key = (a, b)
    if key not in cache:
        cache[key] = _route(topo, a, b)
    return cache[key]


def _route(topo: Topology, a: str, b: str) -> Path:
    table = _node_table(topo)
    for n in (a, b):
        if n not in table:
            topo.node(n)   # raises the "no such node" error
        kind = table[n][0]
        if kind not in ("gpu", "nic", "cpu"):
            raise TopologyError(f"path endpoint {n!r}: expected a gpu, nic or cpu, got a {kind}")
    if a == b:
        return Path(a, b, (a,), (), LOC_BW, 0.0, "LOC", "X", (((a,), 1.0),))
    (ka, ha), (kb, hb) = table[a], table[b]
    if ka == "gpu" and kb == "gpu":   # NVLink may cross hosts (GB200 trays of one NVL72 domain)
        nv = _nvlink_route(topo, a, b)
        if nv is not None and nv.nccl == "NVL":
            return nv
    else:
        nv = None
    if ha == hb:
        pci = _pci_route(topo, a, b)
        if nv is not None:  # NVB: NCCL takes it; nvidia-smi still shows the PCIe class
            return Path(a, b, nv.nodes, nv.kinds, nv.bw, nv.lat, "NVB", pci.smi if pci else None, nv.routes)
        if pci is None:
            raise TopologyError(f"path {a!r} -> {b!r}: no PCIe/NVLink route inside host {ha!r}")
        return pci
    return _net_route(topo, a, b)


def _chain(g, nodes: tuple[str, ...]) -> tuple[tuple[str, ...], float, float]:
    succ = g._succ  # the frozen graph's adjacency dicts: attribute lookups without view objects
    attrs = [succ[u][v] for u, v in zip(nodes, nodes[1:])]
    return tuple(d["kind"] for d in attrs), min(d["bw"] for d in attrs), sum(d.get("lat", 0.0) for d in attrs)


def _node_table(topo: Topology) -> dict[str, tuple[str, str | None]]:
    """``{node: (kind, host)}`` for every node (cached per topology): route searches
    test these for every node they visit."""
    table = topo.__dict__.get("_node_table")
    if table is None:
        table = {n: (d["kind"], d.get("host")) for n, d in topo.graph.nodes(data=True)}
        topo.__dict__["_node_table"] = table
    return table


def _nvlink_route(topo: Topology, a: str, b: str) -> Path | None:
    g = topo.graph
    succ, table = g._succ, _node_table(topo)
    d = succ[a].get(b)
    if d is not None and d["kind"] == "nvlink":
        nodes = (a, b)
        return Path(a, b, nodes, ("nvlink",), d["bw"], d.get("lat", 0.0), "NVL", f"NV{d.get('count', 1)}",
                    ((nodes, 1.0),))
    # parallel one-switch routes: a -> s -> b for every NVSwitch s adjacent to both
    hops = [(s, up, succ[s][b]) for s, up in succ[a].items()
            if table[s][0] == "nvswitch" and up["kind"] == "nvlink" and b in succ[s]
            and succ[s][b]["kind"] == "nvlink"]
    if hops:
        sw = [s for s, _, _ in hops]
        caps = [min(up["bw"], down["bw"]) for _, up, down in hops]
        total = sum(caps)
        routes = tuple(((a, s, b), c / total) for s, c in zip(sw, caps))
        best = max(range(len(sw)), key=lambda i: caps[i])
        nodes = (a, sw[best], b)
        lat = max(up.get("lat", 0.0) + down.get("lat", 0.0) for _, up, down in hops)
        links = sum(up.get("count", 1) for _, up, _ in hops)
        return Path(a, b, nodes, ("nvlink", "nvlink"), total, lat, "NVL", f"NV{links}", routes)
    # multi-hop NVLink (switch-to-switch fabrics, or through other GPUs: NVB)
    nodes = _bfs(g, a, b, lambda n: table[n][0] in ("nvswitch", "gpu"), frozenset({"nvlink"}))
    if nodes is None:
        return None
    kinds, bw, lat = _chain(g, nodes)
    through_gpu = any(g.nodes[n]["kind"] == "gpu" for n in nodes[1:-1])
    cls = "NVB" if through_gpu else "NVL"
    smi = None if through_gpu else f"NV{g.edges[a, nodes[1]].get('count', 1)}"
    return Path(a, b, nodes, kinds, bw, lat, cls, smi, ((nodes, 1.0),))


def _bfs(g, a: str, b: str, node_ok, link_kinds) -> tuple[str, ...] | None:
    """Fewest-hop route a -> b whose intermediate nodes satisfy node_ok; deterministic."""
    succ = g._succ
    prev = {a: None}
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
                out = [b]
                while prev[out[-1]] is not None:
                    out.append(prev[out[-1]])
                return tuple(reversed(out))
            q.append(v)
    return None


def _pci_route(topo: Topology, a: str, b: str) -> Path | None:
    """The PCIe/SMP/C2C route inside one host (cached per topology: the route of a GPU
    to its NIC serves :func:`nearest_nic` and every network route of that GPU)."""
    cache = topo.__dict__.setdefault("_pci_cache", {})
    key = (a, b)
    if key not in cache:
        cache[key] = _pci_search(topo, a, b)
    return cache[key]


def _pci_routes_from(topo: Topology, a: str, targets) -> None:
    """Fill the PCIe route cache from ``a`` to every node of ``targets`` with ONE breadth-first
    search (the routes equal :func:`_bfs`'s one-target searches: same visiting order; a
    target that is a switch or CPU of the host is still crossed on the way to others)."""
    cache = topo.__dict__.setdefault("_pci_cache", {})
    want = {t for t in targets if (a, t) not in cache and t != a}
    if not want:
        return
    g, table = topo.graph, _node_table(topo)
    succ, host = g._succ, table[a][1]
    prev = {a: None}
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
            if passable:             # a target CPU is still crossed on the way to other targets
                q.append(v)
    for t in want:
        if t not in prev:
            cache[(a, t)] = None
            continue
        out = [t]
        while prev[out[-1]] is not None:
            out.append(prev[out[-1]])
        nodes = tuple(reversed(out))
        kinds, bw, lat = _chain(g, nodes)
        nccl, smi = _classify_pci(g, nodes, kinds)
        cache[(a, t)] = Path(a, t, nodes, kinds, bw, lat, nccl, smi, ((nodes, 1.0),))


def _pci_search(topo: Topology, a: str, b: str) -> Path | None:
    g = topo.graph
    table = _node_table(topo)
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


def _classify_pci(g, nodes: tuple[str, ...], kinds: tuple[str, ...]) -> tuple[str, str]:
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


def nearest_nic(topo: Topology, gpu: str) -> str | None:
    """The NIC of ``gpu``'s host with the best (class, bandwidth, hops); None if none.

    Ties (e.g. two NICs PXB to a GPU pair on a DGX A100, or PIX on an HGX B200)
    are spread over the GPUs the way NCCL does (``ncclTopoGetLocalNet``,
    src/graph/search.cc): the tied NIC number ``mirrorBits(dev, n) % n`` for a
    power-of-two ``n`` tied NICs, ``dev % n`` otherwise, ``dev`` the GPU's local index.
    """
    cache = topo.__dict__.setdefault("_nic_cache", {})
    if gpu not in cache:
        host = topo.host_of(gpu)
        best: list[str] = []
        best_key = None
        _pci_routes_from(topo, gpu, topo.nics(host))
        for nic in topo.nics(host):
            p = _pci_route(topo, gpu, nic)
            if p is None:
                continue
            key = (NCCL_CLASSES.index(p.nccl), -p.bw, p.hops)
            if best_key is None or key < best_key:
                best, best_key = [nic], key
            elif key == best_key:
                best.append(nic)
        if not best:
            cache[gpu] = None
        else:
            dev = topo.graph.nodes[gpu].get("index", 0) if topo.graph.nodes[gpu]["kind"] == "gpu" else 0
            cache[gpu] = best[_mirror_bits(dev, len(best)) % len(best)]
    return cache[gpu]


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


def _net_route(topo: Topology, a: str, b: str) -> Path:
    g = topo.graph
    na = a if g.nodes[a]["kind"] == "nic" else nearest_nic(topo, a)
    nb = b if g.nodes[b]["kind"] == "nic" else nearest_nic(topo, b)
    if na is None or nb is None:
        lonely = a if na is None else b
        raise TopologyError(f"path {a!r} -> {b!r}: host {topo.host_of(lonely)!r} has no NIC to reach other hosts")
    mid = _ecmp_route(topo, na, nb)
    if mid is None:
        raise TopologyError(f"path {a!r} -> {b!r}: NICs {na!r} and {nb!r} are not connected by the network")
    head = _pci_route(topo, a, na).nodes if a != na else (a,)
    tail = _pci_route(topo, nb, b).nodes if b != nb else (b,)
    nodes = head[:-1] + mid + tail[1:]
    kinds, bw, lat = _chain(g, nodes)
    return Path(a, b, nodes, kinds, bw, lat, "NET", None, ((nodes, 1.0),))


def _switch_preds(topo: Topology) -> dict[str, list[str]]:
    """Per network switch, the switches with a ``net`` link into it (cached per topology)."""
    sp = topo.__dict__.get("_switch_preds")
    if sp is None:
        g = topo.graph
        sp = {s: [v for v in g.predecessors(s) if g.nodes[v]["kind"] == "net_switch" and g.edges[v, s]["kind"] == "net"]
              for s, d in g.nodes(data=True) if d["kind"] == "net_switch"}
        topo.__dict__["_switch_preds"] = sp
    return sp


def _dist_to_switch(topo: Topology, target: str) -> dict[str, int]:
    """Hops from every network switch to ``target`` through switches only (BFS, cached per target)."""
    cache = topo.__dict__.setdefault("_switch_dist", {})
    if target not in cache:
        preds = _switch_preds(topo)
        dist = {target: 0}
        q = deque([target])
        while q:
            u = q.popleft()
            for v in preds[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    q.append(v)
        cache[target] = dist
    return cache[target]


def _dist_to_leaves(topo: Topology, leaves: tuple[str, ...]) -> dict[str, int]:
    """Hops from every network switch to a NIC whose switches into it are ``leaves`` (one more
    than to the nearest of them); cached per tuple of leaves, which the NICs of a leaf share."""
    cache = topo.__dict__.setdefault("_leaf_dist", {})
    out = cache.get(leaves)
    if out is None:
        out = {}
        for s in leaves:
            for v, hops in _dist_to_switch(topo, s).items():
                if hops + 1 < out.get(v, 1 << 30):
                    out[v] = hops + 1
        cache[leaves] = out
    return out


def _ecmp_route(topo: Topology, na: str, nb: str) -> tuple[str, ...] | None:
    """Shortest route through net switches; equal-cost next hops picked by a hash of (na, nb).

    Distances to ``nb`` come from per-switch BFS tables shared by all routes
    (an 8192-GPU fabric has a few hundred switches), so a route costs its hops.
    """
    g = topo.graph
    succ, table = g._succ, _node_table(topo)
    dist = dict(_dist_to_leaves(topo, tuple(s for s, d in g._pred[nb].items()
                                            if table[s][0] == "net_switch" and d["kind"] == "net")))
    dist[nb] = 0
    best = None
    for v, d in succ[na].items():
        if d["kind"] == "net" and v in dist and (v == nb or table[v][0] == "net_switch"):
            best = dist[v] + 1 if best is None else min(best, dist[v] + 1)
    if best is None:
        return None
    dist[na] = best
    h = zlib.crc32(f"{na}|{nb}".encode())
    out = [na]
    while out[-1] != nb:
        u = out[-1]
        nxt = [v for v, d in succ[u].items() if dist.get(v, -1) == dist[u] - 1 and d["kind"] == "net"
               and (v == nb or table[v][0] == "net_switch")]
        out.append(nxt[h % len(nxt)])
        h //= max(len(nxt), 1)
        h = h or zlib.crc32(f"{u}|{nb}".encode())
    return tuple(out)
