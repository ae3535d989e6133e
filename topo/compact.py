"""Host templates of the compact YAML form and their expansion into the graph.

A host template describes one machine (see docs/topology-yaml.md for the full
schema and examples)::

    gpus:     {count: 8, model: H100-SXM5-80GB, mem_bw: 3350, mem_gb: 80, sm: 90}
    nvswitch: {count: 4, links: [5, 5, 4, 4], link_bw: 20.6}   # NVLinks GPU -> switch k
    cpus:     [{numa: 0, socket: 0, affinity: "0-51"}, {numa: 1, socket: 1}]
    smp:      {bw: 22.0}                                       # between NUMA domains
    pcie:     {bw: 48.0, switches: [{cpu: 0, gpus: [0], nics: [0], host_bridge: 0}, ...]}
    nics:     {count: 8, bw: 50.0, names: [mlx5_0, ...], rails: [0, 1, ...]}

:func:`parse_template` validates a template once (errors name file, line and
key path) and turns it into a :class:`HostTemplate`: local node ids with their
attributes and local links. Counts that multiply (``gpus.count``,
``nics.count``, ``nvswitch.count`` times the GPUs, the NUMA domains' full SMP
mesh) are checked against the caps of :mod:`treecoll.topo.limits` as soon as they are
read, before the nodes and links they ask for are made. :func:`expand` then stamps the template onto a
``networkx.DiGraph`` for every host name, prefixing ids with ``"<host>/"``;
this is the only per-host work, so 1024 hosts cost 1024 dict copies per node.

Default latencies (µs per link) split NCCL's per-step hardware latencies
(``hwLatencies`` of ``ncclTunerConstantsDefaults`` in src/graph/tuning.cc, NCCL 2.30.7,
https://github.com/NVIDIA/nccl; LL protocol: NVLink 0.6, PCI 1.0) evenly over the links of the usual route:
GPU -> NVSwitch -> GPU is 2 links of 0.3, GPU -> PCIe switch -> NIC 2 links of 0.5.
NCCL has no constant for C2C or the SMP link; they default to the PCIe value.

>>> import networkx as nx
>>> from treecoll.topo._schema import Doc
>>> box = {"gpus": {"count": 2, "numa": 0}, "cpus": [{"numa": 0}], "pcie": {"bw": 24.0}}
>>> ht = parse_template(Doc("x.yaml", "", None), box, ("templates", "box"), "box")
>>> [n for n, _ in ht.nodes], [(a, b, d["bw"]) for a, b, d in ht.links]
(['gpu0', 'gpu1', 'cpu0'], [('gpu0', 'cpu0', 24.0), ('gpu1', 'cpu0', 24.0)])
>>> g = nx.DiGraph()
>>> expand(g, ht, ["a", "b"])
>>> sorted(g.nodes), g.number_of_edges()
(['a/cpu0', 'a/gpu0', 'a/gpu1', 'b/cpu0', 'b/gpu0', 'b/gpu1'], 8)
>>> parse_template(Doc("x.yaml", "", None), {**box, "gpus": {"count": 10**9, "numa": 0}}, ("t",), "big")
... # doctest: +ELLIPSIS
Traceback (most recent call last):
...
treecoll.topo.errors.TopologyError: x.yaml: t.gpus.count: one host of template 'big' would make 1,000,000,001 ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from ._schema import Doc

__all__ = ["HostTemplate", "parse_template", "expand", "NVLINK_HOP_LAT", "PCIE_HOP_LAT"]

#: µs per GPU<->NVSwitch link: half of NCCL's NVLink step latency 0.6 µs (tuning.cc hwLatencies, LL)
NVLINK_HOP_LAT = 0.3
#: µs per PCIe link: half of NCCL's PCI step latency 1.0 µs (tuning.cc hwLatencies, LL)
PCIE_HOP_LAT = 0.5

TEMPLATE_KEYS = ("description", "gpus", "nvswitch", "cpus", "smp", "pcie", "nics")
GPU_KEYS = ("count", "model", "mem_bw", "mem_gb", "sm", "pci", "numa", "c2c")
NVSWITCH_KEYS = ("count", "links", "link_bw", "lat", "scope", "domain_hosts", "pci", "multicast")
CPU_KEYS = ("numa", "socket", "affinity", "model")
PCIE_KEYS = ("bw", "lat", "switches")
SWITCH_KEYS = ("cpu", "parent", "gpus", "nics", "host_bridge", "quadrant", "bw")
NIC_KEYS = ("count", "bw", "names", "rails", "numa", "pci", "link_layer", "lat")
LINK_KEYS = ("bw", "lat")
#: the unit of a GPU's ``mem_gb`` (its memory capacity), as errors name it
MEM_GB_UNIT = "GB of 1e9 bytes"


@dataclass
class HostTemplate:
    """A validated host template: local nodes and links, before host prefixes.

    ``nodes``: ``[(local_id, attrs)]``; ``links``: ``[(a, b, attrs)]`` one per
    bidirectional pair; ``rack_switches``: number of rack-level NVLink switches
    (``scope: rack``) the GPUs link to with ``rack_links`` ``[(gpu_local, k, attrs)]``;
    ``domain_hosts``: hosts per rack-level NVLink domain (None = all of them).
    """

    name: str
    source: str
    nodes: list[tuple[str, dict]] = field(default_factory=list)
    links: list[tuple[str, str, dict]] = field(default_factory=list)
    rack_switches: int = 0
    rack_links: list[tuple[str, int, dict]] = field(default_factory=list)
    domain_hosts: int | None = None

    @property
    def gpu_count(self) -> int:
        return sum(1 for _, d in self.nodes if d["kind"] == "gpu")

    def nics(self) -> list[tuple[str, dict]]:
        """``[(local_id, attrs)]`` of the template's NICs, in order."""
        return [(n, d) for n, d in self.nodes if d["kind"] == "nic"]


