"""``treecoll topo probe``: measure the links of a running job, compare them with the topology, calibrate it.

Run it as a distributed job, every rank the same command: under torchrun
(``torchrun --nproc-per-node 8 --nnodes 4 ... -m treecoll.tools.cli topo probe
--topology cluster.yaml``), an emulated cluster (``treecoll emu run --hosts 4
--ranks-per-host 1 -- treecoll topo probe``, which exports the cluster's
topology as ``TREECOLL_EMU_TOPOLOGY``) or any ``env://`` launcher; or locally with
``--nproc N`` (the one launcher, :mod:`treecoll.collectives.launch`). The plan
and the verdict are :mod:`treecoll.topo.probe`, the measurement
:mod:`treecoll.collectives.probe`. Rank 0 prints the table (or ``--json``:
``{"pairs", "slow", "summary"}``) and writes ``-o`` (the calibrated topology)
and ``--plot``; an existing file is kept unless ``--force``.

A probe needs two ranks at least; bad input is one line on stderr and exit code 1:

>>> from treecoll.tools.cli import main
>>> main(["topo", "probe", "--nproc", "1"])   # stderr: ... expected at least 2 ranks to measure between, got 1 ...
1
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path
from typing import Any

from treecoll.topo.errors import TreecollError
from treecoll.topo.fmt import fmt_seconds, table

from . import units
from .cli import IMAGE_SUFFIXES, atomic_output, common_options, emit, output_path, write_output
from .units import UsageError

__all__ = ["add_parser", "run", "render", "EMU_TOPOLOGY"]

#: the variable ``treecoll emu run`` names the cluster's topology YAML in
EMU_TOPOLOGY = "TREECOLL_EMU_TOPOLOGY"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    me = sys.modules[__name__]
    p = sub.add_parser(
        "probe",
        help="measure the links of a running job against the topology (distributed)",
        description="Measure latency and bandwidth between the ranks of a distributed job "
        "(torchrun, treecoll emu run, or --nproc N here), by link class, in rounds of "
        "disjoint pairs, and under load; compare with the topology; name the slow "
        "links, NICs and hosts; write a calibrated topology.",
    )
    p.add_argument(
        "--topology",
        metavar="F",
        help=f"the job's topology (YAML, shipped name); default: ${EMU_TOPOLOGY} "
        "under treecoll emu run, one host of N processes with --nproc",
    )
    p.add_argument(
        "--nproc",
        type=units.int_arg("--nproc"),
        metavar="N",
        help="start N local ranks (when not launched by torchrun or another env:// launcher)",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE.yaml",
        help="write the calibrated topology (measured bw/lat, marked measured); kept if it exists unless --force",
    )
    p.add_argument("--plot", metavar="FILE.png", help="draw the hosts with slow links in red (needs matplotlib)")
    p.add_argument("--force", action="store_true", help="replace existing -o / --plot files")
    p.add_argument(
        "--threshold",
        type=units.fraction_arg("--threshold"),
        default=0.7,
        help="slow below this fraction of the model's bandwidth (default 0.7)",
    )
    p.add_argument(
        "--max-rounds",
        type=units.int_arg("--max-rounds"),
        default=16,
        metavar="K",
        help="rounds of disjoint pairs per phase; more are sampled down to K (default 16)",
    )
    p.add_argument(
        "--reps",
        type=units.int_arg("--reps"),
        default=3,
        metavar="N",
        help="timed repetitions of every transfer (default 3)",
    )
    p.add_argument(
        "--bytes",
        type=units.size_arg("--bytes"),
        metavar="S",
        help="bytes per transfer (default: what the model moves in 20 ms, 256KiB..16MiB)",
    )
    p.add_argument("--no-load", action="store_true", help="skip the loaded steps (all hosts sending at once)")
    p.add_argument("--seed", type=units.int_arg("--seed", minimum=0), default=0, help="seed of the round sampling")
    p.add_argument(
        "--timeout",
        type=units.seconds_arg("--timeout"),
        default=60.0,
        metavar="S",
        help="seconds an operation waits for a peer before the probe fails (default 60)",
    )
    common_options(p).set_defaults(_topo_module=me)
    return p


def _check_output(path: str | None, option: str, force: bool, inputs: list, suffixes=None) -> None:
    if path is None:
        return
    output_path(path, option, inputs=inputs, suffixes=suffixes)
    if Path(path).exists() and not force:
        raise UsageError(
            f"{option} {path}: expected a new file, got an existing one; pass --force to replace it "
            f"or choose another name"
        )


def _topology(args, job):
    from treecoll import topo

    spec = args.topology or os.environ.get(EMU_TOPOLOGY)
    if spec:
        return topo.resolve(spec), str(spec)
    if job is not None:
        raise UsageError(
            "topo probe: expected --topology FILE (the job's topology), got none; "
            "discover it with `treecoll topo discover` on each host"
        )
    from treecoll.tools.emucluster.topology import build_topology

    return build_topology(1, args.nproc, 10**9, name=f"local-{args.nproc}"), "local"


def _world(args, job) -> int:
    if job is None and args.nproc is None:
        raise UsageError(
            "topo probe: expected a distributed job (torchrun, treecoll emu run, any env:// launcher) "
            "or --nproc N, got neither"
        )
    if job is not None and args.nproc is not None and args.nproc != job.world:
        raise UsageError(
            f"topo probe: --nproc {args.nproc} given inside a launched job of {job.world} ranks; drop --nproc"
        )
    world = job.world if job is not None else args.nproc
    if world < 2:
        raise UsageError(
            f"topo probe: expected at least 2 ranks to measure between, got {world}; "
            f"launch 2 or more (torchrun --nproc-per-node 2, or --nproc 2)"
        )
    return world


def run(args: argparse.Namespace) -> int:
    from treecoll.collectives import launch
    from treecoll.topo import probe

    job = launch.job_from_env()
    world = _world(args, job)
    lead = job is None or job.rank == 0
    t, source = _topology(args, job)
    if lead:
        _check_output(args.output, "-o", args.force, [source], (".yaml", ".yml"))
        _check_output(args.plot, "--plot", args.force, [source], IMAGE_SUFFIXES)
    n = len(t.rank_gpus())
    if n != world:
        raise UsageError(
            f"topo probe: topology {t.name!r} ({source}) has {n} ranks, the job {world}; give the "
            f"topology of this job (--topology)"
        )
    plan = probe.make_plan(
        t, reps=args.reps, max_rounds=args.max_rounds, seed=args.seed, nbytes=args.bytes, load=not args.no_load
    )
    results = _measure(plan, t, args, job)
    if results is None:
        return 1
    if not lead:
        return 0
    records = [r for res in results for r in res["records"]]
    report = probe.assess(plan, t, records, threshold=args.threshold)
    summary = report["summary"]
    summary.update(
        topology=t.name,
        source=source,
        hosts=len({h for h in probe.rank_hosts(t).values()}),
        seconds=round(max(res["seconds"] for res in results), 3),
    )
    if args.output:
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        from treecoll import topo

        write_output(args.output, topo.dumps(probe.calibrate(t, report, date=date)))
        summary["output"] = args.output
    if args.plot:
        summary["plot"] = _plot(t, report, args.plot)
    return emit(args, {k: report[k] for k in ("pairs", "slow", "summary")}, render)


def _measure(plan, t, args, job) -> list[dict[str, Any]] | None:
    """Every rank's measurement; None on a rank other than 0 when the ranks' failure was gathered
    (rank 0 reports it, once for the job)."""
    import time

    from treecoll.collectives import launch
    from treecoll.collectives.probe import ProbeError, last_failure, measure
    from treecoll.topo.probe import rank_hosts

    try:
        return launch.run(
            measure,
            None if job is not None else args.nproc,
            plan,
            rank_hosts(t),
            t.name,
            timeout=args.timeout,
            where="topo probe",
        )
    except launch.LaunchError as e:
        if job is None or job.rank == 0 or e.rank is None:
            raise
        time.sleep(1.0)  # rank 0 prints it before a launcher that stops every rank at the first exit stops it
        return None
    except TreecollError:
        raise
    except RuntimeError as e:  # the process group itself failed (a rank died during a gather)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ProbeError(
            f"{last_failure() or 'topo probe: the job lost a rank: ' + first}; no result written"
        ) from None


def _plot(t, report: dict, path: str) -> str:
    from treecoll.topo.render import draw

    overlay = [(s["a"], s["b"], "red") for s in report["slow"] if s["a"] in t.graph and s["b"] in t.graph]
    overlay += [(b, a, c) for a, b, c in overlay]
    with atomic_output(path, "--plot") as tmp:
        draw(t, tmp, overlay=overlay, title=f"{t.name}: slow links in red ({len(report['slow'])})")
    return path


def render(d: dict[str, Any]) -> str:
    """The text view: one header line, the bandwidth and latency tables, the slow links, the files written."""
    s = d["summary"]
    plan = s["plan"]
    out = [
        f"probe of {s['topology']}: {plan['ranks']} ranks on {s['hosts']} hosts, {plan['steps']} steps in "
        f"{fmt_seconds(s['seconds'])} (transfers at the model's rates: {fmt_seconds(plan['model_seconds'])}); "
        f"slow below {s['threshold']:.0%} of the model",
        "",
    ]
    rows = [
        [
            c["class"],
            c["transfers"],
            c["expected_gbps"],
            c["measured_gbps"],
            f"{c['min_gbps']:.4g}..{c['max_gbps']:.4g}",
            c["ratio"],
        ]
        for c in s["classes"]
    ]
    out.append(
        table(
            rows,
            ["link class", "transfers", "expected GB/s", "measured GB/s", "spread", "ratio"],
            formats=[None, None, ".4g", ".4g", None, ".2f"],
        )
    )
    if s["latency"]:
        rows = [
            [c["class"], c["pairs"], c["expected_us"], c["measured_us"], f"{c['min_us']:.0f}..{c['max_us']:.0f}"]
            for c in s["latency"]
        ]
        out += [
            "",
            table(
                rows,
                ["latency class", "pairs", "model us", "measured us", "spread"],
                formats=[None, None, ".1f", ".1f", None],
            ),
        ]
    out.append("")
    if d["slow"]:
        out.append(f"slow: {', '.join(s['slow_names'])} (hosts {', '.join(s['slow_hosts']) or '-'})")
        out += [
            f"  {x['a']} - {x['b']}: {x['measured_gbps']:.4g} of {x['expected_gbps']:.4g} GB/s "
            f"({x['measured_gbps'] / x['expected_gbps']:.0%})"
            for x in d["slow"]
        ]
    else:
        out.append(f"slow: none ({s['links_assessed']} links assessed)")
    for key, what in (("output", "calibrated topology"), ("plot", "plot")):
        if s.get(key):
            out.append(f"wrote {s[key]} ({what})")
    return "\n".join(out) + "\n"
