"""Scale benchmark of the simulator: allreduce on 8192 and 16,384 GPUs.

    python -m treecoll.tools.bench_sim_scale [--quick] [--json OUT] [--sizes 64KiB,1GiB] [--skip-tree]

Targets: an allreduce on topologies/dgx-h100-x1024.yaml (8192 GPUs)
simulates in < 10 s, one on 16,384 GPUs (2048 DGX H100, built from the same
templates in code) in < 30 s, memory linear in ranks + links. Measured per
run: wall time cold (first simulation on a freshly loaded topology, route
queries included) and warm (routes cached), peak RSS of the process, and the
engine's counters. Ring: the lockstep model (NCCL profiles); tree: the
``two_level`` builder compiled to a schedule (1 chunk per tree; one tree per
NIC rail from ``treecoll.collectives.sim.NCCL_TREE_RAIL_BYTES``, as the simulated NCCL tree) run through the event
engine as ``simulate_algorithm`` runs NCCL-style trees (``NCCL_TREE_RUN``,
NCCL's tree factor). Prints a line per run as it ends, then a table, and
writes JSON (default ``bench_sim_scale.json`` in the current directory).
"""
from __future__ import annotations

import resource
import sys
import time

from treecoll.tools import units
from treecoll.tools.bench.harness import Benchmark
from treecoll.tools.cli import script_main
from treecoll.topo.fmt import fmt_bytes, table


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _topology(hosts: int):
    from treecoll.topo import yaml_io
    if hosts == 1024:
        return yaml_io.resolve("dgx-h100-x1024")
    return yaml_io.loads(f"name: dgx-h100-x{hosts}\nhosts: [{{template: dgx-h100, count: {hosts}}}]\n"
                         "network: {type: rail_optimized, su_hosts: 32, spines: 16}\n")


def run(hosts_list, sizes, tree: bool) -> list[dict]:
    from treecoll.collectives import builders
    from treecoll.collectives import compile as compile_
    from treecoll.collectives.sim.profiles import get_profile
    from treecoll.collectives.sim.simulator import NCCL_TREE_RAIL_BYTES, NCCL_TREE_RUN, simulate, simulate_ring
    tree_profile = get_profile("nccl-simple").for_tree_allreduce()
    rows = []
    for hosts in hosts_list:
        t0 = time.perf_counter()
        topo = _topology(hosts)
        load = time.perf_counter() - t0
        P = len(topo.gpus())
        algos = [("ring", None)] + ([("two_level", None)] if tree else [])
        for algo, _ in algos:
            for size in sizes:
                walls, builds = [], []
                for _rep in range(2):   # cold (routes computed), then warm
                    build = 0.0
                    if algo != "ring":
                        tb = time.perf_counter()
                        plan = builders.build("two_level", topo, nbytes=size, rails=size >= NCCL_TREE_RAIL_BYTES)
                        sched = compile_.compile_allreduce(plan, 1, forward_lag=0)
                        build = time.perf_counter() - tb
                    builds.append(build)
                    t0 = time.perf_counter()   # the simulation alone; build + compile reported apart
                    if algo == "ring":
                        r = simulate_ring(topo, size, profile="nccl-simple")
                    else:
                        # as simulate_algorithm runs NCCL-style trees (split lanes, NCCL's tree factor)
                        r = simulate(topo, sched, size, profile=tree_profile, **NCCL_TREE_RUN)
                    walls.append(time.perf_counter() - t0)
                    if algo != "ring" and _rep == 0 and walls[0] > 60:
                        walls.append(float("nan"))
                        break
                row = {"gpus": P, "hosts": hosts, "algo": algo, "size": size, "load_s": load,
                       "cold_s": walls[0], "warm_s": walls[1], "build_compile_s": builds[0],
                       "sim_time_us": r.time * 1e6, "busbw": r.busbw, "rss_mb": _rss_mb(),
                       "links_used": len(r.link_bytes), "stats": {k: v for k, v in r.stats.items() if k != "wall_s"}}
                rows.append(row)
                print(f"{P:>6} {algo:<10} {size:>11} load {load:5.2f}s cold {walls[0]:6.2f}s warm {walls[1]:6.2f}s "
                      f"(build+compile {builds[0]:5.2f}s) -> {r.time * 1e6:10.1f} us busbw {r.busbw:7.2f} "
                      f"rss {row['rss_mb']:6.0f} MB", flush=True)
    return rows


def main(argv=None) -> int:
    bench = Benchmark("bench_sim_scale", __doc__, json="bench_sim_scale.json", quick="8192 GPUs only")
    bench.parser.add_argument("--sizes", default=[1 << 16, 1 << 30], type=units.sizes_arg("--sizes"),
                              help="message sizes, comma list or A:B (default 64KiB,1GiB)")
    bench.parser.add_argument("--skip-tree", action="store_true", help="ring only")
    args = bench.parse(argv)
    hosts = [1024] if args.quick else [1024, 2048]
    print(f"{'GPUs':>6} {'algo':<10} {'bytes':>11}  (wall times of the simulation; targets 8192 < 10 s, "
          f"16384 < 30 s)", flush=True)
    rows = run(hosts, args.sizes, not args.skip_tree)
    print(table([[r["gpus"], r["algo"], fmt_bytes(r["size"]), r["load_s"], r["cold_s"], r["warm_s"],
                  r["build_compile_s"], r["sim_time_us"], r["busbw"], r["rss_mb"]] for r in rows],
                ["GPUs", "algo", "size", "load s", "cold s", "warm s", "build s", "sim us", "busbw GB/s", "rss MB"],
                formats=[None, None, None, ".2f", ".2f", ".2f", ".2f", ".1f", ".2f", ".0f"]))
    bench.write_json({"rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
