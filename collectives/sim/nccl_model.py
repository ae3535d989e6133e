"""What NCCL would predict: its tuning model for ring, tree and NVLS allreduce.

Reproduces ``ncclTopoTuneModel`` / ``ncclTopoGetAlgoTime`` of NCCL 2.30
(src/graph/tuning.cc, https://github.com/NVIDIA/nccl):
base latencies per algorithm and protocol, per-hop hardware latencies (NVLink,
PCI, NET), the per-protocol bandwidth factors and caps, the busBw -> algBw
conversion, the tree correction factors and NCCL's choice of protocol (the
least predicted time).

Inputs NCCL gets from its topology search are derived from the
:class:`~topo.Topology` (documented approximations):

* ``nNodes`` = hosts among the ranks, ``nRanks``, ``ppn = nRanks / nNodes``;
* GPU generation from the GPUs' ``sm`` (70 Volta, 80 Ampere, 90 Hopper, 100
  Blackwell; default Hopper); intra-node link type NVLINK when the ranks of a
  host talk over NVLink (path class NVL/NVB), else PCI;
* the search's total ring bandwidth ``nChannels * bw``: the bottleneck
  ``Path.bw`` between consecutive ranks of a host (intra), and for several
  nodes the smaller of that and the host's summed NIC bandwidth (NCCL's graph
  speed covers the whole ring, so the network caps it);
* ``nChannels``: given, else that total over one link's bandwidth (NVLink:
  the bandwidth of one link of the GPU-to-switch bond; PCI: 2 channels),
  clamped to 1..32;
* ``latencyInter`` = the largest ``lat`` of the hosts' NICs (what the net
  plugin reports as ``ncclNetProperties.latency``; NCCL copies the graph's
  NIC's value, search.cc, and adds it to every inter-node step, twice with
  Simple, tuning.cc); net overhead 1.0 µs (Intel x86; ×3 for Simple), a floor
  on the ring's intra-node hop latency across nodes.

>>> from treecoll import topo
>>> from treecoll.collectives.cost import uniform_topology
>>> r = nccl_predict(uniform_topology(8), None, 8, algo="ring")
>>> r["proto"], round(r["lat_us"], 1)
('LL', 15.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from treecoll.topo import Topology
from treecoll.topo.errors import TreeError
from treecoll.topo.paths import NCCL_CLASSES
from treecoll.topo.ranks import RanksArg

from ..cost import placed_gpus
from ..in_network import min_sm, nvls_domains
from ..placement import Placement, as_placement

__all__ = [
    "nccl_predict",
    "nccl_best",
    "run_channels",
    "ring_run",
    "tree_chunk",
    "tree_slice_bytes",
    "PROTO_CHUNK_BYTES",
    "p2p_setup",
    "p2p_channels",
    "p2p_protocol",
    "p2p_channel_bw",
    "ring_search_channels",
    "collnet_available",
    "COLLECTIVES",
    "COLLECTIVE_ALGOS",
    "ll128_enabled",
    "fabric_env",
    "nccl_protocols",
    "FABRIC_ENV",
    "FabricEnv",
    "DEFAULT_BUFFSIZE",
    "nvls_domains",
    "nvls_run",
    "nvls_chunk",
    "nvls_fill",
    "nccl_algos",
    "generation",
    "PROTOS",
    "BASE_LAT",
    "HW_LAT",
    "LL_MAX_BW",
    "PER_CH_MAX_RING_LL128_BW",
    "PER_CH_MAX_TREE_LL128_BW",
    "PER_CH_MAX_TREE_BW",
    "TREE_CORRECTION",
]

PROTOS = ("LL", "LL128", "Simple")
# NCCL 2.30 src/graph/tuning.cc ncclTunerConstantsDefaults (µs), protocol order (LL, LL128, Simple)
BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
HW_LAT = {
    "NVLINK": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "PCI": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7)},
    "NET": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
#: GB/s; rows Volta/Intel, Ampere/AMD, Hopper, Blackwell; columns nNodes 1, 2, >=3 (tuning.cc llMaxBws)
LL_MAX_BW = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
#: per-channel caps, GB/s, rows Volta, Ampere, Hopper, Blackwell; columns nNodes 1, 2, >=3
PER_CH_MAX_RING_LL128_BW = ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3)
PER_CH_MAX_TREE_LL128_BW = ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_MAX_TREE_BW = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
#: tuning.cc treeCorrectionFactor[proto][log2(nBytes/64)]
TREE_CORRECTION = {
    "LL": (1, 1, 1, 1, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1, 1, 1),
    "Simple": (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
        0.9,
    ),
}
#: NVLS (NVLink SHARP) constants, tuning.cc: nvlsEfficiency (Hopper, Blackwell), hwLatencies NVLINK and NET of
#: NVLS/NVLSTree with Simple (µs; baseLatencies of both are 0), perChMaxNVLSTreeBws (GB/s, nNodes 1, 2, >=3)
NVLS_EFFICIENCY = {2: 0.85, 3: 0.74}
NVLS_LAT = 25.0
NVLS_TREE_NET_LAT = 20.9
PER_CH_MAX_NVLS_TREE_BW = {2: (0.0, 57.7, 45.5), 3: (0.0, 96.0, 80.0)}
#: NCCL_MAX_NVLS_ARITY (device.h): NVLS heads (channels) per NVLink domain
MAX_NVLS_ARITY = 32
#: the NVLS search's per-channel speeds, GB/s (search.cc sm90/sm100 SpeedArrayIntra and SpeedArrayInter)
NVLS_SPEEDS_INTRA = {
    2: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    3: (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
NVLS_SPEEDS_INTER = {
    2: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2),
    3: (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2),
}
#: NVLS run parameters of NCCL 2.30 src/transport/nvls.cc ncclNvlsTuning: channels (CTAs) NVLS and
#: NVLSTree run on (NVLS_NCHANNELS_SM90 16; SM100 32 across nodes, NVLS_NCHANNELS_SM100_NVL 24 on one),
#: NCCL_NVLS_CHUNKSIZE 128 KiB, and NVLSTree's largest chunk (NCCL_NVLSTREE_MAX_CHUNKSIZE: 64 KiB from
#: 4 nodes on, else the chunk size; ncclNvlsTreeSm100Tuning adjusts all three on Blackwell)
NVLS_RUN_CHANNELS = {2: (16, 16), 3: (24, 32)}  # generation -> (one node, several nodes)
NVLS_CHUNK = 128 << 10
#: resources an NVLS loop passes one after the other, each a pipeline stage: the NVLink up to the
#: switches (multimem reduce) and back down (multicast); NVLSTree puts the inter-node tree between
NVLS_STAGES = {"nvls": 2, "nvls_tree": 3}
#: bytes of one chunk per channel by protocol: one buffer step (src/enqueue.cc calcCollChunking,
#: ``stepSize = buffSize / NCCL_STEPS``, NCCL_STEPS 8; src/init.cc DEFAULT_BUFFSIZE 4 MiB for Simple,
#: DEFAULT_LL_BUFFSIZE 512 KiB of which LL carries half, DEFAULT_LL128_BUFFSIZE 120 x 640 x 8 x 8 B of
#: which LL128 carries 15/16; src/include/device.h); trees and NCCL's ring broadcast / reduce move one
#: step per chunk (chunkSteps 1)
#: buffer steps per connection (src/include/device.h NCCL_STEPS) and NCCL_BUFFSIZE's default, bytes
#: (src/init.cc DEFAULT_BUFFSIZE): the Simple protocol's buffer, one step of which is its chunk
NCCL_STEPS = 8
DEFAULT_BUFFSIZE = 4 << 20
PROTO_CHUNK_BYTES = {"LL": 32 << 10, "LL128": 120 * 640 * 8 * 15 // 16, "Simple": DEFAULT_BUFFSIZE // NCCL_STEPS}


@dataclass(frozen=True)
class FabricEnv:
    """The NCCL environment a fabric's vendor sets for every job: the protocols (NCCL_PROTO) and the
    algorithms (NCCL_ALGO) NCCL may choose from, and NCCL_BUFFSIZE (bytes; the Simple protocol's
    buffer, whose step is its chunk)."""

    protos: tuple[str, ...]
    algos: tuple[str, ...]
    buffsize: int = DEFAULT_BUFFSIZE


#: :class:`FabricEnv` by the NICs' ``link_layer`` (fabrics not listed: NCCL's defaults), applied across
#: hosts (:func:`fabric_env`). Google Cloud's GPUDirect-TCPX (A3 High): NCCL_ALGO=Ring (Ring,Tree for
#: allreduce), NCCL_PROTO=Simple, NCCL_BUFFSIZE=4194304 in the plugin's run scripts
#: (github.com/google/nccl-plugin-gpudirecttcpx scripts/run-nccl.sh; tcpxo_scripts/run-nccl.sh and
#: run-allreduce.sh of github.com/google/nccl-plugin-gpudirect-tcpxo v1.0.17). GPUDirect-TCPXO (A3 Mega):
#: NCCL_ALGO=Ring,Tree, NCCL_PROTO=Simple, NCCL_NVLS_ENABLE=0, NCCL_BUFFSIZE=8388608
#: (tcpxo_scripts/nccl-env-profile-simple.sh and run-nccl-tcpxo.sh of the same repository; 8 MiB in every
#: profile there); LL128 only on opting in to nccl-env-profile-ll128.sh (NCCL_PROTO=Simple,LL128;
#: GoogleCloudPlatform/container-engine-accelerators gpudirect-tcpxo/best-practice.md, "Enable LL128 for
#: latency reduction", plugin releases from Feb 2025 on); LL in none of them.
FABRIC_ENV: dict[str, FabricEnv] = {
    "TCPX": FabricEnv(("Simple",), ("ring", "tree")),
    "TCPXO": FabricEnv(("Simple",), ("ring", "tree"), 8 << 20),
}
#: µs, NCCL_NET_OVERHEAD default on Intel x86 (×3 for Simple)
NET_OVERHEAD = 1.0
MAX_CHANNELS = 32


def _check_nvidia(topology: Topology, gpus: Sequence[str]) -> None:
    """Raise :class:`TreeError` when a rank is a CPU process slot: NCCL runs on NVIDIA GPUs
    only, and its tuning constants (link latencies, bandwidths) say nothing about CPUs."""
    from treecoll.topo.discover import CPU_SLOT_MODEL

    for x in gpus:
        if topology.graph.nodes[x].get("model") == CPU_SLOT_MODEL:
            raise TreeError(
                f"nccl model: rank slot {x!r} is a CPU process (model {CPU_SLOT_MODEL!r}); NCCL and its "
                f"tuning model apply to NVIDIA GPUs only"
            )


def generation(topology: Topology, gpus: Sequence[str]) -> int:
    """NCCL's GPU generation index of the oldest GPU: 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell (no ``sm``: Hopper)."""
    sm = min_sm(topology, gpus)
    return 0 if sm < 80 else 1 if sm < 90 else 2 if sm < 100 else 3


