"""Test doubles for discovery: a pynvml stand-in replaying a recording, and a synthetic sysfs tree.

A recording (tests/topo/recordings/<machine>.json) has two parts:

* ``nvml``: per GPU what pynvml answered (``busId`` exactly as NVML prints it,
  upper case with an 8-hex-digit domain; ``links``: per NVLink ``state``,
  ``version`` (the NVML enum), ``remote`` bus id, ``type``; ``link_error``: the
  error NVML raises past the last link; ``fabric``; ``c2c``; ``p2p`` status);
* ``sysfs``: the files discovery reads under /sys and /proc (PCI device paths
  from the root complex down, link speeds, NUMA nodes, verbs and net devices).

Each recording says where its values come from (``source``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pynvml as _real

RECORDINGS = Path(__file__).with_name("recordings")
_ERR = {
    "invalid_argument": _real.NVML_ERROR_INVALID_ARGUMENT,
    "not_supported": _real.NVML_ERROR_NOT_SUPPORTED,
    "driver_not_loaded": _real.NVML_ERROR_DRIVER_NOT_LOADED,
    "library_not_found": _real.NVML_ERROR_LIBRARY_NOT_FOUND,
}


def load(name: str) -> dict:
    return json.loads((RECORDINGS / f"{name}.json").read_text())


class _FabricInfo:
    def __init__(self):
        self.version = 0
        self.clusterUuid = [0] * 16
        self.status = 0
        self.cliqueId = 0
        self.state = 0
        self.healthMask = 0


class FakePynvml:
    """Answers pynvml calls from a recording; counts calls in ``calls``."""

    NVMLError = _real.NVMLError

    def __init__(self, rec: dict):
        self.rec = rec["nvml"]
        self.calls: dict[str, int] = {}
        for k in (
            "NVML_ERROR_INVALID_ARGUMENT",
            "NVML_ERROR_NOT_SUPPORTED",
            "NVML_FEATURE_ENABLED",
            "NVML_NVLINK_MAX_LINKS",
            "NVML_CLOCK_MEM",
        ):
            setattr(self, k, getattr(_real, k))
        self.c_nvmlGpuFabricInfo_v2_t = _FabricInfo
        self.c_nvmlGpuFabricInfo_t = _FabricInfo

    def __getattribute__(self, name):
        if name.startswith("nvml"):
            calls = object.__getattribute__(self, "calls")
            calls[name] = calls.get(name, 0) + 1
        return object.__getattribute__(self, name)

    def _raise(self, what: str):
        raise _real.NVMLError(_ERR[what])

    def _g(self, h):
        return self.rec["gpus"][h]

    def nvmlInit(self):
        if self.rec.get("init_error"):
            self._raise(self.rec["init_error"])

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.rec["gpus"])

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._g(h)["busId"].encode())

    def nvmlDeviceGetUUID(self, h):
        return self._g(h)["uuid"]

    def nvmlDeviceGetName(self, h):
        return self._g(h)["name"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self._g(h)["memory"])

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return tuple(self._g(h)["cc"])

    def nvmlDeviceGetNumaNodeId(self, h):
        if self._g(h).get("numa_node_id") is None:
            self._raise("not_supported")
        return self._g(h)["numa_node_id"]

    def nvmlDeviceGetCpuAffinity(self, h, n):
        from treecoll.topo.sysfs import parse_cpulist

        v = sum(1 << c for c in parse_cpulist(self._g(h)["cpu_affinity"]))
        return [(v >> (64 * i)) & (2**64 - 1) for i in range(n)]

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return self._g(h)["mem_clock_mhz"]

    def nvmlDeviceGetMemoryBusWidth(self, h):
        return self._g(h)["mem_bus_width"]

    def nvmlDeviceGetNvLinkState(self, h, link):
        links = self._g(h)["links"]
        if link >= len(links):
            self._raise(self._g(h)["link_error"])
        return links[link]["state"]

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return self._g(h)["links"][link]["version"]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self._g(h)["links"][link]["remote"].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        t = self._g(h)["links"][link].get("type")
        if t is None:
            self._raise("not_supported")
        return t

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        return self.rec["p2p"][a][b]

    def nvmlDeviceGetGpuFabricInfoV(self, h, info):
        self._fabric(h, info)

    def nvmlDeviceGetGpuFabricInfo(self, h, info):  # deprecated: must only be a fallback
        self._fabric(h, info)

    def _fabric(self, h, info):
        f = self._g(h).get("fabric")
        if f is None:
            self._raise("not_supported")
        info.clusterUuid = bytes.fromhex(f["clusterUuid"].replace("-", ""))
        info.cliqueId, info.state, info.healthMask = f["cliqueId"], f["state"], f.get("healthMask", 0)

    def nvmlDeviceGetFieldValues(self, h, ids):
        c2c = self._g(h).get("c2c")
        vals = {170: c2c[0], 172: c2c[1]} if c2c else {}
        return [
            SimpleNamespace(
                nvmlReturn=0 if i in vals else _real.NVML_ERROR_NOT_SUPPORTED,
                value=SimpleNamespace(uiVal=vals.get(i, 0)),
            )
            for i in ids
        ]


def _w(p: Path, text) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"{text}\n")


def build_sysfs(root: Path, spec: dict) -> Path:
    """Write the synthetic tree of ``spec`` (a recording's ``sysfs``) under ``root``."""
    sysd = root / "sys"
    if "cpuinfo" in spec:
        _w(root / "proc" / "cpuinfo", spec["cpuinfo"])
    for n, cpus in spec.get("nodes", {}).items():
        _w(sysd / "devices/system/node" / f"node{n}" / "cpulist", cpus)
    for cpu, pkg in spec.get("sockets", {}).items():
        _w(sysd / "devices/system/cpu" / f"cpu{cpu}" / "topology/physical_package_id", pkg)
    (sysd / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    for dev in spec.get("pci", []):
        path = dev["path"]
        d = sysd / "devices" / Path(*path)
        d.mkdir(parents=True, exist_ok=True)
        for comp_i in range(1, len(path)):  # every BDF on the way gets a bus/pci/devices link
            comp = path[comp_i]
            link = sysd / "bus/pci/devices" / comp
            if not link.is_symlink():
                os.symlink(os.path.relpath(sysd / "devices" / Path(*path[: comp_i + 1]), link.parent), link)
            cd = sysd / "devices" / Path(*path[: comp_i + 1])
            if not (cd / "class").exists():
                _w(cd / "class", "0x060400")
        files = {
            "class": dev.get("class", "0x060400"),
            "numa_node": dev.get("numa", -1),
            "vendor": dev.get("vendor", "0x10de"),
            "device": dev.get("device", "0x0000"),
        }
        for k in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width"):
            if k in dev:
                files[k] = dev[k]
        for k, v in files.items():
            _w(d / k, v)
    for ib in spec.get("ib", []):
        d = sysd / "class/infiniband" / ib["name"]
        d.mkdir(parents=True, exist_ok=True)
        if ib.get("pci"):
            os.symlink(os.path.relpath(sysd / "bus/pci/devices" / ib["pci"], d), d / "device")
        for port, p in enumerate(ib.get("ports", [{}]), start=1):
            pd = d / "ports" / str(port)
            _w(pd / "rate", p.get("rate", ib.get("rate", "")))
            _w(pd / "link_layer", p.get("link_layer", ib.get("link_layer", "InfiniBand")))
            _w(pd / "state", p.get("state", ib.get("state", "4: ACTIVE")))
    for nd in spec.get("net", []):
        d = sysd / "class/net" / nd["name"]
        d.mkdir(parents=True, exist_ok=True)
        if nd.get("pci"):
            os.symlink(os.path.relpath(sysd / "bus/pci/devices" / nd["pci"], d), d / "device")
        _w(d / "speed", nd.get("speed", -1))
        _w(d / "operstate", nd.get("operstate", "up"))
    return root
