"""Benchmark: tree-attention decoding vs Ring Attention vs the paper's three all-reduces.

Not a test.  P gloo processes on this machine (127.0.0.1), Llama-3.1-8B
attention shapes (32 query heads, 8 KV heads, head_dim 128, bf16 KV cache), one
attention layer, batch 1 and 4, total context 16k..256k tokens split over the
ranks (round-robin blocks of 256 tokens).  Two measurements in one run:

(a) the whole decode step (append the new token, local attention, combine),
    via :func:`treecoll.tools.cmd_decode.worker`: median over steps 2..n of the max
    over ranks; bytes sent per rank (bytes handed to torch.distributed in one
    step); peak memory per rank (KV cache bytes + peak of live tensor bytes
    allocated during one step, torch profiler memory events);
(b) the combine alone, states already computed: ``tree`` = our one tree
    reduction of the packed state plus the broadcast down the same tree (every
    rank gets the result, like an all-reduce), compiled as one schedule
    (``collectives.allreduce`` with ``CollectiveOptions(algo="tree")``), as :func:`attention.tree_combine`
    runs it; ``tree_separate`` (the same messages as two calls,
    ``collectives.reduce`` then ``collectives.broadcast``),
    ``tree_root_only`` (the reduction alone), ``tree_native_bcast`` (the tree reduction, then the backend's own
    ``torch.distributed.broadcast``), ``allreduce3`` (max, numerator, denominator all-reduces), and
    ``floor`` = one ``torch.distributed.all_reduce`` (SUM) of the same packed
    bytes: the cost of a single collective on this engine.  Per iteration:
    barrier, time the call on every rank, take the max over ranks; median over
    iterations (methods interleaved so they see the same machine load).

Usage::

    python -m treecoll.tools.bench_tree_attention                      # full sweep
    python -m treecoll.tools.bench_tree_attention --quick              # small smoke run
    python -m treecoll.tools.bench_tree_attention --nprocs 4 --tokens 65536 --batch 1

Writes JSON (``--json``, default out/bench_tree_attention.json) and a plot
(``--plot``, default out/bench_tree_attention.png; needs matplotlib) and prints
tables.  Targets (:func:`targets`) are checked and printed as met / not met.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from treecoll.tools import units
from treecoll.tools.cli import script_main
from treecoll.tools.cmd_decode import check_start
from treecoll.tools.resources import OVERSUBSCRIBE_HELP

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B attention
COMBINE = ("tree", "tree_root_only", "tree_native_bcast", "tree_separate", "allreduce3", "floor")


def _combine_bench(rank: int, world: int, batch: int, iters: int) -> dict:
    import torch
    import torch.distributed as dist
    from treecoll.attention.baselines import allreduce3_combine
    from treecoll.attention.state import pack_state
    from treecoll.attention.tree_decode import resolve_tree, tree_combine

    g = torch.Generator().manual_seed(rank)
    out = torch.randn(batch, HEADS, HEAD_DIM, generator=g)
    lse = torch.randn(batch, HEADS, generator=g) * 3
    t = resolve_tree("auto")
    packed = pack_state(out, lse)

    def floor():
        buf = packed.clone()
        dist.all_reduce(buf)

    fns = {"tree": lambda: tree_combine(out, lse, tree=t),
           "tree_root_only": lambda: tree_combine(out, lse, tree=t, root_only=True),
           "tree_native_bcast": lambda: tree_combine(out, lse, tree=t, bcast="native"),
           "tree_separate": lambda: tree_combine(out, lse, tree=t, bcast="separate"),
           "allreduce3": lambda: allreduce3_combine(out, lse),
           "floor": floor}
    for _ in range(10):
        for f in fns.values():
            dist.barrier()
            f()
    times = {k: [] for k in fns}
    for _ in range(iters):
        for k, f in fns.items():
            dist.barrier()
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {"times": times, "bytes": packed.numel() * 4, "tree": list(t.parents)}


def _group_worker(rank: int, world: int, plan: dict) -> dict:
    import gc

    from treecoll.tools.cmd_decode import worker

    res = {"steps": [], "combine": []}
    for cfg in plan["steps"]:
        res["steps"].append(worker(rank, world, cfg))
        gc.collect()
    for batch in plan["combine_batches"]:
        res["combine"].append(_combine_bench(rank, world, batch, plan["iters"]))
    return res


def _summarize_combine(ranks: list[dict], i: int) -> dict:
    per = [r["combine"][i] for r in ranks]
    out = {"bytes": per[0]["bytes"], "tree": per[0]["tree"]}
    for k in per[0]["times"]:
        it = [max(ts) for ts in zip(*(p["times"][k] for p in per))]
        out[k] = {"median_s": statistics.median(it), "min_s": min(it)}
    return out


def _steps(args) -> list[dict]:
    """The decode configurations (``treecoll decode``'s) one process group runs in turn."""
    return [{"seq_len": n, "batch": batch, "layers": 1, "heads": HEADS, "kv_heads": KV_HEADS,
             "head_dim": HEAD_DIM, "new_tokens": args.steps, "dtype": "bfloat16",
             "block_size": 256, "methods": ["tree", "ring", "allreduce3"], "seed": 0,
             "topology": None, "check": n <= args.check_max_tokens}
            for batch in args.batch for n in args.tokens if not (batch > 1 and n > args.batch_max_tokens)]


def run(args) -> dict:
    from treecoll.collectives.launch import spawn
    from treecoll.tools.cmd_decode import summarize

    result = {"machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}, "runs": [],
              "combine": [], "args": vars(args)}
    for P in args.nprocs:
        steps = _steps(args)
        plan = {"steps": steps, "combine_batches": args.batch, "iters": args.iters}
        t0 = time.perf_counter()
        ranks = spawn(_group_worker, P, plan, timeout=args.timeout)
        print(f"P={P}: {time.perf_counter() - t0:.0f} s, load average {os.getloadavg()}", flush=True)
        for i, cfg in enumerate(steps):
            s = summarize(cfg, [r["steps"][i] for r in ranks], P)
            s["loadavg"] = os.getloadavg()
            result["runs"].append(s)
            _print_step(s)
        for i, batch in enumerate(args.batch):
            c = _summarize_combine(ranks, i)
            c.update({"nproc": P, "batch": batch})
            result["combine"].append(c)
            _print_combine(c)
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["targets"] = targets(result)
    return result


def _print_step(s: dict) -> None:
    c = s["config"]
    m = s["methods"]
    line = (f"  step P={s['nproc']} B={c['batch']} N={c['seq_len']:>6}: "
            + "  ".join(f"{k} {v['median_step_s'] * 1e6:>9.0f} us / {max(v['bytes_sent_per_rank']) / 1e6:8.3f} MB"
                        f" / peak {max(v['peak_bytes_per_rank']) / 1e6:8.1f} MB"
                        + ("" if v["max_abs_err"] is None else f" / err {v['max_abs_err']:.0e}")
                        for k, v in m.items()))
    print(line, flush=True)


def _print_combine(c: dict) -> None:
    print(f"  combine P={c['nproc']} B={c['batch']} ({c['bytes']} B packed): "
          + "  ".join(f"{k} {c[k]['median_s'] * 1e6:.0f} us" for k in COMBINE), flush=True)


def targets(result: dict) -> list[dict]:
    """The benchmark's targets (met / not met), evaluated on the measured numbers."""
    out = []
    for c in result["combine"]:
        if c["nproc"] == 4:
            r = c["allreduce3"]["median_s"] / c["tree"]["median_s"]
            out.append({"target": f"(b) P=4 B={c['batch']}: tree >= 2.5x faster than three all-reduces",
                        "value": round(r, 2), "met": r >= 2.5})
            r = c["tree"]["median_s"] / c["floor"]["median_s"]
            out.append({"target": f"(b) P=4 B={c['batch']}: tree within 1.2x of one all_reduce",
                        "value": round(r, 2), "met": r <= 1.2})
    for s in result["runs"]:
        m, c = s["methods"], s["config"]
        tag = f"P={s['nproc']} B={c['batch']} N={c['seq_len']}"
        r = m["tree"]["median_step_s"] / m["allreduce3"]["median_step_s"]
        out.append({"target": f"(a) {tag}: tree step not slower than three all-reduces",
                    "value": round(r, 3), "met": r <= 1.0})
        r = max(m["tree"]["peak_bytes_per_rank"]) / max(m["ring"]["peak_bytes_per_rank"])
        out.append({"target": f"(a) {tag}: tree peak memory <= 0.6x ring's", "value": round(r, 3), "met": r <= 0.6})
        if s["nproc"] == 4 and c["seq_len"] == 65536:
            r = m["ring"]["median_step_s"] / m["tree"]["median_step_s"]
            out.append({"target": f"(a) {tag}: tree >= 10x faster than ring", "value": round(r, 2),
                        "met": r >= 10})
    by = {}
    for s in result["runs"]:
        by.setdefault((s["nproc"], s["config"]["batch"]), set()).add(tuple(s["methods"]["tree"]["bytes_sent_per_rank"]))
    for (p, b), v in sorted(by.items()):
        out.append({"target": f"(a) P={p} B={b}: tree bytes per step independent of context",
                    "value": sorted(v), "met": len(v) == 1})
    return out


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is not installed (pip install 'treecoll[plot]')")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for (p, b), style in zip(sorted({(s["nproc"], s["config"]["batch"]) for s in result["runs"]}),
                             ["-", "--", ":", "-."]):
        runs = sorted((s for s in result["runs"] if s["nproc"] == p and s["config"]["batch"] == b),
                      key=lambda s: s["config"]["seq_len"])
        xs = [s["config"]["seq_len"] for s in runs]
        for name, color in (("tree", "C0"), ("ring", "C3"), ("allreduce3", "C2")):
            axes[0].plot(xs, [s["methods"][name]["median_step_s"] * 1e3 for s in runs], style, color=color,
                         marker="o", label=f"{name} P={p} B={b}")
            axes[1].plot(xs, [max(s["methods"][name]["bytes_sent_per_rank"]) for s in runs], style, color=color,
                         marker="o", label=f"{name} P={p} B={b}")
    for ax, title, unit in ((axes[0], "(a) decode step latency", "ms"), (axes[1], "(a) bytes sent per rank", "B")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("total context tokens")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=6)
    labels, vals = [], {k: [] for k in COMBINE}
    for c in result["combine"]:
        labels.append(f"P={c['nproc']} B={c['batch']}")
        for k in vals:
            vals[k].append(c[k]["median_s"] * 1e6)
    w = 0.14
    for i, (k, v) in enumerate(vals.items()):
        axes[2].bar([j + i * w for j in range(len(labels))], v, w, label=k)
    axes[2].set_xticks([j + 2.5 * w for j in range(len(labels))], labels)
    axes[2].set_ylabel("us")
    axes[2].set_title("(b) combine alone (median)")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nprocs", type=units.ints_arg("--nprocs"), default=[2, 4],
                   help="process counts, comma-separated (default 2,4)")
    p.add_argument("--oversubscribe", action="store_true", help=OVERSUBSCRIBE_HELP)
    p.add_argument("--tokens", type=units.counts_arg("--tokens"), default=[16384, 65536, 262144],
                   help="total context tokens, comma-separated; k = 1e3 (default 16384,65536,262144)")
    p.add_argument("--batch", type=units.ints_arg("--batch"), default=[1, 4],
                   help="batch sizes, comma-separated (default 1,4)")
    p.add_argument("--batch-max-tokens", type=units.count_arg("--batch-max-tokens"), default=65536,
                   help="largest context for batch > 1 (memory)")
    p.add_argument("--check-max-tokens", type=units.count_arg("--check-max-tokens"), default=16384,
                   help="check against one process up to this context (the check replays every step)")
    p.add_argument("--steps", type=units.int_arg("--steps", minimum=2), default=6,
                   help="decode steps per method (the first is a warm-up)")
    p.add_argument("--iters", type=units.int_arg("--iters"), default=200, help="combine iterations per method")
    p.add_argument("--timeout", type=units.seconds_arg("--timeout"), default=1800.0,
                   help="seconds per process group before it is killed (default 1800)")
    p.add_argument("--quick", action="store_true", help="P=2,4, 16k tokens, batch 1, 3 steps, 50 iterations")
    p.add_argument("--json", default="out/bench_tree_attention.json", help="where to write the JSON results")
    p.add_argument("--plot", default="out/bench_tree_attention.png", help="where to write the plot ('' for none)")
    args = p.parse_args(argv)
    if args.quick:
        args.tokens, args.batch, args.steps, args.iters = [16384], [1], 3, 50
    for P in args.nprocs:
        for cfg in _steps(args):
            check_start(cfg, P, oversubscribe=args.oversubscribe, option="--nprocs")
    result = run(args)
    print("\ntargets:")
    for t in result["targets"]:
        print(f"  [{'met' if t['met'] else 'NOT met'}] {t['target']}: {t['value']}")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
    print(f"json: {path}")
    if args.plot:
        plot(result, Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(script_main(main))
