"""A benchmark's ranks on an emulated cluster: what ``bench_emucluster`` and ``bench_emucluster_decode`` share.

The driver (the benchmark's ``main``, run as root) adds the cluster options
(:func:`add_options`), checks the process counts and that network namespaces
are available (:func:`ready`), then runs one case per shape and rate
(:func:`cases`): an emulated cluster of that shape comes up
(:mod:`treecoll.tools.emucluster`), the benchmark's own module runs as every
rank (``python -m treecoll.tools.<benchmark> --worker --out FILE ...``, with the
``env://`` variables the cluster's runner sets), and rank 0's result comes
back with the cluster's Topology YAML; the cluster is removed afterwards.

In a rank, :func:`worker` joins the launched job
(:func:`treecoll.collectives.launch.join`: gloo, every rank's failure raised on
every rank), runs the benchmark's measurement and writes rank 0's result.

>>> import argparse
>>> p = argparse.ArgumentParser()
>>> add_options(p, ("gloo", "ring"), rates="1gbit", timeout=900, op_timeout=300)
>>> args = p.parse_args(["--shapes", "2x3", "--methods", "ring"])
>>> parse_methods(p, args, ("gloo", "ring")), args.shapes, args.rates, args.placement
(['ring'], [(2, 3)], ['1gbit'], 'interleaved')
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treecoll.tools import units
from treecoll.tools.resources import OVERSUBSCRIBE_HELP, check_processes

if TYPE_CHECKING:
    from treecoll.topo import Topology

__all__ = ["Unavailable", "load_topology", "add_options", "parse_methods", "ready", "passed_on", "cases", "worker"]


class Unavailable(Exception):
    """A method or prediction that cannot run (the reason is recorded in the JSON)."""


def load_topology(path: str | None) -> Topology:
    """The emulated cluster's Topology from its YAML (``TREECOLL_EMU_TOPOLOGY`` in a rank)."""
    if not path:
        raise Unavailable("no topology YAML (TREECOLL_EMU_TOPOLOGY unset)")
    from treecoll.topo import yaml_io

    return yaml_io.load(path)


def add_options(
    p: argparse.ArgumentParser, methods: Sequence[str], *, rates: str, timeout: float, op_timeout: float
) -> None:
    """The options of an emulated-cluster benchmark (shapes, rates, methods, placement, timeouts)
    and the hidden ones of its ranks (``--worker``, ``--out``)."""
    p.add_argument(
        "--shapes",
        default="2x2,2x3",
        type=units.shapes_arg("--shapes"),
        help="hosts x ranks per host, comma-separated (default 2x2,2x3)",
    )
    p.add_argument("--oversubscribe", action="store_true", help=OVERSUBSCRIBE_HELP)
    p.add_argument(
        "--rates",
        default=rates,
        type=lambda s: units.parse_list(s, what="--rates", kind="rates", error=units.UsageError),
        help=f"uplink rates, comma-separated (tc units; default {rates})",
    )
    p.add_argument("--methods", default=",".join(methods), help=f"comma list of {', '.join(methods)}")
    p.add_argument(
        "--placement",
        default="interleaved",
        choices=("blocked", "interleaved"),
        help="rank placement on the hosts (default interleaved)",
    )
    p.add_argument(
        "--timeout",
        type=units.seconds_arg("--timeout"),
        default=timeout,
        help=f"seconds per case before all ranks are killed (default {timeout:g})",
    )
    p.add_argument(
        "--op-timeout",
        type=units.seconds_arg("--op-timeout"),
        default=op_timeout,
        help=f"torch.distributed timeout in the ranks (default {op_timeout:g})",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)


def parse_methods(p: argparse.ArgumentParser, args: argparse.Namespace, methods: Sequence[str]) -> list[str]:
    """``args.methods`` as a list (stored back), every name one of ``methods`` (else argparse's error)."""
    args.methods = [m for m in str(args.methods).split(",") if m]
    bad = [m for m in args.methods if m not in methods]
    if bad:
        p.error(f"--methods: expected names from {list(methods)}, got {bad}")
    return args.methods