def check_cpulist(doc: Doc, text: str, path: tuple) -> None:
    """A Linux CPU list (``"0-55,112-167"``): ascending ranges of CPU ids below sysfs.MAX_CPU_ID."""
    from .sysfs import MAX_CPU_ID, parse_cpulist

    if not parse_cpulist(text):
        doc.fail(
            path,
            f"expected a CPU list like '0-55,112-167' (ascending ranges, ids below {MAX_CPU_ID}), got {text[:40]!r}",
        )


def _link(kind: str, bw: float, lat: float, count: int = 1) -> dict:
    return {"kind": kind, "bw": float(bw), "lat": float(lat), "count": int(count)}


def _link_spec(doc: Doc, v: Any, path, default_lat: float) -> tuple[float | None, float]:
    d = doc.mapping(v, path, optional=LINK_KEYS)
    bw = doc.number(d["bw"], (*path, "bw"), unit="GB/s") if "bw" in d else None
    lat = doc.number(d["lat"], (*path, "lat"), positive=False, unit="µs") if "lat" in d else default_lat
    return bw, lat


class _Tally:
    """Running node and link counts of one host template, checked against the caps as they grow."""

    def __init__(self, doc: Doc, name: str):
        self.doc, self.name, self.nodes, self.links = doc, name, 0, 0

    def add(self, path: tuple, nodes: int, links: int) -> None:
        self.nodes += nodes
        self.links += links
        self.doc.budget(path, self.nodes, self.links, f"one host of template {self.name!r} would")


