"""Tree-attention decoding on an emulated cluster: the topology's tree against a topology-blind tree, the gather
combine, ring and three all-reduces.

One decode step of Llama-3.1-8B's attention shape (32 query heads, 8 KV
heads, head_dim 128, bf16 KV cache) over a KV cache sharded along the sequence
over the ranks of an emulated cluster (:mod:`treecoll.tools.emucluster`, needs
root; this module runs as every rank, :mod:`treecoll.tools.bench.emulated`),
interleaved placement (rank r on host r mod H, so rank order alternates hosts).
Batch 1 over 16k to 128k tokens, and a batch whose packed state
(``4 · batch · 32 · 129`` bytes) is at least 1 MiB (batch 64: 1.06 MB) over a
short context:

* ``tree``: :func:`treecoll.attention.tree_decode` over the topology's tree
  (``two_level`` without rails: one edge per host pair crosses the network);
* ``tree_blind``: the same combine over a topology-blind tree, ``binomial`` in
  rank order (with interleaved placement most of its edges cross hosts);
* ``gather``: ``tree_decode(combine="gather")``: one all-gather of the P packed
  states (gloo's own algorithm: a ring in rank order, topology-blind), then a
  local merge;
* ``auto``: ``tree_decode(combine="auto")``: what the cost model picks for this
  topology and state (:func:`treecoll.attention.cost.choose_combine`; the pick is
  recorded);
* ``ring``: :func:`attention.ring_decode` (K/V shards travel around a ring, overlapped
  with the partial attention of the shard in hand);
* ``allreduce3``: :func:`attention.allreduce3_decode` (the paper's baseline: three
  all-reduces, max, numerator, denominator).

Time per (method, case) = median over repetitions of the slowest rank's
time; ``compute`` is the slowest rank's :func:`attention.decode_partial` on its
own shard, all ranks at once (what every method pays at least); the methods'
and compute's repetitions are interleaved
(:func:`treecoll.tools.bench.harness.interleaved`). Bytes crossing host links
(``host bytes``): every host's first rank reads its uplink's transmit counter
(``/proc/net/dev`` of the host's namespace: everything that left the host,
TCP/IP headers and acknowledgements included) around ``--repeats`` steps of
one method, minus the same number of bare barriers; summed over hosts, per
step. ``payload`` is what the schedule sends across hosts (tree edges whose
ends sit on different hosts, up and down, times the state's bytes; for gather,
the hops of the rank-order ring that cross hosts, ``P - 1`` times). Prediction:
``compute`` (measured) plus the simulator's communication time on the same
YAML (profile ``ideal``): the combines as
:func:`treecoll.attention.cost.combine_times` models them on gloo (the
executor's tree allreduce of the packed state; for gather, ``P - 1`` steps of
every rank sending one state to the next in rank order at once, gloo's ring;
three rank-order ring allreduces for allreduce3); for ring, per step ``max(compute of one shard,
all ranks sending their K/V shard to the next rank at once)`` (flow-level
max-min sharing, ``sim_engine.concurrent_times``). Beside the step, the combine alone
(``comb ms``: :func:`treecoll.attention.tree_combine` on states already computed, interleaved
with the rest) and the model's time for it (``comb pred``: :func:`predict_combine`). The
combining methods' steps run a split of
:func:`treecoll.attention.tree_decode` (its local attention, then
:func:`treecoll.attention.tree_combine`: the same calls without the check), each rank
noting when its attention ended, so the step's combine splits into ``skew`` (the last
rank's attention done less the first's: the ranks that finished first wait that long in
the combine, the attention's imbalance) and ``after last`` (the combine once every rank
is in it, comparable with ``comb ms`` and the model): :func:`skew_split`.

    python -m treecoll.tools.bench_emucluster_decode                     # 2x2 and 2x3 at 1 Gbit/s
    python -m treecoll.tools.bench_emucluster_decode --shapes 2x2 --tokens 16384 --batches 1,64

Units: seconds in JSON, ms in the table. Not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from treecoll.tools import units
from treecoll.tools.bench import emulated
from treecoll.tools.bench.emulated import load_topology
from treecoll.tools.bench.harness import Benchmark, interleaved, slowest_rank
from treecoll.tools.cli import script_main
from treecoll.topo.fmt import fmt_bytes, table

if TYPE_CHECKING:
    from treecoll.topo import Topology

METHODS = ("tree", "tree_blind", "gather", "auto", "ring", "allreduce3")
Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B (its config.json on the Hugging Face hub)
KV_ITEMSIZE = 2  # bf16
#: the topology-blind tree of ``tree_blind``
BLIND_TREE = "binomial"


def shard_tokens(tokens: int, world: int) -> list[int]:
    """Contiguous split of ``tokens`` over ``world`` ranks (the first ranks take the remainder)."""
    return [tokens // world + (1 if r < tokens % world else 0) for r in range(world)]


def state_bytes(batch: int) -> int:
    """Bytes of the packed float32 (out, lse) state of one step."""
    return 4 * batch * Q_HEADS * (HEAD_DIM + 1)


def cases_of(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(batch, tokens) of every case: batch 1 at every ``--tokens``, larger batches at ``--batch-tokens``."""
    return [(b, n) for b in args.batches for n in (args.tokens if b == 1 else [args.batch_tokens])]


