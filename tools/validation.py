"""Validation and calibration of the simulator on nccl-tests tables: ``treecoll simulate validate`` and
``treecoll simulate calibrate``.

    treecoll simulate validate FILE... [machine flags] [--collective C] [--profile P] [--max-gpus N] [--json]
    treecoll simulate calibrate FILE... [machine flags] -o profile.yaml [--force] [--no-check] [--json]

Each file is read by :mod:`treecoll.collectives.sim.nccltests` (one entry per
table; a file of several tables gives several entries, ``table`` their index).
The machine of a table comes, field by field, from the machine flags of the
command line, then the ``flags`` of a ``tables.yaml`` index beside the file
(or in one of its two parent folders; :mod:`treecoll.tools.machine_flags`
syntax), then what the file prints (its device lines): flags win over the file.

**Prediction** (:func:`predict`): what NCCL would run, as the simulator sees it:
for allreduce the fastest of the algorithms NCCL offers on these GPUs
(:func:`treecoll.collectives.sim.simulate_nccl_allreduce`: ring, tree, and
NVLS / NVLSTree on Hopper-or-later NVSwitch systems), restricted by a file's
``NCCL_ALGO`` / ``NCCL_PROTO`` as they restrict NCCL; other collectives by
:func:`treecoll.collectives.sim.simulate_algorithm` with the ring. With
``--profile`` every algorithm runs that profile (a calibrated YAML, or a
built-in name) instead of the fastest of NCCL's protocols.

**Error**: per row ``(pred − meas) / meas`` of busbw (the measured busbw is
recomputed from the out-of-place time, as nccl-tests computes it, since small
sizes print 0.00); per table and in total the geometric-mean relative error
``exp(mean |ln(pred / meas)|) − 1`` over the rows of large (>= 64 MiB) and of
small (<= 64 KiB) messages, as fractions. The total pools the rows of every
predicted table that is not degraded.

``--json`` prints ``{"files": [{"file", "table", "status": "ok"|"skipped",
"reason", "collective", "geomean_large", "geomean_small", "degraded", "rows":
[{"size", "meas_us", "meas_busbw", "pred_us", "pred_busbw", "error", "algo",
"nccl_model_busbw"}], "machine", "set", "health", ...}], "geomean": {"large",
"small", "tables", ...}, "profile"}``: errors as fractions, busbw in GB/s,
times in µs; ``reason`` is why a table was skipped, why it counts as degraded,
or empty.

**Degraded runs** (:func:`degraded`) are predicted and printed, marked, and left
out of the total: a table whose ``tables.yaml`` entry says ``health: degraded``
(the source says the run was slowed down), or whose measured busbw at its
largest size of at least 64 MiB is below :data:`DEGRADED_FRACTION` (a quarter)
of the busbw the links allow: the ring over the same machine with the
``ideal`` profile (link bandwidths as written, no protocol overhead; the
all_gather ring for collectives without a ring, one ring for sendrecv). Real
healthy runs reach 50-100 % of that (nccl-tests' own README calls busbw the
number to compare with the hardware peak); a quarter is far below any
protocol or efficiency loss the simulator models.

**Skipped tables** say why and the flag that fixes it: an unrecognised
collective (``--collective``), an unknown machine (``--topology`` or
``--hosts/--gpus-per-host/--gpu/--nic``), a GPU count that differs from the
machine's, more GPUs than ``--max-gpus``, a collective the simulator does not
predict (no flag: said so).

**Calibration** (:func:`calibrate`) fits one :class:`~treecoll.collectives.sim.profiles.Profile`
to the tables: the bandwidth efficiency of each link class the tables' routes
use (``net``; ``nvlink`` with ``c2c``; ``pcie`` with ``smp``) and the per-hop
latency floor of each route class (``nvlink``, ``pci``, ``net``), starting from
NCCL's Simple protocol (whose base latency, NIC-latency count and tree factor
it keeps). It minimises the sum of squared ``ln(pred / meas)`` of the time over
the rows the errors count (small and large messages; every row of a table
that has neither), at most :data:`FIT_ROWS` per table spread over its sizes,
by a pattern search in log space (:func:`pattern_search`); a
parameter no row responds to keeps its start value. During the fit the tree
runs only below :data:`~treecoll.collectives.sim.simulator.NCCL_TREE_RAIL_BYTES`
(its flow simulation takes seconds per larger size); the error printed after the
fit is that of a full validation with the fitted profile. The protocol
switch points are not fitted: one profile stands for the protocols NCCL
mixes. ``--profile profile.yaml`` then predicts other sizes, collectives and
machine scales with it (``treecoll simulate validate``, ``simulate
allreduce``).

>>> geo_error([(110.0, 100.0), (100.0, 110.0)])   # 10 % over and 10 % under
0.1
>>> pattern_search(lambda x: (x[0] - 1.0) ** 2 + (x[1] + 0.5) ** 2, [0.0, 0.0], step=1.0, tol=1e-4)[0]
[1.0, -0.5]
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from treecoll.collectives.sim import nccltests
from treecoll.tools.machine_flags import parse_machine_flags
from treecoll.topo.errors import CollectiveError, TreecollError
from treecoll.topo.machines import MachineFlags, machine_topology

if TYPE_CHECKING:
    from treecoll.collectives.sim.profiles import Profile
    from treecoll.topo import Topology

__all__ = [
    "Case",
    "Skip",
    "cases",
    "find_index",
    "merged_flags",
    "topology_for",
    "algorithms",
    "predict",
    "nccl_model_time",
    "geo_error",
    "validate",
    "validate_case",
    "degraded",
    "render",
    "calibrate",
    "pattern_search",
    "fit_parameters",
    "profile_from",
    "render_calibration",
    "counted",
    "LARGE",
    "SMALL",
    "MAX_GPUS",
    "DEGRADED_FRACTION",
    "INDEX_NAME",
]

INDEX_NAME = "tables.yaml"
LARGE, SMALL = 64 << 20, 64 << 10
#: tables on more GPUs are skipped unless --max-gpus allows them (the flow simulation takes minutes there)
MAX_GPUS = 64
#: a table whose busbw at its largest size (>= 64 MiB) is below this fraction of the ideal ring's is degraded
DEGRADED_FRACTION = 0.25
_FIX_MACHINE = "pass --topology FILE|name, or --hosts N --gpus-per-host G --gpu MODEL --nic COUNTxSPEEDG-FABRIC"


class Skip(Exception):
    """A table that cannot be predicted; the message is the reason and the flag that fixes it."""


@dataclass(frozen=True)
class Case:
    """One table to validate: its file, its name as listed (relative to the index folder when there is
    one), the table, the file's header and the index entry (``set``, ``health``, ``flags``, ``why``)."""

    path: Path
    name: str
    table: nccltests.Table
    header: nccltests.Header
    entry: dict = field(default_factory=dict)
    multi: bool = False

    @property
    def env(self) -> str:
        return self.header.env or ""

    @property
    def label(self) -> str:
        """The file name, with ``#k`` (1-based) for a file of several tables."""
        return self.name + (f"#{self.table.index + 1}" if self.multi else "")


