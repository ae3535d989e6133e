"""Validate the simulator against real nccl-tests tables.

    python -m treecoll.tools.validate_sim [FILES or DIRS ...] [--json] [--profile P] [machine flags]
        [--max-gpus N] [--calibrate NAME --fit F1,F2 [--out DIR]]

Reads nccl-tests outputs (default: every ``*.txt`` under tests/fixtures/nccl-tests/
of the repository, its ``heldout/`` folder included) with
:mod:`treecoll.collectives.sim.nccltests`, one entry per table. The machine
of each table comes from what the file prints (device lines), the machine
flags of the ``tables.yaml`` index beside the files (the flags a user of that
table would pass: :mod:`treecoll.tools.machine_flags`) and the machine flags
given here, which win over both; :mod:`treecoll.topo.machines` builds it from
the shipped machine templates. The index also says whether a table was used
to choose constants of the simulator (``set: fit``) or not (``heldout``), and
the health its source states: degraded tables are simulated and listed, but
left out of the averages.

Prediction: what NCCL would run, as the simulator sees it
(:func:`treecoll.collectives.sim.simulator.simulate_nccl`): for allreduce the fastest of
the ring (:func:`treecoll.collectives.sim.simulate_ring`) and an NCCL-like tree
(a chain inside each host under a binomial tree over hosts, one per NIC rail
for large messages: ``two_level`` with ``intra="chain"``, run as NCCL's split
tree kernels run it), each over NCCL's protocol profiles
(:mod:`treecoll.collectives.sim.profiles`; LL128 only where NCCL enables it), and on
NVSwitch systems of compute capability 9.0 and later NCCL's NVLS / NVLSTree
(:mod:`treecoll.collectives.sim.nvls`); all_gather, reduce_scatter, broadcast and reduce
by the ring, alltoall and sendrecv as every transfer at once.
``NCCL_ALGO`` / ``NCCL_PROTO`` in a file's ``# env:`` line restrict the choice as they
restrict NCCL. Nothing is fitted to the tables unless ``--profile`` names a
calibrated profile.

Error per size: ``|pred − meas| / meas`` of busbw (measured busbw recomputed
from the time column, as nccl-tests does, since small sizes print 0.00).
Summary: geometric-mean error ``exp(mean |ln(pred/meas)|) − 1`` over large
(≥ 64 MiB) and small (≤ 64 KiB) sizes, for all healthy tables and for the
``fit`` and ``heldout`` sets apart. A table that cannot be predicted is listed
as skipped with the reason (and the flag that would fix it).

``--calibrate NAME --fit FILES``: fits one bandwidth efficiency per link kind
class (``net``, ``nvlink``, ``pcie``) and the per-step latency floors on the
``--fit`` tables (coordinate search on the geometric-mean error), reports
the error on the other tables and saves the profile as ``NAME.yaml``
(``--out DIR``, default the current directory).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from treecoll.collectives.sim import nccltests
from treecoll.tools.machine_flags import add_machine_flags, machine_flags, parse_machine_flags
from treecoll.topo.errors import TreecollError
from treecoll.topo.machines import MachineFlags, machine_topology

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO / "tests" / "fixtures" / "nccl-tests"
INDEX_NAME = "tables.yaml"
LARGE, SMALL = 64 << 20, 64 << 10
#: collectives the simulator predicts today
PREDICTED = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv")
#: tables on more GPUs are skipped unless --max-gpus says otherwise (the flow simulation takes minutes there)
MAX_GPUS = 64


class Skip(Exception):
    """A table that cannot be predicted; the message is the reason."""


@dataclass(frozen=True)
class Case:
    """One table to validate: the table, its file, what the index says about it, and its machine."""

    path: Path
    name: str                   # the file as listed (relative to the index folder when it has one)
    table: nccltests.Table
    header: nccltests.Header
    entry: dict = field(default_factory=dict)   # the index entry (set, health, flags, assumed, why)

    @property
    def env(self) -> str:
        return self.header.env or ""

    @property
    def collective(self) -> str | None:
        return self.table.collective


# ---------------------------------------------------------------------------------------------- index
def find_index(path: Path) -> tuple[Path, dict] | None:
    """``(folder, entries)`` of the nearest ``tables.yaml`` in ``path``'s folder or its two parents."""
    for d in list(path.resolve().parents)[:3]:
        f = d / INDEX_NAME
        if f.is_file():
            data = yaml.safe_load(f.read_text(encoding="utf-8")) or {}
            if not isinstance(data, dict):
                raise SystemExit(f"validate_sim: {f}: expected a mapping of file -> entry")
            return d, data
    return None


