"""Calibration of the simulator on a user's nccl-tests tables: ``treecoll simulate calibrate``
(the command line: :mod:`treecoll.tools.cmd_validate`; the tables are read and predicted as
:mod:`treecoll.tools.validation` reads and predicts them).

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
depends on (:func:`~treecoll.tools.validation.algorithm_time`), and shared by validation, calibration
and the fit.
``--profile profile.yaml`` then predicts other sizes, collectives and machine
scales with it (``treecoll simulate validate``, ``simulate allreduce``).


>>> pattern_search(lambda x: (x[0] - 1.0) ** 2 + (x[1] + 0.5) ** 2, [0.0, 0.0], step=1.0, tol=1e-4)[0]
[1.0, -0.5]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from treecoll.collectives.sim import nccltests
from treecoll.tools.validation import (
    ALGO_FAMILY,
    LARGE,
    MAX_GPUS,
    NOISY_RATIO,
    SIMULATIONS,
    SLOWER_RATIO,
    SMALL,
    Case,
    Skip,
    algorithm_time,
    algorithms,
    cases,
    collective_of,
    counted,
    glitch_sizes,
    noisy_row_sizes,
    pct,
    row_sizes,
    skip_line,
    topology_for,
    totals,
    validate,
)
from treecoll.topo.errors import CollectiveError
from treecoll.topo.fmt import fmt_bytes
from treecoll.topo.machines import MachineFlags

if TYPE_CHECKING:
    from treecoll.collectives.sim.profiles import Calibration

__all__ = [
    "calibrate",
    "pattern_search",
    "fit_parameters",
    "fit_bounds",
    "calibration_from",
    "default_values",
    "render_calibration",
]

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
        every_row = row_sizes(c, None)
        glitches = glitch_sizes(every_row)
        if glitches:
            left_out.append({"file": c.label, "sizes": sorted(glitches), "reason": GLITCH_REASON})
        noisy_sizes = noisy_row_sizes(every_row) - glitches
        if noisy_sizes:
            left_out.append({"file": c.label, "sizes": sorted(noisy_sizes), "reason": NOISY_REASON})
        glitches |= noisy_sizes
        counted_rows = [r for r in row_sizes(c, counted) if r.size not in glitches]
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


#: why :func:`~treecoll.tools.validation.glitch_sizes` leaves a row out of the fit
GLITCH_REASON = (
    f"slower than {SLOWER_RATIO:g} x the time of a size twice as large or more: the run slowed down there once "
    "(the bytes only grow)"
)
#: why :func:`~treecoll.tools.validation.noisy_row_sizes` leaves a row out of the fit
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
    """The middle-size rows (between :data:`~treecoll.tools.validation.SMALL` and
    :data:`~treecoll.tools.validation.LARGE`) where the measured curve is flat: the time to the next size
    grows by less than :data:`FLAT_SLOPE` of the bytes' growth (log-log slope), so the time is mostly
    latency (a slope near 1 is bandwidth, which a latency fitted there would fake)."""
    ok = sorted(rows, key=lambda r: r.size)
    return [
        a
        for a, b in zip(ok, ok[1:])
        if SMALL < a.size < LARGE
        and math.log(b.out_of_place.time_us / a.out_of_place.time_us) / math.log(b.size / a.size) < FLAT_SLOPE
    ]


def _row_algos(row: _FitRow) -> list[str | None]:
    """The NCCL algorithms the row's prediction takes the fastest of, as
    :func:`~treecoll.tools.validation.predict` does: for allreduce the row's, for the other collectives None
    (the one family NCCL runs them with)."""
    if row.collective != "allreduce":
        return [None]
    return [a for a in row.algos if a in ALGO_FAMILY]


class _Predictor:
    """Predicted times of the fit rows for given factors, each (row, algorithm) simulated once per value of
    the factors it depends on (its family's latency factor and the link factors:
    :func:`~treecoll.tools.validation.algorithm_time`)."""

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
        before = SIMULATIONS[0]
        out = algorithm_time(r.topology, r.collective, r.size, algo, calibration_from(values))
        self.simulations += SIMULATIONS[0] - before
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
    ``before``/``after``: :func:`~treecoll.tools.validation.validate` with the defaults and with the fitted
    calibration, when ``check``). ``max_rows``: rows fitted per table, spread over its sizes. Raises
    :class:`~treecoll.topo.errors.CollectiveError` when no row can be fitted."""
    paths = [Path(p) for p in paths]
    cs, bad = cases(paths)
    rows, skipped, left_out = _fit_rows(cs, flags, max_gpus, collective, max_rows)
    skipped += [{"file": b["file"], "reason": b["reason"]} for b in bad]
    if not rows:
        why = "; ".join(skip_line(s) for s in skipped) or "no rows"
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
        f"group, {pct(f['error_before']).strip()} with the defaults, {pct(f['error_after']).strip()} fitted",
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
                f"large {pct(g['large'])}, small {pct(g['small'])} over {g['tables']} tables"
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
