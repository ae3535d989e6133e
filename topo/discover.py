"""Local discovery: ``treecoll.topo.discover()`` -> the :class:`~topo.model.Topology` of this host.

Sources, combined like NCCL does (``ncclTopoGetSystem`` in src/graph/topo.cc, NCCL 2.30.7):

1. ``NCCL_TOPO_FILE`` (if set): the host's PCIe tree, CPUs, GPUs and NICs come
   from that XML (:mod:`treecoll.topo.nccl_xml`); NVML adds the NVLinks it lacks.
2. NVML (:mod:`treecoll.topo.nvml`): GPUs (``mem_gb``: the memory total of
   ``nvmlDeviceGetMemoryInfo`` in GB of 1e9 bytes), NVLinks per link (each NVSwitch its own node,
   invisible peers one ``assumed`` switch; with GPU fabric info a rack-level
   ``nvl/sw0``), C2C, P2P status, fabric membership.
3. sysfs (:mod:`treecoll.topo.sysfs`, root configurable): PCIe switches above each GPU
   and NIC, link speeds (downtrained links flagged), NICs, NUMA domains.

Without NVML (no driver, as on CPU-only machines) the host is CPU-only: its
NUMA domains and one ``gpu``-kind rank slot per local process (LOCAL_WORLD_SIZE
/ SLURM_NTASKS_PER_NODE / OMPI_COMM_WORLD_LOCAL_SIZE, else 1), model
``"cpu-process"`` (as in topologies/cpu-local.yaml), spread over the NUMA domains in blocks; a one-line notice is
logged. Every partial failure (a query not supported, a device missing from
sysfs, a NIC without PCI path) degrades that part only and adds a line to
``topology.meta["notes"]`` (also logged).

The environment hints (:mod:`treecoll.topo.env`) applied here: NCCL_IB_HCA,
NCCL_SOCKET_IFNAME and NCCL_IB_DISABLE filter NICs; CUDA_VISIBLE_DEVICES and
CUDA_DEVICE_ORDER give each visible GPU its ``cuda`` ordinal; the others are
kept in ``meta["hints"]`` for tree building.

>>> import tempfile
>>> empty = tempfile.mkdtemp()   # a root without sys/: no NUMA or CPU facts
>>> t = discover(nvml=False, sysfs_root=empty, env={}, host="box")  # no driver
>>> t.gpus(), t.node("box/gpu0")["model"], t.nodes("cpu")
(('box/gpu0',), 'cpu-process', ('box/cpu0',))
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from . import sysfs
from .env import Hints
from .env import hints as parse_hints
from .errors import TopologyError
from .hostgraph import GPU_MODELS, LAT, HostBuilder, net_bw, nvlink_bw, smp_bw
from .model import Topology
from .nvml import NA, Nvml, NVMLUnavailable, cuda_order

__all__ = ["discover", "cpu_only_host", "CPU_SLOT_BW", "CPU_SLOT_LAT", "CPU_SLOT_MODEL"]

log = logging.getLogger("treecoll.topo")

#: a rank slot (process) of a CPU-only host reaches its NUMA domain through the
#: kernel's TCP loopback (gloo): 3.8 GB/s per direction and 17 µs per hop, the
#: figures measured for topologies/cpu-local.yaml (one TCP stream, 256 MiB;
#: a quarter of the ~70 µs loopback ping-pong RTT) -- a default, not a measurement of this host
CPU_SLOT_BW = 3.8
CPU_SLOT_LAT = 17.0
CPU_SLOT_MODEL = "cpu-process"


def _cpuinfo(root: str) -> dict[str, Any]:
    try:
        text = (Path(root) / "proc" / "cpuinfo").read_text()
    except OSError:
        return {}
    out: dict[str, Any] = {}
    for key, name in (
        ("vendor_id", "vendor"),
        ("cpu family", "family"),
        ("model", "model"),
        ("CPU implementer", "implementer"),
        ("model name", "model_name"),
    ):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.M)
        if m:
            out[name] = m.group(1).strip()
    if "model_name" in out:  # "Intel(R) Xeon(R) Platinum 8480C" -> "Intel Xeon Platinum 8480C"
        out["model_name"] = re.sub(
            r"\s+", " ", re.sub(r"\((R|TM)\)|\bCPU\b|@.*$|\d+-Core Processor", "", out["model_name"])
        ).strip()
    out["arch"] = "arm64" if "implementer" in out else "x86_64" if "vendor" in out else None
    return out


def _socket(root: str | None, cpulist: str | None) -> int | None:
    cpus = sysfs.parse_cpulist(cpulist)
    if root is None or not cpus:
        return None
    try:
        return int(
            (Path(root) / "sys/devices/system/cpu" / f"cpu{cpus[0]}" / "topology/physical_package_id")
            .read_text()
            .strip()
        )
    except (OSError, ValueError):
        return None


def _cpus(b: HostBuilder, numa: dict[int, str], cpu: dict[str, Any], root: str | None = None) -> list[int]:
    ids = sorted(numa) or [0]
    for n in ids:
        b.add(
            ("cpu", n),
            "cpu",
            numa=n,
            affinity=numa.get(n) or None,
            socket=_socket(root, numa.get(n)),
            model=cpu.get("model_name"),
        )
    bw = smp_bw(cpu.get("arch"), cpu.get("vendor"), cpu.get("family"), cpu.get("model"))
    for i, a in enumerate(ids):
        for c in ids[i + 1 :]:
            b.link(("cpu", a), ("cpu", c), "smp", bw)
    return ids


def cpu_only_host(
    host: str,
    numa: dict[int, str],
    slots: int,
    cpu: Mapping[str, Any] | None = None,
    g: nx.DiGraph | None = None,
    *,
    sysfs_root: str | None = None,
    h: Hints | None = None,
    notes: list | None = None,
) -> nx.DiGraph:
    """The graph of a host without GPUs: NUMA domains joined by smp links, and
    ``slots`` rank slots (kind ``gpu``, model ``"cpu-process"``) spread in blocks over
    them; with ``sysfs_root``, the host's NICs too."""
    b = HostBuilder(host)
    ids = _cpus(b, numa, dict(cpu or {}), sysfs_root)
    for i in range(slots):
        n = ids[i * len(ids) // slots]
        b.add(("gpu", i), "gpu", index=i, model=CPU_SLOT_MODEL, numa=n)
        b.link(("gpu", i), ("cpu", n), "pcie", CPU_SLOT_BW, lat=CPU_SLOT_LAT)
    if sysfs_root is not None:
        _nics(b, sysfs_root, sysfs.pci_devices(sysfs_root), numa, h or Hints(), ids[0], [] if notes is None else notes)
    return b.build(g)


def _local_slots(h: Hints) -> int:
    return h.local_world_size or 1


def _attach(b: HostBuilder, key: Any, dev: sysfs.PciDevice | None, devs: dict, numa: int, notes: list) -> None:
    """Link ``key`` up through its PCIe switches to its CPU; the top switch carries host_bridge.

    A device on a root port (no switch above it) links to its CPU directly, as
    in NCCL's tree (root ports are not nodes) and the YAML form.
    """
    if dev is None:
        b.link(key, ("cpu", numa), "pcie", sysfs.pcie_bw(None, None))
        return
    for s in dev.switches:
        b.add(("sw", s), "pcie_switch", pci=s)
    if dev.downtrained:
        notes.append(
            f"PCIe link of {dev.bdf} is downtrained: {dev.link_speed} x{dev.link_width} "
            f"of {dev.max_link_speed} x{dev.max_link_width}"
        )
        b.add(
            key,
            b.items[key]["kind"],
            x_downtrained=f"{dev.link_speed} x{dev.link_width} of {dev.max_link_speed} x{dev.max_link_width}",
        )
    chain = [key, *(("sw", s) for s in dev.switches), ("cpu", numa)]
    below = dev
    for lo, hi in zip(chain, chain[1:]):
        bw = below.bw if below is not None else sysfs.pcie_bw(None, None)
        b.link(lo, hi, "pcie", bw)
        below = devs.get(hi[1]) if hi[0] == "sw" else None
    if dev.host_bridge and len(chain) > 2:
        b.add(chain[-2], "pcie_switch", host_bridge=dev.host_bridge)


def _numa_of(dev: sysfs.PciDevice | None, cpus: Any, numa: dict[int, str], default: int) -> int:
    if dev is not None and dev.numa is not None and (dev.numa in numa or not numa):
        return dev.numa
    if cpus not in (None, NA) and numa:
        best = max(numa, key=lambda n: len(set(sysfs.parse_cpulist(numa[n])) & set(cpus)))
        if set(sysfs.parse_cpulist(numa[best])) & set(cpus):
            return best
    return default


def _nics(b: HostBuilder, root: str, devs: dict, numa: dict[int, str], h: Hints, default: int, notes: list) -> None:
    for nic in sysfs.nics(root):
        if nic.kind == "ib":
            if h.ib_disable or (h.ib_hca is not None and not h.ib_hca.selects(nic.name, nic.port)):
                continue
            if nic.state is not None and "ACTIVE" not in nic.state.upper():
                notes.append(f"NIC {nic.name} port {nic.port}: state {nic.state!r}, skipped")
                continue
        else:
            if h.socket_ifname is not None and not h.socket_ifname.selects(nic.name):
                continue
            if nic.state is not None and nic.state.lower() not in ("up", "unknown"):
                continue
        if nic.rate is None:
            notes.append(f"NIC {nic.name}: port rate unknown, NCCL's default 10 Gb/s assumed")
        dev = devs.get(nic.pci) if nic.pci else None
        if nic.pci is None or dev is None:
            notes.append(f"NIC {nic.name}: no PCI path in sysfs, attached to cpu{default} (as NCCL does)")
        key = ("nic", nic.name, nic.port)
        n = _numa_of(dev, None, numa, default)
        b.add(
            key, "nic", pci=nic.pci, name=nic.name, bw=net_bw((nic.rate or 0) * 1000), link_layer=nic.link_layer, numa=n
        )
        _attach(b, key, dev, devs, n, notes)


def _gpu_host(host: str, nv: Nvml, root: str, h: Hints, env: Mapping[str, str], notes: list, meta: dict) -> nx.DiGraph:
    numa = sysfs.numa_nodes(root)
    devs = sysfs.pci_devices(root)
    b = HostBuilder(host)
    ids = _cpus(b, numa, _cpuinfo(root), root)
    if not numa:
        notes.append("sysfs: no NUMA nodes found, one CPU domain assumed")
    gpus = [nv.gpu(i) for i in range(nv.count())]
    order = cuda_order(gpus, dict(env))
    by_pci = {g.pci: g for g in gpus if g.pci}
    fabric = {}
    for g in gpus:
        dev = devs.get(g.pci) if g.pci else None
        if dev is None:
            notes.append(f"gpu{g.index}: bus id {g.pci} not in sysfs, attached to its NUMA domain directly")
        n = _numa_of(dev, g.cpus, numa, ids[0])
        f = nv.fabric(g.index)
        if f is not NA:
            fabric[g.index] = f
        model, mem_bw = GPU_MODELS.get(g.name or "", (g.name or None, g.mem_bw or None))
        b.add(
            ("gpu", g.index),
            "gpu",
            pci=g.pci or None,
            index=g.index,
            uuid=g.uuid or None,
            model=model,
            mem_bw=mem_bw,
            numa=n,
            sm=g.sm or None,
            mem_gb=g.memory / 1e9 if g.memory else None,  # NVML's total, bytes -> GB (1e9 B)
            x_cuda=order.index(g.index) if g.index in order else None,
        )
        c2c = nv.c2c(g.index)
        if c2c is not NA:  # Grace: C2C is the GPU's host interface (NCCL prefers it over PCIe)
            b.link(("gpu", g.index), ("cpu", n), "c2c", c2c[0] * c2c[1] / 1000, count=c2c[0])
        else:
            _attach(b, ("gpu", g.index), dev, devs, n, notes)
    # NVLinks: aggregate per peer, as NCCL does, but keep every NVSwitch
    for g in gpus:
        per: dict[Any, int] = {}
        gen = NA
        for ln in nv.nvlinks(g.index):
            gen = ln.generation
            if ln.remote_pci in by_pci and ln.remote_type in ("gpu", NA):
                tgt = ("gpu", by_pci[ln.remote_pci].index)
            elif ln.remote_pci is None:
                f = fabric.get(g.index)
                if f is not None:  # NVL72 wiring: link l of every GPU goes to NVLink switch chip l
                    tgt = ("nvl", ln.link)
                    b.add(
                        tgt,
                        "nvswitch",
                        id=f"nvl/sw{ln.link}",
                        rack=True,
                        assumed=True,
                        x_cluster_uuid=f.cluster_uuid,
                        x_clique=f.clique_id,
                    )
                else:
                    tgt = ("nvs", None)
                    b.add(tgt, "nvswitch", assumed=True)
            else:
                tgt = ("nvs", ln.remote_pci)
                b.add(tgt, "nvswitch", pci=ln.remote_pci)
            per[tgt] = per.get(tgt, 0) + 1
        if any(t[0] == "nvs" and t[1] is None for t in per):
            notes.append(f"gpu{g.index}: NVLink peers not visible (VM or container): one assumed NVSwitch")
        bw1 = nvlink_bw(g.sm if g.sm is not NA else None, gen if gen is not NA else None)
        for tgt, cnt in per.items():
            b.link(("gpu", g.index), tgt, "nvlink", cnt * bw1, count=cnt)
    _nics(b, root, devs, numa, h, ids[0], notes)
    meta["nvml_notes"] = list(nv.notes)
    meta["p2p_read"] = [[("X" if i == j else str(nv.p2p(i, j))) for j in range(len(gpus))] for i in range(len(gpus))]
    notes.extend(nv.notes)
    return b.build()


def _open_nvml(nvml: Any) -> Nvml:
    if isinstance(nvml, Nvml):
        return nvml
    return Nvml.open(module=nvml)


def discover(
    *, sysfs_root: str = "/", nvml: Any = None, env: Mapping[str, str] | None = None, host: str | None = None
) -> Topology:
    """The topology of this host.

    Parameters
    ----------
    sysfs_root: directory containing ``sys/`` (and ``proc/cpuinfo``); tests pass a synthetic tree.
    nvml: None to import pynvml; a pynvml-like module (recorded answers); an open
        :class:`~topo.nvml.Nvml`; or False to skip NVML (CPU-only host).
    env: the environment to read hints from (default ``os.environ``).
    host: the host name used in node ids (default: ``socket.gethostname()``).

    Never raises for a missing driver or a partial failure; raises
    :class:`~topo.errors.TopologyError` for an invalid hint variable or an
    unreadable NCCL_TOPO_FILE.
    """
    if not os.path.isdir(sysfs_root):
        raise TopologyError(
            f"sysfs root {sysfs_root}: expected a directory holding sys/ (as / does), "
            f"got {'a file' if os.path.exists(sysfs_root) else 'no such directory'}"
        )
    env = dict(os.environ if env is None else env)
    h = parse_hints(env)
    host = host or socket.gethostname() or "localhost"
    notes: list[str] = []
    meta: dict[str, Any] = {"source": "discover", "sysfs_root": str(sysfs_root)}
    nv = None
    if nvml is not False:
        try:
            nv = _open_nvml(nvml)
        except NVMLUnavailable as e:
            notice = f"treecoll: no NVML ({e}); topology is a CPU-only host"
            log.warning(notice)
            notes.append(notice)
    try:
        if h.topo_file:
            from .nccl_xml import import_xml

            g = nx.DiGraph(import_xml(h.topo_file, host=host, require_gpus=False).graph)  # may be partial
            if nv is not None:
                _add_nvml_nvlinks(g, host, nv, notes)
            notes.insert(0, f"NCCL_TOPO_FILE={h.topo_file}: PCIe tree, GPUs and NICs from the file")
        elif nv is not None:
            g = _gpu_host(host, nv, sysfs_root, h, env, notes, meta)
    finally:
        if nv is not None and nvml is None:  # we opened it
            nv.close()
    cpu_only = not h.topo_file and nv is None
    if not h.topo_file and nv is not None and not any(d["kind"] == "gpu" for _, d in g.nodes(data=True)):
        notes.append("NVML found no GPU; topology is a CPU-only host")
        cpu_only = True
    if cpu_only:
        g = cpu_only_host(
            host,
            sysfs.numa_nodes(sysfs_root),
            _local_slots(h),
            _cpuinfo(sysfs_root),
            sysfs_root=sysfs_root,
            h=h,
            notes=notes,
        )
    g = _rails(Topology(g), h).graph
    for n in notes[1 if nv is None and nvml is not False else 0 :]:
        log.info("treecoll discover: %s", n)
    meta["notes"] = notes
    meta["hints"] = h.as_dict()
    return Topology(g, name=host, meta=meta)


def _rails(t: Topology, h: Hints) -> Topology:
    """Give the NICs of the compute fabric a ``rail``, as the YAML form numbers them.

    A NIC is on the compute fabric when a GPU of its host is within PXB of it
    (rail-optimized nodes pair each GPU with a NIC behind its PCIe switch); on
    hosts where no NIC is that close (Grace: NICs under the CPU, GPUs on C2C)
    every NIC within PHB/P2C counts; on CPU-only hosts every NIC. Rails are
    numbered in NIC order; storage/management NICs get none. A rail given in
    NCCL_IB_HCA (``name:port:rail``) wins. NICs that already carry a rail keep it.
    """
    from .paths import NCCL_CLASSES

    g = nx.DiGraph(t.graph)
    for host in t.hosts():
        nics = [n for n in t.nics(host) if "rail" not in g.nodes[n]]
        if not nics:
            continue
        gpus = [x for x in t.gpus(host) if g.nodes[x].get("model") != CPU_SLOT_MODEL]
        best = {}
        for n in nics:
            cls = [NCCL_CLASSES.index(t.path(x, n).nccl) for x in gpus]
            best[n] = min(cls) if cls else None
        if not gpus:
            chosen = nics
        else:
            near = [n for n in nics if best[n] is not None and best[n] <= NCCL_CLASSES.index("PXB")]
            chosen = near or [n for n in nics if best[n] is not None and best[n] <= NCCL_CLASSES.index("PHB")]
        for k, n in enumerate(chosen):
            g.nodes[n]["rail"] = k
        if h.ib_hca is not None:
            for n in t.nics(host):
                r = h.ib_hca.rail_of(g.nodes[n].get("name", ""))
                if r is not None:
                    g.nodes[n]["rail"] = r
    return Topology(g, name=t.name, meta=t.meta)


def _add_nvml_nvlinks(g: nx.DiGraph, host: str, nv: Nvml, notes: list) -> None:
    """NCCL_TOPO_FILE + NVML: NVLinks for the file's GPUs (matched by bus id), when the file has none.

    Peers that are GPUs of the file get direct links; every other visible peer
    an NVSwitch node per bus id; invisible peers one ``assumed`` switch.
    """
    if any(d["kind"] == "nvlink" for _, _, d in g.edges(data=True)):
        return
    by_pci = {d.get("pci"): n for n, d in g.nodes(data=True) if d["kind"] == "gpu" and d.get("pci")}
    nvml_pci = {gi.pci: gi for gi in (nv.gpu(i) for i in range(nv.count()))}
    per_gpu: dict[str, dict[Any, int]] = {}
    for pci, node in by_pci.items():
        gi = nvml_pci.get(pci)
        if gi is None:
            notes.append(f"NCCL_TOPO_FILE GPU {pci}: not found by NVML, no NVLinks added")
            continue
        per = per_gpu.setdefault(node, {})
        for ln in nv.nvlinks(gi.index):
            tgt = by_pci.get(ln.remote_pci) or ("sw", ln.remote_pci)
            per[tgt] = per.get(tgt, 0) + 1
        if gi.sm is not NA:
            g.nodes[node].setdefault("sm", gi.sm)
    switches = sorted(
        {t[1] for per in per_gpu.values() for t in per if isinstance(t, tuple)}, key=lambda p: (p is None, p or "")
    )
    sw_id = {p: f"{host}/nvswitch{k}" for k, p in enumerate(switches)}
    for p, n in sw_id.items():
        g.add_node(n, kind="nvswitch", host=host, **({"pci": p} if p else {"assumed": True}))
    for node, per in per_gpu.items():
        sm = g.nodes[node].get("sm")
        for tgt, cnt in per.items():
            peer = sw_id[tgt[1]] if isinstance(tgt, tuple) else tgt
            if not g.has_edge(node, peer):
                d = {"kind": "nvlink", "bw": cnt * nvlink_bw(sm), "lat": LAT["nvlink"], "count": cnt}
                g.add_edge(node, peer, **d)
                g.add_edge(peer, node, **dict(d))
