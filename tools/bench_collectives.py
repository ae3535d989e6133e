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
each pair saw the same machine load (:mod:`treecoll.tools.bench.harness`).
``--json`` writes everything (the ratio of the medians and the minimums too).
At least :data:`MIN_REPS` repetitions per size; the ranks are started by
:func:`treecoll.collectives.launch.spawn`.

    python -m treecoll.tools.bench_collectives --procs 2 4 8 --json bench_collectives.json
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from treecoll.tools import units
from treecoll.tools.bench.harness import Benchmark, interleaved, paired_ratio, slowest_rank, summary
from treecoll.tools.cli import script_main
from treecoll.tools.resources import OVERSUBSCRIBE_HELP, check_processes
from treecoll.topo.fmt import fmt_bytes, table

if TYPE_CHECKING:
    import torch

HEAD_DIM = 128

SIZES = [8, 64, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


#: fewest repetitions at any size: with 3 (the earlier floor, at 1 MiB and up) one
#: descheduled repetition moved a median by 2x on this 2-core machine
MIN_REPS = 11


def _reps(nbytes: int, base: int) -> int:
    """``base`` repetitions up to 64 KiB, fewer for larger messages (about
    ``base * 64 KiB`` bytes per variant), never fewer than :data:`MIN_REPS`."""
    return max(MIN_REPS, min(base, int(base * (1 << 16) / max(nbytes, 1))))


def _time(ours, theirs, reps: int) -> dict:
    """``ours`` against ``theirs``, repetitions interleaved (each after a barrier), a repetition's
    time the slowest rank's: ``median`` and ``min`` seconds of both, and ``paired``: the median
    over repetitions of ours / theirs."""
    import torch.distributed as dist

    t = interleaved({"ours": ours, "theirs": theirs}, reps, before=lambda _: dist.barrier(), combine=slowest_rank)
    a, b = summary(t["ours"]), summary(t["theirs"])
    return {
        "median": [a["median"], b["median"]],
        "min": [a["min"], b["min"]],
        "paired": paired_ratio(t["ours"], t["theirs"]),
    }


def merge_op(
    a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention-state merge, in place into ``a`` (out rows re-weighted by addcmul,
    no out-sized temporaries); (0, -inf) stays the identity."""
    import torch

    (oa, la), (ob, lb) = a, b
    m = torch.maximum(la, lb)
    shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    wa, wb = torch.exp(la - shift), torch.exp(lb - shift)
    den = wa + wb
    safe = torch.where(den > 0, den, torch.ones_like(den))
    oa.mul_((wa / safe)[:, None]).addcmul_(ob, (wb / safe)[:, None])
    la.copy_(torch.where(den > 0, shift + torch.log(safe), m))
    return a


def _one_size(rank: int, world: int, nbytes: int, reps: int, algo: str, nchunks, check: bool) -> dict:
    """Both comparisons at one message size on this rank: the row of the table."""
    import torch
    import torch.distributed as dist
    import treecoll.collectives.execute as ex
    from treecoll.collectives.ops import resolve_op

    opts = ex.CollectiveOptions(algo=algo, nchunks=nchunks)
    merge = resolve_op(merge_op, commutative=True)
    x = torch.randn(max(1, nbytes // 4), generator=torch.Generator().manual_seed(rank))
    buf = x.clone()

    def ours():
        buf.copy_(x)
        ex.allreduce(buf, out=buf, options=opts)

    def theirs():
        buf.copy_(x)
        dist.all_reduce(buf)

    sum_t = _time(ours, theirs, reps)
    # tuple-valued operator: attention-state merge over N rows of (out [128], lse)
    rows = max(1, nbytes // (4 * (HEAD_DIM + 1)))
    g = torch.Generator().manual_seed(100 + rank)
    out = torch.randn(rows, HEAD_DIM, generator=g)
    lse = torch.randn(rows, generator=g)

    def tree_merge():
        return ex.allreduce((out, lse), op=merge, options=opts)

    def three():
        m = lse.clone()
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        w = torch.exp(lse - m)
        num = out * w[:, None]
        dist.all_reduce(num)
        dist.all_reduce(w)
        return num / w[:, None], m + torch.log(w)

    if check:  # correctness of the merge path, once, before the timed calls merge (out, lse) in place
        a = ex.allreduce((out.clone(), lse.clone()), op=merge, options=opts)
        b = three()
        assert torch.allclose(a[0], b[0], rtol=1e-4, atol=1e-5) and torch.allclose(a[1], b[1], rtol=1e-4, atol=1e-5)
    merge_t = _time(tree_merge, three, reps)
    (t_ours, t_torch), (m_ours, m_torch) = sum_t["median"], sum_t["min"]
    (t_merge, t_three), (m_merge, m_three) = merge_t["median"], merge_t["min"]
    return {
        "procs": world,
        "bytes": nbytes,
        "reps": reps,
        "ours_us": t_ours * 1e6,
        "torch_us": t_torch * 1e6,
        "ratio": sum_t["paired"],
        "ratio_of_medians": t_ours / t_torch,
        "merge_bytes": rows * 4 * (HEAD_DIM + 1),
        "tree_merge_us": t_merge * 1e6,
        "three_allreduce_us": t_three * 1e6,
        "merge_ratio": merge_t["paired"],
        "merge_ratio_of_medians": t_merge / t_three,
        "min_us": {
            "ours": m_ours * 1e6,
            "torch": m_torch * 1e6,
            "tree_merge": m_merge * 1e6,
            "three_allreduce": m_three * 1e6,
        },
    }


def _worker(rank: int, world: int, sizes, base_reps: int, algo: str, nchunks=None) -> list[dict]:
    """One rank (:func:`treecoll.collectives.launch.spawn`): every size, both comparisons."""
    return [
        _one_size(rank, world, nbytes, _reps(nbytes, base_reps), algo, nchunks, nbytes == sizes[0]) for nbytes in sizes
    ]


def main(argv: Sequence[str] | None = None) -> int:
    bench = Benchmark("bench_collectives", __doc__, repeats=20, json="", aliases={"--repeats": ["--reps"]})
    ap = bench.parser
    ap.add_argument(
        "--procs",
        type=units.int_arg("--procs"),
        nargs="+",
        default=[2, 4, 8],
        help="process counts, one group each (default 2 4 8)",
    )
    ap.add_argument("--oversubscribe", action="store_true", help=OVERSUBSCRIBE_HELP)
    ap.add_argument(
        "--max-bytes",
        type=units.size_arg("--max-bytes"),
        default=64 << 20,
        help="largest default message size (default 64MiB)",
    )
    ap.add_argument(
        "--sizes", type=units.size_arg("--sizes"), nargs="+", help="message sizes (default 8 B .. --max-bytes)"
    )
    ap.add_argument(
        "--algo",
        default="auto",
        choices=("auto", "tree", "ring", "rsag", "direct"),
        help="treecoll's allreduce algorithm (default auto)",
    )
    ap.add_argument(
        "--nchunks", type=units.int_arg("--nchunks"), help="chunks per message (default: the executor's rule)"
    )
    ap.add_argument(
        "--timeout",
        type=units.seconds_arg("--timeout"),
        default=1800.0,
        help="seconds one process count may take before its ranks are killed (default 1800)",
    )
    args = bench.parse(argv)
    sizes = args.sizes or [s for s in SIZES if s <= args.max_bytes]
    for p in args.procs:  # a rank holds the tensor, its copy for torch's all_reduce and a received chunk
        check_processes(p, option=f"--procs {p}", per_process_bytes=3 * max(sizes), oversubscribe=args.oversubscribe)
    from treecoll.collectives import launch

    results = []
    for p in args.procs:
        t0 = time.time()
        ranks = launch.spawn(
            _worker, p, sizes, args.repeats, args.algo, args.nchunks, timeout=args.timeout, where="bench_collectives"
        )
        results.extend(ranks[0])
        print(f"P={p}: {time.time() - t0:.0f} s", file=sys.stderr)
    print(
        table(
            [
                [
                    r["procs"],
                    fmt_bytes(r["bytes"]),
                    r["ours_us"],
                    r["torch_us"],
                    r["ratio"],
                    r["merge_bytes"],
                    r["tree_merge_us"],
                    r["three_allreduce_us"],
                    r["merge_ratio"],
                ]
                for r in results
            ],
            ["P", "size", "ours us", "gloo us", "ratio", "merge B", "tree us", "3xAR us", "ratio"],
            formats=[None, None, ".1f", ".1f", ".2f", None, ".1f", ".1f", ".2f"],
        )
    )
    bench.write_json({"algo": args.algo, "results": results}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