# ---------------------------------------------------------------------------------------------- reading
def find_index(path: Path) -> tuple[Path, dict] | None:
    """``(folder, entries)`` of the nearest ``tables.yaml`` in ``path``'s folder or its two parents."""
    for d in list(path.resolve().parents)[:3]:
        f = d / INDEX_NAME
        if f.is_file():
            try:
                data = yaml.safe_load(f.read_text(encoding="utf-8")) or {}
            except (yaml.YAMLError, OSError, UnicodeDecodeError) as e:
                raise nccltests.NcclTestsError(
                    f"{f}: cannot read the index of tables: {str(e).splitlines()[0]}"
                ) from None
            if not isinstance(data, dict):
                raise nccltests.NcclTestsError(f"{f}: expected a mapping of file -> entry, got {type(data).__name__}")
            return d, data
    return None


def cases(paths: Iterable[str | Path]) -> tuple[list[Case], list[dict]]:
    """The tables of ``paths`` (in order), and skipped entries for files that cannot be read."""
    out: list[Case] = []
    bad: list[dict] = []
    indexes: dict[Path, Any] = {}
    for p in map(Path, paths):
        idx = indexes.setdefault(p.resolve().parent, find_index(p))
        name, entry = str(p), {}
        if idx is not None:
            folder, entries = idx
            rel = p.resolve().relative_to(folder).as_posix()
            entry = entries.get(rel) or {}
            name = rel if entry else str(p)
        try:
            parsed = nccltests.read(p)
        except nccltests.NcclTestsError as e:
            bad.append(
                {
                    "file": name,
                    "table": 0,
                    "status": "skipped",
                    "reason": str(e),
                    "collective": None,
                    "geomean_large": None,
                    "geomean_small": None,
                    "rows": [],
                    "degraded": False,
                    **_labels(entry),
                }
            )
            continue
        multi = len(parsed.tables) > 1
        out.extend(Case(p, name, t, parsed.header, entry, multi) for t in parsed.tables)
    return out, bad


def _labels(entry: dict) -> dict:
    return {"set": entry.get("set"), "health": entry.get("health", "unstated")}


