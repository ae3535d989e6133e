"""Validation of the simulator on nccl-tests tables: ``treecoll simulate validate``.

    treecoll simulate validate FILE... [machine flags] [--collective C] [--profile P] [--max-gpus N] [--json]

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
``--profile`` a calibration (what :func:`treecoll.tools.calibration.calibrate` writes) corrects those
defaults with its factors; a plain profile (a built-in name or a profile YAML)
is run by every algorithm instead of the fastest of NCCL's protocols.

**Error**: per row ``(pred − meas) / meas`` of busbw (the measured busbw is
recomputed from the out-of-place time, as nccl-tests computes it, since small
sizes print 0.00); per table and in total the geometric-mean relative error
``exp(mean |ln(pred / meas)|) − 1`` over the rows of large (>= 64 MiB) and of
small (<= 64 KiB) messages, as fractions. The total pools the rows of every
predicted table that is not degraded.

**Noisy rows** (:func:`noisy`): nccl-tests times every size twice, out of place
and in place, the same collective on the same bytes. Where the two differ by
more than :data:`NOISY_RATIO` (1.5) the table contradicts itself at that size
(one of the two runs was slowed down, e.g. an 8-byte allreduce at 68.52 us out
of place and 24.70 in place); such a row is printed, marked ``noisy`` with both
times, and left out of the errors, the table's and the total.

``--json`` prints ``{"files": [{"file", "table", "status": "ok"|"skipped",
"reason", "collective", "geomean_large", "geomean_small", "degraded", "rows":
[{"size", "meas_us", "meas_inplace_us", "noisy", "meas_busbw", "pred_us",
"pred_busbw", "error", "algo", "nccl_model_busbw"}], "machine", "set", "health", ...}], "geomean": {"large",
"small", "tables", ...}, "profile"}``: errors as fractions, busbw in GB/s,
times in µs; ``warnings``: what the reader noted, a row it left out (cut mid-line) among them;
``reason`` is why a table was skipped, why it counts as degraded,
or empty.

**Degraded runs** (:func:`degraded`) are predicted and printed, marked, and left
out of the total: a table whose ``tables.yaml`` entry says ``health: degraded``
(the source says the run was slowed down), or where a size of at least 1 MiB
took more than :data:`SLOWER_RATIO` (1.5) times the time of a size twice as large
or more (:func:`slower_than_larger`: the bytes only grow, so the smaller size
was slowed down), or whose measured busbw at its
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

**Calibration** (``treecoll simulate calibrate``) is :mod:`treecoll.tools.calibration`; the command
line of both is :mod:`treecoll.tools.cmd_validate`.

>>> geo_error([(110.0, 100.0), (100.0, 110.0)])   # 10 % over and 10 % under
0.1
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
from treecoll.collectives.sim.profiles import NCCL_PROTO_PROFILES
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
    "algorithm_time",
    "clear_cache",
    "nccl_model_time",
    "geo_error",
    "validate",
    "validate_case",
    "degraded",
    "render",
    "counted",
    "LARGE",
    "SMALL",
    "MAX_GPUS",
    "DEGRADED_FRACTION",
    "NOISY_RATIO",
    "noisy",
    "INDEX_NAME",
    "ALGO_FAMILY",
    "profile_is_default",
]

INDEX_NAME = "tables.yaml"
LARGE, SMALL = 64 << 20, 64 << 10
#: tables on more GPUs are skipped unless --max-gpus allows them (the flow simulation takes minutes there)
MAX_GPUS = 64
#: a table whose busbw at its largest size (>= 64 MiB) is below this fraction of the ideal ring's is degraded
DEGRADED_FRACTION = 0.25
#: a table where a size from SLOWER_FROM bytes on took more than SLOWER_RATIO times the time of a size
#: twice as large or more is degraded (:func:`slower_than_larger`); below 1 MiB times are latency-bound
#: and a run's first sizes often carry its warm-up. Healthy fixtures stay at or below 1.01 from 1 MiB on.
SLOWER_FROM, SLOWER_RATIO = 1 << 20, 1.5
#: a row whose out-of-place and in-place times differ by more than this factor either way is noisy (:func:`noisy`)
NOISY_RATIO = 1.5
_FIX_MACHINE = "pass --topology FILE|name, or --hosts N --gpus-per-host G --gpu MODEL --nic COUNTxSPEEDG-FABRIC"
#: the algorithm family of each NCCL algorithm name (:data:`~treecoll.collectives.sim.profiles.FAMILIES`)
ALGO_FAMILY = {"ring": "ring", "pat": "ring", "tree": "tree", "nvls": "nvls", "p2p": "p2p"}


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
    """The tables of ``paths`` (in order), and skipped entries for files that cannot be read; a file
    given twice (by any path) is an error: its tables would count twice in every total and fit."""
    out: list[Case] = []
    bad: list[dict] = []
    indexes: dict[Path, Any] = {}
    seen: dict[Path, Path] = {}
    for p in map(Path, paths):
        first = seen.setdefault(p.resolve(), p)
        if first is not p:
            raise CollectiveError(f"{p}: the same file as {first}, given before; name each file once")
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
        gpu_nic=flags.gpu_nic or base.gpu_nic,
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


#: machines built by :func:`_machine_topology`, by what decides their topology (not the host names)
_TOPOLOGIES: dict[tuple, Topology] = {}


def _machine_topology(flags: MachineFlags, facts: Any) -> tuple[Topology, Any]:
    """:func:`~treecoll.topo.machines.machine_topology`, a resolved machine built once per process (its
    route tables with it): the tables of one machine, whatever their host names, share one topology."""
    if flags.topology is not None:
        return machine_topology(flags, facts)
    from treecoll.topo.machines import resolve_machine

    m = resolve_machine(flags, facts)
    key = (m.template, m.hosts, m.gpus_per_host, m.nic, m.gpu, repr(m.overrides), m.gpu_nic)
    topo = _TOPOLOGIES.get(key)
    if topo is None:
        topo = _TOPOLOGIES[key] = m.topology()
    return topo, m


def topology_for(
    case: Case, flags: MachineFlags | None = None, max_gpus: int | None = MAX_GPUS
) -> tuple[Topology, str, list[str]]:
    """``(topology, description, notes)`` of the machine a table ran on; raises :class:`Skip`."""
    t = case.table
    try:
        topo, machine = _machine_topology(merged_flags(case, flags), t.machine_facts())
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
    by_lower = {name.lower(): name for name in NCCL_PROTO_PROFILES}  # NCCL_PROTO is case-insensitive
    proto_name = by_lower.get(proto.group(1).lower()) if proto else None
    algos = ["ring"]
    if collective == "allreduce":
        algos = ["ring", "tree"]
        if topology is not None and len(topology.rank_gpus()) > 1:
            from treecoll.collectives.sim.nccl_model import nccl_algos

            algos = list(nccl_algos(topology, topology.rank_gpus(), proto_name))
    if algo:
        a = {"nvlstree": "nvls"}.get(algo.group(1).lower(), algo.group(1).lower())
        algos = [x for x in algos if x == a] or algos
    prof = NCCL_PROTO_PROFILES.get(proto_name, "auto")
    return algos, prof


def predict(
    topology: Topology, collective: str, size: int, algos: Sequence[str], profile: Profile | str | None
) -> tuple[float, str]:
    """Predicted time (s) and ``algorithm/profile`` of one size: what NCCL would run for ``collective``
    (:func:`treecoll.collectives.sim.simulator.simulate_nccl`; ``algos`` choose among allreduce's: the
    fastest of them, the first of equals); a :class:`Skip` for a collective the simulator refuses.
    Each algorithm's time comes from :func:`algorithm_time` (simulated once per machine, size and
    the factors it depends on)."""
    from treecoll.collectives.sim.simulator import nccl_offered, simulate_nccl

    if len(topology.rank_gpus()) == 1:
        return 0.0, "-"
    names: list[str | None] = [None]  # another collective: the one family NCCL runs it with
    if collective == "allreduce":
        names = [a for a in algos if a in nccl_offered(topology, topology.rank_gpus(), collective, profile)]
        if not names:  # none of them offered: simulate_nccl says why
            try:
                simulate_nccl(topology, size, collective=collective, profile=profile, algos=list(algos))
            except CollectiveError as e:
                raise Skip(f"{collective}: the simulator does not predict it ({e}); no flag changes this") from None
    best = None
    for a in names:
        out = algorithm_time(topology, collective, size, a, profile)
        if isinstance(out, str):
            raise Skip(f"{collective}: the simulator does not predict it ({out}); no flag changes this")
        best = out if best is None or out[0] < best[0] else best
    return best


#: ``(time s, label)`` or the refusal's message, by (topology, collective, size, NCCL algorithm, the part of
#: the profile that algorithm depends on): :func:`algorithm_time`'s memory, shared by validate and calibrate
_TIMES: dict[tuple, tuple[float, str] | str] = {}
#: entries :data:`_TIMES` keeps before it starts again (a fit adds a few thousand)
CACHE_ENTRIES = 1 << 18
#: simulations :func:`algorithm_time` ran (its cache misses), for the fit's statistics
SIMULATIONS = [0]


def clear_cache() -> None:
    """Forget every simulated time (:func:`algorithm_time`) and machine (:func:`topology_for`)."""
    _TIMES.clear()
    _TOPOLOGIES.clear()


def _profile_key(profile: Profile | str | None, family: str, size: int = 0) -> Any:
    """What an algorithm of ``family`` sees of ``profile`` at ``size`` bytes: of a calibration its link and
    hop factors, the family's latency and bandwidth factors, which protocols its switch points run
    at this size, the added latencies and the protocols' bandwidth factors (every other factor leaves
    that algorithm's time alone; all at the defaults is ``auto``), of a plain profile its fields, of a
    name the name."""
    from treecoll.collectives.sim.profiles import (
        LINK_CLASSES,
        NCCL_PROTOCOLS,
        ROUTE_CLASSES,
        Calibration,
        Profile,
    )

    if isinstance(profile, Calibration):
        links = tuple(profile.link_scale.get(k, 1.0) for k in LINK_CLASSES)
        hops = tuple(profile.hop_scale.get(k, 1.0) for k in ROUTE_CLASSES)
        runs = tuple(profile.runs(p, size) for p in NCCL_PROTOCOLS)
        added = tuple(sorted(profile.hop_lat_us.items())) + tuple(sorted(profile.proto_bw.items()))
        key = (links, hops, profile.lat_scale.get(family, 1.0), profile.bw_scale.get(family, 1.0), runs, added)
        default = ((1.0,) * len(LINK_CLASSES), (1.0,) * len(ROUTE_CLASSES), 1.0, 1.0, (None,) * len(NCCL_PROTOCOLS), ())
        return "auto" if key == default else key
    if isinstance(profile, Profile):
        return repr(profile.as_dict())
    return profile


def algorithm_time(
    topology: Topology, collective: str, size: int, algo: str | None, profile: Profile | str | None
) -> tuple[float, str] | str:
    """``(time s, "algorithm/profile")`` of NCCL algorithm ``algo`` (None: the fastest NCCL offers for
    ``collective``) by :func:`~treecoll.collectives.sim.simulator.simulate_nccl`, or the message of its
    refusal. Remembered per (topology, collective, size, algorithm, the factors that algorithm's family
    depends on: :func:`_profile_key`), so a calibration that moves the ring's latency reuses the
    tree's and NVLS's times; the simulation is deterministic, so a remembered time is the time."""
    from treecoll.collectives.sim.simulator import P2P_COLLECTIVES, simulate_nccl

    family = ALGO_FAMILY[algo] if algo is not None else "p2p" if collective in P2P_COLLECTIVES else "ring"
    key = (topology, collective, size, algo, _profile_key(profile, family, size))
    out = _TIMES.get(key)
    if out is None:
        SIMULATIONS[0] += 1
        try:
            a, r = simulate_nccl(
                topology, size, collective=collective, profile=profile, algos=None if algo is None else [algo]
            )
            out = (r.time, f"{r.algorithm if a == 'nvls' else a}/{r.profile}")
        except CollectiveError as e:
            out = str(e)
        if len(_TIMES) >= CACHE_ENTRIES:
            _TIMES.clear()
        _TIMES[key] = out
    return out


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


def noisy(out_of_place_us: float, in_place_us: float | None) -> bool:
    """Whether a row's two timings of the same collective (out of place, in place) differ by more than
    :data:`NOISY_RATIO` either way: one of them was slowed down, and the row says nothing reliable.

    >>> noisy(68.52, 24.70), noisy(25.3, 24.7), noisy(24.7, None), noisy(170.3, 349.6)
    (True, False, False, True)
    """
    if not in_place_us or in_place_us <= 0 or out_of_place_us <= 0:
        return False
    return max(out_of_place_us, in_place_us) > NOISY_RATIO * min(out_of_place_us, in_place_us)


def _errors(rows: list[dict], key: str = "pred_busbw") -> tuple[float | None, float | None]:
    pairs = [(r[key], r["meas_busbw"], r["size"]) for r in rows if r.get(key) and not r.get("noisy")]
    return (geo_error((p, m) for p, m, s in pairs if s >= LARGE), geo_error((p, m) for p, m, s in pairs if s <= SMALL))


def degraded(case: Case, topology: Topology, collective: str, rows: list[dict]) -> str:
    """Why a table is degraded ('' when it is not): its index entry says so, or its busbw at its
    largest size (>= 64 MiB) is below :data:`DEGRADED_FRACTION` of the ideal ring's on the machine
    (for collectives without a ring, the all_gather ring's: one ring step, every GPU sending to its
    neighbour at once; for sendrecv, which sends each rank's buffer to one neighbour, over one ring)."""
    if case.entry.get("health") == "degraded":
        return f"degraded: the source says so ({case.entry.get('why') or 'tables.yaml health: degraded'})"
    slow = slower_than_larger([(r.size, r.out_of_place.time_us) for r in case.table.rows])
    if slow:
        (s, t), (s2, t2) = slow
        return (
            f"degraded: {s} B took {t:g} us, {t / t2:.1f} x the {t2:g} us of {s2} B (the rule: from "
            f"{SLOWER_FROM} B on, no size takes more than {SLOWER_RATIO:g} x the time of a size twice as large or more)"
        )
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


def slower_than_larger(rows: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], tuple[int, float]] | None:
    """The first ``((size, time), (larger size, its time))`` of measured rows ``(bytes, µs)`` where a size
    of at least :data:`SLOWER_FROM` took more than :data:`SLOWER_RATIO` times the time of a size twice
    as large or more (None when there is none): a run whose time falls that much as the message grows
    was slowed down at the smaller size (the bytes to move only grow).

    >>> slower_than_larger([(1 << 20, 100.0), (2 << 20, 180.0), (4 << 20, 330.0)]) is None
    True
    >>> slower_than_larger([(2 << 20, 1753.7), (4 << 20, 933.6)])
    ((2097152, 1753.7), (4194304, 933.6))
    """
    return next(_slower_pairs(rows, SLOWER_FROM), None)


