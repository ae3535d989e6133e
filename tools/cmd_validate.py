"""``treecoll simulate validate`` and ``treecoll simulate calibrate``: the command line of
:mod:`treecoll.tools.validation` and :mod:`treecoll.tools.calibration`.

    treecoll simulate validate FILE... [machine flags] [--collective C] [--profile P] [--max-gpus N] [--json]
    treecoll simulate calibrate FILE... [machine flags] -o profile.yaml [--force] [--no-check] [--json]

A file that cannot be read is one line on stderr and exit code 1:

>>> from treecoll.tools.cli import main
>>> main(["simulate", "validate", "/nonexistent/run.txt"])   # stderr: ... cannot read nccl-tests output: no such file
1
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from treecoll.collectives.sim.nccltests import COLLECTIVES
from treecoll.collectives.sim.profiles import PROFILES, get_profile, save_profile
from treecoll.tools import units
from treecoll.tools.calibration import calibrate, render_calibration
from treecoll.tools.cli import emit, output_path
from treecoll.tools.machine_flags import add_machine_flags, machine_flags
from treecoll.tools.validation import MAX_GPUS, render, validate
from treecoll.topo.files import check_file

__all__ = ["add_parsers", "run"]


def add_parsers(sub: argparse._SubParsersAction, common_options: Callable) -> None:
    """Add ``validate`` and ``calibrate`` to ``treecoll simulate``'s subparsers."""

    def one(name: str, help_: str, description: str):
        q = sub.add_parser(name, help=help_, description=description)
        common_options(q)
        q.add_argument("files", nargs="+", metavar="FILE", help="nccl-tests outputs (as printed or pasted)")
        add_machine_flags(q)
        q.add_argument(
            "--collective",
            default=None,
            choices=COLLECTIVES,
            metavar="C",
            help=f"the collective, where a table does not say it: {', '.join(COLLECTIVES)}",
        )
        q.add_argument(
            "--max-gpus",
            type=units.int_arg("--max-gpus", minimum=0),
            default=MAX_GPUS,
            metavar="N",
            help=f"skip tables on more than N GPUs (default {MAX_GPUS}; 0: no limit)",
        )
        return q

    v = one(
        "validate",
        "predicted against measured busbw of nccl-tests tables",
        "Predict every row of nccl-tests tables and print measured and predicted busbw and the geometric-mean "
        "error for large (>= 64 MiB) and small (<= 64 KiB) messages; degraded runs are marked and left out "
        "of the total. Exit status 1 when no table could be predicted (every file skipped).",
    )
    v.add_argument(
        "--profile",
        default=None,
        metavar="P",
        help=f"simulator profile: a calibration YAML file (from calibrate), a profile YAML file or "
        f"{', '.join(sorted(PROFILES))} (default: the fastest NCCL protocol per size)",
    )
    c = one(
        "calibrate",
        "fit a simulator profile to your nccl-tests tables",
        "Fit the simulator's correction parameters (link bandwidth per link class, hop latency per route "
        "class, the network transport's latency, LL's and LL128's bandwidth and switch points, latency per "
        "algorithm family) that nccl-tests tables identify, the others kept at their defaults; use the "
        "profile with --profile.",
    )
    c.add_argument("-o", "--output", required=True, metavar="OUT.yaml", help="the profile file to write")
    c.add_argument("--force", action="store_true", help="replace OUT.yaml if it exists (default: refuse)")
    c.add_argument("--name", default=None, help="the profile's name (default: the file's stem)")
    c.add_argument(
        "--no-check",
        action="store_true",
        help="skip validating the tables before and after the fit (it simulates every row the errors count "
        "twice: minutes for a table on 16 GPUs)",
    )


def _progress(i: int, n: int, what: str) -> None:
    if n > 1 and sys.stderr.isatty():
        sys.stderr.write(f"\r{i}/{n} {what[:60]:<60}" if i < n else "\r" + " " * 70 + "\r")
        sys.stderr.flush()


def _output(path: str, force: bool, inputs: Sequence[str]) -> str:
    if Path(path).exists() and not force:
        raise units.UsageError(f"-o {path}: the file exists; pass --force to replace it, or name another file")
    return output_path(path, "-o", inputs=list(inputs), suffixes=(".yaml", ".yml"))


def run(args: argparse.Namespace) -> int:
    """``treecoll simulate validate|calibrate``."""
    flags = machine_flags(args)
    max_gpus = args.max_gpus or None
    for f in args.files:
        check_file(f, "nccl-tests output", error=units.UsageError)
    if args.sim_command == "validate":
        prof = get_profile(args.profile) if args.profile not in (None, "auto") else None
        d = validate(args.files, prof, flags, max_gpus, args.collective, progress=_progress)
        _progress(1, 1, "")
        emit(args, d, render)
        return 0 if any(e["status"] == "ok" for e in d["files"]) else 1
    out = _output(args.output, args.force, args.files)
    d = calibrate(args.files, flags, max_gpus, args.collective, args.name or Path(out).stem, check=not args.no_check)
    fit = {"files": [str(f) for f in args.files], **d["fit"]}
    for key in ("before", "after"):
        if key in d:
            fit[f"geomean_{key}"] = {k: d[key][k] for k in ("large", "small")}
    save_profile(d["profile"], out, fit=fit)
    d["saved"] = out
    if getattr(args, "json", False):  # the profile as plain data, through the one JSON printer
        return emit(args, {**d, "profile": d["profile"].as_dict()})
    return emit(args, d, render_calibration)