def cases(paths: list[Path]) -> tuple[list[Case], list[dict]]:
    """The tables of ``paths``, and entries for the files that could not be read (status skipped)."""
    out, bad, indexes = [], [], {}
    for p in paths:
        idx = indexes.setdefault(p.resolve().parent, find_index(p))
        name, entry = p.name, {}
        if idx is not None:
            folder, entries = idx
            rel = p.resolve().relative_to(folder).as_posix()
            name, entry = rel, entries.get(rel) or {}
        try:
            parsed = nccltests.read(p)
        except nccltests.NcclTestsError as e:
            bad.append({"file": name, "status": "skipped", "reason": str(e), **_labels(entry)})
            continue
        for t in parsed.tables:
            out.append(Case(p, name, t, parsed.header, entry))
    return out, bad


def _labels(entry: dict) -> dict:
    return {"set": entry.get("set", "unlisted"), "health": entry.get("health", "unstated")}


# ---------------------------------------------------------------------------------------------- machine
def merged_flags(case: Case, flags: MachineFlags) -> MachineFlags:
    """The index's flags for this table, the command line's winning field by field."""
    flags = flags or MachineFlags()
    base = parse_machine_flags(case.entry.get("flags") or "")
    if flags.topology is not None:
        return MachineFlags(topology=flags.topology)
    if base.topology is not None and not flags.counts_given():
        return base
    return MachineFlags(hosts=flags.hosts or base.hosts, gpus_per_host=flags.gpus_per_host or base.gpus_per_host,
                        gpu=flags.gpu or base.gpu, nic=flags.nic or base.nic)


def topology_for(case: Case, flags: MachineFlags | None = None, max_gpus: int | None = MAX_GPUS):
    """``(topology, description, notes)`` of the machine a table ran on; raises :class:`Skip` with the reason."""
    t = case.table
    if t.collective is None:
        why = f"candidates {', '.join(t.candidates)}" if t.candidates else "no collective fits"
        raise Skip(f"the collective is not recognised ({why}; {'; '.join(t.warnings) or 'see evidence'})")
    if t.collective not in PREDICTED:
        raise Skip(f"{t.collective}: the simulator does not predict it yet (it predicts {', '.join(PREDICTED)})")
    try:
        topo, machine = machine_topology(merged_flags(case, flags), t.machine_facts())
    except TreecollError as e:
        raise Skip(f"machine: {e}") from None
    ngpu = len(topo.rank_gpus())
    if t.nranks is not None and t.nranks != ngpu:
        raise Skip(f"the table ran on {t.nranks} ranks ({t.nranks_from}), the machine has {ngpu} GPUs "
                   f"({machine.describe() if machine else topo.name}); "
                   f"{'; '.join(t.warnings) or 'pass the machine flags of the run'}")
    if max_gpus is not None and ngpu > max_gpus:
        raise Skip(f"{ngpu} GPUs: more than --max-gpus {max_gpus} (the flow simulation takes minutes at this "
                   f"scale; pass --max-gpus {ngpu} to run it)")
    desc = machine.describe() if machine else f"topology {topo.name}"
    notes = [n for n in (machine.notes if machine else ()) if not n.startswith("NICs: the template")]
    return topo, desc, notes


# ---------------------------------------------------------------------------------------------- prediction
def algorithms(case: Case, topology=None) -> tuple[list, str]:
    """(algorithm names, profile) NCCL would choose among, as allowed by the file's NCCL_ALGO / NCCL_PROTO:
    :func:`treecoll.collectives.sim.nccl_model.nccl_algos` for the table's collective."""
    algo = re.search(r"NCCL_ALGO=(\w+)", case.env)
    proto = re.search(r"NCCL_PROTO=(\w+)", case.env)
    proto_name = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}.get(proto.group(1).lower()) if proto else None
    algos = ["ring", "tree"] if case.collective == "allreduce" else ["ring"]
    if topology is not None and len(topology.rank_gpus()) > 1:
        from treecoll.collectives.sim.nccl_model import nccl_algos
        algos = list(nccl_algos(topology, topology.rank_gpus(), proto_name, case.collective))
    if algo:
        a = {"nvlstree": "nvls"}.get(algo.group(1).lower(), algo.group(1).lower())
        algos = [x for x in algos if x == a] or algos
    prof = {"LL": "nccl-ll", "LL128": "nccl-ll128", "Simple": "nccl-simple"}.get(proto_name, "auto")
    return algos, prof