# ---------------------------------------------------------------------------------------------- machine
def merged_flags(case: Case, flags: MachineFlags | None) -> MachineFlags:
    """The index's flags for this table, the command line's winning field by field."""
    flags = flags or MachineFlags()
    base = parse_machine_flags(case.entry.get("flags") or "")
    if flags.topology is not None:
        return MachineFlags(topology=flags.topology)
    if base.topology is not None and not flags.counts_given():
        return base
    return MachineFlags(
        hosts=flags.hosts or base.hosts,
        gpus_per_host=flags.gpus_per_host or base.gpus_per_host,
        gpu=flags.gpu or base.gpu,
        nic=flags.nic or base.nic,
    )


def collective_of(case: Case, collective: str | None) -> str:
    """The table's collective, ``collective`` (``--collective``) winning; raises :class:`Skip`."""
    t = case.table
    if collective is not None:
        if t.collective is not None and t.collective != collective:
            raise Skip(f"the table is {t.collective} ({'; '.join(t.evidence)}), --collective says {collective}")
        return collective
    if t.collective is None:
        why = f"it is one of {', '.join(t.candidates)}" if t.candidates else "no collective fits its columns"
        warn = f" ({'; '.join(t.warnings)})" if t.warnings else ""
        fix = f"pass --collective {t.candidates[0]}" if t.candidates else "pass --collective NAME"
        raise Skip(f"the collective is not recognised: {why}{warn}; {fix}")
    return t.collective


def topology_for(
    case: Case, flags: MachineFlags | None = None, max_gpus: int | None = MAX_GPUS
) -> tuple[Topology, str, list[str]]:
    """``(topology, description, notes)`` of the machine a table ran on; raises :class:`Skip`."""
    t = case.table
    try:
        topo, machine = machine_topology(merged_flags(case, flags), t.machine_facts())
    except TreecollError as e:
        msg = str(e)
        raise Skip(f"machine: {msg}" + ("" if "pass " in msg else f"; {_FIX_MACHINE}")) from None
    ngpu = len(topo.rank_gpus())
    desc = machine.describe() if machine else f"topology {topo.name}"
    if t.nranks is not None and t.nranks != ngpu:
        warn = f" ({'; '.join(t.warnings)})" if t.warnings else ""
        raise Skip(
            f"the table ran on {t.nranks} ranks ({t.nranks_from}){warn}, the machine has {ngpu} GPUs "
            f"({desc}); pass --hosts N --gpus-per-host G of the run, or --topology FILE|name"
        )
    if max_gpus is not None and ngpu > max_gpus:
        raise Skip(
            f"{ngpu} GPUs: more than --max-gpus {max_gpus} (the flow simulation takes minutes at this "
            f"scale); pass --max-gpus {ngpu}"
        )
    notes = [n for n in (machine.notes if machine else ()) if not n.startswith("NICs: the template")]
    return topo, desc, notes


# ---------------------------------------------------------------------------------------------- prediction
def algorithms(case: Case, collective: str, topology: Topology | None = None) -> tuple[list[str], str]:
    """``(algorithm names, profile)`` NCCL would choose among, as the file's NCCL_ALGO / NCCL_PROTO allow:
    the ring, and for allreduce the tree and where it runs NVLS
    (:func:`treecoll.collectives.sim.nccl_model.nccl_algos`)."""
    algo = re.search(r"NCCL_ALGO=(\w+)", case.env)
    proto = re.search(r"NCCL_PROTO=(\w+)", case.env)
    proto_name = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}.get(proto.group(1).lower()) if proto else None
    algos = ["ring"]
    if collective == "allreduce":
        algos = ["ring", "tree"]
        if topology is not None and len(topology.rank_gpus()) > 1:
            from treecoll.collectives.sim.nccl_model import nccl_algos

            algos = list(nccl_algos(topology, topology.rank_gpus(), proto_name))
    if algo:
        a = {"nvlstree": "nvls"}.get(algo.group(1).lower(), algo.group(1).lower())
        algos = [x for x in algos if x == a] or algos
    prof = {"LL": "nccl-ll", "LL128": "nccl-ll128", "Simple": "nccl-simple"}.get(proto_name, "auto")
    return algos, prof


def predict(
    topology: Topology, collective: str, size: int, algos: Sequence[str], profile: Profile | str | None
) -> tuple[float, str]:
    """Predicted time (s) and ``algorithm/profile`` of one size: what NCCL would run for ``collective``
    (:func:`treecoll.collectives.sim.simulator.simulate_nccl`; ``algos`` choose among allreduce's);
    a :class:`Skip` for a collective the simulator refuses."""
    from treecoll.collectives.sim.simulator import simulate_nccl

    if len(topology.rank_gpus()) == 1:
        return 0.0, "-"
    try:
        a, r = simulate_nccl(
            topology,
            size,
            collective=collective,
            profile=profile,
            algos=list(algos) if collective == "allreduce" else None,
        )
    except CollectiveError as e:
        raise Skip(f"{collective}: the simulator does not predict it ({e}); no flag changes this") from None
    return r.time, f"{r.algorithm if a == 'nvls' else a}/{r.profile}"


