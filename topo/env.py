"""Environment variables that are topology hints: parsed once into a frozen :class:`Hints`.

Sources of the semantics: NCCL's env.rst (2.30) and source, the CUDA
Programming Guide (CUDA_VISIBLE_DEVICES), torchrun's, Slurm's and Open MPI's
documented variables (NCCL: docs/userguide/source/env.rst, rendered at
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html; CUDA:
https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html;
torchrun: https://pytorch.org/docs/stable/elastic/run.html#environment-variables; Open MPI:
https://docs.open-mpi.org/en/v5.0.x/tuning-apps/environment-var.html). Each variable's effect
on a Topology or on later tree building is in :data:`EFFECTS` (what
``treecoll topo hints`` prints). An invalid value raises
:class:`~topo.errors.TopologyError` naming the variable::

    NCCL_P2P_LEVEL='FAST': expected one of LOC, NVL, PIX, PXB, PHB, SYS or an integer 0..4

>>> h = hints({"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
...            "LOCAL_WORLD_SIZE": "4"})
>>> h.ib_hca.selects("mlx5_0", 1), h.ib_hca.selects("mlx5_10", 1), h.rank, h.launcher
(True, False, 3, 'torchrun')
>>> expand_hostlist("gpu[01-03,7],login")
('gpu01', 'gpu02', 'gpu03', 'gpu7', 'login')
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .errors import TopologyError

__all__ = [
    "Hints",
    "NameFilter",
    "hints",
    "hints_report",
    "expand_hostlist",
    "int_var",
    "EFFECTS",
    "HOST_ID_VAR",
    "PATH_LEVELS",
    "transport",
    "gdr",
]

#: the variable that overrides treecoll's host identity (tests: 4 processes pretending to be 2 hosts)
HOST_ID_VAR = "TREECOLL_HOST_ID"
#: NCCL path levels accepted by NCCL_P2P_LEVEL / NCCL_NET_GDR_LEVEL, and NCCL's legacy integers
PATH_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
_LEGACY = {0: "LOC", 1: "PIX", 2: "PXB", 3: "PHB", 4: "SYS"}

EFFECTS: dict[str, str] = {
    "NCCL_TOPO_FILE": "discovery imports this NCCL topology XML as the host's PCIe tree (NVML adds NVLinks it lacks)",
    "NCCL_GRAPH_FILE": "recorded; an NCCL_GRAPH_FILE can be imported as custom rings/trees "
    "(topo.nccl_xml.parse_graph_xml)",
    "NCCL_P2P_DISABLE": "GPU pairs never use P2P: every intra-host GPU pair talks through host memory "
    "(as level LOC; topo.env.transport)",
    "NCCL_P2P_LEVEL": "GPU pairs whose path class is beyond this level talk through host memory (SHM) instead "
    "of P2P (default PXB; topo.env.transport)",
    "NCCL_SHM_DISABLE": "no host-memory transport: GPU pairs without P2P talk through the network even inside "
    "a host (topo.env.transport)",
    "NCCL_IB_DISABLE": "InfiniBand/RoCE NICs are dropped from discovery; hosts talk over IP sockets NICs",
    "NCCL_IB_HCA": "only the selected verbs NICs/ports are kept (^ excludes, = exact names, :port selects a port); "
    "a :port:rail field sets the NIC's rail",
    "NCCL_SOCKET_IFNAME": "only the selected socket interfaces are kept as NICs (^ excludes, = exact names)",
    "NCCL_NET_GDR_LEVEL": "GPU-NIC pairs beyond this path class stage network traffic through host memory "
    "(default P2C; topo.env.gdr)",
    "NCCL_CROSS_NIC": "0: rings/trees keep each channel on one rail; 1: may cross NICs; 2 (default): prefer one rail",
    "NCCL_HOSTID": "host identity for multi-host assembly (replaces hostname + boot id, as in NCCL)",
    HOST_ID_VAR: "host identity for multi-host assembly; overrides NCCL_HOSTID "
    "(tests: fake several hosts on one machine)",
    "TREECOLL_MAX_NODES": "cap on the nodes of a topology read from a file (default 1,000,000; topo.limits)",
    "TREECOLL_MAX_LINKS": "cap on the directed links of a topology read from a file (default 4,000,000; topo.limits)",
    "CUDA_VISIBLE_DEVICES": "which GPUs (CUDA ordinals or GPU-UUIDs) this process sees; others get no rank",
    "CUDA_DEVICE_ORDER": "CUDA ordinal order: PCI_BUS_ID or FASTEST_FIRST (default)",
    "RANK": "torchrun: global rank of this process",
    "LOCAL_RANK": "torchrun: rank on this host",
    "WORLD_SIZE": "torchrun: number of ranks",
    "LOCAL_WORLD_SIZE": "torchrun: ranks per host (CPU-only rank slots)",
    "GROUP_RANK": "torchrun: index of this host's worker group (the node rank)",
    "SLURM_PROCID": "Slurm: global rank",
    "SLURM_LOCALID": "Slurm: rank on this node",
    "SLURM_NODEID": "Slurm: node index",
    "SLURM_NTASKS": "Slurm: number of ranks",
    "SLURM_JOB_NODELIST": "Slurm: host names of the job (bracket ranges expanded)",
    "SLURM_TOPOLOGY_ADDR": "Slurm: this node's switch path; multi-host assembly builds the network from these paths",
    "SLURM_TOPOLOGY_ADDR_PATTERN": "Slurm: which parts of SLURM_TOPOLOGY_ADDR are switches",
    "OMPI_COMM_WORLD_RANK": "Open MPI: global rank",
    "OMPI_COMM_WORLD_SIZE": "Open MPI: number of ranks",
    "OMPI_COMM_WORLD_LOCAL_RANK": "Open MPI: rank on this node",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "Open MPI: ranks on this node (CPU-only rank slots)",
}


@dataclass(frozen=True)
class NameFilter:
    """NCCL's device list syntax: ``[^][=]name[:port][,name[:port]...]``.

    ``exclude`` (``^``): listed devices are dropped; ``exact`` (``=``): names
    match exactly, else by prefix (``mlx5_1`` also matches ``mlx5_10``).
    """

    entries: tuple[tuple[str, int | None], ...]
    exclude: bool = False
    exact: bool = False
    rails: tuple[tuple[str, int], ...] = ()  # NCCL 2.30 ``name:port:rail``: (name, rail) when rail >= 0

    def rail_of(self, name: str) -> int | None:
        """The rail NCCL_IB_HCA assigns to device ``name`` (exact name), or None."""
        return next((r for n, r in self.rails if n == name), None)

    def selects(self, name: str, port: int | None = None) -> bool:
        hit = any(
            (name == n if self.exact else name.startswith(n)) and (p is None or port is None or p == port)
            for n, p in self.entries
        )
        return hit != self.exclude


@dataclass(frozen=True)
class Hints:
    """Parsed hints; None = not set. See :data:`EFFECTS` for what each changes."""

    topo_file: str | None = None
    graph_file: str | None = None
    p2p_level: str | None = None  # effective level (NCCL_P2P_DISABLE=1 -> "LOC")
    shm_disable: bool = False
    ib_disable: bool = False
    ib_hca: NameFilter | None = None
    socket_ifname: NameFilter | None = None
    net_gdr_level: str | None = None
    cross_nic: int | None = None
    host_id: str | None = None  # TREECOLL_HOST_ID, else NCCL_HOSTID
    cuda_visible_devices: tuple[str, ...] | None = None
    cuda_device_order: str | None = None
    launcher: str | None = None  # "torchrun" | "slurm" | "openmpi"
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    nodelist: tuple[str, ...] | None = None
    topology_addr: tuple[str, ...] | None = None  # switch names, top first (node name excluded)

    def __post_init__(self):
        for a, b in (("rank", "world_size"), ("local_rank", "local_world_size")):
            x, n = getattr(self, a), getattr(self, b)
            if x is not None and n is not None and not x < n:
                raise TopologyError(f"{a}={x}: expected less than {b}={n} (from the {self.launcher} variables)")

    def as_dict(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, NameFilter):
                v = {"entries": [list(e) for e in v.entries], "exclude": v.exclude, "exact": v.exact}
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out


def _bool(env: Mapping[str, str], name: str) -> bool:
    v = env.get(name)
    if v is None or v.strip() == "":
        return False
    try:
        return int(v) != 0
    except ValueError:
        raise TopologyError(f"{name}={v!r}: expected 0 or 1") from None


def int_var(env: Mapping[str, str], name: str, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    """The integer in variable ``name`` of ``env`` (None when unset or blank), in ``minimum..maximum``;
    :class:`~topo.errors.TopologyError` ``"NAME='v': expected an integer 0..3"`` otherwise."""
    v = env.get(name)
    if v is None or v.strip() == "":
        return None
    try:
        x = int(v.strip())
    except ValueError:
        x = None
    if x is None or x < minimum or (maximum is not None and x > maximum):
        rng = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise TopologyError(f"{name}={v!r}: expected an integer {rng}")
    return x


def _level(env: Mapping[str, str], name: str) -> str | None:
    v = env.get(name)
    if v is None or v.strip() == "":
        return None
    s = v.strip().upper()
    if s in PATH_LEVELS:
        return s
    if s.isdigit():
        return _LEGACY.get(int(s), "SYS")  # NCCL: legacy integers above 4 mean SYS
    raise TopologyError(f"{name}={v!r}: expected one of {', '.join(PATH_LEVELS)} or an integer 0..4")


def _filter(env: Mapping[str, str], name: str, *, ports: bool) -> NameFilter | None:
    v = env.get(name)
    if v is None or v.strip() == "":
        return None
    s = v.strip()
    exclude = s.startswith("^")
    s = s[1:] if exclude else s
    exact = s.startswith("=")
    s = s[1:] if exact else s
    entries, rails = [], []
    for item in s.split(","):
        item = item.strip()
        if not item:
            raise TopologyError(f"{name}={v!r}: expected a comma list of device names, got an empty entry")
        parts = item.split(":")
        dev = parts[0]
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+", dev):
            raise TopologyError(f"{name}={v!r}: device name {dev!r} expected letters, digits, '_', '.', '-'")
        port = None
        if len(parts) > 1:
            if not ports:
                raise TopologyError(f"{name}={v!r}: expected interface names without ':port'")
            if not parts[1].isdigit() or int(parts[1]) < 1:
                raise TopologyError(f"{name}={v!r}: port of {dev!r} expected a positive integer, got {parts[1]!r}")
            port = int(parts[1])
            for extra in parts[2:4]:  # NCCL 2.30 rail and plane fields: integers, -1 allowed
                if not re.fullmatch(r"-?\d+", extra):
                    raise TopologyError(f"{name}={v!r}: rail/plane of {dev!r} expected an integer, got {extra!r}")
            if len(parts) > 4:
                raise TopologyError(f"{name}={v!r}: entry {item!r} expected name[:port[:rail[:plane]]]")
            if len(parts) > 2 and int(parts[2]) >= 0:
                rails.append((dev, int(parts[2])))
        entries.append((dev, port))
    return NameFilter(tuple(entries), exclude, exact, tuple(rails))


def expand_hostlist(expr: str, var: str = "SLURM_JOB_NODELIST") -> tuple[str, ...]:
    """Expand a Slurm hostlist (``a[01-03,7],b[1-2]-x[3-4]``): ranges keep zero padding."""
    items, depth, cur = [], 0, ""
    for ch in expr.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise TopologyError(f"{var}={expr!r}: expected balanced brackets")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth != 0:
        raise TopologyError(f"{var}={expr!r}: expected balanced brackets")
    items.append(cur)
    out: list[str] = []
    for item in items:
        if not item:
            raise TopologyError(f"{var}={expr!r}: expected host names separated by ',', got an empty one")
        pieces = re.split(r"(\[[^\]]*\])", item)
        choices = []
        for p in pieces:
            if p.startswith("["):
                opts = []
                for r in p[1:-1].split(","):
                    a, _, b = r.partition("-")
                    if not a.isdigit() or (b and not b.isdigit()) or (b and int(b) < int(a)):
                        raise TopologyError(f"{var}={expr!r}: range {r!r} expected N or N-M with N <= M")
                    opts.extend(str(k).zfill(len(a)) for k in range(int(a), int(b or a) + 1))
                choices.append(opts)
            else:
                choices.append([p])
        out.extend("".join(c) for c in itertools.product(*choices))
    return tuple(out)


def _launcher(env: Mapping[str, str]) -> dict[str, Any]:
    if any(k in env for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")):
        return {
            "launcher": "torchrun",
            "rank": int_var(env, "RANK"),
            "world_size": int_var(env, "WORLD_SIZE", minimum=1),
            "local_rank": int_var(env, "LOCAL_RANK"),
            "local_world_size": int_var(env, "LOCAL_WORLD_SIZE", minimum=1),
            "node_rank": int_var(env, "GROUP_RANK"),
        }
    if "SLURM_PROCID" in env:
        per_node = int_var(env, "SLURM_NTASKS_PER_NODE", minimum=1)
        return {
            "launcher": "slurm",
            "rank": int_var(env, "SLURM_PROCID"),
            "world_size": int_var(env, "SLURM_NTASKS", minimum=1),
            "local_rank": int_var(env, "SLURM_LOCALID"),
            "local_world_size": per_node,
            "node_rank": int_var(env, "SLURM_NODEID"),
        }
    if "OMPI_COMM_WORLD_RANK" in env:
        return {
            "launcher": "openmpi",
            "rank": int_var(env, "OMPI_COMM_WORLD_RANK"),
            "world_size": int_var(env, "OMPI_COMM_WORLD_SIZE", minimum=1),
            "local_rank": int_var(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            "local_world_size": int_var(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1),
            "node_rank": None,
        }
    return {}


def _topology_addr(env: Mapping[str, str]) -> tuple[str, ...] | None:
    addr = env.get("SLURM_TOPOLOGY_ADDR")
    if not addr or not addr.strip():
        return None
    parts = addr.strip().split(".")
    if any(not p for p in parts):
        raise TopologyError(f"SLURM_TOPOLOGY_ADDR={addr!r}: expected dot-separated names, got an empty one")
    pattern = env.get("SLURM_TOPOLOGY_ADDR_PATTERN")
    if pattern:
        kinds = pattern.strip().split(".")
        if len(kinds) != len(parts):
            raise TopologyError(
                f"SLURM_TOPOLOGY_ADDR_PATTERN={pattern!r}: expected {len(parts)} parts like "
                f"SLURM_TOPOLOGY_ADDR={addr!r}, got {len(kinds)}"
            )
        return tuple(p for p, k in zip(parts, kinds) if k == "switch")
    return tuple(parts[:-1])  # last part is the node itself


def hints(env: Mapping[str, str] | None = None) -> Hints:
    """Parse the hint variables of ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    p2p = "LOC" if _bool(env, "NCCL_P2P_DISABLE") else _level(env, "NCCL_P2P_LEVEL")
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    order = env.get("CUDA_DEVICE_ORDER")
    if order is not None and order.strip() not in ("", "PCI_BUS_ID", "FASTEST_FIRST"):
        raise TopologyError(f"CUDA_DEVICE_ORDER={order!r}: expected PCI_BUS_ID or FASTEST_FIRST")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    host_id = env.get(HOST_ID_VAR) or env.get("NCCL_HOSTID") or None
    return Hints(
        topo_file=env.get("NCCL_TOPO_FILE") or None,
        graph_file=env.get("NCCL_GRAPH_FILE") or None,
        p2p_level=p2p,
        shm_disable=_bool(env, "NCCL_SHM_DISABLE"),
        ib_disable=_bool(env, "NCCL_IB_DISABLE"),
        ib_hca=_filter(env, "NCCL_IB_HCA", ports=True),
        socket_ifname=_filter(env, "NCCL_SOCKET_IFNAME", ports=False),
        net_gdr_level=_level(env, "NCCL_NET_GDR_LEVEL"),
        cross_nic=int_var(env, "NCCL_CROSS_NIC", maximum=2),
        host_id=host_id,
        cuda_visible_devices=None if cvd is None else tuple(t.strip() for t in cvd.split(",") if t.strip()),
        cuda_device_order=(order or "").strip() or None,
        nodelist=expand_hostlist(nodelist) if nodelist else None,
        topology_addr=_topology_addr(env),
        **_launcher(env),
    )