def predict(topology, case: Case, size: int, profile) -> tuple[float, str]:
    """Predicted time (s) and label for one size."""
    from treecoll.collectives.sim.simulator import simulate_nccl
    if len(topology.rank_gpus()) == 1:
        return 0.0, "-"
    algos, prof = algorithms(case, topology)
    if profile is not None:
        prof = profile
    a, r = simulate_nccl(topology, size, collective=case.collective, profile=prof, algos=algos)
    return r.time, f"{r.algorithm if a == 'nvls' else a}/{r.profile}"


def nccl_model_time(topology, case: Case, size: int) -> float | None:
    """NCCL's own analytical prediction (collectives.sim.nccl_model), seconds."""
    if len(topology.rank_gpus()) < 2:
        return None
    from treecoll.collectives.sim.nccl_model import nccl_predict
    algos, _ = algorithms(case, topology)
    return min(nccl_predict(topology, None, size, algo=a, collective=case.collective)["time"] for a in algos)


def geo_error(pairs) -> float | None:
    """exp(mean |ln(pred/meas)|) − 1 over (pred, meas) pairs, or None."""
    logs = [abs(math.log(p / m)) for p, m in pairs if p > 0 and m > 0]
    return math.exp(sum(logs) / len(logs)) - 1 if logs else None


def _errors(rows: list[dict], key: str = "pred_busbw") -> tuple[float | None, float | None]:
    pairs = [(r[key], r["meas_busbw"], r["size"]) for r in rows if r.get(key)]
    return (geo_error([(p, m) for p, m, s in pairs if s >= LARGE]),
            geo_error([(p, m) for p, m, s in pairs if s <= SMALL]))


def _entry(case: Case, multi: bool) -> dict:
    t = case.table
    return {"file": case.name + (f"#{t.index + 1}" if multi else ""), "line": t.line, "collective": t.collective,
            "nranks": t.nranks, "gpu": ", ".join(t.gpu_names()) or "-", "hosts": len(t.hosts()) or None,
            "warnings": list(t.warnings), **_labels(case.entry)}


def validate_case(case: Case, profile=None, flags: MachineFlags | None = None, max_gpus: int | None = MAX_GPUS,
                  multi: bool = False) -> dict:
    """One table's entry: status ``ok`` with rows and errors, or ``skipped`` with the reason."""
    from treecoll.collectives.sim.nccltests import bus_factor
    entry = _entry(case, multi)
    try:
        topo, desc, notes = topology_for(case, flags, max_gpus)
    except Skip as e:
        return {**entry, "status": "skipped", "reason": str(e)}
    n = len(topo.rank_gpus())
    entry.update(status="ok", reason="", machine=desc, notes=notes, nranks=n)
    f = bus_factor(case.collective, n)
    rows = []
    for r in case.table.rows:
        m = r.out_of_place
        if r.size <= 0 or m.time_us <= 0:
            continue
        pred, label = predict(topo, case, r.size, profile)
        meas_bus = r.size / (m.time_us * 1e-6) / 1e9 * f
        pred_bus = r.size / pred / 1e9 * f if pred > 0 else 0.0
        nm = nccl_model_time(topo, case, r.size) if profile is None else None
        rows.append({"size": r.size, "meas_us": m.time_us, "meas_busbw": meas_bus, "pred_us": pred * 1e6,
                     "pred_busbw": pred_bus, "algo": label, "nccl_model_busbw": r.size / nm / 1e9 * f if nm else None,
                     "err": (pred_bus - meas_bus) / meas_bus if meas_bus > 0 else None})
    entry["rows"] = rows
    entry["large_err"], entry["small_err"] = _errors(rows)
    entry["nccl_model_large_err"], entry["nccl_model_small_err"] = _errors(rows, "nccl_model_busbw")
    return entry


def _summary(entries: list[dict]) -> dict:
    rows = [r for e in entries for r in e.get("rows", [])]
    large, small = _errors(rows)
    nl, ns = _errors(rows, "nccl_model_busbw")
    return {"tables": len(entries), "large_err": large, "small_err": small, "nccl_model_large_err": nl,
            "nccl_model_small_err": ns}