def nccl_model_time(topology: Topology, collective: str, size: int, algos: Sequence[str]) -> float | None:
    """NCCL's own analytical prediction (:func:`treecoll.collectives.sim.nccl_model.nccl_predict`),
    seconds: the least over ``algos`` for allreduce, over what NCCL offers for the other collectives."""
    gpus = topology.rank_gpus()
    if len(gpus) < 2:
        return None
    from treecoll.collectives.sim.nccl_model import nccl_algos, nccl_predict

    names = list(algos) if collective == "allreduce" else nccl_algos(topology, gpus, collective=collective)
    return min(nccl_predict(topology, None, size, algo=a, collective=collective)["time"] for a in names)


def geo_error(pairs: Iterable[tuple[float, float]]) -> float | None:
    """``exp(mean |ln(pred / meas)|) − 1`` over ``(pred, meas)`` pairs of positive values, or None."""
    logs = [abs(math.log(p / m)) for p, m in pairs if p > 0 and m > 0]
    return round(math.exp(sum(logs) / len(logs)) - 1, 12) if logs else None


def _errors(rows: list[dict], key: str = "pred_busbw") -> tuple[float | None, float | None]:
    pairs = [(r[key], r["meas_busbw"], r["size"]) for r in rows if r.get(key)]
    return (geo_error((p, m) for p, m, s in pairs if s >= LARGE), geo_error((p, m) for p, m, s in pairs if s <= SMALL))


def degraded(case: Case, topology: Topology, collective: str, rows: list[dict]) -> str:
    """Why a table is degraded ('' when it is not): its index entry says so, or its busbw at its
    largest size (>= 64 MiB) is below :data:`DEGRADED_FRACTION` of the ideal ring's on the machine
    (for collectives without a ring, the all_gather ring's: one ring step, every GPU sending to its
    neighbour at once; for sendrecv, which sends each rank's buffer to one neighbour, over one ring)."""
    if case.entry.get("health") == "degraded":
        return f"degraded: the source says so ({case.entry.get('why') or 'tables.yaml health: degraded'})"
    big = [r for r in rows if r["size"] >= LARGE and r["meas_busbw"] > 0]
    if not big or len(topology.rank_gpus()) < 2:
        return ""
    from treecoll.collectives.sim import simulate_algorithm

    r = max(big, key=lambda x: x["size"])
    try:
        ideal = simulate_algorithm(topology, "ring", r["size"], collective=collective, profile="ideal").busbw
    except CollectiveError:  # alltoall, sendrecv, ...: a ring step is what a GPU's links carry at once
        from treecoll.collectives.sim import simulate_ring

        ideal = simulate_ring(
            topology,
            r["size"],
            collective="allgather",
            profile="ideal",
            channels=1 if collective == "sendrecv" else None,
        ).busbw
    if r["meas_busbw"] < DEGRADED_FRACTION * ideal:
        return (
            f"degraded: busbw {r['meas_busbw']:.2f} GB/s at {r['size']} B is {r['meas_busbw'] / ideal:.0%} of "
            f"the {ideal:.1f} GB/s the links allow (ideal ring; the rule: below {DEGRADED_FRACTION:.0%})"
        )
    return ""


def counted(size: int) -> bool:
    """Whether the errors count a row of this size: small (<= 64 KiB) or large (>= 64 MiB) messages."""
    return size <= SMALL or size >= LARGE


def _row_sizes(case: Case, keep: Callable[[int], bool] | None) -> list[nccltests.Row]:
    return [r for r in case.table.rows if r.size > 0 and r.out_of_place.time_us > 0 and (keep is None or keep(r.size))]


