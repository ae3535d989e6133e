"""The link probe on the emulated cluster: probe time against host count, and the allreduce gain of the probed tree.

Needs root (network namespaces, :mod:`treecoll.tools.emucluster`). One host of
every cluster is degraded: host ``min(2, H - 1)`` runs its uplink at
``--slow-rate`` (default 100mbit) while the others run at ``--rates`` (default
1gbit), a fault the cluster's topology YAML does not know (``--host-rate``).

1. **Probe time**: for each host count of ``--shapes`` (one rank per host;
   default 2, 4 and 6 hosts) ``treecoll topo probe --json -o probed.yaml`` runs
   as the job. Recorded: the job's wall time (start-up of the ranks included,
   making and removing the cluster not), the probe's own time, its steps, and
   whether it named the degraded host and no other.
2. **Allreduce gain**: on the ``--gain-hosts`` cluster (default 4 hosts), every
   rank (``--worker``) times treecoll's allreduce(sum) of ``--bytes`` float32
   (default 4 MiB) with ``two_level`` built on the cluster's unprobed topology
   and on the probed one, the repetitions interleaved (slowest rank's time of
   each); the gain is the median of the paired ratios unprobed / probed.

Usage (root)::

    python -m treecoll.tools.bench_probe                 # 2, 4, 6 hosts; gain on 4
    python -m treecoll.tools.bench_probe --quick         # 2 and 4 hosts, 3 repetitions
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from treecoll.tools import units
from treecoll.tools.bench import emulated
from treecoll.tools.bench.harness import Benchmark, interleaved, paired_ratio, slowest_rank, summary
from treecoll.tools.cli import script_main
from treecoll.topo.fmt import fmt_bytes, table

METHODS = ("unprobed", "probed")


def slow_host(hosts: int) -> int:
    """The degraded host of an ``hosts``-host cluster: host 2, or the last of a smaller one.

    >>> slow_host(6), slow_host(2)
    (2, 1)
    """
    return min(2, hosts - 1)


# ----------------------------------------------------------------------------- part 1: the probe as the job
def probe_case(hosts: int, rate: str, slow_rate: str, out: Path, timeout: float) -> dict[str, Any]:
    """Run ``treecoll topo probe`` as the job of a ``hosts``-host cluster; rank 0's JSON summary and the times."""
    from treecoll.tools.emucluster import netns, runner
    from treecoll.tools.emucluster.netns import EmuClusterError

    slow = slow_host(hosts)
    cmd = [sys.executable, "-m", "treecoll.tools.cli", "topo", "probe", "--json", "--force", "-o", str(out)]
    text, err = io.StringIO(), io.StringIO()
    res = runner.run(
        cmd,
        hosts=hosts,
        ranks_per_host=1,
        rate_bps=netns.parse_rate(rate),
        host_rates={slow: netns.parse_rate(slow_rate, "--slow-rate")},
        timeout=timeout,
        tag_output=True,
        stdout=text,
        stderr=err,
    )
    if res.returncode != 0:
        raise EmuClusterError(
            f"bench_probe {hosts} hosts: the probe exited {res.returncode} (rank {res.failed_rank}): "
            + " ".join(err.getvalue().strip().splitlines()[-1:])
        )
    rank0 = "".join(line[5:] + "\n" for line in text.getvalue().splitlines() if line.startswith("[r0] "))
    s = json.loads(rank0)["summary"]
    return {
        "hosts": hosts,
        "slow_host": f"h{slow}",
        "job_seconds": round(res.seconds, 3),
        "probe_seconds": s["seconds"],
        "steps": s["plan"]["steps"],
        "transfers": s["plan"]["transfers"],
        "model_seconds": s["plan"]["model_seconds"],
        "named": s["slow_names"],
        "slow_hosts": s["slow_hosts"],
        "found": s["slow_hosts"] == [f"h{slow}"],
    }


