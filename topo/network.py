"""Network templates of the compact YAML form: the fabric between hosts.

``network: {type: ..., ...}`` with ``type`` one of :data:`NETWORKS`:

``single_switch``
    every NIC plugs into ``leaf0``.
``fat_tree``
    two tiers: NICs fill leaves of ``leaf_size`` ports in host order
    (``leaf<k>``); each leaf has ``leaf_size / oversubscription`` ports of
    uplink bandwidth spread over ``spines`` switches (``spine<j>``; default
    one spine per uplink port), every leaf connected to every spine.
``rail_optimized``
    hosts are grouped in scalable units of ``su_hosts``; NIC with rail ``r`` of
    every host of unit ``k`` plugs into ``rail<r>/leaf<k>``; leaves connect to
    every spine as in ``fat_tree``. Traffic between hosts of one unit on the
    same rail is one switch hop; across rails or units it goes up a spine.
``torus``
    ``dims: [X, Y]`` or ``[X, Y, Z]`` with X*Y*Z = hosts: one router per host
    (``torus<x>_<y>[_<z>]``, tier 0) to which its NICs plug, and each router
    linked to its +1/-1 neighbour on every dimension, with wrap-around.

Common keys: ``link: {bw, lat}`` for NIC <-> switch links (bw defaults to the
NIC's own bw), ``uplink: {bw, lat}`` for one leaf <-> spine port (bw defaults
to the fastest NIC). Only NICs with a ``rail`` (the host template's
``nics.rails``, default 0..n-1; null for e.g. storage NICs) are connected.
The switches and links a network asks for (every leaf links to every spine)
are counted and checked against the caps of :mod:`treecoll.topo.limits` before any is
made.

Default latencies (µs per link): NIC <-> leaf 1.35, half of NCCL's NET step
latency 2.7 µs (tuning.cc hwLatencies, LL) so NIC -> leaf -> NIC is 2.7;
leaf <-> spine 0.5 (a leaf-spine detour adds ~1 µs: 3rd-party figure,
UNCERTAIN: blog figures of dev.ure.us and kentino.com).

>>> from treecoll import topo
>>> t = topo.loads("hosts: [{template: dgx-h100, count: 4}]\\n"
...                "network: {type: fat_tree, leaf_size: 16, oversubscription: 2}\\n")
>>> sorted(t.nodes("net_switch"))  # 32 NICs fill two leaves of 16 ports; 16 / 2 = 8 uplinks: 8 spines
['leaf0', 'leaf1', 'spine0', 'spine1', 'spine2', 'spine3', 'spine4', 'spine5', 'spine6', 'spine7']
>>> t.link("leaf0", "spine0")["bw"]    # one 50 GB/s port to each spine (the NICs' speed)
50.0
"""

from __future__ import annotations

import math
from typing import Any

import networkx as nx

from ._schema import Doc
from .compact import clear_view_cache

__all__ = ["NETWORKS", "add_network", "NIC_LEAF_LAT", "LEAF_SPINE_LAT"]

NIC_LEAF_LAT = 1.35
LEAF_SPINE_LAT = 0.5
NETWORKS = ("single_switch", "fat_tree", "rail_optimized", "torus")
_KEYS = {
    "single_switch": ("type", "link", "sharp"),
    "fat_tree": ("type", "link", "uplink", "leaf_size", "oversubscription", "spines", "sharp"),
    "rail_optimized": ("type", "link", "uplink", "su_hosts", "oversubscription", "spines", "sharp"),
    "torus": ("type", "link", "dims", "sharp"),
}


def _link(bw: float, lat: float, count: int = 1) -> dict:
    return {"kind": "net", "bw": float(bw), "lat": float(lat), "count": int(count)}


def _bi(g: nx.DiGraph, a: str, b: str, d: dict) -> None:
    """Links ``a -> b`` and ``b -> a`` with attributes ``d``: the dict itself in both directions, written
    into networkx's adjacency (callers share one dict among the links alike; the graph is frozen once
    built: nothing writes to it); through ``add_edge`` when a node or either link is there already.
    The caller clears networkx's cached views after (:func:`~treecoll.topo.compact.clear_view_cache`)."""
    succ, pred = g._succ, g._pred
    if a in succ and b in succ and b not in succ[a] and a not in succ[b]:
        succ[a][b] = pred[b][a] = succ[b][a] = pred[a][b] = d
    else:
        g.add_edge(a, b, **d)
        g.add_edge(b, a, **d)


