"""Tree-attention decoding on an emulated cluster: tree versus ring versus three all-reduces.

One decode step of Llama-3.1-8B's attention shape (32 query heads, 8 KV
heads, head_dim 128, batch 1, bf16 KV cache) over a KV cache of 16k to 128k
tokens sharded along the sequence over the ranks of an emulated cluster
(:mod:`treecoll.tools.emucluster`, needs root; this module runs as every rank,
:mod:`treecoll.tools.bench.emulated`), interleaved placement:

* ``tree``: :func:`treecoll.attention.tree_decode` (local partial attention, then one
  tree allreduce of the packed (out, lse) state over the topology's tree);
* ``ring``: :func:`attention.ring_decode` (K/V shards travel around a ring, overlapped
  with the partial attention of the shard in hand);
* ``allreduce3``: :func:`attention.allreduce3_decode` (the paper's baseline: three
  all-reduces, max, numerator, denominator).

Time per (method, tokens) = median over repetitions of the slowest rank's
time; ``compute`` is the slowest rank's :func:`attention.decode_partial` on its
own shard, all ranks at once (what every method pays at least); the methods'
and compute's repetitions are interleaved
(:func:`treecoll.tools.bench.harness.interleaved`). Prediction:
``compute`` (measured) plus the simulator's communication time on the same
YAML (``treecoll.collectives.sim``, profile ``ideal``): the tree's allreduce of the
16.5 KB state; three rank-order ring allreduces for allreduce3; for ring, per
step ``max(compute of one shard, all ranks sending their K/V shard to the next
rank at once)`` (flow-level max-min sharing, ``sim_engine.concurrent_times``).

    python -m treecoll.tools.bench_emucluster_decode                     # 2x2 and 2x3 at 1 Gbit/s
    python -m treecoll.tools.bench_emucluster_decode --shapes 2x2 --tokens 16384

Units: seconds in JSON, ms in the table. Not a test.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from treecoll.tools import units
from treecoll.tools.bench import emulated
from treecoll.tools.bench.emulated import load_topology
from treecoll.tools.bench.harness import Benchmark, interleaved, slowest_rank
from treecoll.tools.cli import script_main
from treecoll.topo.fmt import table

if TYPE_CHECKING:
    from treecoll.topo import Topology

METHODS = ("tree", "ring", "allreduce3")
Q_HEADS, KV_HEADS, HEAD_DIM, BATCH = 32, 8, 128, 1  # Llama-3.1-8B (its config.json on the Hugging Face hub)
KV_ITEMSIZE = 2  # bf16


def shard_tokens(tokens: int, world: int) -> list[int]:
    """Contiguous split of ``tokens`` over ``world`` ranks (the first ranks take the remainder)."""
    return [tokens // world + (1 if r < tokens % world else 0) for r in range(world)]


# ----------------------------------------------------------------------------- worker
def measure(rank: int, world: int, args: argparse.Namespace) -> dict | None:
    """One rank (:func:`treecoll.tools.bench.emulated.worker`): every context length, compute and the
    methods interleaved; rank 0 returns the rows."""
    import torch

    from treecoll import attention

    topo = load_topology(os.environ.get("TREECOLL_EMU_TOPOLOGY"))
    q = torch.randn(BATCH, Q_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    fns = {"tree": lambda k, v, chk: attention.tree_decode(q, k, v, topology=topo, check=chk),
           "ring": lambda k, v, chk: attention.ring_decode(q, k, v, check=chk),
           "allreduce3": lambda k, v, chk: attention.allreduce3_decode(q, k, v, check=chk)}
    methods = [m for m in args.methods if m in fns]
    rows = []
    for i, tokens in enumerate(args.tokens):
        rows += _measure_tokens(q, fns, methods, tokens, rank, world, args.repeats, first=i == 0)
    return {"world": world, "rows": rows} if rank == 0 else None


def _measure_tokens(q, fns: dict, methods: list[str], tokens: int, rank: int, world: int, reps: int,
                    first: bool) -> list[dict]:
    import torch
    import torch.distributed as dist

    from treecoll import attention

    n = shard_tokens(tokens, world)[rank]
    g = torch.Generator().manual_seed(1000 + rank + 7 * tokens)
    k = torch.randn(BATCH, n, KV_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)
    v = torch.randn(BATCH, n, KV_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)
    outs = {}
    for m in methods:
        if first:
            fns[m](k, v, True)  # warm-up: connections, trees, agreement checks
        outs[m] = fns[m](k, v, False)
    cases = {"compute": lambda: attention.decode_partial(q, k, v)}
    cases |= {m: (lambda fn=fns[m]: fn(k, v, False)) for m in methods}
    times = interleaved(cases, reps, warmup=0, before=lambda _: dist.barrier(), combine=slowest_rank)
    compute = statistics.median(times["compute"])
    ref = outs[methods[0]]
    diff = torch.tensor([max(float((o - ref).abs().max()) for o in outs.values())], dtype=torch.float64)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return [{"method": m, "tokens": tokens, "time": statistics.median(times[m]), "times": times[m],
             "compute": compute, "max_abs_diff_vs_" + methods[0]: float(diff)} for m in methods]


# ----------------------------------------------------------------------------- predictions
def predict(method: str, topology: Topology, world: int, tokens: int, compute: float) -> float:
    """Measured ``compute`` plus the simulated communication of ``method`` (seconds)."""
    from treecoll.collectives import builders, compile_plan
    from treecoll.collectives.sim.engine import Network, concurrent_times
    from treecoll.collectives.sim.profiles import get_profile
    from treecoll.collectives.sim.simulator import simulate

    state_bytes = BATCH * Q_HEADS * (HEAD_DIM + 1) * 4  # packed fp32 (out, lse)
    if method == "tree":  # attention.resolve_tree("auto"): two_level without rails
        tree = builders.build("two_level", topology, list(range(world)), rails=False)
        return compute + simulate(topology, compile_plan(tree, "allreduce", 1), state_bytes).time
    if method == "allreduce3":
        ring = compile_plan(None, "allreduce", 1, algo="ring", nranks=world)
        parts = (BATCH * Q_HEADS * 4, BATCH * Q_HEADS * HEAD_DIM * 4, BATCH * Q_HEADS * 4)
        return compute + sum(simulate(topology, ring, max(b, world)).time for b in parts)
    # ring: world steps of partial attention; the first world-1 overlap one K/V shard hop each
    gpus = topology.rank_gpus()
    net = Network(topology, get_profile("ideal"))
    shards = shard_tokens(tokens, world)
    total = 0.0
    for s in range(world - 1):
        hops = [(gpus[r], gpus[(r + 1) % world], 2.0 * shards[(r - s) % world] * BATCH * KV_HEADS * HEAD_DIM
                 * KV_ITEMSIZE) for r in range(world)]
        res = concurrent_times(net, hops)  # (latency, drain) arrays; older versions: one array
        hop = max(a + b for a, b in zip(*res)) if isinstance(res, tuple) else max(res)
        total += max(compute, float(hop))
    return total + compute


# ----------------------------------------------------------------------------- driver
def make_case(hosts: int, rph: int, rate: str, raw: dict, topo_path: Path, args: argparse.Namespace) -> dict:
    """One case of the JSON: rank 0's rows with the predictions added."""
    topology = load_topology(str(topo_path))
    rows = []
    for r in raw["rows"]:
        r = dict(r)
        r["predicted"] = predict(r["method"], topology, raw["world"], r["tokens"], r["compute"])
        r["error"] = r["predicted"] / r["time"] - 1
        rows.append(r)
    return {"shape": f"{hosts}x{rph}", "rate": rate, "world": raw["world"], "placement": args.placement,
            "rows": rows}


