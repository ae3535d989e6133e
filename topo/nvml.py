"""One small adapter over NVML (``pynvml`` from the ``nvidia-ml-py`` package).

Discovery asks NVML only what it needs, through :class:`Nvml`; every answer is
plain data, and a query the driver cannot answer returns :data:`NA` (a typed
"not available" value, falsy, printed ``N/A``; cf. nvitop's ``nvmlQuery``)
instead of raising. Only opening NVML can fail, with :class:`NVMLUnavailable`
(no ``pynvml`` module, no ``libnvidia-ml.so``, no driver): discovery turns that
into a CPU-only host and a one-line notice.

Pitfalls handled (sources: the NVML API reference, https://docs.nvidia.com/deploy/nvml-api/;
``pynvml.py`` of nvidia-ml-py 13.615.71; https://github.com/NVIDIA/nccl-tests/issues/256 for
the invisible remote bus id in VMs; NVIDIA/TensorRT-LLM PR #17060 for GB200's INVALID_ARGUMENT; open-mpi/hwloc#658
for the NVLink version enum):

* NVML bus ids are upper case with an 8-hex-digit domain (``00000000:18:00.0``);
  :func:`norm_busid` gives NCCL's/sysfs' ``0000:18:00.0``. A remote bus id that
  is empty, all ``F`` or all zero (VMs, containers: NVSwitch not passed through)
  becomes ``None`` ("invisible").
* Link loops stop at the first link NVML rejects: GB200 answers
  ``NVML_ERROR_INVALID_ARGUMENT`` past the real link count (not NOT_SUPPORTED).
* ``nvmlDeviceGetNvLinkVersion`` returns an enum (A100 answers 5 = NVLink 3.1);
  :data:`NVLINK_VERSION_GENERATION` maps it to the generation.
* The fabric-info call: ``nvmlDeviceGetGpuFabricInfoV`` (versioned struct)
  first, the deprecated ``nvmlDeviceGetGpuFabricInfo`` as a fallback.
* ``NVML_P2P_CAPS_INDEX_READ`` is the tuple ``(0,)`` in nvidia-ml-py 13.615.71:
  literal indices are used.

The module object is injectable (``Nvml(module=fake)``) so tests replay
recorded answers of real machines.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from .errors import DiscoveryError

__all__ = [
    "NA",
    "NotAvailable",
    "NVMLUnavailable",
    "Nvml",
    "GpuInfo",
    "LinkInfo",
    "FabricInfo",
    "norm_busid",
    "NVLINK_VERSION_GENERATION",
    "P2P_STATUS",
    "cuda_order",
]


class NotAvailable:
    """The type of :data:`NA`: a query NVML could not answer (falsy, ``N/A``)."""

    _inst = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "N/A"

    __str__ = __repr__


NA = NotAvailable()


class NVMLUnavailable(DiscoveryError):
    """NVML cannot be used on this machine (no pynvml, no library, no driver)."""


# NVML return codes (nvml.h); literal fallbacks when the module lacks them
_ERR_INVALID_ARGUMENT = 2
_ERR_NOT_SUPPORTED = 3

#: nvmlNvlinkVersion_t enum -> NVLink generation (nvml.h; hwloc#658: A100 answers 5)
NVLINK_VERSION_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
#: nvmlGpuP2PStatus_t -> nvidia-smi's abbreviation (nvidia-smi topo -p2p legend)
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
_P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "pci": 4}
_REMOTE_TYPE = {0: "gpu", 1: "ibmnpu", 2: "switch", 0xFF: "unknown"}


def norm_busid(busid: Any) -> str | None:
    """NVML/sysfs/NCCL bus id -> ``"dddd:bb:dd.f"`` lower case; None when invisible.

    >>> norm_busid(b"00000000:18:00.0"), norm_busid("FFFFFFFF:FF:FF.0"), norm_busid("")
    ('0000:18:00.0', None, None)
    >>> norm_busid("0001:00:00.0")
    '0001:00:00.0'
    """
    if isinstance(busid, bytes):
        busid = busid.decode("ascii", "replace")
    s = str(busid or "").strip().strip("\x00").lower()
    if not s:
        return None
    parts = s.split(":")
    if len(parts) == 2:
        parts = ["0"] + parts
    if len(parts) != 3 or "." not in parts[2]:
        return None
    dom, bus, devfn = parts
    dev, _, fn = devfn.partition(".")
    try:
        d, b, v, f = int(dom, 16), int(bus, 16), int(dev, 16), int(fn or "0", 16)
    except ValueError:
        return None
    if set(dom + bus + dev) <= {"f"} or (d, b, v, f) == (0, 0, 0, 0):
        return None  # FFFFFFFF:FF:FF.0 (NCCL: fffffff:ff:ff.0) or all-zero: remote not visible
    return f"{d & 0xFFFF:04x}:{b:02x}:{v:02x}.{f:x}"


@dataclass(frozen=True)
class GpuInfo:
    """What NVML says about one GPU. Fields NVML could not answer are :data:`NA`.

    index: NVML index; pci: normalised bus id; memory: bytes; sm: compute
    capability x10; mem_bw: GB/s (max memory clock x 2 x bus width / 8);
    cpus: CPU ids of the GPU's affinity; pcie_*: PCIe generation and width.
    """

    index: int
    uuid: Any
    pci: Any
    name: Any
    memory: Any
    sm: Any
    numa: Any
    cpus: Any
    mem_bw: Any
    pcie_gen: Any = NA
    pcie_width: Any = NA
    pcie_max_gen: Any = NA
    pcie_max_width: Any = NA


@dataclass(frozen=True)
class LinkInfo:
    """One active NVLink of a GPU: ``remote_pci`` None when the peer is invisible."""

    link: int
    version: Any  # NVML enum value
    generation: Any  # NVLink generation (1..6) or NA
    remote_pci: str | None
    remote_type: Any  # "gpu" | "switch" | "ibmnpu" | "unknown" | NA


@dataclass(frozen=True)
class FabricInfo:
    """Multi-node NVLink fabric membership (GB200 NVL72): equal cluster_uuid and
    clique_id = one NVLink domain; an all-zero uuid means no fabric."""

    cluster_uuid: str
    clique_id: int
    state: int
    health_mask: int = 0


@dataclass
class Nvml:
    """An open NVML session. ``Nvml.open(module=None)`` imports pynvml lazily.

    ``notes`` collects one line per degraded query (e.g. "gpu3: NVLink remote
    type not supported"), so discovery can say what it could not see.
    """

    m: Any
    notes: list = field(default_factory=list)

    @classmethod
    def open(cls, module: Any = None) -> Nvml:
        """Import pynvml (unless given) and call nvmlInit; NVMLUnavailable on any failure."""
        if module is None:
            try:
                module = importlib.import_module("pynvml")
            except ImportError as e:
                raise NVMLUnavailable(f"NVML: expected the pynvml module (pip install nvidia-ml-py), got {e}") from None
        try:
            module.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError from ctypes
            raise NVMLUnavailable(f"NVML: expected a working NVIDIA driver, got {type(e).__name__}: {e}") from None
        return cls(module)

    def close(self) -> None:
        try:
            self.m.nvmlShutdown()
        except Exception:
            pass

    # ---------------------------------------------------------------- helpers
    def _q(self, fn: str, *args, what: str = "") -> Any:
        """Call ``pynvml.<fn>(*args)``; NA (and a note) on NVMLError or a missing function."""
        f = getattr(self.m, fn, None)
        if f is None:
            return NA
        try:
            return f(*args)
        except getattr(self.m, "NVMLError", Exception) as e:
            if what:
                self.notes.append(f"{what}: {fn} failed ({e})")
            return NA

    def _code(self, e: Exception) -> int:
        return getattr(e, "value", -1)

    def _handle(self, i: int):
        return self.m.nvmlDeviceGetHandleByIndex(i)

    # ---------------------------------------------------------------- queries
    def count(self) -> int:
        """Number of GPUs NVML enumerates (all of them, whatever CUDA_VISIBLE_DEVICES says)."""
        n = self._q("nvmlDeviceGetCount", what="device count")
        return 0 if n is NA else int(n)

    def gpu(self, i: int) -> GpuInfo:
        """Identity, memory, compute capability, NUMA and PCIe link of GPU ``i``."""
        h = self._handle(i)
        w = f"gpu{i}"
        pci = self._q("nvmlDeviceGetPciInfo", h, what=w)
        busid = norm_busid(getattr(pci, "busId", "")) if pci is not NA else NA
        mem = self._q("nvmlDeviceGetMemoryInfo", h, what=w)
        cc = self._q("nvmlDeviceGetCudaComputeCapability", h, what=w)
        sm = NA if cc is NA else int(cc[0]) * 10 + int(cc[1])
        numa = self._q("nvmlDeviceGetNumaNodeId", h)  # only coherent (GH/GB200) systems answer
        aff = self._q("nvmlDeviceGetCpuAffinity", h, 64)
        cpus = (
            NA if aff is NA else [w64 * 64 + b for w64, word in enumerate(aff) for b in range(64) if int(word) >> b & 1]
        )
        clk = self._q("nvmlDeviceGetMaxClockInfo", h, getattr(self.m, "NVML_CLOCK_MEM", 2))
        width = self._q("nvmlDeviceGetMemoryBusWidth", h)
        mem_bw = NA if NA in (clk, width) else round(float(clk) * 1e6 * 2 * int(width) / 8 / 1e9, 1)
        return GpuInfo(
            index=i,
            uuid=_s(self._q("nvmlDeviceGetUUID", h, what=w)),
            pci=busid,
            name=_s(self._q("nvmlDeviceGetName", h, what=w)),
            memory=NA if mem is NA else int(mem.total),
            sm=sm,
            numa=NA if numa is NA or int(numa) < 0 else int(numa),
            cpus=cpus,
            mem_bw=mem_bw,
            pcie_gen=self._q("nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_width=self._q("nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_max_gen=self._q("nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_max_width=self._q("nvmlDeviceGetMaxPcieLinkWidth", h),
        )

    def nvlinks(self, i: int) -> list[LinkInfo]:
        """Active NVLinks of GPU ``i`` (NCCL's order: state, then remote PCI info).

        Stops at the first link NVML rejects with INVALID_ARGUMENT (GB200 past
        the last link) or at NVML_NVLINK_MAX_LINKS; NOT_SUPPORTED on link 0
        means "no NVLink" (PCIe cards).
        """
        h = self._handle(i)
        out: list[LinkInfo] = []
        nmax = int(getattr(self.m, "NVML_NVLINK_MAX_LINKS", 18))
        err = getattr(self.m, "NVMLError", Exception)
        for link in range(nmax):
            try:
                state = self.m.nvmlDeviceGetNvLinkState(h, link)
            except err as e:
                code = self._code(e)
                if code not in (
                    getattr(self.m, "NVML_ERROR_INVALID_ARGUMENT", _ERR_INVALID_ARGUMENT),
                    getattr(self.m, "NVML_ERROR_NOT_SUPPORTED", _ERR_NOT_SUPPORTED),
                ):
                    self.notes.append(f"gpu{i}: NVLink {link} state failed ({e}); later links skipped")
                break
            if state != getattr(self.m, "NVML_FEATURE_ENABLED", 1):
                continue
            ver = self._q("nvmlDeviceGetNvLinkVersion", h, link)
            rpci = self._q("nvmlDeviceGetNvLinkRemotePciInfo", h, link, what=f"gpu{i} link {link}")
            rtype = self._q("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            out.append(
                LinkInfo(
                    link=link,
                    version=ver,
                    generation=NA if ver is NA else NVLINK_VERSION_GENERATION.get(int(ver), NA),
                    remote_pci=None if rpci is NA else norm_busid(getattr(rpci, "busId", "")),
                    remote_type=NA if rtype is NA else _REMOTE_TYPE.get(int(rtype), "unknown"),
                )
            )
        return out

    def p2p(self, i: int, j: int, cap: str = "read") -> Any:
        """P2P status between GPUs i and j: "OK", "CNS", "GNS", "TNS", "DR", "NS", "U", or NA."""
        st = self._q("nvmlDeviceGetP2PStatus", self._handle(i), self._handle(j), _P2P_CAPS[cap])
        return NA if st is NA else P2P_STATUS.get(int(st), "U")

    def c2c(self, i: int) -> Any:
        """``(count, MB/s per link)`` of C2C links (Grace), or NA (fields 170, 172)."""
        f = getattr(self.m, "nvmlDeviceGetFieldValues", None)
        if f is None:
            return NA
        try:
            vals = f(self._handle(i), [170, 172])  # NVML_FI_DEV_C2C_LINK_COUNT, _GET_MAX_BW
        except getattr(self.m, "NVMLError", Exception):
            return NA
        if any(getattr(v, "nvmlReturn", 1) != 0 for v in vals):
            return NA
        count, bw = (int(getattr(v.value, "uiVal", 0)) for v in vals)
        return (count, bw) if count > 0 else NA

    def fabric(self, i: int) -> Any:
        """:class:`FabricInfo` of GPU i, or NA (no fabric, or state NOT_SUPPORTED)."""
        h = self._handle(i)
        info = NA
        ctor = getattr(self.m, "c_nvmlGpuFabricInfo_v2_t", None)
        fv = getattr(self.m, "nvmlDeviceGetGpuFabricInfoV", None)
        err = getattr(self.m, "NVMLError", Exception)
        if ctor is not None and fv is not None:
            try:
                info = ctor()
                fv(h, _byref(info))
            except err:
                info = NA
        if info is NA and getattr(self.m, "c_nvmlGpuFabricInfo_t", None) is not None:
            try:  # deprecated ("will be removed in CUDA 14.0"), kept as a fallback for old drivers
                info = self.m.c_nvmlGpuFabricInfo_t()
                self.m.nvmlDeviceGetGpuFabricInfo(h, _byref(info))
            except (err, AttributeError):
                info = NA
        if info is NA or int(getattr(info, "state", 0)) == 0:
            return NA
        uuid = bytes(bytearray(getattr(info, "clusterUuid", b"")))
        if not any(uuid):
            return NA
        hx = uuid.hex()
        return FabricInfo(
            cluster_uuid=f"{hx[:8]}-{hx[8:12]}-{hx[12:16]}-{hx[16:20]}-{hx[20:32]}",
            clique_id=int(info.cliqueId),
            state=int(info.state),
            health_mask=int(getattr(info, "healthMask", 0)),
        )


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _byref(obj: Any) -> Any:
    try:
        import ctypes

        return ctypes.byref(obj)
    except TypeError:  # test doubles are plain objects
        return obj


def cuda_order(gpus: list[GpuInfo], env: dict | None = None) -> list[int]:
    """NVML indices of the GPUs CUDA will see, in CUDA ordinal order.

    CUDA enumerates by PCI bus id with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; its
    default ``FASTEST_FIRST`` puts faster devices first and breaks ties by bus
    id, approximated here as (compute capability descending, bus id). Then
    ``CUDA_VISIBLE_DEVICES`` selects from that order: integer ordinals, or
    ``GPU-<uuid>`` (a unique prefix is enough); enumeration stops at the first
    invalid entry (CUDA Programming Guide, Environment Variables); an empty
    string hides every GPU. MIG ids are not resolved (they stop enumeration).

    >>> g = [GpuInfo(i, f"GPU-{i}aa", f"0000:{b:02x}:00.0", "x", 0, 90, NA, NA, NA) for i, b in enumerate([0x30, 0x10])]
    >>> cuda_order(g, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}), cuda_order(g, {"CUDA_VISIBLE_DEVICES": "1,GPU-1,7"})
    ([1, 0], [0, 1])
    """
    env = {} if env is None else env
    if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID":
        key = lambda g: (str(g.pci or ""), g.index)  # noqa: E731
    else:
        key = lambda g: (-(g.sm if isinstance(g.sm, int) else 0), str(g.pci or ""), g.index)  # noqa: E731
    order = [g.index for g in sorted(gpus, key=key)]
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return order
    by_index = {g.index: g for g in gpus}
    out: list[int] = []
    for tok in (t.strip() for t in cvd.split(",")):
        if not tok:
            break
        if tok.lstrip("-").isdigit():
            k = int(tok)
            if not 0 <= k < len(order):
                break
            pick = order[k]
        elif tok.startswith("GPU-"):
            hits = [i for i in order if str(by_index[i].uuid or "").startswith(tok)]
            if len(hits) != 1:
                break
            pick = hits[0]
        else:
            break
        if pick in out:
            break
        out.append(pick)
    return out