# ----------------------------------------------------------------------------- worker
def uplink_tx_bytes(iface: str) -> int:
    """Bytes sent so far on ``iface`` of this network namespace (``/proc/net/dev``)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == iface:
            return int(rest.split()[8])
    raise emulated.Unavailable(f"/proc/net/dev: no interface {iface!r} in this namespace")


def measure(rank: int, world: int, args: argparse.Namespace) -> dict | None:
    """One rank (:func:`treecoll.tools.bench.emulated.worker`): every case, compute and the methods
    interleaved, then the bytes each method sends across hosts; rank 0 returns the rows."""
    topo = load_topology(os.environ.get("TREECOLL_EMU_TOPOLOGY"))
    rows = []
    for i, (batch, tokens) in enumerate(cases_of(args)):
        rows += _measure_case(topo, batch, tokens, rank, world, args, first=i == 0)
    return {"world": world, "rows": rows} if rank == 0 else None


def _methods(topo, q):
    from treecoll import attention

    return {
        "tree": lambda k, v, chk: attention.tree_decode(q, k, v, topology=topo, combine="tree", check=chk),
        "tree_blind": lambda k, v, chk: attention.tree_decode(
            q, k, v, topology=topo, tree=BLIND_TREE, combine="tree", check=chk
        ),
        "gather": lambda k, v, chk: attention.tree_decode(q, k, v, topology=topo, combine="gather", check=chk),
        "auto": lambda k, v, chk: attention.tree_decode(q, k, v, topology=topo, combine="auto", check=chk),
        "ring": lambda k, v, chk: attention.ring_decode(q, k, v, check=chk),
        "allreduce3": lambda k, v, chk: attention.allreduce3_decode(q, k, v, check=chk),
    }


def _combines(topo) -> dict:
    """The combine alone of every method that combines states (``ring`` moves K/V instead), as functions
    of the states ``(out, lse)`` already computed (:func:`treecoll.attention.tree_combine`)."""
    from treecoll.attention.tree_decode import tree_combine

    return {
        "tree": lambda out, lse: tree_combine(out, lse, topology=topo, combine="tree"),
        "tree_blind": lambda out, lse: tree_combine(out, lse, topology=topo, tree=BLIND_TREE, combine="tree"),
        "gather": lambda out, lse: tree_combine(out, lse, topology=topo, combine="gather"),
        "auto": lambda out, lse: tree_combine(out, lse, topology=topo, combine="auto"),
        "allreduce3": lambda out, lse: tree_combine(out, lse, topology=topo, combine="allreduce3"),
    }


def _marked_step(q, k, v, combine, marks: list):
    """One decode step as :func:`treecoll.attention.tree_decode` runs it without its check (the local
    attention, then the combine), appending this rank's ``(start, attention done, combine done)``
    (``time.perf_counter``: one clock for every process of the machine) to ``marks``."""
    from treecoll import attention

    def step():
        start = time.perf_counter()
        out, lse = attention.decode_partial(q, k, v)
        done = time.perf_counter()
        combine(out, lse)
        marks.append((start, done, time.perf_counter()))

    return step


def skew_split(marks: list[list[tuple[float, float, float]]]) -> dict[str, float]:
    """From every rank's ``(start, attention done, combine done)`` of each repetition
    (``marks[rank][rep]``): the medians over repetitions of ``skew`` (the last rank's attention done
    less the first's: what the ranks that finished first wait in the combine for the last one, the
    attention's imbalance) and ``after_last`` (the last combine done less the last attention done:
    the combine once every rank is in it), seconds.

    >>> skew_split([[(0.0, 1.0, 3.5)], [(0.0, 1.5, 3.0)]])
    {'skew': 0.5, 'after_last': 2.0}
    """
    reps = range(min(len(m) for m in marks))
    skew = [max(m[i][1] for m in marks) - min(m[i][1] for m in marks) for i in reps]
    after = [max(m[i][2] for m in marks) - max(m[i][1] for m in marks) for i in reps]
    return {"skew": statistics.median(skew), "after_last": statistics.median(after)}


def _measure_case(topo, batch: int, tokens: int, rank: int, world: int, args, first: bool) -> list[dict]:
    import torch
    import torch.distributed as dist
    from treecoll.attention.tree_decode import choose_combine

    from treecoll import attention

    q = torch.randn(batch, Q_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    fns = _methods(topo, q)
    methods = [m for m in args.methods if m in fns]
    n = shard_tokens(tokens, world)[rank]
    g = torch.Generator().manual_seed(1000 + rank + 7 * tokens + batch)
    k = torch.randn(batch, n, KV_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)
    v = torch.randn(batch, n, KV_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)
    outs = {}
    for m in methods:
        fns[m](k, v, True)  # warm-up: connections, trees, agreement checks
        outs[m] = fns[m](k, v, False)
    cases = {"compute": lambda: attention.decode_partial(q, k, v)}
    combines = _combines(topo)
    marks = {m: [] for m in methods if m in combines}
    # the combining methods' steps are tree_decode's two parts, timed apart per rank (the skew)
    cases |= {
        m: _marked_step(q, k, v, combines[m], marks[m]) if m in marks else (lambda fn=fns[m]: fn(k, v, False))
        for m in methods
    }
    out, lse = attention.decode_partial(q, k, v)
    cases |= {f"combine/{m}": (lambda fn=combines[m]: fn(out, lse)) for m in marks}
    times = interleaved(cases, args.repeats, warmup=0, before=lambda _: dist.barrier(), combine=slowest_rank)
    compute = statistics.median(times["compute"])
    ref = outs[methods[0]]
    diff = torch.tensor([max(float((o - ref).abs().max()) for o in outs.values())], dtype=torch.float64)
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    split = {}
    for m, mine in marks.items():
        every = [torch.zeros(len(mine), 3, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(every, torch.tensor(mine, dtype=torch.float64))
        split[m] = skew_split([e.tolist() for e in every])
    host_bytes = _host_bytes({m: (lambda fn=fns[m]: fn(k, v, False)) for m in methods}, args.repeats)
    picks = choose_combine(batch, Q_HEADS, HEAD_DIM, topology=topo)
    return [
        {
            "method": m,
            "batch": batch,
            "tokens": tokens,
            "state_bytes": state_bytes(batch),
            **({"picks": picks} if m == "auto" else {}),
            "time": statistics.median(times[m]),
            "times": times[m],
            **({"combine_time": statistics.median(times[f"combine/{m}"])} if f"combine/{m}" in times else {}),
            **split.get(m, {}),
            "compute": compute,
            "host_bytes_per_step": host_bytes[m],
            "max_abs_diff_vs_" + methods[0]: float(diff),
        }
        for m in methods
    ]


def _host_bytes(fns: dict, reps: int) -> dict[str, float]:
    """Bytes that left every host's uplink per call of each of ``fns`` (summed over hosts), the same
    number of bare barriers subtracted."""
    import torch
    import torch.distributed as dist

    counts = os.environ.get("LOCAL_RANK") == "0"
    iface = os.environ.get("GLOO_SOCKET_IFNAME", "emu0")

    def sent(fn) -> float:
        dist.barrier()
        before = uplink_tx_bytes(iface) if counts else 0
        for _ in range(reps):
            dist.barrier()
            if fn is not None:
                fn()
        dist.barrier()
        total = torch.tensor([float(uplink_tx_bytes(iface) - before) if counts else 0.0], dtype=torch.float64)
        dist.all_reduce(total)
        return float(total) / reps

    base = sent(None)
    return {m: max(0.0, sent(fn) - base) for m, fn in fns.items()}


# ----------------------------------------------------------------------------- predictions
def _tree(method: str, topology, world: int):
    from treecoll.collectives import builders

    if method == "tree":  # attention.resolve_tree("auto"): two_level without rails
        return builders.build("two_level", topology, list(range(world)), rails=False)
    return builders.build(BLIND_TREE, nranks=world)


def payload_bytes(method: str, topology: Topology, world: int, batch: int) -> float | None:
    """Bytes the method's schedule sends from one host to another per step (None: not modelled):
    a tree's edges between hosts, up and down; gather's ring in rank order, ``world - 1`` steps."""
    host = [topology.host_of(g) for g in topology.rank_gpus()[:world]]
    if method == "gather":
        crossing = sum(1 for r in range(world) if host[r] != host[(r + 1) % world])
        return float((world - 1) * crossing * state_bytes(batch))
    if method not in ("tree", "tree_blind"):
        return None
    t = _tree(method, topology, world)
    crossing = sum(1 for r, p in enumerate(t.parents) if p >= 0 and host[r] != host[p])
    return 2.0 * crossing * state_bytes(batch)


def predict_combine(method: str, topology: Topology, world: int, batch: int) -> float | None:
    """Seconds of ``method``'s combine alone as :func:`treecoll.attention.cost.combine_times` models it
    on gloo (the model ``combine="auto"`` picks by); None for ``ring`` (no combine)."""
    from treecoll.attention.cost import combine_times

    if method not in ("tree", "tree_blind", "gather", "allreduce3"):
        return None
    combine = "tree" if method == "tree_blind" else method
    t = combine_times(
        topology,
        batch,
        Q_HEADS,
        HEAD_DIM,
        ranks=world,
        backend="gloo",
        methods=(combine,),
        tree=BLIND_TREE if method == "tree_blind" else "two_level",
    )
    return t[combine]["time_s"]


def predict(method: str, topology: Topology, world: int, batch: int, tokens: int, compute: float) -> float:
    """Measured ``compute`` plus the simulated communication of ``method`` (seconds): the combines
    by :func:`predict_combine`; ring as below."""
    from treecoll.collectives.sim.engine import Network, concurrent_times
    from treecoll.collectives.sim.profiles import get_profile

    combine = predict_combine(method, topology, world, batch)
    if combine is not None:
        return compute + combine
    gpus = topology.rank_gpus()
    net = Network(topology, get_profile("ideal"))
    # ring: world steps of partial attention; the first world-1 overlap one K/V shard hop each
    shards = shard_tokens(tokens, world)
    total = 0.0
    for s in range(world - 1):
        hops = [
            (gpus[r], gpus[(r + 1) % world], 2.0 * shards[(r - s) % world] * batch * KV_HEADS * HEAD_DIM * KV_ITEMSIZE)
            for r in range(world)
        ]
        lat, drain = concurrent_times(net, hops)
        total += max(compute, float((lat + drain).max()))
    return total + compute


# ----------------------------------------------------------------------------- driver
def make_case(hosts: int, rph: int, rate: str, raw: dict, topo_path: Path, args: argparse.Namespace) -> dict:
    """One case of the JSON: rank 0's rows with the predictions added."""
    topology = load_topology(str(topo_path))
    rows = []
    for r in raw["rows"]:
        r = dict(r)
        r["predicted"] = predict(
            r.get("picks", r["method"]), topology, raw["world"], r["batch"], r["tokens"], r["compute"]
        )
        r["error"] = r["predicted"] / r["time"] - 1
        if "combine_time" in r:
            r["combine_predicted"] = predict_combine(r.get("picks", r["method"]), topology, raw["world"], r["batch"])
        r["payload_bytes_per_step"] = payload_bytes(r.get("picks", r["method"]), topology, raw["world"], r["batch"])
        rows.append(r)
    return {"shape": f"{hosts}x{rph}", "rate": rate, "world": raw["world"], "placement": args.placement, "rows": rows}