def _slower_pairs(
    rows: Sequence[tuple[int, float]], start: int
) -> Iterable[tuple[tuple[int, float], tuple[int, float]]]:
    """Every ``((size, time), (larger size, its time))`` of :func:`slower_than_larger`'s rule, from ``start`` bytes
    on, the smaller size first (at most one pair per size)."""
    ok = sorted((int(s), float(t)) for s, t in rows if s > 0 and t > 0)
    for i, (s, t) in enumerate(ok):
        if s < start:
            continue
        for s2, t2 in ok[i + 1 :]:
            if s2 >= 2 * s and t > SLOWER_RATIO * t2:
                yield (s, t), (s2, t2)
                break


def glitch_sizes(rows: Sequence[nccltests.Row]) -> set[int]:
    """The sizes of a table, at any size, that took more than :data:`SLOWER_RATIO` times the time of a size twice
    as large or more (:func:`slower_than_larger`'s rule, below 1 MiB too): a row a run slowed down once (an
    8-byte allreduce at 68.52 us between sizes at 25 us, its in-place run at 24.70), which the fit leaves out
    (a latency fitted to it would be the glitch's)."""
    return {a[0] for a, _ in _slower_pairs([(r.size, r.out_of_place.time_us) for r in rows], 0)}


def noisy_row_sizes(rows: Sequence[nccltests.Row]) -> set[int]:
    """The sizes whose out-of-place and in-place times disagree (:func:`noisy`): left out of the fit as of
    the errors."""
    return {r.size for r in rows if noisy(r.out_of_place.time_us, _in_place_us(r))}


