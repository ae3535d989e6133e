"""Multi-host assembly: ``topo.discover_cluster(group)`` over torch.distributed.

Protocol (two ``all_gather_object`` calls, so every rank ends with the same data):

1. every rank sends ``(host identity, its GPU's UUID / CUDA ordinal or None)``;
   hosts are ordered by their lowest rank and named ``h0, h1, ...``;
2. the lowest rank of each host (its elected prober) runs :func:`treecoll.topo.discover`
   once for the host (a CPU-only host gets one rank slot per process of the
   group on it) and sends the explicit form; the others send None.

Warnings of a probe (a host without NVML, ...) are logged once, by rank 0: the
other probers hold theirs back and send them with their probe, and rank 0 logs
them naming the host, so a job of many hosts prints each host's notice once.

Every rank then builds the same graph from the same gathered data (no rank-local
input enters it), so the result, and its fingerprint, are identical on every
rank; :func:`discover_cluster` checks this with a third gather of fingerprints
and raises :class:`~topo.errors.DiscoveryError` naming the ranks that differ.

Host identity is NCCL's (src/misc/utils.cc): ``NCCL_HOSTID``, else the host
name plus ``/proc/sys/kernel/random/boot_id``. ``TREECOLL_HOST_ID`` overrides
both (documented for tests: four processes on one machine pretend to be two
hosts with ``TREECOLL_HOST_ID=a`` / ``b``).

Ranks map to GPUs by the GPU each rank reports (the UUID of
``torch.cuda.current_device()`` when CUDA is initialised, so per-rank
CUDA_VISIBLE_DEVICES does not confuse it), else in order: the k-th rank of a
host gets the host's k-th visible GPU (or rank slot).

The network between hosts, first that applies:

* ``network=``: a YAML network section (``{"type": "rail_optimized", ...}``,
  :mod:`treecoll.topo.network`); NICs without a rail get their host-local order as rail;
* every host reported ``SLURM_TOPOLOGY_ADDR``: a tree of its switches (the
  last switch of a path is the host's leaf, tier 0; upper switches tier 1, 2...;
  each uplink carries the sum of the NIC bandwidth below it: non-blocking);
* else one switch ``leaf0``, each NIC at its own speed.

A host without a NIC gets one ``assumed`` socket NIC (NCCL's default 10 Gb/s)
so that it is reachable.

>>> host_identity({"TREECOLL_HOST_ID": "a", "NCCL_HOSTID": "b"}), host_identity({"NCCL_HOSTID": "b"})
('a', 'b')
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator, Mapping
from typing import Any

import networkx as nx

from .env import HOST_ID_VAR
from .env import hints as parse_hints
from .errors import DiscoveryError, MissingDependency
from .hostgraph import LAT, net_bw
from .model import Topology

__all__ = ["host_identity", "discover_cluster", "assemble"]

log = logging.getLogger("treecoll.topo")


@contextlib.contextmanager
def _held_warnings(hold: bool) -> Iterator[list[str]]:
    """With ``hold``, keep the ``treecoll.topo`` logger's records of the block out of the
    logs and yield their messages instead (a list filled as they come)."""
    held: list[str] = []

    def keep(record: logging.LogRecord) -> bool:
        held.append(record.getMessage())
        return False

    if hold:
        log.addFilter(keep)
    try:
        yield held
    finally:
        if hold:
            log.removeFilter(keep)


def host_identity(env: Mapping[str, str] | None = None) -> str:
    """This host's identity: TREECOLL_HOST_ID, else NCCL_HOSTID, else hostname + boot id."""
    env = os.environ if env is None else env
    for var in (HOST_ID_VAR, "NCCL_HOSTID"):
        if env.get(var):
            return env[var]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return socket.gethostname() + boot