def _log2i(x: float) -> int:
    return int(math.floor(math.log2(x))) if x >= 1 else 0


def _by_host(topology: Topology, gpus: Sequence[str]) -> dict[str, list[str]]:
    hosts: dict[str, list[str]] = {}
    node = topology.graph._node  # networkx's node dict (Topology.host_of per GPU costs more than the work)
    for x in gpus:
        hosts.setdefault(node[x].get("host"), []).append(x)
    return hosts


def _host_kinds(topology: Topology, hosts: dict[str, list[str]]) -> dict[str, list[str]]:
    """One host and its ranks' GPUs per kind: hosts built alike (``topology.routes.host_class``)
    whose ranks sit at the same local GPUs have the same routes inside them and the same NICs
    (renamed), so what :func:`_inputs` and :func:`ll128_enabled` ask of a host is asked once per kind.

    >>> from treecoll import topo
    >>> t = topo.resolve("dgx-h100-x16")
    >>> list(_host_kinds(t, _by_host(t, t.rank_gpus())))
    ['h0']
    """
    kinds: dict[tuple, tuple[str, list[str]]] = {}
    for h, members in hosts.items():
        cls, prefix = topology.routes.host_class(h), f"{h}/"
        if cls is None or not all(m.startswith(prefix) for m in members):
            key: tuple = (h, tuple(members))
        else:  # a host that stands alone is its own class
            key = (cls, tuple(m[len(prefix) :] for m in members))
        kinds.setdefault(key, (h, members))
    return dict(kinds.values())


def _inputs(topology: Topology, gpus: Sequence[str], nchannels: int | None):
    hosts = _by_host(topology, gpus)
    n_nodes = len(hosts)
    kinds = _host_kinds(topology, hosts)
    g = topology.graph
    gen = generation(topology, gpus)
    intra_bw, nvlink, link_bw = math.inf, True, math.inf
    for members in kinds.values():
        for a, b in zip(members, members[1:] + members[:1]):
            if a == b:
                continue
            p = topology.path(a, b)
            intra_bw = min(intra_bw, p.bw)
            if p.nccl not in ("NVL", "NVB"):
                nvlink = False
            else:
                e = g.edges[p.nodes[0], p.nodes[1]]
                link_bw = min(link_bw, e["bw"] / e.get("count", 1))
    total = intra_bw
    if n_nodes > 1:
        nic_bw = min(sum(float(topology.node(n).get("bw") or 0.0) for n in topology.nics(h)) for h in kinds)
        if nic_bw <= 0:
            raise TreeError("nccl model: several hosts but a host has no NIC bandwidth")
        total = min(total, nic_bw)
    if not math.isfinite(total):  # one rank per host
        total = min(sum(float(topology.node(n).get("bw") or 0.0) for n in topology.nics(h)) for h in kinds) or 12.0
    if nchannels is None:
        if nvlink and math.isfinite(link_bw):
            nchannels = int(round(total / link_bw))
        else:
            nchannels = 2
    nchannels = max(1, min(MAX_CHANNELS, int(nchannels)))
    lat_inter = (
        max((float(topology.node(n).get("lat") or 0.0) for h in kinds for n in topology.nics(h)), default=0.0)
        if n_nodes > 1
        else 0.0
    )
    return n_nodes, gen, "NVLINK" if nvlink else "PCI", total, nchannels, lat_inter


def ll128_enabled(topology: Topology, gpus: Sequence[str]) -> bool:
    """Whether NCCL enables its LL128 protocol by default for these GPUs (NCCL 2.30 tuning.cc):
    the GPUs of each host talk over NVLink (path NVL or NVB); across hosts every GPU reaches its
    nearest NIC through PCIe switches only (PIX, PXB; Hopper and later also C2C, P2C and PXN);
    all GPUs have one compute capability (or all are Hopper or later) and none is older than
    Volta. GPUs without ``sm`` count as Hopper. PCIe-only hosts (GeForce, V100 PCIe) get LL and
    Simple only."""
    sms = {int(topology.graph.nodes[g].get("sm") or 90) for g in gpus}
    if min(sms) < 70 or (len(sms) > 1 and min(sms) < 90):
        return False
    by_host = _by_host(topology, gpus)
    kinds = _host_kinds(topology, by_host)
    for members in kinds.values():
        for a, b in zip(members, members[1:]):
            if topology.path(a, b).nccl not in ("LOC", "NVL", "NVB"):
                return False
    if len(by_host) > 1:
        limit = NCCL_CLASSES.index("PXN" if min(sms) >= 90 else "PXB")
        for g in (x for members in kinds.values() for x in members):
            nic = topology.nearest_nic(g)
            if nic is None or NCCL_CLASSES.index(topology.path(g, nic).nccl) > limit:
                return False
    return True


def fabric_env(topology: Topology, gpus: Sequence[str]) -> FabricEnv | None:
    """The vendor's NCCL environment of the NICs these GPUs use across hosts (:data:`FABRIC_ENV`, by the
    NICs' ``link_layer``; several such fabrics: what all allow, the smallest buffer); None on one host
    or where no fabric's vendor sets NCCL's environment.

    >>> from treecoll.topo.machines import MachineFlags, Nic, machine_topology
    >>> t, _ = machine_topology(MachineFlags(hosts=2, gpu="H100", nic=Nic(8, 200.0, "tcpxo")))
    >>> fabric_env(t, t.rank_gpus()), fabric_env(t, t.rank_gpus()[:8])
    (FabricEnv(protos=('Simple',), algos=('ring', 'tree'), buffsize=8388608), None)
    """
    hosts = _by_host(topology, gpus)
    if len(hosts) < 2:
        return None
    layers = {
        str(topology.node(n).get("link_layer") or "") for h in _host_kinds(topology, hosts) for n in topology.nics(h)
    }
    envs = [FABRIC_ENV[x] for x in sorted(layers) if x in FABRIC_ENV]
    if not envs:
        return None
    return FabricEnv(
        tuple(p for p in PROTOS if all(p in e.protos for e in envs)),
        tuple(a for a in envs[0].algos if all(a in e.algos for e in envs)),
        min(e.buffsize for e in envs),
    )