def _spec(doc: Doc, v: Any, path: tuple, lat: float) -> tuple[float | None, float]:
    d = doc.mapping(v, path, optional=("bw", "lat"))
    bw = doc.number(d["bw"], (*path, "bw"), unit="GB/s") if "bw" in d else None
    return bw, (doc.number(d["lat"], (*path, "lat"), positive=False, unit="µs") if "lat" in d else lat)


def add_network(
    doc: Doc, spec: Any, path: tuple, g: nx.DiGraph, host_nics: list[tuple[str, list[tuple[str, int, float]]]]
) -> None:
    """Validate ``spec`` and add its switches and links to ``g``.

    ``host_nics``: per host in order, ``(host, [(nic_id, rail, bw GB/s), ...])``
    listing the NICs that have a rail. ``sharp: true``: the switches reduce in the network
    (InfiniBand SHARP, what NCCL's CollNet algorithms use); every switch gets ``sharp: True``.
    """
    before = set(g)
    _add_network(doc, spec, path, g, host_nics)
    clear_view_cache(g)
    if isinstance(spec, dict) and "sharp" in spec and doc.boolean(spec["sharp"], (*path, "sharp")):
        for n in set(g) - before:
            if g.nodes[n].get("kind") == "net_switch":
                g.nodes[n]["sharp"] = True