def validate_case(
    case: Case,
    profile: Profile | str | None = None,
    flags: MachineFlags | None = None,
    max_gpus: int | None = MAX_GPUS,
    collective: str | None = None,
    keep: Callable[[int], bool] | None = None,
) -> dict:
    """One table's entry: ``status`` ``ok`` with its rows and errors, or ``skipped`` with the reason.
    ``keep(size)``: which rows to predict (default all)."""
    from treecoll.collectives.sim.nccltests import bus_factor

    t = case.table
    entry = {
        "file": case.name,
        "table": t.index,
        "line": t.line,
        "status": "skipped",
        "reason": "",
        "collective": t.collective,
        "geomean_large": None,
        "geomean_small": None,
        "rows": [],
        "degraded": False,
        "nranks": t.nranks,
        "gpu": ", ".join(t.gpu_names()) or None,
        "warnings": list(t.warnings),
        **_labels(case.entry),
    }
    try:
        coll = collective_of(case, collective)
        entry["collective"] = coll
        topo, desc, notes = topology_for(case, flags, max_gpus)
        n = len(topo.rank_gpus())
        entry.update(machine=desc, notes=notes, nranks=n)
        algos, prof = algorithms(case, coll, topo)
        prof = profile if profile is not None else prof
        f = bus_factor(coll, n)
        rows = []
        for r in _row_sizes(case, keep):
            pred, label = predict(topo, coll, r.size, algos, prof)
            meas_bus = r.size / (r.out_of_place.time_us * 1e-6) / 1e9 * f
            pred_bus = r.size / pred / 1e9 * f if pred > 0 else 0.0
            nm = nccl_model_time(topo, coll, r.size, algos) if profile is None else None
            rows.append(
                {
                    "size": r.size,
                    "meas_us": r.out_of_place.time_us,
                    "meas_busbw": meas_bus,
                    "pred_us": pred * 1e6,
                    "pred_busbw": pred_bus,
                    "algo": label,
                    "nccl_model_busbw": r.size / nm / 1e9 * f if nm else None,
                    "error": (pred_bus - meas_bus) / meas_bus if meas_bus > 0 else None,
                }
            )
    except Skip as e:
        entry["reason"] = str(e)
        return entry
    entry.update(status="ok", rows=rows)
    entry["geomean_large"], entry["geomean_small"] = _errors(rows)
    entry["nccl_model_large"], entry["nccl_model_small"] = _errors(rows, "nccl_model_busbw")
    why = degraded(case, topo, coll, rows)
    entry.update(reason=why, degraded=bool(why))
    return entry


def totals(entries: list[dict], *, degraded_too: bool = False) -> dict:
    """The pooled geometric-mean errors of the predicted entries, degraded ones left out unless
    ``degraded_too`` (``tables``: how many)."""
    used = [e for e in entries if e["status"] == "ok" and (degraded_too or not e["degraded"])]
    rows = [r for e in used for r in e["rows"]]
    large, small = _errors(rows)
    nl, ns = _errors(rows, "nccl_model_busbw")
    return {"large": large, "small": small, "tables": len(used), "nccl_model_large": nl, "nccl_model_small": ns}


def validate(
    paths: Iterable[str | Path],
    profile: Profile | str | None = None,
    flags: MachineFlags | None = None,
    max_gpus: int | None = MAX_GPUS,
    collective: str | None = None,
    keep: Callable[[int], bool] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> dict:
    """Every table of ``paths``: ``{"files": [entry, ...], "geomean": {"large", "small", ...}, "profile"}``;
    degraded tables are listed but left out of ``geomean``."""
    cs, bad = cases(paths)
    files = []
    for i, c in enumerate(cs):
        if progress is not None:
            progress(i, len(cs), c.label)
        files.append(validate_case(c, profile, flags, max_gpus, collective, keep))
    files += bad
    name = getattr(profile, "name", profile)
    return {"files": files, "geomean": totals(files), "profile": name or "auto (the fastest NCCL protocol per size)"}


# ---------------------------------------------------------------------------------------------- text
def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def _title(e: dict) -> str:
    k = f"#{e['table'] + 1}" if e.get("table") else ""
    return f"== {e['file']}{k}: {e.get('collective') or '?'}, {e.get('nranks') or '?'} GPUs"


def render(d: dict) -> str:
    """The text of ``treecoll simulate validate``."""
    lines = [f"profile: {d['profile']}"]
    for e in d["files"]:
        if e["status"] != "ok":
            continue
        lines += ["", _title(e) + f"; machine {e['machine']}" + ("  [DEGRADED]" if e["degraded"] else "")]
        lines.extend(f"   note: {n}" for n in e.get("notes", []) + e.get("warnings", []))
        if e["degraded"]:
            lines.append(f"   {e['reason']}; left out of the total")
        lines.append(
            f"{'size':>12} {'meas us':>10} {'meas busbw':>10} {'pred us':>10} {'pred busbw':>10} "
            f"{'error':>7}  {'algo':<20} {'nccl model':>10}"
        )
        for r in e["rows"]:
            nm = "-" if r.get("nccl_model_busbw") is None else f"{r['nccl_model_busbw']:.2f}"
            lines.append(
                f"{r['size']:>12} {r['meas_us']:>10.1f} {r['meas_busbw']:>10.2f} {r['pred_us']:>10.1f} "
                f"{r['pred_busbw']:>10.2f} {_pct(r['error']):>7}  {r['algo']:<20} {nm:>10}"
            )
        lines.append(
            f"   geomean error: large (>= 64 MiB) {_pct(e['geomean_large'])}, small (<= 64 KiB) "
            f"{_pct(e['geomean_small'])}"
        )
    skipped = [e for e in d["files"] if e["status"] != "ok"]
    if skipped:
        lines += ["", f"skipped ({len(skipped)}):"]
        lines.extend(f"   {_title(e)[3:]}: {e['reason']}" for e in skipped)
    g = d["geomean"]
    deg = sum(1 for e in d["files"] if e["degraded"])
    lines += [
        "",
        f"total over {g['tables']} tables ({deg} degraded and {len(skipped)} skipped left out): geomean "
        f"error large {_pct(g['large'])}, small {_pct(g['small'])}",
    ]
    if profile_is_default(d):
        lines.append(
            f"NCCL's own model (allreduce rows): large {_pct(g['nccl_model_large'])}, small "
            f"{_pct(g['nccl_model_small'])}"
        )
    return "\n".join(lines)


def profile_is_default(d: dict) -> bool:
    return str(d.get("profile", "")).startswith("auto")


# ---------------------------------------------------------------------------------------------- calibration
#: rows per table the fit simulates (spread over the table's sizes; every row counts in ``before``/``after``)
FIT_ROWS = 12
#: the fitted parameters: name -> (Profile field, keys of that field it sets)
PARAMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "eff_net": ("bw_eff", ("net",)),
    "eff_nvlink": ("bw_eff", ("nvlink", "c2c")),
    "eff_pcie": ("bw_eff", ("pcie", "smp")),
    "lat_nvlink": ("lat_floor_us", ("nvlink",)),
    "lat_pci": ("lat_floor_us", ("pci",)),
    "lat_net": ("lat_floor_us", ("net",)),
}