def print_table(cases: list[dict]) -> None:
    lines = []
    for c in cases:
        tree = {r["tokens"]: r["time"] for r in c["rows"] if r["method"] == "tree"}
        for r in c["rows"]:
            diff = next((v for k, v in r.items() if k.startswith("max_abs_diff")), None)
            lines.append([c["shape"], c["rate"], r["method"], f"{r['tokens'] // 1024}k", r["time"] * 1e3,
                          r["compute"] * 1e3, r["predicted"] * 1e3, f"{r['error'] * 100:+.0f}%",
                          f"{r['time'] / tree[r['tokens']]:.2f}x" if r["tokens"] in tree else None, diff])
    print(table(lines, ["shape", "rate", "method", "tokens", "time ms", "compute", "pred ms", "err", "vs tree",
                        "max|diff|"], formats=[None, None, None, None, ".1f", ".1f", ".1f", None, None, ".2e"]))
    print("compute = slowest rank's local decode_partial; vs tree = time / tree's time; "
          "max|diff| = largest output difference between methods")


def main(argv: Sequence[str] | None = None) -> int:
    bench = Benchmark("bench_emucluster_decode", __doc__, repeats=2, json="bench_emucluster_decode.json",
                      aliases={"--repeats": ["--reps"], "--json": ["--json-out"]},
                      helps={"--repeats": "repetitions per method"})
    p = bench.parser
    emulated.add_options(p, METHODS, rates="1gbit", timeout=1200, op_timeout=600)
    p.add_argument("--tokens", default="16384,32768,65536,131072", type=units.counts_arg("--tokens"),
                   help="KV lengths, comma-separated; k = 1e3 (default 16384,32768,65536,131072)")
    args = bench.parse(argv)
    emulated.parse_methods(p, args, METHODS)
    if args.worker:
        return emulated.worker(measure, args)

    def per_process_bytes(hosts: int, rph: int) -> int:  # the K/V shard, its float32 draw and ring's received shard
        shard = -(-max(args.tokens) // (hosts * rph)) * KV_HEADS * HEAD_DIM * BATCH
        return shard * (2 * KV_ITEMSIZE + 4 + 2 * KV_ITEMSIZE)

    why = emulated.ready(args, per_process_bytes)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 1
    t0 = time.time()
    worker_argv = ["--methods", ",".join(args.methods), "--tokens", ",".join(map(str, args.tokens)),
                   "--repeats", str(args.repeats)]
    cases = [make_case(hosts, rph, rate, raw, topo_path, args)
             for hosts, rph, rate, raw, topo_path in emulated.cases("bench_emucluster_decode", args, worker_argv)]
    print_table(cases)
    bench.write_json({"seconds": time.time() - t0, "cases": cases}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
