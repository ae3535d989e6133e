"""Fit the executor's per-message cost (:class:`treecoll.collectives.executor_cost.ExecutorCost`) on this machine.

treecoll's executor issues every send and receive from Python; the
``executor`` prediction mode charges each message a serial cost ``o`` per rank
(:mod:`treecoll.collectives.sim.executor`). This script measures it:

* **gloo** (``GLOO_STEP_S``): latency-bound tree allreduces (chain, binomial,
  star; 8 B to 1 KiB, one chunk) on P gloo processes, timed in rounds of
  :data:`CALLS` calls (a round's time: its slowest rank's; a case's: its
  fastest round, the one other load on the machine disturbed least). Each time ``T``
  is divided by the schedule's number of messages in a row ``S``: the
  executor simulation of the same schedule with ``o = 1`` on free links (no
  latency, unbounded bandwidth). ``o`` is the least-squares fit of ``T = o S``.
* **gloo's own allreduce** (``GLOO_NATIVE_STEP_S``): ``torch.distributed.all_reduce``
  of the same sizes, divided by its ``2 (P - 1)`` ring steps (sizes with fewer
  float32 elements than processes left out: gloo does not run the ring's steps on them).
* **gloo's own all-gather** (case ``gather``): the all-gather of ``P`` buffers of the same
  sizes into one (what the decode combine ``gather`` calls), divided by its ``P - 1`` ring
  steps: gloo's all-gather is an algorithm of its own, and its call measured slower than
  an allreduce of the same bytes at 2 processes though it has half the steps.
* **Python alone** (``PYTHON_STEP_S``): the same tree allreduces on the in-process
  transport (:mod:`treecoll.collectives.local`, threads under one GIL): the
  time divided by the messages of all ranks (the GIL runs one rank's Python at
  a time), the executor's own cost per message without a network library.
* **Per process count** (``GLOO_BY_NRANKS``): the fits above again on each
  ``--procs`` count alone, ``(P, GLOO_STEP_S, GLOO_NATIVE_STEP_S, call_s, native call_s,
  gather step, gather call_s)``. They differ in kind, not only in size, once the processes
  outnumber the cores: each step of gloo's rings needs every rank running at once, a tree
  message only its two ends; the counts fitted are the ones predicted for (the emulated
  cluster's 2 x 3 runs 6 processes), since the costs there include the cores' sharing.
* **Per call** (``call_s``, ``native call_s``, ``gather call_s``): the same cases again, one
  call at a time after a barrier (the way a decode step calls its combine, and the way
  :mod:`treecoll.tools.bench_tree_attention` times it: the slowest rank, the median of
  ``--reps`` calls), minus the case's time per call back to back; the median of these
  differences over a count's cases of one kind (the executor's trees, gloo's allreduce,
  gloo's all-gather). The ranks leave the barrier apart and wait asleep in a receive for
  the last one; gloo's rings then wait again at every step for ranks to be woken (the
  allreduce's excess grows with its steps), so each kind has its own, paid once per call:
  three all-reduces three times the allreduce's, the tree the executor's, the gather the
  all-gather's.
* **A decode combine's own Python** (``GLOO_LOCAL_BY_NRANKS``,
  :class:`treecoll.attention.cost.LocalCost`): one :class:`treecoll.attention.MergeOp` of two
  packed states (what a tree node does per child), one :func:`treecoll.attention.merge_states`
  of the ``P`` stacked states (what the all-gather combine does once) and the rest of a
  ``tree_combine`` call's Python (:func:`combine_dispatch`: the placement and tree looked up,
  the state packed and unpacked), Llama-3.1-8B's 32 heads x 128 at batch 1, timed in the
  ranks as the combine runs them and as the benchmark times it: one call at a time after a
  barrier, interleaved with the single calls above, the slowest rank's, the median
  (:func:`fit_local`). An op right after its rank waited asleep takes 2-3x what it takes back
  to back in a loop (caches and the core woken cold), and a decode step's merges always
  follow a wait.

The constants in :mod:`treecoll.collectives.executor_cost` (and ``GLOO_LOCAL_BY_NRANKS`` in
:mod:`treecoll.attention.cost`) are what this printed; run it on a quiet machine::

    python -m treecoll.tools.fit_executor_cost --procs 2 4 6 [--reps 30] [--json fit.json]

>>> round(fit_through_origin([(2.0, 1.0), (4.0, 2.0)]), 6)
2.0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = [
    "main",
    "fit_through_origin",
    "fit_by_nranks",
    "fit_local",
    "case_rows",
    "combine_dispatch",
    "LOCAL_CASES",
    "implausible",
    "messages_of",
    "serial_messages",
    "TREES",
    "SIZES",
    "NATIVE_CASES",
]

#: trees timed (one chunk, latency bound)
TREES = ("chain", "binomial", "star")
#: float32 message sizes, bytes (16512: the decode combine's packed state at batch 1, 32 heads x 129)
SIZES = (8, 256, 1024, 16512)
#: gloo's own collectives timed beside the trees: allreduce (``native``) and all-gather (``gather``)
NATIVE_CASES = ("native", "gather")
#: calls per timed round
CALLS = 10
#: a decode combine's local ops timed in the ranks (:func:`fit_local`), in :class:`treecoll.attention.cost.LocalCost`'s
#: order; keys ``local/<name>`` of :func:`_time_rank`'s result
LOCAL_CASES = ("merge_pair", "merge_states", "dispatch")
#: the decode state the local ops are timed on: Llama-3.1-8B's attention at batch 1 (batch, heads, head_dim)
LOCAL_SHAPE = (1, 32, 128)


def fit_through_origin(pairs: list[tuple[float, float]]) -> float:
    """The least-squares ``o`` of ``T = o S`` over ``(T, S)`` pairs."""
    den = sum(s * s for _, s in pairs)
    return sum(t * s for t, s in pairs) / den if den else 0.0


def _ring_sized(row: dict) -> bool:
    """True when gloo's ring runs all its ``2 (P - 1)`` steps on the row's buffer: at least one float32
    element per rank (4 processes all-reduce 8 B in about an eighth of the time of 256 B here, far
    from the ring's step count)."""
    return row["bytes"] // 4 >= row["procs"]


def fit_by_nranks(rows: list[dict]) -> list[tuple[int, float, float, float, float, float, float]]:
    """``(P, executor o, native o, call, native call, gather o, gather call)`` per process count of
    ``rows`` (:func:`main`'s: ``procs``, ``case``, ``bytes``, ``time_us``, ``single_us``, ``messages``):
    the per-message and per-step costs the fits through the origin of that count's rows of each kind
    (the executor's trees, ``native``: gloo's allreduce, ``gather``: gloo's all-gather), each call
    cost the median of ``single_us - time_us`` over the same rows (seconds). A kind without rows
    gets 0.

    >>> rows = [{"procs": 2, "case": "chain", "bytes": 8, "time_us": 400.0, "single_us": 900.0, "messages": 2.0},
    ...         {"procs": 2, "case": "native", "bytes": 8, "time_us": 200.0, "single_us": 600.0, "messages": 2.0},
    ...         {"procs": 2, "case": "gather", "bytes": 8, "time_us": 300.0, "single_us": 400.0, "messages": 1.0},
    ...         {"procs": 4, "case": "star", "bytes": 8, "time_us": 600.0, "single_us": 1600.0, "messages": 6.0},
    ...         {"procs": 4, "case": "native", "bytes": 8, "time_us": 60.0, "single_us": 960.0, "messages": 6.0},
    ...         {"procs": 4, "case": "native", "bytes": 256, "time_us": 3000.0, "single_us": 4000.0,
    ...          "messages": 6.0}]
    >>> for row in fit_by_nranks(rows):   # 4 ranks' 8 B (2 elements) does not run the ring: left out of native
    ...     print(row)
    (2, 0.0002, 0.0001, 0.0005, 0.0004, 0.0003, 0.0001)
    (4, 0.0001, 0.0005, 0.001, 0.001, 0.0, 0.0)
    """

    def fit(mine: list[dict]) -> tuple[float, float]:
        if not mine:
            return 0.0, 0.0
        o = fit_through_origin([(r["time_us"] * 1e-6, r["messages"]) for r in mine])
        call = statistics.median((r["single_us"] - r["time_us"]) * 1e-6 for r in mine)
        return round(o, 10), round(call, 10)

    out = []
    for p in sorted({r["procs"] for r in rows}):
        mine = [r for r in rows if r["procs"] == p and (_kind(r) != "native" or _ring_sized(r))]
        (o, call), (native, native_call), (gather, gather_call) = (
            fit([r for r in mine if _kind(r) == k]) for k in ("tree", "native", "gather")
        )
        out.append((p, o, native, call, native_call, gather, gather_call))
    return out


def implausible(by_nranks: list[tuple]) -> list[str]:
    """What in a per-count fit cannot be a cost (a negative one: single calls after a barrier measured
    faster than the same calls back to back, which happens when other load on the machine disturbs the
    rounds), one line each; empty when none.

    >>> implausible([(2, 1e-4, 1e-4, 2e-4, 1e-4, 1e-4, 1e-4), (4, 1e-4, 1e-4, -5e-5, 1e-4, 1e-4, 1e-4)])
    ['P=4: call -50.0 us < 0: the machine was busy; re-run the fit on a quiet machine']
    """
    names = ("step", "native step", "call", "native call", "gather step", "gather call")
    return [
        f"P={row[0]}: {name} {v * 1e6:.1f} us < 0: the machine was busy; re-run the fit on a quiet machine"
        for row in by_nranks
        for name, v in zip(names, row[1:])
        if v < 0
    ]


def messages_of(case: str, nranks: int, nbytes: int) -> float:
    """The steps a case's time is divided by: gloo's allreduce ``2 (P - 1)``, its all-gather ``P - 1``,
    a tree its messages in a row (:func:`serial_messages`)."""
    if case == "native":
        return 2.0 * (nranks - 1)
    if case == "gather":
        return float(nranks - 1)
    return serial_messages(case, nranks, nbytes)


def serial_messages(tree: str, nranks: int, nbytes: int) -> float:
    """Messages in a row of the executor's one-chunk allreduce on ``tree``: its simulated time
    on (nearly) free links in units of the per-message cost.

    >>> serial_messages("chain", 2, 8)   # rank 1 sends as rank 0 posts its receive; then back
    2.0
    """
    from treecoll.collectives.builders import build
    from treecoll.collectives.compile import compile_allreduce
    from treecoll.collectives.cost import uniform_topology
    from treecoll.collectives.placement import Placement
    from treecoll.collectives.sim.executor import simulate_executor_schedule

    topo = uniform_topology(nranks, bw=1e3, lat=0.0)  # 1 KiB in 1 ns: free next to 1 ms per message
    sched = compile_allreduce(build(tree, nranks=nranks), 1)
    o = 1e-3
    return round(simulate_executor_schedule(Placement(topo, nranks), sched, nbytes, step_cost=o).time / o, 3)


def _time_rank(rank: int, world: int, reps: int) -> dict:
    """On one gloo rank: seconds per call of each (tree, size) and of torch's all_reduce, one
    value per round of :data:`CALLS` calls (each round after a barrier), under
    ``single/<case>`` the slowest rank's seconds of each of ``reps`` single calls after a barrier
    (:func:`treecoll.tools.bench.harness.interleaved`, as the benchmarks time a call), and under
    ``local/<op>`` this rank's seconds of each of ``reps`` calls of the combine's local ops
    (:data:`LOCAL_CASES`), one after a barrier each, interleaved with the single calls again."""
    import torch
    import torch.distributed as dist
    from treecoll.attention.tree_decode import all_gather_single
    from treecoll.collectives.execute import CollectiveOptions, allreduce
    from treecoll.tools.bench.harness import interleaved, slowest_rank

    opts = CollectiveOptions(algo="tree", nchunks=1, check=False)
    out, single = {}, {}
    for size in SIZES:
        x = torch.ones(size // 4)
        gathered = torch.empty(world * x.numel())
        cases = {t: (lambda t=t, x=x: allreduce(x, tree=t, options=opts)) for t in TREES}
        cases["native"] = lambda x=x: dist.all_reduce(x)
        cases["gather"] = lambda x=x, y=gathered: all_gather_single(y, x)
        for name, fn in cases.items():
            for _ in range(10):
                fn()
            times = []
            for _ in range(reps):  # rounds of CALLS calls after a barrier: seconds per call
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(CALLS):
                    fn()
                times.append((time.perf_counter() - t0) / CALLS)
            out[f"{name}/{size}"] = times
            single[f"single/{name}/{size}"] = fn
    out |= interleaved(single, reps, warmup=1, before=lambda _: dist.barrier(), combine=slowest_rank)
    # the combine's local ops as the combine runs them: after a barrier, among the single calls (per rank)
    cases = _local_cases(world) | single
    times = interleaved(cases, reps, warmup=1, before=lambda _: dist.barrier())
    out |= {k: v for k, v in times.items() if k.startswith("local/")}
    return out


def _time_local(nranks: int, reps: int) -> float:
    """Seconds per message of the executor on the in-process transport (all ranks' messages)."""
    import torch
    from treecoll.collectives.builders import build
    from treecoll.collectives.compile import compile_allreduce
    from treecoll.collectives.execute import CollectiveOptions, allreduce
    from treecoll.collectives.local import run_ranks

    opts = CollectiveOptions(algo="tree", nchunks=1, check=False)
    msgs = sum(
        len([s for s in steps if s.kind != "reduce"])
        for steps in compile_allreduce(build("binomial", nranks=nranks), 1).steps
    )

    def body(r, t):
        x = torch.ones(2)
        for _ in range(10):
            allreduce(x, tree="binomial", options=opts, _transport=t)
        t0 = time.perf_counter()
        for _ in range(reps):
            allreduce(x, tree="binomial", options=opts, _transport=t)
        return time.perf_counter() - t0

    return max(run_ranks(nranks, body)) / reps / msgs


def fit_local(per_rank: list[dict], nranks: int) -> tuple[float, ...]:
    """``(P, merge pair, merge states, dispatch)`` seconds: the median over repetitions of the slowest rank's
    time of each :data:`LOCAL_CASES` op (``per_rank``: :func:`_time_rank`'s results, ``local/<name>`` a list of
    seconds per repetition on that rank).

    >>> rest = {"local/merge_states": [1e-4] * 3, "local/dispatch": [5e-5] * 3}
    >>> ranks = [{"local/merge_pair": [1e-4, 3e-4, 2e-4]} | rest,
    ...          {"local/merge_pair": [2e-4, 1e-4, 1e-4]} | rest | {"local/merge_states": [2e-4] * 3}]
    >>> fit_local(ranks, 2)   # merge pair: slowest ranks 2e-4, 3e-4, 2e-4
    (2, 0.0002, 0.0002, 5e-05)
    """
    return (
        nranks,
        *(
            round(statistics.median(max(ts) for ts in zip(*(r[f"local/{c}"] for r in per_rank))), 10)
            for c in LOCAL_CASES
        ),
    )


def combine_dispatch(out: torch.Tensor, lse: torch.Tensor) -> None:
    """The Python one ``tree_combine`` call runs on a rank besides its communication and merges (timed as
    ``dispatch``): the group's placement and the tree looked up, the state packed into one buffer, the
    result unpacked."""
    from treecoll.attention.state import pack_state, unpack_state
    from treecoll.attention.tree_decode import _merge_op, group_placement, resolve_tree

    p = group_placement()
    resolve_tree("auto", placement=p)
    _merge_op(*out.shape)
    unpack_state(pack_state(out, lse), *out.shape)


def _local_cases(world: int) -> dict:
    """:data:`LOCAL_CASES`' ops on this rank (keys ``local/<name>``), on :data:`LOCAL_SHAPE` states."""
    import torch
    from treecoll.attention.state import MergeOp, merge_states, pack_state

    batch, heads, head_dim = LOCAL_SHAPE
    op = MergeOp(batch=batch, heads=heads, head_dim=head_dim)
    out, lse = torch.randn(batch, heads, head_dim), torch.randn(batch, heads)
    a = pack_state(out, lse)
    outs, lses = torch.randn(world, batch, heads, head_dim), torch.randn(world, batch, heads)
    return {
        "local/merge_pair": lambda: op(a, a),
        "local/merge_states": lambda: merge_states(outs, lses, dim=0),
        "local/dispatch": lambda: combine_dispatch(out, lse),
    }


def case_rows(per_rank: list[dict], nranks: int) -> list[dict]:
    """:func:`fit_by_nranks`'s rows from :func:`_time_rank`'s results on ``nranks`` ranks, one per (case,
    size): ``time_us`` a call back to back (a round's time is its slowest rank's; the fastest round, the
    one the machine's other load disturbed least), ``single_us`` the median of the single calls after a
    barrier (already the slowest rank's), ``messages`` the steps it is divided by (:func:`messages_of`).

    >>> r0 = {"chain/8": [3e-4, 2e-4], "single/chain/8": [5e-4, 7e-4, 6e-4], "local/dispatch": [1e-4]}
    >>> r1 = {"chain/8": [1e-4, 4e-4], "single/chain/8": [5e-4, 7e-4, 6e-4], "local/dispatch": [1e-4]}
    >>> case_rows([r0, r1], 2)   # rounds: slowest 3e-4 and 4e-4, the fastest of them 3e-4
    [{'procs': 2, 'case': 'chain', 'bytes': 8, 'time_us': 300.0, 'messages': 2.0, 'single_us': 600.0}]
    """
    rows = []
    for key in (k for k in per_rank[0] if not k.startswith(("single/", "local/"))):
        name, size = key.split("/")
        t = min(max(rounds) for rounds in zip(*(r[key] for r in per_rank)))
        single = statistics.median(per_rank[0][f"single/{key}"])
        rows.append(
            {
                "procs": nranks,
                "case": name,
                "bytes": int(size),
                "time_us": round(t * 1e6, 6),
                "messages": messages_of(name, nranks, int(size)),
                "single_us": round(single * 1e6, 6),
            }
        )
    return rows


def _row_text(row: tuple) -> str:
    """A per-count row ``(P, seconds, ...)`` as the Python the constants are written in."""
    return "(" + ", ".join([str(row[0])] + [f"{v * 1e6:.1f}e-6" for v in row[1:]]) + ")"


def _kind(row: dict) -> str:
    """Which fit a row of :func:`case_rows` belongs to: ``native``, ``gather`` or ``tree``."""
    return row["case"] if row["case"] in NATIVE_CASES else "tree"


def main(argv: list[str] | None = None) -> int:
    from treecoll.collectives.launch import RankPool

    ap = argparse.ArgumentParser(prog="python -m treecoll.tools.fit_executor_cost", description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4, 6], help="gloo process counts (default 2 4 6)")
    ap.add_argument("--reps", type=int, default=30, help=f"rounds of {CALLS} calls timed per case (default 30)")
    ap.add_argument("--json", default="", help="write the measurements and the fit here")
    args = ap.parse_args(argv)
    rows, local, python = [], [], []
    for p in args.procs:
        with RankPool(p) as pool:
            per_rank = pool.run(_time_rank, args.reps, timeout=600)
        local.append(fit_local(per_rank, p))
        for row in case_rows(per_rank, p):
            rows.append(row)
            t, s = row["time_us"], row["messages"]
            print(
                f"P={p} {row['case']:9} {row['bytes']:>5} B  {t:8.1f} us  / {s:5.1f} = {t / s:6.1f} us per message; "
                f"one call after a barrier {row['single_us']:8.1f} us",
                flush=True,
            )
        python.append(_time_local(p, args.reps))
    tree_pairs = [(r["time_us"] * 1e-6, r["messages"]) for r in rows if _kind(r) == "tree"]
    native_pairs = [(r["time_us"] * 1e-6, r["messages"]) for r in rows if _kind(r) == "native" and _ring_sized(r)]
    fit = {
        "GLOO_STEP_S": fit_through_origin(tree_pairs),
        "GLOO_NATIVE_STEP_S": fit_through_origin(native_pairs),
        "PYTHON_STEP_S": min(python),
    }
    for k, v in fit.items():
        print(f"{k} = {v * 1e6:.1f}e-6")
    fit["GLOO_BY_NRANKS"] = fit_by_nranks(rows)
    fit["GLOO_LOCAL_BY_NRANKS"] = local
    for name in ("GLOO_BY_NRANKS", "GLOO_LOCAL_BY_NRANKS"):
        print(f"{name} = ({', '.join(_row_text(r) for r in fit[name])})")
    print(f"load average after the fit: {os.getloadavg()}")
    for line in implausible(fit["GLOO_BY_NRANKS"]):
        print(f"warning: {line}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "command": "python -m treecoll.tools.fit_executor_cost " + " ".join(argv or sys.argv[1:]),
                    "rows": rows,
                    "fit": fit,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