def profile_from(values: dict[str, float], name: str = "calibrated", source: str = "") -> Profile:
    """A Profile: NCCL's Simple protocol with ``values`` (:data:`PARAMS` names) set."""
    import dataclasses

    from treecoll.collectives.sim.profiles import PROFILES

    base = PROFILES["nccl-simple"]
    eff, floor = dict(base.bw_eff), dict(base.lat_floor_us)
    for k, v in values.items():
        fld, keys = PARAMS[k]
        for key in keys:
            (eff if fld == "bw_eff" else floor)[key] = min(v, 1.0) if fld == "bw_eff" else v
    return dataclasses.replace(base, name=name, bw_eff=eff, lat_floor_us=floor, source=source)


def start_values() -> dict[str, float]:
    """Where the fit starts: NCCL's Simple protocol (efficiency 1, NCCL's latency floors)."""
    p = profile_from({})
    return {
        k: (p.efficiency(keys[0]) if fld == "bw_eff" else p.lat_floor_us[keys[0]]) for k, (fld, keys) in PARAMS.items()
    }


def pattern_search(
    f: Callable[[list[float]], float],
    x0: Sequence[float],
    *,
    step: float = 0.7,
    tol: float = 0.002,
    max_evals: int = 400,
    bounds: Sequence[tuple[float, float]] | None = None,
) -> tuple[list[float], float, int]:
    """Minimise ``f`` by compass search: try ``± step`` on each coordinate, keep any improvement, halve the
    step when none helps, stop below ``tol`` or after ``max_evals`` calls. Returns ``(x, f(x), calls)``."""
    x = list(x0)
    best = f(x)
    calls = 1
    while step >= tol and calls < max_evals:
        improved = False
        for i in range(len(x)):
            for d in (step, -step):
                y = list(x)
                y[i] += d
                if bounds is not None:
                    y[i] = min(max(y[i], bounds[i][0]), bounds[i][1])
                if y[i] == x[i]:
                    continue
                v = f(y)
                calls += 1
                if v < best - 1e-12:
                    x, best, improved = y, v, True
                    break
        if not improved:
            step /= 2
    return x, best, calls


@dataclass(frozen=True)
class _FitRow:
    topology: Any
    collective: str
    size: int
    algos: tuple[str, ...]
    meas: float  # seconds


def _spread(rows: list, n: int | None) -> list:
    """At most ``n`` of ``rows`` (sorted by size), evenly spread over the list, the first and last kept."""
    if n is None or len(rows) <= n:
        return rows
    idx = sorted({round(i * (len(rows) - 1) / (n - 1)) for i in range(n)})
    return [rows[i] for i in idx]


