"""Building the graph of one host from what a discovery source saw.

NVML+sysfs discovery, NCCL XML import and ``nvidia-smi topo -m`` import all
describe a host as CPUs (NUMA domains), PCIe switches, GPUs, NVSwitches and
NICs; :class:`HostBuilder` turns such a description into nodes and links with
the naming conventions shared with the YAML expander (docs/topology-yaml.md):

* ids ``"<host>/cpu<numa>"``, ``"<host>/gpu<index>"``, ``"<host>/pcisw<k>"``,
  ``"<host>/nvswitch<k>"``, ``"<host>/nic<k>"``; switches and NICs are numbered
  in PCI bus id order on the host (items without a bus id after, in the order
  they were added);
* link bandwidths are NCCL's effective figures (GB/s per direction, count
  included) and latencies NCCL's per-hop figures (µs), see the constants below.

Plain data in, a ``networkx.DiGraph`` out; no I/O.
"""

from __future__ import annotations

import re
from typing import Any

import networkx as nx

from .compact import NVLINK_HOP_LAT, PCIE_HOP_LAT
from .network import NIC_LEAF_LAT

__all__ = [
    "HostBuilder",
    "nvlink_bw",
    "smp_bw",
    "net_bw",
    "LAT",
    "GPU_CLASS",
    "NIC_CLASSES",
    "GPU_MODELS",
    "GPU_PCI_IDS",
]

#: per-link NVLink bandwidth, GB/s per direction, by compute capability
#: (NCCL 2.30.7 src/graph/topo.h SM60/70/80/86/90/100_NVLINK_BW, ncclTopoNVLinkBw)
_NVLINK_BY_SM = ((100, 40.1), (90, 20.6), (80, 20.0), (70, 20.0), (60, 18.0))
#: the same by NVLink generation when the compute capability is unknown
_NVLINK_BY_GEN = {1: 18.0, 2: 20.0, 3: 20.0, 4: 20.6, 5: 40.1, 6: 40.1}
#: per-link latency in µs, the YAML expander's defaults (topo.compact / topo.network:
#: NCCL's per-step hwLatencies split over the links of the usual route)
LAT = {"nvlink": NVLINK_HOP_LAT, "c2c": PCIE_HOP_LAT, "pcie": PCIE_HOP_LAT, "smp": PCIE_HOP_LAT, "net": NIC_LEAF_LAT}
#: NVML device name -> (model as the shipped YAML spells it, memory bandwidth GB/s from the datasheet)
GPU_MODELS = {
    "NVIDIA H100 80GB HBM3": ("H100-SXM5-80GB", 3350.0),  # H100 SXM5 datasheet: 3.35 TB/s
    "NVIDIA H200": ("H200-SXM-141GB", 4800.0),  # H200 datasheet: 4.8 TB/s
    "NVIDIA A100-SXM4-40GB": ("A100-SXM4-40GB", 1555.0),  # A100 datasheet: 1,555 GB/s
    "NVIDIA A100-SXM4-80GB": ("A100-SXM4-80GB", 2039.0),  # A100 80GB datasheet: 2,039 GB/s
    "NVIDIA GeForce RTX 3090": ("GeForce-RTX-3090", 936.0),  # RTX 3090 spec: 936 GB/s
    "NVIDIA GB200": ("B200 (GB200)", 8000.0),  # GB200 NVL72 spec: 8 TB/s per GPU
    "NVIDIA B200": ("B200", 8000.0),
}
#: PCI device id (NCCL XML ``device``) -> (model, memory bandwidth GB/s, compute capability x10,
#: memory capacity GB of 1e9 B); bandwidths from the NVIDIA datasheets (A10G: AWS G5 page, 600 GB/s),
#: capacities as the model's name states them (B200: 1,440 GB over 8 GPUs, NVIDIA DGX B200 User
#: Guide); tests/topo/test_machines.py holds them equal to the machine templates of the same model
GPU_PCI_IDS = {
    0x1DB1: ("V100-SXM2-16GB", 900.0, 70, 16.0),
    0x20B0: ("A100-SXM4-40GB", 1555.0, 80, 40.0),
    0x20B2: ("A100-SXM4-80GB", 2039.0, 80, 80.0),
    0x20B5: ("A100-PCIE-80GB", 1935.0, 80, 80.0),
    0x2237: ("A10G", 600.0, 86, 24.0),
    0x2330: ("H100-SXM5-80GB", 3350.0, 90, 80.0),
    0x2335: ("H200-SXM-141GB", 4800.0, 90, 141.0),
    0x2901: ("B200", 8000.0, 100, 180.0),
}
GPU_CLASS = 0x0302
NIC_CLASSES = (0x0200, 0x0207)


def nvlink_bw(sm: Any = None, generation: Any = None) -> float:
    """NCCL's per-link NVLink bandwidth (GB/s) for a compute capability x10 (or generation).

    >>> nvlink_bw(90), nvlink_bw(86), nvlink_bw(None, 3), nvlink_bw()
    (20.6, 12.0, 20.0, 20.0)
    """
    if isinstance(sm, int) and sm > 0:
        if sm == 86:
            return 12.0  # SM86_NVLINK_BW (GA10x NVLink bridge)
        for lo, bw in _NVLINK_BY_SM:
            if sm >= lo:
                return bw
    if isinstance(generation, int) and generation in _NVLINK_BY_GEN:
        return _NVLINK_BY_GEN[generation]
    return 20.0  # SM80_NVLINK_BW, NCCL's default for unknown


