"""Read the PCIe tree, NICs and NUMA nodes from sysfs (Linux), below a configurable root.

Everything is read relative to ``root`` (default ``"/"``), so tests build
synthetic trees in a temporary directory:

* ``<root>/sys/bus/pci/devices/<bdf>``: a symlink into
  ``<root>/sys/devices/pci<dddd>:<bb>/<root port>/<upstream port>/<downstream
  port>/.../<bdf>``; files ``class``, ``vendor``, ``device``, ``numa_node``,
  ``current_link_speed``/``current_link_width``, ``max_link_speed``/``max_link_width``,
  ``local_cpulist``.
* ``<root>/sys/class/infiniband/<hca>/device`` (symlink to the PCI device) and
  ``ports/<p>/{rate,link_layer,state}``.
* ``<root>/sys/class/net/<ifname>/device`` (absent for virtual interfaces),
  ``speed`` (Mb/s), ``operstate``.
* ``<root>/sys/devices/system/node/node<N>/cpulist``.

PCIe switches follow NCCL (src/graph/xml.cc, ``ncclTopoGetXmlFromSys``): the
path from the root complex is root port, upstream port, downstream port,
upstream port, ...; a switch is identified by its upstream port (every other
path component), root and downstream ports are not nodes. The root complex
(``pci0000:16`` -> ``"0000:16"``) is the device's host bridge.

Nothing here raises on a missing or unreadable file: the field is None and the
caller decides (and says so).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PciDevice",
    "NicInfo",
    "read_pci",
    "pci_devices",
    "nics",
    "numa_nodes",
    "pcie_bw",
    "parse_cpulist",
    "speed_gen",
]

_BDF = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_ROOT = re.compile(r"^pci([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2})$")

#: NCCL's kvDictPciGen (src/graph/topo.cc): speed string -> x100 Mb/s per lane;
#: PCIe edge bw = width * code / 80 GB/s (x16 Gen3 12, Gen4 24, Gen5 48, Gen6 96)
_SPEED_CODE = {"2.5": 15, "5": 30, "8": 60, "16": 120, "32": 240, "64": 480}
_SPEED_GEN = {"2.5": 1, "5": 2, "8": 3, "16": 4, "32": 5, "64": 6}


def _gts(speed: str | None) -> str | None:
    m = re.match(r"\s*([0-9.]+)\s*GT/s", speed or "")
    if not m:
        return None
    v = float(m.group(1))
    return f"{v:g}"


def speed_gen(speed: str | None) -> int | None:
    """``"32.0 GT/s PCIe"`` -> 5 (PCIe generation); None if unknown."""
    return _SPEED_GEN.get(_gts(speed) or "")


def pcie_bw(speed: str | None, width: int | None) -> float:
    """NCCL's PCIe link bandwidth in GB/s: ``width * speedcode / 80``.

    Unknown speed counts as 8 GT/s (code 60) and width 0/None as 16, as NCCL does.

    >>> pcie_bw("32.0 GT/s PCIe", 16), pcie_bw("16 GT/s", 16), pcie_bw("", 0)
    (48.0, 24.0, 12.0)
    """
    code = _SPEED_CODE.get(_gts(speed) or "", 60)
    return (width or 16) * code / 80


#: CPU ids accepted in a CPU list (Linux's NR_CPUS is at most 8192; a larger id is a typo, not a machine)
MAX_CPU_ID = 1 << 16


def parse_cpulist(s: str | None) -> list[int]:
    """``"0-3,8,10-11"`` -> [0, 1, 2, 3, 8, 10, 11]; empty/None, malformed, descending ranges or ids of
    :data:`MAX_CPU_ID` and above -> [] (so a typo can never make a list of a billion CPUs).

    >>> parse_cpulist("0-2,7"), parse_cpulist("0-1000000000"), parse_cpulist("3-1")
    ([0, 1, 2, 7], [], [])
    """
    out: list[int] = []
    for part in (s or "").strip().split(","):
        part = part.strip()
        if not part:
            continue
        a, _, b = part.partition("-")
        if not (a.isascii() and a.isdecimal() and (b == "" or b.isascii() and b.isdecimal())):
            return []
        lo, hi = int(a), int(b or a)
        if not lo <= hi < MAX_CPU_ID:
            return []
        out.extend(range(lo, hi + 1))
    return out


@dataclass(frozen=True)
class PciDevice:
    """One PCI function as sysfs shows it.

    cls: PCI class (e.g. 0x030200); numa: NUMA node or None (-1 in sysfs);
    switches: upstream ports of the PCIe switches above it, nearest first;
    root_port: the root port it hangs from (None for root complex devices);
    host_bridge: root complex ``"dddd:bb"``; downtrained: current link speed or
    width below the maximum (note: idle GPUs may lower their speed to save power).
    """

    bdf: str
    cls: int | None
    vendor: int | None
    device: int | None
    numa: int | None
    link_speed: str | None
    link_width: int | None
    max_link_speed: str | None
    max_link_width: int | None
    switches: tuple[str, ...]
    host_bridge: str | None
    cpulist: str | None = None
    root_port: str | None = None

    @property
    def downtrained(self) -> bool:
        cur, mx = speed_gen(self.link_speed), speed_gen(self.max_link_speed)
        if cur and mx and cur < mx:
            return True
        return bool(self.link_width and self.max_link_width and self.link_width < self.max_link_width)

    @property
    def bw(self) -> float:
        """NCCL's bandwidth of the link above this device (max speed/width), GB/s."""
        return pcie_bw(self.max_link_speed or self.link_speed, self.max_link_width or self.link_width)