def nccl_protocols(topology: Topology, gpus: Sequence[str]) -> tuple[str, ...]:
    """The protocols NCCL runs by default on these GPUs: :data:`PROTOS`, LL128 only where
    :func:`ll128_enabled`, and only those the fabric's vendor environment allows (:func:`fabric_env`).

    >>> from treecoll import topo
    >>> nccl_protocols(topo.resolve("dgx-h100-x2"), topo.resolve("dgx-h100-x2").rank_gpus())
    ('LL', 'LL128', 'Simple')
    """
    env = fabric_env(topology, gpus)
    return tuple(
        p for p in PROTOS if (p != "LL128" or ll128_enabled(topology, gpus)) and (env is None or p in env.protos)
    )


def nccl_algos(
    topology: Topology, gpus: Sequence[str], proto: str | None = None, collective: str = "allreduce"
) -> tuple[str, ...]:
    """The algorithms NCCL offers for ``collective`` on these GPUs (:data:`COLLECTIVE_ALGOS`):
    allreduce ``ring``, ``tree`` and ``nvls`` (NVLS on one NVLink domain, NVLSTree across several)
    where :func:`nvls_domains` allows it and ``proto`` (a protocol NCCL is restricted to, e.g. by
    NCCL_PROTO) is None or Simple: NVLS runs Simple only; allgather and reduce_scatter ``ring``,
    ``pat`` with one GPU per node on several nodes (tuning.cc ncclPatEnable) and ``nvls`` on one
    NVLink domain; broadcast and reduce ``ring``; alltoall and sendrecv ``p2p``. Allreduce also
    ``collnet`` where :func:`collnet_available` (the network's switches reduce: SHARP). Across hosts
    only those the fabric's vendor environment allows (:func:`fabric_env`, e.g. no NVLS over
    GPUDirect-TCPXO)."""
    if collective not in COLLECTIVES:
        raise TreeError(f"nccl model: collective expected one of {list(COLLECTIVES)}, got {collective!r}")
    if collective in ("broadcast", "reduce"):
        return ("ring",)
    if collective in ("alltoall", "sendrecv"):
        return ("p2p",)
    out = _offered_algos(topology, gpus, proto, collective)
    env = fabric_env(topology, gpus)
    return out if env is None else tuple(a for a in out if a in env.algos) or ("ring",)


def _offered_algos(topology: Topology, gpus: Sequence[str], proto: str | None, collective: str) -> tuple[str, ...]:
    """:func:`nccl_algos` of a collective NCCL's tuner models, before the fabric's environment."""
    simple = proto in (None, "Simple")
    out = ("ring", "tree") if collective == "allreduce" else ("ring",)
    if collective != "allreduce" and simple and len(gpus) > 1 and len(_by_host(topology, gpus)) == len(gpus):
        out += ("pat",)
    if not simple:
        return out
    if collective == "allreduce" and collnet_available(topology, gpus):
        out += ("collnet",)
    try:
        domains = nvls_domains(topology, gpus)
    except TreeError:
        return out
    if collective == "allreduce" or len(domains) == 1:
        out += ("nvls",)
    return out


def _quantize(x: float, speeds: Sequence[float]) -> float:
    """The largest of NCCL's search speeds that is <= ``x`` (the smallest one if none is)."""
    return next((s for s in speeds if s <= x + 1e-9), speeds[-1])


def _nvls_predict(topology: Topology, gpus: Sequence[str], nbytes: int) -> dict:
    """NCCL's NVLS / NVLSTree allreduce time (Simple protocol only), as tuning.cc computes it.

    The NVLS graph NCCL's search finds is derived (approximation): one channel
    per GPU of a domain (heads, at most 32); per channel ``bwIntra``, the largest
    search speed with ``(n + 1) × bwIntra`` within a GPU's NVLink bandwidth to
    its switches (each channel pulls ``bwIntra`` from every GPU and twice from
    its head, search.cc ``ncclTopoSearchTryNvls``); ``bwInter``, the largest
    speed within every GPU's path to its nearest NIC.
    """
    domains = nvls_domains(topology, gpus)
    g = topology.graph
    n, n_nodes, nranks = len(domains[0]), len(domains), len(gpus)
    gen = generation(topology, gpus)
    nch = min(MAX_NVLS_ARITY, n)
    kinds = [x for members in _host_kinds(topology, _by_host(topology, gpus)).values() for x in members]
    nvl = min(sum(float(d["bw"]) for v, d in g[x].items() if g.nodes[v].get("kind") == "nvswitch") for x in kinds)
    bw_intra = _quantize(nvl / (n + 1), NVLS_SPEEDS_INTRA[gen])
    intra = bw_intra * NVLS_EFFICIENCY[gen] * (nch - 1) / nch * 2.0
    bw = intra
    lat = NVLS_LAT
    if n_nodes > 1:
        nics = [topology.nearest_nic(x) for x in kinds]
        if None in nics:
            raise TreeError(
                f"nccl model: NVLSTree across NVLink domains but GPU {kinds[nics.index(None)]!r} has no NIC"
            )
        path_bw = min(
            min(topology.path(x, c).bw, float(topology.node(c).get("bw") or 0.0)) for x, c in zip(kinds, nics)
        )
        inter = _quantize(path_bw, NVLS_SPEEDS_INTER[gen]) * (2 if n_nodes <= 2 else 1)
        bw = min(intra, inter, PER_CH_MAX_NVLS_TREE_BW[gen][1 if n_nodes == 2 else 2])
        lat_inter = max(float(topology.node(c).get("lat") or 0.0) for c in nics)
        lat += 2 * _log2i(n_nodes) * (NVLS_TREE_NET_LAT + 2 * lat_inter)
    alg = nch * bw * nranks / (2 * (nranks - 1))
    if n_nodes > 1 and gen >= 3 and not _arm_hosts(topology):
        idx = _log2i(max(nbytes, 1) / 64)
        if 0 <= idx < 24:
            alg *= TREE_CORRECTION["Simple"][idx]
    t_us = lat + nbytes / (1000.0 * alg)
    algbw = nbytes / (t_us * 1e3)
    return {
        "algo": "nvls_tree" if n_nodes > 1 else "nvls",
        "proto": "Simple",
        "time": t_us * 1e-6,
        "time_us": t_us,
        "lat_us": lat,
        "model_algbw": alg,
        "algbw": algbw,
        "busbw": algbw * 2 * (nranks - 1) / nranks,
        "nchannels": nch,
        "nnodes": n_nodes,
        "nranks": nranks,
        "protocols": {"Simple": t_us},
    }


def nvls_run(topology: Topology, gpus: Sequence[str]) -> dict:
    """How NCCL runs NVLS / NVLSTree on these GPUs (NCCL 2.30 src/transport/nvls.cc ``ncclNvlsTuning``):
    ``{channels, chunk, tree_max_chunk, heads, nodes}``; ``heads``: the NVLS graph's channels, one per
    GPU of a domain up to :data:`MAX_NVLS_ARITY` (each heads one part of every loop, enqueue.cc
    ``nchunksPerLoop = nHeads``), ``nodes``: NVLink domains.

    >>> from treecoll import topo
    >>> nvls_run(topo.resolve("dgx-h100-x2"), topo.resolve("dgx-h100-x2").rank_gpus())
    {'channels': 16, 'chunk': 131072, 'tree_max_chunk': 131072, 'heads': 8, 'nodes': 2}
    """
    domains = nvls_domains(topology, gpus)
    gen, n_nodes, heads = generation(topology, gpus), len(domains), min(MAX_NVLS_ARITY, len(domains[0]))
    nch = NVLS_RUN_CHANNELS.get(gen, NVLS_RUN_CHANNELS[2])[1 if n_nodes > 1 else 0]
    chunk, tree_max = NVLS_CHUNK, 0
    if gen >= 3 and n_nodes > 1:  # ncclNvlsTreeSm100Tuning
        nics = [topology.nearest_nic(x) for x in gpus]
        nic_bw = min((float(topology.node(c).get("bw") or 0.0) for c in nics if c is not None), default=0.0)
        pxb = all(
            c is not None and NCCL_CLASSES.index(topology.path(x, c).nccl) <= NCCL_CLASSES.index("PXB")
            for x, c in zip(gpus, nics)
        )
        ppn = min(len(d) for d in domains)
        if n_nodes == 2 and nic_bw >= 48.0:
            nch, tree_max = 32, 128 << 10
            if ppn <= 4:
                chunk = tree_max = 256 << 10
            elif ppn >= 16 or (ppn <= 8 and pxb and nic_bw < 96.0):
                tree_max = 64 << 10
        elif nic_bw >= 96.0:
            if ppn <= 8:
                nch, chunk, tree_max = 24, 256 << 10, 256 << 10
            else:
                nch, tree_max = 32, (128 << 10) if ppn < 32 else (64 << 10)
        elif nic_bw >= 48.0:
            nch, tree_max = 24, (64 << 10) if pxb else (128 << 10)
    if tree_max == 0:
        tree_max = (64 << 10) if n_nodes >= 4 else chunk
    return {"channels": nch, "chunk": chunk, "tree_max_chunk": tree_max, "heads": heads, "nodes": n_nodes}