# ----------------------------------------------------------------------------- part 2: allreduce, two trees
def measure(rank: int, world: int, args: argparse.Namespace) -> dict | None:
    """One rank: allreduce with two_level on the unprobed and on the probed topology, interleaved."""
    import torch
    import torch.distributed as dist
    from treecoll.tools.bench_emucluster import make_ours

    fns = {
        "unprobed": make_ours("two_level", os.environ.get("TREECOLL_EMU_TOPOLOGY"), world),
        "probed": make_ours("two_level", args.probed, world),
    }
    x = torch.empty(args.bytes // 4, dtype=torch.float32)
    ok = dict.fromkeys(fns, True)

    def before(_m: str) -> None:
        x.fill_(rank + 1)
        dist.barrier()

    def after(m: str) -> None:
        ok[m] &= bool(torch.all(x == world * (world + 1) / 2))

    times = interleaved(
        {m: (lambda fn=fn: fn(x)) for m, fn in fns.items()},
        args.repeats,
        warmup=1,
        before=before,
        after=after,
        combine=slowest_rank,
    )
    right = torch.tensor([0.0 if ok[m] else 1.0 for m in fns])
    dist.all_reduce(right)
    return {"times": times, "correct": {m: bool(right[i] == 0) for i, m in enumerate(fns)}} if rank == 0 else None


def trees(unprobed: Path, probed: Path, hosts: int) -> dict[str, list[int]]:
    """The two_level trees (parents by rank) the two topologies give."""
    from treecoll.collectives.builders import two_level
    from treecoll.topo import yaml_io

    out = {}
    for name, path in (("unprobed", unprobed), ("probed", probed)):
        t = yaml_io.load(path)
        out[name] = list(two_level(t, t.rank_gpus(), hosts, rails=False).parents)
    return out


# ----------------------------------------------------------------------------- driver
def main(argv: Sequence[str] | None = None) -> int:
    bench = Benchmark("bench_probe", __doc__, repeats=7, json="bench_probe.json", quick="2 and 4 hosts, 3 repetitions")
    p = bench.parser
    emulated.add_options(p, METHODS, rates="1gbit", timeout=300, op_timeout=120)
    p.set_defaults(shapes=[(2, 1), (4, 1), (6, 1)])
    p.add_argument("--slow-rate", default="100mbit", help="the degraded host's uplink rate (default 100mbit)")
    p.add_argument(
        "--gain-hosts",
        type=units.int_arg("--gain-hosts", minimum=3),
        default=4,
        metavar="H",
        help="hosts of the allreduce comparison (default 4)",
    )
    p.add_argument(
        "--bytes", type=units.size_arg("--bytes"), default=4 << 20, metavar="S", help="allreduce size (default 4MiB)"
    )
    p.add_argument("--probed", help=argparse.SUPPRESS)
    args = bench.parse(argv)
    emulated.parse_methods(p, args, METHODS)
    if args.worker:
        return emulated.worker(measure, args)
    if args.quick:
        args.shapes, args.repeats = [(2, 1), (4, 1)], 3
    if any(rph != 1 for _, rph in args.shapes):
        p.error("--shapes: expected one rank per host (Hx1): the probe measures host links")
    rate = args.rates[0]
    if not emulated.ready(args, lambda hosts, rph: 64 << 20):
        return 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_probe-") as d:
        counts = sorted({h for h, _ in args.shapes} | {args.gain_hosts})
        for hosts in counts:
            print(f"# probe on {hosts} hosts ...", file=sys.stderr, flush=True)
            rows.append(probe_case(hosts, rate, args.slow_rate, Path(d) / f"probed-{hosts}.yaml", args.timeout))
        print(
            table(
                [
                    [
                        r["hosts"],
                        r["slow_host"],
                        r["steps"],
                        r["transfers"],
                        r["probe_seconds"],
                        r["job_seconds"],
                        ", ".join(r["named"]) or "-",
                        "yes" if r["found"] else "NO",
                    ]
                    for r in rows
                ],
                ["hosts", "degraded", "steps", "transfers", "probe s", "job s", "named slow", "alone"],
                formats=[None, None, None, None, ".2f", ".2f", None, None],
            )
        )
        gain = _gain(args, rate, Path(d) / f"probed-{args.gain_hosts}.yaml")
    bench.write_json({"rate": rate, "slow_rate": args.slow_rate, "probe": rows, "gain": gain}, args.json)
    return 0


def _gain(args, rate: str, probed: Path) -> dict[str, Any]:
    from treecoll.tools.emucluster import netns

    hosts = args.gain_hosts
    args.shapes, args.rates = [(hosts, 1)], [rate]
    worker_argv = ["--probed", str(probed), *emulated.passed_on(args, "--bytes", "--repeats")]
    slow = {slow_host(hosts): netns.parse_rate(args.slow_rate, "--slow-rate")}
    print(f"# allreduce of {fmt_bytes(args.bytes)} on {hosts} hosts, two trees ...", file=sys.stderr, flush=True)
    for _, _, _, raw, topo_path in emulated.cases("bench_probe", args, worker_argv, host_rates=slow):
        times, built = raw["times"], trees(topo_path, probed, hosts)
    ratio = paired_ratio(times["unprobed"], times["probed"])
    out = {
        "hosts": hosts,
        "bytes": args.bytes,
        "trees": built,
        "correct": raw["correct"],
        "unprobed": summary(times["unprobed"]),
        "probed": summary(times["probed"]),
        "times": times,
        "gain_unprobed_over_probed": ratio,
    }
    print(
        table(
            [
                [
                    m,
                    str(built[m]),
                    out[m]["median"] * 1e3,
                    out[m]["min"] * 1e3,
                    out[m]["reps"],
                    "yes" if raw["correct"][m] else "WRONG",
                ]
                for m in METHODS
            ],
            ["tree on", "parents", "median ms", "min ms", "reps", "correct"],
            formats=[None, None, ".1f", ".1f", None, None],
        )
    )
    print(
        f"allreduce {fmt_bytes(args.bytes)} on {hosts} hosts (h{slow_host(hosts)} at {args.slow_rate}): "
        f"the probed tree is {ratio:.2f}x as fast (median of paired ratios unprobed / probed)"
    )
    return out


if __name__ == "__main__":
    sys.exit(script_main(main))
