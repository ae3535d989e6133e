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
``--profile`` a calibration (what :func:`calibrate` writes) corrects those
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

**Calibration** (:func:`calibrate`) fits a
:class:`~treecoll.collectives.sim.profiles.Calibration`: the simulator's
defaults (NCCL's protocols, the fastest per size; NVLS with NCCL's constants)
corrected by parameters, each at its default unless fitted. Shared by every
algorithm: ``link_scale.nvlink`` / ``.pcie`` / ``.net`` on the bandwidth of
a link class, ``hop_scale.nvlink`` / ``.pci`` / ``.net`` on the latency of
one hop over a route class, ``hop_lat_us.net`` the network transport's
latency added to every hop over it (µs; once with LL and LL128, twice with
Simple and NVLS), ``proto_bw.ll`` / ``.ll128`` on the bandwidth LL and LL128
deliver, and the protocol switch points ``proto_max.ll`` / ``.ll128`` (the
largest message each protocol runs at).
Per algorithm family: ``lat_scale.ring`` / ``.tree`` / ``.nvls`` / ``.p2p``
on that family's latencies, ``bw_scale.tree`` / ``.nvls`` on its bandwidth
over the links'. A calibrated row is predicted as with the defaults, by the
fastest algorithm the simulator finds with the calibrated parameters; since
the links, the hops and the switch points are every family's, a latency
fitted on the rows of one family (the tree's small allreduce messages) moves
the others' (an all_gather's ring) alike. Only the factors the tables
identify move: a factor is identified when scaling it by :data:`PROBE`
changes by :data:`IDENTIFY` or more the predicted time of some fitted row that
can measure it (:func:`_identifies`: a link's bandwidth only ring and
point-to-point rows, a hop's latency every row, a family's factors only that
family's rows; a protocol's bandwidth only where the slope between two rows
of one table moves, :func:`_moves`); the others stay at their defaults and
the output says so (an added latency is probed from 0 to :data:`LAT_REF_US`,
:data:`LAT_PROBE`). A table without small messages fits its middle sizes
instead (where it shows a latency); a fitted move that buys less than
:data:`PRUNE` goes back to the default (:func:`_pruned`). The fit runs in
two stages: the ring and point-to-point rows fix the links, then every row
the hops and the families' factors; then the switch points are scanned
(:func:`_switch_points`: candidates where the measured curves step up, and
below each table's first size, each with its latencies fitted again).
The objective is the mean ``|ln(pred / meas)|`` of the time (the
geometric-mean error) over the fitted rows, each table's small and large
messages weighing alike, plus per parameter a prior × ``|ln(value /
default)|``: :data:`PRIOR` for the shared factors, the larger
:data:`HOST_HOP_PRIOR` for a hop within a host (NVLink, PCIe: what a table
across hosts shows goes to the network first, whose fabric and transport
differ between machines), the larger still :data:`FAMILY_PRIOR` for a
family's own (what one table shows goes to the shared physics first, so it
carries to the collectives the table did not run; across an InfiniBand
network, whose transport NCCL's network latencies describe, no transport
latency is added and the roles swap: every hop's latency pulls as a family's
own and a family's latency as the links, :data:`RDMA_FABRICS`), the small
:data:`SWITCH_PRIOR` for a switch point; each factor stays within
:func:`fit_bounds` (a hop within a host half to twice NCCL's per-hop
constants, the network's a quarter to four times; a file may say more). The fit rows:
at most :data:`FIT_ROWS` per table, half small and half large messages spread
over the sizes (every row of a table that has neither). The minimiser is a
pattern search over the logarithms (:func:`pattern_search`), run again when
the fitted values make another factor identified. During the fit the tree
runs only below :data:`~treecoll.collectives.sim.simulator.NCCL_TREE_RAIL_BYTES`
(its flow simulation takes seconds per larger size), and a row the tree runs
there with the defaults is left out of the fit and listed (:func:`_unfitted`:
the ring in its place would make the links fit the tree's time); the error printed after
the fit is that of a full validation with the calibration. Every algorithm's
time is simulated once per machine, collective, size and the parameters it
depends on (:func:`algorithm_time`), and shared by validation, calibration
and the fit.
``--profile profile.yaml`` then predicts other sizes, collectives and machine
scales with it (``treecoll simulate validate``, ``simulate allreduce``).

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
from treecoll.topo.fmt import fmt_bytes
from treecoll.topo.machines import MachineFlags, machine_topology

if TYPE_CHECKING:
    from treecoll.collectives.sim.profiles import Calibration, Profile
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
    "calibrate",
    "pattern_search",
    "fit_parameters",
    "fit_bounds",
    "calibration_from",
    "default_values",
    "render_calibration",
    "counted",
    "LARGE",
    "SMALL",
    "MAX_GPUS",
    "DEGRADED_FRACTION",
    "NOISY_RATIO",
    "noisy",
    "INDEX_NAME",
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
    key = (m.template, m.hosts, m.gpus_per_host, m.nic, m.gpu, repr(m.overrides))
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
    (:func:`treecoll.collectives.sim.simulator.simulate_nccl`; ``algos`` choose among allreduce's: the
    fastest of them, the first of equals); a :class:`Skip` for a collective the simulator refuses.
    Each algorithm's time comes from :func:`algorithm_time` (simulated once per machine, size and
    the factors it depends on)."""
    from treecoll.collectives.sim.simulator import simulate_nccl

    if len(topology.rank_gpus()) == 1:
        return 0.0, "-"
    names: list[str | None] = [None]  # another collective: the one family NCCL runs it with
    if collective == "allreduce":
        names = [a for a in algos if a in _offered(topology, collective, profile)]
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


def _offered(topology: Topology, collective: str, profile: Profile | str | None) -> tuple[str, ...]:
    """The NCCL algorithms :func:`~treecoll.collectives.sim.simulator.simulate_nccl` chooses among."""
    from treecoll.collectives.sim.nccl_model import nccl_algos

    proto = {"nccl-ll": "LL", "nccl-ll128": "LL128"}.get(profile) if isinstance(profile, str) else None
    offered = nccl_algos(topology, topology.rank_gpus(), proto, collective)
    return tuple(a for a in offered if a != "collnet" and (a != "nvls" or collective == "allreduce"))


#: ``(time s, label)`` or the refusal's message, by (topology, collective, size, NCCL algorithm, the part of
#: the profile that algorithm depends on): :func:`algorithm_time`'s memory, shared by validate and calibrate
_TIMES: dict[tuple, tuple[float, str] | str] = {}
#: entries :data:`_TIMES` keeps before it starts again (a fit adds a few thousand)
CACHE_ENTRIES = 1 << 18
#: simulations :func:`algorithm_time` ran (its cache misses), for the fit's statistics
_SIMULATIONS = [0]


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
        _SIMULATIONS[0] += 1
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


def _glitches(rows: Sequence[nccltests.Row]) -> set[int]:
    """The sizes of a table, at any size, that took more than :data:`SLOWER_RATIO` times the time of a size twice
    as large or more (:func:`slower_than_larger`'s rule, below 1 MiB too): a row a run slowed down once (an
    8-byte allreduce at 68.52 us between sizes at 25 us, its in-place run at 24.70), which the fit leaves out
    (a latency fitted to it would be the glitch's)."""
    return {a[0] for a, _ in _slower_pairs([(r.size, r.out_of_place.time_us) for r in rows], 0)}


def _noisy_sizes(rows: Sequence[nccltests.Row]) -> set[int]:
    """The sizes whose out-of-place and in-place times disagree (:func:`noisy`): left out of the fit as of
    the errors."""
    return {r.size for r in rows if noisy(r.out_of_place.time_us, _in_place_us(r))}


def _in_place_us(row: nccltests.Row) -> float | None:
    """A row's in-place time (us), None where the table printed one run only."""
    return row.in_place.time_us if row.in_place is not None else None


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
        for r in _row_sizes(case, keep):
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
def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def _where(e: dict) -> str:
    """A file entry's file, and its table (``#2``...) when the file holds several."""
    return f"{e['file']}#{e['table'] + 1}" if e.get("table") else str(e["file"])


def _title(e: dict) -> str:
    return f"== {_where(e)}: {e.get('collective') or '?'}, {e.get('nranks') or '?'} GPUs"


def _skip_line(e: dict) -> str:
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
                f"{r['pred_busbw']:>10.2f} {_pct(r['error']):>7}  {r['algo']:<20} {nm:>10}"
                + ("  noisy" if r.get("noisy") else "")
            )
        lines.extend(
            f"   noisy: {r['size']} B took {r['meas_us']:g} us out of place and {r['meas_inplace_us']:g} in place "
            f"(more than {NOISY_RATIO:g} x apart); left out of the error"
            for r in e["rows"]
            if r.get("noisy")
        )
        lines.append(
            f"   geomean error: large (>= 64 MiB) {_pct(e['geomean_large'])}, small (<= 64 KiB) "
            f"{_pct(e['geomean_small'])}"
        )
    skipped = [e for e in d["files"] if e["status"] != "ok"]
    if skipped:
        lines += ["", f"skipped ({len(skipped)}):"]
        lines.extend(f"   {_skip_line(e)}" for e in skipped)
    g = d["geomean"]
    deg = sum(1 for e in d["files"] if e["degraded"])
    noisy_rows = sum(1 for e in d["files"] if not e["degraded"] for r in e["rows"] if r.get("noisy"))
    also = f"; {noisy_rows} noisy row{'s' * (noisy_rows != 1)} not counted" if noisy_rows else ""
    lines += [
        "",
        f"total over {g['tables']} tables ({deg} degraded and {len(skipped)} skipped left out{also}): geomean "
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
#: rows per table the fit simulates: half of them small messages, half large, spread over the sizes
FIT_ROWS = 12
#: pull of every factor back to its default, per unit of ``|ln factor|``, against the objective (a mean
#: ``|ln(pred / meas)|``): a factor moves only where that buys a larger drop of the error. The factors
#: every algorithm shares (a link's bandwidth, a hop's latency) pull by :data:`PRIOR`, a family's own
#: (its latency and bandwidth) by :data:`FAMILY_PRIOR`: what one table shows is put on the shared
#: physics first, so it carries to the collectives the table did not run; a family's own factor moves
#: only for what the shared ones cannot explain
PRIOR = 0.01
FAMILY_PRIOR = 0.03
#: pull of a hop within a host (``hop_scale.nvlink``, ``.pci``) back to its default: more than the network's
#: (:data:`PRIOR`), less than a family's own. An NVLink or PCIe hop is a piece of silicon whose latency
#: differs little between machines, where the network's depends on its fabric and transport: a latency a
#: table across hosts shows goes to the network first (a table on one host has no network hop, and puts it
#: on the hops within the host), and the hops within a host take only what the network's cannot explain
HOST_HOP_PRIOR = 0.02
#: the NICs' link layers NCCL's own network latencies describe (NCCL 2.30 src/graph/tuning.cc hwLat NET, for its
#: InfiniBand verbs transport): there no transport latency is added to them (``hop_lat_us.net`` is not fitted),
#: and where the rows cross that network every hop's latency (``hop_scale``: NVLink, PCI and the network, all
#: NCCL's own measures there) pulls back as a family's own factor (:data:`FAMILY_PRIOR`) and a family's latency
#: (``lat_scale``) as the links (:data:`PRIOR`): a latency a table shows beyond NCCL's goes to the algorithm that
#: showed it (a run's own configuration of it), not to a hop the other algorithms share (:meth:`_Predictor.prior`);
#: on other fabrics (a plugin's RoCE, EFA, TCPX/TCPXO, Slingshot, sockets) the transport's
#: own latency is the fabric's and pulls by :data:`PRIOR`
RDMA_FABRICS = ("InfiniBand",)
#: the range the fit searches a hop's latency factor in, narrower than what a calibration file may say
#: (:data:`~treecoll.collectives.sim.profiles.HOP_BOUNDS`, :data:`~treecoll.collectives.sim.profiles.SCALE_BOUNDS`):
#: within a host half to twice NCCL's per-hop constants (NCCL 2.30 src/graph/tuning.cc hwLat: an NVLink hop
#: 0.6 us with LL, 3.4 us with Simple; never tens of µs), over the network a quarter to four times them;
#: a transport's own latency beyond that is the added ``hop_lat_us.net``, the same for every protocol
FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "hop_scale.nvlink": (0.5, 2.0),
    "hop_scale.pci": (0.5, 2.0),
    "hop_scale.net": (0.25, 4.0),
}
#: the scale of an added latency (``hop_lat_us``) in the fit, µs: it is searched, probed and pulled back to 0
#: in ``ln(1 + v / LAT_REF_US)`` (:func:`_coord`), the order of NCCL's own per-hop network latencies
LAT_REF_US = 10.0
#: pull of a protocol switch point back to the simulator's rule, per unit of ``|ln(bytes / default)|``
#: (:data:`~treecoll.collectives.sim.profiles.NO_SWITCH` for no switch point of its own)
SWITCH_PRIOR = 0.0005
#: a fitted parameter goes back to its default when that raises the objective by less than this (a mean
#: ``|ln(pred / meas)|``: 0.1%), about what nccl-tests' two printed decimals leave in a small row's time
PRUNE = 0.001
#: candidate switch points per protocol (:func:`_bends`), each with its latencies fitted again
SWITCH_CANDIDATES = 3
#: a factor is identified by the tables when scaling it by :data:`PROBE` (or its inverse) changes some
#: row's predicted time by :data:`IDENTIFY` or more: the row's time depends on it, not only in its last
#: digits (a latency is identified by latency-bound rows, a link's bandwidth by bandwidth-bound ones)
PROBE = 1.25
IDENTIFY = 0.05
#: the probe of a protocol's bandwidth (``proto_bw``): LL on the few channels NCCL gives a small message moves
#: a fraction of the links' bandwidth, and a row shows it only where that fraction is small (a factor
#: of :data:`PROBE` on LL's default rate moves a small row by a few percent)
PROTO_BW_PROBE = 4.0
#: the probe of an added latency (``hop_lat_us``), in its coordinate ``ln(1 + v / LAT_REF_US)`` (:func:`_coord`):
#: from 0 to :data:`LAT_REF_US`, the order of NCCL's own per-hop network latency; a transport that adds
#: tens of µs per hop shows in rows of a hundred µs, which :data:`PROBE`'s 2.5 µs would leave below
#: :data:`IDENTIFY`
LAT_PROBE = 2.0
#: a middle size measures a latency where the time to the next size grows by less than this fraction of the
#: bytes' growth (log-log slope; :func:`_flat_rows`)
FLAT_SLOPE = 0.5
#: the algorithm family of each NCCL algorithm name (:data:`~treecoll.collectives.sim.profiles.FAMILIES`)
ALGO_FAMILY = {"ring": "ring", "pat": "ring", "tree": "tree", "nvls": "nvls", "p2p": "p2p"}


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
    table: str = ""
    group: str = "small"  # small, large or mid: the fit's objective weighs each (table, group) alike
    latency_only: bool = False  # a middle size fitted in place of small messages: it measures latencies only


def _spread(rows: list, n: int | None) -> list:
    """At most ``n`` of ``rows`` (sorted by size), evenly spread over the list, the first and last kept."""
    if n is None or len(rows) <= n:
        return rows
    if n <= 1:
        return rows[-1:]
    idx = sorted({round(i * (len(rows) - 1) / (n - 1)) for i in range(n)})
    return [rows[i] for i in idx]


def _group(size: int) -> str:
    return "small" if size <= SMALL else "large" if size >= LARGE else "mid"


def _fit_rows(
    cs: list[Case],
    flags: MachineFlags | None,
    max_gpus: int | None,
    collective: str | None,
    max_rows: int | None = None,
) -> tuple[list[_FitRow], list[dict], list[dict]]:
    """The rows to fit (:class:`_FitRow`), the tables skipped (``{"file", "reason"}``) and the rows left out of
    the fit (``{"file", "sizes", "reason"}``: :func:`_unfitted`)."""
    from treecoll.collectives.sim.simulator import NCCL_TREE_RAIL_BYTES

    rows, skipped, left_out = [], [], []
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
        if len(topo.rank_gpus()) < 2:
            skipped.append({"file": c.label, "reason": "one GPU: nothing to fit"})
            continue
        algos = tuple(algorithms(c, coll, topo)[0])
        every_row = _row_sizes(c, None)
        glitches = _glitches(every_row)
        if glitches:
            left_out.append({"file": c.label, "sizes": sorted(glitches), "reason": GLITCH_REASON})
        noisy_sizes = _noisy_sizes(every_row) - glitches
        if noisy_sizes:
            left_out.append({"file": c.label, "sizes": sorted(noisy_sizes), "reason": NOISY_REASON})
        glitches |= noisy_sizes
        counted_rows = [r for r in _row_sizes(c, counted) if r.size not in glitches]
        half = None if max_rows is None else max(1, max_rows // 2)
        small = [r for r in counted_rows if r.size <= SMALL]
        # a table without small messages shows its latency in its middle sizes where its curve is flat: those
        # rows too (the large ones alone cannot tell a latency from a bandwidth)
        mid = [] if small else [r for r in _flat_rows(every_row) if r.size not in glitches]
        picked = (
            _spread(small, half) + _spread(mid, half) + _spread([r for r in counted_rows if r.size >= LARGE], half)
            if counted_rows
            else _spread([r for r in every_row if r.size not in glitches], max_rows)  # neither: as they are
        )
        unfitted = []
        for r in picked:
            use = tuple(a for a in algos if a != "tree" or r.size < NCCL_TREE_RAIL_BYTES) or algos
            meas = r.out_of_place.time_us * 1e-6
            row = _FitRow(topo, coll, r.size, use, meas, c.label, _group(r.size), r in mid)
            if _unfitted(row, algos):
                unfitted.append(r.size)
                continue
            rows.append(row)
        if unfitted:
            left_out.append({"file": c.label, "sizes": unfitted, "reason": UNFITTED_REASON})
    return rows, skipped, left_out


#: why :func:`_glitches` leaves a row out of the fit
GLITCH_REASON = (
    f"slower than {SLOWER_RATIO:g} x the time of a size twice as large or more: the run slowed down there once "
    "(the bytes only grow)"
)
#: why :func:`_noisy_sizes` leaves a row out of the fit
NOISY_REASON = f"out of place and in place more than {NOISY_RATIO:g} x apart: one of the two runs was slowed down"
#: why :func:`_unfitted` leaves a row out of the fit
UNFITTED_REASON = (
    "NCCL's tree is the fastest there with the defaults, and the fit does not simulate the tree from "
    "4 MiB on (its flow simulation takes about a second per size): the ring in its place would make the links "
    "fit the tree's time"
)


def _unfitted(row: _FitRow, algos: Sequence[str]) -> bool:
    """Whether an allreduce row is left out of the fit: an algorithm of ``algos`` the fit does not run at its size
    (the tree from :data:`~treecoll.collectives.sim.simulator.NCCL_TREE_RAIL_BYTES` on) is the fastest there
    with the defaults, as the prediction runs it. Fitted with the algorithms left (the ring), the row would
    ask the links for the tree's time: a 2-host allreduce over TCPXO reaches 338.8 GB/s busbw at 8 GiB, which
    NCCL's tree gives over 8 x 200 Gb/s NICs per host (each host sends and receives the message once:
    up to 375 GB/s busbw on 16 GPUs) and a ring does not (each ring crosses each host's NICs with
    2 x 15/16 of it: up to 200 GB/s), and fitting it with the ring had made both link classes twice as fast."""
    missing = [a for a in algos if a not in row.algos]
    if row.collective != "allreduce" or not missing:
        return False
    defaults = calibration_from({})
    times = {a: algorithm_time(row.topology, row.collective, row.size, a, defaults) for a in algos}
    ok = [(t[0], a) for a, t in times.items() if not isinstance(t, str)]
    return bool(ok) and min(ok)[1] in missing


def _flat_rows(rows: list[nccltests.Row]) -> list[nccltests.Row]:
    """The middle-size rows (between :data:`SMALL` and :data:`LARGE`) where the measured curve is flat: the
    time to the next size grows by less than :data:`FLAT_SLOPE` of the bytes' growth (log-log slope), so
    the time is mostly latency (a slope near 1 is bandwidth, which a latency fitted there would fake)."""
    ok = sorted(rows, key=lambda r: r.size)
    return [
        a
        for a, b in zip(ok, ok[1:])
        if SMALL < a.size < LARGE
        and math.log(b.out_of_place.time_us / a.out_of_place.time_us) / math.log(b.size / a.size) < FLAT_SLOPE
    ]


def _row_algos(row: _FitRow) -> list[str | None]:
    """The NCCL algorithms the row's prediction takes the fastest of, as :func:`predict` does: for
    allreduce the row's, for the other collectives None (the one family NCCL runs them with)."""
    if row.collective != "allreduce":
        return [None]
    return [a for a in row.algos if a in ALGO_FAMILY]


class _Predictor:
    """Predicted times of the fit rows for given factors, each (row, algorithm) simulated once per value of
    the factors it depends on (its family's latency factor and the link factors: :func:`algorithm_time`)."""

    def __init__(self, rows: list[_FitRow]):
        self.rows = rows
        self.algos = [_row_algos(r) for r in rows]
        self.simulations = 0
        self.infiniband = _infiniband_only(rows)
        # the rows cross an InfiniBand network (a table on one host of an InfiniBand machine does not)
        self.across_infiniband = self.infiniband and any(_hosts(r.topology) > 1 for r in rows)

    def prior(self, parameter: str) -> float:
        """The pull of ``parameter`` back to its default on these rows' machines (:func:`_prior`); where every
        NIC is InfiniBand (:data:`RDMA_FABRICS`) and rows cross the network, every hop's latency (``hop_scale``)
        pulls as a family's own (:data:`FAMILY_PRIOR`) and a family's latency (``lat_scale``) as the links
        (:data:`PRIOR`): there every per-hop latency is NCCL's own measure (tuning.cc hwLat NVLINK, PCI and
        NET, the last for its verbs transport), and a latency a table shows beyond them goes to the
        algorithm that showed it first (a run's own configuration of it: its channels, NCCL_MIN_CTAS, ...),
        not to a hop the other algorithms share."""
        if self.across_infiniband and parameter.startswith("hop_scale."):
            return FAMILY_PRIOR
        if self.across_infiniband and parameter.startswith("lat_scale."):
            return PRIOR
        return _prior(parameter)

    def _time(self, i: int, algo: str | None, values: dict[str, float]) -> float:
        r = self.rows[i]
        before = _SIMULATIONS[0]
        out = algorithm_time(r.topology, r.collective, r.size, algo, calibration_from(values))
        self.simulations += _SIMULATIONS[0] - before
        return math.inf if isinstance(out, str) else out[0]

    def times(self, values: dict[str, float]) -> list[float]:
        """The predicted time (s) of every row: the fastest of its families."""
        return [min(self._time(i, a, values) for a in algos) for i, algos in enumerate(self.algos)]

    def error(self, values: dict[str, float]) -> float:
        """The mean over (table, size group) of the mean ``|ln(pred / meas)|`` of its rows."""
        groups: dict[tuple[str, str], list[float]] = {}
        for r, t in zip(self.rows, self.times(values)):
            if 0 < t < math.inf:
                groups.setdefault((r.table, r.group), []).append(abs(math.log(t / r.meas)))
        return sum(sum(v) / len(v) for v in groups.values()) / len(groups) if groups else 0.0


def _hosts(topology: Any) -> int:
    """How many hosts the ranks of ``topology`` are on."""
    return len({topology.host_of(g) for g in topology.rank_gpus()})


def _infiniband_only(rows: list[_FitRow]) -> bool:
    """Whether the rows' machines have NICs and every NIC's link layer is one of :data:`RDMA_FABRICS`."""
    layers = {r.topology.node(n).get("link_layer") for r in rows for n in r.topology.nodes("nic")}
    return bool(layers) and layers <= set(RDMA_FABRICS)


def calibration_from(
    values: dict[str, float], name: str = "calibrated", source: str = "", fitted: Sequence[str] = ()
) -> Calibration:
    """A :class:`~treecoll.collectives.sim.profiles.Calibration` of ``values`` (parameter name -> value,
    names of :func:`default_values`; absent ones and ones at their default are left out: the default)."""
    from treecoll.collectives.sim.profiles import Calibration

    defaults = default_values()
    scales: dict[str, dict[str, float]] = {}
    for k, v in values.items():
        if v != defaults[k]:
            fld, _, key = k.partition(".")
            scales.setdefault(fld, {})[key] = round(v) if fld == "proto_max" else v
    return Calibration(name, source=source, fitted=tuple(fitted), **scales)


def default_values() -> dict[str, float]:
    """Every parameter at its default (:func:`~treecoll.collectives.sim.profiles.parameter_default`):
    each factor 1 and each added latency 0
    (:func:`~treecoll.collectives.sim.profiles.calibration_parameters`), each protocol switch point
    (:func:`~treecoll.collectives.sim.profiles.switch_parameters`) none of its own
    (:data:`~treecoll.collectives.sim.profiles.NO_SWITCH`: the simulator's rule)."""
    from treecoll.collectives.sim.profiles import calibration_parameters, parameter_default, switch_parameters

    return {k: parameter_default(k) for k in (*calibration_parameters(), *switch_parameters())}


def fit_bounds() -> dict[str, tuple[float, float]]:
    """Every continuous calibration parameter with the range the fit searches it in: its bounds
    (:func:`~treecoll.collectives.sim.profiles.calibration_parameters`), the hops' narrowed to
    :data:`FIT_BOUNDS`.

    >>> fit_bounds()["hop_scale.nvlink"], fit_bounds()["link_scale.net"]
    ((0.5, 2.0), (0.1, 2.0))
    """
    from treecoll.collectives.sim.profiles import calibration_parameters

    return {**calibration_parameters(), **FIT_BOUNDS}


def _identified(pred: _Predictor, values: dict[str, float], candidates: list[str]) -> list[str]:
    """The ``candidates`` whose scaling by :data:`PROBE` (up or down) changes some row's predicted time
    by :data:`IDENTIFY` or more."""
    bounds = fit_bounds()
    base = pred.times(values)
    out = []
    for k in candidates:
        lo, hi = bounds[k]
        seen = [_identifies(k, algos, r) for r, algos in zip(pred.rows, pred.algos)]
        for f in (_probe(k), 1 / _probe(k)):
            trial = dict(values, **{k: min(max(_from_coord(k, _coord(k, values[k]) + math.log(f)), lo), hi)})
            moved = {
                i: math.log(a / b)
                for i, (a, b, s) in enumerate(zip(pred.times(trial), base, seen))
                if s and 0 < b < math.inf and 0 < a < math.inf
            }
            if _moves(k, moved, pred.rows):
                out.append(k)
                break
    return out


def _moves(parameter: str, moved: dict[int, float], rows: list[_FitRow]) -> bool:
    """Whether the probe's changes ``moved`` (row index -> ``ln(trial / base)`` of its time) identify
    ``parameter``: some row moved by :data:`IDENTIFY` or more; for a protocol's bandwidth (``proto_bw``)
    the slope between two rows of one table and size group (the time one more byte takes, which a
    latency leaves alone), so that one small row cannot trade it for a latency."""
    bar = math.log(1 + IDENTIFY)
    if not parameter.startswith("proto_bw."):
        return any(abs(m) >= bar for m in moved.values())
    by: dict[tuple[str, str], list[float]] = {}
    for i, m in moved.items():
        by.setdefault((rows[i].table, rows[i].group), []).append(m)
    return any(len(v) > 1 and max(v) - min(v) >= bar for v in by.values())


def _probe(parameter: str) -> float:
    """The factor :func:`_identified` scales ``parameter`` by (in its coordinate, :func:`_coord`)."""
    fld = parameter.partition(".")[0]
    return {"proto_bw": PROTO_BW_PROBE, "hop_lat_us": LAT_PROBE}.get(fld, PROBE)


def _families(algos: list[str | None], collective: str) -> set[str]:
    """The algorithm families of ``algos`` (None: the one NCCL runs ``collective`` with)."""
    from treecoll.collectives.sim.simulator import P2P_COLLECTIVES

    other = "p2p" if collective in P2P_COLLECTIVES else "ring"
    return {ALGO_FAMILY[a] if a is not None else other for a in algos}


def _identifies(parameter: str, algos: list[str | None], row: _FitRow) -> bool:
    """Whether a row run by ``algos`` can identify ``parameter``: a link's bandwidth only a ring's or a
    point-to-point row (the bytes over the links and nothing else; a tree's or NVLS's bandwidth also
    carries that family's own efficiency, ``bw_scale``), a family's factors only that family's rows;
    a bandwidth (``link_scale``, ``bw_scale``) only a row above the small messages (<= 64 KiB: there
    the time is mostly latency, and a bandwidth fitted to it is a latency in disguise), nor a middle
    size fitted in place of small messages (``latency_only``)."""
    families = _families(algos, row.collective)
    fld, _, key = parameter.partition(".")
    if fld in ("hop_scale", "hop_lat_us"):  # a hop's latency: every family's rows
        return True
    if fld == "proto_bw":  # LL's and LL128's bandwidth: where they run, the small messages first
        return bool(families - {"nvls"}) and not row.latency_only
    if fld != "lat_scale" and (row.group == "small" or row.latency_only):
        return False
    return bool(families & {"ring", "p2p"}) if fld == "link_scale" else key in families


def fit_parameters(
    rows: list[_FitRow], *, tol: float = 0.002, max_evals: int = 400, rounds: int = 3
) -> tuple[dict[str, float], dict[str, Any]]:
    """The calibration parameters that minimise :func:`_objective` (:meth:`_Predictor.error` plus each
    parameter's prior × ``|ln(value / default)|``) over ``rows``, and fit statistics. Only the factors
    the rows identify
    (:func:`_identified`, at the defaults, then again at the fitted values: up to ``rounds`` rounds)
    move, each within its bounds
    (:data:`~treecoll.collectives.sim.profiles.SCALE_BOUNDS`), by :func:`pattern_search` over their
    logarithms, the shared factors before the families' own (:func:`_search_shared_first`); every
    other factor keeps its default (1). Two stages: the rows run by a ring or point-to-point fix the
    links (and the hops and those families' latencies), then every row the hops and the families'
    factors on top of those links (a tree's or NVLS's bandwidth is the links' times its own factor:
    :func:`_identifies`). Then the protocol switch points (:func:`_switch_points`), each candidate
    with every latency and family factor fitted again."""
    bounds = fit_bounds()
    pred = _Predictor(rows)
    values = default_values()
    before = pred.error(values)
    # the links from the small and large messages a ring or point-to-point runs; a table's middle sizes (fitted
    # where it has no small ones) show its latency on top of those links, and join in the second stage
    plain = _Predictor(
        [r for r, a in zip(rows, pred.algos) if _families(a, r.collective) <= {"ring", "p2p"} and not r.latency_only]
    )
    free: list[str] = []
    calls = 0
    # on InfiniBand NCCL's network latencies are the transport's own: no latency is added to them
    candidates = {k for k in bounds if not (pred.infiniband and k.startswith("hop_lat_us."))}
    for stage, allowed in ((plain, candidates), (pred, {k for k in candidates if not k.startswith("link_scale.")})):
        moving: list[str] = []
        for _ in range(rounds if stage.rows else 0):
            new = _identified(stage, values, [k for k in bounds if k not in free and k in allowed])
            if not new:
                break
            free += new
            moving += new
            values, n = _search_shared_first(stage, values, moving, bounds, tol, max_evals)
            calls += n
    latencies = [k for k in free if not k.startswith("link_scale.")]
    defaults = default_values()

    def refit(v: dict[str, float]) -> tuple[dict[str, float], int]:
        # from the latencies fitted without the switch point and from the defaults: the first may sit where
        # they made up for a protocol the switch point now stops (a coordinate search stays there)
        starts = (v, dict(v, **{k: defaults[k] for k in latencies}))
        fits = [_search_shared_first(pred, start, latencies, bounds, tol, max_evals) for start in starts]
        return min(fits, key=lambda f: _objective(pred, f[0]))[0], sum(f[1] for f in fits)

    values, n = _switch_points(pred, values, refit)
    calls += n
    values, n = _pruned(pred, values, [k for k in free if not k.startswith("proto_max.")], latencies, tol, max_evals)
    calls += n
    defaults = default_values()
    switches = [k for k in defaults if k.startswith("proto_max.")]
    fitted = [k for k in free + switches if values[k] != defaults[k]]
    return values, {
        "fitted": fitted,
        "identified_default": [k for k in free if k not in fitted],
        "switch_default": [k for k in switches if k not in fitted],
        "not_identified": [k for k in bounds if k in candidates and k not in free],
        "infiniband_default": sorted(set(bounds) - candidates),
        "rows": len(rows),
        "tables": len({r.table for r in rows}),
        "evaluations": calls,
        "simulations": pred.simulations + plain.simulations,
        "error_before": math.exp(before) - 1,
        "error_after": math.exp(pred.error(values)) - 1,
    }


def _pruned(
    pred: _Predictor,
    values: dict[str, float],
    names: list[str],
    shared: list[str],
    tol: float,
    max_evals: int,
) -> tuple[dict[str, float], int]:
    """``values`` with each of ``names`` back at its default where moving it bought less than :data:`PRUNE`
    of the objective (:func:`_objective`): a move the rows' printed precision makes, not their physics.
    A family's own factor is tried with the shared factors of ``shared`` fitted again without it (what
    it took may be theirs: a coordinate search can stop with both moved). Returns the values and the
    evaluations."""
    defaults = default_values()
    best, calls = _objective(pred, values), 1
    for k in sorted(names, key=pred.prior, reverse=True):  # the families' own first, then the hops within a host
        if values[k] == defaults[k]:
            continue
        trial = dict(values, **{k: defaults[k]})
        others = [x for x in shared if pred.prior(x) < pred.prior(k) and trial[x] != defaults[x]]
        if others:
            trial, n = _search(pred, trial, others, fit_bounds(), tol, max_evals)
            calls += n
        v = _objective(pred, trial)
        calls += 1
        if v < best + PRUNE:
            values, best = trial, min(best, v)
    return values, calls


def _prior(parameter: str) -> float:
    """The pull of ``parameter`` back to its default: :data:`PRIOR`, :data:`HOST_HOP_PRIOR`,
    :data:`FAMILY_PRIOR` or :data:`SWITCH_PRIOR`."""
    if parameter in ("hop_scale.nvlink", "hop_scale.pci"):
        return HOST_HOP_PRIOR
    fld = parameter.partition(".")[0]
    shared = {"link_scale", "hop_scale", "hop_lat_us", "proto_bw"}
    return PRIOR if fld in shared else SWITCH_PRIOR if fld == "proto_max" else FAMILY_PRIOR


def _objective(pred: _Predictor, values: dict[str, float]) -> float:
    """The fit's objective: :meth:`_Predictor.error` plus each parameter's prior (:func:`_prior`) times
    ``|ln(value / default)|``."""
    defaults = default_values()
    return pred.error(values) + sum(
        pred.prior(k) * abs(_coord(k, v) - _coord(k, defaults[k])) for k, v in values.items() if v != defaults[k]
    )


def _switch_points(
    pred: _Predictor, values: dict[str, float], refit: Callable[[dict[str, float]], tuple[dict[str, float], int]]
) -> tuple[dict[str, float], int]:
    """``values`` with each protocol switch point (``proto_max.ll``, then ``proto_max.ll128``) set to the
    one of least objective (:func:`_objective`) among none of its own and the candidates
    :func:`_bends` finds where the measured curves step up and below each table's first size, each candidate
    with the latencies fitted
    again for it (``refit``: values -> (values, evaluations)), since a protocol that stops running
    changes which latencies the rows show; LL128's switch point is not below LL's (NCCL runs LL on the
    smallest messages, LL128 on the next), and LL's not above
    :data:`~treecoll.collectives.sim.simulator.LL_MAX_BYTES` (half the bandwidth: NCCL never runs it
    there). Returns the values and the evaluations."""
    from treecoll.collectives.sim.profiles import switch_parameters
    from treecoll.collectives.sim.simulator import LL_MAX_BYTES

    calls, floor = 0, 0.0
    candidates = _bends(pred.rows)
    for k in switch_parameters():  # LL, then LL128
        best, best_values = _objective(pred, values), values
        calls += 1
        for c in candidates:
            if c < floor or (k == "proto_max.ll" and c > LL_MAX_BYTES):  # LL never runs above the simulator's rule
                continue
            trial, n = refit(dict(values, **{k: float(c)}))
            v = _objective(pred, trial)
            calls += n + 1
            if v < best - 1e-12:
                best, best_values = v, trial
        values = best_values
        floor = min(values[k], LL_MAX_BYTES)
    return values, calls


def _bends(rows: list[_FitRow]) -> list[int]:
    """Where the measured curves step up, as candidate protocol switch points (bytes), the sharpest first:
    per table, between each two consecutive fitted sizes ``a < b``, the local slope ``ln(t_b / t_a) /
    ln(b / a)`` of the measured time (0 where latency holds it, 1 where bandwidth does) less the larger
    of its neighbours' slopes; a protocol that stops running shows as a slope above both (the time
    steps up to the next protocol's latency and then flattens). The point is ``sqrt(a b)`` rounded
    down (every point between ``a`` and ``b`` predicts the fitted rows alike); at most
    :data:`SWITCH_CANDIDATES` of them, each above 0 and within
    :data:`~treecoll.collectives.sim.profiles.SWITCH_BOUNDS`. Then, per table, a point below its smallest
    fitted size ``a`` (``a / sqrt(2)``, between it and the size nccl-tests would print before it): the
    protocol runs at none of the table's sizes, which no bend shows (a table from 1 MiB on whose time stays
    flat at Simple's latency, where LL would be several times faster)."""
    from treecoll.collectives.sim.profiles import SWITCH_BOUNDS

    by_table: dict[str, dict[int, float]] = {}
    for r in rows:
        by_table.setdefault(r.table, {})[r.size] = r.meas
    bend: dict[int, float] = {}
    for curve in by_table.values():
        sizes = sorted(curve)
        slopes = [math.log(curve[b] / curve[a]) / math.log(b / a) for a, b in zip(sizes, sizes[1:])]
        for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
            around = [slopes[j] for j in (i - 1, i + 1) if 0 <= j < len(slopes)]
            excess = slopes[i] - max(around, default=0.0)
            point = int(math.sqrt(a * b))
            if excess > 0 and SWITCH_BOUNDS[0] <= point < SWITCH_BOUNDS[1]:
                bend[point] = max(bend.get(point, 0.0), excess)
    sharpest = sorted(bend, key=lambda p: -bend[p])[:SWITCH_CANDIDATES]
    below = sorted({int(min(curve) / math.sqrt(2)) for curve in by_table.values()})
    return sharpest + [p for p in below if SWITCH_BOUNDS[0] <= p and p not in sharpest]


def _search_shared_first(
    pred: _Predictor, values: dict[str, float], names: list[str], bounds: dict, tol: float, max_evals: int
) -> tuple[dict[str, float], int]:
    """:func:`_search` over the factors of ``names`` shared by every machine's network (:data:`PRIOR`), then
    with the hops within a host (:data:`HOST_HOP_PRIOR`), then over all of them: the hops within a host
    take what the network leaves, the families' own factors what both leave (a coordinate search
    started at the defaults could otherwise stop at a factor the prior weighs more)."""
    calls = 0
    for level in sorted({pred.prior(k) for k in names}):
        group = [k for k in names if pred.prior(k) <= level]
        if group:
            values, n = _search(pred, values, group, bounds, tol, max_evals)
            calls += n
    return values, calls


def _search(
    pred: _Predictor, values: dict[str, float], names: list[str], bounds: dict, tol: float, max_evals: int
) -> tuple[dict[str, float], int]:
    """``values`` with ``names`` moved by :func:`pattern_search` over their logarithms to the least
    error plus prior, and the calls it took."""

    def f(x: list[float]) -> float:
        return _objective(pred, dict(values, **{k: _from_coord(k, y) for k, y in zip(names, x)}))

    start = [_coord(k, values[k]) for k in names]
    x, _, n = pattern_search(
        f,
        start,
        tol=tol,
        max_evals=max_evals,
        bounds=[(_coord(k, bounds[k][0]), _coord(k, bounds[k][1])) for k in names],
    )
    return dict(values, **{k: _snapped(k, y, values[k], x0) for k, y, x0 in zip(names, x, start)}), n


def _snapped(parameter: str, x: float, v0: float, x0: float) -> float:
    """The value at coordinate ``x`` of a search that started at ``v0`` (coordinate ``x0``): ``v0`` or the
    default where ``x`` came back to either (not their round trip through the coordinate's rounding)."""
    from treecoll.collectives.sim.profiles import parameter_default

    default = parameter_default(parameter)
    if abs(x - _coord(parameter, default)) < 1e-9:
        return default
    return v0 if abs(x - x0) < 1e-9 else _from_coord(parameter, x)


def _coord(parameter: str, v: float) -> float:
    """The coordinate the fit searches ``parameter`` in: a factor's or a switch point's logarithm, an added
    latency's ``ln(1 + v / LAT_REF_US)`` (0 at its default, a factor's scale far from it)."""
    if parameter.startswith("hop_lat_us."):
        return math.log1p(v / LAT_REF_US)
    return math.log(v)


def _from_coord(parameter: str, x: float) -> float:
    """The value of ``parameter`` at coordinate ``x`` (:func:`_coord`'s inverse)."""
    if parameter.startswith("hop_lat_us."):
        return LAT_REF_US * math.expm1(x)
    return math.exp(x)


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
    """Fit a calibration to the tables of ``paths``: ``{"profile": Calibration, "values", "fit", "skipped",
    "left_out", "before", "after"}`` (``left_out``: rows not fitted, per table, :func:`_unfitted`;
    ``before``/``after``: :func:`validate` with the defaults and with the fitted
    calibration, when ``check``). ``max_rows``: rows fitted per table, spread over its sizes. Raises
    :class:`~treecoll.topo.errors.CollectiveError` when no row can be fitted."""
    paths = [Path(p) for p in paths]
    cs, bad = cases(paths)
    rows, skipped, left_out = _fit_rows(cs, flags, max_gpus, collective, max_rows)
    skipped += [{"file": b["file"], "reason": b["reason"]} for b in bad]
    if not rows:
        why = "; ".join(_skip_line(s) for s in skipped) or "no rows"
        raise CollectiveError(f"calibrate: no table row to fit ({why})")
    values, stats = fit_parameters(rows, tol=tol)
    src = "treecoll simulate calibrate on " + ", ".join(p.name for p in paths)
    prof = calibration_from(values, name, src, stats["fitted"])
    out = {"profile": prof, "values": values, "fit": stats, "skipped": skipped, "left_out": left_out}
    if check:  # the rows the errors count, of every table fitted (a slow machine's own profile: degraded too)
        for key, p in (("before", None), ("after", prof)):
            files = validate(paths, p, flags, max_gpus, collective, keep=counted)["files"]
            out[key] = totals([e for e in files if e.get("health") != "degraded"], degraded_too=True)
    return out


def _value_text(parameter: str, v: float) -> str:
    """A factor with three decimals; a protocol switch point in bytes (``none``: the simulator's rule)."""
    from treecoll.collectives.sim.profiles import NO_SWITCH

    if parameter.startswith("proto_max."):
        return "none" if v >= NO_SWITCH else f"{int(v)}"
    return f"{v:.3f}"


def _not_identified(parameter: str) -> str:
    """Why a parameter was not identified: the probe (:func:`_probe`) and what it did not move."""
    if parameter.startswith("proto_bw."):
        return f"x{PROTO_BW_PROBE:g} moves no slope between two rows of a table by {IDENTIFY:.0%}"
    if parameter.startswith("hop_lat_us."):
        return f"+{LAT_REF_US * (LAT_PROBE - 1):g} us moves no row by {IDENTIFY:.0%}"
    return f"x{PROBE:g} moves no row that measures it by {IDENTIFY:.0%}"


def render_calibration(d: dict) -> str:
    """The text of ``treecoll simulate calibrate``."""
    f = d["fit"]
    lines = [
        f"fitted on {f['rows']} rows of {f['tables']} tables ({f['evaluations']} evaluations, "
        f"{f['simulations']} simulations); objective: mean |ln(pred/meas)| of the times per table and size "
        f"group, {_pct(f['error_before']).strip()} with the defaults, {_pct(f['error_after']).strip()} fitted",
        "parameters (factors: 1 = the simulator's default; link_scale on the links' bandwidth, hop_scale on a "
        "hop's latency, lat_scale on a family's latencies, bw_scale on a family's bandwidth over the links', "
        "proto_bw on LL's and LL128's bandwidth; hop_lat_us: µs the network's transport adds per hop, default 0; "
        "proto_max: the largest message in bytes a protocol runs at):",
    ]
    why = {
        **dict.fromkeys(f.get("switch_default", ()), "default kept: no protocol switch between the sizes fits better"),
        **dict.fromkeys(f["fitted"], "fitted"),
        **dict.fromkeys(f["identified_default"], "default kept: these tables depend on it, moving it gains nothing"),
        **{k: f"default kept: not identified ({_not_identified(k)})" for k in f["not_identified"]},
        **dict.fromkeys(
            f.get("infiniband_default", ()), "default kept: InfiniBand (NCCL's network latencies are its transport's)"
        ),
    }
    for k, v in d["values"].items():
        lines.append(f"   {k:<18} {_value_text(k, v):>7}   {why.get(k, '')}")
    for label in ("before", "after"):
        if label in d:
            g = d[label]
            lines.append(
                f"geomean busbw error {label:<6} ({'defaults' if label == 'before' else 'calibrated'}): "
                f"large {_pct(g['large'])}, small {_pct(g['small'])} over {g['tables']} tables"
            )
    worse = [k for k in ("large", "small") if "after" in d and (d["after"][k] or 0) > (d["before"][k] or 0)]
    if worse:
        lines.append(
            f"warning: the calibration predicts these tables worse than the defaults ({', '.join(worse)} "
            f"messages): the fit weighs every table and size group alike; check the rows with validate"
        )
    lines.extend(f"skipped {s['file']}: {s['reason']}" for s in d["skipped"])
    lines.extend(
        f"not fitted: {x['file']} at {', '.join(fmt_bytes(n) for n in x['sizes'])}: {x['reason']}"
        for x in d.get("left_out", ())
    )
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
    from treecoll.tools.units import UsageError
    from treecoll.topo.files import check_file

    for f in args.files:
        check_file(f, "nccl-tests output", error=UsageError)
    if args.sim_command == "validate":
        prof = None
        if args.profile not in (None, "auto"):
            from treecoll.collectives.sim.profiles import get_profile

            prof = get_profile(args.profile)
        d = validate(args.files, prof, flags, max_gpus, args.collective, progress=_progress)
        _progress(1, 1, "")
        emit(args, d, render)
        return 0 if any(e["status"] == "ok" for e in d["files"]) else 1
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