def _local_device() -> str | int | None:
    """This rank's GPU: its UUID (``"GPU-..."``, survives per-rank CUDA_VISIBLE_DEVICES),
    else its CUDA ordinal; None without an initialised CUDA context."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            dev = int(torch.cuda.current_device())
            uuid = getattr(torch.cuda.get_device_properties(dev), "uuid", None)
            return f"GPU-{uuid}" if uuid is not None else dev
    except Exception:
        return None
    return None


def discover_cluster(
    group: Any = None,
    *,
    network: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    discover_kwargs: Mapping[str, Any] | None = None,
    check: bool = True,
) -> Topology:
    """The cluster of ``group`` (default: the world), identical on every rank.

    Collective: every rank of the group must call it. ``discover_kwargs`` go to
    :func:`treecoll.topo.discover` on the probing ranks (``sysfs_root``, ``nvml``).
    """
    try:
        import torch.distributed as dist
    except ImportError:
        raise MissingDependency("torch", "topo.discover_cluster") from None
    if not dist.is_available() or not dist.is_initialized():
        raise DiscoveryError(
            "discover_cluster: expected an initialised torch.distributed process group, got none; "
            "call torch.distributed.init_process_group first"
        )
    env = dict(os.environ if env is None else env)
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    mine = (host_identity(env), _local_device())
    ids: list[Any] = [None] * world
    dist.all_gather_object(ids, mine, group=group)
    order = list(dict.fromkeys(i for i, _ in ids))  # hosts by lowest rank
    leader = {h: min(r for r in range(world) if ids[r][0] == h) for h in order}
    probe = None
    if leader[mine[0]] == rank:
        from .discover import discover

        hname = f"h{order.index(mine[0])}"
        e = dict(env)
        e["LOCAL_WORLD_SIZE"] = str(sum(1 for i, _ in ids if i == mine[0]))
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK"):
            e.pop(k, None)  # the probe describes the host, not this rank
        try:
            h = parse_hints(env)
            with _held_warnings(rank != 0) as held:
                t = discover(env=e, host=hname, **dict(discover_kwargs or {}))
            probe = {
                "topology": t.to_dict(),
                "identity": mine[0],
                "hostname": socket.gethostname(),
                "topology_addr": list(h.topology_addr) if h.topology_addr else None,
                "warnings": held,
            }
        except Exception as exc:  # every rank must reach the gather, then all raise together
            probe = {"error": f"{type(exc).__name__}: {exc}"}
    probes: list[Any] = [None] * world
    dist.all_gather_object(probes, probe, group=group)
    failed = [(r, p["error"]) for r, p in enumerate(probes) if p and "error" in p]
    if failed:
        r, err = failed[0]
        raise DiscoveryError(f"discover_cluster: rank {r} (probe of host h{order.index(ids[r][0])}) failed: {err}")
    if rank == 0:
        for i, h in enumerate(order):
            for message in probes[leader[h]].get("warnings", []) if leader[h] != 0 else []:
                log.warning("%s (host h%d, probed by rank %d)", message, i, leader[h])
    topo = assemble([probes[leader[h]] for h in order], [(order.index(i), dev) for i, dev in ids], network=network)
    if check:
        prints: list[Any] = [None] * world
        dist.all_gather_object(prints, topo.fingerprint(), group=group)
        bad = [r for r in range(world) if prints[r] != prints[0]]
        if bad:
            raise DiscoveryError(
                f"discover_cluster: expected the same topology on every rank, ranks {bad} "
                f"differ from rank 0 ({prints[0]})"
            )
    return topo


def assemble(
    probes: list[Mapping[str, Any]], ranks: list[tuple[int, Any]], network: Mapping[str, Any] | None = None
) -> Topology:
    """Pure assembly: per host (in order) its probe, per rank ``(host index, GPU UUID | CUDA ordinal | None)``.

    ``probes[i]["topology"]`` is the explicit form of host ``h<i>``. Rack-level
    NVLink switches (``nvl/sw<k>``, no host) are shared by the hosts of one
    NVLink domain (equal fabric cluster UUID and clique id): cross-host NVLink;
    with several domains they become ``nvl<d>/sw<k>``.
    """
    g = nx.DiGraph()
    tops = [Topology.from_dict(p["topology"]) for p in probes]
    domains = sorted(
        {_domain(d) for t in tops for _, d in t.graph.nodes(data=True) if d["kind"] == "nvswitch" and "host" not in d},
        key=str,
    )
    for t in tops:
        if len(domains) > 1:  # several NVLink domains (racks, cliques): nvl<d>/sw<k>, as the YAML names them
            t = Topology(
                nx.relabel_nodes(
                    nx.DiGraph(t.graph),
                    {
                        n: f"nvl{domains.index(_domain(d))}/{n.split('/', 1)[1]}"
                        for n, d in t.graph.nodes(data=True)
                        if d["kind"] == "nvswitch" and "host" not in d
                    },
                ),
                name=t.name,
            )
        for n, d in t.graph.nodes(data=True):
            if n in g:  # rack-level NVLink switches (nvl/sw<k>) are shared by the hosts of a domain
                continue
            g.add_node(n, **{k: v for k, v in d.items() if k != "rank"})
        for a, b, d in t.graph.edges(data=True):
            g.add_edge(a, b, **d)
    hosts = [f"h{i}" for i in range(len(probes))]
    _ranks(g, hosts, ranks)
    host_nics = _ensure_nics(g, hosts)
    addrs = [p.get("topology_addr") for p in probes]
    if network is not None:
        import yaml

        from ._schema import Doc
        from .network import add_network

        add_network(
            Doc("<network>", yaml.safe_dump(dict(network)), dict(network)), dict(network), ("network",), g, host_nics
        )
        how = f"network section {dict(network).get('type')}"
    elif all(addrs) and len(hosts) > 1:
        _slurm_tree(g, host_nics, addrs)
        how = "SLURM_TOPOLOGY_ADDR switch paths"
    elif len(hosts) > 1:
        g.add_node("leaf0", kind="net_switch", tier=0)
        for _, ns in host_nics:
            for nic, _, bw in ns:
                _bi(g, nic, "leaf0", bw)
        how = "one switch at the NICs' speed"
    else:
        how = "single host"
    meta = {
        "source": "discover_cluster",
        "network": how,
        "hosts": [
            {
                "name": h,
                "identity": p.get("identity"),
                "hostname": p.get("hostname"),
                "notes": (p["topology"].get("meta") or {}).get("notes", []),
            }
            for h, p in zip(hosts, probes)
        ],
    }
    return Topology(g, name="cluster", meta=meta)


def _domain(d: Mapping[str, Any]) -> tuple:
    return (d.get("x_cluster_uuid"), d.get("x_clique"))


def _ranks(g: nx.DiGraph, hosts: list[str], ranks: list[tuple[int, Any]]) -> None:
    """Give each rank its GPU: by reported UUID, else CUDA ordinal (``x_cuda``), else the
    host's next free GPU (visible ones first, in CUDA order)."""
    per_host: dict[int, list[int]] = {}
    for r, (hi, _) in enumerate(ranks):
        per_host.setdefault(hi, []).append(r)
    for hi, rs in per_host.items():
        gpus = sorted(
            (n for n, d in g.nodes(data=True) if d["kind"] == "gpu" and d.get("host") == hosts[hi]),
            key=lambda n: (g.nodes[n].get("x_cuda") is None, g.nodes[n].get("x_cuda") or 0, g.nodes[n].get("index", 0)),
        )
        by_dev = {g.nodes[n]["x_cuda"]: n for n in gpus if g.nodes[n].get("x_cuda") is not None}
        by_dev.update({g.nodes[n]["uuid"]: n for n in gpus if g.nodes[n].get("uuid")})
        free = list(gpus)
        for r in rs:
            dev = ranks[r][1]
            n = by_dev.get(dev) if dev is not None else None
            if n is None or n not in free:
                if not free:
                    raise DiscoveryError(
                        f"rank {r}: host {hosts[hi]} has {len(gpus)} GPUs for {len(rs)} ranks; "
                        "expected at most one rank per GPU"
                    )
                n = free[0]
            free.remove(n)
            g.nodes[n]["rank"] = r


