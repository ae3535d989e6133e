"""``treecoll tree``: build, show, check and draw reduction trees.

* ``tree build --topology F [--ranks N] --builder B [--bytes S] [-o tree.yaml]``:
  build a tree with a registered builder (``chain``, ``binomial``, ``kary:K``,
  ``star``, ``double_binary``, ``two_level``, ``auto``) over the first N ranks of
  topology F (a YAML path or a shipped name) and print it; ``-o`` writes the
  tree file (see :mod:`treecoll.collectives.tree_io`).
* ``tree show FILE [--topology F] [--bytes S]``: an ASCII drawing, with each
  edge's link (NCCL path class, link kinds, bandwidth) and the predicted
  reduce/broadcast/allreduce times when a topology is given. FILE may also be
  an NCCL_GRAPH_FILE XML (its graphs and channels are listed).
* ``tree check FILE --topology F [--ranks N]``: the tree fits the topology
  (it covers every GPU, or the first N with ``--ranks N``; host labels), and
  how it compares with ``auto`` and the lower bound; exit code 1 when it does
  not fit.
* ``tree draw FILE [--topology F] -o tree.png``: with ``--topology``, the tree
  over the topology picture (one arrow per edge, child GPU to parent GPU,
  coloured by link class; one colour per tree for several trees); without it,
  the tree alone, ranks by depth (needs matplotlib).
* ``tree bruteforce --topology F [--ranks N] [--sizes S,...] [--trees symmetry|shapes|all]``:
  ``auto`` against the best of every spanning tree under the cost model
  (:mod:`treecoll.collectives.bruteforce`), on at most :data:`MAX_BRUTE_RANKS` ranks.

Wherever ``--topology F`` is taken, the machine flags (:mod:`treecoll.tools.machine_flags`:
``--hosts N --gpu MODEL [--gpus-per-host G] [--nic COUNTxSPEEDG-FABRIC] [--gpu-nic ...]``) may name
the machine instead. Every command builds a plain dict first (``--json`` prints it).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from pathlib import Path as FsPath
from typing import TYPE_CHECKING, Any

from treecoll.collectives.executor_cost import MODES
from treecoll.collectives.tree_io import TREE_SUFFIXES
from treecoll.topo.errors import MissingDependency, TreeError

from . import units
from .cli import IMAGE_SUFFIXES, REPLACES, atomic_output, common_options, emit, output_path, write_output
from .machine_flags import COUNTS_HELP, add_machine_flags, machine_given, topology_from_args

if TYPE_CHECKING:
    from treecoll.collectives.tree import MultiTree, Tree
    from treecoll.topo import Topology

__all__ = ["add_parser", "run", "tree_data", "render_tree", "build_data", "bruteforce_data", "render_bruteforce"]

#: the most ranks ``tree bruteforce`` takes: it scores up to P^(P-2) trees per root (8^6 = 262,144 at 8, seconds
#: to a minute per size; 9^7 = 4.8 million at 9, minutes even after the topology's symmetries)
MAX_BRUTE_RANKS = 8
#: the most trees ``tree bruteforce --trees all`` scores per size (P^(P-1): 7 ranks, 117,649, are under it)
MAX_ALL_TREES = 1_000_000
#: ``tree bruteforce --trees``: which trees are enumerated
BRUTE_TREES = {
    "symmetry": "every rooted tree up to the topology's automorphisms (exhaustive)",
    "shapes": "one tree per shape (exhaustive where every rank is equivalent, e.g. one NVSwitch fabric)",
    "all": "every rooted labeled tree, P^(P-1) of them",
}

#: what ``tree bruteforce``'s times are: not the flow simulation ``tree build`` prints, nor its stepped-through
#: cost model
BRUTE_MODEL = "collectives.cost without step_through, not the flow simulation tree build prints"

MODE_HELP = (
    "how treecoll's trees are predicted: executor (as treecoll's executor runs them, one isend/irecv "
    "from Python per message; the default) or in-kernel (the same tree inside NCCL, its protocols)"
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from treecoll.collectives.builders import BUILDERS, INTER_KINDS, INTRA_KINDS

    p = subparsers.add_parser(
        "tree",
        help="build, show, check and draw reduction trees",
        description="Build, show, check and draw reduction trees.",
    )
    common_options(p)
    sub = p.add_subparsers(dest="tree_cmd", metavar="SUBCOMMAND")
    sub.required = True
    builders = f"{', '.join(sorted(BUILDERS))}; kary:K for fan-out K"
    b = common_options(
        sub.add_parser(
            "build",
            help="build a tree with a registered builder",
            description="Build a tree with a registered builder over the first N ranks of a topology, print it with "
            "each edge's link and the predicted times, and optionally save it as a tree file.",
        )
    )
    add_machine_flags(
        b,
        topology_help="topology YAML file, shipped name or 'default'",
        description=f"the machine to build the tree over (required): --topology, or {COUNTS_HELP}",
    )
    b.add_argument(
        "--ranks", type=units.int_arg("--ranks"), metavar="N", help="use the first N ranks (default: every GPU)"
    )
    b.add_argument("--builder", required=True, metavar="B", help=f"the builder: {builders}")
    b.add_argument(
        "--bytes",
        default=1 << 20,
        type=units.size_arg("--bytes"),
        metavar="S",
        help="message size for auto/two_level and the predictions (default 1MiB)",
    )
    b.add_argument(
        "--intra",
        metavar="SHAPE",
        help=f"two_level: the tree inside a host: {', '.join(INTRA_KINDS)} (kary:K) (default auto)",
    )
    b.add_argument(
        "--inter",
        metavar="SHAPE",
        help=f"two_level: the tree between hosts: {', '.join(INTER_KINDS)} (kary:K) (default binomial)",
    )
    b.add_argument(
        "--rails",
        choices=("auto", "yes", "no"),
        help="two_level: one tree per NIC rail: auto, yes or no (default auto)",
    )
    b.add_argument("-o", "--output", metavar="FILE", help=f"tree file to write (.yaml, .yml or .json) {REPLACES}")
    b.add_argument("--mode", choices=MODES, default="executor", help=MODE_HELP)
    for name, help_, description in (
        (
            "show",
            "ASCII drawing with link kinds and predicted times",
            "Draw a tree file in ASCII; with --topology, each edge's link and the predicted times over the "
            "first ranks of the topology. An NCCL_GRAPH_FILE XML lists its graphs and channels.",
        ),
        (
            "check",
            "check a tree file against a topology",
            "Check that a tree file fits a topology: it covers every GPU (or the --ranks N given), its host "
            "labels match, and how it compares with the auto builder. Exit code 1 when it does not fit.",
        ),
        (
            "draw",
            "draw a tree to an image (needs matplotlib)",
            "Draw a tree file to an image: over the topology picture with --topology, else ranks by depth.",
        ),
    ):
        q = common_options(sub.add_parser(name, help=help_, description=description))
        q.add_argument(
            "file", metavar="FILE", help="tree file (YAML/JSON)" + (" or NCCL graph XML" if name == "show" else "")
        )
        add_machine_flags(
            q,
            topology_help="topology YAML file, shipped name or 'default'",
            description=f"the machine{' (required)' if name == 'check' else ''}: --topology, or {COUNTS_HELP}",
        )
        if name != "draw":  # a picture has no predictions
            q.add_argument(
                "--bytes",
                default=1 << 20 if name != "show" else None,  # show: None tells 'not given' (needs --topology)
                type=units.size_arg("--bytes"),
                metavar="S",
                help="message size for the predictions (default 1MiB)",
            )
        if name in ("show", "check"):
            q.add_argument("--mode", choices=MODES, default="executor" if name != "show" else None, help=MODE_HELP)
        if name == "check":
            q.add_argument(
                "--ranks",
                type=units.int_arg("--ranks"),
                metavar="N",
                help="the tree is meant for the first N ranks of the topology (default: every GPU; "
                "a tree over fewer ranks fails without it)",
            )
        if name == "draw":
            q.add_argument(
                "-o", "--output", required=True, metavar="FILE", help=f"image file (.png, .svg, .pdf) {REPLACES}"
            )
            q.add_argument(
                "--max-hosts",
                type=units.int_arg("--max-hosts"),
                default=None,  # None tells 'not given' (it needs --topology)
                metavar="N",
                help="with --topology: hosts drawn (default 4; edges to others are left out)",
            )
    f = common_options(
        sub.add_parser(
            "bruteforce",
            help="auto against the best of every spanning tree",
            description="Compare the auto builder with the least predicted allreduce time over every spanning tree "
            "(each at its best child order and chunk count, under the cost model auto minimises), on "
            f"at most {MAX_BRUTE_RANKS} ranks.",
        )
    )
    add_machine_flags(
        f,
        topology_help="topology YAML file, shipped name or 'default'",
        description=f"the machine (required): --topology, or {COUNTS_HELP}",
    )
    f.add_argument(
        "--ranks",
        type=units.int_arg("--ranks", maximum=MAX_BRUTE_RANKS),
        metavar="N",
        help=f"use the first N ranks (default: every GPU; at most {MAX_BRUTE_RANKS})",
    )
    f.add_argument(
        "--sizes",
        default=[8, 1 << 20, 16 << 20],
        type=units.sizes_arg("--sizes"),
        metavar="S[,S...]",
        help="message sizes, a comma list or A:B doubling (default 8B,1MiB,16MiB)",
    )
    f.add_argument(
        "--trees",
        choices=tuple(BRUTE_TREES),
        default="symmetry",
        help="; ".join(f"{k}: {v}" for k, v in BRUTE_TREES.items()) + " (default symmetry)",
    )
    return p


# ---------------------------------------------------------------------- data
def _topology(args, required: str | None = None):
    """The topology the machine flags of ``args`` name, or None (a UsageError with ``required``, the
    command, when they name none)."""
    return topology_from_args(args, required=required)[0]


def _gpus(topology, n: int):
    """The GPUs of the first ``n`` ranks (the one rank rule), or None without a topology."""
    from treecoll.topo.ranks import resolve_gpus

    return None if topology is None else resolve_gpus(topology, n)


def tree_data(
    plan: Tree | MultiTree,
    topology: Topology | None = None,
    nbytes: int = 1 << 20,
    hosts: Sequence[str] | None = None,
    mode: str = "executor",
) -> dict[str, Any]:
    """Plain data for a tree (or multitree) on an optional topology: edges with their
    links, edge counts by class, predicted times in ``mode`` (``executor``: as treecoll's
    executor runs the tree; ``in-kernel``: inside the communication library), by
    :func:`treecoll.collectives.sim.executor.predict_tree`, what ``treecoll simulate`` prints."""
    from treecoll.collectives.cost import CostModel
    from treecoll.collectives.placement import Placement
    from treecoll.collectives.sim.executor import predict_tree
    from treecoll.collectives.sim.nccl_model import nccl_algos, nccl_predict
    from treecoll.collectives.tree import as_multi

    multi = as_multi(plan)
    n = multi.size
    gpus = _gpus(topology, n)
    trees = []
    classes: Counter = Counter()
    for ti, t in enumerate(multi.trees):
        edges = []
        for c, p in t.edges():
            e: dict[str, Any] = {"child": c, "parent": p}
            if gpus is not None:
                path = topology.path(gpus[c], gpus[p])
                e.update(
                    {
                        "child_gpu": gpus[c],
                        "parent_gpu": gpus[p],
                        "nccl": path.nccl,
                        "kinds": sorted(set(path.kinds)),
                        "bw_GBps": path.bw,
                        "lat_us": path.lat,
                        "inter_host": topology.host_of(gpus[c]) != topology.host_of(gpus[p]),
                    }
                )
                classes[path.nccl] += 1
                if any("measured" in topology.link(a, b) for a, b in zip(path.nodes, path.nodes[1:])):
                    e["measured"] = True  # a link on the route carries a probe's numbers (treecoll topo probe)
            elif hosts is not None:
                e["inter_host"] = hosts[c] != hosts[p]
            edges.append(e)
        trees.append(
            {
                "root": t.root,
                "height": t.height,
                "parents": list(t.parents),
                "children": [list(x) for x in t.children],
                "edges": edges,
                "share": multi.shares[ti],
                "name": t.name,
            }
        )
    data: dict[str, Any] = {
        "name": multi.name,
        "ranks": n,
        "trees": trees,
        "order_preserving": plan.is_order_preserving(),
        "fingerprint": plan.fingerprint(),
        "bytes": nbytes,
    }
    if hosts is not None:
        data["hosts"] = list(hosts)
    if gpus is not None:
        data["topology"] = topology.name
        data["gpus"] = list(gpus)
        data["edge_classes"] = dict(sorted(classes.items()))
        data["inter_host_edges"] = sum(e.get("inter_host", False) for t in trees for e in t["edges"])
        model = CostModel(topology, gpus, step_through=True)
        pred: dict[str, Any] = {"mode": mode}
        if mode == "executor":
            pred |= {"backend": model.backend, "step_cost_us": model.executor.step_s * 1e6}
        for coll in ("reduce", "broadcast", "allreduce"):
            if coll != "allreduce" and len(set(multi.roots)) > 1:
                continue
            r = predict_tree(Placement(topology, gpus), plan, nbytes, collective=coll, mode=mode)
            pred[coll] = {"time_us": r.time * 1e6}
            if mode == "executor":  # in-kernel, NCCL's protocol slices pipeline the tree
                pred[coll]["nchunks"] = r.stats["chunks"]
            else:
                pred[coll]["profile"] = r.profile
        if mode == "executor":  # what the planner weighs (a test bounds its distance to the above)
            k = pred["allreduce"]["nchunks"]
            pred["cost_model_allreduce_us"] = model.tree_time(plan, nbytes, "allreduce", k) * 1e6
        pred["lower_bound_allreduce_us"] = model.lower_bound(nbytes, "allreduce") * 1e6
        try:
            runs = (nccl_predict(topology, gpus, nbytes, a) for a in nccl_algos(topology, gpus))
            # named as NCCL names what runs (nvls_tree across hosts), as simulate's nccl column does
            pred["nccl"] = {r["algo"]: {k: r[k] for k in ("proto", "time_us", "busbw")} for r in runs}
        except TreeError:
            pass
        data["predicted"] = pred
    return data


def render_tree(data: dict) -> str:
    """The ASCII drawing of :func:`tree_data`."""
    from treecoll.collectives.sim.profiles import NCCL_PROTO_NAMES

    out = []
    head = f"tree {data['name'] or ''} over {data['ranks']} ranks".replace("  ", " ")
    if "topology" in data:
        head += f" of {data['topology']}"
    out.append(head)
    gpus = data.get("gpus")
    for ti, t in enumerate(data["trees"]):
        if len(data["trees"]) > 1:
            out.append(f"tree {ti} (share {t['share']:.3g}) root r{t['root']} height {t['height']}")
        by_child = {e["child"]: e for e in t["edges"]}

        def label(r: int, by_child: dict = by_child) -> str:
            s = f"r{r}"
            if gpus:
                s += f" {gpus[r]}"
            elif data.get("hosts"):
                s += f" {data['hosts'][r]}"
            e = by_child.get(r)
            if e and "nccl" in e:
                tag = "NET" if e["inter_host"] else e["nccl"]
                mark = " measured" if e.get("measured") else ""
                s += f"  [{tag} {'/'.join(e['kinds'])} {e['bw_GBps']:g} GB/s {e['lat_us']:g} us{mark}]"
            return s

        out.append(label(t["root"]))
        stack = [
            (c, "", i == len(t["children"][t["root"]]) - 1)
            for i, c in reversed(list(enumerate(t["children"][t["root"]])))
        ]
        while stack:
            r, prefix, last = stack.pop()
            out.append(f"{prefix}{'└── ' if last else '├── '}{label(r)}")
            kids = t["children"][r]
            sub = prefix + ("    " if last else "│   ")
            stack.extend((c, sub, i == len(kids) - 1) for i, c in reversed(list(enumerate(kids))))
    if "edge_classes" in data:
        cls = ", ".join(f"{v} {k}" for k, v in data["edge_classes"].items()) or "none"
        out.append(f"edges: {cls}; inter-host edges: {data['inter_host_edges']}")
    out.append(f"order preserving: {'yes' if data['order_preserving'] else 'no'}; fingerprint {data['fingerprint']}")
    p = data.get("predicted")
    if p:

        def how(v: dict) -> str:  # executor: its chunks; in-kernel: NCCL's protocol, which sets the pipeline
            if "nchunks" in v:
                return f"{v['nchunks']} chunk{'s' * (v['nchunks'] != 1)}"
            return NCCL_PROTO_NAMES.get(v["profile"], v["profile"])

        parts = [
            f"{k} {v['time_us']:.1f} us ({how(v)})" for k, v in p.items() if k in ("reduce", "broadcast", "allreduce")
        ]
        out.append(f"predicted for {data['bytes']} B, {_mode_text(p)}: " + ", ".join(parts))
        if "cost_model_allreduce_us" in p:
            out.append(f"(the planner's cost model, collectives.cost: allreduce {p['cost_model_allreduce_us']:.1f} us)")
        if "nccl" in p:
            out.append(
                "NCCL's own allreduce (its tuning model): "
                + ", ".join(f"{a} {v['proto']} {v['time_us']:.1f} us" for a, v in p["nccl"].items())
            )
        out.append(f"allreduce lower bound {p['lower_bound_allreduce_us']:.1f} us (any algorithm above)")
    if data.get("output"):
        out.append(f"wrote {data['output']}")
    return "\n".join(out)


def _mode_text(p: dict) -> str:
    """How a prediction was made, as the commands print it."""
    if p["mode"] == "executor":
        return (
            f"executor mode (treecoll's executor on {p['backend']}: {p['step_cost_us']:.1f} us per message, "
            f"flow simulation)"
        )
    return "in-kernel mode (the tree inside NCCL: its protocols and pipelining, flow simulation)"


# ---------------------------------------------------------------------- commands
def build_data(
    topology: Topology,
    builder: str,
    *,
    ranks: int | None = None,
    nbytes: int = 1 << 20,
    intra: str | None = None,
    inter: str | None = None,
    rails: str | None = None,
    mode: str = "executor",
) -> tuple[Tree | MultiTree, dict[str, Any]]:
    """What ``tree build`` prints, as ``(plan, data)``: the tree of ``builder`` over the first
    ``ranks`` GPUs of ``topology`` (default all), built and predicted for ``nbytes``.
    ``rails`` is the command's ``auto`` / ``yes`` / ``no``."""
    from treecoll.collectives.builders import build

    opts: dict[str, Any] = {}
    base = builder.partition(":")[0]
    if base in ("two_level", "auto"):
        opts["nbytes"] = nbytes
    if base == "two_level":
        if intra:
            opts["intra"] = intra
        if inter:
            opts["inter"] = inter
        if rails:
            opts["rails"] = {"auto": "auto", "yes": True, "no": False}[rails]
    elif intra or inter or rails:
        raise TreeError(f"tree build: --intra/--inter/--rails apply to --builder two_level, got {builder!r}")
    total = len(topology.rank_gpus())
    if ranks is not None and ranks > total:
        raise TreeError(f"--ranks: expected at most {total} (the GPUs of topology {topology.name!r}), got {ranks}")
    n = ranks if ranks is not None else total
    plan = build(builder, topology, _gpus(topology, n), **opts)
    data = tree_data(plan, topology, nbytes, mode=mode)
    data["builder"] = builder
    return plan, data


