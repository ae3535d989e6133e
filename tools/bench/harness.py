"""The harness every benchmark shares: options, repetitions, paired ratios, table, JSON, plot.

A benchmark is a module run with ``python -m treecoll.tools.bench_<name>``; it
prints a table and writes JSON, and is not a test. Its ``main(argv)``:

1. builds a :class:`Benchmark` (``Benchmark("bench_x", __doc__, repeats=5,
   json="bench_x.json")``), adds its own options to ``bench.parser`` and calls
   :meth:`Benchmark.parse`. The common options are ``--json OUT`` (``''``: no
   file), ``--repeats N``, ``--quick`` and ``--plot OUT``, each present when the
   benchmark gives it a default;
2. times its cases with :func:`interleaved`: repetition k of every case runs
   before repetition k+1 of any (A, B, A, B, ...), so a noisy neighbour on a
   shared machine slows every case alike, and :func:`paired_ratio` compares two
   cases repetition by repetition (the median of ``a_k / b_k``). In a process
   group, ``before`` is a barrier and ``combine`` takes the slowest rank's time
   of each repetition;
3. prints rows with :func:`treecoll.topo.fmt.table` (the one formatter) and
   writes JSON with :meth:`Benchmark.write_json`, which records the command,
   the machine (CPU model, cores, memory), the date and the git commit;
   :meth:`Benchmark.plot` draws a figure when matplotlib is installed.

>>> order = []
>>> times = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3, warmup=0)
>>> "".join(order), sorted(times), [len(t) for t in times.values()]
('ababab', ['a', 'b'], [3, 3])
>>> paired_ratio([2.0, 4.0, 9.0], [1.0, 4.0, 3.0]), summary([3.0, 1.0, 2.0])
(2.0, {'median': 2.0, 'min': 1.0, 'reps': 3})
>>> bench = Benchmark("bench_example", "Example benchmark.\\n\\nMore text.", repeats=5, json="x.json")
>>> args = bench.parse(["--repeats", "3", "--json", ""])
>>> args.repeats, args.json, bench.command
(3, '', "python -m treecoll.tools.bench_example --repeats 3 --json ''")
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from treecoll.tools import units

__all__ = ["Benchmark", "interleaved", "slowest_rank", "paired_ratio", "summary", "machine_info", "git_commit"]


def interleaved(
    cases: Mapping[str, Callable[..., Any]],
    repeats: int | Mapping[str, int],
    *,
    warmup: int = 1,
    setup: Mapping[str, Callable[[], Any]] | None = None,
    before: Callable[[str], Any] | None = None,
    after: Callable[[str], Any] | None = None,
    combine: Callable[[list[list[float]]], list[list[float]]] | None = None,
) -> dict[str, list[float]]:
    """Wall times (seconds) of every case, repetitions interleaved: case order within a
    round, then the next round.

    ``repeats``: repetitions of every case, or per case (a case with fewer stops
    early); ``warmup``: untimed calls of each case first; ``setup[name]()``: untimed,
    before each call, its result passed to the case (a fresh object each time);
    ``before(name)`` / ``after(name)``: untimed hooks around each timed call (a
    barrier, a counter); ``combine``: maps the ``[case][repetition]`` times once at
    the end (the maximum over ranks in a process group). Returns ``{name: [t_0, ...]}``.
    """
    names = list(cases)
    counts = {n: repeats[n] if isinstance(repeats, Mapping) else repeats for n in names}
    setup = setup or {}

    def call(name: str, timed: bool) -> float:
        arg = setup[name]() if name in setup else None
        if before is not None:
            before(name)
        t0 = time.perf_counter()
        cases[name]() if name not in setup else cases[name](arg)
        dt = time.perf_counter() - t0
        if after is not None:
            after(name)
        return dt if timed else 0.0

    for _ in range(warmup):
        for name in names:
            call(name, False)
    times: dict[str, list[float]] = {n: [] for n in names}
    for k in range(max(counts.values(), default=0)):
        for name in names:
            if k < counts[name]:
                times[name].append(call(name, True))
    if combine is not None:
        times = dict(zip(names, combine([times[n] for n in names])))
    return times


def slowest_rank(times: list[list[float]]) -> list[list[float]]:
    """``combine`` for :func:`interleaved` in a process group: every repetition's time becomes
    the slowest rank's (one all-reduce of the whole table; every rank must call it)."""
    import torch
    import torch.distributed as dist

    table = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(table, op=dist.ReduceOp.MAX)
    return table.tolist()


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """Median over repetitions of ``a[k] / b[k]``: two cases measured side by side, the drift
    of the machine's load between repetitions cancelled (< 1: ``a`` is faster)."""
    if len(a) != len(b) or not a:
        raise units.UsageError(f"paired_ratio: expected two equally long, non-empty series, got {len(a)} and {len(b)}")
    return statistics.median(x / y for x, y in zip(a, b))


