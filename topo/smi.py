"""``nvidia-smi topo -m`` text -> a host Topology whose own matrix prints the same codes.

Parsing (:func:`parse_smi`) copes with what real pastes contain: tabs or runs
of spaces, ANSI escape codes around the header, CRLF line ends, the current
legend (X, SYS, NODE, PHB, PXB, PIX, NV#) and the legacy one (SOC = SYS), NICs
named in the header (``mlx5_0``) or numbered (``NIC0``) with a ``NIC Legend:``
block, ``N/A`` and empty affinity fields, comment lines starting with ``#``.
The row labels are authoritative: older nvidia-smi versions print NIC columns
by device name and can run two names together in the header
(``mlx5_2mlx5_3``); such a header is read as the row labels it concatenates.

Building (:func:`import_smi`) reconstructs a PCIe/NVLink structure that
reproduces every code of the matrix (the legend nvidia-smi prints under it):

* ``NV#``: a direct ``nvlink`` link with count #, or, when every GPU pair of a
  box of 3+ GPUs shows the same ``NV#``, one ``assumed`` NVSwitch reached with
  # links (nvidia-smi cannot tell the two apart).
* The PCIe codes are an ultrametric: endpoints (GPUs and NICs) are grouped
  by single linkage at each level. ``SYS`` separates root-complex groups;
  groups that share a NUMA affinity (the GPU rows' column) are ``quadrant`` s
  of one CPU node (nvidia-smi says SYS between root complexes far apart in one
  socket, e.g. the I/O-die quadrants of an AMD EPYC: see :mod:`treecoll.topo.paths`),
  the others CPU (NUMA) nodes joined by ``smp`` links; ``NODE`` separates host
  bridges inside a quadrant (``host_bridge`` attributes, only when a NODE code
  occurs); ``PHB`` separates top PCIe switches under one host bridge; ``PXB``
  separates second-level switches under one top switch; ``PIX`` pairs share a
  switch. Pairs whose PCIe code is hidden behind ``NV#`` take whatever the
  structure implies.

Bandwidths are not in the text: PCIe links are NCCL's Gen4 x16 (24 GB/s),
NVLinks NCCL's default per link (20 GB/s, SM80), smp 10 GB/s (assumptions,
listed in ``meta["assumed"]``). The reproduced matrix is checked; any
mismatch is listed in ``meta["smi_mismatches"]`` and logged.

>>> t = import_smi("\\tGPU0\\tGPU1\\tNUMA Affinity\\nGPU0\\t X \\tSYS\\t1\\nGPU1\\tSYS\\t X \\t1\\n")
>>> t.path("host0/gpu0", "host0/gpu1").smi, t.nodes("cpu"), t.meta["smi_mismatches"]
('SYS', ('host0/cpu1',), [])
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from .errors import TopologyError
from .files import decode_text, read_text
from .hostgraph import HostBuilder
from .limits import limits as make_limits
from .model import Topology

__all__ = ["parse_smi", "import_smi", "render_smi", "smi_matrix", "looks_like_smi"]

log = logging.getLogger("treecoll.topo")

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_CODE = re.compile(r"^(X|SYS|SOC|NODE|PHB|PXB|PIX|NV[1-9][0-9]{0,5})$", re.ASCII)
_GPU = re.compile(r"GPU(0|[1-9][0-9]{0,5})", re.ASCII)
_LEVEL = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
_EXTRA = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
PCIE_BW = 24.0  # NCCL: x16 Gen4 = 16 * 120 / 80 GB/s (assumed: the text has no speeds)
NVLINK_BW = 20.0  # NCCL SM80_NVLINK_BW, its default for unknown GPUs
SMP_BW = 10.0  # NCCL SKL_QPI_BW (CPU unknown)


def looks_like_smi(text: str) -> bool:
    """True for ``nvidia-smi topo -m`` output (a header with GPU0 and a row ``GPU0 X``)."""
    t = _ANSI.sub("", text)
    return bool(re.search(r"^\s*GPU0\s+X\b", t, re.M)) and "GPU0" in t


def _header(line: str, where: str, lineno: int) -> tuple[list[str], list[str]]:
    """The device columns and the affinity columns of the header line."""
    toks = line.split()  # whitespace may be tabs, runs of spaces, or collapsed to one space
    devices: list[str] = []
    extras: list[str] = []
    i = 0
    while i < len(toks):
        multi = next((e for e in _EXTRA if toks[i : i + len(e.split())] == e.split()), None)
        if multi is not None:
            extras.append(multi)
            i += len(multi.split())
        elif extras:
            raise TopologyError(
                f"{where}:{lineno}: header column {toks[i]!r} after the affinity columns: "
                f"expected one of {list(_EXTRA)}"
            )
        else:
            devices.append(toks[i])
            i += 1
    return devices, extras


def _columns(head: list[str], labels: list[str], where: str, lineno: int) -> list[str]:
    """The matrix columns: the header's devices, or the row labels when the header glued names together.

    Older nvidia-smi versions print NIC columns by device name and can run two
    names together in the header (``mlx5_2mlx5_3``); the row labels are
    authoritative then, as long as the header is their concatenation.
    """
    seen: set[str] = set()
    for d in head:
        if d in seen:
            raise TopologyError(f"{where}:{lineno}: header column {d!r} appears twice: expected each device once")
        seen.add(d)
    if len(labels) > len(head) and "".join(head) == "".join(labels) and len(set(labels)) == len(labels):
        return list(labels)
    return head


def parse_smi(text: str, where: str = "<text>") -> dict[str, Any]:
    """Plain data: ``{"devices": [...], "gpus": [...], "nics": [...], "names": {col: name},
    "codes": {(a, b): code}, "cpu_affinity": {gpu: str|None}, "numa_affinity": {gpu: int|None},
    "gpu_numa": {gpu: int|None}, "legacy": bool}``. Codes keep the text's spelling (SOC stays SOC)."""
    lines = _ANSI.sub("", text).replace("\r", "").split("\n")
    hi = next(
        (
            i
            for i, ln in enumerate(lines)
            if not ln.lstrip().startswith("#") and "GPU0" in ln.split() and not re.match(r"^\s*GPU0\s+X\b", ln)
        ),
        None,
    )
    if hi is None:
        raise TopologyError(f"{where}: expected an 'nvidia-smi topo -m' matrix (a header line with GPU0), found none")
    head, extras = _header(lines[hi], where, hi + 1)
    rows: list[tuple[int, list[str]]] = []
    for li in range(hi + 1, len(lines)):
        ln = lines[li]
        if not ln.strip() or ln.strip().startswith("Legend"):
            break
        rows.append((li, ln.split()))
    devices = _columns(head, [tok[0] for _, tok in rows], where, hi + 1)
    n = len(devices)
    codes: dict[tuple[str, str], str] = {}
    cpu_aff: dict[str, Any] = {}
    numa_aff: dict[str, Any] = {}
    gpu_numa: dict[str, Any] = {}
    seen: set[str] = set()
    legacy = False
    for li, tok in rows:
        name, vals, rest = tok[0], tok[1 : 1 + n], tok[1 + n :]
        if name not in devices:
            raise TopologyError(
                f"{where}:{li + 1}: row {name!r}: expected one of the header's devices {devices[:6]}..."
            )
        if name in seen:
            raise TopologyError(f"{where}:{li + 1}: row {name!r} appears twice: expected one row per device")
        seen.add(name)
        if len(vals) < n:
            raise TopologyError(f"{where}:{li + 1}: row {name!r}: expected {n} codes, got {len(vals)}")
        for col, v in zip(devices, vals):
            if not _CODE.match(v):
                raise TopologyError(
                    f"{where}:{li + 1}: row {name!r}, column {col!r}: expected one of X, SYS, SOC, "
                    f"NODE, PHB, PXB, PIX, NV<n>, got {v[:20]!r}"
                )
            if (v == "X") != (col == name):
                raise TopologyError(
                    f"{where}:{li + 1}: row {name!r}, column {col!r}: 'X' expected exactly on the diagonal, got {v!r}"
                )
            legacy |= v == "SOC"
            codes[(name, col)] = v
        for k, v in zip(extras, rest):
            val = None if v in ("N/A", "") else v
            if k == "CPU Affinity":
                cpu_aff[name] = val
            elif k == "NUMA Affinity":
                numa_aff[name] = _small_int(val)
            else:
                gpu_numa[name] = _small_int(val)
    missing = [d for d in devices if d not in seen]
    if missing:
        raise TopologyError(f"{where}: expected one row per header device, rows missing for {missing[:8]}")
    names = {d: d for d in devices}
    for ln in lines:
        m = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", ln)
        if m and m.group(1) in names:
            names[m.group(1)] = m.group(2)
    gpus = [d for d in devices if _GPU.fullmatch(d)]
    return {
        "devices": devices,
        "gpus": gpus,
        "nics": [d for d in devices if d not in gpus],
        "names": names,
        "codes": codes,
        "cpu_affinity": cpu_aff,
        "numa_affinity": numa_aff,
        "gpu_numa": gpu_numa,
        "legacy": legacy,
    }