def hints_report(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Plain data for ``treecoll topo hints``: every known variable that is set, its
    value and its effect, plus the parsed :class:`Hints` (raises on an invalid value)."""
    from .limits import limits

    env = os.environ if env is None else env
    h = hints(env)
    limits(env=env)  # an invalid TREECOLL_MAX_NODES / _LINKS is a one-line error naming it
    rows = [{"variable": k, "value": env[k], "effect": EFFECTS[k]} for k in EFFECTS if k in env]
    return {"set": rows, "parsed": h.as_dict(), "unset": [k for k in EFFECTS if k not in env]}


#: NCCL path classes in order (src/include/graph.h); a level admits every class up to it
_ORDER = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET")


def _within(cls: str, level: str) -> bool:
    return _ORDER.index(cls) <= _ORDER.index(level)


def transport(path_class: str, h: Hints | None = None, *, amd_two_gpus: bool = False) -> str:
    """How NCCL moves data between two GPUs whose path has NCCL class ``path_class``.

    ``"p2p"`` when the class is within the P2P level (NCCL_P2P_LEVEL, default
    PXB; SYS on AMD CPUs with at most two GPUs; NCCL_P2P_DISABLE=1 = LOC),
    else ``"shm"`` (through host memory) unless NCCL_SHM_DISABLE=1, then
    ``"net"``; between hosts always ``"net"`` (src/graph/paths.cc ncclTopoCheckP2p).

    >>> transport("NVL"), transport("PHB"), transport("PHB", hints({"NCCL_P2P_LEVEL": "SYS"}))
    ('p2p', 'shm', 'p2p')
    >>> transport("SYS", hints({"NCCL_SHM_DISABLE": "1"})), transport("NET")
    ('net', 'net')
    """
    h = h or Hints()
    if path_class == "NET":
        return "net"
    level = h.p2p_level or ("SYS" if amd_two_gpus else "PXB")
    if level != "LOC" and _within(path_class, level):
        return "p2p"
    return "net" if h.shm_disable else "shm"


def gdr(path_class: str, h: Hints | None = None, *, c2c: bool = True) -> bool:
    """Whether NCCL uses GPUDirect RDMA between a GPU and a NIC at ``path_class``:
    within NCCL_NET_GDR_LEVEL (default PXB, or P2C when NCCL_NET_GDR_C2C=1, the
    default since 2.27 - ``c2c``), src/graph/paths.cc ncclTopoCheckGdr.

    >>> gdr("PIX"), gdr("PHB"), gdr("PHB", hints({"NCCL_NET_GDR_LEVEL": "PHB"})), gdr("P2C")
    (True, False, True, True)
    """
    h = h or Hints()
    level = h.net_gdr_level or ("P2C" if c2c else "PXB")
    return level != "LOC" and _within(path_class, level)
