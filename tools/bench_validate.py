"""The simulator's error on real nccl-tests tables: default parameters per set, and leave-one-out calibration.

    python -m treecoll.tools.bench_validate [--quick] [--max-gpus N] [--machine TEXT]... [--all-rows] [--json OUT] [DIR]

Reads every table of DIR (default tests/fixtures/nccl-tests, its ``heldout/``
folder included) with ``treecoll simulate validate`` (:mod:`treecoll.tools.validation`),
its ``tables.yaml`` giving per table the machine flags, the health and the set.

1. **Default parameters**: per table the geometric-mean busbw error of large
   (>= 64 MiB) and small (<= 64 KiB) messages, and the totals of the ``fit``
   tables (used to choose constants of the simulator) and the ``heldout``
   tables (never used) apart. Degraded tables (the source says so, or busbw
   below a quarter of the ideal ring) are listed and left out of the totals.
2. **Leave-one-out calibration per machine**: tables are grouped by machine
   (template and NICs, any number of hosts); for every group of two tables or
   more, ``calibrate`` on one table (not on a degraded one: its source says so
   or the validator flags it),
   then the error on the other tables of the group with the fitted calibration
   (degraded ones included: the calibration is that machine's own), beside
   their error with the defaults (before). Each row names the factors the fit
   moved (the others stay at the defaults). The totals pool those rows,
   degraded tables left out: over all, and over the other tables of the
   ``fit`` and of the ``heldout`` set apart.

Only the rows that count in the errors are simulated (<= 64 KiB and >= 64 MiB)
unless ``--all-rows``. ``--quick``: tables on at most 4 GPUs. ``--machine TEXT``
(repeatable): only the tables whose machine (template and NICs, as the
leave-one-out groups them: :func:`machine_key`) contains one of the texts,
e.g. ``--machine tcpxo`` for the leave-one-out of the TCPXO machine alone. Prints the
tables and writes JSON (default bench_validate.json). The model is
deterministic: the numbers do not depend on the machine, only the run time does.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from treecoll.tools import calibration, validation
from treecoll.tools.bench.harness import Benchmark
from treecoll.tools.validate_sim import DEFAULT_DIR
from treecoll.topo.fmt import fmt_bytes, table

__all__ = ["main", "machine_key", "machine_files", "leave_one_out"]

QUICK_GPUS = 4


def machine_key(description: str) -> str:
    """A machine without its host count: ``"2 x h100-sxm (8 GPUs each), NICs 8x400G-ib"`` ->
    ``"h100-sxm, NICs 8x400G-ib"``.

    >>> machine_key("2 x h100-sxm (8 GPUs each), NICs 8x400G-ib")
    'h100-sxm, NICs 8x400G-ib'
    """
    return re.sub(r"^\d+ x (\S+) \(\d+ GPUs? each\)", r"\1", description)


def machine_files(files: list[Path], texts: list[str], max_gpus: int | None) -> list[Path]:
    """The ``files`` with a table whose machine (:func:`machine_key` of its description) contains one of
    ``texts`` (case-insensitive); a table whose machine is not known or has more than ``max_gpus`` GPUs
    matches none. Builds the machines, simulates nothing."""
    cs, _ = validation.cases(files)
    keep = set()
    for c in cs:
        try:
            key = machine_key(validation.topology_for(c, None, max_gpus)[1]).lower()
        except validation.Skip:
            continue
        if any(t.lower() in key for t in texts):
            keep.add(c.path)
    return [f for f in files if f in keep]


def _pct(x: float | None) -> str | None:
    return None if x is None else f"{100 * x:.1f}%"


def leave_one_out(
    entries: list[dict], root: Path, max_gpus: int | None, keep: Callable[..., bool] | None
) -> list[dict]:
    """Per machine with two predicted tables or more: calibrate on each, validate the others (their
    default entries, from ``entries``, are the ``before``)."""
    groups: dict[str, list[dict]] = {}
    for e in entries:
        if e["status"] == "ok" and e["rows"]:
            groups.setdefault(machine_key(e["machine"]), []).append(e)
    out = []
    for key, group in sorted(groups.items()):
        if len(group) < 2:
            continue
        for fit in group:
            if fit.get("health") == "degraded" or fit["degraded"]:  # a slowed-down run (source or rule): not fitted
                continue
            t0 = time.perf_counter()
            cal = calibration.calibrate([root / fit["file"]], None, max_gpus, name="loo", check=False)
            others = [e for e in group if e is not fit]
            tests = [
                validation.validate([root / e["file"]], cal["profile"], None, max_gpus, keep=keep)["files"][0]
                for e in others
            ]
            for t, e in zip(tests, others):
                t["file"] = e["file"]
            # per calibration every other table counts, degraded or not (the fit is that machine's own);
            # the total over all calibrations leaves degraded tables out, as everywhere
            out.append(
                {
                    "machine": key,
                    "fit": fit["file"],
                    "values": cal["values"],
                    "fitted": cal["fit"]["fitted"],
                    "not_identified": cal["fit"]["not_identified"],
                    "left_out": cal["left_out"],
                    "tests": tests,
                    "defaults": others,
                    "degraded_tests": sum(t["degraded"] for t in tests),
                    "geomean": validation.totals(tests, degraded_too=True),
                    "before": validation.totals(others, degraded_too=True),
                    "wall_s": time.perf_counter() - t0,
                }
            )
            g, b = out[-1]["geomean"], out[-1]["before"]
            print(
                f"  calibrated on {fit['file']} ({', '.join(cal['fit']['fitted']) or 'nothing fitted'}): others "
                f"large {_pct(b['large'])} -> {_pct(g['large'])}, small {_pct(b['small'])} -> {_pct(g['small'])} "
                f"({out[-1]['wall_s']:.0f} s)",
                file=sys.stderr,
            )
    return out


def _factors(r: dict) -> str:
    """The factors a calibration moved, with their values: ``link_scale.nvlink 0.93, lat_scale.ring 1.4``."""
    return ", ".join(f"{k} {_value(k, r['values'][k])}" for k in r["fitted"]) or "none"


def _value(parameter: str, v: float) -> str:
    """A factor with two decimals, an added latency in µs, a protocol switch point as a size (``4 KiB``)."""
    if parameter.startswith("proto_max."):
        return fmt_bytes(int(v))
    return f"{v:.1f} us" if parameter.startswith("hop_lat_us.") else f"{v:.2f}"


def loo_totals(loo: list[dict]) -> dict[str, dict]:
    """Leave-one-out totals, before (defaults) and after (calibrated), over every other table and over
    those of the ``fit`` and ``heldout`` sets apart; degraded tables left out."""
    out = {}
    for name, sets in (("all", None), ("fit", ("fit",)), ("heldout", ("heldout",))):
        after = [t for r in loo for t in r["tests"] if sets is None or t.get("set") in sets]
        before = [t for r in loo for t in r["defaults"] if sets is None or t.get("set") in sets]
        out[name] = {
            "after": validation.totals(after),
            "before": validation.totals(before),
            "tests": len(after),
            "degraded": sum(t["degraded"] for t in after),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    bench = Benchmark(
        "bench_validate", __doc__, json="bench_validate.json", quick=f"tables on at most {QUICK_GPUS} GPUs"
    )
    bench.parser.add_argument("dir", nargs="?", default=str(DEFAULT_DIR), help="folder of nccl-tests tables")
    bench.parser.add_argument(
        "--max-gpus",
        type=int,
        default=validation.MAX_GPUS,
        metavar="N",
        help=f"skip tables on more than N GPUs (default {validation.MAX_GPUS})",
    )
    bench.parser.add_argument(
        "--machine",
        action="append",
        metavar="TEXT",
        help="only tables whose machine (template and NICs) contains TEXT (repeatable: any of them)",
    )
    bench.parser.add_argument("--all-rows", action="store_true", help="simulate every row, not only counted ones")
    args = bench.parse(argv)
    root = Path(args.dir)
    max_gpus = QUICK_GPUS if args.quick else (args.max_gpus or None)
    keep = None if args.all_rows else validation.counted
    files = sorted(root.rglob("*.txt"))
    if args.machine:
        files = machine_files(files, args.machine, max_gpus)
    t0 = time.perf_counter()
    d = validation.validate(
        files, None, None, max_gpus, keep=keep, progress=lambda i, n, w: print(f"  [{i + 1}/{n}] {w}", file=sys.stderr)
    )
    entries = d["files"]
    for e in entries:
        e["file"] = Path(e["file"]).as_posix()
    rows = []
    for e in entries:
        if e["status"] != "ok":
            continue
        rows.append(
            [
                e["file"],
                e.get("set") or "-",
                "degraded" if e["degraded"] else e.get("health", "-"),
                e["collective"],
                e["machine"],
                _pct(e["geomean_large"]),
                _pct(e["geomean_small"]),
                _pct(e.get("nccl_model_large")),
                _pct(e.get("nccl_model_small")),
            ]
        )
    print(
        table(
            rows,
            [
                "table",
                "set",
                "health",
                "collective",
                "machine",
                "large",
                "small",
                "NCCL model large",
                "NCCL model small",
            ],
        )
    )
    skipped = [e for e in entries if e["status"] != "ok"]
    big = [e for e in skipped if "more than --max-gpus" in e["reason"]]
    print(f"\n{len(skipped)} skipped, {len(big)} of them on more than {max_gpus} GPUs (--max-gpus):")
    for e in skipped:
        if e not in big:
            print(f"  {e['file']}: {e['reason']}")
    sets = {s: validation.totals([e for e in entries if e.get("set") == s]) for s in ("fit", "heldout")}
    sets["all"] = d["geomean"]
    deg = [e["file"] for e in entries if e["degraded"]]
    print("\ndefault parameters (degraded tables left out: " + (", ".join(deg) or "none") + ")")
    print(
        table(
            [
                [
                    s,
                    g["tables"],
                    _pct(g["large"]),
                    _pct(g["small"]),
                    _pct(g["nccl_model_large"]),
                    _pct(g["nccl_model_small"]),
                ]
                for s, g in sets.items()
            ],
            ["tables", "predicted", "large (target 15%)", "small (target 30%)", "NCCL model large", "NCCL model small"],
        )
    )
    print("\nleave-one-out calibration per machine", file=sys.stderr)
    loo = leave_one_out(entries, root, max_gpus, keep)
    loo_total = loo_totals(loo)
    print(
        "\nleave-one-out: calibrate on one table of a machine, error on its other tables (target 10%), "
        "before (defaults) -> after (calibrated)"
    )

    def arrow(b: dict, a: dict, k: str) -> str:
        return f"{_pct(b[k]) or '-'} -> {_pct(a[k]) or '-'}"

    print(
        table(
            [
                [
                    r["machine"],
                    r["fit"],
                    _factors(r),
                    len(r["tests"]),
                    r["degraded_tests"],
                    arrow(r["before"], r["geomean"], "large"),
                    arrow(r["before"], r["geomean"], "small"),
                ]
                for r in loo
            ]
            + [
                [
                    f"{name} (degraded left out)",
                    "-",
                    "-",
                    tot["tests"],
                    tot["degraded"],
                    arrow(tot["before"], tot["after"], "large"),
                    arrow(tot["before"], tot["after"], "small"),
                ]
                for name, tot in loo_total.items()
            ],
            ["machine", "calibrated on", "fitted factors", "other tables", "degraded", "large", "small"],
        )
    )
    wall = time.perf_counter() - t0
    print(f"\n{wall:.0f} s")
    data: dict[str, Any] = {
        "quick": bool(args.quick),
        "max_gpus": max_gpus,
        "all_rows": bool(args.all_rows),
        "default": {"files": entries, "sets": sets},
        "leave_one_out": loo,
        "leave_one_out_total": loo_total,
        "wall_s": wall,
    }
    bench.write_json(data, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