def parse_template(doc: Doc, data: Any, path: tuple, name: str) -> HostTemplate:
    """Validate one host template at ``path`` of ``doc`` and build its local graph."""
    t = doc.mapping(data, path, required=("gpus",), optional=TEMPLATE_KEYS)
    ht = HostTemplate(name=name, source=doc.source)
    tally = _Tally(doc, name)
    if "description" in t:
        doc.string(t["description"], (*path, "description"))

    # ---- CPUs (NUMA domains) and the SMP interconnect
    cpus: dict[int, str] = {}
    cpu_list = doc.seq(t.get("cpus", []), (*path, "cpus"), what="NUMA domains")
    tally.add((*path, "cpus"), len(cpu_list), len(cpu_list) * (len(cpu_list) - 1))  # full SMP mesh
    for i, c in enumerate(cpu_list):
        cp = (*path, "cpus", i)
        c = doc.mapping(c, cp, required=("numa",), optional=CPU_KEYS)
        numa = doc.integer(c["numa"], (*cp, "numa"), minimum=0)
        if numa in cpus:
            doc.fail((*cp, "numa"), f"NUMA domain {numa} defined twice")
        attrs = {"kind": "cpu", "numa": numa}
        if "socket" in c:
            attrs["socket"] = doc.integer(c["socket"], (*cp, "socket"), minimum=0)
        for k in ("affinity", "model"):
            if k in c:
                attrs[k] = doc.string(str(c[k]) if isinstance(c[k], int) else c[k], (*cp, k))
        if "affinity" in attrs:
            check_cpulist(doc, attrs["affinity"], (*cp, "affinity"))
        cpus[numa] = f"cpu{numa}"
        ht.nodes.append((f"cpu{numa}", attrs))
    if len(cpus) > 1:
        if "smp" not in t:
            doc.fail(path, f"missing key 'smp': {len(cpus)} NUMA domains need the SMP interconnect's bw (GB/s)")
        bw, lat = _link_spec(doc, t["smp"], (*path, "smp"), PCIE_HOP_LAT)
        if bw is None:
            doc.fail((*path, "smp"), "missing key 'bw': expected the SMP bandwidth in GB/s per direction")
        numas = sorted(cpus)
        for i, a in enumerate(numas):  # full mesh, as NCCL links every pair of CPU nodes
            for b in numas[i + 1 :]:
                ht.links.append((cpus[a], cpus[b], _link("smp", bw, lat)))
    elif "smp" in t:
        _link_spec(doc, t["smp"], (*path, "smp"), PCIE_HOP_LAT)

    def numa_of(v, p):
        n = doc.integer(v, p, minimum=0)
        if n not in cpus:
            doc.fail(p, f"expected a NUMA domain listed in cpus ({sorted(cpus)}), got {n}")
        return n

    # ---- GPUs
    gp = (*path, "gpus")
    gd = doc.mapping(t["gpus"], gp, required=("count",), optional=GPU_KEYS)
    ngpu = doc.integer(gd["count"], (*gp, "count"), minimum=1)
    tally.add((*gp, "count"), ngpu, 2 * ngpu)  # each GPU and its link to the host
    gpus = []
    for i in range(ngpu):
        a = {"kind": "gpu", "index": i}
        if "model" in gd:
            a["model"] = doc.string(gd["model"], (*gp, "model"))
        if "mem_bw" in gd:
            a["mem_bw"] = doc.number(gd["mem_bw"], (*gp, "mem_bw"), unit="GB/s")
        if "mem_gb" in gd:
            a["mem_gb"] = doc.number(gd["mem_gb"], (*gp, "mem_gb"), unit=MEM_GB_UNIT)
        if "sm" in gd:
            a["sm"] = doc.integer(gd["sm"], (*gp, "sm"), minimum=1)
        gpus.append(a)
    if "pci" in gd:
        for i, v in enumerate(doc.seq(gd["pci"], (*gp, "pci"), length=ngpu, what="PCI bus ids (one per GPU)")):
            gpus[i]["pci"] = doc.string(v, (*gp, "pci", i)).lower()
    gpu_numa = (
        doc.per_item(gd["numa"], (*gp, "numa"), ngpu, numa_of, what="NUMA domains (one per GPU)")
        if "numa" in gd
        else [None] * ngpu
    )

    # ---- NICs
    nics: list[dict] = []
    nic_numa: list = []
    if "nics" in t:
        np_ = (*path, "nics")
        nd = doc.mapping(t["nics"], np_, required=("count", "bw"), optional=NIC_KEYS)
        nnic = doc.integer(nd["count"], (*np_, "count"), minimum=0)
        tally.add((*np_, "count"), nnic, 2 * nnic)
        bws = doc.per_item(
            nd["bw"], (*np_, "bw"), nnic, lambda v, p: doc.number(v, p, unit="GB/s"), what="bandwidths (one per NIC)"
        )
        nics = [{"kind": "nic", "bw": bws[k]} for k in range(nnic)]
        if "names" in nd:
            for k, v in enumerate(doc.seq(nd["names"], (*np_, "names"), length=nnic, what="names (one per NIC)")):
                nics[k]["name"] = doc.string(v, (*np_, "names", k))
        rails = (
            doc.seq(nd["rails"], (*np_, "rails"), length=nnic, what="rails (one per NIC, null = none)")
            if "rails" in nd
            else list(range(nnic))
        )
        for k, r in enumerate(rails):
            if r is not None:
                nics[k]["rail"] = doc.integer(r, (*np_, "rails", k), minimum=0)
        if "pci" in nd:
            for k, v in enumerate(doc.seq(nd["pci"], (*np_, "pci"), length=nnic, what="PCI bus ids (one per NIC)")):
                nics[k]["pci"] = doc.string(v, (*np_, "pci", k)).lower()
        if "lat" in nd:  # the transport's own latency per message (an NCCL net plugin's `latency`)
            lats = doc.per_item(
                nd["lat"],
                (*np_, "lat"),
                nnic,
                lambda v, p: doc.number(v, p, positive=False, unit="µs"),
                what="latencies (one per NIC)",
            )
            for k, v in enumerate(lats):
                nics[k]["lat"] = v
        if "link_layer" in nd:
            ll = doc.string(nd["link_layer"], (*np_, "link_layer"))
            for a in nics:
                a["link_layer"] = ll
        nic_numa = (
            doc.per_item(nd["numa"], (*np_, "numa"), nnic, numa_of, what="NUMA domains (one per NIC)")
            if "numa" in nd
            else [None] * nnic
        )

    # ---- PCIe tree
    pcie_bw, pcie_lat = None, PCIE_HOP_LAT
    placed_gpu: dict[int, int] = {}
    placed_nic: dict[int, int] = {}
    sw_numa: list[int] = []
    sw_attrs: list[dict] = []
    sw_links: list[tuple[str, str, dict]] = []
    if "pcie" in t:
        pp = (*path, "pcie")
        pd = doc.mapping(t["pcie"], pp, required=("bw",), optional=PCIE_KEYS)
        pcie_bw = doc.number(pd["bw"], (*pp, "bw"), unit="GB/s")
        if "lat" in pd:
            pcie_lat = doc.number(pd["lat"], (*pp, "lat"), positive=False, unit="µs")
        sw_list = doc.seq(pd.get("switches", []), (*pp, "switches"), what="PCIe switches")
        tally.add((*pp, "switches"), len(sw_list), 2 * len(sw_list))
        for s, sd in enumerate(sw_list):
            sp = (*pp, "switches", s)
            sd = doc.mapping(sd, sp, optional=SWITCH_KEYS)
            if ("cpu" in sd) == ("parent" in sd):
                doc.fail(sp, "expected exactly one of 'cpu' (a NUMA domain) or 'parent' (an earlier switch index)")
            up_bw = doc.number(sd["bw"], (*sp, "bw"), unit="GB/s") if "bw" in sd else pcie_bw
            attrs = {"kind": "pcie_switch"}
            if "host_bridge" in sd:
                hb = sd["host_bridge"]
                if isinstance(hb, bool) or not isinstance(hb, (int, str)):
                    doc.fail((*sp, "host_bridge"), f"expected an integer or string id, got {hb!r}")
                attrs["host_bridge"] = hb
            if "quadrant" in sd:
                attrs["quadrant"] = doc.integer(sd["quadrant"], (*sp, "quadrant"), minimum=0)
            if "cpu" in sd:
                numa = numa_of(sd["cpu"], (*sp, "cpu"))
                up = cpus[numa]
            else:
                par = doc.integer(sd["parent"], (*sp, "parent"), minimum=0)
                if par >= s:
                    doc.fail((*sp, "parent"), f"expected the index of an earlier switch (0..{s - 1}), got {par}")
                numa, up = sw_numa[par], f"pcisw{par}"
                for k in ("host_bridge", "quadrant"):
                    if k in sw_attrs[par] and k not in attrs:
                        attrs[k] = sw_attrs[par][k]
            sw_numa.append(numa)
            sw_attrs.append(attrs)
            sw_links.append((f"pcisw{s}", up, _link("pcie", up_bw, pcie_lat)))
            for key, n, placed in (("gpus", ngpu, placed_gpu), ("nics", len(nics), placed_nic)):
                for j, i in enumerate(doc.index_list(sd.get(key, []), (*sp, key), n, what=key[:-1].upper())):
                    if i in placed:
                        doc.fail((*sp, key, j), f"{key[:-1].upper()} {i} is already under PCIe switch {placed[i]}")
                    placed[i] = s
    elif any(v is None for v in gpu_numa) or any(v is None for v in nic_numa):
        doc.fail(path, "missing key 'pcie': GPUs and NICs without 'numa' must sit under a PCIe switch")

    for s, attrs in enumerate(sw_attrs):
        ht.nodes.append((f"pcisw{s}", attrs))
    ht.links.extend(sw_links)

    c2c = None
    if "c2c" in gd:
        c2c = _link_spec(doc, gd["c2c"], (*gp, "c2c"), PCIE_HOP_LAT)
        if c2c[0] is None:
            doc.fail((*gp, "c2c"), "missing key 'bw': expected the NVLink-C2C bandwidth in GB/s per direction")
    for kind, devs, numas, placed, key in (
        ("GPU", gpus, gpu_numa, placed_gpu, "gpus"),
        ("NIC", nics, nic_numa, placed_nic, "nics"),
    ):
        prefix = "gpu" if kind == "GPU" else "nic"
        for i, a in enumerate(devs):
            if i in placed:
                s = placed[i]
                if numas[i] is not None and numas[i] != sw_numa[s]:
                    doc.fail(
                        (*path, key, "numa"),
                        f"{kind} {i}: numa {numas[i]} disagrees with its PCIe switch "
                        f"{s} under NUMA domain {sw_numa[s]}",
                    )
                a["numa"] = sw_numa[s]
                ht.links.append((f"{prefix}{i}", f"pcisw{s}", _link("pcie", pcie_bw, pcie_lat)))
            elif numas[i] is not None:
                a["numa"] = numas[i]
                if kind == "GPU" and c2c is not None:
                    ht.links.append((f"gpu{i}", cpus[numas[i]], _link("c2c", c2c[0], c2c[1])))
                else:
                    if pcie_bw is None:
                        doc.fail(path, f"missing key 'pcie': {kind} {i} attaches to a CPU over PCIe; give pcie.bw")
                    ht.links.append((f"{prefix}{i}", cpus[numas[i]], _link("pcie", pcie_bw, pcie_lat)))
            else:
                doc.fail(
                    (*path, key),
                    f"{kind} {i}: expected it under a PCIe switch (pcie.switches[].{key}) "
                    f"or a 'numa' to attach it to a CPU directly",
                )
            if kind == "GPU" and c2c is not None and i in placed:
                ht.links.append((f"gpu{i}", cpus[a["numa"]], _link("c2c", c2c[0], c2c[1])))
    ht.nodes[:0] = [(f"gpu{i}", a) for i, a in enumerate(gpus)]

    # ---- NVSwitches
    if "nvswitch" in t:
        _parse_nvswitch(doc, t["nvswitch"], (*path, "nvswitch"), ht, ngpu, tally)
    ht.nodes.extend((f"nic{k}", a) for k, a in enumerate(nics))
    return ht


