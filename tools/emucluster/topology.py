"""The Topology of an emulated cluster, and rank placement.

Each host ``h<i>`` is a CPU-only host: one NUMA domain ``h<i>/cpu0``, its ranks
as processes ``h<i>/p<j>`` (node kind ``gpu``: "a process that acts as a rank",
see topo.model; ``mem_bw`` = :data:`PROCESS_MEM_BW`, what one CPU thread reduces), and one NIC
``h<i>/nic0`` plugged into the switch ``sw0``.

Links (bw in GB/s per direction, lat in µs):

* ``h<i>/p<j> - h<i>/cpu0`` (kind ``pcie``): loopback, i.e. a memory copy
  through the kernel's TCP stack. Default bw :data:`LOOPBACK_GBS`.
* ``h<i>/cpu0 - h<i>/nic0`` (``pcie``): never the bottleneck, bw = loopback.
* ``h<i>/nic0 - sw0`` (``net``): the shaped uplink. bw is the *payload* rate:
  tbf counts whole Ethernet frames, and TCP over IPv4 with timestamps carries
  1448 payload bytes in a 1514-byte frame at MTU 1500, so
  ``bw = rate / 8 / 1e9 * 1448 / 1514`` (measured: a 1gbit link moves
  0.958 Gbit/s of payload, the formula gives 0.956).
* ``--host-rate H=RATE`` shapes host H's uplink at RATE, but its link here keeps
  the cluster's rate: the fault is one the model does not know (a NIC that
  trained at a lower speed), listed under ``meta.host_rates`` for the record,
  for ``treecoll topo probe`` to find.
* ``--pair-rate A-B`` adds ``h<A>/nic0 - h<B>/nic0`` (``net``) at that rate: the
  direct veth between the two hosts, which their traffic takes instead of the switch.

Latency defaults come from Python TCP ping-pongs on this machine (1 byte,
TCP_NODELAY, median of 200): 61-86 µs round trip both inside a namespace and
across the bridge, so the software stack dominates and the emulated wire
adds nothing measurable. Hence a same-host one-way of RTT/2 = 2 hops x
:data:`LOOPBACK_LAT_US`, and ``net`` hops of 0 µs. ``treecoll emu up --measure``
replaces these defaults with numbers measured on the spot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .netns import EmuClusterError

if TYPE_CHECKING:
    from treecoll.topo.model import Topology

__all__ = [
    "PLACEMENTS",
    "placement",
    "build_topology",
    "payload_gbs",
    "save_topology",
    "LOOPBACK_GBS",
    "LOOPBACK_LAT_US",
    "NET_LAT_US",
    "PROCESS_MEM_BW",
]

#: loopback TCP throughput inside one namespace, GB/s: one stream, 256 MiB,
#: measured 2.2 / 3.8 / 4.4 GB/s on this 2-core VM (tools.emucluster.measure); the median.
LOOPBACK_GBS = 3.8
#: per p-cpu hop, µs: a quarter of the ~70 µs loopback ping-pong RTT measured here.
LOOPBACK_LAT_US = 17.0
#: per net hop, µs: bridge and veth add no measurable latency over loopback (see module doc).
NET_LAT_US = 0.0
#: effective memory bandwidth of one rank's reduction, GB/s (the simulator charges a reduce
#: 3 x bytes / mem_bw): torch ``x.add_(y)`` on float32 with one thread on this VM moved
#: 3 x bytes at 97 GB/s (1 MiB, in cache), 44 GB/s (16 MiB) and 20 GB/s (64 MiB); the last.
PROCESS_MEM_BW = 20.0
#: payload fraction of a tbf-shaped TCP/IPv4 stream at MTU 1500 with TCP timestamps
PAYLOAD_FRACTION = 1448 / 1514
PLACEMENTS = ("blocked", "interleaved")


def placement(hosts: int, ranks_per_host: int, mode: str = "blocked") -> list[tuple[int, int]]:
    """``out[rank] = (host, local_rank)``.

    blocked puts consecutive ranks on one host, interleaved deals them round robin:

    >>> placement(2, 2, "blocked"), placement(2, 2, "interleaved")
    ([(0, 0), (0, 1), (1, 0), (1, 1)], [(0, 0), (1, 0), (0, 1), (1, 1)])
    """
    if mode not in PLACEMENTS:
        raise EmuClusterError(f"--placement: expected one of {list(PLACEMENTS)}, got {mode!r}")
    if not isinstance(ranks_per_host, int) or ranks_per_host < 1:
        raise EmuClusterError(f"--ranks-per-host: expected a positive integer, got {ranks_per_host!r}")
    n = hosts * ranks_per_host
    if mode == "blocked":
        return [(r // ranks_per_host, r % ranks_per_host) for r in range(n)]
    return [(r % hosts, r // hosts) for r in range(n)]


def payload_gbs(rate_bps: int) -> float:
    """Payload GB/s of a link shaped at ``rate_bps`` bits/s (see module doc)."""
    return rate_bps / 8 / 1e9 * PAYLOAD_FRACTION


def build_topology(
    hosts: int,
    ranks_per_host: int,
    rate_bps: int,
    *,
    pair_rates: Mapping[tuple[int, int], int] | None = None,
    host_rates: Mapping[int, int] | None = None,
    placement_mode: str = "blocked",
    name: str | None = None,
    loopback_gbs: float = LOOPBACK_GBS,
    loopback_lat_us: float = LOOPBACK_LAT_US,
    net_lat_us: float = NET_LAT_US,
    process_mem_bw: float = PROCESS_MEM_BW,
    meta: Mapping[str, Any] | None = None,
) -> Topology:
    """The :class:`topo.Topology` of an emulated cluster with ranks mapped by ``placement_mode``.

    ``host_rates`` ({host: bits/s}) are recorded in ``meta`` only: the links keep ``rate_bps``
    (see the module doc)."""
    from treecoll.topo.model import Topology

    place = placement(hosts, ranks_per_host, placement_mode)
    rank_of = {hl: r for r, hl in enumerate(place)}
    nodes: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    nic_bw = round(payload_gbs(rate_bps), 6)
    for h in range(hosts):
        hn = f"h{h}"
        nodes.append({"id": f"{hn}/cpu0", "kind": "cpu", "host": hn, "numa": 0})
        for j in range(ranks_per_host):
            nodes.append(
                {
                    "id": f"{hn}/p{j}",
                    "kind": "gpu",
                    "host": hn,
                    "index": j,
                    "model": "cpu-process",
                    "mem_bw": process_mem_bw,
                    "rank": rank_of[(h, j)],
                }
            )
            links.append(
                {"a": f"{hn}/p{j}", "b": f"{hn}/cpu0", "kind": "pcie", "bw": loopback_gbs, "lat": loopback_lat_us}
            )
        nodes.append({"id": f"{hn}/nic0", "kind": "nic", "host": hn, "bw": nic_bw, "name": "emu0"})
        links.append({"a": f"{hn}/cpu0", "b": f"{hn}/nic0", "kind": "pcie", "bw": loopback_gbs, "lat": 0.0})
        links.append({"a": f"{hn}/nic0", "b": "sw0", "kind": "net", "bw": nic_bw, "lat": net_lat_us})
    nodes.append({"id": "sw0", "kind": "net_switch", "tier": 0})
    for (a, b), r in sorted((pair_rates or {}).items()):
        links.append(
            {"a": f"h{a}/nic0", "b": f"h{b}/nic0", "kind": "net", "bw": round(payload_gbs(r), 6), "lat": net_lat_us}
        )
    info = {
        "source": "treecoll emu",
        "rate_bps": rate_bps,
        "placement": placement_mode,
        "ranks_per_host": ranks_per_host,
        "pair_rates": {f"{a}-{b}": r for (a, b), r in sorted((pair_rates or {}).items())},
        **({"host_rates": {str(h): r for h, r in sorted(host_rates.items())}} if host_rates else {}),
        **dict(meta or {}),
    }
    data = {"name": name or f"emu-{hosts}x{ranks_per_host}", "meta": info, "nodes": nodes, "links": links}
    return Topology.from_dict(data)


def save_topology(topology: Topology, path: str | Path) -> Path:
    """Write ``topology`` as YAML (explicit form). Uses ``treecoll.topo.yaml_io.save`` when it exists."""
    path = Path(path)
    try:
        from treecoll.topo import yaml_io  # written by another part of the project

        save = getattr(yaml_io, "save", None)
    except ImportError:
        save = None
    if save is not None:
        save(topology, path)
        return path
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(topology.to_dict(), sort_keys=False, default_flow_style=None))
    return path


def ranks_of_hosts(place: Sequence[tuple[int, int]], hosts: int) -> list[list[int]]:
    """Ranks on each host, by local rank: ``out[h] = [ranks...]``."""
    out: list[list[int]] = [[] for _ in range(hosts)]
    for r, (h, _) in sorted(enumerate(place), key=lambda x: (x[1][0], x[1][1])):
        out[h].append(r)
    return out