def _build(args) -> dict:
    from treecoll.collectives.tree_io import dumps_tree, tree_format

    if args.output:
        output_path(args.output, inputs=[args.topology], suffixes=TREE_SUFFIXES)
    topology = _topology(args, required="tree build")
    plan, data = build_data(
        topology,
        args.builder,
        ranks=args.ranks,
        nbytes=args.bytes,
        intra=args.intra,
        inter=args.inter,
        rails=args.rails,
        mode=args.mode,
    )
    if args.output:
        hosts = [topology.host_of(g) for g in data["gpus"]]
        write_output(args.output, dumps_tree(plan, hosts=hosts, fmt=tree_format(args.output)))
        data["output"] = args.output
    return data


def _load(args):
    from treecoll.collectives.tree_io import load_tree

    return load_tree(args.file)


def _is_nccl_graph(path: str) -> bool:
    """True for an NCCL_GRAPH_FILE: named .xml, or a file whose text is one
    (:func:`treecoll.topo.nccl_xml.looks_like_nccl_graph`)."""
    from treecoll.topo.nccl_xml import looks_like_nccl_graph

    if FsPath(path).suffix.lower() == ".xml":
        return True
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(4096)
    except OSError:
        return False  # the tree file reader names the problem
    return looks_like_nccl_graph(head)