def _add_network(
    doc: Doc, spec: Any, path: tuple, g: nx.DiGraph, host_nics: list[tuple[str, list[tuple[str, int, float]]]]
) -> None:
    if not isinstance(spec, dict):
        doc.fail(path, f"expected a mapping with 'type' (one of {list(NETWORKS)}), got {type(spec).__name__}")
    kind = spec.get("type")
    if kind not in NETWORKS:
        doc.fail((*path, "type"), f"expected one of {list(NETWORKS)}, got {kind!r}")
    d = doc.mapping(spec, path, required=("type",), optional=_KEYS[kind])
    link_bw, link_lat = _spec(doc, d.get("link", {}), (*path, "link"), NIC_LEAF_LAT)
    all_nics = [n for _, ns in host_nics for n in ns]
    if not all_nics:
        doc.fail(path, "a network needs NICs: expected hosts with nics (with a rail), got none")
    port_bw = max(bw for _, _, bw in all_nics)

    shared: dict[float, dict] = {}  # one attribute dict per bandwidth, shared by the NICs' links

    def attach(nic: str, bw: float, sw: str) -> None:
        bw = link_bw or bw
        d = shared.get(bw)
        if d is None:
            d = shared[bw] = _link(bw, link_lat)
        _bi(g, nic, sw, d)

    if kind == "single_switch":
        _budget(doc, path, g, 1, 2 * len(all_nics), "a single switch")
        g.add_node("leaf0", kind="net_switch", tier=0)
        for nic, _, bw in all_nics:
            attach(nic, bw, "leaf0")
        return
    if kind == "torus":
        _torus(doc, d, path, g, host_nics, attach, link_bw or port_bw, link_lat)
        return

    up_bw, up_lat = _spec(doc, d.get("uplink", {}), (*path, "uplink"), LEAF_SPINE_LAT)
    up_bw = up_bw or port_bw
    over = doc.number(d.get("oversubscription", 1), (*path, "oversubscription"))
    leaves: list[tuple[str, int]] = []  # (leaf id, down ports)
    if kind == "fat_tree":
        size = doc.integer(d.get("leaf_size"), (*path, "leaf_size"), minimum=1) if "leaf_size" in d else None
        if size is None:
            doc.fail(path, "missing key 'leaf_size': expected the number of NIC ports per leaf switch")
        nleaves = -(-len(all_nics) // size)
    else:
        su = doc.integer(d["su_hosts"], (*path, "su_hosts"), minimum=1) if "su_hosts" in d else len(host_nics)
        size = su
        nleaves = len({(rail, hi // su) for hi, (_, ns) in enumerate(host_nics) for _, rail, _ in ns})
    ratio = size / over  # uplink ports per leaf
    if not ratio <= doc.limits.max_links:
        doc.fail(
            (*path, "oversubscription"),
            f"{size} ports per leaf / oversubscription {over:g} ask for "
            f"{ratio:.3g} uplink ports per leaf: expected at most "
            f"{doc.limits.max_links:,} (the links cap)",
        )
    uplinks = max(1, math.ceil(ratio))
    spines = doc.integer(d["spines"], (*path, "spines"), minimum=1) if "spines" in d else uplinks
    _budget(
        doc,
        (*path, "spines") if "spines" in d else path,
        g,
        nleaves + spines,
        2 * len(all_nics) + 2 * nleaves * spines,
        f"{nleaves:,} leaves x {spines:,} spines",
    )
    if kind == "fat_tree":
        for i, (nic, _, bw) in enumerate(all_nics):
            leaf = f"leaf{i // size}"
            if i % size == 0:
                g.add_node(leaf, kind="net_switch", tier=0)
                leaves.append((leaf, size))
            attach(nic, bw, leaf)
    else:
        for hi, (_, ns) in enumerate(host_nics):
            for nic, rail, bw in ns:
                leaf = f"rail{rail}/leaf{hi // su}"
                if leaf not in g:
                    g.add_node(leaf, kind="net_switch", tier=0, rail=rail)
                    leaves.append((leaf, size))
                attach(nic, bw, leaf)
    per = uplinks / spines
    count = max(1, round(per))
    bw = up_bw * per
    if not math.isfinite(bw):
        doc.fail((*path, "uplink"), f"{per:g} uplink ports x {up_bw:g} GB/s overflows: expected a bandwidth in GB/s")
    for j in range(spines):
        g.add_node(f"spine{j}", kind="net_switch", tier=1)
    ld = _link(bw, up_lat, count)
    for leaf, _ in leaves:
        for j in range(spines):
            _bi(g, leaf, f"spine{j}", ld)


def _budget(doc: Doc, path: tuple, g: nx.DiGraph, nodes: int, links: int, what: str) -> None:
    edges = sum(map(len, g._succ.values()))  # g.number_of_edges() walks a degree view: seconds on 100,000 GPUs
    doc.budget(path, len(g._node) + nodes, edges + links, f"the hosts and a network of {what}")


def _torus(doc, d, path, g, host_nics, attach, bw, lat) -> None:
    if "dims" not in d:
        doc.fail(path, "missing key 'dims': expected [X, Y] or [X, Y, Z] with X*Y*Z = hosts")
    dims = doc.seq(d["dims"], (*path, "dims"), what="dimensions")
    if len(dims) not in (2, 3):
        doc.fail((*path, "dims"), f"expected 2 or 3 dimensions, got {len(dims)}")
    dims = [doc.integer(x, (*path, "dims", i), minimum=1) for i, x in enumerate(dims)]
    if math.prod(dims) != len(host_nics):
        doc.fail(
            (*path, "dims"),
            f"expected dimensions whose product is the host count {len(host_nics)}, "
            f"got {dims} (product {math.prod(dims)})",
        )

    nics = sum(len(ns) for _, ns in host_nics)
    _budget(
        doc,
        (*path, "dims"),
        g,
        len(host_nics),
        2 * nics + 4 * len(dims) * len(host_nics),
        f"{len(host_nics):,} torus routers",
    )

    def rid(c):
        return "torus" + "_".join(map(str, c))

    coords = [tuple((i // math.prod(dims[:k])) % dims[k] for k in range(len(dims))) for i in range(len(host_nics))]
    for c, (_, ns) in zip(coords, host_nics):
        g.add_node(rid(c), kind="net_switch", tier=0, coord=list(c))
        for nic, _, nbw in ns:
            attach(nic, nbw, rid(c))
    for c in coords:
        for k, n in enumerate(dims):
            if n == 1:
                continue
            nb = list(c)
            nb[k] = (c[k] + 1) % n
            if rid(nb) != rid(c) and not g.has_edge(rid(c), rid(nb)):
                _bi(g, rid(c), rid(tuple(nb)), _link(bw, lat))