def validate(paths, profile=None, flags: MachineFlags | None = None, max_gpus: int | None = MAX_GPUS) -> dict:
    """Run every table of ``paths``; plain dict (files, rows, summaries). Degraded tables are listed but
    left out of every summary; ``sets`` summarises the ``fit`` and ``heldout`` tables apart."""
    cs, bad = cases([Path(p) for p in paths])
    counts: dict[Path, int] = {}
    for c in cs:
        counts[c.path] = counts.get(c.path, 0) + 1
    out = {"files": [validate_case(c, profile, flags, max_gpus, counts[c.path] > 1) for c in cs] + bad,
           "profile": getattr(profile, "name", profile) or "NCCL protocols (auto)"}
    ok = [e for e in out["files"] if e["status"] == "ok"]
    healthy = [e for e in ok if e["health"] != "degraded"]
    out.update(_summary(healthy))
    out["sets"] = {s: _summary([e for e in healthy if e["set"] == s]) for s in ("fit", "heldout")}
    out["degraded"] = _summary([e for e in ok if e["health"] == "degraded"])
    return out


# ---------------------------------------------------------------------------------------------- text
def _pct(x) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def _line(label: str, s: dict) -> str:
    return (f"{label}: {s['tables']} tables, geomean error large {_pct(s['large_err'])}, small "
            f"{_pct(s['small_err'])}; NCCL's own model (allreduce): large {_pct(s['nccl_model_large_err'])}, small "
            f"{_pct(s['nccl_model_small_err'])}")


def render(d: dict) -> str:
    lines = [f"profile: {d['profile']}"]
    for e in d["files"]:
        lines.append("")
        tags = f"[{e['set']}, {e['health']}]"
        head = (f"== {e['file']} {tags}: {e.get('collective') or '?'}, {e.get('nranks') or '?'} GPUs, "
                f"{e.get('gpu', '-')}")
        if e["status"] != "ok":
            lines.append(head + f"\n   SKIPPED: {e['reason']}")
            continue
        lines.append(head + f"; machine {e['machine']}")
        lines.extend(f"   note: {n}" for n in e.get("notes", []) + e.get("warnings", []))
        lines.append(f"{'size':>12} {'meas us':>10} {'meas busbw':>10} {'pred us':>10} {'pred busbw':>10} "
                     f"{'error':>7}  {'algo':<18} {'nccl model':>10}")
        for r in e["rows"]:
            nm = "-" if r.get("nccl_model_busbw") is None else f"{r['nccl_model_busbw']:.2f}"
            lines.append(f"{r['size']:>12} {r['meas_us']:>10.1f} {r['meas_busbw']:>10.2f} {r['pred_us']:>10.1f} "
                         f"{r['pred_busbw']:>10.2f} {_pct(r['err']):>7}  {r['algo']:<18} {nm:>10}")
        lines.append(f"   geomean error: large (>= 64 MiB) {_pct(e['large_err'])}, small (<= 64 KiB) "
                     f"{_pct(e['small_err'])}; NCCL's model: large {_pct(e.get('nccl_model_large_err'))}, "
                     f"small {_pct(e.get('nccl_model_small_err'))}")
    skipped = [e for e in d["files"] if e["status"] != "ok"]
    lines += ["", f"{len(d['files']) - len(skipped)} tables predicted, {len(skipped)} skipped (targets: large 15%, "
                  f"small 30%)"]
    for s in ("fit", "heldout"):
        lines.append(_line(f"{s} tables", d["sets"][s]))
    lines.append(_line("degraded tables (left out above)", d["degraded"]))
    lines.append(_line("ALL tables but the degraded", d))
    return "\n".join(lines)


def collect(args_paths) -> list[Path]:
    paths = []
    for p in (args_paths or [DEFAULT_DIR]):
        p = Path(p)
        if p.is_dir():
            paths.extend(sorted(q for q in p.rglob("*.txt") if q.is_file()))
        elif p.exists():
            paths.append(p)
        else:
            raise SystemExit(f"validate_sim: {p}: no such file or directory")
    return paths