def summary(times: Sequence[float]) -> dict[str, float]:
    """``median``, ``min`` (seconds) and ``reps`` of one case's times."""
    return {"median": statistics.median(times), "min": min(times), "reps": len(times)}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def machine_info() -> dict[str, Any]:
    """What ran the benchmark: CPU model, cores (all and usable by this process), memory (bytes),
    OS, Python and torch versions, the 1-minute load average."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or platform.machine(),
    )
    mem = next(
        (int(line.split()[1]) * 1024 for line in _read("/proc/meminfo").splitlines() if line.startswith("MemTotal:")),
        None,
    )
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch = sys.modules.get("torch")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_bytes": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": getattr(torch, "__version__", None),
        "loadavg_1min": os.getloadavg()[0],
    }


def git_commit(where: Path | None = None) -> str | None:
    """The commit the code ran from (``+dirty`` with uncommitted changes), None outside a git checkout."""
    where = where or Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


class Benchmark:
    """Options, JSON and plot of one benchmark (see the module docstring).

    ``name``: the module's name under ``treecoll.tools`` (``bench_collectives``);
    ``doc``: its docstring (the first paragraph is the ``--help`` description);
    ``repeats`` / ``json`` / ``plot``: defaults of ``--repeats`` / ``--json`` /
    ``--plot`` (None: the benchmark takes no such option); ``quick``: the help of
    ``--quick`` (None: no such option); ``aliases``: older spellings of a common
    option (``{"--repeats": ["--reps"]}``), accepted alike; ``helps``: a help text
    of a common option that says more than the generic one.
    """

    def __init__(
        self,
        name: str,
        doc: str,
        *,
        repeats: int | None = None,
        json: str | None = None,
        plot: str | None = None,
        quick: str | None = None,
        aliases: Mapping[str, Sequence[str]] = (),
        helps: Mapping[str, str] = (),
    ):
        self.name = name
        self.argv: list[str] = []
        self.parser = argparse.ArgumentParser(
            prog=f"python -m treecoll.tools.{name}", description=(doc or "").strip().split("\n\n")[0]
        )
        aliases, helps = dict(aliases), dict(helps)
        if json is not None:
            self.parser.add_argument(
                "--json",
                *aliases.get("--json", ()),
                dest="json",
                default=json,
                metavar="OUT",
                help=f"write the results as JSON to OUT, '' for none (default {json})",
            )
        if repeats is not None:
            self.parser.add_argument(
                "--repeats",
                *aliases.get("--repeats", ()),
                dest="repeats",
                default=repeats,
                type=units.int_arg("--repeats"),
                metavar="N",
                help=helps.get("--repeats", "timed repetitions of every case") + f" (default {repeats})",
            )
        if quick is not None:
            self.parser.add_argument("--quick", action="store_true", help=quick)
        if plot is not None:
            self.parser.add_argument(
                "--plot",
                *aliases.get("--plot", ()),
                dest="plot",
                default=plot,
                metavar="OUT",
                help=f"write a plot to OUT (needs matplotlib), '' for none (default {plot})",
            )

    @property
    def command(self) -> str:
        """The command line that reproduces this run."""
        return shlex.join(["python", "-m", f"treecoll.tools.{self.name}", *self.argv])

    def parse(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        """Parse ``argv`` (default ``sys.argv[1:]``) and remember it for :attr:`command`."""
        self.argv = list(sys.argv[1:] if argv is None else argv)
        return self.parser.parse_args(self.argv)

    def meta(self) -> dict[str, Any]:
        """The record of this run: benchmark, command, UTC date, git commit, machine."""
        return {
            "benchmark": self.name,
            "command": self.command,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "machine": machine_info(),
        }

    def write_json(self, data: Mapping[str, Any], path: str | os.PathLike | None) -> Path | None:
        """Write ``{"meta": ..., **data}`` to ``path`` (its folder created; None or ``''``: nothing)
        and say so on stdout. Returns the path written."""
        if not path:
            return None
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": self.meta(), **data}, indent=1, default=str) + "\n")
        print(f"wrote {out}")
        return out

    def plot(
        self, path: str | os.PathLike | None, draw: Callable[[Any], Any], *, size: tuple[float, float] = (7.0, 5.0)
    ) -> str | None:
        """Draw with ``draw(ax)`` on one matplotlib axes and save to ``path``; returns None
        when written, else why not (no path, matplotlib not installed)."""
        if not path:
            return "no --plot"
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return "matplotlib not installed (pip install 'treecoll[plot]')"
        fig, ax = plt.subplots(figsize=size)
        draw(ax)
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"wrote {path}")
        return None
