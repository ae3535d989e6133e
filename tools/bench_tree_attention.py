"""Benchmark: tree-attention decoding against the gather combine, Ring Attention and the paper's three all-reduces.

Not a test.  P gloo processes on this machine (127.0.0.1), Llama-3.1-8B
attention shapes (32 query heads, 8 KV heads, head_dim 128, bf16 KV cache), one
attention layer, batch 1 and 4, total context 16k..256k tokens split over the
ranks (round-robin blocks of 256 tokens).  Two measurements in one run:

(a) the whole decode step (append the new token, local attention, combine) of
    every decode method (:data:`treecoll.attention.baselines.METHODS`: ``tree``,
    ``gather``, ``ring``, ``allreduce3``), via :func:`treecoll.tools.cmd_decode.worker`:
    median over steps 2..n of the max over ranks; bytes sent per rank (bytes
    handed to torch.distributed in one step); peak memory per rank (KV cache
    bytes + peak of live tensor bytes allocated during one step, torch profiler
    memory events);
(b) the combine alone, states already computed, every ``combine=`` method of
    :func:`treecoll.attention.tree_combine`: ``tree`` (the tree reduction and the
    broadcast down the same tree compiled as one schedule), ``tree_separate``
    (the same messages as two calls, reduce then broadcast), ``tree_root_only``
    (the reduction alone), ``tree_native_bcast`` (the tree reduction, then the
    backend's own ``torch.distributed.broadcast``), ``gather`` (one all-gather of
    the P packed states, then a local merge), ``allreduce3`` (max, numerator,
    denominator all-reduces), ``auto`` (what the cost model picks; the pick is
    printed), and ``floor`` = one ``torch.distributed.all_reduce`` (SUM) of the
    same packed bytes: the cost of a single collective on this engine.
    Repetitions interleaved (:func:`treecoll.tools.bench.harness.interleaved`:
    barrier, time the call on every rank, the slowest rank's time), median;
(c) the combines of (b) against what the cost model ``auto`` asks predicts for
    them on this group (:func:`treecoll.attention.cost.combine_times`), with
    each method's rank measured and predicted.

Usage::

    python -m treecoll.tools.bench_tree_attention                      # full sweep
    python -m treecoll.tools.bench_tree_attention --quick              # small smoke run
    python -m treecoll.tools.bench_tree_attention --nprocs 4 --tokens 65536 --batch 1

Writes JSON (``--json``) and a plot (``--plot``; needs matplotlib) and prints
tables.  Targets (:func:`targets`) are checked and printed as met / not met.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence

from treecoll.tools import units
from treecoll.tools.bench.harness import Benchmark, interleaved, slowest_rank
from treecoll.tools.cli import script_main
from treecoll.tools.cmd_decode import check_start
from treecoll.tools.resources import OVERSUBSCRIBE_HELP
from treecoll.topo.fmt import fmt_bytes, table

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B attention
STEP_METHODS = ("tree", "gather", "ring", "allreduce3")
COMBINE = ("tree", "tree_root_only", "tree_native_bcast", "tree_separate", "gather", "allreduce3", "auto", "floor")


def _combine_bench(rank: int, world: int, batch: int, repeats: int) -> dict:
    import torch
    import torch.distributed as dist
    from treecoll.attention.state import pack_state
    from treecoll.attention.tree_decode import choose_combine, resolve_tree, tree_combine

    g = torch.Generator().manual_seed(rank)
    out = torch.randn(batch, HEADS, HEAD_DIM, generator=g)
    lse = torch.randn(batch, HEADS, generator=g) * 3
    t = resolve_tree("auto")
    packed = pack_state(out, lse)

    def floor():
        buf = packed.clone()
        dist.all_reduce(buf)

    fns = {
        "tree": lambda: tree_combine(out, lse, tree=t, combine="tree"),
        "tree_root_only": lambda: tree_combine(out, lse, tree=t, root_only=True, combine="tree"),
        "tree_native_bcast": lambda: tree_combine(out, lse, tree=t, bcast="native", combine="tree"),
        "tree_separate": lambda: tree_combine(out, lse, tree=t, bcast="separate", combine="tree"),
        "gather": lambda: tree_combine(out, lse, combine="gather"),
        "allreduce3": lambda: tree_combine(out, lse, combine="allreduce3"),
        "auto": lambda: tree_combine(out, lse, combine="auto"),
        "floor": floor,
    }
    times = interleaved(fns, repeats, warmup=10, before=lambda _: dist.barrier(), combine=slowest_rank)
    return {
        "times": times,
        "bytes": packed.numel() * 4,
        "tree": list(t.parents),
        "auto_picks": choose_combine(batch, HEADS, HEAD_DIM),
        "model_s": _model_times(batch),
    }


def _model_times(batch: int) -> dict[str, float]:
    """What the cost model ``combine="auto"`` asks predicts for each combine on this group (seconds)."""
    from treecoll.attention import cost
    from treecoll.attention.tree_decode import _backend, group_placement

    t = cost.combine_times(group_placement(), batch, HEADS, HEAD_DIM, backend=_backend(None))
    return {m: v["time_s"] for m, v in t.items()}


def _group_worker(rank: int, world: int, plan: dict) -> dict:
    import gc

    from treecoll.tools.cmd_decode import worker

    res = {"steps": [], "combine": []}
    for cfg in plan["steps"]:
        res["steps"].append(worker(rank, world, cfg))
        gc.collect()
    for batch in plan["combine_batches"]:
        res["combine"].append(_combine_bench(rank, world, batch, plan["repeats"]))
    return res


def _summarize_combine(rank0: dict) -> dict:
    out = {
        "bytes": rank0["bytes"],
        "tree": rank0["tree"],
        "auto_picks": rank0["auto_picks"],
        "model_s": rank0["model_s"],
    }
    for k, ts in rank0["times"].items():
        out[k] = {"median_s": statistics.median(ts), "min_s": min(ts)}
    return out


def _steps(args) -> list[dict]:
    """The decode configurations (``treecoll decode``'s) one process group runs in turn."""
    return [
        {
            "seq_len": n,
            "batch": batch,
            "layers": 1,
            "heads": HEADS,
            "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "new_tokens": args.steps,
            "dtype": "bfloat16",
            "block_size": 256,
            "methods": list(STEP_METHODS),
            "seed": 0,
            "topology": None,
            "check": n <= args.check_max_tokens,
        }
        for batch in args.batch
        for n in args.tokens
        if not (batch > 1 and n > args.batch_max_tokens)
    ]


def run(args: argparse.Namespace) -> dict:
    from treecoll.collectives.launch import spawn
    from treecoll.tools.cmd_decode import summarize

    result = {"runs": [], "combine": []}
    for P in args.nprocs:
        steps = _steps(args)
        plan = {"steps": steps, "combine_batches": args.batch, "repeats": args.repeats}
        t0 = time.perf_counter()
        ranks = spawn(_group_worker, P, plan, timeout=args.timeout)
        print(f"P={P}: {time.perf_counter() - t0:.0f} s, load average {os.getloadavg()}", flush=True)
        for i, cfg in enumerate(steps):
            s = summarize(cfg, [r["steps"][i] for r in ranks], P)
            s["loadavg"] = os.getloadavg()
            result["runs"].append(s)
        for i, batch in enumerate(args.batch):
            c = _summarize_combine(ranks[0]["combine"][i])
            c.update({"nproc": P, "batch": batch})
            result["combine"].append(c)
    result["targets"] = targets(result)
    return result


def step_table(runs: list[dict]) -> str:
    """(a): one row per (P, batch, tokens, method)."""
    rows = []
    for s in runs:
        c = s["config"]
        for name, m in s["methods"].items():
            rows.append(
                [
                    s["nproc"],
                    c["batch"],
                    c["seq_len"],
                    name,
                    m["median_step_s"] * 1e3,
                    m["median_step_s"] / s["methods"]["tree"]["median_step_s"],
                    fmt_bytes(max(m["bytes_sent_per_rank"]), si=True),
                    fmt_bytes(max(m["peak_bytes_per_rank"]), si=True),
                    m["max_abs_err"],
                ]
            )
    return table(
        rows,
        ["P", "batch", "tokens", "method", "step ms", "vs tree", "sent/rank", "peak/rank", "max|err|"],
        formats=[None, None, None, None, ".2f", ".2f", None, None, ".0e"],
    )


def combine_table(combine: list[dict]) -> str:
    """(b): one row per (P, batch), one column per combine method (median microseconds)."""
    rows = [
        [
            c["nproc"],
            c["batch"],
            fmt_bytes(c["bytes"], si=True),
            *(c[k]["median_s"] * 1e6 for k in COMBINE),
            c["auto_picks"],
        ]
        for c in combine
    ]
    return table(
        rows,
        ["P", "batch", "state", *(f"{k} us" for k in COMBINE), "auto picks"],
        formats=[None, None, None, *(".0f" for _ in COMBINE), None],
    )


def model_table(combine: list[dict]) -> str:
    """(c): per (P, batch) and combine method, the measured median against the cost model's prediction,
    and each method's rank (1 = fastest) measured and predicted."""
    rows = []
    for c in combine:
        model = c["model_s"]
        measured = {m: c[m]["median_s"] for m in model}
        by_m, by_p = sorted(measured, key=measured.get), sorted(model, key=model.get)
        for m in model:
            rows.append(
                [
                    c["nproc"],
                    c["batch"],
                    m,
                    measured[m] * 1e6,
                    model[m] * 1e6,
                    measured[m] / model[m] if model[m] > 0 else float("nan"),
                    by_m.index(m) + 1,
                    by_p.index(m) + 1,
                ]
            )
    return table(
        rows,
        ["P", "batch", "method", "measured us", "model us", "measured/model", "rank measured", "rank model"],
        formats=[None, None, None, ".0f", ".0f", ".2f", None, None],
    )


def targets(result: dict) -> list[dict]:
    """The benchmark's targets (met / not met), evaluated on the measured numbers."""
    out = []
    for c in result["combine"]:
        if c["nproc"] == 4:
            r = c["allreduce3"]["median_s"] / c["tree"]["median_s"]
            out.append(
                {
                    "target": f"(b) P=4 B={c['batch']}: tree >= 2.5x faster than three all-reduces",
                    "value": round(r, 2),
                    "met": r >= 2.5,
                }
            )
            r = c["tree"]["median_s"] / c["floor"]["median_s"]
            out.append(
                {
                    "target": f"(b) P=4 B={c['batch']}: tree within 1.2x of one all_reduce",
                    "value": round(r, 2),
                    "met": r <= 1.2,
                }
            )
        best = min(c[k]["median_s"] for k in ("tree", "gather", "allreduce3"))
        r = c["auto"]["median_s"] / best
        out.append(
            {
                "target": f"(b) P={c['nproc']} B={c['batch']}: auto ({c['auto_picks']}) within 1.2x of the "
                f"fastest of tree, gather, allreduce3",
                "value": round(r, 2),
                "met": r <= 1.2,
            }
        )
    for s in result["runs"]:
        m, c = s["methods"], s["config"]
        tag = f"P={s['nproc']} B={c['batch']} N={c['seq_len']}"
        r = m["tree"]["median_step_s"] / m["allreduce3"]["median_step_s"]
        out.append(
            {"target": f"(a) {tag}: tree step not slower than three all-reduces", "value": round(r, 3), "met": r <= 1.0}
        )
        r = max(m["tree"]["peak_bytes_per_rank"]) / max(m["ring"]["peak_bytes_per_rank"])
        out.append({"target": f"(a) {tag}: tree peak memory <= 0.6x ring's", "value": round(r, 3), "met": r <= 0.6})
        if s["nproc"] == 4 and c["seq_len"] == 65536:
            r = m["ring"]["median_step_s"] / m["tree"]["median_step_s"]
            out.append({"target": f"(a) {tag}: tree >= 10x faster than ring", "value": round(r, 2), "met": r >= 10})
    by = {}
    for s in result["runs"]:
        by.setdefault((s["nproc"], s["config"]["batch"]), set()).add(tuple(s["methods"]["tree"]["bytes_sent_per_rank"]))
    for (p, b), v in sorted(by.items()):
        out.append(
            {
                "target": f"(a) P={p} B={b}: tree bytes per step independent of context",
                "value": sorted(v),
                "met": len(v) == 1,
            }
        )
    return out


def _draw(result: dict):
    """(a) decode step latency against the context, one line per (method, P, batch)."""

    def draw(ax):
        for (p, b), style in zip(
            sorted({(s["nproc"], s["config"]["batch"]) for s in result["runs"]}), ["-", "--", ":", "-."]
        ):
            runs = sorted(
                (s for s in result["runs"] if s["nproc"] == p and s["config"]["batch"] == b),
                key=lambda s: s["config"]["seq_len"],
            )
            xs = [s["config"]["seq_len"] for s in runs]
            for i, name in enumerate(STEP_METHODS):
                ax.plot(
                    xs,
                    [s["methods"][name]["median_step_s"] * 1e3 for s in runs],
                    style,
                    color=f"C{i}",
                    marker="o",
                    label=f"{name} P={p} B={b}",
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("total context tokens")
        ax.set_ylabel("decode step (ms)")
        ax.legend(fontsize=6)

    return draw


def main(argv: Sequence[str] | None = None) -> int:
    bench = Benchmark(
        "bench_tree_attention",
        __doc__,
        repeats=200,
        json="out/bench_tree_attention.json",
        plot="out/bench_tree_attention.png",
        quick="P=2,4, 16k tokens, batch 1, 3 steps, 50 combine repetitions",
        aliases={"--repeats": ["--iters"]},
        helps={"--repeats": "combine repetitions per method"},
    )
    p = bench.parser
    p.add_argument(
        "--nprocs",
        type=units.ints_arg("--nprocs"),
        default=[2, 4],
        help="process counts, comma-separated (default 2,4)",
    )
    p.add_argument("--oversubscribe", action="store_true", help=OVERSUBSCRIBE_HELP)
    p.add_argument(
        "--tokens",
        type=units.counts_arg("--tokens"),
        default=[16384, 65536, 262144],
        help="total context tokens, comma-separated; k = 1e3 (default 16384,65536,262144)",
    )
    p.add_argument(
        "--batch", type=units.ints_arg("--batch"), default=[1, 4], help="batch sizes, comma-separated (default 1,4)"
    )
    p.add_argument(
        "--batch-max-tokens",
        type=units.count_arg("--batch-max-tokens"),
        default=65536,
        help="largest context for batch > 1 (memory)",
    )
    p.add_argument(
        "--check-max-tokens",
        type=units.count_arg("--check-max-tokens"),
        default=16384,
        help="check against one process up to this context (the check replays every step)",
    )
    p.add_argument(
        "--steps",
        type=units.int_arg("--steps", minimum=2),
        default=6,
        help="decode steps per method (the first is a warm-up)",
    )
    p.add_argument(
        "--timeout",
        type=units.seconds_arg("--timeout"),
        default=1800.0,
        help="seconds per process group before it is killed (default 1800)",
    )
    args = bench.parse(argv)
    if args.quick:
        args.tokens, args.batch, args.steps, args.repeats = [16384], [1], 3, 50
    for P in args.nprocs:
        for cfg in _steps(args):
            check_start(cfg, P, oversubscribe=args.oversubscribe, option="--nprocs")
    t0 = time.time()
    result = run(args)
    print("(a) decode step: median of steps 2..n of the slowest rank; max|err| against one process")
    print(step_table(result["runs"]))
    print("\n(b) combine alone: median of the interleaved repetitions of the slowest rank")
    print(combine_table(result["combine"]))
    print("\n(c) combine: measured against the cost model auto asks (attention.cost.combine_times)")
    print(model_table(result["combine"]))
    print("\ntargets:")
    for t in result["targets"]:
        print(f"  [{'met' if t['met'] else 'NOT met'}] {t['target']}: {t['value']}")
    bench.write_json({"seconds": time.time() - t0, **result}, args.json)
    why = bench.plot(args.plot, _draw(result))
    if why and args.plot:
        print(f"plot skipped: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(script_main(main))
