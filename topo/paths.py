"""Routes between two endpoints of a :class:`~topo.model.Topology` and their classes.

A route is chosen the way NCCL chooses (``ncclTopoSetPaths`` in src/graph/paths.cc and the path
types of src/include/graph.h, NCCL 2.30.7): the best path class first (NVLink before
PCIe before the SMP interconnect before the network), then bandwidth, then
hops. Classes:

* NCCL path class (strings, never NCCL's version-dependent integers):
  ``LOC`` (same node), ``NVL`` (NVLink, directly or through NVSwitches),
  ``NVB`` (NVLink through an intermediate GPU), ``C2C``, ``PIX`` (at most one
  PCIe switch), ``PXB`` (several PCIe switches, no host bridge), ``P2C`` (C2C
  then PCIe), ``PHB`` (through a CPU's host bridge), ``SYS`` (across the SMP
  interconnect between NUMA domains), ``NET`` (between hosts over the network).
* nvidia-smi code (``nvidia-smi topo -m``): ``X``, ``NV#`` (direct bonded
  NVLinks or through NVSwitches, # = the links of the source GPU on that
  route), ``PIX``, ``PXB``, ``PHB``, ``NODE`` (through two host bridges of one
  NUMA domain), ``SYS`` (across the SMP interconnect, or between two
  ``quadrant`` s of one NUMA domain, see below); ``None`` between hosts
  (nvidia-smi shows one host).

  nvidia-smi also says ``SYS`` between devices of one NUMA domain whose PCIe
  root complexes are far apart inside the processor: with several root
  complexes in one socket, "connections between devices may effectively flow
  over a 'SMP' connection, which is the tool's way of saying that it is flowing
  from one root complex to another root complex" (NVIDIA's answer on
  https://forums.developer.nvidia.com/t/strange-output-by-nvidia-smi-topo/68452,
  a one-socket Skylake host). AMD EPYC 7002/7003 packages are divided into four
  I/O-die quadrants, and in the default NPS1 mode the whole socket is one NUMA
  domain (Dell, "NUMA Configuration settings on AMD EPYC 2nd Generation",
  https://infohub.delltechnologies.com/en-us/p/numa-configuration-settings-on-amd-epyc-2nd-generation/).
  Real matrices show it: the four GPUs of each NUMA node of an 8x RTX 4090 box
  are all SYS apart (https://github.com/NVIDIA/go-gpuallocator/issues/17). The
  model says which root complexes are apart with the ``quadrant`` of the top
  PCIe switches (host bridges): two branches that meet at a CPU through
  different quadrants are ``SYS`` (NCCL, which only knows NUMA domains, still
  says ``PHB``).
  Unlike NCCL, nvidia-smi never reports NVB: it shows the PCIe class instead.

NVSwitch fabrics keep each switch as a node (an H100 reaches its 4 switches
with 5/5/4/4 links); a GPU-to-GPU route through them is the set of parallel
one-switch routes, listed in :attr:`Path.routes` with the share of the traffic
each carries (proportional to its bottleneck bandwidth), and :attr:`Path.bw`
is their sum. Between hosts, a GPU uses its nearest NIC (NCCL's default) and
the network route is a shortest route through the switches, with ties between
equal-cost switches broken by a hash of the two NICs (deterministic ECMP).
A topology's :class:`~treecoll.topo.routes.RouteTable` (``Topology.routes``)
finds the routes and keeps them.

>>> from treecoll import topo
>>> t = topo.default()                      # two DGX H100 on a rail-optimized fabric
>>> p = t.path("h0/gpu0", "h0/nic0")        # the NIC behind the GPU's own PCIe switch
>>> p.nodes, p.nccl, p.smi
(('h0/gpu0', 'h0/pcisw0', 'h0/nic0'), 'PIX', 'PIX')
>>> p = t.path("h0/gpu0", "h0/gpu1")        # 5 + 5 + 4 + 4 NVLinks of 20.6 GB/s over four NVSwitches
>>> p.smi, len(p.routes), round(p.bw, 1)
('NV18', 4, 370.8)
>>> q = t.path("h0/gpu0", "h1/gpu0")
>>> q.nccl, q.smi, q.nodes[3], t.nearest_nic("h0/gpu3")
('NET', None, 'rail0/leaf0', 'h0/nic3')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Path", "NCCL_CLASSES", "SMI_CODES", "LOC_BW"]

#: NCCL path classes from best to worst (src/include/graph.h, NCCL 2.30)
NCCL_CLASSES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS")
SMI_CODES = ("X", "NV#", "PIX", "PXB", "PHB", "NODE", "SYS")
#: bandwidth of a node to itself, GB/s: NCCL's LOC_BW (src/graph/topo.h)
LOC_BW = 5000.0


@dataclass(frozen=True)
class Path:
    """A route between two endpoints.

    Attributes
    ----------
    src, dst: endpoint node ids.
    nodes: the primary route, ``src`` ... ``dst``.
    kinds: link kind of each hop of ``nodes`` (len = hops).
    bw: bottleneck bandwidth in GB/s per direction; over parallel NVSwitch
        routes, the sum of their bottlenecks.
    lat: summed link latency of the primary route, µs.
    nccl: NCCL path class (see module doc).
    smi: nvidia-smi code, or None between hosts.
    routes: ``((nodes, share), ...)`` parallel routes and the fraction of the
        traffic each carries (shares sum to 1); one route for most paths.
    """

    src: str
    dst: str
    nodes: tuple[str, ...]
    kinds: tuple[str, ...]
    bw: float
    lat: float
    nccl: str
    smi: str | None
    routes: tuple[tuple[tuple[str, ...], float], ...]

    @property
    def hops(self) -> int:
        """Number of links on the primary route."""
        return len(self.nodes) - 1

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "src": self.src,
            "dst": self.dst,
            "nodes": list(self.nodes),
            "kinds": list(self.kinds),
            "hops": self.hops,
            "bw_GBps": self.bw,
            "lat_us": self.lat,
            "nccl": self.nccl,
            "smi": self.smi,
            "routes": [[list(n), s] for n, s in self.routes],
        }