def orders(case: dict) -> list[str]:
    """Per (batch, tokens) of ``case``: the methods fastest first as measured and as predicted, for the
    step (the rows' ``time`` and ``predicted``) and for the combine alone (``combine_time`` and
    ``combine_predicted``, where measured); ``auto`` left out: it runs one of the others.

    >>> cells = (("tree", 2.0, 1.0), ("gather", 1.0, 2.0), ("auto", 1.5, 1.0))
    >>> rows = [{"method": m, "batch": 1, "tokens": 1024, "time": t, "predicted": p, "combine_time": t / 2,
    ...          "combine_predicted": p / 2} for m, t, p in cells]
    >>> for line in orders({"shape": "2x2", "rows": rows}):
    ...     print(line)
    2x2 batch 1 1k step: measured gather < tree; predicted tree < gather
    2x2 batch 1 1k combine: measured gather < tree; predicted tree < gather
    """
    out = []
    for key in dict.fromkeys((r["batch"], r["tokens"]) for r in case["rows"]):
        rows = [r for r in case["rows"] if (r["batch"], r["tokens"]) == key and r["method"] != "auto"]
        for what, m, p in (("step", "time", "predicted"), ("combine", "combine_time", "combine_predicted")):
            mine = [r for r in rows if r.get(m) is not None and r.get(p) is not None]
            if mine:
                measured = " < ".join(r["method"] for r in sorted(mine, key=lambda r: r[m]))
                predicted = " < ".join(r["method"] for r in sorted(mine, key=lambda r: r[p]))
                head = f"{case['shape']} batch {key[0]} {key[1] // 1024}k {what}"
                out.append(f"{head}: measured {measured}; predicted {predicted}")
    return out


