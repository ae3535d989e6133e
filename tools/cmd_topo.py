"""``treecoll topo``: inspect topologies.

FILE is a YAML path, a shipped name (``dgx-h100-x16``: topologies/<name>.yaml)
or ``default`` (the embedded 2-host DGX H100 cluster); see :func:`topo.resolve`.

* ``topo show FILE``: hosts, GPUs, links by kind with bandwidths, network.
* ``topo matrix FILE [--host H]``: the ``nvidia-smi topo -m`` view of one host
  (GPU x GPU, GPU x NIC, NIC x NIC codes, CPU and NUMA affinity, legend).
* ``topo path FILE A B``: the route between two endpoints. A and B are node
  ids (``h0/gpu3``, ``h1/nic0``) or ranks (``r3`` = the GPU of rank 3, see
  :meth:`topo.Topology.rank_gpus`).
* ``topo export FILE --format yaml|json|dot [-o OUT]``: the explicit YAML form,
  JSON (:meth:`topo.Topology.to_dict`) or Graphviz DOT (a cluster per host).
* ``topo draw FILE -o out.png [--max-hosts N]``: a picture (needs matplotlib).
* ``topo probe``: measure the links of a running job against the topology
  (:mod:`treecoll.tools.cmd_probe`, mounted from :data:`SUBMODULES`).

Instead of FILE, the machine flags (``--hosts N --gpu MODEL [--gpus-per-host G] [--nic
COUNTxSPEEDG-FABRIC] [--gpu-nic ...]``, :mod:`treecoll.tools.machine_flags`) name a machine built from
the shipped machine templates (:mod:`treecoll.topo.machines`): ``topo export --hosts 16 --gpu H100
--nic 8x400G-ib --format yaml -o cluster.yaml`` writes it as a file to edit.

Each command builds a plain dict (``--json`` prints it); the text view is a
second renderer. More ``treecoll topo <x>`` subcommands: add a module to
:data:`SUBMODULES` exposing ``add_parser(topo_subparsers)`` and ``run(args)``.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections import Counter
from typing import Any

from treecoll.topo.errors import TopologyError
from treecoll.topo.fmt import fmt_bytes

from treecoll import topo

from . import units
from .cli import IMAGE_SUFFIXES, REPLACES, atomic_output, common_options, emit, output_path, write_output
from .machine_flags import COUNTS_HELP, add_machine_flags

__all__ = [
    "add_parser",
    "run",
    "show_data",
    "matrix_data",
    "path_data",
    "render_show",
    "render_matrix",
    "render_path",
    "endpoint",
    "SUBMODULES",
]

#: modules adding more ``treecoll topo`` subcommands (e.g. discovery); one line each
SUBMODULES: list[str] = ["treecoll.tools.cmd_discover", "treecoll.tools.cmd_probe"]

SMI_LEGEND = [
    ("X", "Self"),
    ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
    ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"),
    ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
    ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
    ("NV#", "Connection traversing a bonded set of # NVLinks"),
]


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "topo",
        help="inspect, discover and import cluster topologies",
        description="Inspect, discover and import cluster topologies. FILE is a YAML path, "
        "a shipped name (topologies/<name>.yaml) or 'default'.",
    )
    common_options(p)
    sub = p.add_subparsers(dest="topo_cmd", metavar="SUBCOMMAND")
    sub.required = True

    def cmd(name: str, help_: str) -> argparse.ArgumentParser:
        q = sub.add_parser(name, help=help_, description=help_)
        q.add_argument(
            "file",
            metavar="FILE",
            nargs="?",
            default=None,
            help="topology YAML, shipped name, or 'default' (or the machine flags instead)",
        )
        add_machine_flags(
            q,
            topology=False,
            description=f"a machine instead of FILE: {COUNTS_HELP}",
        )
        return common_options(q)

    cmd("show", "summary: hosts, GPUs, links by kind, network")
    q = cmd("matrix", "nvidia-smi topo -m view of one host")
    q.add_argument("--host", help="host name (default: the first host)")
    q = cmd("path", "route between two GPUs/NICs (ids like h0/gpu3, or ranks like r3)")
    q.add_argument("a", metavar="A", help="first endpoint: a node id (h0/gpu3, h1/nic0) or a rank (r3)")
    q.add_argument("b", metavar="B", help="second endpoint, as A")
    q = cmd("export", "write the topology as YAML (explicit form), JSON or DOT")
    q.add_argument(
        "--format",
        choices=("yaml", "json", "dot"),
        required=True,
        help="yaml (the explicit form), json (Topology.to_dict) or dot (Graphviz, a cluster per host)",
    )
    q.add_argument("-o", "--output", metavar="FILE", help=f"file to write {REPLACES} (default: standard output)")
    q = cmd("draw", "draw hosts, switches and links to an image (needs matplotlib)")
    q.add_argument("-o", "--output", required=True, metavar="FILE", help=f"image file (.png, .svg, .pdf) {REPLACES}")
    q.add_argument(
        "--max-hosts", type=units.int_arg("--max-hosts"), default=8, metavar="N", help="hosts to draw (default 8)"
    )
    for name in SUBMODULES:
        mod = importlib.import_module(name)
        mod.add_parser(sub).set_defaults(_topo_module=mod)
    return p


def run(args: argparse.Namespace) -> int:
    mod = getattr(args, "_topo_module", None)
    if mod is not None:
        return mod.run(args)
    c = args.topo_cmd
    if c in ("export", "draw") and args.output:
        output_path(args.output, inputs=[args.file], suffixes=IMAGE_SUFFIXES if c == "draw" else None)
    t, source = _topology(args)
    if c == "show":
        return emit(args, show_data(t, source), render_show)
    if c == "matrix":
        return emit(args, matrix_data(t, args.host), render_matrix)
    if c == "path":
        return emit(args, path_data(t, args.a, args.b), render_path)
    if c == "export":
        return _export(args, t)
    from treecoll.topo.render import draw

    with atomic_output(args.output) as tmp:
        data = dict(draw(t, tmp, max_hosts=args.max_hosts), output=args.output)
    return emit(
        args,
        data,
        lambda d: (
            f"wrote {d['output']} ({d['hosts_drawn']} of {d['hosts_total']} hosts, "
            f"{d['nodes']} nodes, {d['links']} links)"
        ),
    )


def _topology(args: argparse.Namespace) -> tuple[topo.Topology, str]:
    """The topology of FILE, or of the machine flags (one of the two), and the name of its source."""
    from .machine_flags import machine_flags

    flags = machine_flags(args)
    if args.file is not None and flags.counts_given():
        raise units.UsageError(
            f"topo {args.topo_cmd}: FILE names the whole machine: expected FILE or the machine flags "
            "(--hosts, --gpus-per-host, --gpu, --nic, --gpu-nic), got both; pass one or the other"
        )
    if args.file is not None:
        return topo.resolve(args.file), args.file
    if not flags.counts_given():
        raise units.UsageError(
            f"topo {args.topo_cmd}: expected FILE (a topology YAML, a shipped name or 'default'), or the "
            "machine: --hosts N --gpu MODEL [--gpus-per-host G] [--nic COUNTxSPEEDG-FABRIC] [--gpu-nic ...]"
        )
    from treecoll.topo.machines import machine_topology

    t, machine = machine_topology(flags)
    return t, machine.describe()


# ------------------------------------------------------------------------------------------ show
def _range(vals: list[float]) -> list[float]:
    return [min(vals), max(vals)] if vals else []


def show_data(t: topo.Topology, source: str = "") -> dict[str, Any]:
    """Summary of a topology as plain data."""
    g = t.graph
    per_host = t.gpus_per_host()
    links: dict[str, dict[str, Any]] = {}
    for _, _, d in g.edges(data=True):
        e = links.setdefault(d["kind"], {"pairs": 0, "bw": [], "lat": []})
        e["pairs"] += 0.5
        e["bw"].append(d["bw"])
        e["lat"].append(d.get("lat", 0.0))
    tiers = Counter(d.get("tier", 0) for _, d in g.nodes(data=True) if d["kind"] == "net_switch")
    groups = t.leaf_groups() if t.nics() else ()
    hosts = t.hosts()
    nic_lat = [float(g.nodes[n]["lat"]) for n in t.nics() if "lat" in g.nodes[n]]
    return {
        "name": t.name,
        "source": str(source),
        "fingerprint": t.fingerprint(),
        "hosts": len(hosts),
        "host_names": [hosts[0], hosts[-1]] if hosts else [],
        "gpus": len(t.gpus()),
        "gpus_per_host": {str(k): v for k, v in sorted(Counter(per_host.values()).items())},
        "gpu_models": dict(Counter(g.nodes[n].get("model", "?") for n in t.gpus())),
        "nodes": {k: len(t.nodes(k)) for k in topo.NODE_KINDS if t.nodes(k)},
        "links": {
            k: {"pairs": int(v["pairs"]), "bw_GBps": _range(v["bw"]), "lat_us": _range(v["lat"])}
            for k, v in sorted(links.items(), key=lambda kv: topo.LINK_KINDS.index(kv[0]))
        },
        "network": {
            "switches_by_tier": {str(k): v for k, v in sorted(tiers.items())},
            "leaf_groups": len(groups),
            "largest_leaf_group": max((len(x) for x in groups), default=0),
        },
        **({"nic_lat_us": _range(nic_lat)} if nic_lat else {}),
        **({"gpu_memory": memory} if (memory := _gpu_memory(t)) else {}),
    }


def _gpu_memory(t: topo.Topology) -> dict[str, dict[str, float]]:
    """Per GPU model, the capacity (``mem_gb``, GB) and bandwidth (``mem_bw``, GB/s) its GPUs state, where
    every GPU of the model states the same (a model whose GPUs disagree or state nothing is left out)."""
    by_model: dict[str, list[dict]] = {}
    for n in t.gpus():
        d = t.graph.nodes[n]
        by_model.setdefault(d.get("model", "?"), []).append(d)
    out: dict[str, dict[str, float]] = {}
    for model, nodes in by_model.items():
        row = {}
        for key in ("mem_gb", "mem_bw"):
            values = {d.get(key) for d in nodes}
            if len(values) == 1 and None not in values:
                row[key] = float(values.pop())
        if row:
            out[model] = row
    return out


def render_show(d: dict[str, Any]) -> str:
    src = f"  ({d['source']})" if d["source"] else ""
    hosts = d["host_names"]
    span = f"{hosts[0]} .. {hosts[1]}" if len(hosts) == 2 and hosts[0] != hosts[1] else (hosts[0] if hosts else "-")
    per = ", ".join(f"{n} hosts x {k} GPUs" if n > 1 else f"{n} host x {k} GPUs" for k, n in d["gpus_per_host"].items())
    memory = d.get("gpu_memory", {})

    def model(m: str, n: int) -> str:
        mem = memory.get(m, {})
        each = ", ".join(
            ([fmt_bytes(mem["mem_gb"] * 1e9, si=True)] if "mem_gb" in mem else [])
            + ([f"{mem['mem_bw']:g} GB/s"] if "mem_bw" in mem else [])
        )
        return f"{n} x {m}" + (f" ({each} each)" if each else "")

    models = ", ".join(model(m, n) for m, n in d["gpu_models"].items())
    out = [
        f"{d['name'] or '(unnamed)'}{src}  fingerprint {d['fingerprint']}",
        f"hosts    {d['hosts']} ({span}): {per}",
        f"gpus     {d['gpus']}: {models}",
        "nodes    " + ", ".join(f"{n} {k}" for k, n in d["nodes"].items()),
        f"links    {'kind':<8}{'pairs':>8}   {'bw GB/s':<18}lat us",
    ]

    def rng(v: list[float]) -> str:
        return "-" if not v else (f"{v[0]:g}" if v[0] == v[1] else f"{v[0]:g} - {v[1]:g}")

    for k, v in d["links"].items():
        out.append(f"         {k:<8}{v['pairs']:>8}   {rng(v['bw_GBps']):<18}{rng(v['lat_us']):<12}".rstrip())
    net = d["network"]
    tiers = net["switches_by_tier"]
    if tiers:
        names = {"0": ("leaf", "leaves"), "1": ("spine", "spines"), "2": ("core", "cores")}
        sw = ", ".join(f"{n} {names.get(k, ('tier ' + k, 'tier ' + k))[n > 1]}" for k, n in tiers.items())
        out.append(
            f"network  {sw}; {net['leaf_groups']} leaf group(s), up to {net['largest_leaf_group']} hosts "
            f"one switch hop apart on every rail"
        )
    else:
        out.append("network  none")
    if d.get("nic_lat_us"):
        out.append(
            f"nic lat  {rng(d['nic_lat_us'])} us per message (the transport's own latency, as an NCCL net "
            f"plugin reports it)"
        )
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ matrix
def matrix_data(t: topo.Topology, host: str | None = None) -> dict[str, Any]:
    """The ``nvidia-smi topo -m`` matrix of one host as plain data."""
    from treecoll.topo.smi import smi_matrix

    if not t.hosts():
        raise TopologyError(f"topology {t.name!r}: has no hosts to show a matrix for")
    host = host or t.hosts()[0]
    if host not in t.hosts():
        raise TopologyError(f"--host {host!r}: not in topology {t.name!r}; hosts are {list(t.hosts())[:8]}")
    g = t.graph
    ids, codes = smi_matrix(t, host)
    labels, names, cpu_aff, numa_aff = [], {}, {}, {}
    ni = 0
    for n in ids:
        d = g.nodes[n]
        if d["kind"] == "gpu":
            lab = f"GPU{d.get('index', len(labels))}"
            numa = d.get("numa")
            numa_aff[lab] = numa
            cpu = f"{host}/cpu{numa}"
            cpu_aff[lab] = g.nodes[cpu].get("affinity") if numa is not None and cpu in g else None
        else:
            lab = f"NIC{ni}"
            ni += 1
            names[lab] = d.get("name", n)
        labels.append(lab)
    return {
        "host": host,
        "devices": labels,
        "ids": ids,
        "codes": codes,
        "nic_names": names,
        "cpu_affinity": cpu_aff,
        "numa_affinity": numa_aff,
        "legend": dict(SMI_LEGEND),
    }


def render_matrix(d: dict[str, Any]) -> str:
    labs = d["devices"]
    w = max([5] + [len(x) + 2 for x in labs])
    aff_w = max([14] + [len(str(v)) + 2 for v in d["cpu_affinity"].values()])
    head = " " * w + "".join(x.ljust(w) for x in labs) + "CPU Affinity".ljust(aff_w) + "NUMA Affinity"
    out = [f"host {d['host']}", "", head.rstrip()]
    for lab, row in zip(labs, d["codes"]):
        line = lab.ljust(w) + "".join((" X" if c == "X" else c).ljust(w) for c in row)
        if lab in d["cpu_affinity"]:
            aff, numa = d["cpu_affinity"][lab], d["numa_affinity"][lab]
            line += str("N/A" if aff is None else aff).ljust(aff_w) + str("N/A" if numa is None else numa)
        out.append(line.rstrip())
    out += ["", "Legend:", ""] + [f"  {k:<4} = {v}" for k, v in d["legend"].items()]
    if d["nic_names"]:
        out += ["", "NIC Legend:", ""] + [f"  {k}: {v}" for k, v in d["nic_names"].items()]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ path
def endpoint(t: topo.Topology, spec: str) -> str:
    """A node id from ``h0/gpu3``-style ids or ``r<rank>``."""
    if len(spec) > 1 and spec[0] == "r" and spec[1:].isdigit():
        return t.gpu_of_rank(int(spec[1:]))
    if spec not in t.graph:
        gpus, nics = t.nodes(kind="gpu"), t.nodes(kind="nic")
        examples = ", ".join([*gpus[:2], *nics[:1]])
        hint = f"; a rank is written r{spec}" if spec.isdigit() else ""
        raise TopologyError(
            f"endpoint {spec!r}: not a node of topology {t.name!r}; expected a node id ({examples}, ...; "
            f"`treecoll topo show {t.name}` lists them) or a rank r0..r{len(gpus) - 1}{hint}"
        )
    return spec


def path_data(t: topo.Topology, a: str, b: str) -> dict[str, Any]:
    """The route between two endpoints as plain data (see :meth:`topo.Path.as_dict`)."""
    src, dst = endpoint(t, a), endpoint(t, b)
    d = t.path(src, dst).as_dict()
    ranks = {g: r for r, g in enumerate(t.rank_gpus())}
    d["src_rank"], d["dst_rank"] = ranks.get(src), ranks.get(dst)
    return d


def render_path(d: dict[str, Any]) -> str:
    def who(n, r):
        return n if r is None else f"{n} (rank {r})"

    smi = d["smi"] or "-"
    out = [
        f"{who(d['src'], d['src_rank'])} -> {who(d['dst'], d['dst_rank'])}",
        f"class    NCCL {d['nccl']}, nvidia-smi {smi}",
        f"hops     {d['hops']}, bottleneck {d['bw_GBps']:g} GB/s, latency {d['lat_us']:g} us",
    ]
    route = d["nodes"][0] + "".join(f" -{k}-> {n}" for k, n in zip(d["kinds"], d["nodes"][1:]))
    out.append(f"route    {route}")
    if len(d["routes"]) > 1:
        via = [f"via {nodes[1]} {share:.1%}" for nodes, share in d["routes"]]
        more = f", ... ({len(via) - 6} more)" if len(via) > 6 else ""
        out.append(f"parallel {len(via)} routes: " + ", ".join(via[:6]) + more)
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------ export
def _export(args: argparse.Namespace, t: topo.Topology) -> int:
    if args.format == "yaml":
        text = topo.dumps(t)
    elif args.format == "json":
        text = json.dumps(t.to_dict(), indent=1, ensure_ascii=False, default=str) + "\n"
    else:
        from treecoll.topo.render import to_dot

        text = to_dot(t)
    if args.output:
        nbytes = write_output(args.output, text)
        data = {
            "format": args.format,
            "output": args.output,
            "bytes": nbytes,
            "nodes": t.graph.number_of_nodes(),
            "links": t.graph.number_of_edges(),
        }
        return emit(
            args,
            data,
            lambda d: f"wrote {d['output']} ({d['format']}, {d['nodes']} nodes, {d['links']} directed links)",
        )
    if getattr(args, "json", False):
        return emit(args, {"format": args.format, "text": text})
    print(text, end="")
    return 0