def smp_bw(arch: str | None = None, vendor: str | None = None, family: Any = None, model: Any = None) -> float:
    """NCCL's inter-socket bandwidth (``ncclTopoGetInterCpuBw``, src/graph/topo.h of NCCL 2.30.7), GB/s.

    >>> smp_bw("x86_64", "GenuineIntel", 6, 143), smp_bw("x86_64", "AuthenticAMD", 23, 49), smp_bw()
    (22.0, 16.0, 10.0)
    """
    arch = (arch or "").lower()
    vendor = (vendor or "").strip()
    if arch.startswith("ppc"):
        return 32.0  # P9_BW
    if arch in ("arm64", "aarch64"):
        return 6.0  # ARM_BW
    if vendor == "AuthenticAMD":
        return 16.0  # AMD_BW
    if vendor == "GenuineIntel":
        try:
            f, m = int(family), int(model)
        except (TypeError, ValueError):
            return 10.0
        if f == 6 and m >= 0xCF:
            return 40.0  # ERP_QPI_BW
        if f == 6 and m >= 0x8F:
            return 22.0  # SRP_QPI_BW
        if f == 6 and m >= 0x55:
            return 10.0  # SKL_QPI_BW
        return 6.0  # BDW_QPI_BW
    if vendor in ("CentaurHauls", "Shanghai"):
        return 6.0  # ZPI_BW
    return 10.0  # unknown CPU: SKL_QPI_BW (assumption, no NCCL default)


def net_bw(speed_mbps: Any) -> float:
    """NCCL's NET bandwidth: speed (Mb/s) / 8000 GB/s; speed <= 0 counts as 10000 Mb/s."""
    try:
        s = float(speed_mbps)
    except (TypeError, ValueError):
        s = 0.0
    return (s if s > 0 else 10000.0) / 8000.0


class HostBuilder:
    """Collects one host's devices under provisional keys, then names and links them.

    Keys are any hashable (a bus id, or a tuple); :meth:`build` assigns the
    conventional ids. Links go between keys; both directions are added.
    """

    def __init__(self, host: str):
        self.host = host
        self.items: dict[Any, dict] = {}  # key -> {"kind": ..., "attrs": {...}, "order": (bus, seq)}
        self.links: list[tuple[Any, Any, dict]] = []
        self._seq = 0
        self._linked: set = set()

    def add(self, key: Any, kind: str, *, pci: str | None = None, **attrs: Any) -> Any:
        """Add (or update) a device; attributes with value None are dropped."""
        if key in self.items:
            self.items[key]["attrs"].update({k: v for k, v in attrs.items() if v is not None})
            return key
        self._seq += 1
        a = {k: v for k, v in attrs.items() if v is not None}
        if pci is not None:
            a["pci"] = pci
        self.items[key] = {"kind": kind, "attrs": a, "order": (pci is None, pci or "", self._seq)}
        return key

    def has(self, key: Any) -> bool:
        return key in self.items

    def link(self, a: Any, b: Any, kind: str, bw: float, *, count: int = 1, **attrs: Any) -> None:
        """A bidirectional link; ``bw`` GB/s per direction with count included."""
        if (a, b) in self._linked or (b, a) in self._linked:
            return
        self._linked.add((a, b))
        d = {
            "kind": kind,
            "bw": float(round(bw, 4)),
            "lat": attrs.pop("lat") if "lat" in attrs else LAT[kind],
            "count": int(count),
        }
        d.update({k: v for k, v in attrs.items() if v is not None})
        self.links.append((a, b, d))

    def ids(self) -> dict[Any, str]:
        """Key -> node id, following the naming conventions."""
        out: dict[Any, str] = {}
        counters: dict[str, int] = {}
        prefix = {"pcie_switch": "pcisw", "nvswitch": "nvswitch", "nic": "nic"}
        for key, it in sorted(self.items.items(), key=lambda kv: kv[1]["order"]):
            kind, a = it["kind"], it["attrs"]
            if "id" in a:
                out[key] = a["id"]
            elif kind == "gpu":
                out[key] = f"{self.host}/gpu{a['index']}"
            elif kind == "cpu":
                out[key] = f"{self.host}/cpu{a['numa']}"
            else:
                k = counters.get(kind, 0)
                counters[kind] = k + 1
                out[key] = f"{self.host}/{prefix[kind]}{k}"
        return out

    def build(self, g: nx.DiGraph | None = None) -> nx.DiGraph:
        """Add this host's nodes and links to ``g`` (a new graph when None)."""
        g = nx.DiGraph() if g is None else g
        ids = self.ids()
        for key in sorted(self.items, key=lambda k: (_KIND_ORDER.get(self.items[k]["kind"], 9), _natural(ids[k]))):
            it = self.items[key]
            a = {k: v for k, v in it["attrs"].items() if k != "id"}
            if it["kind"] != "nvswitch" or not a.pop("rack", False):
                a["host"] = self.host
            g.add_node(ids[key], kind=it["kind"], **a)
        for a, b, d in self.links:
            g.add_edge(ids[a], ids[b], **d)
            g.add_edge(ids[b], ids[a], **dict(d))
        return g


def _natural(s: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


_KIND_ORDER = {"cpu": 0, "pcie_switch": 1, "gpu": 2, "nvswitch": 3, "nic": 4}
