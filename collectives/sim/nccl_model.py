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

from treecoll.topo import Topology
from treecoll.topo.errors import TreeError
from treecoll.topo.paths import NCCL_CLASSES
from treecoll.topo.ranks import RanksArg

from ..cost import placed_gpus
from ..in_network import min_sm, nvls_domains
from ..placement import Placement, as_placement

__all__ = ["nccl_predict", "ll128_enabled", "nvls_domains", "nccl_algos", "generation", "PROTOS", "BASE_LAT",
           "HW_LAT", "LL_MAX_BW", "PER_CH_MAX_RING_LL128_BW", "PER_CH_MAX_TREE_LL128_BW", "PER_CH_MAX_TREE_BW",
           "TREE_CORRECTION"]

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
    "LL": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1, 1),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
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
NVLS_SPEEDS_INTRA = {2: (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
                     3: (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)}
NVLS_SPEEDS_INTER = {2: (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2),
                     3: (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                         3.0, 2.4, 1.2)}
#: µs, NCCL_NET_OVERHEAD default on Intel x86 (×3 for Simple)
NET_OVERHEAD = 1.0
MAX_CHANNELS = 32


def _check_nvidia(topology: Topology, gpus: Sequence[str]) -> None:
    """Raise :class:`TreeError` when a rank is a CPU process slot: NCCL runs on NVIDIA GPUs
    only, and its tuning constants (link latencies, bandwidths) say nothing about CPUs."""
    from treecoll.topo.discover import CPU_SLOT_MODEL
    for x in gpus:
        if topology.graph.nodes[x].get("model") == CPU_SLOT_MODEL:
            raise TreeError(f"nccl model: rank slot {x!r} is a CPU process (model {CPU_SLOT_MODEL!r}); NCCL and its "
                            f"tuning model apply to NVIDIA GPUs only")


def generation(topology: Topology, gpus: Sequence[str]) -> int:
    """NCCL's GPU generation index of the oldest GPU: 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell (no ``sm``: Hopper)."""
    sm = min_sm(topology, gpus)
    return 0 if sm < 80 else 1 if sm < 90 else 2 if sm < 100 else 3


def _log2i(x: float) -> int:
    return int(math.floor(math.log2(x))) if x >= 1 else 0


def _by_host(topology: Topology, gpus: Sequence[str]) -> dict[str, list[str]]:
    hosts: dict[str, list[str]] = {}
    for x in gpus:
        hosts.setdefault(topology.host_of(x), []).append(x)
    return hosts


def _inputs(topology: Topology, gpus: Sequence[str], nchannels: int | None):
    hosts = _by_host(topology, gpus)
    n_nodes = len(hosts)
    g = topology.graph
    gen = generation(topology, gpus)
    intra_bw, nvlink, link_bw = math.inf, True, math.inf
    for members in hosts.values():
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
        nic_bw = min(sum(float(topology.node(n).get("bw") or 0.0) for n in topology.nics(h)) for h in hosts)
        if nic_bw <= 0:
            raise TreeError("nccl model: several hosts but a host has no NIC bandwidth")
        total = min(total, nic_bw)
    if not math.isfinite(total):    # one rank per host
        total = min(sum(float(topology.node(n).get("bw") or 0.0) for n in topology.nics(h)) for h in hosts) or 12.0
    if nchannels is None:
        if nvlink and math.isfinite(link_bw):
            nchannels = int(round(total / link_bw))
        else:
            nchannels = 2
    nchannels = max(1, min(MAX_CHANNELS, int(nchannels)))
    lat_inter = max((float(topology.node(n).get("lat") or 0.0) for h in hosts for n in topology.nics(h)),
                    default=0.0) if n_nodes > 1 else 0.0
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
    for members in by_host.values():
        for a, b in zip(members, members[1:]):
            if topology.path(a, b).nccl not in ("LOC", "NVL", "NVB"):
                return False
    if len(by_host) > 1:
        limit = NCCL_CLASSES.index("PXN" if min(sms) >= 90 else "PXB")
        for g in gpus:
            nic = topology.nearest_nic(g)
            if nic is None or NCCL_CLASSES.index(topology.path(g, nic).nccl) > limit:
                return False
    return True


def nccl_algos(topology: Topology, gpus: Sequence[str], proto: str | None = None) -> tuple[str, ...]:
    """The allreduce algorithms NCCL offers on these GPUs: ``ring``, ``tree``, and ``nvls`` (NVLS on one
    NVLink domain, NVLSTree across several) where :func:`nvls_domains` allows it and ``proto`` (a
    protocol NCCL is restricted to, e.g. by NCCL_PROTO) is None or Simple: NVLS runs Simple only."""
    if proto not in (None, "Simple"):
        return ("ring", "tree")
    try:
        nvls_domains(topology, gpus)
    except TreeError:
        return ("ring", "tree")
    return ("ring", "tree", "nvls")


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
    nvl = min(sum(float(d["bw"]) for v, d in g[x].items() if g.nodes[v].get("kind") == "nvswitch") for x in gpus)
    bw_intra = _quantize(nvl / (n + 1), NVLS_SPEEDS_INTRA[gen])
    intra = bw_intra * NVLS_EFFICIENCY[gen] * (nch - 1) / nch * 2.0
    bw = intra
    lat = NVLS_LAT
    if n_nodes > 1:
        nics = [topology.nearest_nic(x) for x in gpus]
        if None in nics:
            raise TreeError(f"nccl model: NVLSTree across NVLink domains but GPU {gpus[nics.index(None)]!r} "
                            f"has no NIC")
        path_bw = min(min(topology.path(x, c).bw, float(topology.node(c).get("bw") or 0.0))
                      for x, c in zip(gpus, nics))
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
    return {"algo": "nvls_tree" if n_nodes > 1 else "nvls", "proto": "Simple", "time": t_us * 1e-6,
            "time_us": t_us, "lat_us": lat, "model_algbw": alg, "algbw": algbw,
            "busbw": algbw * 2 * (nranks - 1) / nranks, "nchannels": nch, "nnodes": n_nodes, "nranks": nranks,
            "protocols": {"Simple": t_us}}


def _arm_hosts(topology: Topology) -> bool:
    """Whether the CPUs are Arm (NVIDIA Grace): NCCL's x86-only NVLSTree correction then does not apply."""
    return any("grace" in str(topology.node(c).get("model", "")).lower() or
               str(topology.node(c).get("arch", "")).lower() in ("arm", "arm64", "aarch64")
               for c in topology.nodes("cpu"))


def nccl_predict(placement: Placement | Topology | None, ranks: RanksArg, nbytes: int, algo: str = "ring",
                 proto: str | None = None, *, nranks: int | None = None, nchannels: int | None = None) -> dict:
    """NCCL's predicted allreduce time for ``algo`` ("ring", "tree" or "nvls") on ``nbytes``.

    ``placement``: a :class:`~treecoll.collectives.placement.Placement`, or a Topology /
    None with ``ranks`` and ``nranks`` (:func:`~treecoll.collectives.placement.as_placement`).

    ``proto`` None lets the model choose (least time over LL, LL128, Simple,
    like NCCL). ``nvls`` is NCCL's NVLS on one NVLink domain and NVLSTree
    across several (Simple only; :func:`nvls_domains` says where it runs). Returns ``{algo, proto,
    time (s), time_us, lat_us, algbw, busbw (GB/s, nccl-tests definitions), nchannels, nnodes,
    nranks, protocols: {proto: time_us}}``.
    """
    if algo not in (*BASE_LAT, "nvls"):
        raise TreeError(f"nccl model: algo expected 'ring', 'tree' or 'nvls', got {algo!r}")
    if proto is not None and proto not in PROTOS:
        raise TreeError(f"nccl model: proto expected one of {list(PROTOS)} or None, got {proto!r}")
    topology, gpus = placed_gpus(as_placement(placement, ranks, nranks=nranks, what="nccl model"))
    _check_nvidia(topology, gpus)
    if algo == "nvls":
        if proto not in (None, "Simple"):
            raise TreeError(f"nccl model: NVLS runs the Simple protocol only, got proto {proto!r}")
        return _nvls_predict(topology, gpus, nbytes)
    n = len(gpus)
    n_nodes, gen, intra_kind, total, nch, lat_inter = _inputs(topology, gpus, nchannels)
    col = 0 if n_nodes == 1 else 1 if n_nodes == 2 else 2
    bw_ch = total / nch
    nsteps = 2 * (n - 1)
    times = {}
    detail = {}
    for pi, pr in enumerate(PROTOS):
        bus = nch * bw_ch
        ll_max = LL_MAX_BW[gen if n_nodes == 1 else 0][col]
        if algo == "ring":
            if pr == "LL":
                bus = min(ll_max, bus * 0.5)
            elif pr == "LL128":
                bus = min(bus * 0.92, nch * PER_CH_MAX_RING_LL128_BW[gen][col])
            alg = bus * n / nsteps if n > 1 else bus
        else:
            if pr == "LL":
                bus = min(bus / 3.8, ll_max)
            elif pr == "LL128":
                bus = min(bus * (7.0 / 9.0 if n_nodes == 1 else 120.0 / 128.0),
                          nch * PER_CH_MAX_TREE_LL128_BW[gen][col])
            else:
                bus = min(bus * 0.92, nch * PER_CH_MAX_TREE_BW[gen][col])
            alg = bus * 0.5
        # latency
        intra = HW_LAT[intra_kind][algo][pi]
        inter = HW_LAT["NET"][algo][pi]
        if n_nodes > 1 and algo == "ring":
            intra = max(intra, NET_OVERHEAD * (3 if pr == "Simple" else 1))
        base = BASE_LAT[algo][pi]
        ppn = n / n_nodes
        if algo == "ring" and ppn == 1 and n_nodes > 1:
            inter = HW_LAT["NET"]["tree"][pi]
        inter += lat_inter * (2 if pr == "Simple" else 1)
        if algo == "ring":
            n_inter = 2 * (n_nodes - 1)
            lat = base + (nsteps - n_inter) * intra + n_inter * inter
            if n_nodes > 1 and pr == "Simple" and nbytes / (nch * n) >= 64:
                lat *= 1.4   # "plateau effect", sm80+ (tuning.cc)
        else:
            lat = base + 2 * ((ppn - 1) * intra + _log2i(n_nodes) * inter)
            idx = min(max(_log2i(max(nbytes, 1) / 64), 0), 23)
            alg *= TREE_CORRECTION[pr][idx]
        if n == 1:
            lat = 0.0
        t_us = lat + nbytes / (1000.0 * alg)
        times[pr] = t_us
        detail[pr] = (lat, alg)
    allowed = [p for p in PROTOS if p != "LL128" or ll128_enabled(topology, gpus)]
    chosen = proto or min(allowed, key=lambda p: (times[p], PROTOS.index(p)))
    lat, alg = detail[chosen]
    t_us = times[chosen]
    algbw = nbytes / (t_us * 1e3) if t_us > 0 else math.inf
    return {"algo": algo, "proto": chosen, "time": t_us * 1e-6, "time_us": t_us, "lat_us": lat,
            "model_algbw": alg, "algbw": algbw, "busbw": algbw * (2 * (n - 1) / n if n > 1 else 1.0),
            "nchannels": nch, "nnodes": n_nodes, "nranks": n, "protocols": dict(times)}