def print_table(cases: list[dict]) -> None:
    lines = []
    for c in cases:
        tree = {(r["batch"], r["tokens"]): r["time"] for r in c["rows"] if r["method"] == "tree"}
        for r in c["rows"]:
            key = (r["batch"], r["tokens"])
            diff = next((v for k, v in r.items() if k.startswith("max_abs_diff")), None)
            payload = r.get("payload_bytes_per_step")
            name = f"auto ({r['picks']})" if "picks" in r else r["method"]
            lines.append(
                [
                    c["shape"],
                    c["rate"],
                    r["batch"],
                    f"{r['tokens'] // 1024}k",
                    name,
                    r["time"] * 1e3,
                    r["compute"] * 1e3,
                    r["predicted"] * 1e3,
                    f"{r['error'] * 100:+.0f}%",
                    r["combine_time"] * 1e3 if "combine_time" in r else None,
                    r["combine_predicted"] * 1e3 if "combine_predicted" in r else None,
                    r["skew"] * 1e3 if "skew" in r else None,
                    r["after_last"] * 1e3 if "after_last" in r else None,
                    f"{r['time'] / tree[key]:.2f}x" if key in tree else None,
                    fmt_bytes(r["host_bytes_per_step"], si=True),
                    None if payload is None else fmt_bytes(payload, si=True),
                    diff,
                ]
            )
    print(
        table(
            lines,
            [
                "shape",
                "rate",
                "batch",
                "tokens",
                "method",
                "time ms",
                "compute",
                "pred ms",
                "err",
                "comb ms",
                "comb pred",
                "skew",
                "after last",
                "vs tree",
                "host bytes",
                "payload",
                "max|diff|",
            ],
            formats=[
                None,
                None,
                None,
                None,
                None,
                ".1f",
                ".1f",
                ".1f",
                None,
                ".2f",
                ".2f",
                ".2f",
                ".2f",
                None,
                None,
                None,
                ".2e",
            ],
        )
    )
    print(
        "compute = slowest rank's local decode_partial; vs tree = time / tree's time; host bytes = bytes leaving "
        "the hosts' uplinks per step (TCP/IP included); payload = the schedule's bytes between hosts; "
        "max|diff| = largest output difference between methods; pred = compute + the combine as "
        "attention.cost.combine_times(backend='gloo') models it (the model combine='auto' picks by); "
        "comb ms = the combine alone on states already computed (tree_combine), comb pred = the model's; "
        "skew = in the step, the last rank's attention done less the first's (what the first wait for in the "
        "combine: the attention's imbalance, not the combine's); after last = the combine once the last rank is in it"
    )
    for c in cases:
        print("\n".join(orders(c)))


