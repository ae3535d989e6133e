"""``treecoll simulate``: predict collectives and decode steps on a topology you may not have.

    treecoll simulate allreduce --topology F --algo ring,tree,two_level,auto,nccl --sizes 8B:1GiB
                                [--ranks N] [--profile P] [--json] [--plot out.png]
    treecoll simulate decode --topology F --seq-len 1M[,2M...] --heads 16 --head-dim 128 [--kv-heads 8]
                             [--batch B] [--ranks N] [--tree two_level] [--plot out.png]
    treecoll simulate links --topology F --algo two_level --size 1GiB [--top 10]

``--algo``: ``ring`` (NCCL's ring, lockstep model), ``tree`` (NCCL's double
binary tree, :func:`collectives.builders.double_binary`), ``nvls`` (NCCL's
NVLink SHARP reduction in the NVSwitches, NVLSTree across hosts:
:mod:`collectives.sim_nvls`; Hopper and later NVSwitch systems), any builder
name of :mod:`collectives.builders` (``two_level``, ``auto``, ``binomial``,
``kary:4``, ...), and ``nccl``: NCCL's own analytical model
(:func:`collectives.nccl_model.nccl_predict`, the fastest of the algorithms NCCL
offers there: ring, tree and where it runs NVLS),
a separate line for comparison. Simulated algorithms use the fastest NCCL
protocol profile per size unless ``--profile`` names one (``ideal``,
``nccl-simple``, a calibrated YAML...). Sizes: ``A:B`` doubles from A to B,
or a comma list; units B, K/KiB, M/MiB, G/GiB (powers of 1024). Token counts
(``--seq-len``) use k = 1e3, M = 1e6 like the paper (80k ... 5.12M).
Sweeps show a progress bar on stderr when it is a terminal.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from topo.errors import CollectiveError

from . import units

def parse_sizes(spec: str) -> list[int]:
    """``"8B:1GiB"`` (doubling) or ``"1K,1MiB"`` (units: :mod:`tools.units`)."""
    return units.parse_sizes(spec, what="--sizes", error=CollectiveError)


def _progress(i: int, n: int, what: str) -> None:
    if n > 1 and sys.stderr.isatty():
        w = 30
        k = int(w * i / n)
        sys.stderr.write(f"\r[{'#' * k}{'.' * (w - k)}] {i}/{n} {what:<24}")
        if i == n:
            sys.stderr.write("\r" + " " * (w + 40) + "\r")
        sys.stderr.flush()


def add_parser(subparsers) -> argparse.ArgumentParser:
    from tools.cli import common_options
    p = subparsers.add_parser("simulate", help="simulate collectives and decode steps on a topology")
    common_options(p)
    sub = p.add_subparsers(dest="sim_command", metavar="WHAT")
    sub.required = True

    def base(name, help_):
        q = sub.add_parser(name, help=help_)
        common_options(q)
        q.add_argument("--topology", default="default", help="YAML file, shipped name or 'default'")
        q.add_argument("--ranks", type=int, default=None, help="use the first N ranks (default all GPUs)")
        q.add_argument("--profile", default=None, help="simulator profile (default: fastest NCCL protocol)")
        return q

    a = base("allreduce", "time, algbw and busbw per size and algorithm (nccl-tests style)")
    a.add_argument("--algo", default="ring,tree,two_level,auto,nccl", help="comma list of algorithms")
    a.add_argument("--sizes", default="8B:1GiB", help="A:B (doubling) or a comma list")
    a.add_argument("--plot", default=None, help="write a log-log busbw plot (PNG)")
    d = base("decode", "tree attention vs three allreduces vs ring attention, one decode step")
    d.add_argument("--seq-len", default="1M", help="tokens of KV cache (k = 1e3, M = 1e6), comma list allowed")
    d.add_argument("--heads", type=int, default=16)
    d.add_argument("--head-dim", type=int, default=128)
    d.add_argument("--kv-heads", type=int, default=None)
    d.add_argument("--batch", type=int, default=1)
    d.add_argument("--dtype", default="bfloat16")
    d.add_argument("--tree", default="two_level", help="tree builder for tree attention")
    d.add_argument("--plot", default=None, help="write a log-log time vs sequence length plot (PNG)")
    lk = base("links", "the busiest links of one run")
    lk.add_argument("--algo", default="two_level")
    lk.add_argument("--size", default="1GiB")
    lk.add_argument("--top", type=int, default=10)
    return p


def run(args: argparse.Namespace) -> int:
    from tools.cli import emit
    from topo.yaml_io import resolve
    topology = resolve(args.topology)
    if args.sim_command == "allreduce":
        data = allreduce_data(topology, [a.strip() for a in args.algo.split(",") if a.strip()],
                              parse_sizes(args.sizes), args.ranks, args.profile)
        if args.plot:
            plot_allreduce(data, args.plot)
            data["plot"] = args.plot
        return emit(args, data, render_allreduce)
    if args.sim_command == "decode":
        from collectives.sim_decode import DecodeShape
        seqs = [units.parse_count(s, what="--seq-len", error=CollectiveError)
                for s in args.seq_len.split(",") if s.strip()]
        data = decode_data(topology, [DecodeShape(seq_len=n, heads=args.heads, head_dim=args.head_dim,
                                                  kv_heads=args.kv_heads, batch=args.batch, dtype=args.dtype)
                                      for n in seqs], args.ranks, args.tree, args.profile)
        if args.plot:
            plot_decode(data, args.plot)
            data["plot"] = args.plot
        return emit(args, data, render_decode)
    data = links_data(topology, args.algo, units.parse_bytes(args.size, what="--size", error=CollectiveError), args.ranks, args.profile, args.top)
    return emit(args, data, render_links)


def _one(topology, algo: str, size: int, ranks, profile):
    """(time s, busbw, algbw, label) of one algorithm at one size."""
    from collectives.sim import bandwidths, rank_gpus_of, simulate_algorithm
    if algo == "nccl":
        from collectives.nccl_model import nccl_algos, nccl_predict
        gpus = rank_gpus_of(topology, ranks)
        best = min((nccl_predict(topology, list(gpus), size, algo=a) for a in nccl_algos(topology, gpus)),
                   key=lambda r: r["time"])
        alg, bus = bandwidths("allreduce", size, len(gpus), best["time"])
        return best["time"], bus, alg, f"{best['algo']}/{best['proto']}"
    name = "double_binary" if algo == "tree" else algo
    r = simulate_algorithm(topology, name, size, ranks=ranks, profile=profile or "auto")
    return r.time, r.busbw, r.algbw, r.profile


#: --algo names besides the tree builders of collectives.builders
SIM_ALGOS = ("ring", "tree", "nvls", "nccl")


def check_algos(algos) -> None:
    """Refuse an unknown --algo name before any work, listing every valid one."""
    from collectives.builders import BUILDERS
    for a in algos:
        if a not in SIM_ALGOS and a.partition(":")[0] not in BUILDERS:
            raise CollectiveError(f"--algo {a!r}: unknown; expected one of {list(SIM_ALGOS)} or a tree builder "
                                  f"{sorted(BUILDERS)} (e.g. kary:4)")


def allreduce_data(topology, algos, sizes, ranks=None, profile=None) -> dict[str, Any]:
    from collectives.sim import rank_gpus_of
    check_algos(algos)
    P = len(rank_gpus_of(topology, ranks))
    rows = []
    total = len(algos) * len(sizes)
    k = 0
    for size in sizes:
        row = {"size": size, "algos": {}}
        for a in algos:
            _progress(k, total, f"{a} {size} B")
            t, bus, alg, label = _one(topology, a, size, ranks, profile)
            row["algos"][a] = {"time_us": t * 1e6, "algbw": alg, "busbw": bus, "how": label}
            k += 1
        rows.append(row)
    _progress(total, total, "")
    return {"topology": topology.name, "nranks": P, "collective": "allreduce", "algos": list(algos),
            "profile": profile or "auto (fastest NCCL protocol)", "rows": rows}


def render_allreduce(d: dict) -> str:
    head = f"# allreduce on {d['topology']} ({d['nranks']} ranks), profile {d['profile']}\n"
    cols = "".join(f" | {a:^30}" for a in d["algos"])
    sub = "".join(f" | {'time(us)':>10} {'algbw':>9} {'busbw':>9}" for _ in d["algos"])
    lines = [head + f"{'':>12}{cols}", f"{'size (B)':>12}{sub}"]
    for r in d["rows"]:
        cells = "".join(f" | {v['time_us']:>10.1f} {v['algbw']:>9.2f} {v['busbw']:>9.2f}"
                        for v in (r["algos"][a] for a in d["algos"]))
        lines.append(f"{r['size']:>12}{cells}")
    return "\n".join(lines) + "\n(algbw, busbw in GB/s as nccl-tests defines them)"


def _plt():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from topo.errors import MissingDependency
        raise MissingDependency("--plot needs matplotlib: pip install 'treecoll[plot]'") from None
    return plt


def plot_allreduce(d: dict, path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["size"] for r in d["rows"]]
    for a in d["algos"]:
        ax.plot(xs, [max(r["algos"][a]["busbw"], 1e-6) for r in d["rows"]], marker="o", ms=3, label=a)
    ax.set_xscale("log", base=2)
    _finish_plot(plt, fig, ax, "message size (bytes)", "busbw (GB/s)",
                 f"allreduce on {d['topology']} ({d['nranks']} ranks)", path)


def _finish_plot(plt, fig, ax, xlabel: str, ylabel: str, title: str, path: str) -> None:
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def decode_data(topology, shapes, ranks=None, tree="two_level", profile=None) -> dict[str, Any]:
    from collectives.sim_decode import decode_step
    runs = []
    for i, s in enumerate(shapes):
        _progress(i, len(shapes), f"{s.seq_len} tokens")
        runs.append(decode_step(topology, s, ranks=ranks, tree=tree, profile=profile or "auto"))
    _progress(len(shapes), len(shapes), "")
    return {"topology": topology.name, "tree": tree, "runs": runs}


def render_decode(d: dict) -> str:
    lines = []
    for r in d["runs"]:
        s = r["shape"]
        lines.append(f"# decode step on {d['topology']}: {r['nranks']} GPUs ({r['hosts']} hosts), "
                     f"{s['seq_len']} tokens ({r['tokens_per_rank']}/GPU), b={s['batch']}, heads={s['heads']} "
                     f"(kv {s['kv_heads']}) x {s['head_dim']}, {s['dtype']}")
        lines.append(f"{'method':<12} {'time(us)':>11} {'local(us)':>10} {'combine(us)':>12} {'sent/GPU':>12} "
                     f"{'peak mem/GPU':>13} {'paper vol(el)':>14}")
        for name, m in r["methods"].items():
            lines.append(f"{name:<12} {m['time_s'] * 1e6:>11.1f} {m['local_s'] * 1e6:>10.1f} "
                         f"{m['combine_s'] * 1e6:>12.1f} {_b(m['sent_bytes_per_gpu']):>12} "
                         f"{_b(m['peak_mem_bytes']):>13} {m['paper_volume_elements']:>14.4g}")
        if "speedup_tree_vs_ring" in r:
            lines.append(f"tree attention vs ring attention: {r['speedup_tree_vs_ring']:.1f}x faster")
        lines.append("")
    return "\n".join(lines)


def _b(x: float) -> str:
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if x >= f:
            return f"{x / f:.2f} {unit}"
    return f"{x:.0f} B"


def plot_decode(d: dict, path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["shape"]["seq_len"] for r in d["runs"]]
    for m in d["runs"][0]["methods"]:
        ax.plot(xs, [r["methods"][m]["time_s"] * 1e6 for r in d["runs"]], marker="o", label=m)
    ax.set_xscale("log")
    _finish_plot(plt, fig, ax, "sequence length (tokens)", "decode step attention time (µs)",
                 f"decode on {d['topology']} ({d['runs'][0]['nranks']} GPUs)", path)


def links_data(topology, algo: str, size: int, ranks=None, profile=None, top: int = 10) -> dict[str, Any]:
    from collectives.sim import simulate_algorithm
    check_algos([algo])
    name = "double_binary" if algo == "tree" else algo
    if name == "nccl":
        raise CollectiveError("simulate links: 'nccl' is an analytical model without links; "
                              "pick ring, tree, nvls or a builder name")
    r = simulate_algorithm(topology, name, size, ranks=ranks, profile=profile or "auto", top=top)
    return {"topology": topology.name, "algo": algo, "nranks": r.nranks, "size": size, "time_us": r.time * 1e6,
            "busbw": r.busbw, "profile": r.profile, "kind_bytes": r.kind_bytes, "busiest": list(r.busiest),
            "peak_scratch_max_bytes": max(r.peak_scratch, default=0.0)}


def render_links(d: dict) -> str:
    lines = [f"# {d['algo']} allreduce of {d['size']} B on {d['topology']} ({d['nranks']} ranks): "
             f"{d['time_us']:.1f} us, busbw {d['busbw']:.2f} GB/s ({d['profile']})",
             "bytes per link kind: " + ", ".join(f"{k} {_b(v)}" for k, v in d["kind_bytes"].items()),
             f"{'link':<44} {'kind':<7} {'bytes':>10} {'busy':>6}"]
    for b in d["busiest"]:
        lines.append(f"{b['link']:<44} {b['kind']:<7} {_b(b['bytes']):>10} {100 * b['busy']:>5.1f}%")
    lines.append(f"peak scratch per GPU: {_b(d['peak_scratch_max_bytes'])}")
    return "\n".join(lines)
