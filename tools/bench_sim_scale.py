"""Speed of ``treecoll simulate allreduce`` as a user runs it, from 128 to 100,000 GPUs.

    python -m treecoll.tools.bench_sim_scale [--quick] [--json OUT] [--repeats N] [--case NAME ...]

Each case is one ``treecoll simulate allreduce`` command. Measured per case:
``command s``, the wall time of the command run as a user runs it (a fresh
process: interpreter start, imports, topology load, simulation, output), and
the same work split in two, timed in a fresh process of its own (so that no
earlier case's objects sit in its heap, as in the command): ``load s`` (reading the topology
file) and ``simulate s`` (the table: :func:`treecoll.tools.cmd_simulate.allreduce_data`
on the loaded topology, routes computed cold). ``cpu s``: the CPU time of
those two (what the work costs on a busy machine, where the wall times
stretch). ``event_loop``: whether the flow engine's loop ran in C or in Python
(:mod:`treecoll.collectives.sim.engine_native`). ``rss MB``: peak resident memory of the commands run so far (the
largest child). Cases and targets:

==========  ==========================================================================  ======
case        command                                                                     target
==========  ==========================================================================  ======
sweep128    ``--topology dgx-h100-x16 --sizes 64K,1M,64M,1G`` (5 algorithms x 4 sizes)  10 s
flow8192    ``--topology dgx-h100-x1024 --algo two_level --sizes 64MiB``                  10 s
flow16384   the same on 2048 DGX H100 (a generated file, :func:`cluster_yaml`)          20 s
ana100k     ``--engine analytic --algo ring,two_level,nccl --sizes 64MiB`` on 12,500    seconds
            DGX H100 (100,000 GPUs; generated)
==========  ==========================================================================  ======

``--quick``: the 128-GPU sweep at 64 KiB only and the 8192-GPU case on the
analytic engine, to check the script runs. Prints a line per case as it ends,
then a table, and writes JSON (default ``bench_sim_scale.json``).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from treecoll.tools.bench.harness import Benchmark
from treecoll.tools.cli import script_main
from treecoll.topo.fmt import table

#: name -> (topology: a shipped name or a host count to generate, command arguments, target seconds or None)
CASES = {
    "sweep128": ("dgx-h100-x16", ["--sizes", "64K,1M,64M,1G"], 10.0),
    "flow8192": ("dgx-h100-x1024", ["--algo", "two_level", "--sizes", "64MiB"], 10.0),
    "flow16384": (2048, ["--algo", "two_level", "--sizes", "64MiB"], 20.0),
    "ana100k": (12500, ["--engine", "analytic", "--algo", "ring,two_level,nccl", "--sizes", "64MiB"], None),
}
QUICK = {
    "sweep128": ("dgx-h100-x16", ["--sizes", "64K"], None),
    "ana8192": ("dgx-h100-x1024", ["--engine", "analytic", "--algo", "ring,two_level", "--sizes", "64MiB"], None),
}


def cluster_yaml(hosts: int) -> str:
    """A cluster of ``hosts`` DGX H100 on the rail-optimized fat tree of ``topologies/dgx-h100-x1024.yaml``.

    >>> print(cluster_yaml(2048))
    name: dgx-h100-x2048
    hosts: [{template: dgx-h100, count: 2048}]
    network: {type: rail_optimized, su_hosts: 32, spines: 16}
    <BLANKLINE>
    """
    return (
        f"name: dgx-h100-x{hosts}\nhosts: [{{template: dgx-h100, count: {hosts}}}]\n"
        "network: {type: rail_optimized, su_hosts: 32, spines: 16}\n"
    )


def _topology_arg(spec, where: Path) -> str:
    if isinstance(spec, str):
        return spec
    p = where / f"dgx-h100-x{spec}.yaml"
    p.write_text(cluster_yaml(spec))
    return str(p)


def _command(topology: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "treecoll.tools.cli", "simulate", "allreduce", "--topology", topology, *args]


def _in_process(topology: str, args: list[str]) -> tuple[float, float, dict, float, float]:
    """(load s, simulate s, the table, load CPU s, simulate CPU s) of the command's work in this process."""
    from treecoll.tools import cmd_simulate
    from treecoll.tools.cli import build_parser

    ns = build_parser().parse_args(["simulate", "allreduce", "--topology", topology, *args])
    t0, c0 = time.perf_counter(), time.process_time()
    topo, _ = cmd_simulate._resolve(ns)
    t1, c1 = time.perf_counter(), time.process_time()
    from treecoll.tools import units

    algos = units.parse_list(ns.algo, what="--algo", kind="algorithms")
    data = cmd_simulate.allreduce_data(
        topo, algos, ns.sizes, ns.ranks, ns.profile, ns.sim_command, mode=ns.mode, engine=ns.engine
    )
    t2, c2 = time.perf_counter(), time.process_time()
    from treecoll.collectives.sim.engine_native import native_status

    data["event_loop"] = "native" if native_status()["available"] else "python"  # the flow engine's loop
    return t1 - t0, t2 - t1, data, c1 - c0, c2 - c1