def main(argv: list[str] | None = None) -> int:
    bench = Benchmark(
        "bench_emucluster_decode",
        __doc__,
        repeats=2,
        json="bench_emucluster_decode.json",
        aliases={"--repeats": ["--reps"], "--json": ["--json-out"]},
        helps={"--repeats": "repetitions per method"},
    )
    p = bench.parser
    emulated.add_options(p, METHODS, rates="1gbit", timeout=1200, op_timeout=600)
    p.add_argument(
        "--tokens",
        default="16384,32768,65536,131072",
        type=units.counts_arg("--tokens"),
        help="KV lengths at batch 1, comma-separated; k = 1e3 (default 16384,32768,65536,131072)",
    )
    p.add_argument(
        "--batches",
        default="1,64",
        type=units.ints_arg("--batches"),
        help="batch sizes, comma-separated (default 1,64: 64 makes the packed state 1.06 MB)",
    )
    p.add_argument(
        "--batch-tokens",
        default="1024",
        type=units.count_arg("--batch-tokens"),
        help="KV length of the batches above 1 (default 1024)",
    )
    args = bench.parse(argv)
    emulated.parse_methods(p, args, METHODS)
    if args.worker:
        return emulated.worker(measure, args)

    def per_process_bytes(hosts: int, rph: int) -> int:  # the K/V shard, its float32 draw and ring's received shard
        shard = max(-(-n // (hosts * rph)) * b for b, n in cases_of(args)) * KV_HEADS * HEAD_DIM
        return shard * (2 * KV_ITEMSIZE + 4 + 2 * KV_ITEMSIZE)

    if not emulated.ready(args, per_process_bytes):
        return 1
    t0 = time.time()
    worker_argv = emulated.passed_on(args, "--methods", "--tokens", "--batches", "--batch-tokens", "--repeats")
    cases = [
        make_case(hosts, rph, rate, raw, topo_path, args)
        for hosts, rph, rate, raw, topo_path in emulated.cases("bench_emucluster_decode", args, worker_argv)
    ]
    print_table(cases)
    bench.write_json({"seconds": time.time() - t0, "cases": cases}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