def _show(args) -> dict:
    if not machine_given(args):
        for option, value in (("--bytes", args.bytes), ("--mode", args.mode)):
            if value is not None:
                raise units.UsageError(
                    f"tree show: {option} applies to the predictions, which need --topology; pass --topology or drop it"
                )
    if _is_nccl_graph(args.file):
        if machine_given(args):
            raise units.UsageError(
                f"tree show {args.file}: an NCCL graph file is listed, not predicted: drop --topology"
            )
        from treecoll.collectives.tree_io import load_nccl_graph

        graphs = load_nccl_graph(args.file)
        return {
            "nccl_graphs": [
                {
                    "id": g.id,
                    "pattern": g.pattern,
                    "kind": g.kind,
                    "channels": [list(c) for c in g.channels],
                    "schedule": {"name": g.schedule().name, "nchunks": g.schedule().nchunks},
                }
                for g in graphs
            ]
        }
    f = _load(args)
    return tree_data(f.plan, _topology(args), args.bytes or 1 << 20, hosts=f.hosts, mode=args.mode or "executor")


def _check(args) -> dict:
    from treecoll.collectives.builders import build
    from treecoll.collectives.placement import Placement
    from treecoll.collectives.sim.executor import predict_tree

    f = _load(args)
    topology = _topology(args, required="tree check")
    nbytes = args.bytes
    n = f.plan.size
    all_gpus = topology.rank_gpus()
    total = len(all_gpus)
    if args.ranks is not None and args.ranks > total:
        raise TreeError(f"--ranks: expected at most {total} (the GPUs of topology {topology.name!r}), got {args.ranks}")
    want = total if args.ranks is None else args.ranks
    problems = []
    if n > total:
        problems.append(f"the tree has {n} ranks, topology {topology.name!r} has {total} GPUs")
    elif n != want and args.ranks is None:
        problems.append(
            f"the tree has {n} ranks, topology {topology.name!r} has {total} GPUs: ranks {n}..{total - 1} "
            f"({all_gpus[n]} .. {all_gpus[-1]}) would have no tree; pass --ranks {n} if the tree is "
            f"meant for the first {n} GPUs"
        )
    elif n != want:
        problems.append(f"the tree has {n} ranks, --ranks says {want}")
    if problems:
        return {
            "file": args.file,
            "ok": False,
            "problems": problems,
            "ranks": n,
            "topology": topology.name,
            "topology_gpus": total,
        }
    gpus = _gpus(topology, n)
    if f.hosts is not None:
        for r, (h, g) in enumerate(zip(f.hosts, gpus)):
            if topology.host_of(g) != h:
                problems.append(f"rank {r}: file says host {h!r}, topology puts {g} on {topology.host_of(g)!r}")
                if len(problems) > 8:
                    break
    data = tree_data(f.plan, topology, nbytes, mode=args.mode)
    best = build("auto", topology, gpus, nbytes=nbytes, search=n <= 8)
    mine = data["predicted"]["allreduce"]["time_us"] * 1e-6
    theirs = predict_tree(Placement(topology, gpus), best, nbytes, mode=args.mode).time
    data.update(
        {
            "file": args.file,
            "ok": not problems,
            "problems": problems,
            "topology_gpus": total,
            "auto": {"name": best.name, "allreduce_us": theirs * 1e6},
            "ratio_to_auto": mine / theirs if theirs > 0 else 1.0,
        }
    )
    return data