def nvls_chunk(nbytes: int, run: dict) -> int:
    """Bytes per chunk NCCL moves ``nbytes`` (a rank's buffer) in with NVLS (one domain) or NVLSTree
    (several), as src/enqueue.cc ``calcCollChunking`` (NCCL 2.30) shrinks the chunk for small messages:
    ``concurrentOps = channels × heads``; NVLS 64 / 32 / 16 KiB below 64 / 8 / 2 ``concurrentOps``
    chunks, NVLSTree 256 / 128 / 64 / 32 KiB below 32 / 16 / 4 / 1.

    >>> run = {"channels": 16, "chunk": 128 << 10, "tree_max_chunk": 128 << 10, "heads": 8, "nodes": 2}
    >>> [nvls_chunk(s << 20, run) >> 10 for s in (4, 16, 64, 1024)]
    [32, 64, 128, 128]
    """
    ops = run["channels"] * run["heads"]
    if run["nodes"] > 1:
        c = min(run["chunk"], run["tree_max_chunk"])
        for times, size in ((32, 256 << 10), (16, 128 << 10), (4, 64 << 10), (1, 32 << 10)):
            if nbytes < times * ops * c and c > size:
                c = size
        return c
    c = run["chunk"]
    for times, size in ((64, 64 << 10), (8, 32 << 10), (2, 16 << 10)):
        if nbytes < times * ops * c and c > size:
            c = size
    return c


def nvls_fill(nbytes: int, run: dict) -> float:
    """The pipeline fill of NCCL's NVLS kernels as a fraction of the time the bytes take to drain.

    Each channel moves its share in loops of ``heads`` chunks (:func:`nvls_chunk`; enqueue.cc:
    ``loopSize = nChannels × nHeads × chunkSize``); a loop passes :data:`NVLS_STAGES` resources
    one after another (NVLink to the switches, for NVLSTree the network, NVLink back), so ``L``
    loops take ``L + stages − 1`` loop times (one loop time: the drain / ``L``), and a message
    of at most one loop takes ``stages`` drains. Fraction: ``(stages − 1) × min(1, loopSize / nbytes)``.

    >>> run = {"channels": 16, "chunk": 128 << 10, "tree_max_chunk": 128 << 10, "heads": 8, "nodes": 2}
    >>> nvls_fill(64 << 20, run)          # 4 loops of 16 MiB through 3 stages: 2 loops of fill
    0.5
    >>> nvls_fill(1 << 20, run)           # less than one loop: the stages one after another
    2.0
    """
    if nbytes <= 0:
        return 0.0
    loop = run["channels"] * run["heads"] * nvls_chunk(nbytes, run)
    stages = NVLS_STAGES["nvls_tree" if run["nodes"] > 1 else "nvls"]
    return (stages - 1) * min(1.0, loop / nbytes)


def _arm_hosts(topology: Topology) -> bool:
    """Whether the CPUs are Arm (NVIDIA Grace): NCCL's x86-only NVLSTree correction then does not apply."""
    return any(
        "grace" in str(topology.node(c).get("model", "")).lower()
        or str(topology.node(c).get("arch", "")).lower() in ("arm", "arm64", "aarch64")
        for c in topology.nodes("cpu")
    )


#: the collectives nccl-tests measures (its binaries all_reduce_perf ... sendrecv_perf)
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv")
#: algorithms NCCL's tuner models per collective (tuning.cc ncclTopoTuneModel: broadcast and reduce
#: ring only; reduce_scatter and allgather ring, PAT, NVLS, CollNetDirect); alltoall and sendrecv are
#: NCCL point-to-point operations, which the tuner does not model ("p2p" here)
COLLECTIVE_ALGOS = {
    "allreduce": ("ring", "tree", "nvls", "collnet"),
    "allgather": ("ring", "pat", "nvls"),
    "reduce_scatter": ("ring", "pat", "nvls"),
    "broadcast": ("ring",),
    "reduce": ("ring",),
    "alltoall": ("p2p",),
    "sendrecv": ("p2p",),
}
#: CollNet (in-network reduction, SHARP; tuning.cc, Simple only): hwLatencies NVLINK/PCI (intra) and NET
#: (inter) of CollNetDirect and CollNetChain (µs; base latencies 0), the 0.4 µs arity serialization per
#: local GPU of CollNetDirect, its 0.85 bandwidth factor on Hopper and later; NCCL_MAX_DIRECT_ARITY + 1 = 8
#: local GPUs at most (src/include/device.h)
COLLNET_LAT = {"direct": (3.7, 31.0), "chain": (2.8, 30.0)}
COLLNET_ARITY_LAT, COLLNET_DIRECT_HOPPER, COLLNET_MAX_LOCAL = 0.4, 0.85, 8
#: PAT (NCCL 2.23+, tuning.cc): base latency 8 µs, bus bandwidth x 0.75, latency
#: log2(nNodes) x interLat / 3.5 + nRanks x 2.8 µs; Simple only, one GPU per node (ncclPatEnable)
PAT_BASE_LAT, PAT_BW_FACTOR, PAT_RANK_LAT = 8.0, 0.75, 2.8
#: how much work NCCL gives a thread before it opens another channel (src/include/comm.h
#: NCCL_{LL,LL128,SIMPLE}_THREAD_THRESHOLD; ring LL x nRanks, tuning.cc), and the threads per
#: channel (src/include/device.h NCCL_LL_MAX_NTHREADS 512, NCCL_LL128_MAX_NTHREADS 640,
#: NCCL_SIMPLE_MAX_NTHREADS 512; ring Simple 256 when the ring's graph bandwidth is within PCI_BW 12 GB/s)
THREAD_THRESHOLD = {"LL": 8, "LL128": 8, "Simple": 64}
MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}
PCI_BW = 12.0
#: NCCL's channels per ring-graph channel: connect.cc ncclTopoPostset duplicates every channel once
#: ("Duplication should be complete now"), up to MAXCHANNELS 64 (src/include/device.h)
CHANNEL_DUP, MAXCHANNELS = 2, 64


def run_channels(
    nbytes: int, algo: str, proto: str, graph_channels: int, nranks: int, graph_bw: float = math.inf
) -> tuple[int, int]:
    """``(channels NCCL runs a collective of nbytes on, channels it has)`` for ring and tree, as
    enqueue.cc ``topoGetAlgoInfo`` (NCCL 2.30) shrinks them: one channel fewer while
    ``nbytes < nc × nThreads × threadThreshold``. ``graph_channels`` × ``graph_bw``: the
    search's ring bandwidth (for ring Simple's thread count).

    >>> run_channels(1 << 20, "ring", "Simple", 16, 16)    # 32 channels x 512 threads x 64 B = 1 MiB
    (32, 32)
    >>> run_channels(64 << 10, "ring", "Simple", 16, 16)
    (2, 32)
    """
    have = max(1, min(MAXCHANNELS, CHANNEL_DUP * graph_channels))
    nt = MAX_THREADS[proto]
    if algo == "ring" and proto == "Simple" and graph_bw * graph_channels <= PCI_BW:
        nt = 256
    thr = THREAD_THRESHOLD[proto] * (nranks if algo == "ring" and proto == "LL" else 1)
    nc = have
    while nc >= 2 and nbytes < nc * nt * thr:
        nc -= 1
    return nc, have