def _parse_nvswitch(doc: Doc, v: Any, sp: tuple, ht: HostTemplate, ngpu: int, tally: _Tally) -> None:
    sd = doc.mapping(v, sp, required=("count", "links", "link_bw"), optional=NVSWITCH_KEYS)
    nsw = doc.integer(sd["count"], (*sp, "count"), minimum=1)
    tally.add((*sp, "count"), nsw, 2 * nsw * ngpu)  # every GPU links to every switch
    links = doc.per_item(
        sd["links"],
        (*sp, "links"),
        nsw,
        lambda x, p: doc.integer(x, p, minimum=1),
        what="integers (NVLinks from each GPU to each switch)",
    )
    link_bw = doc.number(sd["link_bw"], (*sp, "link_bw"), unit="GB/s per NVLink per direction")
    if not math.isfinite(max(links) * link_bw):
        doc.fail((*sp, "link_bw"), f"{max(links)} links x {link_bw:g} GB/s overflows: expected a bandwidth in GB/s")
    lat = doc.number(sd["lat"], (*sp, "lat"), positive=False, unit="µs") if "lat" in sd else NVLINK_HOP_LAT
    multicast = doc.boolean(sd["multicast"], (*sp, "multicast")) if "multicast" in sd else True
    scope = sd.get("scope", "host")
    if scope not in ("host", "rack"):
        doc.fail((*sp, "scope"), f"expected 'host' or 'rack', got {scope!r}")
    if "domain_hosts" in sd:
        if scope != "rack":
            doc.fail((*sp, "domain_hosts"), "only valid with scope: rack")
        ht.domain_hosts = doc.integer(sd["domain_hosts"], (*sp, "domain_hosts"), minimum=1)
    pci = doc.seq(sd["pci"], (*sp, "pci"), length=nsw, what="PCI bus ids (one per switch)") if "pci" in sd else None
    if scope == "rack":
        if pci is not None:
            doc.fail((*sp, "pci"), "rack-level NVLink switches have no PCI address in a host")
        if not multicast:
            doc.fail((*sp, "multicast"), "only valid with scope: host (rack-level NVLink switches multicast)")
        ht.rack_switches = nsw
        for i in range(ngpu):
            ht.rack_links.extend((f"gpu{i}", k, _link("nvlink", n * link_bw, lat, n)) for k, n in enumerate(links))
        return
    for k in range(nsw):
        a = {"kind": "nvswitch"}
        if not multicast:
            a["multicast"] = False
        if pci is not None:
            a["pci"] = doc.string(pci[k], (*sp, "pci", k)).lower()
        ht.nodes.append((f"nvswitch{k}", a))
    for i in range(ngpu):
        ht.links.extend((f"gpu{i}", f"nvswitch{k}", _link("nvlink", n * link_bw, lat, n)) for k, n in enumerate(links))