def _render_check(d: dict) -> str:
    if "trees" not in d:
        return "\n".join([f"{d['file']}: does not fit"] + [f"  {p}" for p in d["problems"]])
    lines = [render_tree(d)]
    lines.append(
        f"the auto builder's tree ({d['auto']['name']}; not simulate's auto column, which may hand the allreduce "
        f"to the backend): allreduce {d['auto']['allreduce_us']:.1f} us; "
        f"this tree is {d['ratio_to_auto']:.2f}x of it"
    )
    lines.append("OK: the tree fits the topology" if d["ok"] else "PROBLEMS:")
    lines += [f"  {p}" for p in d["problems"]]
    return "\n".join(lines)


def bruteforce_data(
    topology: Topology,
    *,
    ranks: int | None = None,
    sizes: Sequence[int] = (8, 1 << 20, 16 << 20),
    trees: str = "symmetry",
) -> dict[str, Any]:
    """What ``tree bruteforce`` prints: per size, the least predicted allreduce time over the
    ``trees`` (:data:`BRUTE_TREES`) of the first ``ranks`` GPUs of ``topology`` and what ``auto``
    builds; times in µs, ``gap_ns`` = auto − least."""
    import time

    from treecoll.collectives import bruteforce
    from treecoll.collectives.builders import build
    from treecoll.collectives.cost import CostModel

    total = len(topology.rank_gpus())
    n = total if ranks is None else ranks
    if n > min(total, MAX_BRUTE_RANKS):
        raise TreeError(
            f"tree bruteforce: expected at most {min(total, MAX_BRUTE_RANKS)} ranks (the GPUs of "
            f"topology {topology.name!r}, and the enumeration's limit), got {n}; pass --ranks"
        )
    if trees not in BRUTE_TREES:
        raise TreeError(f"tree bruteforce: trees expected one of {list(BRUTE_TREES)}, got {trees!r}")
    if trees == "all" and n ** (n - 1) > MAX_ALL_TREES:
        raise TreeError(
            f"tree bruteforce --trees all: {n} ranks make {n ** (n - 1):,} rooted trees ({n}^{n - 1}) per size: "
            f"expected at most {MAX_ALL_TREES:,}; pass --trees symmetry (exhaustive up to the topology's "
            "automorphisms) or fewer --ranks"
        )
    gpus = _gpus(topology, n)
    model = CostModel(topology, gpus)
    rows = []
    for nbytes in sizes:
        t0 = time.perf_counter()
        candidates = {
            "symmetry": lambda: bruteforce.trees_up_to_symmetry(model),
            "all": lambda: None,
            "shapes": lambda: bruteforce.shapes(n),
        }[trees]()
        least, best = bruteforce.brute_force(model, nbytes, trees=candidates)
        a = build("auto", topology, gpus, nbytes=nbytes, model=model)
        auto_s = model.best_nchunks(a, nbytes)[1]
        rows.append(
            {
                "bytes": nbytes,
                "brute_force_us": least * 1e6,
                "best_parents": list(best.parents),
                "auto": a.name,
                "auto_us": auto_s * 1e6,
                "gap_ns": (auto_s - least) * 1e9,
                "seconds": time.perf_counter() - t0,
            }
        )
    return {
        "topology": topology.name,
        "ranks": n,
        "gpus": list(gpus),
        "trees": trees,
        "model": BRUTE_MODEL,
        "rows": rows,
    }


