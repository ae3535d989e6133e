"""Machines from a few facts (GPU model, hosts, GPUs per host, NICs) -> a Topology.

Without a topology file, a machine is named the way people describe one:
``--hosts 2 --gpus-per-host 8 --gpu H100 --nic 8x400G-ib`` (the flags of
``treecoll.tools.machine_flags``), or by what an nccl-tests output prints
(its device lines: hosts, GPUs per host, the GPU's name; see
:meth:`treecoll.collectives.sim.nccltests.Table.machine_facts`). Flags win over
the file. :func:`resolve_machine` combines the two into a :class:`Machine`;
:meth:`Machine.topology` builds it: the shipped machine template of the GPU
(``topologies/machines/*.yaml``, and the shipped ``hgx-b200`` and
``gb200-nvl72``), trimmed to the GPUs per host, its NICs replaced by
``--nic``, repeated over the hosts on a rail-optimized network, written as
the compact YAML form and loaded by :func:`treecoll.topo.yaml_io.loads` like
any topology file. Every template cites the public sources of its numbers.

GPU names resolve through one table, :data:`MACHINES`: per template the names
nvidia-smi and nccl-tests print (``"NVIDIA H100 80GB HBM3"``,
``"NVIDIA A100-SXM4-80GB"``, ``"Tesla V100-PCIE-32GB"``) and short aliases
(``H100``, ``B200``). Matching ignores case, spaces, dashes and the
``NVIDIA`` / ``Tesla`` / ``GeForce`` prefixes old drivers drop. A name several
templates share (a GH200 node of 1 or 4 superchips) picks the smallest
template with room for the GPUs per host. ``"NVIDIA Graphics Device"``, the name
a driver prints for a GPU it does not know, is read as a GB200 tray only with 4
GPUs per host (:data:`UNNAMED`), and the machine says so in
:attr:`Machine.notes`. Anything else is a one-line :class:`~treecoll.topo.errors.TopologyError`
that lists the known names and the flag to pass.

``--nic COUNTxSPEEDG-FABRIC`` (:func:`parse_nic`): NICs per host, their line
rate in Gb/s (NCCL's NET bandwidth is rate / 8: 400G -> 50 GB/s, NVIDIA/nccl
src/graph/topo.h) and the fabric, one of :data:`FABRICS`. The NICs replace
the template's, NIC ``k`` beside GPU ``k * G / COUNT`` (its PCIe switch, or its
NUMA domain): 8 NICs on 8 GPUs one each, 32 on 8 four each, 4 on 8 one per pair.

``--gpu-nic aligned|unaligned`` (:data:`GPU_NIC`): whether each GPU shares a PCIe
switch with the NIC it uses. ``aligned`` (the default) is the template's
placement, as on DGX / HGX hosts; ``unaligned`` puts every NIC (the template's
or ``--nic``'s) on the CPU of its GPU's NUMA node, on no GPU's switch: a
container given one fixed NIC and whichever GPU is free (a Kubernetes pod
asking for ``nvidia.com/gpu: 1``). NCCL then runs the network without
GPUDirect RDMA (the GPU-NIC path is beyond ``NCCL_NET_GDR_LEVEL``, PXB by
default: NVIDIA/nccl src/graph/paths.cc ``ncclTopoCheckGdr``), which the
simulator derives from the path (:func:`treecoll.topo.env.gdr`).

>>> m = resolve_machine(MachineFlags(hosts=2, gpu="NVIDIA H100 80GB HBM3", nic=parse_nic("8x400G-ib")))
>>> m.template, m.hosts, m.gpus_per_host, str(m.nic)
('h100-sxm', 2, 8, '8x400G-ib')
>>> t = m.topology()
>>> len(t.gpus()), t.node("h0/nic0")["bw"], t.path("h0/gpu0", "h1/gpu0").nccl, t.meta["machine"]["fabric"]
(16, 50.0, 'NET', 'ib')
>>> f = MachineFlags(hosts=2, gpu="H200", gpus_per_host=1, nic=parse_nic("1x400G-roce"), gpu_nic="unaligned")
>>> u = resolve_machine(f)
>>> u.topology().path("h0/gpu0", "h0/nic0").nccl, u.describe()[-34:]
('PHB', "GPUs off their NICs' PCIe switches")
>>> resolve_machine(MachineFlags(hosts=1, gpu="H999")).template  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
treecoll.topo.errors.TopologyError: --gpu 'H999': no machine template for this GPU; expected a template (a100-pcie, ...
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from ._schema import YAML_LOADER
from .errors import TopologyError

if TYPE_CHECKING:
    from .model import Topology

__all__ = [
    "Fabric",
    "FABRICS",
    "Nic",
    "parse_nic",
    "MachineTemplate",
    "MACHINES",
    "GPU_VARIANTS",
    "UNNAMED",
    "GpuChoice",
    "resolve_gpu",
    "GPU_NIC",
    "parse_gpu_nic",
    "MachineFacts",
    "MachineFlags",
    "Machine",
    "resolve_machine",
    "machine_topology",
    "template_data",
    "known_gpus",
    "MAX_NICS",
    "MAX_HOSTS",
]

#: NICs per host and hosts accepted from flags (a typo of 10**6 is refused before anything is built)
MAX_NICS = 256
MAX_HOSTS = 1 << 17


@dataclass(frozen=True)
class Fabric:
    """A network fabric ``--nic`` may name. ``link_layer``: the NICs' ``link_layer`` attribute;
    ``lat``: µs per message the transport reports to NCCL as its network latency (the NICs'
    ``lat``), only where a public source or a fit table (named beside it) gives it."""

    name: str
    link_layer: str
    description: str
    lat: float | None = None


#: the fabrics of ``--nic``, by flag value
FABRICS: dict[str, Fabric] = {
    f.name: f
    for f in (
        Fabric("ib", "InfiniBand", "InfiniBand (verbs, GPUDirect RDMA)"),
        # 7.5 us: chosen from the fit table h200-2gpu-2node-allreduce-gke-mpioperator (Google Cloud RoCE,
        # gIB NCCL plugin; 2-rank allreduce of 1-64 KiB in 32-54 us), modelled with its GPUs off their
        # NIC's PCIe switch (tables.yaml gpu_nic: --gpu-nic unaligned): NCCL then runs without GPUDirect
        # RDMA (beyond PXB, src/graph/paths.cc ncclTopoCheckGdr) and stages every network step through
        # host memory on both sides (src/transport/net.cc sendProxyConnect, recvProxyConnect), which the
        # simulator adds per step. The value is the best of a scan in 0.5 us steps of the table's small-
        # message error (5: 11.3%, 6: 8.7%, 7: 7.2%, 7.5: 7.1%, 8: 7.7%, 9: 11.0%). No public source states
        # the latency of a RoCE NCCL net plugin (NCCL's own verbs transport reports 0, src/transport/net_ib.cc)
        Fabric("roce", "RoCE", "RDMA over Converged Ethernet (verbs, GPUDirect RDMA)", lat=7.5),
        # aws/aws-ofi-nccl src/platform-aws.cpp: the plugin's default net latency, 75 us (p4d, p4de,
        # p5, g5.48xlarge; 35 us on p5en/p6, pass a topology file for those)
        Fabric("efa", "EFA", "AWS Elastic Fabric Adapter (aws-ofi-nccl plugin)", lat=75.0),
        Fabric("tcpx", "TCPX", "Google Cloud GPUDirect-TCPX (A3 High)"),
        Fabric("tcpxo", "TCPXO", "Google Cloud GPUDirect-TCPXO (A3 Mega)"),
        Fabric("slingshot", "Slingshot", "HPE Slingshot (libfabric CXI through the aws-ofi-nccl plugin)"),
        Fabric("socket", "Socket", "NCCL's TCP socket transport (no RDMA)"),
    )
}

_NIC_SPEC = re.compile(
    r"\s*(\d{1,6})\s*[xX*]\s*(\d{1,6}(?:\.\d{1,3})?)\s*([GgTtMm])(?:b|bps|b/s|bit/s)?"
    r"\s*-\s*(\S*)\s*"
)
_NIC_FORM = "COUNTxSPEEDG-FABRIC (e.g. 8x400G-ib, 32x100G-efa, 8x200G-tcpxo, 1x200G-slingshot)"
_SPEED_UNITS = {"g": 1.0, "t": 1000.0, "m": 0.001}


@dataclass(frozen=True)
class Nic:
    """``count`` NICs per host of ``gbps`` Gb/s line rate each, on ``fabric`` (a key of :data:`FABRICS`)."""

    count: int
    gbps: float
    fabric: str

    @property
    def bw(self) -> float:
        """GB/s per direction as NCCL models a NIC: line rate / 8 (NET bw = Mb/s / 8000, topo.h)."""
        return self.gbps / 8.0

    def __str__(self) -> str:
        return f"{self.count}x{self.gbps:g}G-{self.fabric}"


def parse_nic(text: str, *, what: str = "--nic") -> Nic:
    """``"8x400G-ib"`` -> ``Nic(8, 400.0, "ib")``; anything else is a one-line :class:`TopologyError`.

    >>> parse_nic("32x100G-efa").bw, str(parse_nic("1 x 200Gbps-Slingshot"))
    (12.5, '1x200G-slingshot')
    >>> parse_nic("8x400G-xyz")
    Traceback (most recent call last):
    ...
    treecoll.topo.errors.TopologyError: --nic '8x400G-xyz': unknown fabric 'xyz'; expected one of ib, roce, efa, ...
    """
    m = _NIC_SPEC.fullmatch(str(text))
    if not m:
        raise TopologyError(f"{what} {str(text)[:60]!r}: expected {_NIC_FORM}")
    count, gbps = int(m.group(1)), float(m.group(2)) * _SPEED_UNITS[m.group(3).lower()]
    fabric = m.group(4).lower()
    if fabric not in FABRICS:
        raise TopologyError(
            f"{what} {text!r}: unknown fabric {fabric!r}; expected one of {', '.join(FABRICS)} in {_NIC_FORM}"
        )
    if not 1 <= count <= MAX_NICS:
        raise TopologyError(f"{what} {text!r}: expected 1 to {MAX_NICS} NICs per host, got {count}")
    if not 0 < gbps <= 100_000:
        raise TopologyError(f"{what} {text!r}: expected a line rate above 0 and at most 100000 Gb/s, got {gbps:g}")
    return Nic(count, gbps, fabric)


#: the values of ``--gpu-nic``: whether each GPU shares a PCIe switch with the NIC it uses (module docstring)
GPU_NIC = ("aligned", "unaligned")


def parse_gpu_nic(text: str, *, what: str = "--gpu-nic") -> str:
    """``"Unaligned"`` -> ``"unaligned"``; anything but :data:`GPU_NIC` is a one-line :class:`TopologyError`.

    >>> parse_gpu_nic("aligned")
    'aligned'
    >>> parse_gpu_nic("pix")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    treecoll.topo.errors.TopologyError: --gpu-nic 'pix': expected one of aligned, unaligned (whether each GPU ...
    """
    v = str(text).strip().lower()
    if v not in GPU_NIC:
        raise TopologyError(
            f"{what} {str(text)[:60]!r}: expected one of {', '.join(GPU_NIC)} (whether each GPU shares a "
            f"PCIe switch with its NIC)"
        )
    return v


# ---------------------------------------------------------------------------------------------- GPU names
@dataclass(frozen=True)
class MachineTemplate:
    """A shipped machine template (a topology file of that name with one host template):
    ``gpus`` per host, the GPU ``names`` nvidia-smi / nccl-tests print, short ``aliases`` for ``--gpu``."""

    name: str
    gpus: int
    names: tuple[str, ...]
    aliases: tuple[str, ...] = ()


#: the one table from GPU names to machine templates (sources: each template file's header)
MACHINES: tuple[MachineTemplate, ...] = (
    MachineTemplate(
        "h100-sxm", 8, ("NVIDIA H100 80GB HBM3",), ("H100", "H100-SXM5-80GB", "H100 SXM", "HGX H100", "DGX H100")
    ),
    MachineTemplate("h200-sxm", 8, ("NVIDIA H200",), ("H200", "H200-SXM-141GB", "HGX H200", "DGX H200")),
    MachineTemplate("h100-pcie", 8, ("NVIDIA H100 PCIe",), ("H100-PCIe-80GB",)),
    MachineTemplate("h20", 8, ("NVIDIA H20",)),
    MachineTemplate("hgx-b200", 8, ("NVIDIA B200",), ("B200", "HGX B200", "DGX B200")),
    MachineTemplate("gb200-nvl72", 4, ("NVIDIA GB200",), ("GB200", "GB200 NVL72")),
    MachineTemplate("gh200", 1, ("NVIDIA GH200 120GB", "NVIDIA GH200 480GB"), ("GH200",)),
    MachineTemplate("gh200-x4", 4, ("NVIDIA GH200 120GB", "NVIDIA GH200 480GB"), ("GH200",)),
    MachineTemplate("a100-sxm-4", 4, ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"), ("HGX A100 4-GPU",)),
    MachineTemplate(
        "a100-sxm", 8, ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"), ("A100", "HGX A100", "DGX A100")
    ),
    MachineTemplate("a100-pcie", 8, ("NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB"), ("A100 PCIe",)),
    MachineTemplate("a10g", 8, ("NVIDIA A10G",), ("g5.48xlarge",)),
    MachineTemplate("l40s", 8, ("NVIDIA L40S",)),
    MachineTemplate("rtx4090", 8, ("NVIDIA GeForce RTX 4090",)),
    MachineTemplate("rtx5090", 8, ("NVIDIA GeForce RTX 5090",)),
    MachineTemplate("v100-pcie", 4, ("Tesla V100-PCIE-32GB", "Tesla V100-PCIE-16GB"), ("V100 PCIe",)),
)
#: GPU names whose memory differs from their template's GPUs: name -> the GPU attributes to use
GPU_VARIANTS: dict[str, dict[str, Any]] = {
    # A100 40GB datasheet: 1,555 GB/s; mem_gb (GB, 1e9 B): the capacity in the GPU's name
    "NVIDIA A100-SXM4-40GB": {"model": "A100-SXM4-40GB", "mem_bw": 1555.0, "mem_gb": 40.0},
    "NVIDIA A100-PCIE-40GB": {"model": "A100-PCIE-40GB", "mem_bw": 1555.0, "mem_gb": 40.0},  # A100 PCIe 40GB
    "Tesla V100-PCIE-16GB": {"model": "V100-PCIE-16GB", "mem_gb": 16.0},  # same HBM2 bandwidth
}
#: names a driver prints for GPUs it does not know (pre-release drivers): GPUs per host -> template.
#: CoreWeave's GB200 NVL72 runs print "NVIDIA Graphics Device" with 4 GPUs per tray (coreweave/nccl-tests README)
UNNAMED: dict[str, dict[int, str]] = {"NVIDIA Graphics Device": {4: "gb200-nvl72"}}
_PREFIXES = re.compile(r"^(?:nvidia|tesla|geforce)(?=[^a-z0-9]|$)")


def _key(name: str) -> str:
    """Case, spaces, dashes and the NVIDIA / Tesla / GeForce prefixes do not count."""
    s = str(name).strip().lower()
    while True:
        t = _PREFIXES.sub("", s).strip(" -_")
        if t == s:
            break
        s = t
    return re.sub(r"[^a-z0-9.]+", "", s)


def _name_table() -> dict[str, tuple[str, ...]]:
    table: dict[str, list[str]] = {}
    for mt in MACHINES:
        for n in (mt.name, *mt.names, *mt.aliases):
            lst = table.setdefault(_key(n), [])
            if mt.name not in lst:
                lst.append(mt.name)
    size = {mt.name: mt.gpus for mt in MACHINES}
    return {k: tuple(sorted(v, key=lambda x: size[x])) for k, v in table.items()}


_NAMES = _name_table()
_BY_NAME = {mt.name: mt for mt in MACHINES}


def known_gpus() -> list[str]:
    """The template names, then every GPU name the table knows (for messages and ``--help``)."""
    return [mt.name for mt in sorted(MACHINES, key=lambda m: m.name)] + sorted(
        {n for mt in MACHINES for n in mt.names} | set(UNNAMED)
    )


@dataclass(frozen=True)
class GpuChoice:
    """The template a GPU name resolves to, GPU attributes to override, and a note when it was read
    from an ambiguous name."""

    template: str
    overrides: tuple[tuple[str, Any], ...] = ()
    note: str | None = None


def _unknown(name: str, what: str) -> TopologyError:
    names = ", ".join(mt.name for mt in sorted(MACHINES, key=lambda m: m.name))
    return TopologyError(
        f"{what} {name!r}: no machine template for this GPU; expected a template ({names}) or a "
        f"GPU name as nvidia-smi prints it (e.g. 'NVIDIA H100 80GB HBM3'); pass --gpu TEMPLATE, "
        f"or --topology FILE|name for another machine"
    )


def resolve_gpu(name: str, gpus_per_host: int | None = None, *, what: str = "--gpu") -> GpuChoice:
    """The machine template of a GPU name (see the module docstring).

    >>> resolve_gpu("NVIDIA GH200 120GB", 4).template, resolve_gpu("nvidia gh200 120gb", 1).template
    ('gh200-x4', 'gh200')
    >>> c = resolve_gpu("NVIDIA Graphics Device", 4)
    >>> c.template, c.note[:40]
    ('gb200-nvl72', "'NVIDIA Graphics Device' with 4 GPUs per")
    >>> dict(resolve_gpu("A100-SXM4-40GB", 8).overrides)["mem_bw"]
    1555.0
    """
    key = _key(name)
    for unnamed, by_count in UNNAMED.items():
        if key == _key(unnamed):
            if gpus_per_host in by_count:
                t = by_count[gpus_per_host]
                return GpuChoice(
                    t,
                    note=f"{unnamed!r} with {gpus_per_host} GPUs per host read as {t} (the name a "
                    f"driver prints for a GPU it does not know); pass --gpu to change",
                )
            counts = ", ".join(f"{g} GPUs per host: {t}" for g, t in by_count.items())
            raise TopologyError(
                f"{what} {name!r}: the driver did not name this GPU; it is read only as ({counts}), "
                f"got {gpus_per_host or 'an unknown number of'} GPUs per host; pass --gpu TEMPLATE "
                f"(one of {', '.join(sorted(_BY_NAME))}) or --topology FILE|name"
            )
    temps = _NAMES.get(key)
    if not temps:
        raise _unknown(name, what)
    variant = next((v for n, v in GPU_VARIANTS.items() if _key(n) == key), {})
    overrides = tuple(variant.items())
    if len(temps) == 1:
        return GpuChoice(temps[0], overrides)
    if gpus_per_host is None:
        named = [t for t in temps if _key(t) == key]
        if named:  # the template's own name, and no GPU count to choose by
            return GpuChoice(named[0], overrides)
        sizes = ", ".join(f"{_BY_NAME[t].gpus}: {t}" for t in temps)
        raise TopologyError(
            f"{what} {name!r}: several machine templates have this GPU ({sizes} GPUs per host); "
            f"pass --gpus-per-host G or --gpu TEMPLATE"
        )
    fit = next((t for t in temps if _BY_NAME[t].gpus >= gpus_per_host), None)
    if fit is None:
        raise TopologyError(
            f"{what} {name!r}: {gpus_per_host} GPUs per host; the machine templates of this GPU "
            f"hold at most {_BY_NAME[temps[-1]].gpus}; pass --topology FILE|name"
        )
    return GpuChoice(fit, overrides)


# ---------------------------------------------------------------------------------------------- templates
def template_data(name: str) -> tuple[str, dict]:
    """``(host template name, its mapping)`` of the shipped file ``name`` (plain data, a fresh copy).

    >>> key, data = template_data("gb200-nvl72")
    >>> key, data["gpus"]["count"], data["nvswitch"]["domain_hosts"]
    ('gb200-tray', 4, 18)
    """
    from .files import read_text
    from .yaml_io import shipped

    path = shipped(name)
    doc = yaml.load(read_text(path, "topology file"), Loader=YAML_LOADER)
    temps = doc.get("templates") if isinstance(doc, dict) else None
    if not isinstance(temps, dict) or not temps:
        raise TopologyError(f"{path}: expected a file with one host template under 'templates'")
    key = name if name in temps else next(iter(temps))
    return key, copy.deepcopy(temps[key])


def _per_item(v: Any, n: int) -> Any:
    return v[:n] if isinstance(v, list) else v


def _trim(t: dict, gpus: int, template: str) -> None:
    """Keep GPUs 0..gpus-1 of template mapping ``t`` (in place)."""
    g = t["gpus"]
    have = int(g["count"])
    if gpus > have:
        raise TopologyError(
            f"--gpus-per-host {gpus}: the machine template {template} has {have} GPUs per host; "
            f"expected at most {have}, or pass --topology FILE|name"
        )
    if gpus == have:
        return
    g["count"] = gpus
    for k in ("pci", "numa"):
        if k in g:
            g[k] = _per_item(g[k], gpus)
    for sw in (t.get("pcie") or {}).get("switches", []):
        if "gpus" in sw:
            sw["gpus"] = [i for i in sw["gpus"] if i < gpus]


def _gpu_numa(t: dict, i: int) -> int | None:
    numa = t["gpus"].get("numa")
    if isinstance(numa, list):
        return numa[i]
    return numa


def _set_nics(t: dict, nic: Nic) -> None:
    """Replace the template's NICs by ``nic``: NIC k beside GPU k*G//count (in place)."""
    fab = FABRICS[nic.fabric]
    nics: dict[str, Any] = {"count": nic.count, "bw": nic.bw, "link_layer": fab.link_layer}
    if fab.lat is not None:
        nics["lat"] = fab.lat
    t["nics"] = nics
    _place_nics(t, aligned=True)


def _place_nics(t: dict, *, aligned: bool) -> None:
    """Put the template's NICs (``t["nics"]``, in place) beside their GPUs, NIC k beside GPU k*G//count:
    on that GPU's PCIe switch when ``aligned`` and every such GPU has one, else on the CPU of its NUMA
    node (a NIC on no GPU's switch: beyond PXB of every GPU)."""
    nics = t["nics"]
    ngpu = int(t["gpus"]["count"])
    switches = (t.get("pcie") or {}).get("switches", [])
    for sw in switches:
        sw.pop("nics", None)
    nics.pop("numa", None)
    gpu_switch = {i: s for s, sw in enumerate(switches) for i in sw.get("gpus", [])}
    near = [k * ngpu // int(nics["count"]) for k in range(int(nics["count"]))]
    if aligned and all(g in gpu_switch for g in near):
        for k, g in enumerate(near):
            switches[gpu_switch[g]].setdefault("nics", []).append(k)
        return
    cpus = [c["numa"] for c in t.get("cpus", []) if isinstance(c, dict) and "numa" in c]

    def numa(g: int) -> int:
        n = _gpu_numa(t, g)
        if n is None and g in gpu_switch:
            n = switches[gpu_switch[g]].get("cpu")
        return cpus[0] if n is None else n

    nics["numa"] = [numa(g) for g in near]
    t.setdefault("pcie", {"bw": 48.0})  # PCIe Gen5 x16 (topo.h) for a template that lists no PCIe


# ---------------------------------------------------------------------------------------------- machines
@dataclass(frozen=True)
class MachineFacts:
    """What a file says about the machine it ran on. ``source``: where (``"run.log:12"``); ``hosts``:
    ``((host, GPUs), ...)`` from a complete device list (else empty); ``gpu_names``: as printed;
    ``nranks``: the GPUs the run used, when known."""

    source: str = ""
    hosts: tuple[tuple[str, int], ...] = ()
    gpu_names: tuple[str, ...] = ()
    nranks: int | None = None


@dataclass(frozen=True)
class MachineFlags:
    """The machine as the command line names it: a topology (file or shipped name) or the counts,
    GPU and NICs (None: not given)."""

    topology: str | None = None
    hosts: int | None = None
    gpus_per_host: int | None = None
    gpu: str | None = None
    nic: Nic | None = None
    gpu_nic: str | None = None

    def counts_given(self) -> bool:
        return any(v is not None for v in (self.hosts, self.gpus_per_host, self.gpu, self.nic, self.gpu_nic))


@dataclass(frozen=True)
class Machine:
    """A resolved machine: ``hosts`` hosts of the shipped ``template`` with ``gpus_per_host`` GPUs each and
    ``nic`` NICs (None: the template's own). ``gpu``: the name it was resolved from; ``overrides``: GPU
    attributes of that name's variant; ``notes``: what was read from where and what was assumed;
    ``gpu_nic``: ``"unaligned"`` puts the NICs on no GPU's PCIe switch (:data:`GPU_NIC`)."""

    template: str
    hosts: int
    gpus_per_host: int
    nic: Nic | None
    gpu: str
    overrides: tuple[tuple[str, Any], ...] = ()
    notes: tuple[str, ...] = field(default=())
    gpu_nic: str = "aligned"

    @property
    def nranks(self) -> int:
        return self.hosts * self.gpus_per_host

    def describe(self) -> str:
        """``"2 x h100-sxm (8 GPUs each), NICs 8x400G-ib"``."""
        nic = str(self.nic) if self.nic else "the template's"
        gpus = f"{self.gpus_per_host} GPU{'s' if self.gpus_per_host != 1 else ''}"
        off = ", GPUs off their NICs' PCIe switches" if self.gpu_nic == "unaligned" else ""
        return f"{self.hosts} x {self.template} ({gpus} each), NICs {nic}{off}"

    def document(self) -> dict:
        """The compact YAML form of the machine, as plain data."""
        key, t = template_data(self.template)
        _trim(t, self.gpus_per_host, self.template)
        if self.overrides:
            t["gpus"].update(dict(self.overrides))
        if self.nic is not None:
            _set_nics(t, self.nic)
        if self.gpu_nic == "unaligned" and (t.get("nics") or {}).get("count"):
            _place_nics(t, aligned=False)
        if self.hosts > 1 and not (t.get("nics") or {}).get("count"):
            raise TopologyError(
                f"{self.hosts} hosts of {self.template}: the template lists no NICs; pass --nic {_NIC_FORM}"
            )
        ll = (t.get("nics") or {}).get("link_layer")
        fabric = self.nic.fabric if self.nic else next((f for f, fab in FABRICS.items() if fab.link_layer == ll), None)
        meta = {
            "template": self.template,
            "hosts": self.hosts,
            "gpus_per_host": self.gpus_per_host,
            "gpu": self.gpu,
            "nic": str(self.nic) if self.nic else "template",
            "fabric": fabric,
            "gpu_nic": self.gpu_nic,
        }
        doc: dict[str, Any] = {
            "name": self.template if self.hosts == 1 else f"{self.template}-x{self.hosts}",
            "meta": {"machine": meta},
            "templates": {key: t},
            "hosts": [{"template": key, "count": self.hosts}],
        }
        if self.hosts > 1:
            doc["network"] = {"type": "rail_optimized"}
        return doc

    def topology(self) -> Topology:
        """The :class:`~treecoll.topo.model.Topology`, through the compact YAML reader."""
        from .yaml_io import loads

        text = yaml.safe_dump(self.document(), sort_keys=False, default_flow_style=None)
        return loads(text, source=f"<machine {self.describe()}>")


def _uniform(hosts: tuple[tuple[str, int], ...], where: str) -> int | None:
    counts = sorted({n for _, n in hosts})
    if not counts:
        return None
    if len(counts) > 1:
        raise TopologyError(
            f"the hosts have different GPU counts {counts}: expected the same on every host; pass "
            f"--gpus-per-host G, or --topology FILE|name",
            where=where or None,
        )
    return counts[0]


def resolve_machine(flags: MachineFlags, facts: MachineFacts | None = None) -> Machine:
    """The machine ``flags`` and ``facts`` describe, flags first; a one-line :class:`TopologyError`
    naming what to pass when neither says enough.

    >>> f = MachineFacts("run.log:5", hosts=(("a", 4), ("b", 4)), gpu_names=("NVIDIA GH200 120GB",), nranks=8)
    >>> m = resolve_machine(MachineFlags(nic=parse_nic("4x200G-slingshot")), f)
    >>> m.describe()
    '2 x gh200-x4 (4 GPUs each), NICs 4x200G-slingshot'
    >>> resolve_machine(MachineFlags(), MachineFacts("run.log:5"))
    Traceback (most recent call last):
    ...
    treecoll.topo.errors.TopologyError: run.log:5: the file does not say the machine (no complete device list): ...
    """
    if flags.topology is not None:
        raise TopologyError("--topology names the whole machine: resolve it with machine_topology()")
    facts = facts or MachineFacts()
    where = facts.source or None
    notes: list[str] = []
    if len(set(facts.gpu_names)) > 1 and flags.gpu is None:
        raise TopologyError(
            f"the device lines name several GPUs {list(facts.gpu_names)}: expected one model; pass "
            f"--gpu MODEL, or --topology FILE|name",
            where=where,
        )
    gpu = flags.gpu or (facts.gpu_names[0] if facts.gpu_names else None)
    hosts = flags.hosts or (len(facts.hosts) if facts.hosts else None)
    per = flags.gpus_per_host or _uniform(facts.hosts, facts.source)
    n = facts.nranks
    if hosts is None and per and n and n % per == 0:
        hosts = n // per
        notes.append(f"hosts: {hosts} = {n} ranks / {per} GPUs per host")
    if per is None and hosts and n and n % hosts == 0:
        per = n // hosts
        notes.append(f"GPUs per host: {per} = {n} ranks / {hosts} hosts")
    if gpu is None:
        missing = [x for x, v in (("--hosts N", hosts), ("[--gpus-per-host G]", per)) if v is None]
        if not facts.gpu_names and not facts.hosts and flags == MachineFlags():
            raise TopologyError(
                "the file does not say the machine (no complete device list): pass --hosts N "
                "--gpus-per-host G --gpu MODEL [--nic COUNTxSPEEDG-FABRIC], or --topology "
                "FILE|name",
                where=where,
            )
        raise TopologyError(
            f"the GPU model is not known: pass --gpu MODEL{''.join(' ' + m for m in missing)}, or --topology FILE|name",
            where=where,
        )
    choice = resolve_gpu(gpu, per, what="--gpu" if flags.gpu else "GPU")
    if choice.note:
        notes.append(choice.note)
    if per is None:
        per = _BY_NAME[choice.template].gpus
        notes.append(f"GPUs per host: {per}, a whole {choice.template} host (pass --gpus-per-host to use fewer)")
        if hosts is None and n and n % per == 0:
            hosts = n // per
            notes.append(f"hosts: {hosts} = {n} ranks / {per} GPUs per host")
    if hosts is None:
        raise TopologyError(
            f"the number of hosts is not known ({per} GPUs per host of {choice.template}): pass "
            f"--hosts N, or --topology FILE|name",
            where=where,
        )
    if not 1 <= hosts <= MAX_HOSTS:
        raise TopologyError(f"--hosts {hosts}: expected 1 to {MAX_HOSTS:,} hosts", where=where)
    if flags.nic is None:
        notes.append("NICs: the template's own (pass --nic to change)")
    if n is not None and n != hosts * per:
        notes.append(f"the table ran on {n} ranks; the machine has {hosts} x {per} = {hosts * per} GPUs")
    return Machine(
        choice.template, hosts, per, flags.nic, gpu, choice.overrides, tuple(notes), flags.gpu_nic or "aligned"
    )


def machine_topology(flags: MachineFlags, facts: MachineFacts | None = None) -> tuple[Topology, Machine | None]:
    """``(Topology, Machine or None)``: ``--topology`` as :func:`treecoll.topo.yaml_io.resolve` reads it, or the
    machine of :func:`resolve_machine` built (None for a topology given whole)."""
    if flags.topology is not None:
        if flags.counts_given():
            raise TopologyError(
                "--topology names the whole machine: expected it alone, got it with --hosts, "
                "--gpus-per-host, --gpu, --nic or --gpu-nic; pass one or the other"
            )
        from .yaml_io import resolve

        return resolve(flags.topology), None
    m = resolve_machine(flags, facts)
    return m.topology(), m