def rack_switch_id(domain: int | None, k: int) -> str:
    """Id of rack-level NVLink switch ``k``: ``nvl/sw<k>`` (one domain) or ``nvl<d>/sw<k>``."""
    return f"nvl/sw{k}" if domain is None else f"nvl{domain}/sw{k}"


def _add_host(g: nx.DiGraph, nodes: list[tuple[str, dict]], links: list[tuple[str, str, dict]]) -> None:
    """``g.add_nodes_from(nodes)``, then ``g.add_edges_from`` of ``links`` and of their reverses, written
    into networkx's adjacency dicts directly (the same graph in the same order, each link's attributes
    the template's dict, shared by the hosts: a third of the time and of the memory on 12,500 hosts).
    Falls back to the networkx calls when a node is already in ``g``."""
    node, succ, pred = g._node, g._succ, g._pred
    if any(n in node for n, _ in nodes):
        g.add_nodes_from(nodes)
        g.add_edges_from(links)
        g.add_edges_from((b, a, d) for a, b, d in links)
        return
    for n, a in nodes:
        succ[n] = {}
        pred[n] = {}
        node[n] = a
    for pairs in (((a, b, d) for a, b, d in links), ((b, a, d) for a, b, d in links)):
        for u, v, d in pairs:
            if u not in node or v not in node:  # a link to a node the template lacks: networkx adds it
                g.add_edge(u, v, **d)
                continue
            dd = succ[u].get(v)
            # the template's attribute dict itself, shared by every host (the graph is frozen: nothing
            # writes to it); a link listed twice gets a merged copy, as networkx would merge them
            succ[u][v] = pred[v][u] = d if dd is None else {**dd, **d}
    clear_view_cache(g)