def _in_fresh_process(topology: str, args: list[str]) -> tuple[float, float, dict, float, float]:
    """:func:`_in_process` in a new interpreter, started as the command starts: the benchmark's own
    heap, holding what earlier cases left, slowed a 100,000-GPU load about twofold."""
    code = (
        "import json, sys; from treecoll.tools.bench_sim_scale import _in_process; "
        "print(json.dumps(_in_process(sys.argv[1], sys.argv[2:])))"
    )
    done = subprocess.run([sys.executable, "-c", code, topology, *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the timed load and simulation failed: {done.stderr.strip()[-500:]}")
    load, sim, data, load_cpu, sim_cpu = json.loads(done.stdout.splitlines()[-1])
    return load, sim, data, load_cpu, sim_cpu


def run_case(name: str, spec: str | int, args: list[str], target: float | None, where: Path, repeats: int) -> dict:
    topology = _topology_arg(spec, where)
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = subprocess.run(_command(topology, args), capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if done.returncode:
            raise RuntimeError(f"{name}: the command failed: {done.stderr.strip()[-500:]}")
    load, sim, data, load_cpu, sim_cpu = _in_fresh_process(topology, args)
    row = {
        "case": name,
        "command": "treecoll simulate allreduce --topology "
        + " ".join([str(spec) if isinstance(spec, str) else f"dgx-h100-x{spec}.yaml", *args]),
        "gpus": data["nranks"],
        "engine": data["engine"],
        "event_loop": data["event_loop"],
        "command_s": min(walls),
        "command_runs_s": walls,
        "load_s": load,
        "simulate_s": sim,
        "load_cpu_s": load_cpu,
        "simulate_cpu_s": sim_cpu,
        "target_s": target,
        "rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0,
        "results": [{"size": r["size"], **{a: v["time_us"] for a, v in r["algos"].items()}} for r in data["rows"]],
    }
    print(
        f"{name:<10} {row['gpus']:>7} GPUs {row['engine']:<8} ({row['event_loop']} loop) command "
        f"{row['command_s']:7.2f} s  load {load:6.2f} s  simulate {sim:7.2f} s  "
        f"(CPU {load_cpu:.2f} + {sim_cpu:.2f} s; target {target or '-'} s)",
        flush=True,
    )
    return row


def main(argv: Sequence[str] | None = None) -> int:
    bench = Benchmark(
        "bench_sim_scale",
        __doc__,
        repeats=1,
        json="bench_sim_scale.json",
        quick="the 128-GPU sweep at 64 KiB and 8192 GPUs on the analytic engine",
    )
    bench.parser.add_argument(
        "--case",
        action="append",
        choices=sorted({*CASES, *QUICK}),
        default=None,
        help="run only these cases (repeatable; default every case)",
    )
    args = bench.parse(argv)
    cases = QUICK if args.quick else CASES
    if args.case:  # the full case, or its quick form with --quick
        missing = sorted(set(args.case) - set(cases))
        if missing:
            bench.parser.error(
                f"--case {','.join(missing)}: not among the {'--quick ' if args.quick else ''}cases {sorted(cases)}"
            )
        cases = {k: v for k, v in cases.items() if k in args.case}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (spec, cargs, target) in cases.items():
            rows.append(run_case(name, spec, cargs, target, Path(tmp), args.repeats))
    print(
        table(
            [
                [
                    r["case"],
                    r["gpus"],
                    r["engine"],
                    r["command_s"],
                    r["load_s"],
                    r["simulate_s"],
                    r["load_cpu_s"] + r["simulate_cpu_s"],
                    r["target_s"] if r["target_s"] is not None else "-",
                    r["rss_mb"],
                ]
                for r in rows
            ],
            ["case", "GPUs", "engine", "command s", "load s", "simulate s", "cpu s", "target s", "rss MB"],
            formats=[None, None, None, ".2f", ".2f", ".2f", ".2f", None, ".0f"],
        )
    )
    bench.write_json({"rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