def _fit_rows(
    cs: list[Case],
    flags: MachineFlags | None,
    max_gpus: int | None,
    collective: str | None,
    max_rows: int | None = None,
) -> tuple[list[_FitRow], list[dict]]:
    from treecoll.collectives.sim.simulator import NCCL_TREE_RAIL_BYTES

    rows, skipped = [], []
    for c in cs:
        try:
            coll = collective_of(c, collective)
            topo = topology_for(c, flags, max_gpus)[0]
        except Skip as e:
            skipped.append({"file": c.label, "reason": str(e)})
            continue
        if c.entry.get("health") == "degraded":
            skipped.append({"file": c.label, "reason": "degraded (tables.yaml): not fitted"})
            continue
        algos = tuple(algorithms(c, coll, topo)[0])
        rows_c = _row_sizes(c, counted) or _row_sizes(c, None)  # the rows the errors count, where it has any
        for r in _spread(rows_c, max_rows):
            use = tuple(a for a in algos if a != "tree" or r.size < NCCL_TREE_RAIL_BYTES) or algos
            rows.append(_FitRow(topo, coll, r.size, use, r.out_of_place.time_us * 1e-6))
    return rows, skipped


def fit_parameters(
    rows: list[_FitRow], start: dict[str, float] | None = None, *, tol: float = 0.002, max_evals: int = 400
) -> tuple[dict[str, float], dict[str, Any]]:
    """The :data:`PARAMS` values that minimise ``sum ln(pred / meas)^2`` over ``rows``, and fit statistics.
    Parameters no row responds to keep their start value (``fixed``)."""
    start = dict(start or start_values())

    def cost(values: dict[str, float]) -> float:
        prof = profile_from(values)
        s = 0.0
        for r in rows:
            t, _ = predict(r.topology, r.collective, r.size, r.algos, prof)
            s += math.log(t / r.meas) ** 2 if t > 0 else 0.0
        return s

    base = cost(start)
    free = []
    for k in PARAMS:  # a parameter is free when doubling or halving it changes the cost
        trial = dict(start, **{k: start[k] * (0.5 if k.startswith("eff") else 2.0)})
        if abs(cost(trial) - base) > 1e-9 * max(base, 1.0):
            free.append(k)
    bounds = [(math.log(0.01), 0.0) if k.startswith("eff") else (math.log(0.01), math.log(1000.0)) for k in free]

    def f(x: list[float]) -> float:
        return cost(dict(start, **{k: math.exp(v) for k, v in zip(free, x)}))

    x, best, calls = pattern_search(f, [math.log(start[k]) for k in free], tol=tol, max_evals=max_evals, bounds=bounds)
    for i, k in enumerate(free):  # a value the optimum does not depend on goes back to its start
        y = list(x)
        y[i] = math.log(start[k])
        v = f(y)
        calls += 1
        if v <= best * (1 + 1e-6) + 1e-15:
            x, best = y, min(best, v)
    values = dict(start, **{k: math.exp(v) for k, v in zip(free, x)})
    n = max(len(rows), 1)
    return values, {
        "free": free,
        "fixed": [k for k in PARAMS if k not in free],
        "rows": len(rows),
        "evaluations": calls + len(PARAMS) + 1,
        "rms_log_error_before": math.sqrt(base / n),
        "rms_log_error_after": math.sqrt(best / n),
    }


def calibrate(
    paths: Iterable[str | Path],
    flags: MachineFlags | None = None,
    max_gpus: int | None = MAX_GPUS,
    collective: str | None = None,
    name: str = "calibrated",
    *,
    tol: float = 0.002,
    check: bool = True,
    max_rows: int | None = FIT_ROWS,
) -> dict:
    """Fit a profile to the tables of ``paths``: ``{"profile": Profile, "values", "fit", "skipped",
    "before", "after"}`` (``before``/``after``: :func:`validate` with NCCL's protocols and with the fitted
    profile, when ``check``). ``max_rows``: rows fitted per table, spread over its sizes. Raises
    :class:`~treecoll.topo.errors.CollectiveError` when no row can be fitted."""
    paths = [Path(p) for p in paths]
    cs, bad = cases(paths)
    rows, skipped = _fit_rows(cs, flags, max_gpus, collective, max_rows)
    skipped += [{"file": b["file"], "reason": b["reason"]} for b in bad]
    if not rows:
        why = "; ".join(f"{s['file']}: {s['reason']}" for s in skipped) or "no rows"
        raise CollectiveError(f"calibrate: no table row to fit ({why})")
    values, stats = fit_parameters(rows, tol=tol)
    src = "treecoll simulate calibrate on " + ", ".join(p.name for p in paths)
    prof = profile_from(values, name, src)
    out = {"profile": prof, "values": values, "fit": stats, "skipped": skipped}
    if check:  # the rows the errors count, of every table fitted (a slow machine's own profile: degraded too)
        for key, p in (("before", None), ("after", prof)):
            files = validate(paths, p, flags, max_gpus, collective, keep=counted)["files"]
            out[key] = totals([e for e in files if e.get("health") != "degraded"], degraded_too=True)
    return out