def _small_int(v: str | None) -> int | None:
    """A NUMA id column: an ASCII decimal integer (N/A and anything else: None)."""
    return int(v) if v is not None and v.isascii() and v.isdecimal() and len(v) <= 9 else None


class _UF:
    def __init__(self, items):
        self.p = {i: i for i in items}

    def find(self, x):
        while self.p[x] != x:
            self.p[x] = self.p[self.p[x]]
            x = self.p[x]
        return x

    def union(self, a, b):
        self.p[self.find(a)] = self.find(b)

    def groups(self, items) -> list[list]:
        out: dict[Any, list] = {}
        for i in items:
            out.setdefault(self.find(i), []).append(i)
        return list(out.values())


def _level(code: str) -> int | None:
    return _LEVEL.get("SYS" if code == "SOC" else code)


def _split(items: list, codes: dict, below: int) -> list[list]:
    uf = _UF(items)
    for a in items:
        for b in items:
            lv = _level(codes[(a, b)]) if a != b else None
            if lv is not None and lv < below:
                uf.union(a, b)
    return uf.groups(items)


def _read(src: str | bytes | os.PathLike, source: str | None) -> tuple[str, str]:
    """(where, text) of an ``nvidia-smi topo -m`` output given as a path, text or bytes."""
    if isinstance(src, (bytes, bytearray)):
        where = source or "<text>"
        return where, decode_text(bytes(src), where, "the nvidia-smi output")
    if isinstance(src, str) and ("\n" in src or looks_like_smi(src)):
        return source or "<text>", src
    if isinstance(src, str) and not src.strip():
        raise TopologyError(f"{source or '<text>'}: expected nvidia-smi output or a file name, got an empty string")
    path = os.fspath(src)
    return source or str(path), read_text(path, "the nvidia-smi output")