def calibrate(fit_paths, test_paths, name: str, flags: MachineFlags | None = None,
              max_gpus: int | None = MAX_GPUS):
    """Fit bw_eff (net, nvlink, pcie) and latency floors of one profile on ``fit_paths``;
    returns (profile, fit, test)."""
    from treecoll.collectives.sim.profiles import PROFILES, Profile
    base = PROFILES["nccl-simple"]
    params = {"eff_net": 1.0, "eff_nvlink": 1.0, "eff_pcie": 1.0, "base": base.base_lat_us,
              "lat_nvlink": base.lat_floor_us["nvlink"], "lat_pci": base.lat_floor_us["pci"],
              "lat_net": base.lat_floor_us["net"]}

    def make(pr):
        eff = {"net": pr["eff_net"], "nvlink": pr["eff_nvlink"], "c2c": pr["eff_nvlink"], "pcie": pr["eff_pcie"],
               "smp": pr["eff_pcie"]}
        return Profile(name, pr["base"], {"nvlink": pr["lat_nvlink"], "pci": pr["lat_pci"], "net": pr["lat_net"]},
                       eff, source="tools/validate_sim.py --calibrate on " + ", ".join(p.name for p in fit_paths),
                       nic_lat_mult=base.nic_lat_mult, tree_eff=base.tree_eff)

    def score(pr):
        d = validate(fit_paths, make(pr), flags, max_gpus)
        return (d["large_err"] or 0) + (d["small_err"] or 0)

    best = score(params)
    for _ in range(2):
        for k in params:
            for mult in (0.5, 0.7, 0.85, 1.15, 1.4, 2.0):
                trial = dict(params)
                trial[k] = min(trial[k] * mult, 1.0) if k.startswith("eff") else trial[k] * mult
                s = score(trial)
                if s < best - 1e-9:
                    best, params = s, trial
    prof = make(params)
    return prof, validate(fit_paths, prof, flags, max_gpus), validate(test_paths, prof, flags, max_gpus)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="validate_sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="nccl-tests output files or directories (searched recursively)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--profile", default=None, help="a profile name or YAML file (default: NCCL protocols, auto)")
    ap.add_argument("--max-gpus", type=int, default=MAX_GPUS, metavar="N",
                    help=f"skip tables on more than N GPUs (default {MAX_GPUS}; 0: no limit)")
    ap.add_argument("--calibrate", metavar="NAME", help="fit a profile NAME on --fit tables, test on the rest")
    ap.add_argument("--fit", default="", help="comma-separated file names used for fitting")
    ap.add_argument("--out", default=".", help="directory for the calibrated NAME.yaml")
    add_machine_flags(ap)
    try:
        args = ap.parse_args(argv)
        flags = machine_flags(args)
    except TreecollError as e:
        print(f"validate_sim: error: {e}", file=sys.stderr)
        return 1
    max_gpus = args.max_gpus or None
    paths = collect(args.paths)
    if args.calibrate:
        from treecoll.collectives.sim.profiles import save_profile
        fit_names = {s.strip() for s in args.fit.split(",") if s.strip()}
        fit = [p for p in paths if p.name in fit_names]
        test = [p for p in paths if p.name not in fit_names]
        if not fit:
            raise SystemExit("validate_sim: --calibrate needs --fit with at least one of the given files")
        prof, dfit, dtest = calibrate(fit, test, args.calibrate, flags, max_gpus)
        dest = Path(args.out) / f"{args.calibrate}.yaml"
        save_profile(prof, dest, fit={"fit_files": sorted(fit_names), "fit_large_err": dfit["large_err"],
                                      "fit_small_err": dfit["small_err"], "test_large_err": dtest["large_err"],
                                      "test_small_err": dtest["small_err"]})
        res = {"profile": prof.as_dict(), "saved": str(dest), "fit": dfit, "test": dtest}
        if args.json:
            print(json.dumps(res, indent=1, default=float))
        else:
            print(f"saved {dest}: {prof.as_dict()}\n\n--- fit tables ---\n{render(dfit)}\n\n"
                  f"--- held-out tables ---\n{render(dtest)}")
        return 0
    prof = None
    if args.profile:
        from treecoll.collectives.sim.profiles import get_profile
        prof = get_profile(args.profile)
    d = validate(paths, prof, flags, max_gpus)
    print(json.dumps(d, indent=1, default=float) if args.json else render(d))
    return 0


__all__ = ["main", "validate", "validate_case", "calibrate", "cases", "topology_for", "algorithms", "predict",
           "nccl_model_time", "geo_error", "render", "collect", "find_index", "merged_flags", "Case", "Skip"]

if __name__ == "__main__":
    sys.exit(main())