def _ensure_nics(g: nx.DiGraph, hosts: list[str]) -> list[tuple[str, list[tuple[str, int, float]]]]:
    out = []
    for h in hosts:
        nics = sorted(
            (n for n, d in g.nodes(data=True) if d["kind"] == "nic" and d.get("host") == h),
            key=lambda n: int(n.rsplit("nic", 1)[-1]) if n.rsplit("nic", 1)[-1].isdigit() else 0,
        )
        if not nics:
            cpus = sorted(
                (n for n, d in g.nodes(data=True) if d["kind"] == "cpu" and d.get("host") == h),
                key=lambda n: g.nodes[n].get("numa", 0),
            )
            nic = f"{h}/nic0"
            g.add_node(nic, kind="nic", host=h, name="socket", bw=net_bw(0), x_assumed=True)
            for a, b in ((nic, cpus[0]), (cpus[0], nic)):
                g.add_edge(a, b, kind="pcie", bw=12.0, lat=LAT["pcie"], count=1)
            nics = [nic]
        if not any(g.nodes[n].get("rail") is not None for n in nics):
            for k, n in enumerate(nics):  # no compute-fabric NIC identified: every NIC is a rail
                g.nodes[n]["rail"] = k
        ns = [
            (n, g.nodes[n]["rail"], g.nodes[n].get("bw", net_bw(0))) for n in nics if g.nodes[n].get("rail") is not None
        ]  # storage/management NICs stay off the fabric
        out.append((h, ns))
    return out


def _bi(g: nx.DiGraph, a: str, b: str, bw: float) -> None:
    d = {"kind": "net", "bw": float(bw), "lat": LAT["net"], "count": 1}
    g.add_edge(a, b, **d)
    g.add_edge(b, a, **dict(d))


def _slurm_tree(g: nx.DiGraph, host_nics: list, addrs: list[list[str]]) -> None:
    """Switch tree from SLURM_TOPOLOGY_ADDR paths (top switch first)."""
    depth = max(len(a) for a in addrs)
    names: dict[str, str] = {}
    by_tier: dict[int, list[str]] = {}
    for a in addrs:
        for pos, sw in enumerate(a):
            tier = len(a) - 1 - pos
            if sw not in names:
                by_tier.setdefault(tier, []).append(sw)
                names[sw] = ""
    prefix = {0: "leaf", 1: "spine"}
    for tier, sws in by_tier.items():
        for k, sw in enumerate(sorted(sws)):
            names[sw] = f"{prefix.get(tier, 'core')}{k}" if tier < 2 or depth <= 3 else f"core{tier - 2}_{k}"
            g.add_node(names[sw], kind="net_switch", tier=tier, name=sw)
    below: dict[tuple[str, str], float] = {}
    for (_, ns), a in zip(host_nics, addrs):
        for nic, _, bw in ns:
            _bi(g, nic, names[a[-1]], bw)
            for lo, hi in zip(a[1:][::-1], a[:-1][::-1]):
                below[(names[lo], names[hi])] = below.get((names[lo], names[hi]), 0.0) + bw
    for (lo, hi), bw in below.items():
        _bi(g, lo, hi, bw)