def render_bruteforce(d: dict) -> str:
    """The text view of :func:`bruteforce_data`: the model its times are from, then one line per size."""
    head = (
        f"# allreduce times under the closed-form cost model auto's search scores ({BRUTE_MODEL}), each tree "
        "at its best chunk count"
    )
    return "\n".join(
        [head]
        + [
            f"{d['topology']} P={d['ranks']} {r['bytes']} B: brute force {r['brute_force_us']:.3f} us "
            f"{tuple(r['best_parents'])}; auto {r['auto_us']:.3f} us ({r['auto']}); auto - min "
            f"{r['gap_ns']:+.4f} ns; {r['seconds']:.0f} s"
            for r in d["rows"]
        ]
    )


def _draw(args) -> dict:
    output_path(args.output, inputs=[args.file, args.topology], suffixes=IMAGE_SUFFIXES)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependency("matplotlib", "treecoll tree draw", extra="plot") from None
    if not machine_given(args) and args.max_hosts is not None:
        raise units.UsageError(
            "tree draw: --max-hosts applies to the topology picture, which needs --topology; pass --topology or drop it"
        )
    f = _load(args)
    topology = _topology(args)
    data = tree_data(f.plan, topology, hosts=f.hosts)
    colors = {
        "NVL": "tab:green",
        "NVB": "tab:olive",
        "PIX": "tab:blue",
        "PXB": "tab:blue",
        "PHB": "tab:purple",
        "SYS": "tab:red",
        "NET": "tab:orange",
        "C2C": "tab:cyan",
    }
    ntrees = len(data["trees"])
    if topology is not None:
        # the tree over the topology picture: one arrow per edge, child GPU -> parent GPU
        from treecoll.topo.render import draw

        palette = ["crimson", "darkorange", "gold", "teal", "navy", "purple", "brown", "magenta"]
        overlay = [
            (
                e["child_gpu"],
                e["parent_gpu"],
                palette[ti % len(palette)]
                if ntrees > 1
                else ("tab:orange" if e.get("inter_host") else colors.get(e.get("nccl"), "gray")),
            )
            for ti, t in enumerate(data["trees"])
            for e in t["edges"]
        ]
        with atomic_output(args.output) as tmp:
            out = draw(
                topology,
                tmp,
                overlay=overlay,
                max_hosts=4 if args.max_hosts is None else args.max_hosts,
                title=f"{data['name']} over {topology.name} ({ntrees} tree(s), child -> parent)",
            )
        return {
            "output": args.output,
            "ranks": data["ranks"],
            "trees": ntrees,
            "over_topology": True,
            "edges_drawn": out["overlay"],
            "hosts_drawn": out["hosts_drawn"],
        }
    fig, axes = plt.subplots(1, ntrees, figsize=(max(6, min(0.25 * data["ranks"], 30)), 5), squeeze=False)
    for ax, t in zip(axes[0], data["trees"]):
        depth = {t["root"]: 0}
        order = [t["root"]]
        for r in order:
            for c in t["children"][r]:
                depth[c] = depth[r] + 1
                order.append(c)
        # leaves left to right in DFS order, parents centred over their children
        x: dict[int, float] = {}
        nxt = [0.0]

        def place(r: int, t: dict = t, x: dict = x, nxt: list = nxt) -> float:
            kids = t["children"][r]
            if not kids:
                x[r] = nxt[0]
                nxt[0] += 1
            else:
                xs = [place(c) for c in kids]
                x[r] = sum(xs) / len(xs)
            return x[r]

        place(t["root"])
        for e in t["edges"]:
            c, p = e["child"], e["parent"]
            col = "tab:orange" if e.get("inter_host") else colors.get(e.get("nccl"), "gray")
            ax.plot([x[c], x[p]], [-depth[c], -depth[p]], color=col, lw=1.2, zorder=1)
        for r in order:
            ax.scatter([x[r]], [-depth[r]], s=80, color="white", edgecolors="black", zorder=2)
            ax.text(x[r], -depth[r], str(r), ha="center", va="center", fontsize=6, zorder=3)
        ax.set_title(f"{t['name'] or data['name']} (share {t['share']:.2g})", fontsize=8)
        ax.axis("off")
    fig.tight_layout()
    with atomic_output(args.output) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return {"output": args.output, "ranks": data["ranks"], "trees": ntrees}


def run(args: argparse.Namespace) -> int:
    cmd = args.tree_cmd
    if cmd == "build":
        return emit(args, _build(args), render_tree)
    if cmd == "show":
        d = _show(args)
        if "nccl_graphs" in d:
            return emit(
                args,
                d,
                lambda d: "\n".join(
                    f"graph {g['id']} {g['kind']} (pattern {g['pattern']}): "
                    + "; ".join(" ".join(map(str, c)) for c in g["channels"])
                    for g in d["nccl_graphs"]
                ),
            )
        return emit(args, d, render_tree)
    if cmd == "check":
        d = _check(args)
        emit(args, d, _render_check)
        return 0 if d["ok"] else 1
    if cmd == "draw":
        return emit(args, _draw(args), lambda d: f"wrote {d['output']} ({d['ranks']} ranks, {d['trees']} tree(s))")
    if cmd == "bruteforce":
        data = bruteforce_data(
            _topology(args, required="tree bruteforce"), ranks=args.ranks, sizes=args.sizes, trees=args.trees
        )
        return emit(args, data, render_bruteforce)
    raise TreeError(f"tree: unknown subcommand {cmd!r}")  # pragma: no cover