@dataclass(frozen=True)
class NicInfo:
    """A network port: ``kind`` "ib" (verbs device) or "net" (netdev); ``pci`` None
    when the device has no PCI path (virtual, bond); ``rate`` Gb/s or None."""

    name: str
    kind: str
    pci: str | None
    port: int
    rate: float | None
    link_layer: str | None
    state: str | None
    netdev: str | None = None


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(s: str | None, base: int = 10) -> int | None:
    try:
        return int(s, base) if s is not None else None
    except ValueError:
        return None


def _names(d: Path, key: Callable[[str], Any] | None = None) -> list[str]:
    """The entries of directory ``d``, sorted (by ``key``); none when it cannot be listed (absent, no access)."""
    try:
        return sorted(os.listdir(d), key=key)
    except OSError:
        return []


def _sys(root: str | os.PathLike) -> Path:
    return Path(root) / "sys"


def _bdf_of(p: Path) -> str | None:
    """The BDF of the nearest PCI function a ``device`` symlink resolves to (lower case)."""
    try:
        parts = p.resolve(strict=True).parts
    except OSError:
        return None
    for name in reversed(parts):  # virtio-net: .../0000:00:03.0/virtio2 -> its PCI function
        if _BDF.match(name):
            return name.lower()
        if _ROOT.match(name):
            break
    return None


def read_pci(root: str | os.PathLike, bdf: str) -> PciDevice | None:
    """One device under ``<root>/sys/bus/pci/devices``; None if absent."""
    link = _sys(root) / "bus" / "pci" / "devices" / bdf
    try:
        real = link.resolve(strict=True)
    except OSError:
        return None
    comps = real.parts
    # components after the root complex "pciDDDD:BB"
    idx = next((i for i, c in enumerate(comps) if _ROOT.match(c)), None)
    host_bridge = None
    chain: list[str] = []
    if idx is not None:
        m = _ROOT.match(comps[idx])
        host_bridge = f"{int(m.group(1), 16) & 0xFFFF:04x}:{m.group(2).lower()}"
        chain = [c.lower() for c in comps[idx + 1 :] if _BDF.match(c)]
    parents = chain[:-1]  # root port, usp, dsp, usp, dsp, ...
    switches = tuple(reversed(parents[1::2]))
    numa = _int(_read(real / "numa_node"))
    return PciDevice(
        bdf=bdf.lower(),
        cls=_int(_read(real / "class"), 16),
        vendor=_int(_read(real / "vendor"), 16),
        device=_int(_read(real / "device"), 16),
        numa=None if numa is None or numa < 0 else numa,
        link_speed=_read(real / "current_link_speed"),
        link_width=_int(_read(real / "current_link_width")),
        max_link_speed=_read(real / "max_link_speed"),
        max_link_width=_int(_read(real / "max_link_width")),
        switches=switches,
        host_bridge=host_bridge,
        cpulist=_read(real / "local_cpulist"),
        root_port=parents[0] if parents else None,
    )


def pci_devices(root: str | os.PathLike = "/") -> dict[str, PciDevice]:
    """All PCI devices by BDF (empty when sysfs is absent)."""
    out = {}
    for n in _names(_sys(root) / "bus" / "pci" / "devices"):
        dev = read_pci(root, n)
        if dev is not None:
            out[dev.bdf] = dev
    return out


_RATE = re.compile(r"([0-9.]+)\s*Gb/sec")


def nics(root: str | os.PathLike = "/") -> list[NicInfo]:
    """Verbs devices (one entry per port) then physical netdevs not backing a verbs port.

    Loopback, virtual interfaces without a ``device`` link (docker0, veth,
    bonds) are skipped; netdevs whose PCI function is already a verbs device
    (``ib0`` on ``mlx5_0``) are folded into it (``netdev``).
    """
    base = _sys(root) / "class"
    out: list[NicInfo] = []
    ib_pci: dict[str, int] = {}
    for hca in _names(base / "infiniband"):
        d = base / "infiniband" / hca
        pci = _bdf_of(d / "device")
        for p in _names(d / "ports", key=lambda s: _int(s) or 0):
            pd = d / "ports" / p
            m = _RATE.search(_read(pd / "rate") or "")
            out.append(
                NicInfo(
                    name=hca,
                    kind="ib",
                    pci=pci,
                    port=_int(p) or 1,
                    rate=float(m.group(1)) if m else None,
                    link_layer=_read(pd / "link_layer"),
                    state=_read(pd / "state"),
                )
            )
            if pci:
                ib_pci[pci] = len(out) - 1
    for ifn in _names(base / "net"):
        d = base / "net" / ifn
        if ifn == "lo" or not (d / "device").exists():
            continue
        pci = _bdf_of(d / "device")
        if pci in ib_pci:
            i = ib_pci[pci]
            out[i] = NicInfo(**{**out[i].__dict__, "netdev": ifn})
            continue
        speed = _int(_read(d / "speed"))
        out.append(
            NicInfo(
                name=ifn,
                kind="net",
                pci=pci,
                port=1,
                rate=speed / 1000 if speed and speed > 0 else None,
                link_layer="Ethernet",
                state=_read(d / "operstate"),
                netdev=ifn,
            )
        )
    return out


def numa_nodes(root: str | os.PathLike = "/") -> dict[int, str]:
    """NUMA node id -> cpulist string; empty when sysfs has no node directory."""
    d = _sys(root) / "devices" / "system" / "node"
    out: dict[int, str] = {}
    for n in _names(d):
        m = re.fullmatch(r"node(\d+)", n)
        if m:
            out[int(m.group(1))] = _read(d / n / "cpulist") or ""
    return dict(sorted(out.items()))
