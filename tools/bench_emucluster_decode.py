"""Tree-attention decoding on an emulated cluster: tree versus ring versus three all-reduces.

One decode step of Llama-3.1-8B's attention shape (32 query heads, 8 KV
heads, head_dim 128, batch 1, bf16 KV cache) over a KV cache of 16k to 128k
tokens sharded along the sequence over the ranks of an emulated cluster
(:mod:`treecoll.tools.emucluster`, needs root), interleaved placement:

* ``tree``: :func:`treecoll.attention.tree_decode` (local partial attention, then one
  tree allreduce of the packed (out, lse) state over the topology's tree);
* ``ring``: :func:`attention.ring_decode` (K/V shards travel around a ring, overlapped
  with the partial attention of the shard in hand);
* ``allreduce3``: :func:`attention.allreduce3_decode` (the paper's baseline: three
  all-reduces, max, numerator, denominator).

Time per (method, tokens) = median over repetitions of the slowest rank's
time; ``compute`` is the slowest rank's :func:`attention.decode_partial` on its
own shard, all ranks at once (what every method pays at least). Prediction:
``compute`` (measured) plus the simulator's communication time on the same
YAML (``treecoll.collectives.sim``, profile ``ideal``): the tree's allreduce of the
16.5 KB state; three rank-order ring allreduces for allreduce3; for ring, per
step ``max(compute of one shard, all ranks sending their K/V shard to the next
rank at once)`` (flow-level max-min sharing, ``sim_engine.concurrent_times``).

    python tools/bench_emucluster_decode.py                     # 2x2 and 2x3 at 1 Gbit/s
    python tools/bench_emucluster_decode.py --shapes 2x2 --tokens 16384

Units: seconds in JSON, ms in the table. Not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treecoll.tools import units  # noqa: E402
from treecoll.tools.bench_emucluster import _load_topology  # noqa: E402
from treecoll.tools.cli import script_main  # noqa: E402
from treecoll.tools.resources import OVERSUBSCRIBE_HELP, check_processes  # noqa: E402

METHODS = ("tree", "ring", "allreduce3")
Q_HEADS, KV_HEADS, HEAD_DIM, BATCH = 32, 8, 128, 1  # Llama-3.1-8B (its config.json on the Hugging Face hub)
KV_ITEMSIZE = 2  # bf16


def shard_tokens(tokens: int, world: int) -> list[int]:
    """Contiguous split of ``tokens`` over ``world`` ranks (the first ranks take the remainder)."""
    return [tokens // world + (1 if r < tokens % world else 0) for r in range(world)]


# ----------------------------------------------------------------------------- worker
def worker(args) -> int:
    import datetime

    import torch
    import torch.distributed as dist

    from treecoll import attention

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.op_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    topo = _load_topology(os.environ.get("TREECOLL_EMU_TOPOLOGY"))
    q = torch.randn(BATCH, Q_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    fns = {"tree": lambda k, v, chk: attention.tree_decode(q, k, v, topology=topo, check=chk),
           "ring": lambda k, v, chk: attention.ring_decode(q, k, v, check=chk),
           "allreduce3": lambda k, v, chk: attention.allreduce3_decode(q, k, v, check=chk)}
    methods = [m for m in args.methods if m in fns]

    def slowest(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    rows, first = [], True
    for tokens in args.tokens:
        n = shard_tokens(tokens, world)[rank]
        g = torch.Generator().manual_seed(1000 + rank + 7 * tokens)
        k = torch.randn(BATCH, n, KV_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)
        v = torch.randn(BATCH, n, KV_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)
        compute = statistics.median(slowest(lambda: attention.decode_partial(q, k, v)) for _ in range(args.reps))
        outs = {}
        for m in methods:
            if first:
                fns[m](k, v, True)  # warm-up: connections, trees, agreement checks
            outs[m] = fns[m](k, v, False)
            times = [slowest(lambda: fns[m](k, v, False)) for _ in range(args.reps)]
            rows.append({"method": m, "tokens": tokens, "time": statistics.median(times), "times": times,
                         "compute": compute})
        first = False
        ref = outs[methods[0]]
        diff = torch.tensor([max(float((o - ref).abs().max()) for o in outs.values())], dtype=torch.float64)
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        for r in rows:
            if r["tokens"] == tokens:
                r["max_abs_diff_vs_" + methods[0]] = float(diff)
        k = v = None  # free this size's shard before the next one
    if rank == 0:
        Path(args.out).write_text(json.dumps({"world": world, "rows": rows}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ----------------------------------------------------------------------------- predictions
def predict(method: str, topology, world: int, tokens: int, compute: float) -> float:
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
def run_case(hosts: int, rph: int, rate: str, args, workdir: Path) -> dict:
    from treecoll.tools.emucluster import netns, runner

    tag = f"{hosts}x{rph}-{rate}"
    topo_path, out = workdir / f"emu-{tag}.yaml", workdir / f"decode-{tag}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--out", str(out),
           "--methods", ",".join(args.methods), "--tokens", ",".join(map(str, args.tokens)),
           "--reps", str(args.reps), "--op-timeout", str(args.op_timeout)]
    res = runner.run(cmd, hosts=hosts, ranks_per_host=rph, placement_mode=args.placement,
                     rate_bps=netns.parse_rate(rate), timeout=args.timeout, topology_out=str(topo_path),
                     tag_output=True)
    if res.returncode != 0:
        raise SystemExit(f"decode bench {tag}: ranks failed with exit {res.returncode} (rank {res.failed_rank})")
    raw = json.loads(out.read_text())
    topology = _load_topology(str(topo_path))
    rows = []
    for r in raw["rows"]:
        r = dict(r)
        r["predicted"] = predict(r["method"], topology, raw["world"], r["tokens"], r["compute"])
        r["error"] = r["predicted"] / r["time"] - 1
        rows.append(r)
    return {"shape": f"{hosts}x{rph}", "rate": rate, "world": raw["world"], "placement": args.placement,
            "rows": rows}


def print_table(cases: list[dict]) -> None:
    hdr = (f"{'shape':>5} {'rate':>6} {'method':>10} {'tokens':>7} {'time ms':>9} {'compute':>8} "
           f"{'pred ms':>9} {'err':>6} {'vs tree':>8} {'max|diff|':>9}")
    print(hdr + "\n" + "-" * len(hdr))
    for c in cases:
        tree = {r["tokens"]: r["time"] for r in c["rows"] if r["method"] == "tree"}
        for r in c["rows"]:
            diff = next((v for k, v in r.items() if k.startswith("max_abs_diff")), float("nan"))
            rel = f"{r['time'] / tree[r['tokens']]:7.2f}x" if r["tokens"] in tree else f"{'-':>8}"
            print(f"{c['shape']:>5} {c['rate']:>6} {r['method']:>10} {r['tokens'] // 1024:>6}k "
                  f"{r['time'] * 1e3:9.1f} {r['compute'] * 1e3:8.1f} {r['predicted'] * 1e3:9.1f} "
                  f"{r['error'] * 100:+5.0f}% {rel} {diff:9.2e}")
    print("compute = slowest rank's local decode_partial; vs tree = time / tree's time; "
          "max|diff| = largest output difference between methods")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="2x2,2x3", type=units.shapes_arg("--shapes"),
                   help="hosts x ranks per host, comma-separated (default 2x2,2x3)")
    p.add_argument("--oversubscribe", action="store_true", help=OVERSUBSCRIBE_HELP)
    p.add_argument("--rates", default="1gbit", help="uplink rates, comma-separated (tc units; default 1gbit)")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    p.add_argument("--tokens", default="16384,32768,65536,131072", type=units.counts_arg("--tokens"),
                   help="KV lengths, comma-separated; k = 1e3 (default 16384,32768,65536,131072)")
    p.add_argument("--placement", default="interleaved", choices=("blocked", "interleaved"),
                   help="rank placement on the hosts (default interleaved)")
    p.add_argument("--reps", type=units.int_arg("--reps"), default=2, help="repetitions per method (default 2)")
    p.add_argument("--timeout", type=units.seconds_arg("--timeout"), default=1200,
                   help="seconds per case before all ranks are killed (default 1200)")
    p.add_argument("--op-timeout", type=units.seconds_arg("--op-timeout"), default=600,
                   help="torch.distributed timeout in the ranks (default 600)")
    p.add_argument("--json-out", default="bench_emucluster_decode.json", help="where to write the JSON results")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in args.methods if m not in METHODS]
    if bad:
        p.error(f"--methods: expected names from {list(METHODS)}, got {bad}")
    if args.worker:
        return worker(args)
    for hosts, rph in args.shapes:  # the rank's K/V shard, its float32 draw and ring's received shard
        world = hosts * rph
        shard = -(-max(args.tokens) // world) * KV_HEADS * HEAD_DIM * BATCH
        check_processes(world, option=f"--shapes {hosts}x{rph}", oversubscribe=args.oversubscribe,
                        per_process_bytes=shard * (2 * KV_ITEMSIZE + 4 + 2 * KV_ITEMSIZE))
    from treecoll.tools.emucluster import netns
    ok, why = netns.namespaces_available()
    if not ok:
        print(f"error: {why}", file=sys.stderr)
        return 1
    cases, t0 = [], time.time()
    with tempfile.TemporaryDirectory(prefix="bench-emu-decode-") as d:
        for hosts, rph in args.shapes:
            shape = f"{hosts}x{rph}"
            for rate in args.rates.split(","):
                print(f"# case {shape} at {rate} ...", file=sys.stderr, flush=True)
                cases.append(run_case(hosts, rph, rate, args, Path(d)))
    print_table(cases)
    Path(args.json_out).write_text(json.dumps({"benchmark": "bench_emucluster_decode", "command": " ".join(sys.argv),
                                               "seconds": time.time() - t0, "cases": cases}, indent=1))
    print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