def _in_place_us(row: nccltests.Row) -> float | None:
    """A row's in-place time (us), None where the table printed one run only."""
    return row.in_place.time_us if row.in_place is not None else None


def counted(size: int) -> bool:
    """Whether the errors count a row of this size: small (<= 64 KiB) or large (>= 64 MiB) messages."""
    return size <= SMALL or size >= LARGE


def row_sizes(case: Case, keep: Callable[[int], bool] | None) -> list[nccltests.Row]:
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
        "warnings": list(t.warnings) + [f"line {no}: a row left out: {why}" for no, why in t.dropped],
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
        for r in row_sizes(case, keep):
            pred, label = predict(topo, coll, r.size, algos, prof)
            meas_bus = r.size / (r.out_of_place.time_us * 1e-6) / 1e9 * f
            pred_bus = r.size / pred / 1e9 * f if pred > 0 else 0.0
            nm = nccl_model_time(topo, coll, r.size, algos) if profile is None else None
            rows.append(
                {
                    "size": r.size,
                    "meas_us": r.out_of_place.time_us,
                    "meas_inplace_us": _in_place_us(r),
                    "noisy": noisy(r.out_of_place.time_us, _in_place_us(r)),
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
def pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def _where(e: dict) -> str:
    """A file entry's file, and its table (``#2``...) when the file holds several."""
    return f"{e['file']}#{e['table'] + 1}" if e.get("table") else str(e["file"])


def _title(e: dict) -> str:
    return f"== {_where(e)}: {e.get('collective') or '?'}, {e.get('nranks') or '?'} GPUs"


def skip_line(e: dict) -> str:
    """A skipped table: the file (and table), what is known of it, and why; the file once."""
    known = ", ".join(x for x in (e.get("collective"), e.get("nranks") and f"{e['nranks']} GPUs") if x)
    where = _where(e)
    reason = str(e["reason"])
    if known:
        return f"{where} ({known}): {reason}"
    return reason if reason.startswith(str(e["file"])) else f"{where}: {reason}"


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
                f"{r['pred_busbw']:>10.2f} {pct(r['error']):>7}  {r['algo']:<20} {nm:>10}"
                + ("  noisy" if r.get("noisy") else "")
            )
        lines.extend(
            f"   noisy: {r['size']} B took {r['meas_us']:g} us out of place and {r['meas_inplace_us']:g} in place "
            f"(more than {NOISY_RATIO:g} x apart); left out of the error"
            for r in e["rows"]
            if r.get("noisy")
        )
        lines.append(
            f"   geomean error: large (>= 64 MiB) {pct(e['geomean_large'])}, small (<= 64 KiB) "
            f"{pct(e['geomean_small'])}"
        )
    skipped = [e for e in d["files"] if e["status"] != "ok"]
    if skipped:
        lines += ["", f"skipped ({len(skipped)}):"]
        lines.extend(f"   {skip_line(e)}" for e in skipped)
    g = d["geomean"]
    deg = sum(1 for e in d["files"] if e["degraded"])
    noisy_rows = sum(1 for e in d["files"] if not e["degraded"] for r in e["rows"] if r.get("noisy"))
    also = f"; {noisy_rows} noisy row{'s' * (noisy_rows != 1)} not counted" if noisy_rows else ""
    lines += [
        "",
        f"total over {g['tables']} tables ({deg} degraded and {len(skipped)} skipped left out{also}): geomean "
        f"error large {pct(g['large'])}, small {pct(g['small'])}",
    ]
    if profile_is_default(d):
        lines.append(
            f"NCCL's own model (allreduce rows): large {pct(g['nccl_model_large'])}, small {pct(g['nccl_model_small'])}"
        )
    return "\n".join(lines)


def profile_is_default(d: dict) -> bool:
    return str(d.get("profile", "")).startswith("auto")