def import_smi(
    src: str | bytes | os.PathLike,
    *,
    host: str = "host0",
    name: str | None = None,
    source: str | None = None,
    max_nodes: int | None = None,
    max_links: int | None = None,
) -> Topology:
    """Build the host of an ``nvidia-smi topo -m`` output (a path, or the text or its bytes).

    ``source`` names the text in errors and in ``meta["source"]`` (default: the
    path, or ``"<text>"``); ``max_nodes`` / ``max_links``: the caps of
    :mod:`treecoll.topo.limits`.
    """
    where, text = _read(src, source)
    p = parse_smi(text, where)
    devs, codes, gpus = p["devices"], p["codes"], p["gpus"]
    lim = make_limits(max_nodes, max_links)
    # nodes: every device, its switches (at most two each) and CPUs; links: as many, plus NVLinks and the SMP mesh
    msg = lim.excess(4 * len(devs), 2 * (3 * len(devs) + len(devs) ** 2), f"{len(devs):,} devices")
    if msg is not None:
        raise TopologyError(msg, where=where)
    b = HostBuilder(host)
    groups = _split(devs, codes, 5)  # devices linked below SYS: one root-complex group each
    for numa, quads in _numa_domains(groups, p["numa_affinity"], devs):
        cg = [d for q in quads for d in q]
        aff = next((p["cpu_affinity"].get(d) for d in cg if p["cpu_affinity"].get(d)), None)
        ck = b.add(("cpu", numa), "cpu", numa=numa, affinity=aff)
        use_hb = any(codes[(a, c)] == "NODE" for a in cg for c in cg)
        for qi, quad in enumerate(quads):
            for hi, hb in enumerate(_split(quad, codes, 4)):
                for phb in _split(hb, codes, 3):
                    top = b.add(
                        ("sw", phb[0], "top"),
                        "pcie_switch",
                        host_bridge=f"{numa}.{qi}.{hi}" if use_hb else None,
                        quadrant=qi if len(quads) > 1 else None,
                    )
                    b.link(top, ck, "pcie", PCIE_BW)
                    pix = _split(phb, codes, 2)
                    for grp in pix:
                        up = top
                        if len(pix) > 1:
                            up = b.add(("sw", grp[0], "pix"), "pcie_switch")
                            b.link(up, top, "pcie", PCIE_BW)
                        for d in grp:
                            _endpoint(b, p, d, numa)
                            b.link(("dev", d), up, "pcie", PCIE_BW)
    cpus = [k for k, it in b.items.items() if it["kind"] == "cpu"]
    for i, a in enumerate(cpus):
        for c in cpus[i + 1 :]:
            b.link(a, c, "smp", SMP_BW)
    _nvlinks(b, gpus, codes)
    t = Topology(
        b.build(),
        name=name or host,
        meta={
            "source": f"nvidia-smi:{where}",
            "legacy_legend": p["legacy"],
            "assumed": {"pcie_bw": PCIE_BW, "nvlink_bw_per_link": NVLINK_BW, "smp_bw": SMP_BW},
        },
    )
    ids = b.ids()
    mism = []
    for (a, c), code in codes.items():
        got = t.path(ids[("dev", a)], ids[("dev", c)]).smi
        want = "SYS" if code == "SOC" else code
        if got != want:
            mism.append(f"{a}-{c}: {want} expected, structure gives {got}")
    if mism:
        log.warning(
            "treecoll: %s: %d nvidia-smi codes not reproducible (inconsistent matrix?): %s",
            where,
            len(mism),
            "; ".join(mism[:4]),
        )
    meta = dict(t.meta, smi_mismatches=mism, columns={d: ids[("dev", d)] for d in devs})
    return Topology(t.graph, name=t.name, meta=meta)