def clear_view_cache(g: nx.DiGraph) -> None:
    """Drop the views networkx (3.3 and later) caches of ``g``: after writing into its dicts directly."""
    clear = getattr(nx, "_clear_cache", None)  # networkx >= 3.3 caches views of a graph
    if clear is not None:
        clear(g)


class _Stamp:
    """A template's local adjacency, made once (:func:`_add_host` on the local ids), and copied per
    host with its ids prefixed: the graph :func:`_add_host` makes, in the same order, sharing the
    same attribute dicts, without building each host's node and link lists."""

    def __init__(self, ht: HostTemplate):
        local = nx.DiGraph()
        _add_host(local, ht.nodes, ht.links)
        self.ok = len(local) == len(ht.nodes)  # else a link to a node the template lacks: stamp the slow way
        self.nodes = [(n, a, list(local._succ[n].items()), list(local._pred[n].items())) for n, a in ht.nodes]
        self.names = [n for n, _ in ht.nodes]

    def onto(self, g: nx.DiGraph, host: str) -> bool:
        """Add ``host``'s copy to ``g``; False (nothing added) when one of its nodes is already there."""
        p = host + "/"
        node, succ, pred = g._node, g._succ, g._pred
        ids = {n: p + n for n in self.names}
        if any(map(node.__contains__, ids.values())):
            return False
        for n, a, out, into in self.nodes:
            gn = ids[n]
            node[gn] = {**a, "host": host}
            succ[gn] = {ids[v]: d for v, d in out}
            pred[gn] = {ids[u]: d for u, d in into}
        return True


def expand(g: nx.DiGraph, ht: HostTemplate, hosts: list[str]) -> None:
    """Add one copy of the template per host name to ``g`` (both link directions)."""
    nodes, links = ht.nodes, ht.links
    domains = None
    if ht.rack_switches and ht.domain_hosts is not None and ht.domain_hosts < len(hosts):
        domains = ht.domain_hosts
    stamp = _Stamp(ht) if len(hosts) > 1 else None
    for hi, h in enumerate(hosts):
        p = h + "/"
        if stamp is None or not stamp.ok or not stamp.onto(g, h):
            _add_host(g, [(p + n, {**a, "host": h}) for n, a in nodes], [(p + a, p + b, d) for a, b, d in links])
        if ht.rack_switches:
            dom = hi // domains if domains else None
            for k in range(ht.rack_switches):
                sw = rack_switch_id(dom, k)
                if sw not in g:
                    g.add_node(sw, kind="nvswitch")
            g.add_edges_from((p + a, rack_switch_id(dom, k), d) for a, k, d in ht.rack_links)
            g.add_edges_from((rack_switch_id(dom, k), p + a, d) for a, k, d in ht.rack_links)
    clear_view_cache(g)
