"""NCCL topology XML (``NCCL_TOPO_FILE`` / ``NCCL_TOPO_DUMP_FILE``) <-> Topology, and NCCL graph XML.

Format (src/graph/xml.cc and xml.h of NCCL 2.30.7, https://github.com/NVIDIA/nccl)::

    <system version="1">
      <cpu numaid="0" affinity=".." arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
        <pci busid="0000:16:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">
          <pci busid="0000:18:00.0" class="0x030200" ...>
            <gpu dev="0" sm="90" rank="0" gdr="1">
              <nvlink target="0000:07:00.0" count="5" tclass="0x068000"/>
              <c2c bw="56376" count="7"/>
            </gpu>
          </pci>
          <pci busid="0000:19:00.0" class="0x020000"><nic><net name="mlx5_0" dev="0" speed="400000" .../></nic></pci>
        </pci>
        <nic><net name="eth0" .../></nic>      (a NIC not on PCI hangs off the CPU)
      </cpu>
    </system>

Import (:func:`import_xml`): ``cpu`` -> a ``cpu`` node (NUMA id as given, -1 in
VMs), joined to the host's other CPUs by ``smp`` links (NCCL's
ncclTopoConnectCpus, bandwidth by CPU family); ``pci`` of a bridge class ->
``pcie_switch``; of a GPU class (0x03....) -> ``gpu`` (partial vendor files
list GPUs as bare ``pci`` elements: they get indices in bus id order); of a
NIC class (0x02....) -> one ``nic`` per ``net`` (or one unnamed NIC);
``nvlink`` -> ``nvlink`` links to the target GPU, or to an ``nvswitch`` node
per target bus id (NCCL merges switches; we keep them), ``fffffff:ff:ff.0``
-> one ``assumed`` switch; ``c2c`` -> a ``c2c`` link to the GPU's CPU
(``bw`` MB/s per link x count / 1000). The PCIe link above each ``pci`` has
NCCL's bandwidth from ``link_speed``/``link_width``. Several ``host_hash``
values split a multi-host (MNNVL) dump into hosts.

Every attribute NCCL defines but the model does not use (and every unknown
one) is kept on the node under ``x_nccl`` = ``{tag: {attr: value}}`` and written
back on export, so import -> export -> import is the identity; modelled
attributes are ``busid`` (-> ``pci``), ``numaid`` (-> ``numa``), ``dev`` (->
``index``), ``sm``, ``name`` and ``speed`` (-> ``bw`` = speed/8000 GB/s). NICs are
numbered by their ``<net dev>`` (NCCL's net device index) where every NIC of a host
has a distinct one, else in bus id order; the export writes each NIC's number as its
``dev``, so a NIC keeps its number through a file.

A file that yields no GPU, names a NUMA node, a bus id or a GPU ``dev`` twice
in one host, nests PCIe deeper than :data:`MAX_PCI_DEPTH` levels or asks for
more nodes or links than the caps of :mod:`treecoll.topo.limits` is refused with a
:class:`~topo.errors.TopologyError` naming the file (``source=`` names text
given directly) and the element.

Export (:func:`export_xml`) writes one host as a file NCCL can read (every
attribute NCCL requires is present for nodes that did not come from XML).
:func:`parse_graph_xml` reads the other NCCL format (``NCCL_GRAPH_FILE``:
rings/trees as channels) into plain data for the custom-tree import.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from typing import Any
from xml.parsers import expat

import networkx as nx

from .errors import TopologyError
from .files import decode_text, read_text
from .hostgraph import GPU_PCI_IDS, HostBuilder, net_bw, nvlink_bw, smp_bw
from .limits import limits as make_limits
from .model import Topology
from .nvml import norm_busid
from .sysfs import pcie_bw

__all__ = [
    "import_xml",
    "export_xml",
    "parse_graph_xml",
    "GRAPH_PATTERNS",
    "looks_like_nccl_xml",
    "looks_like_nccl_graph",
    "mask_to_cpulist",
    "cpulist_to_mask",
]

#: NCCL graph patterns (src/graph/search.cc, NCCL_TOPO_PATTERN_*)
GRAPH_PATTERNS = {1: "balanced_tree", 2: "split_tree", 3: "tree", 4: "ring", 5: "nvls", 6: "collnet_direct"}
_INVISIBLE = "fffffff:ff:ff.0"  # NCCL's target for an NVLink peer not visible on PCI
_MODELLED = {"cpu": {"numaid"}, "pci": {"busid"}, "gpu": {"dev", "sm"}, "net": {"name", "speed"}, "nic": set()}
_NVSWITCH_CLASS = "0x068000"
_GPU_CLASS = "0x030200"
#: deepest nesting of <pci> elements accepted (real hosts have a handful of switch levels)
MAX_PCI_DEPTH = 64


def looks_like_nccl_xml(text: str) -> bool:
    """True for an NCCL topology file (a ``<system`` root), used by ``treecoll topo import``."""
    return "<system" in text[:4096]


def looks_like_nccl_graph(text: str) -> bool:
    """True for an NCCL graph file (NCCL_GRAPH_FILE: XML with a ``<graphs`` root), which the readers of
    topologies and tree files name instead of failing on its shape.

    >>> looks_like_nccl_graph('<graphs version="1"><graph id="0"/></graphs>'), looks_like_nccl_graph("parents: [-1]")
    (True, False)
    """
    return text.lstrip().startswith("<") and "<graphs" in text[:4096]


def _read(src: str | bytes | os.PathLike, source: str | None, what: str) -> tuple[str, str]:
    """(where, text) of XML given as a path, the text itself (starting with '<') or its bytes."""
    if isinstance(src, (bytes, bytearray)):
        where = source or "<string>"
        return where, decode_text(bytes(src), where, what)
    if isinstance(src, str) and src.lstrip("\ufeff \t\r\n").startswith("<"):
        return source or "<string>", src
    if isinstance(src, str) and not src.strip():
        raise TopologyError(f"{source or '<string>'}: expected XML text or a file name, got an empty string")
    path = os.fspath(src)
    return source or str(path), read_text(path, what)


class _Where(str):
    """The file name, with :meth:`at` giving ``"file:line"`` of an element (expat records where each starts)."""

    lines: dict

    def at(self, el: ET.Element | None) -> str:
        line = self.lines.get(el) if el is not None else None
        return f"{self}:{line}" if line else str(self)


def _parse(where: str, text: str) -> tuple[ET.Element, _Where]:
    """The root element and a :class:`_Where` that knows every element's line.

    expat (through ``xml.parsers.expat``, as ElementTree uses it) refuses entity
    expansion bombs itself ("limit on input amplification factor").
    """
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate()
    lines: dict[ET.Element, int] = {}

    def start(tag: str, attrs: dict) -> None:
        lines[builder.start(tag, attrs)] = parser.CurrentLineNumber

    parser.StartElementHandler = start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(text, True)
        root = builder.close()
    except expat.ExpatError as e:
        raise TopologyError(
            f"{where}:{e.lineno}: expected well-formed XML, got {expat.ErrorString(e.code)}: "
            f"line {e.lineno}, column {e.offset + 1}"
        ) from None
    except ValueError as e:  # e.g. a document with no element at all
        raise TopologyError(f"{where}: expected well-formed XML, got {e}") from None
    w = _Where(where)
    w.lines = lines
    return root, w


def _extra(el: ET.Element, tag: str) -> dict[str, str]:
    return {k: v for k, v in el.attrib.items() if k not in _MODELLED.get(tag, set())}


def _int(v: Any, where: str, what: str) -> int:
    try:
        return int(str(v), 0) if str(v).lower().startswith("0x") else int(str(v))
    except ValueError:
        raise TopologyError(f"{where}: {what} expected an integer, got {str(v)[:40]!r}") from None


def _digits(v: str | None) -> int | None:
    """An attribute that holds a small ASCII decimal integer, else None."""
    return int(v) if v is not None and v.isascii() and v.isdecimal() and len(v) <= 9 else None


def _cls_int(v: str | None) -> int | None:
    try:
        return int(v, 16) if v else None
    except ValueError:
        return None


def _cls(el: ET.Element) -> int | None:
    c = el.get("class")
    try:
        return int(c, 16) if c else None
    except ValueError:
        return None


def import_xml(
    src: str | bytes | os.PathLike,
    *,
    host: str = "host0",
    name: str | None = None,
    source: str | None = None,
    max_nodes: int | None = None,
    max_links: int | None = None,
    require_gpus: bool = True,
) -> Topology:
    """An NCCL topology XML (a path, or the text itself or its bytes) as a Topology.

    ``host`` names the host (``"<host>/gpu0"``...); a multi-host dump gets
    ``"<host>-<i>"`` per distinct ``host_hash``. ``source`` names text in errors
    and ``meta["source"]`` (default: the path, or ``"<string>"``); ``max_nodes``
    / ``max_links``: the caps of :mod:`treecoll.topo.limits`. Malformed input raises
    TopologyError naming the file, line and element; so does a file without
    GPUs unless ``require_gpus`` is False (discovery reads a partial
    NCCL_TOPO_FILE that way: vendors' files may list only the PCIe bridges).
    """
    where, text = _read(src, source, "the NCCL topology file")
    lim = make_limits(max_nodes, max_links)
    root, where = _parse(where, text)
    if root.tag != "system":
        raise TopologyError(f"{where}: root element expected <system>, got <{root.tag[:40]}>")
    if root.get("version", "1") != "1":
        raise TopologyError(
            f'{where.at(root)}: <system version> expected "1" (NCCL_TOPO_XML_VERSION), got {root.get("version")[:40]!r}'
        )
    cpus = [c for c in root if c.tag == "cpu"]
    hashes = list(dict.fromkeys(c.get("host_hash", "") for c in cpus))
    hostname = {hh: (host if len(hashes) <= 1 else f"{host}-{i}") for i, hh in enumerate(hashes)}
    builders: dict[str, HostBuilder] = {}
    gpus_by_pci: dict[tuple[str, str], Any] = {}
    pending_nvlinks: list[tuple[HostBuilder, Any, ET.Element, int | None]] = []
    busids: set[tuple[str, str]] = set()
    elements = sum(1 for _ in root.iter())
    msg = lim.excess(
        elements,
        2 * elements + len(cpus) * (len(cpus) - 1),
        f"{elements:,} XML elements and {len(cpus):,} CPUs (linked pairwise)",
    )
    if msg is not None:
        raise TopologyError(msg, where=where)
    declared: dict[str, set] = {}  # per host: the NUMA ids the -1 domains of a VM must not take
    for c in cpus:
        declared.setdefault(c.get("host_hash", ""), set()).add(_digits(c.get("numaid")))
    for ci, cpu in enumerate(cpus):
        h = hostname[cpu.get("host_hash", "")]
        b = builders.setdefault(h, HostBuilder(h))
        if cpu.get("numaid") is None:
            raise TopologyError(f"{where.at(cpu)}: <cpu> #{ci}: attribute numaid is required")
        numa = _int(cpu.get("numaid"), where.at(cpu), f"<cpu> #{ci} numaid")
        xcpu = _extra(cpu, "cpu")
        taken = {it["attrs"]["numa"] for it in b.items.values() if it["kind"] == "cpu"}
        if numa < 0:  # VMs: numaid="-1"; the model wants a domain id, the file's value is kept
            xcpu["numaid"] = cpu.get("numaid")
            avoid = taken | declared[cpu.get("host_hash", "")]
            numa = next(k for k in range(len(avoid) + 1) if k not in avoid)
        elif numa in taken:
            raise TopologyError(
                f"{where.at(cpu)}: <cpu> #{ci}: numaid {numa} appears twice in host {h!r}: "
                f"expected one <cpu> per NUMA node"
            )
        ck = ("cpu", numa)
        b.add(ck, "cpu", numa=numa, affinity=mask_to_cpulist(cpu.get("affinity")), x_nccl={"cpu": xcpu})
        for child in cpu:
            _walk(b, child, ck, ck, where, gpus_by_pci, pending_nvlinks, h, busids)
    if not gpus_by_pci and require_gpus:
        raise TopologyError(
            f"{where}: expected at least one GPU (a <gpu> element, or a <pci> of class 0x03....), "
            f"got none: a topology without GPUs has no ranks (a partial vendor file may list only "
            f"PCIe bridges, NCCL adds the GPUs it finds when it runs)"
        )
    for b in builders.values():
        _number_gpus(b)
        _number_nics(b)
        cpu_keys = [k for k, it in b.items.items() if it["kind"] == "cpu"]
        for i, a in enumerate(cpu_keys):
            xa = b.items[a]["attrs"]["x_nccl"]["cpu"]
            bw = smp_bw(xa.get("arch"), xa.get("vendor"), xa.get("familyid"), xa.get("modelid"))
            for c in cpu_keys[i + 1 :]:
                b.link(a, c, "smp", bw)
    for b, gk, gpu_el, sm in pending_nvlinks:
        _nvlinks(b, gk, gpu_el, sm, gpus_by_pci, where)
    g = nx.DiGraph()
    for b in builders.values():
        b.build(g)
    meta = {"source": f"nccl-xml:{where}"}
    if root.attrib:
        meta["xml_system"] = dict(root.attrib)
    return Topology(g, name=name or root.get("name") or host, meta=meta)


def _walk(
    b: HostBuilder,
    el: ET.Element,
    parent: Any,
    cpu: Any,
    where: str,
    gpus_by_pci: dict,
    pending: list,
    h: str,
    seen: set,
    depth: int = 1,
) -> None:
    if depth > MAX_PCI_DEPTH:
        raise TopologyError(
            f"{where.at(el)}: <pci busid={el.get('busid')!r}>: nested deeper than {MAX_PCI_DEPTH} "
            f"levels of <pci>: expected a PCIe tree a few switches deep"
        )
    if el.tag == "nic":  # NIC not on PCI: directly under the CPU
        for k in _nic(b, el, None, where):
            b.link(k, parent, "pcie", pcie_bw(None, None))
        return
    if el.tag != "pci":
        b.items[parent]["attrs"].setdefault("x_nccl", {}).setdefault("children", []).append(
            {"tag": el.tag, **el.attrib}
        )  # pcilink and unknown elements: preserved
        return
    busid = el.get("busid")
    if not busid:
        raise TopologyError(
            f"{where.at(el)}: <pci> under {b.items[parent]['kind']} {parent[1]!r}: attribute busid is required"
        )
    pci = norm_busid(busid) or busid.lower()
    if (h, pci) in seen:
        raise TopologyError(
            f"{where.at(el)}: <pci busid={busid!r}>: bus id appears twice in host {h!r}: expected each PCI device once"
        )
    seen.add((h, pci))
    cls = _cls(el)
    width = _int(el.get("link_width") or 0, where.at(el), f"<pci busid={busid!r}> link_width")
    if not 0 <= width <= 64:
        raise TopologyError(
            f"{where.at(el)}: <pci busid={busid!r}> link_width: expected 1..64 lanes (0: unknown), got {width}"
        )
    bw = pcie_bw(el.get("link_speed"), width)
    gpu_el = el.find("gpu")
    nic_el = el.find("nic")
    xml = {"pci": _extra(el, "pci")}
    if gpu_el is not None or (cls is not None and cls >> 16 == 0x03):
        key = ("gpu", pci)
        attrs: dict[str, Any] = {}
        sm = None
        if gpu_el is not None:
            xml["gpu"] = _extra(gpu_el, "gpu")
            other = [{"tag": c.tag, **c.attrib} for c in gpu_el if c.tag not in ("nvlink", "c2c")]
            if other:  # elements of newer NCCL versions: preserved
                xml["gpu_children"] = other
            if gpu_el.get("dev") is not None:
                dev = attrs["index"] = _int(gpu_el.get("dev"), where.at(gpu_el), f"<gpu> of {busid!r} dev")
                if dev < 0 or ("dev", h, dev) in seen:
                    raise TopologyError(
                        f"{where.at(gpu_el)}: <gpu dev={dev}> of {busid!r}: expected each GPU dev once "
                        f"in host {h!r}, as a non-negative integer"
                    )
                seen.add(("dev", h, dev))
            if gpu_el.get("sm") is not None:
                sm = attrs["sm"] = _int(gpu_el.get("sm"), where.at(gpu_el), f"<gpu> of {busid!r} sm")
            pending.append((b, key, gpu_el, sm))
        known = GPU_PCI_IDS.get(_cls_int(el.get("device")))
        if known is not None:  # model, memory bandwidth and capacity from the PCI device id; sm if the file has none
            attrs.update(model=known[0], mem_bw=known[1], mem_gb=known[3])
            attrs.setdefault("sm", known[2])
        b.add(key, "gpu", pci=pci, numa=cpu[1], x_nccl=xml, **attrs)
        gpus_by_pci[(h, pci)] = key
        b.link(key, parent, "pcie", bw)
        for c2c in gpu_el.findall("c2c") if gpu_el is not None else []:
            cnt = _int(c2c.get("count", "1"), where.at(c2c), f"<c2c> of {busid!r} count")
            per = _number(c2c.get("bw", "0") or "0", where.at(c2c), f"<c2c> of {busid!r} bw (MB/s per link)")
            if cnt < 1 or cnt > 1024:
                raise TopologyError(f"{where.at(c2c)}: <c2c> of {busid!r} count: expected 1..1024 links, got {cnt}")
            b.link(key, cpu, "c2c", per * cnt / 1000 if per > 0 else 1.0, count=cnt)
        return
    if nic_el is not None or (cls is not None and cls >> 16 == 0x02):
        keys = _nic(b, nic_el, pci, where) if nic_el is not None else [b.add(("nic", pci, None), "nic", pci=pci)]
        for k in keys:
            b.items[k]["attrs"].setdefault("x_nccl", {}).update(xml)
            b.link(k, parent, "pcie", bw)
        return
    kind = "nvswitch" if el.get("class") == _NVSWITCH_CLASS else "pcie_switch"
    key = ("sw", pci)
    b.add(key, kind, pci=pci, x_nccl=xml)
    b.link(key, parent, "pcie", bw)
    for child in el:
        _walk(b, child, key, cpu, where, gpus_by_pci, pending, h, seen, depth + 1)


def _number(v: str, where: str, what: str) -> float:
    try:
        x = float(v)
    except ValueError:
        x = float("nan")
    if not 0 <= x < float("inf"):
        raise TopologyError(f"{where}: {what}: expected a number >= 0, got {v!r}")
    return x


def _nic(b: HostBuilder, nic_el: ET.Element, pci: str | None, where: str) -> list:
    keys = []
    nets = nic_el.findall("net")
    for i, net in enumerate(nets or [None]):
        if net is None:
            keys.append(b.add(("nic", pci, None), "nic", pci=pci, x_nccl={"nic": dict(nic_el.attrib)}))
            continue
        name = net.get("name") or f"net{i}"
        speed = net.get("speed")
        xml = {"net": _extra(net, "net")}
        if nic_el.attrib:
            xml["nic"] = dict(nic_el.attrib)
        rail = _digits(net.get("rail"))  # NCCL 2.30 net attribute (kept in x_nccl as well)
        k = b.add(
            ("nic", pci, name),
            "nic",
            pci=pci,
            name=name,
            rail=rail,
            bw=net_bw(_int(speed, where.at(net), f"<net name={name!r}> speed") if speed else 0),
            lat=_net_latency(net, name, where),
            x_nccl=xml,
        )
        keys.append(k)
    return keys


def _net_latency(net: ET.Element, name: str, where: str) -> float | None:
    """A ``<net latency>`` above 0 (µs: what the net plugin reports; NCCL adds it per inter-node step), else None."""
    text = net.get("latency")
    if text is None:
        return None
    try:
        lat = float(text)
    except ValueError:
        lat = float("nan")
    if not (lat >= 0 and lat != float("inf")):
        raise TopologyError(f"{where.at(net)}: <net name={name!r}> latency: expected a number >= 0 (µs), got {text!r}")
    return lat or None


def _number_gpus(b: HostBuilder) -> None:
    gpus = [(k, it["attrs"]) for k, it in b.items.items() if it["kind"] == "gpu"]
    used = {a["index"] for _, a in gpus if "index" in a}  # distinct and >= 0 (checked in _walk)
    nxt = 0
    for _, a in sorted(gpus, key=lambda ka: ka[1].get("pci", "")):
        if "index" in a:
            continue
        while nxt in used:
            nxt += 1
        a["index"] = nxt
        used.add(nxt)


def _number_nics(b: HostBuilder) -> None:
    """NICs numbered by their ``<net dev>`` (NCCL's net device index, the ``NET/IB/<dev>`` of its logs) when
    every NIC of the host has a distinct one; else in PCI bus id order (:class:`HostBuilder`'s rule)."""
    nics = [it["attrs"] for it in b.items.values() if it["kind"] == "nic"]
    devs = [_digits(((a.get("x_nccl") or {}).get("net") or {}).get("dev")) for a in nics]
    if nics and None not in devs and len(set(devs)) == len(devs):
        for a, dev in zip(nics, devs):
            a["id"] = f"{b.host}/nic{dev}"


def _nvlinks(b: HostBuilder, gk: Any, gpu_el: ET.Element, sm: int | None, gpus_by_pci: dict, where: str) -> None:
    per_link = nvlink_bw(sm)
    for nv in gpu_el.findall("nvlink"):
        tgt = nv.get("target", "")
        cnt = _int(nv.get("count", "1"), where.at(nv), f"<nvlink target={tgt!r}> count")
        if not 1 <= cnt <= 1024:
            raise TopologyError(f"{where.at(nv)}: <nvlink target={tgt!r}> count: expected 1..1024 links, got {cnt}")
        tpci = norm_busid(tgt)
        tclass = (nv.get("tclass") or "").lower()
        extra = {k: v for k, v in nv.attrib.items() if k not in ("target", "count", "tclass")}
        if extra:
            b.items[gk]["attrs"]["x_nccl"].setdefault("nvlink", {})[tgt] = extra
        if tclass.startswith("0x03"):
            peer = gpus_by_pci.get((b.host, tpci))
            if peer is None or peer == gk:
                # NCv4 lists an NVLink to itself (bridge partner not in the VM): preserved, not modelled
                b.items[gk]["attrs"]["x_nccl"].setdefault("nvlink_unresolved", []).append(dict(nv.attrib))
                continue
            b.link(gk, peer, "nvlink", cnt * per_link, count=cnt)
        elif tclass == "0x068001":  # NVLink to a CPU (POWER9)
            cpu = next(
                k
                for k, it in b.items.items()
                if it["kind"] == "cpu" and it["attrs"]["numa"] == b.items[gk]["attrs"]["numa"]
            )
            b.link(gk, cpu, "nvlink", cnt * per_link, count=cnt)
        else:
            sk = ("nvs", tpci)
            if tpci is None:
                b.add(sk, "nvswitch", assumed=True)
            else:
                b.add(sk, "nvswitch", pci=tpci)
            b.link(gk, sk, "nvlink", cnt * per_link, count=cnt)


def mask_to_cpulist(mask: str | None) -> str | None:
    """NCCL's cpumask (comma-separated 32-bit hex words, most significant first) -> cpulist.

    >>> mask_to_cpulist("000000ff,ffff0000,00ffffff"), mask_to_cpulist("0,0")
    ('0-23,48-71', None)
    """
    if not mask:
        return None
    try:
        v = int(mask.replace(",", ""), 16)
    except ValueError:
        return None
    cpus = [i for i, bit in enumerate(bin(v)[:1:-1]) if bit == "1"]  # linear in the mask's length
    if not cpus:
        return None
    runs, start = [], cpus[0]
    for a, b in zip(cpus, cpus[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a > start else f"{a}")
            start = b
    return ",".join(runs)


def cpulist_to_mask(cpulist: str) -> str:
    """Inverse of :func:`mask_to_cpulist` (at least one 32-bit word)."""
    from .sysfs import parse_cpulist

    cpus = set(parse_cpulist(cpulist))
    bits = "".join("1" if c in cpus else "0" for c in range(max(cpus, default=0), -1, -1))
    v = int(bits, 2)  # linear in the number of CPUs
    words = max(1, (v.bit_length() + 31) // 32)
    return ",".join(f"{v >> (32 * i) & 0xFFFFFFFF:08x}" for i in reversed(range(words)))


# ---------------------------------------------------------------------------------------- export
def _fmt_speed(bw: float, width: int) -> str:
    code = bw * 80 / max(width, 1)
    for s, c in (
        ("2.5 GT/s", 15),
        ("5 GT/s", 30),
        ("8 GT/s", 60),
        ("16 GT/s", 120),
        ("32.0 GT/s PCIe", 240),
        ("64.0 GT/s PCIe", 480),
    ):
        if abs(code - c) < 1e-6:
            return s
    return "8 GT/s"


def export_xml(topo: Topology, host: str | None = None) -> str:
    """One host of ``topo`` as NCCL topology XML text (NCCL_TOPO_FILE format).

    Devices without a bus id (YAML topologies) get synthetic ones in PCI
    domain ``fffe``; CPU-only rank slots are left out; nodes that came from an
    NCCL file get their original attributes back. NCCL's limit of 256 XML
    nodes per host is not checked.
    """
    g = topo.graph
    host = host or (topo.hosts()[0] if topo.hosts() else None)
    if host is None:
        raise TopologyError(f"topology {topo.name!r}: expected at least one host to export")
    cpus = sorted(topo.nodes("cpu", host), key=lambda n: g.nodes[n].get("numa", 0))
    if not cpus:
        raise TopologyError(f"host {host!r}: expected at least one cpu node to export")
    parent: dict[str, str] = {}
    frontier = list(cpus)
    seen = set(cpus)
    while frontier:  # BFS over PCIe links from the CPUs: the PCIe tree
        nxt = []
        for u in frontier:
            for v in sorted(g.successors(u)):
                d = g.edges[u, v]
                if v in seen or d["kind"] != "pcie" or g.nodes[v].get("host") != host:
                    continue
                if g.nodes[u]["kind"] in ("gpu", "nic"):
                    continue
                seen.add(v)
                parent[v] = u
                nxt.append(v)
        frontier = nxt
    children: dict[str, list[str]] = {}
    for v, u in parent.items():
        children.setdefault(u, []).append(v)
    # devices without a bus id (YAML topologies) get synthetic ones in domain fffe, in id order;
    # CPU-only rank slots (model cpu / cpu-process) are not PCI devices and are left out;
    # a NIC without bus id right under a CPU is written as NCCL's non-PCI <cpu><nic>
    synth: dict[str, str] = {}
    for n in sorted(topo.nodes(host=host)) + sorted(n for n in topo.nodes("nvswitch") if "host" not in g.nodes[n]):
        d = g.nodes[n]
        nic_on_cpu = d["kind"] == "nic" and g.nodes.get(parent.get(n), {}).get("kind") == "cpu"
        if (
            d["kind"] in ("gpu", "nic", "pcie_switch", "nvswitch")
            and not d.get("pci")
            and not nic_on_cpu
            and not d.get("assumed")
            and not (d["kind"] == "gpu" and str(d.get("model", "")).startswith("cpu"))
        ):
            k = len(synth)
            synth[n] = f"fffe:{k // 32:02x}:{k % 32:02x}.0"
    g = _with_pci(g, synth)
    root = ET.Element("system", dict(topo.meta.get("xml_system") or {"version": "1"}))
    for c in cpus:
        d = g.nodes[c]
        x = dict((d.get("x_nccl") or {}).get("cpu") or {})
        attrs = {"numaid": str(d.get("numa", 0))}
        if d.get("affinity") and "affinity" not in x:
            attrs["affinity"] = cpulist_to_mask(d["affinity"])
        attrs.update(x)
        cel = ET.SubElement(root, "cpu", attrs)
        _export_children(g, c, children, cel)
        for ch in (d.get("x_nccl") or {}).get("children", []):
            ET.SubElement(cel, ch["tag"], {k: v for k, v in ch.items() if k != "tag"})
    ET.indent(root, "  ")
    return ET.tostring(root, encoding="unicode").replace(" />", "/>") + "\n"  # NCCL's own dump style


def _with_pci(g: nx.DiGraph, synth: dict[str, str]) -> nx.DiGraph:
    if not synth:
        return g
    h = nx.DiGraph(g)
    for n, busid in synth.items():
        h.nodes[n]["pci"] = busid
    return h


def _export_children(g: nx.DiGraph, u: str, children: dict, el: ET.Element) -> None:
    nic_groups: dict[str, list[str]] = {}
    for v in sorted(children.get(u, []), key=lambda n: (g.nodes[n].get("pci") or "~", n)):
        d = g.nodes[v]
        if d["kind"] == "nic":
            nic_groups.setdefault(d.get("pci") or f"~{v}", []).append(v)
            continue
        if d["kind"] == "gpu" and not d.get("pci"):
            continue
        pel = ET.SubElement(el, "pci", _pci_attrs(g, v, u))
        if d["kind"] == "gpu":
            _export_gpu(g, v, pel)
        else:
            _export_children(g, v, children, pel)
        for ch in (d.get("x_nccl") or {}).get("children", []):
            ET.SubElement(pel, ch["tag"], {k: x for k, x in ch.items() if k != "tag"})
    for nics in nic_groups.values():
        first = g.nodes[nics[0]]
        holder = ET.SubElement(el, "pci", _pci_attrs(g, nics[0], u)) if first.get("pci") else el
        fx = first.get("x_nccl")
        if fx is not None and "net" not in fx and "nic" not in fx and not first.get("name"):
            continue  # partial file: a bare <pci> for this NIC
        nel = ET.SubElement(holder, "nic", dict((first.get("x_nccl") or {}).get("nic") or {}))
        for i, n in enumerate(nics):
            d = g.nodes[n]
            x = d.get("x_nccl") or {}
            if "net" not in x and not d.get("name") and "nic" in x:
                continue  # a NIC element without <net> in the source
            attrs = {"name": d.get("name") or n.split("/")[-1], **(x.get("net") or {"dev": _nic_number(n, i)})}
            attrs["speed"] = str(int(round(d.get("bw", 1.25) * 8000)))
            if d.get("lat"):
                attrs["latency"] = f"{float(d['lat']):.6f}"
            ET.SubElement(nel, "net", attrs)


def _nic_number(node: str, fallback: int) -> str:
    """A NIC's ``<net dev>``: its number on the host (``h0/nic3`` -> ``"3"``), which an import numbers it by."""
    m = re.search(r"/nic(\d+)$", node)
    return m.group(1) if m else str(fallback)


def _pci_attrs(g: nx.DiGraph, v: str, up: str) -> dict[str, str]:
    d = g.nodes[v]
    x = (d.get("x_nccl") or {}).get("pci")
    out = {"busid": d.get("pci") or "ffff:ff:ff.0"}
    if x is not None:
        out.update(x)
        return out
    e = g.edges[v, up]
    cls = {"gpu": _GPU_CLASS, "nic": "0x020000", "nvswitch": _NVSWITCH_CLASS}.get(d["kind"], "0x060400")
    out.update({"class": cls, "link_speed": _fmt_speed(e["bw"], 16), "link_width": "16"})
    return out


def _export_gpu(g: nx.DiGraph, v: str, pel: ET.Element) -> None:
    d = g.nodes[v]
    x = d.get("x_nccl") or {}
    if (
        "gpu" not in x
        and "x_nccl" in d
        and not any(g.edges[v, w]["kind"] in ("nvlink", "c2c") for w in g.successors(v))
    ):
        return  # partial file: bare <pci> for this GPU
    attrs = {"dev": str(d.get("index", 0))}
    if d.get("sm") is not None:
        attrs["sm"] = str(d["sm"])
    attrs.update(x.get("gpu") or {"rank": str(d.get("rank", d.get("index", 0))), "gdr": "1"})
    gel = ET.SubElement(pel, "gpu", attrs)
    for w in sorted(g.successors(v), key=lambda n: (g.nodes[n].get("pci") or _INVISIBLE, n)):
        e = g.edges[v, w]
        wd = g.nodes[w]
        if e["kind"] == "nvlink":
            tgt = wd.get("pci") or _INVISIBLE
            tclass = {"gpu": _GPU_CLASS, "cpu": "0x068001"}.get(wd["kind"], _NVSWITCH_CLASS)
            a = {"target": tgt, "count": str(e.get("count", 1)), "tclass": tclass}
            a.update((x.get("nvlink") or {}).get(tgt, {}))
            ET.SubElement(gel, "nvlink", a)
        elif e["kind"] == "c2c":
            cnt = e.get("count", 1)
            ET.SubElement(gel, "c2c", {"bw": str(int(round(e["bw"] * 1000 / cnt))), "count": str(cnt)})
    for nv in x.get("nvlink_unresolved", []):
        ET.SubElement(gel, "nvlink", dict(nv))
    for ch in x.get("gpu_children", []):
        ET.SubElement(gel, ch["tag"], {k: v for k, v in ch.items() if k != "tag"})


# ---------------------------------------------------------------------------------------- graphs
def parse_graph_xml(src: str | os.PathLike, *, source: str | None = None) -> dict[str, Any]:
    """An ``NCCL_GRAPH_FILE`` (path or text) as plain data; ``source`` names text in errors.

    Returns ``{"version": 1, "graphs": [graph, ...]}`` where each graph is
    ``{"id": int, "pattern": int, "pattern_name": "ring" | "tree" | "balanced_tree" |
    "split_tree" | "nvls" | "collnet_direct", "nchannels": int, "crossnic": int,
    "speedintra": float, "speedinter": float (GB/s), "latencyinter": float,
    "typeintra": str, "typeinter": str (NCCL path classes), "samechannels": int,
    "channels": [{"gpus": [dev, ...], "ranks": [rank | None, ...],
    "net_in": dev | None, "net_out": dev | None}, ...]}``.
    A ring channel lists the GPUs in ring order; a tree channel lists them from
    the tree root down the chain (NCCL's intra-node tree is a chain).
    """
    where, text = _read(src, source, "the NCCL graph file")
    root, where = _parse(where, text)
    if root.tag != "graphs":
        raise TopologyError(f"{where}: root element expected <graphs>, got <{root.tag[:40]}>")
    out: dict[str, Any] = {"version": _int(root.get("version", "1"), where, "<graphs> version"), "graphs": []}
    for gi, gel in enumerate(root.findall("graph")):

        def num(k, conv=int, default="0", gel=gel, gi=gi):
            v = gel.get(k, default)
            try:
                return conv(v)
            except ValueError:
                raise TopologyError(f"{where.at(gel)}: <graph> #{gi} {k} expected a number, got {v[:40]!r}") from None

        pat = num("pattern")
        chans = []
        for ch in gel.findall("channel"):
            nets = [_int(n.get("dev"), where.at(n), "<net> dev") for n in ch.findall("net")]
            gpus = ch.findall("gpu")
            chans.append(
                {
                    "gpus": [_int(x.get("dev"), where.at(x), "<gpu> dev") for x in gpus],
                    "ranks": [
                        _int(x.get("rank"), where.at(x), "<gpu> rank") if x.get("rank") is not None else None
                        for x in gpus
                    ],
                    "net_in": nets[0] if nets else None,
                    "net_out": nets[-1] if nets else None,
                }
            )
        nch = num("nchannels", int, str(len(chans)))
        out["graphs"].append(
            {
                "id": num("id"),
                "pattern": pat,
                "pattern_name": GRAPH_PATTERNS.get(pat, f"pattern{pat}"),
                "nchannels": nch,
                "crossnic": num("crossnic"),
                "speedintra": num("speedintra", float),
                "speedinter": num("speedinter", float),
                "latencyinter": num("latencyinter", float),
                "typeintra": gel.get("typeintra"),
                "typeinter": gel.get("typeinter"),
                "samechannels": num("samechannels"),
                "channels": chans,
            }
        )
    return out
