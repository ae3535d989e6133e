"""Benchmark: treecoll collectives against torch.distributed on gloo (not a test).

For P = 2, 4, 8 gloo processes (spawned on 127.0.0.1) and sizes 8 B .. 64 MiB:

* ``sum``: our allreduce (``collectives.allreduce(x)``: ``algo="auto"``, the
  tree chosen by ``auto`` for small messages and the direct reduce-scatter +
  all-gather from 256 KiB, default chunking; ``--algo`` forces tree/ring/rsag) against
  ``torch.distributed.all_reduce`` on the same float32 tensor;
* ``merge``: one tree allreduce of the attention-state merge, a tuple-valued
  operator on ``(out [N, 128] f32, lse [N] f32)`` (merged in place: out rows
  re-weighted with ``mul_``/``addcmul_``), against the same result by three
  all-reduces (max of lse, sum of weighted out, sum of weights; the Tree
  Attention paper's baseline), checked equal once.

A repetition's time is that of the slowest rank; the table prints the median
over repetitions (after a warm-up call) in microseconds, and the ratio ours /
theirs (< 1 is faster) as the median over repetitions of the paired ratio:
the two variants' repetitions are interleaved (ours, theirs, ours, ...), so
each pair saw the same machine load.  ``--json`` writes everything (the ratio
of the medians and the minimums too).  At least :data:`MIN_REPS` repetitions
per size.

    python -m treecoll.tools.bench_collectives --procs 2 4 8 --json bench_collectives.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

from treecoll.tools import units
from treecoll.tools.cli import script_main
from treecoll.tools.resources import OVERSUBSCRIBE_HELP, check_processes

HEAD_DIM = 128

SIZES = [8, 64, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


#: fewest repetitions at any size: with 3 (the earlier floor, at 1 MiB and up) one
#: descheduled repetition moved a median by 2x on this 2-core machine
MIN_REPS = 11


def _reps(nbytes: int, base: int) -> int:
    """``base`` repetitions up to 64 KiB, fewer for larger messages (about
    ``base * 64 KiB`` bytes per variant), never fewer than :data:`MIN_REPS`."""
    return max(MIN_REPS, min(base, int(base * (1 << 16) / max(nbytes, 1))))


def _time(fns, reps: int, dist) -> dict:
    """Time each function ``reps`` times, repetitions interleaved (fn0, fn1, fn0, ...,
    each after a barrier) so that load from other processes hits every variant
    alike.  A repetition's time is the slowest rank's.  Returns ``median`` and
    ``min`` seconds per function and ``paired``: the median over repetitions of
    ``t_0 / t_1`` (fn0 against fn1 measured next to each other, which cancels the
    drift of the machine's load between repetitions)."""
    import torch
    for fn in fns:
        fn()  # warm-up (plans, schedules, fingerprints, connections)
    ts = torch.zeros(len(fns), reps, dtype=torch.float64)
    for k in range(reps):
        for i, fn in enumerate(fns):
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            ts[i, k] = time.perf_counter() - t0
    dist.all_reduce(ts, op=dist.ReduceOp.MAX)  # the slowest rank of each repetition
    rows = ts.tolist()
    return {"median": [statistics.median(t) for t in rows], "min": [min(t) for t in rows],
            "paired": statistics.median(a / b for a, b in zip(rows[0], rows[1]))}


def _worker(rank: int, world: int, port: int, sizes, base_reps: int, algo: str, out_path: str,
            nchunks=None, parent: int | None = None) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if parent is not None:
        from treecoll.attention.dist import die_with_parent
        die_with_parent(parent)      # a killed benchmark leaves no ranks behind
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    import treecoll.collectives.execute as ex
    from treecoll.collectives.ops import resolve_op

    def merge_op(a, b):
        """The attention-state merge, in place into ``a`` (out rows re-weighted by addcmul,
        no out-sized temporaries); (0, -inf) stays the identity."""
        (oa, la), (ob, lb) = a, b
        m = torch.maximum(la, lb)
        shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        wa, wb = torch.exp(la - shift), torch.exp(lb - shift)
        den = wa + wb
        safe = torch.where(den > 0, den, torch.ones_like(den))
        oa.mul_((wa / safe)[:, None]).addcmul_(ob, (wb / safe)[:, None])
        la.copy_(torch.where(den > 0, shift + torch.log(safe), m))
        return a

    opts = ex.CollectiveOptions(algo=algo, nchunks=nchunks)
    merge = resolve_op(merge_op, commutative=True)
    rows_out = []
    for nbytes in sizes:
        reps = _reps(nbytes, base_reps)
        n = max(1, nbytes // 4)
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        buf = x.clone()

        def ours(buf=buf, x=x):
            buf.copy_(x)
            ex.allreduce(buf, out=buf, options=opts)

        def theirs(buf=buf, x=x):
            buf.copy_(x)
            dist.all_reduce(buf)

        sum_t = _time([ours, theirs], reps, dist)
        # tuple-valued operator: attention-state merge over N rows of (out [128], lse)
        rows = max(1, nbytes // (4 * (HEAD_DIM + 1)))
        g = torch.Generator().manual_seed(100 + rank)
        out = torch.randn(rows, HEAD_DIM, generator=g)
        lse = torch.randn(rows, generator=g)

        def tree_merge(out=out, lse=lse):
            return ex.allreduce((out, lse), op=merge, options=opts)

        def three(out=out, lse=lse):
            m = lse.clone()
            dist.all_reduce(m, op=dist.ReduceOp.MAX)
            w = torch.exp(lse - m)
            num = out * w[:, None]
            dist.all_reduce(num)
            dist.all_reduce(w)
            return num / w[:, None], m + torch.log(w)

        merge_t = _time([tree_merge, three], reps, dist)
        if nbytes == sizes[0]:   # correctness of the merge path, once
            a, b = tree_merge(), three()
            assert torch.allclose(a[0], b[0], rtol=1e-4, atol=1e-5) and torch.allclose(a[1], b[1], rtol=1e-4, atol=1e-5)
        (t_ours, t_torch), (m_ours, m_torch) = sum_t["median"], sum_t["min"]
        (t_merge, t_three), (m_merge, m_three) = merge_t["median"], merge_t["min"]
        rows_out.append({"procs": world, "bytes": nbytes, "reps": reps, "ours_us": t_ours * 1e6,
                         "torch_us": t_torch * 1e6, "ratio": sum_t["paired"],
                         "ratio_of_medians": t_ours / t_torch,
                         "merge_bytes": rows * 4 * (HEAD_DIM + 1), "tree_merge_us": t_merge * 1e6,
                         "three_allreduce_us": t_three * 1e6, "merge_ratio": merge_t["paired"],
                         "merge_ratio_of_medians": t_merge / t_three,
                         "min_us": {"ours": m_ours * 1e6, "torch": m_torch * 1e6, "tree_merge": m_merge * 1e6,
                                    "three_allreduce": m_three * 1e6}})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows_out, f)
    dist.barrier()
    dist.destroy_process_group()


def _size(n: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=units.int_arg("--procs"), nargs="+", default=[2, 4, 8],
                    help="process counts, one group each (default 2 4 8)")
    ap.add_argument("--oversubscribe", action="store_true", help=OVERSUBSCRIBE_HELP)
    ap.add_argument("--max-bytes", type=units.size_arg("--max-bytes"), default=64 << 20,
                    help="largest default message size (default 64MiB)")
    ap.add_argument("--sizes", type=units.size_arg("--sizes"), nargs="+",
                    help="message sizes (default 8 B .. --max-bytes)")
    ap.add_argument("--reps", type=units.int_arg("--reps"), default=20,
                    help="repetitions for small sizes (fewer for large)")
    ap.add_argument("--algo", default="auto", choices=("auto", "tree", "ring", "rsag", "direct"),
                    help="treecoll's allreduce algorithm (default auto)")
    ap.add_argument("--nchunks", type=units.int_arg("--nchunks"),
                    help="chunks per message (default: the executor's rule)")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args(argv)
    sizes = args.sizes or [s for s in SIZES if s <= args.max_bytes]
    for p in args.procs:  # a rank holds the tensor, its copy for torch's all_reduce and a received chunk
        check_processes(p, option=f"--procs {p}", per_process_bytes=3 * max(sizes), oversubscribe=args.oversubscribe)
    import torch.multiprocessing as mp
    from treecoll.attention.dist import free_port
    results = []
    for p in args.procs:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        t0 = time.time()
        mp.spawn(_worker, args=(p, free_port(), sizes, args.reps, args.algo, path, args.nchunks, os.getpid()),
                 nprocs=p, join=True)
        with open(path) as f:
            rows = json.load(f)
        os.unlink(path)
        results.extend(rows)
        print(f"P={p}: {time.time() - t0:.0f} s", file=sys.stderr)
    hdr = (f"{'P':>2} {'size':>8} | {'ours us':>10} {'gloo us':>10} {'ratio':>6} | "
           f"{'merge B':>9} {'tree us':>10} {'3xAR us':>10} {'ratio':>6}")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        print(f"{r['procs']:>2} {_size(r['bytes']):>8} | {r['ours_us']:>10.1f} {r['torch_us']:>10.1f} "
              f"{r['ratio']:>6.2f} | {r['merge_bytes']:>9} {r['tree_merge_us']:>10.1f} "
              f"{r['three_allreduce_us']:>10.1f} {r['merge_ratio']:>6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"algo": args.algo, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