def tree_chunk(
    nbytes: int, proto: str, channels: int, n_nodes: int, nranks: int, buffsize: int = DEFAULT_BUFFSIZE
) -> int:
    """Bytes per chunk of each of ``channels`` channels NCCL's tree moves ``nbytes`` in
    (src/enqueue.cc ``calcCollChunking``, NCCL 2.30): :data:`PROTO_CHUNK_BYTES` (Simple: a step of
    ``buffsize``, NCCL_BUFFSIZE / NCCL_STEPS); with LL128 halved
    while a channel's share is under ``64 × nsteps / ppn`` chunks (down to 128 KiB), then under
    ``16 × nsteps / ppn`` (down to 32 KiB), ``nsteps = 1 + log2(nNodes) + 0.1 ppn``.

    >>> tree_chunk(1 << 30, "Simple", 16, 2, 16), tree_chunk(1 << 30, "LL128", 16, 2, 16)
    (524288, 576000)
    >>> tree_chunk(16 << 20, "LL128", 16, 2, 16)     # 1 MiB a channel: under 64 x 2.8 / 8 chunks of 576000
    72000
    >>> tree_chunk(1 << 30, "Simple", 16, 2, 16, buffsize=8 << 20)          # NCCL_BUFFSIZE=8388608
    1048576
    """
    chunk = PROTO_CHUNK_BYTES[proto] if proto != "Simple" else buffsize // NCCL_STEPS
    if proto == "LL128":
        ppn = nranks / max(n_nodes, 1)
        steps = 1 + _log2i(n_nodes) + 0.1 * ppn
        per_channel = nbytes // max(channels, 1)
        while per_channel // chunk < steps * 64 / ppn and chunk > 131072:
            chunk //= 2
        while per_channel // chunk < steps * 16 / ppn and chunk > 32768:
            chunk //= 2
    return chunk


def tree_slice_bytes(topology: Topology, gpus: Sequence[str], nbytes: int, proto: str) -> int:
    """Bytes NCCL's tree moves per pipeline step summed over the channels it runs ``nbytes`` on:
    :func:`run_channels` (tree) times :func:`tree_chunk` (of the fabric's NCCL_BUFFSIZE, :func:`fabric_env`).
    Each channel pipelines its own share down its tree in chunks, so a tree carrying all channels moves
    ``channels × chunk`` per step.

    >>> from treecoll import topo
    >>> t = topo.resolve("dgx-h100-x2")
    >>> [tree_slice_bytes(t, t.rank_gpus(), s, "Simple") >> 10 for s in (1 << 20, 1 << 30)]  # 32, 36 channels
    [16384, 18432]
    """
    n_nodes, _, _, total, nch, _ = _inputs(topology, gpus, None)
    nc, _ = run_channels(nbytes, "tree", proto, nch, len(gpus), total / nch)
    env = fabric_env(topology, gpus)
    buffsize = DEFAULT_BUFFSIZE if env is None else env.buffsize
    return nc * tree_chunk(nbytes, proto, nc, n_nodes, len(gpus), buffsize)


def ring_run(topology: Topology, gpus: Sequence[str], nbytes: int, proto: str) -> tuple[float, int]:
    """``(GB/s, channels)``: the bandwidth a rank's ring sends at when NCCL runs ``nbytes`` on
    :func:`run_channels` of its channels, and how many that is: the search's ring bandwidth
    (``nChannels × bw``, as :func:`nccl_predict` derives it) times the share of channels running (each
    channel is one thread block moving its share).

    >>> from treecoll import topo
    >>> t = topo.resolve("dgx-h100")
    >>> [(round(bw, 1), nc) for bw, nc in (ring_run(t, t.rank_gpus(), s, "Simple") for s in (1 << 30, 1 << 16))]
    [(370.8, 36), (20.6, 2)]
    """
    n_nodes, _, _, total, nch, _ = _inputs(topology, gpus, None)
    nc, have = run_channels(nbytes, "ring", proto, nch, len(gpus), total / nch)
    return total * nc / have, nc