def render_calibration(d: dict) -> str:
    """The text of ``treecoll simulate calibrate``."""
    f = d["fit"]
    lines = [
        f"fitted on {f['rows']} rows ({f['evaluations']} simulations of every row); free parameters: "
        f"{', '.join(f['free']) or 'none'}"
    ]
    for k, v in d["values"].items():
        unit = "" if k.startswith("eff") else " us"
        lines.append(f"   {k:<11} {v:8.3f}{unit}{'' if k in f['free'] else '   (no row responds: kept)'}")
    lines.append(
        f"rms |ln(pred/meas)| of the times: {f['rms_log_error_before']:.3f} at the start (NCCL Simple), "
        f"{f['rms_log_error_after']:.3f} fitted"
    )
    for label in ("before", "after"):
        if label in d:
            g = d[label]
            lines.append(
                f"geomean busbw error {label:<6} ({'NCCL protocols' if label == 'before' else 'fitted'}): "
                f"large {_pct(g['large'])}, small {_pct(g['small'])} over {g['tables']} tables"
            )
    worse = [k for k in ("large", "small") if "after" in d and (d["after"][k] or 0) > (d["before"][k] or 0)]
    if worse:
        lines.append(
            f"warning: the fitted profile predicts these tables worse than NCCL's protocols "
            f"({', '.join(worse)} messages): one profile stands for NCCL's protocol mix and NVLS "
            f"constants; keep the default (no --profile) for these"
        )
    lines.extend(f"skipped {s['file']}: {s['reason']}" for s in d["skipped"])
    if d.get("saved"):
        lines.append(f"saved {d['saved']} (use it with --profile {d['saved']})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- command
def add_parsers(sub, common_options: Callable) -> None:
    """Add ``validate`` and ``calibrate`` to ``treecoll simulate``'s subparsers."""
    from treecoll.collectives.sim.nccltests import COLLECTIVES
    from treecoll.collectives.sim.profiles import PROFILES
    from treecoll.tools import units
    from treecoll.tools.machine_flags import add_machine_flags

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
        "of the total.",
    )
    v.add_argument(
        "--profile",
        default=None,
        metavar="P",
        help=f"simulator profile: a calibrated YAML file or {', '.join(sorted(PROFILES))} (default: the "
        f"fastest NCCL protocol per size)",
    )
    c = one(
        "calibrate",
        "fit a simulator profile to your nccl-tests tables",
        "Fit link efficiencies and per-hop latencies of a simulator profile to nccl-tests tables; "
        "use the profile with --profile.",
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
    import sys

    if n > 1 and sys.stderr.isatty():
        sys.stderr.write(f"\r{i}/{n} {what[:60]:<60}" if i < n else "\r" + " " * 70 + "\r")
        sys.stderr.flush()


def _output(path: str, force: bool, inputs: Sequence[str]) -> str:
    from treecoll.tools.cli import output_path
    from treecoll.tools.units import UsageError

    if Path(path).exists() and not force:
        raise UsageError(f"-o {path}: the file exists; pass --force to replace it, or name another file")
    return output_path(path, "-o", inputs=list(inputs), suffixes=(".yaml", ".yml"))


def run(args) -> int:
    """``treecoll simulate validate|calibrate``."""
    import json

    from treecoll.tools.cli import emit
    from treecoll.tools.machine_flags import machine_flags

    flags = machine_flags(args)
    max_gpus = args.max_gpus or None
    for f in args.files:
        if not Path(f).is_file():
            from treecoll.tools.units import UsageError

            raise UsageError(f"{f}: no such file; expected an nccl-tests output")
    if args.sim_command == "validate":
        prof = None
        if args.profile not in (None, "auto"):
            from treecoll.collectives.sim.profiles import get_profile

            prof = get_profile(args.profile)
        d = validate(args.files, prof, flags, max_gpus, args.collective, progress=_progress)
        _progress(1, 1, "")
        return emit(args, d, render)
    out = _output(args.output, args.force, args.files)
    from treecoll.collectives.sim.profiles import save_profile

    d = calibrate(args.files, flags, max_gpus, args.collective, args.name or Path(out).stem, check=not args.no_check)
    fit = {"files": [str(f) for f in args.files], **d["fit"]}
    for key in ("before", "after"):
        if key in d:
            fit[f"geomean_{key}"] = {k: d[key][k] for k in ("large", "small")}
    save_profile(d["profile"], out, fit=fit)
    d["saved"] = out
    if getattr(args, "json", False):
        print(json.dumps({**d, "profile": d["profile"].as_dict()}, indent=2, default=str))
        return 0
    return emit(args, d, render_calibration)