def _numa_domains(groups: list[list[str]], numa_affinity: dict, devs: list[str]) -> list[tuple[int, list[list[str]]]]:
    """``[(numa id, [root-complex group, ...])]``: the groups that share a NUMA affinity form one NUMA
    domain (SYS between them is then the distance between root complexes of one socket, see
    :mod:`treecoll.topo.paths`); a group without any affinity (NICs only, or an output without the NUMA column)
    is a domain of its own with the first free id. Domains in the order of their first device."""
    numa_of = {d: numa_affinity.get(d) for d in devs}
    uf = _UF(range(len(groups)))
    first: dict[int, int] = {}
    for i, grp in enumerate(groups):
        for n in {numa_of[d] for d in grp if numa_of[d] is not None}:
            uf.union(i, first.setdefault(n, i))
    domains = [[groups[k] for k in ks] for ks in uf.groups(range(len(groups)))]
    used = {v for v in numa_of.values() if v is not None}
    out, nxt = [], 0
    for quads in sorted(domains, key=lambda qs: devs.index(qs[0][0])):
        nums = sorted({numa_of[d] for q in quads for d in q if numa_of[d] is not None})
        if nums:
            numa = nums[0]
        else:
            while nxt in used:
                nxt += 1
            numa = nxt
            used.add(numa)
        out.append((numa, quads))
    return out


def _endpoint(b: HostBuilder, p: dict, d: str, numa: int) -> None:
    if d in p["gpus"]:
        gn = p["gpu_numa"].get(d)
        b.add(("dev", d), "gpu", index=int(d[3:]), numa=numa, x_gpu_numa=gn)  # GPU<n>: ASCII digits (_GPU)
    else:
        b.add(("dev", d), "nic", name=p["names"][d])


def _nvlinks(b: HostBuilder, gpus: list[str], codes: dict) -> None:
    nv = {(a, c): int(codes[(a, c)][2:]) for a in gpus for c in gpus if a != c and codes[(a, c)].startswith("NV")}
    pairs = len(gpus) * (len(gpus) - 1)
    if len(gpus) >= 3 and len(nv) == pairs and len(set(nv.values())) == 1:
        cnt = next(iter(nv.values()))
        sw = b.add(("nvs",), "nvswitch", assumed=True)
        for a in gpus:
            b.link(("dev", a), sw, "nvlink", cnt * NVLINK_BW, count=cnt)
        return
    for (a, c), cnt in nv.items():
        b.link(("dev", a), ("dev", c), "nvlink", cnt * NVLINK_BW, count=cnt)


def smi_matrix(topo: Topology, host: str | None = None) -> tuple[list[str], list[list[str]]]:
    """The nvidia-smi matrix of one host: (endpoint ids GPUs then NICs, codes[i][j])."""
    host = host or topo.hosts()[0]
    ends = list(topo.gpus(host)) + list(topo.nics(host))
    return ends, [[topo.path(a, c).smi or "SYS" for c in ends] for a in ends]


def render_smi(topo: Topology, host: str | None = None) -> str:
    """The matrix as ``nvidia-smi topo -m`` prints it (GPU0.., NIC0.., NIC legend)."""
    host = host or topo.hosts()[0]
    ends, m = smi_matrix(topo, host)
    g = topo.graph
    labels = []
    gi = ni = 0
    for e in ends:
        if g.nodes[e]["kind"] == "gpu":
            labels.append(f"GPU{g.nodes[e].get('index', gi)}")
            gi += 1
        else:
            labels.append(f"NIC{ni}")
            ni += 1
    w = max([4] + [len(x) for x in labels]) + 2
    out = [" " * w + "".join(x.ljust(w) for x in labels) + "NUMA Affinity"]
    for lab, e, row in zip(labels, ends, m):
        cells = "".join((" X" if c == "X" else c).ljust(w) for c in row)
        numa = g.nodes[e].get("numa", "") if g.nodes[e]["kind"] == "gpu" else ""
        out.append(lab.ljust(w) + cells + str(numa))
    nics = [(lab, e) for lab, e in zip(labels, ends) if lab.startswith("NIC")]
    if nics:
        out += ["", "NIC Legend:", ""] + [f"  {lab}: {g.nodes[e].get('name', e)}" for lab, e in nics]
    return "\n".join(x.rstrip() for x in out) + "\n"
