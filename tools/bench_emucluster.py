"""Allreduce on an emulated cluster: measured versus predicted.

For each cluster shape (hosts x ranks per host) and inter-host rate, the
driver brings up an emulated cluster (:mod:`treecoll.tools.emucluster`, needs root),
writes its Topology YAML, and runs this module as every rank (``--worker``;
:mod:`treecoll.tools.bench.emulated`). The workers time ``all_reduce(sum)`` of
float32 tensors from 4 KiB to 64 MiB with each method, interleaved placement by
default (the placement a topology-oblivious launcher often gets):

* ``gloo``: torch.distributed's built-in all_reduce (gloo's ring algorithm);
* ``ring``, ``binomial``, ``two_level``: treecoll's schedules executed over
  torch.distributed point-to-point (see :func:`make_ours`).

Time per size is the median over repetitions of the slowest rank's time
(barrier, then the collective); the methods' repetitions are interleaved
(:func:`treecoll.tools.bench.harness.interleaved`), so they see the same machine
load, and ``--budget`` repeats short collectives more (:func:`repetitions`).
Rank 0 of each host also reads its uplink's transmit counter around every
call, so the table shows the rate the shaped link really carried (bytes on the
wire incl. headers). The driver adds the simulator's prediction for the same
YAML (:func:`predict`) and the relative error, prints a table, writes JSON and,
when matplotlib is present, a measured-versus-predicted plot.

Usage (root)::

    python -m treecoll.tools.bench_emucluster                       # full matrix
    python -m treecoll.tools.bench_emucluster --shapes 2x2 --rates 1gbit --methods gloo

Decoding (tree attention versus ring versus three all-reduces) is measured
by the sibling module ``treecoll.tools.bench_emucluster_decode``.

Units: bytes, seconds in JSON; µs and GB/s (1e9 B/s) in the table. algbw =
bytes / time, busbw = algbw * 2 (P - 1) / P (nccl-tests' definitions).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treecoll.tools import units
from treecoll.tools.bench import emulated
from treecoll.tools.bench.emulated import Unavailable, load_topology
from treecoll.tools.bench.harness import Benchmark, interleaved, slowest_rank
from treecoll.tools.cli import script_main
from treecoll.topo.errors import TreecollError
from treecoll.topo.fmt import fmt_bytes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from treecoll.collectives import Schedule
    from treecoll.topo import Topology

METHODS = ("gloo", "ring", "binomial", "two_level")
DEFAULT_SIZES = tuple(4096 * 4**i for i in range(8))  # 4 KiB .. 64 MiB


# ----------------------------------------------------------------------------- hooks into collectives
def schedule_for(method: str, topology: Topology, nranks: int, nbytes: int) -> Schedule:
    """The Schedule treecoll's executor runs for ``method`` at this size (same plan, same chunks:
    the planner's :meth:`~treecoll.collectives.planner.Planner.schedule_for`).

    ``gloo`` is modelled by treecoll's ``ring`` schedule: gloo's CPU allreduce
    is a reduce-scatter + all-gather ring in rank order, like ours.
    """
    from treecoll.collectives.placement import Placement
    from treecoll.collectives.planner import default_planner

    ring = method in ("gloo", "ring")
    return default_planner().schedule_for(
        None if ring else method,
        collective="allreduce",
        nbytes=nbytes,
        placement=Placement(topology, nranks),
        algo="ring" if ring else "tree",
        max_chunks=nbytes // 4,
    )[1]  # float32: one element per chunk at most


def make_ours(method: str, topology_path: str | None, nranks: int) -> Callable[[Any], Any]:
    """A callable ``fn(tensor)``: treecoll's in-place allreduce(sum) with ``method``
    (``ring``: ``algo="ring"``; tree builders: ``tree=method`` on the cluster's topology)."""
    from treecoll.collectives.execute import CollectiveOptions, allreduce
    from treecoll.collectives.placement import Placement

    if method == "ring":
        ring = CollectiveOptions(algo="ring")
        return lambda t: allreduce(t, out=t, options=ring)
    placement = Placement(load_topology(topology_path), nranks)
    return lambda t: allreduce(t, tree=method, placement=placement, out=t)


def predict(method: str, topology_path: str, nranks: int, nbytes: int, profile: str = "ideal") -> float:
    """The simulator's time in seconds for ``method`` on the YAML's cluster (profile ``ideal``:
    the links as written in the YAML, no library overheads)."""
    from treecoll.collectives.sim.simulator import simulate

    topology = load_topology(topology_path)
    # gloo over TCP: one socket per pair of ranks, so a rank's messages to a peer go in order,
    # and a message moves once the receiver has posted its recv
    return float(
        simulate(
            topology,
            schedule_for(method, topology, nranks, nbytes),
            nbytes,
            profile=profile,
            ordered_pairs=True,
            rendezvous=True,
        ).time
    )


def apply_machine_model(cases: list[dict], calibrate: str = "gloo", min_bytes: int = 1 << 20) -> dict | None:
    """Fit :mod:`treecoll.tools.emucluster.machine` on ``calibrate``'s rows (>= ``min_bytes``) at the
    fastest rate of the run, then add ``predicted_machine`` / ``error_machine`` (the roofline
    of the simulator and the machine's cores) and ``calibration`` (True for fitted rows) to
    every row. Returns the fitted model as a dict, or None (with the reason) when it cannot fit."""
    from treecoll.collectives.sim.simulator import simulate  # noqa: F401  (the simulator must exist)
    from treecoll.tools.emucluster.machine import fit, local_bytes, schedule_work
    from treecoll.topo import yaml_io

    if not cases:
        return None
    fastest = max(c["rate_bps"] for c in cases)
    samples, works, loopback = [], {}, set()
    for ci, c in enumerate(cases):
        topology = yaml_io.loads(c["topology"])
        gpus = topology.rank_gpus()
        hosts = [topology.host_of(g) for g in gpus]
        # the rank -> cpu link is loopback TCP, its bw measured by the link check (GB/s)
        loopback.add(float(topology.link(gpus[0], f"{hosts[0]}/cpu0")["bw"]) * 1e9)
        for ri, r in enumerate(c["rows"]):
            if r.get("predicted") is None:
                continue
            sched = schedule_for(r["method"], topology, c["world"], r["bytes"])
            works[ci, ri] = schedule_work(sched, r["bytes"]) + (local_bytes(sched, r["bytes"], hosts),)
            if r["method"] == calibrate and c["rate_bps"] == fastest and r["bytes"] >= min_bytes:
                total, msgs, local = works[ci, ri]
                samples.append((total, msgs, r["time"], local))
    label = f"{calibrate} >= {fmt_bytes(min_bytes)} at {fastest / 1e9:g} Gbit/s ({len(samples)} rows)"
    try:
        model = fit(samples, label, local_rate=min(loopback))
    except TreecollError as e:
        return {"unavailable": str(e)}
    for (ci, ri), (total, msgs, local) in works.items():
        c, r = cases[ci], cases[ci]["rows"][ri]
        r["work"] = {"bytes": total, "messages": msgs, "local_bytes": local}
        r["predicted_machine"] = model.predict(r["predicted"], total, msgs, local)
        r["error_machine"] = r["predicted_machine"] / r["time"] - 1
        r["calibration"] = r["method"] == calibrate and c["rate_bps"] == fastest and r["bytes"] >= min_bytes
    return model.as_dict()


def machine_model_bound(cases: list[dict], min_bytes: int = 1 << 20) -> dict | None:
    """How well a machine model of the form ``(B - L)/C + L/C_loop + M o`` can follow the rows
    it is fitted on: ``C``, ``C_loop`` and ``o`` fitted by least squares (relative error) on
    *every* row from ``min_bytes`` at the fastest rate (no held-out rows: an in-sample check of
    the roofline's form, not a prediction). Needs :func:`apply_machine_model` first (``work``)."""
    import numpy as np

    fastest = max((c["rate_bps"] for c in cases), default=None)
    rows = [
        dict(r, shape=c.get("shape", "?"))
        for c in cases
        if c["rate_bps"] == fastest
        for r in c["rows"]
        if r.get("work") and r.get("predicted") is not None and r["bytes"] >= min_bytes
    ]
    if len(rows) < 3:
        return None
    from treecoll.tools.emucluster.machine import relative_lstsq

    x = np.array(
        [
            [r["work"]["bytes"] - r["work"]["local_bytes"], r["work"]["local_bytes"], r["work"]["messages"]]
            for r in rows
        ],
        dtype=float,
    )
    t = np.array([r["time"] for r in rows])
    coef = relative_lstsq(x, t)
    pred = np.maximum([r["predicted"] for r in rows], x @ coef)
    err = pred / t - 1
    worst = sorted(zip(err.tolist(), rows), key=lambda e: -abs(e[0]))[:5]
    return {
        "rows": len(rows),
        "within_25pct": int(np.sum(np.abs(err) <= 0.25)),
        "s_per_cross_byte": float(coef[0]),
        "s_per_local_byte": float(coef[1]),
        "s_per_message": float(coef[2]),
        "worst": [
            {"shape": r["shape"], "method": r["method"], "bytes": r["bytes"], "error": float(e)} for e, r in worst
        ],
    }


# ----------------------------------------------------------------------------- worker (one rank)
def _uplink_tx() -> int | None:
    try:
        return int(Path("/sys/class/net/emu0/statistics/tx_bytes").read_text())
    except OSError:
        return None


def measure(rank: int, world: int, args: argparse.Namespace) -> dict | None:
    """One rank (:func:`treecoll.tools.bench.emulated.worker`): every size, the methods interleaved;
    rank 0 returns the rows."""
    import torch
    import torch.distributed as dist

    fns: dict[str, Callable] = {}
    skipped: dict[str, str] = {}
    for m in args.methods:
        if m == "gloo":
            fns[m] = lambda t: dist.all_reduce(t)
            continue
        try:
            fns[m] = make_ours(m, os.environ.get("TREECOLL_EMU_TOPOLOGY"), world)
        except Unavailable as e:
            skipped[m] = str(e)
    # every rank must agree on what runs
    agree = torch.tensor([1.0 if m in fns else 0.0 for m in args.methods])
    dist.all_reduce(agree, op=dist.ReduceOp.MIN)
    for i, m in enumerate(args.methods):
        if agree[i] < 1 and m in fns:
            del fns[m]
            skipped.setdefault(m, "unavailable on another rank")
    rows = [row for nbytes in args.sizes for row in _measure_size(fns, nbytes, rank, world, args)] if fns else []
    return {"world": world, "rows": rows, "skipped": skipped} if rank == 0 else None


def _measure_size(fns: dict[str, Callable], nbytes: int, rank: int, world: int, args) -> list[dict]:
    """Every method at one size: a checked, timed warm-up each, then the repetitions interleaved."""
    import torch
    import torch.distributed as dist

    x = torch.empty(nbytes // 4, dtype=torch.float32)
    expected = world * (world + 1) / 2
    local0 = os.environ.get("LOCAL_RANK") == "0"
    ok = dict.fromkeys(fns, True)
    sent = dict.fromkeys(fns, 0)
    tx_before: list[int | None] = [None]

    def before(m: str) -> None:
        x.fill_(rank + 1)
        dist.barrier()
        tx_before[0] = _uplink_tx()

    def after(m: str) -> None:
        tx = _uplink_tx()
        if tx is not None and tx_before[0] is not None:
            sent[m] += tx - tx_before[0]
        ok[m] &= bool(torch.all(x == expected))

    # warm-up (connections, buffers), checked and timed: the repetitions follow from the slowest method
    warm = interleaved(
        {m: (lambda fn=fn: fn(x)) for m, fn in fns.items()},
        1,
        warmup=0,
        before=before,
        after=after,
        combine=slowest_rank,
    )
    reps = max(repetitions(nbytes, t[0], args.repeats, args.budget) for t in warm.values())
    local = interleaved({m: (lambda fn=fn: fn(x)) for m, fn in fns.items()}, reps, warmup=0, before=before, after=after)
    slowest = dict(zip(fns, slowest_rank([local[m] for m in fns])))
    # uplink rate while the collective ran (local rank 0 of each host), and whether every call was right
    up = torch.tensor(
        [
            [sent[m] * 8 / sum(local[m]) / 1e9 if local0 else 0.0, 1.0 if local0 else 0.0, 0.0 if ok[m] else 1.0]
            for m in fns
        ],
        dtype=torch.float64,
    )
    dist.all_reduce(up)
    return [
        {
            "method": m,
            "bytes": nbytes,
            "reps": reps,
            "time": statistics.median(slowest[m]),
            "times": slowest[m],
            "uplink_gbit_s": float(up[i, 0] / max(up[i, 1], 1)),
            "correct": bool(up[i, 2] == 0),
        }
        for i, m in enumerate(fns)
    ]


#: most repetitions :func:`repetitions` asks for (short collectives on a quiet link)
MAX_REPS = 40


def repetitions(nbytes: int, warmup_s: float, reps: int, budget_s: float) -> int:
    """Repetitions for one (method, size): at least ``reps`` (10 below 1 MiB), more for short
    collectives so that each runs about ``budget_s`` seconds in all (from its warm-up time), at most
    :data:`MAX_REPS`: a 1 MiB allreduce takes milliseconds and its spread on two shared cores is
    tens of percent, so its median needs more samples than a 64 MiB one.

    >>> repetitions(64 << 20, 0.5, 7, 1.0), repetitions(1 << 20, 0.02, 7, 1.0), repetitions(4096, 1e-4, 7, 1.0)
    (7, 40, 40)
    """
    base = reps if nbytes >= (1 << 20) else max(reps, 10)
    if budget_s <= 0 or warmup_s <= 0:
        return base
    return max(base, min(MAX_REPS, int(budget_s / warmup_s)))


# ----------------------------------------------------------------------------- driver
def make_case(hosts: int, rph: int, rate: str, raw: dict, topo_path: Path, args: argparse.Namespace) -> dict:
    """One case of the JSON: rank 0's rows with bandwidths and the simulator's prediction added."""
    from treecoll.tools.emucluster import netns

    world = raw["world"]
    case = {
        "shape": f"{hosts}x{rph}",
        "hosts": hosts,
        "ranks_per_host": rph,
        "rate": rate,
        "rate_bps": netns.parse_rate(rate),
        "placement": args.placement,
        "world": world,
        "topology": topo_path.read_text(),
        "skipped": raw["skipped"],
        "rows": [],
    }
    pred_skip = None
    for row in raw["rows"]:
        row = dict(row)
        row["algbw_gbs"] = row["bytes"] / row["time"] / 1e9
        row["busbw_gbs"] = row["algbw_gbs"] * 2 * (world - 1) / world
        try:
            row["predicted"] = predict(row["method"], str(topo_path), world, row["bytes"])
            row["error"] = row["predicted"] / row["time"] - 1
        except Unavailable as e:
            row["predicted"] = row["error"] = None
            pred_skip = str(e)
        case["rows"].append(row)
    case["prediction_unavailable"] = pred_skip
    return case


def repredict(cases: list[dict]) -> None:
    """Replace each row's link-only prediction (``predicted``, ``error``) with the
    current simulator's, on the topology recorded with the case."""
    for case in cases:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(case["topology"])
        try:
            for row in case["rows"]:
                row["predicted"] = predict(row["method"], f.name, case["world"], row["bytes"])
                row["error"] = row["predicted"] / row["time"] - 1
        finally:
            os.unlink(f.name)


def print_table(cases: list[dict]) -> None:
    hdr = (
        f"{'shape':>5} {'rate':>6} {'method':>9} {'size':>8} {'time us':>10} {'algbw':>7} "
        f"{'busbw':>7} {'uplink':>8} {'pred us':>10} {'err':>6} {'+cores us':>10} {'err':>6}"
    )
    print(hdr + "\n" + "-" * len(hdr))
    for c in cases:
        for r in c["rows"]:
            pred = f"{r['predicted'] * 1e6:10.0f}" if r["predicted"] is not None else f"{'-':>10}"
            err = f"{r['error'] * 100:+5.0f}%" if r["error"] is not None else f"{'-':>6}"
            if r.get("predicted_machine") is not None:
                mach = f" {r['predicted_machine'] * 1e6:10.0f} {r['error_machine'] * 100:+5.0f}%" + (
                    "*" if r.get("calibration") else ""
                )
            else:
                mach = f" {'-':>10} {'-':>6}"
            print(
                f"{c['shape']:>5} {c['rate']:>6} {r['method']:>9} {fmt_bytes(r['bytes']):>8} "
                f"{r['time'] * 1e6:10.0f} {r['algbw_gbs']:7.3f} {r['busbw_gbs']:7.3f} "
                f"{r['uplink_gbit_s']:6.3f}Gb {pred} {err}{mach}" + ("" if r["correct"] else "  WRONG RESULT")
            )
        for m, why in c["skipped"].items():
            print(f"{c['shape']:>5} {c['rate']:>6} {m:>9} skipped: {why}")
    print(
        "algbw, busbw in GB/s; uplink = Gbit/s on host uplinks while the collective ran (wire bytes); "
        "pred = link-only simulator; +cores = max(simulator, the machine's cores), * = calibration row"
    )


def summarize(cases: list[dict], target_bytes: int = 16 << 20, min_bytes: int = 1 << 20) -> list[dict]:
    """Per case: two_level's speedup over gloo at ``target_bytes`` and the simulator's
    worst and median absolute error for messages of ``min_bytes`` and more."""
    out = []
    for c in cases:
        t = {(r["method"], r["bytes"]): r["time"] for r in c["rows"]}
        errs = [abs(r["error"]) for r in c["rows"] if r["error"] is not None and r["bytes"] >= min_bytes]
        held = [
            abs(r["error_machine"])
            for r in c["rows"]
            if r.get("error_machine") is not None and r["bytes"] >= min_bytes and not r.get("calibration")
        ]
        g, tl = t.get(("gloo", target_bytes)), t.get(("two_level", target_bytes))
        out.append(
            {
                "shape": c["shape"],
                "rate": c["rate"],
                "two_level_speedup_vs_gloo": (g / tl) if g and tl else None,
                "sim_abs_error_max": max(errs) if errs else None,
                "sim_abs_error_median": statistics.median(errs) if errs else None,
                "cores_abs_error_max": max(held) if held else None,
                "cores_abs_error_median": statistics.median(held) if held else None,
                "cores_rows_within_25pct": f"{sum(e <= 0.25 for e in held)}/{len(held)}" if held else None,
            }
        )
    return out


def print_summary(summary: list[dict]) -> None:
    for s in summary:
        sp = s["two_level_speedup_vs_gloo"]
        em, ed = s["sim_abs_error_max"], s["sim_abs_error_median"]
        print(
            f"{s['shape']} {s['rate']}: two_level vs gloo at 16 MiB "
            + (f"{sp:.2f}x" if sp else "-")
            + " (target >= 2x at 1gbit); simulator |error| from 1 MiB: "
            + (f"median {ed * 100:.0f}%, max {em * 100:.0f}%" if em is not None else "-")
            + " (target <= 25%)"
            + (
                f"; with the machine's cores (held-out rows): median {s['cores_abs_error_median'] * 100:.0f}%, "
                f"max {s['cores_abs_error_max'] * 100:.0f}%, {s['cores_rows_within_25pct']} within 25%"
                if s.get("cores_abs_error_max") is not None
                else ""
            )
        )


def print_bound(bound: dict | None) -> None:
    if bound:
        print(
            f"in-sample machine model at the fastest rate (least squares on every row from 1 MiB, no held-out rows): "
            f"{bound['within_25pct']}/{bound['rows']} within 25%; worst: "
            + ", ".join(
                f"{w['shape']} {w['method']} {fmt_bytes(w['bytes'])} {w['error'] * 100:+.0f}%" for w in bound["worst"]
            )
        )


def report(cases: list[dict]) -> dict[str, Any]:
    """Fit the machine model, print the table, the summary and the in-sample bound;
    returns them as the JSON stores them (``machine_model``, ``summary``,
    ``machine_model_bound``, then ``cases``)."""
    machine = apply_machine_model(cases)
    print(f"machine model: {machine}")
    print_table(cases)
    summary = summarize(cases)
    print_summary(summary)
    bound = machine_model_bound(cases)
    print_bound(bound)
    return {"machine_model": machine, "summary": summary, "machine_model_bound": bound, "cases": cases}


def _plot(bench: Benchmark, path: str | None, cases: list[dict]) -> None:
    """Draw ``cases`` (:func:`draw`) to ``path`` (``--plot``), or say why there is no plot."""
    why = bench.plot(path, lambda ax: draw(cases, ax), size=(7, 5.5))
    if why:
        print(f"no plot: {why}")


def draw(cases: list[dict], ax: Axes) -> None:
    """Measured against predicted time (log-log), one marker per method and rate."""
    pts = [(r["predicted"], r["time"], r["method"], c["rate"]) for c in cases for r in c["rows"] if r["predicted"]]
    if pts:
        rates = sorted({p[3] for p in pts})
        colors = {m: f"C{i}" for i, m in enumerate(sorted({p[2] for p in pts}))}
        for m in colors:
            for i, rate in enumerate(rates):
                xs = [p[0] * 1e6 for p in pts if p[2] == m and p[3] == rate]
                ys = [p[1] * 1e6 for p in pts if p[2] == m and p[3] == rate]
                if xs:
                    ax.loglog(xs, ys, "oxs^"[i % 4], color=colors[m], label=f"{m} {rate}", mfc="none")
        lo = min(min(p[0], p[1]) for p in pts) * 1e6
        hi = max(max(p[0], p[1]) for p in pts) * 1e6
        ax.loglog([lo, hi], [lo, hi], "k--", lw=0.8, label="measured = predicted")
        ax.set_xlabel("predicted time (µs)")
        ax.set_ylabel("measured time (µs)")
    else:  # no prediction: measured time versus size
        for c in cases:
            for m in sorted({r["method"] for r in c["rows"]}):
                rows = [r for r in c["rows"] if r["method"] == m]
                ax.loglog(
                    [r["bytes"] for r in rows],
                    [r["time"] * 1e6 for r in rows],
                    "o-",
                    label=f"{m} {c['shape']} {c['rate']}",
                )
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("measured time (µs)")
    ax.legend(fontsize=7)
    ax.set_title("allreduce on the emulated cluster (interleaved placement)")


def main(argv: Sequence[str] | None = None) -> int:
    bench = Benchmark(
        "bench_emucluster",
        __doc__,
        repeats=3,
        json="bench_emucluster.json",
        plot="bench_emucluster.png",
        aliases={"--repeats": ["--reps"], "--json": ["--json-out"]},
        helps={"--repeats": "least repetitions for sizes >= 1 MiB (10 below)"},
    )
    p = bench.parser
    emulated.add_options(p, METHODS, rates="1gbit,10gbit", timeout=900, op_timeout=300)
    p.add_argument(
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        type=units.sizes_arg("--sizes"),
        help="message sizes, comma-separated or A:B (4K, 64M accepted)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=0.0,
        help="seconds of repetitions per method and size: short collectives repeat up to "
        f"{MAX_REPS} times to fill it (0: exactly --repeats)",
    )
    p.add_argument("--from-json", metavar="FILE", help="re-print the table, summary and plot of an earlier run")
    p.add_argument(
        "--repredict",
        action="store_true",
        help="with --from-json: simulate every row again with the current simulator "
        "(the measurements stay as recorded) and write the result to --json",
    )
    args = bench.parse(argv)
    emulated.parse_methods(p, args, METHODS)
    if args.worker:
        return emulated.worker(measure, args)
    if args.from_json:
        earlier = json.loads(Path(args.from_json).read_text())
        cases = earlier["cases"]
        if args.repredict:
            repredict(cases)
        fields = report(cases)
        if args.repredict:
            if Path(args.json).resolve() == Path(args.from_json).resolve():
                p.error("--json: expected a file other than --from-json (the measurements are kept)")
            bench.write_json(
                {**{k: v for k, v in earlier.items() if k != "meta"}, "measured": earlier.get("meta"), **fields},
                args.json,
            )
        _plot(bench, args.plot, cases)
        return 0
    # a rank holds its buffer, the received chunk and the reduction's output
    if not emulated.ready(args, lambda hosts, rph: 4 * max(args.sizes)):
        return 1
    t0 = time.time()
    worker_argv = emulated.passed_on(args, "--methods", "--sizes", "--repeats", "--budget")
    cases = [
        make_case(hosts, rph, rate, raw, topo_path, args)
        for hosts, rph, rate, raw, topo_path in emulated.cases("bench_emucluster", args, worker_argv)
    ]
    fields = report(cases)
    bench.write_json({"seconds": time.time() - t0, **fields}, args.json)
    _plot(bench, args.plot, cases)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