def ready(args: argparse.Namespace, per_process_bytes: Callable[[int, int], int]) -> bool:
    """Check every shape's process count (``per_process_bytes(hosts, ranks_per_host)`` each) against
    this machine, then that namespaces can be made; where they cannot, prints ``error: <why>`` on
    stderr and returns False (the benchmark exits 1)."""
    for hosts, rph in args.shapes:
        check_processes(
            hosts * rph,
            option=f"--shapes {hosts}x{rph}",
            oversubscribe=args.oversubscribe,
            per_process_bytes=per_process_bytes(hosts, rph),
        )
    from treecoll.tools.emucluster import netns

    ok, why = netns.namespaces_available()
    if not ok:
        print(f"error: {why}", file=sys.stderr)
    return ok


def passed_on(args: argparse.Namespace, *options: str) -> list[str]:
    """The driver's ``options`` with their values in ``args``, as words of the ranks' command line
    (``worker_argv`` of :func:`cases`): a list comma-joined, any other value as ``str``.

    >>> passed_on(argparse.Namespace(methods=["ring", "gloo"], batch_tokens=1024), "--methods", "--batch-tokens")
    ['--methods', 'ring,gloo', '--batch-tokens', '1024']
    """
    words = []
    for option in options:
        value = getattr(args, option.lstrip("-").replace("-", "_"))
        words += [option, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)]
    return words


def cases(
    benchmark: str, args: argparse.Namespace, worker_argv: Sequence[str], host_rates: Mapping[int, int] | None = None
) -> Iterator[tuple[int, int, str, dict, Path]]:
    """Run ``benchmark``'s ranks on a cluster of every shape and rate; yields ``(hosts,
    ranks_per_host, rate, rank 0's result, the cluster's Topology YAML path)`` (the YAML is
    removed after the last case). ``host_rates``: hosts whose uplink runs at another rate
    (``treecoll emu run --host-rate``). A failing case raises, naming the rank."""
    from treecoll.tools.emucluster import netns, runner
    from treecoll.tools.emucluster.netns import EmuClusterError

    with tempfile.TemporaryDirectory(prefix=f"{benchmark}-") as d:
        for hosts, rph in args.shapes:
            for rate in args.rates:
                tag = f"{hosts}x{rph}-{rate}"
                print(f"# case {hosts}x{rph} at {rate} ...", file=sys.stderr, flush=True)
                topo_path, out = Path(d) / f"emu-{tag}.yaml", Path(d) / f"raw-{tag}.json"
                cmd = [
                    sys.executable,
                    "-m",
                    f"treecoll.tools.{benchmark}",
                    "--worker",
                    "--out",
                    str(out),
                    "--op-timeout",
                    str(args.op_timeout),
                    *worker_argv,
                ]
                res = runner.run(
                    cmd,
                    hosts=hosts,
                    ranks_per_host=rph,
                    placement_mode=args.placement,
                    rate_bps=netns.parse_rate(rate),
                    timeout=args.timeout,
                    topology_out=str(topo_path),
                    tag_output=True,
                    host_rates={h: r for h, r in (host_rates or {}).items() if h < hosts},
                )
                if res.returncode != 0:
                    raise EmuClusterError(
                        f"{benchmark} {tag}: expected every rank to exit 0, got exit "
                        f"{res.returncode} (rank {res.failed_rank})" + (" after the timeout" if res.timed_out else "")
                    )
                yield hosts, rph, rate, json.loads(out.read_text()), topo_path


def worker(measure: Callable[[int, int, argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """One rank: ``measure(rank, world, args)`` in the launched job; rank 0's result goes to ``args.out``."""
    from treecoll.collectives import launch

    results = launch.join(measure, args, backend="gloo", timeout=args.op_timeout, where=Path(args.out).stem)
    if launch.job_from_env().rank == 0:
        Path(args.out).write_text(json.dumps(results[0]))
    return 0
