"""What NCCL's transports deliver over the simulator's links, beyond the protocols' efficiency.

NCCL's tuning model (:mod:`~treecoll.collectives.sim.nccl_model`) sees every
link at its nominal bandwidth; the runs do not reach it where NCCL's
transports stand between the GPUs and the link: data crossing a CPU's root
complex goes through host memory, and a network fabric's transport reaches a
fraction of the NIC's line rate. :func:`link_factor` gives that fraction per
link; :class:`~treecoll.collectives.sim.engine.Network` multiplies every
link's capacity by it (not in the ``ideal`` profile, the links as written).
Each constant names its source: public statements of NCCL's maintainers and
users for the mechanism, a ``fit`` table of tests/fixtures/nccl-tests for
the value.

>>> link_factor(__import__("treecoll").topo.resolve("dgx-h100"), "h0/gpu0", "h0/nvswitch0")
1.0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from treecoll.topo import Topology

__all__ = [
    "link_factor",
    "net_efficiency",
    "SHM_BW_FACTOR",
    "NET_EFFICIENCY",
    "NET_CHANNEL_BW",
    "NIC_CHANNELS",
    "host_buffer",
    "gpu_direct",
]

#: The fraction of a PCIe link into a CPU's root complex NCCL's traffic gets through host memory
#: (:func:`link_factor`): its SHM transport between two GPUs of a host that do not talk P2P, and
#: network buffers staged in host memory without GPUDirect RDMA. The sender's GPU writes into host memory and the
#: receiver's GPU reads it back (src/transport/shm.cc; buffers on the receiver's side by default,
#: NCCL_SHM_LOCALITY=2), so on a ring every GPU's link carries writes out and reads in at once
#: through the CPU's root complex; NCCL's maintainers note that CPUs handle such bidirectional
#: traffic poorly (NVIDIA/nccl#384: 3.2-3.9 GB/s for allreduce over SHM on PCIe Gen3 x16 against
#: 10.3 for one-way broadcast) and quote 9 or 6 GB/s through SHM against 12 GB/s within a PCIe
#: switch (NVIDIA/nccl#406). NCCL's tuner has no such factor. The value was chosen from the fit table
#: rtx5090-4gpu-1node-allreduce-pcie (NVIDIA/nccl-tests#287): 27.26 GB/s busbw at 128 MiB over PCIe Gen5 paths
#: of 48 GB/s.
SHM_BW_FACTOR = 0.57
#: The fraction of a NIC's line rate NCCL reaches over a fabric, by the NICs' ``link_layer`` (fabrics
#: not listed: 1; NVIDIA quotes 46-48 GB/s per NDR InfiniBand NIC, NVIDIA/nccl-tests#290, which the
#: 48 GB/s PCIe Gen5 path to the NIC already bounds). Socket 0.65: NCCL's TCP socket transport (staged
#: through host memory, one flow per socket at the speed of the slowest, NVIDIA/nccl-tests#83), chosen
#: from the fit table l40s-2gpu-2node-allreduce-pcie (8.11 GB/s busbw at 8 GiB over one 100 Gb/s
#: interface of 12.5 GB/s); users report less than half of 100 Gb/s TCP untuned (NVIDIA/nccl#450).
NET_EFFICIENCY = {"Socket": 0.65}
#: GB/s one NCCL channel (one connection) moves through a NIC, by the NICs' ``link_layer`` (fabrics not
#: listed: no limit but the NIC's). NCCL's rings and trees run :data:`NIC_CHANNELS` channels per NIC
#: (the simulator holds its point-to-point operations to as many), so they reach at most that many
#: times this per NIC; NVLSTree's 24 to 32 channels (src/transport/nvls.cc) spread
#: over more connections and are not held to it. RoCE 16: chosen from the fit table
#: h200-2gpu-2node-allreduce-gke-mpioperator (Google Cloud, gIB NCCL plugin: 31.89 GB/s busbw at 8 GiB
#: on the 2-rank ring through one 400 Gb/s NIC, two channels); a per-connection limit far below line
#: rate on RoCE whose perftest reaches line rate is also reported in NVIDIA/nccl#2409 (231 GB/s
#: allreduce busbw on 2 x 8 H100 over 8x 400G RoCEv2; sendrecv 13.1 GB/s on one rail). A RoCE machine
#: should be calibrated.
NET_CHANNEL_BW = {"RoCE": 16.0}
#: channels NCCL's ring and tree run per NIC: its search puts one channel on each NIC and
#: ncclTopoDupChannels doubles them where a channel's speed is 25 GB/s or more (src/graph/search.cc)
NIC_CHANNELS = 2


def link_factor(topology: Topology, a: str, b: str, nic_channels: int | None = NIC_CHANNELS) -> float:
    """The fraction of link ``a`` -> ``b``'s bandwidth NCCL's transports deliver over it, beyond the
    protocol's efficiency (the simulator's links, :class:`~treecoll.collectives.sim.engine.Network`,
    carry it; NCCL's own tuner,
    :func:`~treecoll.collectives.sim.nccl_model.nccl_predict`, does not): a NIC's link to the network at its
    fabric's :func:`net_efficiency`, and at most ``nic_channels`` x its fabric's :data:`NET_CHANNEL_BW`
    (None: no channel limit, NVLSTree's many channels); a PCIe link into a CPU's root complex at :data:`SHM_BW_FACTOR`,
    since NCCL moves data across the root complex through host memory (its SHM transport between
    GPUs beyond the default P2P level PXB, src/graph/paths.cc ``ncclTopoCheckP2p``; staged network
    buffers beyond the GPUDirect RDMA level PXB, ``ncclTopoCheckGdr``), except on a CPU with an
    NVLink-C2C GPU (Grace: GPUDirect RDMA through C2C, NCCL_NET_GDR_C2C, the default since 2.27);
    every other link 1, a NIC's own link into the root complex too: a NIC reads and writes host memory
    at its line rate (the fit table h200-2gpu-2node-allreduce-gke-mpioperator, whose NIC is on no GPU's
    PCIe switch and stages the network through host memory, moves 31.89 GB/s at 8 GiB, above the 27.36
    GB/s SHM_BW_FACTOR leaves of its PCIe Gen5 link).

    >>> from treecoll import topo
    >>> t = topo.resolve("pcie-8gpu")
    >>> link_factor(t, "h0/pcisw0", "h0/cpu0"), link_factor(t, "h0/gpu0", "h0/pcisw0")
    (0.57, 1.0)
    >>> g = topo.resolve("gb200-nvl72")      # Grace: the NIC's PCIe link carries GPUDirect RDMA
    >>> link_factor(g, "tray0/cpu0", "tray0/nic0")
    1.0
    >>> from treecoll.topo.machines import MachineFlags, Nic, machine_topology
    >>> r, _ = machine_topology(MachineFlags(hosts=2, gpus_per_host=1, gpu="H200", nic=Nic(1, 400.0, "roce")))
    >>> up = next(v for v in r.graph["h0/nic0"] if r.graph.nodes[v]["kind"] != "gpu" and "h0/" not in v)
    >>> link_factor(r, "h0/nic0", up), link_factor(r, "h0/nic0", up, None)   # 2 x 16 of 50 GB/s; NVLSTree
    (0.64, 1.0)
    """
    g = topology.graph
    kind = g.edges[a, b].get("kind")
    if kind == "net":
        nic = a if g.nodes[a].get("kind") == "nic" else b
        if g.nodes[nic].get("kind") != "nic":
            return 1.0
        eff = net_efficiency(g.nodes[nic])
        per = NET_CHANNEL_BW.get(str(g.nodes[nic].get("link_layer") or ""))
        bw = float(g.edges[a, b].get("bw") or 0.0)
        if per is not None and nic_channels is not None and bw > 0:
            eff = min(eff, nic_channels * per / bw)
        return eff
    cpu = a if g.nodes[a].get("kind") == "cpu" else b if g.nodes[b].get("kind") == "cpu" else None
    if kind != "pcie" or cpu is None or g.nodes[b if cpu == a else a].get("kind") == "nic":
        return 1.0
    return 1.0 if any(d.get("kind") == "c2c" for d in g[cpu].values()) else SHM_BW_FACTOR


def net_efficiency(nic: Mapping[str, Any]) -> float:
    """The fraction of a NIC's line rate NCCL's network transport delivers over its fabric
    (:data:`NET_EFFICIENCY` by the NIC's ``link_layer``; 1 for fabrics it does not list).

    >>> net_efficiency({"link_layer": "Socket"}), net_efficiency({"link_layer": "InfiniBand"})
    (0.65, 1.0)
    """
    return NET_EFFICIENCY.get(str(nic.get("link_layer") or ""), 1.0)


def host_buffer(topology: Topology, gpu: str) -> str | None:
    """The CPU whose memory holds ``gpu``'s network buffers in host memory: its host's CPU on the GPU's
    NUMA node (NCCL's proxy thread, which allocates them, runs on the GPU's CPU cores), else the CPU
    nearest to it; None on a host without a CPU node, or on a CPU with an NVLink-C2C GPU (Grace: host
    memory at NVLink-C2C speed, no PCIe crossing to model).

    >>> from treecoll import topo
    >>> t = topo.resolve("dgx-h100")
    >>> host_buffer(t, "h0/gpu1"), host_buffer(t, "h0/gpu6")
    ('h0/cpu0', 'h0/cpu1')
    """
    g = topology.graph
    node = g.nodes[gpu]
    cpus = topology.nodes("cpu", node.get("host"))
    if not cpus:
        return None
    same = [c for c in cpus if g.nodes[c].get("numa") == node.get("numa")]
    cpu = same[0] if same else min(cpus, key=lambda c: len(topology.path(gpu, c).nodes))
    if any(d.get("kind") == "c2c" for d in g[cpu].values()):
        return None
    return cpu


def gpu_direct(topology: Topology, gpu: str, nic: str) -> bool:
    """Whether NCCL runs GPUDirect RDMA between ``gpu`` and the ``nic`` it uses: their path's NCCL class
    within the default GDR level (:func:`treecoll.topo.env.gdr`: PXB, or P2C through NVLink-C2C;
    NVIDIA/nccl src/graph/paths.cc ``ncclTopoCheckGdr``). A PXN path (the GPU reaching the NIC through a
    GPU beside it over NVLink) counts as that GPU's path, which NCCL picks within PXB of the NIC. Without
    it NCCL's net transport keeps every protocol's buffers in host memory, on the sending and on the
    receiving side (src/transport/net.cc ``sendProxyConnect``, ``recvProxyConnect``).

    >>> from treecoll.topo.machines import MachineFlags, Nic, machine_topology
    >>> f = dict(hosts=2, gpus_per_host=1, gpu="H200", nic=Nic(1, 400.0, "roce"))
    >>> a, _ = machine_topology(MachineFlags(**f))
    >>> u, _ = machine_topology(MachineFlags(**f, gpu_nic="unaligned"))
    >>> gpu_direct(a, "h0/gpu0", "h0/nic0"), gpu_direct(u, "h0/gpu0", "h0/nic0")
    (True, False)
    """
    from treecoll.topo.env import gdr

    cls = topology.path(gpu, nic).nccl
    return cls == "PXN" or gdr(cls)