#: NCCL 2.30 src/graph/search.cc: the ring search's per-channel speeds (GB/s) on one host, by generation
#: (speedArrayIntra, sm90SpeedArrayIntra, sm100SpeedArrayIntra), and the channels it searches at most
#: (src/init.cc ``ringGraph->maxChannels = MAXCHANNELS / 2``)
RING_SPEEDS_INTRA = {
    0: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    1: (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    2: NVLS_SPEEDS_INTRA[2],
    3: NVLS_SPEEDS_INTRA[3],
}
RING_SEARCH_MAX_CHANNELS = MAXCHANNELS // 2
#: GB/s of one NVLink as NCCL counts it, by generation (src/graph/topo.h SM70/SM80/SM90/SM100_NVLINK_BW)
NVLINK_BW = (20.0, 20.0, 20.6, 40.1)
#: NCCL 2.30 point-to-point constants: a channel's step (p2pChunkSize, src/init.cc NCCL_P2P_NET_CHUNKSIZE /
#: NCCL_P2P_NVL_CHUNKSIZE / NCCL_P2P_PCI_CHUNKSIZE: 128 KiB across hosts, doubled on Arm hosts of
#: Blackwell GPUs; 512 KiB when every GPU talks over NVLink; 128 KiB over PCIe), the bytes per channel up
#: to which an operation runs LL (src/enqueue.cc NCCL_P2P_LL_THRESHOLD), the GB/s one channel carries to
#: a peer over the network (src/graph/paths.cc NCCL_P2P_PER_CHANNEL_NET_BW, from which NCCL sizes a
#: network peer's channels) and the operations one channel runs at once (src/include/device.h
#: NCCL_MAX_DEV_WORK_P2P_PER_BATCH)
P2P_CHUNK_BYTES = {"net": 128 << 10, "nvlink": 512 << 10, "pci": 128 << 10}
P2P_LL_THRESHOLD = 16384
P2P_PER_CHANNEL_NET_BW = 14.0
P2P_PER_BATCH = 8


def _pow2_up(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


def ring_search_channels(total_bw: float, gen: int) -> tuple[int, float]:
    """``(channels, GB/s per channel)`` of the ring graph NCCL's search finds on one host whose GPUs each
    have ``total_bw`` GB/s to the others (NVLink through switches), as src/graph/search.cc
    ``ncclTopoCompute`` (NCCL 2.30) proceeds: from the fastest speed of :data:`RING_SPEEDS_INTRA` within
    ``total_bw``, as many channels as fit at each speed (at most :data:`RING_SEARCH_MAX_CHANNELS`), the
    first with the largest channels x speed kept, slower speeds tried while above 0.49 of the kept one
    and the total not reached; then ``ncclTopoDupChannels`` doubles the channels at half the speed
    (a speed of 25 GB/s or more; from Hopper on 50 or more when over 4 channels), and the second pass
    raises the speed while the channels still fit. NCCL's communicator then runs twice these channels
    (:data:`CHANNEL_DUP`, connect.cc).

    >>> ring_search_channels(18 * 20.6, 2), ring_search_channels(12 * 20.0, 1)   # 8 H100, 8 A100
    ((12, 30.0), (12, 20.0))
    >>> ring_search_channels(18 * 40.1, 3)                                       # B200
    (16, 45.0)
    """
    speeds = RING_SPEEDS_INTRA[gen]

    def fit(s: float) -> int:
        return min(RING_SEARCH_MAX_CHANNELS, int(total_bw / s + 1e-9))

    i = next((k for k, s in enumerate(speeds) if s <= total_bw + 1e-9), len(speeds) - 1)
    nch, bw = fit(speeds[i]), speeds[i]
    while nch * bw < total_bw - 1e-9 and i + 1 < len(speeds) and speeds[i + 1] / bw > 0.49:
        i += 1
        if fit(speeds[i]) * speeds[i] > nch * bw:
            nch, bw = fit(speeds[i]), speeds[i]
    if bw >= 25.0 and not (gen >= 2 and bw < 50.0 and nch > 4):
        dup = min(2 * nch, RING_SEARCH_MAX_CHANNELS)
        bw, nch = bw / -(-dup // nch), dup
    faster = [s for s in speeds if s > bw]
    while faster and nch * faster[-1] <= total_bw + 1e-9:
        bw = faster.pop()
    return nch, bw


def p2p_setup(topology: Topology, gpus: Sequence[str]) -> dict:
    """How NCCL 2.30 sets up point-to-point operations among ``gpus``: ``{channels, per_peer, min,
    chunk, nodes, gen}``. ``channels``: p2pnChannels, the communicator's channels rounded up to a power
    of two (src/graph/paths.cc ``ncclTopoComputeP2pChannels``; one host of NVLink GPUs:
    :func:`ring_search_channels` x :data:`CHANNEL_DUP`, else the search's channels as
    :func:`nccl_predict` derives them); ``per_peer``: p2pnChannelsPerPeer, the least over the peers of
    2 per NVLink of the path's bandwidth (:data:`NVLINK_BW`), 2 over PCIe, and over the network
    ``max(NICs, NIC GB/s / P2P_PER_CHANNEL_NET_BW)`` (``ncclTopoGetNchannels``), rounded up to a power
    of two and, across hosts, halved while ``per_peer x ceil(ranks / 8) > channels``; ``min``: the
    channels an operation starts from (enqueue.cc ``scheduleP2pTasksToPlan``: ``per_peer`` halved while
    ``min x ranks > channels``); ``chunk``: :data:`P2P_CHUNK_BYTES`; ``nodes``: hosts, one when every GPU
    reaches the others over NVLink (one NVLink domain).

    >>> from treecoll import topo
    >>> t = topo.resolve("dgx-h100")
    >>> p2p_setup(t, t.rank_gpus())
    {'channels': 32, 'per_peer': 32, 'min': 4, 'chunk': 524288, 'nodes': 1, 'gen': 2}
    """
    n = len(gpus)
    hosts = _by_host(topology, gpus)
    gen = generation(topology, gpus)
    pairs = [(a, b) for a, b in zip(gpus, gpus[1:] + gpus[:1]) if a != b]
    if n > 2 and len(hosts) > 1:  # a peer on another host, as an alltoall has (sendrecv's ring may not)
        first = topology.host_of(gpus[0])
        pairs.append((gpus[0], next(x for x in gpus if topology.host_of(x) != first)))
    paths = [topology.path(a, b) for a, b in pairs]
    all_nvlink = all(p.nccl in ("NVL", "NVB") for p in paths)
    nodes = 1 if all_nvlink else len(hosts)
    per_peer = MAXCHANNELS
    for (a, _), p in zip(pairs, paths):
        if p.nccl in ("NVL", "NVB"):
            per_peer = min(per_peer, 2 * max(1, int(p.bw / NVLINK_BW[gen] + 1e-9)))
        elif p.nccl != "NET":
            per_peer = min(per_peer, 2)
        else:
            nic = topology.nearest_nic(a)
            nic_bw = float(topology.node(nic).get("bw") or 0.0) if nic is not None else 0.0
            per_peer = min(per_peer, max(1, math.ceil(nic_bw / P2P_PER_CHANNEL_NET_BW - 1e-9)))
    if nodes == 1 and all_nvlink and paths:
        comm = CHANNEL_DUP * ring_search_channels(min(p.bw for p in paths), gen)[0]
    else:
        _, _, _, _, nch, _ = _inputs(topology, gpus, None)
        comm = CHANNEL_DUP * nch
    channels = min(_pow2_up(min(comm, MAXCHANNELS)), MAXCHANNELS)
    per_peer = _pow2_up(per_peer)
    if nodes > 1:
        while per_peer * -(-n // P2P_PER_BATCH) > channels and per_peer > 1:
            per_peer //= 2
    else:
        per_peer = min(channels, per_peer)
    lo = per_peer
    while lo * n > channels and lo > 1:
        lo //= 2
    if nodes > 1:
        arm = _arm_hosts(topology) and gen >= 3
        chunk = P2P_CHUNK_BYTES["net"] * (2 if arm else 1)
    else:
        chunk = P2P_CHUNK_BYTES["nvlink" if all_nvlink else "pci"]
    return {"channels": channels, "per_peer": per_peer, "min": lo, "chunk": chunk, "nodes": nodes, "gen": gen}


def p2p_channels(nbytes: float, setup: dict) -> int:
    """Channels NCCL 2.30 runs one send (or receive) of ``nbytes`` on (src/enqueue.cc ``addP2pToPlan``):
    ``min(setup["min"], ceil(nbytes / minPart))``, doubled (up to ``per_peer``) while a channel's part is
    over ``maxPart``; one host: parts of chunk / 8 to chunk x 32, across hosts chunk / 2 to chunk.

    >>> s = {"channels": 32, "per_peer": 32, "min": 4, "chunk": 512 << 10, "nodes": 1}
    >>> [p2p_channels(m << 20, s) for m in (32, 64, 128, 256, 512, 1024)]
    [4, 4, 8, 16, 32, 32]
    """
    if nbytes <= 0:
        return 1
    one = setup["nodes"] <= 1
    lo_part = setup["chunk"] // 8 if one else setup["chunk"] // 2
    hi_part = setup["chunk"] * 32 if one else setup["chunk"]
    nch = max(1, min(setup["min"], math.ceil(nbytes / lo_part)))
    part = max(lo_part, math.ceil(nbytes / nch))
    while part > hi_part and nch <= setup["per_peer"] // 2:
        nch *= 2
        part = math.ceil(nbytes / nch)
    return nch


def p2p_protocol(nbytes: float, channels: int) -> str:
    """The protocol NCCL runs a point-to-point operation of ``nbytes`` on ``channels`` with: LL up to
    :data:`P2P_LL_THRESHOLD` bytes per channel, else Simple (src/enqueue.cc ``addP2pToPlan``; never LL128).

    >>> p2p_protocol(64 << 10, 4), p2p_protocol(65 << 10, 4)
    ('LL', 'Simple')
    """
    return "LL" if nbytes <= channels * P2P_LL_THRESHOLD else "Simple"


def p2p_channel_bw(topology: Topology, a: str, b: str, gen: int) -> float:
    """GB/s one point-to-point channel carries from ``a`` to ``b``: one NVLink (:data:`NVLINK_BW`) over
    NVLink, NCCL's :data:`P2P_PER_CHANNEL_NET_BW` over the network, unbounded (inf) otherwise (the links
    bound it). NCCL's kernels move each channel's part with one thread block; NCCL gives a peer two
    channels per NVLink and one per 14 GB/s of NIC (src/graph/paths.cc ``ncclTopoGetNchannels``).

    >>> from treecoll import topo
    >>> t = topo.resolve("dgx-h100")
    >>> p2p_channel_bw(t, "h0/gpu0", "h0/gpu1", 2)
    20.6
    """
    return _channel_bw(topology.path(a, b).nccl, gen)


def _channel_bw(path_class: str, gen: int) -> float:
    """:func:`p2p_channel_bw` by the route's NCCL path class."""
    if path_class in ("NVL", "NVB"):
        return NVLINK_BW[gen]
    if path_class == "NET":
        return P2P_PER_CHANNEL_NET_BW
    return math.inf


def nccl_predict(
    placement: Placement | Topology | None,
    ranks: RanksArg,
    nbytes: int,
    algo: str = "ring",
    proto: str | None = None,
    *,
    nranks: int | None = None,
    nchannels: int | None = None,
    collective: str = "allreduce",
) -> dict:
    """NCCL's predicted time of ``collective`` with ``algo`` on ``nbytes`` (the size nccl-tests prints:
    the total of all ranks' pieces for allgather, reduce_scatter and alltoall).

    ``placement``: a :class:`~treecoll.collectives.placement.Placement`, or a Topology /
    None with ``ranks`` and ``nranks`` (:func:`~treecoll.collectives.placement.as_placement`).
    ``algo``: one of :data:`COLLECTIVE_ALGOS` for the collective ("ring", "tree", "nvls", "pat", "p2p").

    ``proto`` None lets the model choose (least time over LL, LL128, Simple,
    like NCCL). ``nvls`` is NCCL's NVLS on one NVLink domain and NVLSTree
    across several (Simple only; :func:`nvls_domains` says where it runs). Returns ``{algo, proto,
    time (s), time_us, lat_us, algbw, busbw (GB/s, nccl-tests definitions), nchannels, nnodes,
    nranks, protocols: {proto: time_us}, run_channels, run_time_us}``: ``time`` is NCCL's own
    estimate (what its tuner compares); ``run_channels`` the channels NCCL then runs the
    collective on at this size (:func:`run_channels`; NVLS: :func:`nvls_run`) and ``run_time_us``
    the same model with only those channels' share of the bandwidth (NVLS: on all its channels,
    plus its pipeline fill, :func:`nvls_fill`). ``alltoall`` and ``sendrecv`` (``p2p``) are
    not modelled by NCCL: there the time is one point-to-point latency plus each GPU's bytes
    over its bottleneck (NVLink inside a host, its share of the host's NICs across).
    """
    if collective not in COLLECTIVES:
        raise TreeError(f"nccl model: collective expected one of {list(COLLECTIVES)}, got {collective!r}")
    if algo not in COLLECTIVE_ALGOS[collective]:
        raise TreeError(
            f"nccl model: algo for {collective} expected one of {list(COLLECTIVE_ALGOS[collective])}, got {algo!r}"
        )
    if proto is not None and proto not in PROTOS:
        raise TreeError(f"nccl model: proto expected one of {list(PROTOS)} or None, got {proto!r}")
    topology, gpus = placed_gpus(as_placement(placement, ranks, nranks=nranks, what="nccl model"))
    if len(gpus) < 2:  # enqueue.cc: with nRanks == 1 NCCL copies the buffer (ncclLaunchOneRank), no algorithm
        raise TreeError(f"nccl model: one rank runs no {algo} (NCCL only copies the buffer); expected 2 ranks or more")
    _check_nvidia(topology, gpus)
    if algo == "nvls":
        if proto not in (None, "Simple"):
            raise TreeError(f"nccl model: NVLS runs the Simple protocol only, got proto {proto!r}")
        if collective != "allreduce":
            return _nvls_gather_predict(topology, gpus, nbytes, collective)
        return _with_run(_nvls_predict(topology, gpus, nbytes), nbytes, nvls_run(topology, gpus))
    if algo == "p2p":
        return _p2p_predict(topology, gpus, nbytes, collective)
    if algo == "collnet":
        if proto not in (None, "Simple"):
            raise TreeError(f"nccl model: CollNet runs the Simple protocol only, got proto {proto!r}")
        return _collnet_predict(topology, gpus, nbytes)
    return _ring_tree_predict(topology, gpus, nbytes, algo, proto, nchannels, collective)


def _with_run(r: dict, nbytes: int, run: dict) -> dict:
    """``r`` with NVLS's run fields: NVLS runs on all its channels (``run``: :func:`nvls_run`;
    enqueue.cc), its bytes through a pipeline of chunks (:func:`nvls_fill` added to the drain)."""
    drain = r["time_us"] - r["lat_us"]
    return {
        **r,
        "run_channels": run["channels"],
        "run_time_us": r["time_us"] + drain * nvls_fill(nbytes, run),
        "collective": "allreduce",
    }


def _result(
    collective: str,
    algo: str,
    proto: str,
    nbytes: int,
    n: int,
    t_us: float,
    lat: float,
    alg: float,
    nch: int,
    n_nodes: int,
    times: dict,
    run: tuple[int, float] | None = None,
) -> dict:
    algbw = nbytes / (t_us * 1e3) if t_us > 0 else math.inf
    from .result import bus_factor

    run_nc, run_t = run if run is not None else (nch, t_us)
    return {
        "collective": collective,
        "algo": algo,
        "proto": proto,
        "time": t_us * 1e-6,
        "time_us": t_us,
        "lat_us": lat,
        "model_algbw": alg,
        "algbw": algbw,
        "busbw": algbw * bus_factor(collective, n),
        "nchannels": nch,
        "nnodes": n_nodes,
        "nranks": n,
        "protocols": dict(times),
        "run_channels": run_nc,
        "run_time_us": run_t,
    }


def _ring_tree_predict(
    topology: Topology,
    gpus: Sequence[str],
    nbytes: int,
    algo: str,
    proto: str | None,
    nchannels: int | None,
    collective: str,
) -> dict:
    """Ring, tree and PAT as tuning.cc ncclTopoTuneModel / ncclTopoGetAlgoTime compute them."""
    n = len(gpus)
    n_nodes, gen, intra_kind, total, nch, lat_inter = _inputs(topology, gpus, nchannels)
    if algo == "pat" and n_nodes != n:
        raise TreeError(
            f"nccl model: PAT runs with one GPU per node only (ncclPatEnable), got {n} ranks on {n_nodes} nodes"
        )
    col = 0 if n_nodes == 1 else 1 if n_nodes == 2 else 2
    bw_ch = total / nch
    nsteps = 2 * (n - 1) if collective == "allreduce" else n - 1 if collective in ("allgather", "reduce_scatter") else n
    times, detail = {}, {}
    protos = ("Simple",) if algo == "pat" else PROTOS
    for pr in protos:
        pi = PROTOS.index(pr)
        alg = _algo_bw(algo, pr, collective, nch * bw_ch, nch, gen, n_nodes, col, n, nsteps)
        lat = 0.0 if n == 1 else _latency(algo, pr, pi, collective, intra_kind, n, n_nodes, nsteps, lat_inter)
        if (
            algo == "ring"
            and collective == "allreduce"
            and n_nodes > 1
            and pr == "Simple"
            and nbytes / (CHANNEL_DUP * nch * n) >= 64
        ):
            lat *= 1.4 if gen >= 1 else 1.9  # "plateau effect" (ncclTopoGetAlgoTime; nBytes / (comm nCh x nRanks))
        if algo == "tree" and collective == "allreduce":
            idx = _log2i(max(nbytes, 1) / 64)
            if 0 <= idx < 23:  # ncclTopoGetAlgoTime: logSize < 23
                alg *= TREE_CORRECTION[pr][idx]
        times[pr] = lat + nbytes / (1000.0 * alg) if alg > 0 else math.inf
        detail[pr] = (lat, alg)
    offered = nccl_protocols(topology, gpus)
    allowed = [p for p in protos if p in offered] or list(protos)
    chosen = proto or min(allowed, key=lambda p: (times[p], PROTOS.index(p)))
    if chosen not in times:
        raise TreeError(f"nccl model: {algo} runs the Simple protocol only, got proto {chosen!r}")
    lat, alg = detail[chosen]
    nc, have = run_channels(nbytes, "tree" if algo == "tree" else "ring", chosen, nch, n, bw_ch)
    run_t = lat + nbytes / (1000.0 * alg * nc / have) if alg > 0 else math.inf
    return _result(collective, algo, chosen, nbytes, n, times[chosen], lat, alg, nch, n_nodes, times, (nc, run_t))


def _algo_bw(
    algo: str, pr: str, collective: str, bus: float, nch: int, gen: int, n_nodes: int, col: int, n: int, nsteps: int
) -> float:
    """The algorithm bandwidth NCCL's tuner gives ``algo`` / ``pr`` (tuning.cc "Various model refinements"
    and "Convert bus BW to algorithm BW"), GB/s."""
    ll_max = LL_MAX_BW[gen if n_nodes == 1 else 0][col]
    if algo == "ring":
        if pr == "LL":
            bus = min(ll_max, bus * 0.5)
        elif pr == "LL128":
            bus = min(bus * 0.92, nch * PER_CH_MAX_RING_LL128_BW[gen][col])
        return bus * n / nsteps if n > 1 else bus
    if algo == "pat":
        return bus * PAT_BW_FACTOR  # no busBw -> algBw conversion for PAT (allgather, reduce_scatter)
    bus = min(bus * 0.92, nch * PER_CH_MAX_TREE_BW[gen][col])
    if pr == "LL":
        bus = min(bus / 3.8, ll_max)
    elif pr == "LL128":
        bus = min(bus * (7.0 / 9.0 if n_nodes == 1 else 120.0 / 128.0), nch * PER_CH_MAX_TREE_LL128_BW[gen][col])
    return bus * 0.5


def _latency(
    algo: str, pr: str, pi: int, collective: str, intra_kind: str, n: int, n_nodes: int, nsteps: int, lat_inter: float
) -> float:
    """NCCL's latency of ``algo`` / ``pr`` for ``collective``, µs (tuning.cc ncclTopoTuneModel)."""
    table = "tree" if algo == "tree" else "ring"
    intra = HW_LAT[intra_kind][table][pi]
    ppn = n / n_nodes
    inter = HW_LAT["NET"]["tree" if ppn == 1 else table][pi]
    inter += lat_inter * (2 if pr == "Simple" else 1)
    if algo == "pat":
        return PAT_BASE_LAT + _log2i(n_nodes) * inter / 3.5 + n * PAT_RANK_LAT
    base = BASE_LAT[table][pi]
    if algo == "tree":
        return base + 2 * ((ppn - 1) * intra + _log2i(n_nodes) * inter)
    hw = HW_LAT["NET" if n_nodes > 1 else intra_kind]
    if collective in ("broadcast", "reduce"):  # graph sameChannels assumed: one hop's latency
        return base + hw["ring"][pi]
    if n_nodes > 1:
        intra = max(intra, NET_OVERHEAD * (3 if pr == "Simple" else 1))
    n_inter = 0 if n_nodes == 1 else 2 * (n_nodes - 1) if collective == "allreduce" else n_nodes - 1
    return base + (nsteps - n_inter) * intra + n_inter * inter


def _nvls_gather_predict(topology: Topology, gpus: Sequence[str], nbytes: int, collective: str) -> dict:
    """NVLS allgather / reduce_scatter on one NVLink domain (tuning.cc: ``intraBw × (ppn − 1) / ppn``;
    across nodes NCCL needs CollNet for them, which this model does not offer)."""
    domains = nvls_domains(topology, gpus)
    if len(domains) > 1:
        raise TreeError(
            f"nccl model: NVLS {collective} across NVLink domains needs CollNet (tuning.cc), got {len(domains)} domains"
        )
    g = topology.graph
    n = len(gpus)
    gen = generation(topology, gpus)
    nch = min(MAX_NVLS_ARITY, n)
    nvl = min(sum(float(d["bw"]) for v, d in g[x].items() if g.nodes[v].get("kind") == "nvswitch") for x in gpus)
    bw_intra = _quantize(nvl / (n + 1), NVLS_SPEEDS_INTRA[gen])
    bw = bw_intra * NVLS_EFFICIENCY[gen] * (nch - 1) / nch * (n - 1) / n
    alg = nch * bw * n / (n - 1)
    t_us = NVLS_LAT + nbytes / (1000.0 * alg)
    return _result(collective, "nvls", "Simple", nbytes, n, t_us, NVLS_LAT, alg, nch, 1, {"Simple": t_us})


def _p2p_predict(topology: Topology, gpus: Sequence[str], nbytes: int, collective: str) -> dict:
    """alltoall (each rank sends ``nbytes / P`` to every other) and sendrecv (rank r sends ``nbytes``
    to r + 1): one Simple point-to-point step's latency (ring base and hop latencies of tuning.cc)
    plus the bytes each GPU sends over its bottleneck: NVLink (its path bandwidth) to the peers it
    reaches over NVLink (its host's, or its NVLink domain's), its share of the host's NIC
    bandwidth to the others, and each peer's bytes over the channels NCCL runs them on
    (:func:`p2p_channels` x :func:`p2p_channel_bw`)."""
    n = len(gpus)
    hosts = _by_host(topology, gpus)
    n_nodes, gen, intra_kind, _, nch, lat_inter = _inputs(topology, gpus, None)
    pi = PROTOS.index("Simple")
    t_bw = 0.0
    net_lat = HW_LAT["NET"]["ring"][pi] + 2 * lat_inter
    setup = p2p_setup(topology, gpus)

    def on_channels(path_class: str, op: float) -> float:
        return op / (p2p_channels(op, setup) * _channel_bw(path_class, gen))

    if collective == "alltoall":
        any_net = False
        for h, members in hosts.items():
            rep = members[0]  # peers over NVLink (also across hosts of one NVLink domain) or the NICs
            paths = [topology.path(rep, b) for b in gpus if b != rep]
            nvl = [p.bw for p in paths if p.nccl != "NET"]
            net = len(paths) - len(nvl)
            any_net = any_net or net > 0
            nic_bw = sum(float(topology.node(c).get("bw") or 0.0) for c in topology.nics(h)) / len(members)
            t_bw = max(
                t_bw,
                nbytes * len(nvl) / n / min(nvl) if nvl else 0.0,
                nbytes * net / n / nic_bw if net and nic_bw > 0 else 0.0,
                max((on_channels(c, nbytes / n) for c in {p.nccl for p in paths}), default=0.0),
            )
        hop = net_lat if any_net else HW_LAT[intra_kind]["ring"][pi]
    else:
        hop = 0.0
        for a, b in zip(gpus, gpus[1:] + gpus[:1]):
            p = topology.path(a, b)
            t_bw = max(t_bw, nbytes / p.bw, on_channels(p.nccl, nbytes))
            hop = max(hop, net_lat if p.nccl == "NET" else HW_LAT[intra_kind]["ring"][pi])
    lat = BASE_LAT["ring"][pi] + hop
    t_us = lat + t_bw / 1000.0
    return _result(
        collective,
        "p2p",
        "Simple",
        nbytes,
        n,
        t_us,
        lat,
        nbytes / t_bw if t_bw else math.inf,
        nch,
        n_nodes,
        {"Simple": t_us},
    )


def nccl_best(
    placement: Placement | Topology | None,
    ranks: RanksArg,
    nbytes: int,
    collective: str = "allreduce",
    proto: str | None = None,
    *,
    nranks: int | None = None,
) -> dict:
    """What NCCL's tuner picks for ``collective``: the least predicted time over :func:`nccl_algos`
    (enqueue.cc ``topoGetAlgoInfo``: argmin over algorithm and protocol), as :func:`nccl_predict` returns it.

    >>> from treecoll.collectives.cost import uniform_topology
    >>> r = nccl_best(uniform_topology(8), None, 1 << 30, "broadcast")
    >>> r["algo"], r["collective"]
    ('ring', 'broadcast')
    """
    p = as_placement(placement, ranks, nranks=nranks, what="nccl model")
    topology, gpus = placed_gpus(p)
    algos = nccl_algos(topology, gpus, proto, collective)
    return min(
        (nccl_predict(p, None, nbytes, algo=a, proto=proto, collective=collective) for a in algos),
        key=lambda r: r["time"],
    )


def collnet_available(topology: Topology, gpus: Sequence[str]) -> bool:
    """Whether NCCL can run CollNet (in-network reduction) here: the ranks span several hosts, at
    most 8 per host (CollNetDirect and CollNetChain, enqueue.cc), and every NIC of their hosts plugs
    into a network switch that reduces (``sharp: true`` on the topology's ``network``). NCCL
    also needs a CollNet plugin (the SHARP plugin) and ``NCCL_COLLNET_ENABLE=1``; the model
    assumes both where the fabric has SHARP."""
    hosts = _by_host(topology, gpus)
    if len(hosts) < 2 or max(len(m) for m in hosts.values()) > COLLNET_MAX_LOCAL:
        return False
    g = topology.graph
    for h in hosts:
        nics = topology.nics(h)
        if not nics:
            return False
        for c in nics:
            sw = [v for v in g.successors(c) if g.nodes[v].get("kind") == "net_switch"]
            if not sw or not all(g.nodes[v].get("sharp") for v in sw):
                return False
    return True


def _collnet_predict(topology: Topology, gpus: Sequence[str], nbytes: int) -> dict:
    """CollNet allreduce (Simple) as tuning.cc models it: CollNetDirect where every host's GPUs share
    NVSwitches (else CollNetChain). The CollNet graph is derived (approximation): a channel per NIC
    of a host (its heads), each at the NIC's bandwidth within the host's share of NCCL's ring
    bandwidth; busBw = nCh × bwIntra, CollNetDirect divided by the GPU/NIC factor
    ``f − (f − 1) / 2`` (``f = ppn / nCh``) and × 0.85 on Hopper and later; algBw = busBw × 0.5.
    Latency: CollNetDirect ``2 (min(1, ppn − 1) intra + (ppn − 1) 0.4) + inter``, CollNetChain
    ``2 (ppn − 1) intra + inter``; inter adds the NIC's latency twice (Simple)."""
    if not collnet_available(topology, gpus):
        raise TreeError(
            "nccl model: CollNet needs several hosts of at most 8 ranks whose network switches "
            "reduce (network 'sharp: true' in the topology)"
        )
    n = len(gpus)
    n_nodes, gen, intra_kind, total, _, lat_inter = _inputs(topology, gpus, None)
    hosts = _by_host(topology, gpus)
    ppn = n / n_nodes
    nics = min(len(topology.nics(h)) for h in hosts)
    nic_bw = min(float(topology.node(c).get("bw") or 0.0) for h in hosts for c in topology.nics(h))
    nch = max(1, min(nics, int(ppn)))
    bw_intra = min(nic_bw, total / nch)
    g = topology.graph
    direct = all(any(g.nodes[v].get("kind") == "nvswitch" for v in g.successors(x)) for x in gpus)
    kind = "direct" if direct else "chain"
    bus = nch * bw_intra
    if direct:
        f = ppn / nch
        bus /= f - (f - 1) / 2
        if gen >= 2:
            bus *= COLLNET_DIRECT_HOPPER
    alg = bus * 0.5
    intra_lat, net_lat = COLLNET_LAT[kind]
    inter = (HW_LAT["NET"]["tree"][2] if ppn == 1 else net_lat) + 2 * lat_inter
    if direct:
        lat = 2 * (min(1.0, ppn - 1) * intra_lat + (ppn - 1) * COLLNET_ARITY_LAT) + inter
    else:
        lat = 2 * (ppn - 1) * intra_lat + inter
    t_us = lat + nbytes / (1000.0 * alg)
    r = _result("allreduce", "collnet", "Simple", nbytes, n, t_us, lat, alg, nch, n_nodes, {"Simple": t_us})
    return {**r, "collnet": kind}
