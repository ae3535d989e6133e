"""A link probe's plan, its verdict and the calibrated topology: the plain-data half of ``treecoll topo probe``.

The measuring half (:mod:`treecoll.collectives.probe`) runs a :class:`Plan` over
torch.distributed and hands back plain records; everything else is here, free
of torch and I/O:

1. :func:`make_plan` turns a :class:`~treecoll.topo.model.Topology` whose ranks
   are mapped into steps. Each step is a set of transfers that run at once, and
   no rank sends or receives two of them:

   * ``intra``: inside every host, the ranks' round-robin rounds
     (:func:`treecoll.topo.pairing.round_robin`), all hosts at once;
   * ``inter``: between hosts, the hosts' round-robin rounds; in a round every
     paired host pair exchanges on every rail (the rank nearest each NIC, class
     ``inter-host nicK``), so each NIC carries one flow per direction;
   * ``load``: every rank sends to the rank with its local index on host
     ``i + k`` at once (:func:`treecoll.topo.pairing.shifts`): what a collective
     does to the fabric.

   Each round is a latency step (ping-pong of one byte per pair) and two bandwidth
   steps (a to b, then b to a). With ``max_rounds`` the rounds are sampled
   (:func:`treecoll.topo.pairing.sample_rounds`): ``H`` hosts cost
   ``3 * min(H - 1, max_rounds) + len(shifts(H))`` steps (for odd ``H``, ``H``
   rounds instead of ``H - 1``), so 1,024 hosts with the default 16 rounds take
   50 steps, 34 of them transfers: at 3 repetitions of 20 ms each, 2.0 s of
   transfers (:attr:`Plan.budget_seconds` gives the model's number for a plan;
   finding the routes of 8 ranks per host makes building the plan the larger part).

2. The model's expectation of each transfer (:func:`expected`): the route's
   bandwidth (:meth:`Topology.path`), divided by the overload of the busiest link
   it crosses when the step's transfers share links (each transfer asks for its
   route's bandwidth; a link asked for more than it has serves each in proportion).
   The route's links that limit it (utilisation equal to the route's highest)
   are its *bottlenecks*.

3. :func:`assess` compares measurements with the expectations. A transfer's
   ratio is measured / expected. A directed link's ratio is the best ratio of
   the transfers it was a bottleneck of (a link is as good as the best traffic
   it carried: a slow neighbour slows some transfers, never all of them); links
   below ``threshold`` (default :data:`THRESHOLD`) are slow, named as the
   topology names them: a NIC's link to its switch by the NIC (``h3/nic2``), a
   direct link between hosts by the hosts (``h1 -> h2``), any other by its ends.
   A slow transfer none of whose bottlenecks is slow is named by its hosts
   (``h1 -> h2``). Latency is reported against the model, never flagged (a
   process-level ping-pong includes the software stack the model leaves out).

4. :func:`calibrate` writes the verdict into a copy of the topology: every
   assessed link gets ``bw`` = its ratio x its model bandwidth, links on measured
   latency routes get ``lat`` = model + their share of the measured excess, each
   marked ``measured: <date>``; ``meta.probe`` records the date, threshold and
   what was slow. Builders, ``auto`` and the planner read it as any topology.

Bandwidths are GB/s (1e9 B/s) per direction, as in the topology; latencies µs.

>>> from treecoll.topo.model import Topology
>>> t = Topology.from_dict({"name": "pair", "nodes": [
...     {"id": f"h{i}/{n}", "kind": k, "host": f"h{i}", **({"rank": i} if k == "gpu" else {})}
...     for i in range(3) for n, k in (("p0", "gpu"), ("cpu0", "cpu"), ("nic0", "nic"))]
...     + [{"id": "sw0", "kind": "net_switch"}], "links": [
...     {"a": f"h{i}/{x}", "b": y if y == "sw0" else f"h{i}/{y}", "kind": k, "bw": bw, "lat": 1.0}
...     for i in range(3) for x, y, k, bw in (("p0", "cpu0", "pcie", 4.0), ("cpu0", "nic0", "pcie", 4.0),
...                                            ("nic0", "sw0", "net", 0.1))]})
>>> plan = make_plan(t, reps=1, nbytes=1 << 20)
>>> [(s.kind, s.phase, s.flows) for s in plan.steps][:3]
[('lat', 'inter', ((1, 2),)), ('bw', 'inter', ((1, 2),)), ('bw', 'inter', ((2, 1),))]
>>> s = plan.steps[1]; s.expected, s.bottlenecks[0]
((0.1,), (('h1/nic0', 'sw0'), ('sw0', 'h2/nic0')))
>>> def seconds(step, src, dst):       # host 2's NIC moves a tenth of its rate
...     return (1 << 20) / 1e9 / (0.01 if 2 in (src, dst) else 0.1)
>>> recs = [{"step": i, "src": a, "dst": b, "seconds": [seconds(i, a, b)]}
...         for i, s in enumerate(plan.steps) if s.kind == "bw" for a, b in s.flows]
>>> r = assess(plan, t, recs)
>>> r["slow"]
[{'a': 'h2/nic0', 'b': 'sw0', 'measured_gbps': 0.01, 'expected_gbps': 0.1}]
>>> r["summary"]["slow_hosts"], r["summary"]["slow_nics"]
(['h2'], ['h2/nic0'])
>>> c = calibrate(t, r, date="2026-01-01")
>>> c.link("h2/nic0", "sw0")["bw"], c.link("h2/nic0", "sw0")["measured"], c.link("h0/nic0", "sw0")["bw"]
(0.01, '2026-01-01', 0.1)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import networkx as nx

from .errors import TopologyError
from .model import Topology
from .pairing import round_robin, sample_rounds, shifts

__all__ = [
    "THRESHOLD",
    "MAX_ROUNDS",
    "Step",
    "Plan",
    "make_plan",
    "expected",
    "assess",
    "calibrate",
    "link_name",
    "table_rows",
    "latency_rows",
    "rank_hosts",
    "check_job",
]

#: a link is slow below this fraction of the model's bandwidth
THRESHOLD = 0.7
#: rounds of each phase measured before sampling starts
MAX_ROUNDS = 16
#: automatic transfer size: what the model moves in this many seconds, within [MIN_BYTES, MAX_BYTES]
TARGET_SECONDS = 0.02
MIN_BYTES = 256 << 10
MAX_BYTES = 16 << 20
#: ping-pongs per pair of a latency step (after one untimed)
LAT_ITERS = 10

Link = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Step:
    """Transfers that run at once.

    ``kind``: ``"bw"`` (``flows[i]`` = (src rank, dst rank) sends ``nbytes[i]`` bytes)
    or ``"lat"`` (``flows[i]`` = a rank pair that ping-pongs one byte);
    ``phase``: ``intra``, ``inter`` or ``load``; ``classes[i]``: the link class of
    flow i (``intra-host``, ``inter-host nic0``, ``loaded shift 1``);
    ``expected[i]``: the model's GB/s (bw) or one-way µs (lat); ``bottlenecks[i]``:
    the directed links limiting flow i (bw steps; empty for lat).
    """

    kind: str
    phase: str
    flows: tuple[tuple[int, int], ...]
    classes: tuple[str, ...]
    expected: tuple[float, ...]
    nbytes: tuple[int, ...] = ()
    bottlenecks: tuple[tuple[Link, ...], ...] = ()
    routes: tuple[tuple[Link, ...], ...] = ()


@dataclasses.dataclass(frozen=True)
class Plan:
    """The steps of one probe over ``ranks`` ranks; ``reps`` timed repetitions of every
    bandwidth step, ``lat_iters`` ping-pongs per latency pair; ``rounds``: per phase the
    rounds kept and the rounds of the full tournament."""

    ranks: int
    steps: tuple[Step, ...]
    reps: int
    lat_iters: int
    rounds: Mapping[str, tuple[int, int]]

    @property
    def budget_seconds(self) -> float:
        """What the model says the transfers take: per bandwidth step its slowest transfer x
        ``reps``, per latency step ``lat_iters + 1`` round trips of its slowest pair."""
        total = 0.0
        for s in self.steps:
            if s.kind == "bw":
                total += self.reps * max(n / (e * 1e9) for n, e in zip(s.nbytes, s.expected))
            else:
                total += (self.lat_iters + 1) * 2 * max(s.expected) * 1e-6
        return total

    def as_dict(self) -> dict[str, Any]:
        """Counts for the report: steps by kind, transfers, rounds, budget."""
        return {
            "ranks": self.ranks,
            "steps": len(self.steps),
            "transfers": sum(len(s.flows) for s in self.steps if s.kind == "bw"),
            "latency_pairs": sum(len(s.flows) for s in self.steps if s.kind == "lat"),
            "reps": self.reps,
            "rounds": {k: {"measured": a, "of": b} for k, (a, b) in self.rounds.items()},
            "model_seconds": round(self.budget_seconds, 3),
        }


# ------------------------------------------------------------------------------------------ plan
def _route_links(path) -> tuple[tuple[tuple[Link, ...], float], ...]:
    return tuple((tuple(zip(nodes[:-1], nodes[1:])), share) for nodes, share in path.routes)


def expected(topology: Topology, flows: Sequence[tuple[str, str]]) -> list[tuple[float, tuple[Link, ...]]]:
    """``(GB/s, bottleneck links)`` the model expects of each of ``flows`` (endpoint ids)
    when they run at once (see the module doc: proportional share of overloaded links)."""
    g = topology.graph
    paths = [topology.path(a, b) for a, b in flows]
    routes = [_route_links(p) for p in paths]
    demand: dict[Link, float] = {}
    for p, rs in zip(paths, routes):
        for links, share in rs:
            for lk in links:
                demand[lk] = demand.get(lk, 0.0) + share * p.bw
    util = {lk: d / g.edges[lk]["bw"] for lk, d in demand.items()}
    out = []
    for p, rs in zip(paths, routes):
        mine = [lk for links, _ in rs for lk in links]
        if not mine:
            out.append((p.bw, ()))
            continue
        top = max(util[lk] for lk in mine)
        worst = tuple(dict.fromkeys(lk for lk in mine if util[lk] >= top * (1 - 1e-9)))
        out.append((p.bw / max(1.0, top), worst))
    return out


def _size(gbs: float, nbytes: int | None) -> int:
    if nbytes is not None:
        return nbytes
    want = int(gbs * 1e9 * TARGET_SECONDS)
    return min(MAX_BYTES, max(MIN_BYTES, (want + 4095) // 4096 * 4096))


def _step_pair(
    topology: Topology,
    gpus: Sequence[str],
    phase: str,
    pairs: list[tuple[int, int]],
    classes: list[str],
    nbytes: int | None,
) -> list[Step]:
    """The latency step and the two bandwidth steps (a -> b, b -> a) of one round."""
    if not pairs:
        return []
    lat = tuple(float(topology.path(gpus[a], gpus[b]).lat) for a, b in pairs)
    out = [Step("lat", phase, tuple(pairs), tuple(classes), lat)]
    for flows in (pairs, [(b, a) for a, b in pairs]):
        out.append(_bw_step(topology, gpus, phase, flows, classes, nbytes))
    return out


def _bw_step(
    topology: Topology,
    gpus: Sequence[str],
    phase: str,
    flows: list[tuple[int, int]],
    classes: list[str],
    nbytes: int | None,
) -> Step:
    exp = expected(topology, [(gpus[a], gpus[b]) for a, b in flows])
    routes = tuple(
        tuple(lk for links, _ in _route_links(topology.path(gpus[a], gpus[b])) for lk in links) for a, b in flows
    )
    return Step(
        "bw",
        phase,
        tuple(flows),
        tuple(classes),
        tuple(round(e, 9) for e, _ in exp),
        tuple(_size(e, nbytes) for e, _ in exp),
        tuple(b for _, b in exp),
        routes,
    )


def _rails(topology: Topology, gpus: Sequence[str], members: list[int]) -> dict[int, int]:
    """Rail k of a host (its k-th NIC) -> the first of ``members`` whose nearest NIC it is;
    a host without NICs has rail 0 = its first rank."""
    nics = list(topology.nics(topology.host_of(gpus[members[0]])))
    out: dict[int, int] = {}
    for r in members:
        nic = topology.nearest_nic(gpus[r])
        k = nics.index(nic) if nic in nics else 0
        out.setdefault(k, r)
    return out or {0: members[0]}


def make_plan(
    topology: Topology,
    *,
    reps: int = 3,
    max_rounds: int = MAX_ROUNDS,
    seed: int = 0,
    nbytes: int | None = None,
    load: bool = True,
    lat_iters: int = LAT_ITERS,
) -> Plan:
    """The probe of every rank of ``topology`` (its ranks mapped: :meth:`Topology.rank_gpus`).

    ``nbytes``: bytes per transfer (default: what the model moves in :data:`TARGET_SECONDS`,
    within :data:`MIN_BYTES`..:data:`MAX_BYTES`); ``max_rounds``: rounds kept per phase
    (sampled with ``seed``); ``load``: add the loaded steps.
    """
    for name, v in (("reps", reps), ("max_rounds", max_rounds), ("lat_iters", lat_iters)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TopologyError(f"probe {name}: expected a positive integer, got {v!r}")
    if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1):
        raise TopologyError(f"probe bytes: expected a positive integer, got {nbytes!r}")
    gpus = topology.rank_gpus()
    if len(gpus) < 2:
        raise TopologyError(f"probe: expected at least 2 ranks in topology {topology.name!r}, got {len(gpus)}")
    hosts: dict[str, list[int]] = {}
    for r, x in enumerate(gpus):
        hosts.setdefault(topology.host_of(x), []).append(r)
    steps: list[Step] = []
    rounds: dict[str, tuple[int, int]] = {}
    # intra: every host's own tournament, the hosts side by side
    per_host = {
        h: sample_rounds(round_robin(len(m)), max_rounds, seed=seed) if len(m) > 1 else [] for h, m in hosts.items()
    }
    full = max((len(m) - 1 + len(m) % 2 for m in hosts.values() if len(m) > 1), default=0)
    n_intra = max((len(v) for v in per_host.values()), default=0)
    if n_intra:
        rounds["intra"] = (n_intra, full)
    for k in range(n_intra):
        pairs = [(hosts[h][a], hosts[h][b]) for h, rs in per_host.items() if k < len(rs) for a, b in rs[k]]
        steps += _step_pair(topology, gpus, "intra", pairs, ["intra-host"] * len(pairs), nbytes)
    # inter: the hosts' tournament, every rail of a host pair at once
    names = list(hosts)
    if len(names) > 1:
        rails = {h: _rails(topology, gpus, hosts[h]) for h in names}
        full_rounds = round_robin(len(names))
        kept = sample_rounds(full_rounds, max_rounds, seed=seed)
        rounds["inter"] = (len(kept), len(full_rounds))
        for rnd in kept:
            pairs, classes = [], []
            for x, y in rnd:
                rx, ry = rails[names[x]], rails[names[y]]
                for k in sorted(set(rx) & set(ry)):
                    pairs.append((rx[k], ry[k]))
                    classes.append(f"inter-host nic{k}")
            steps += _step_pair(topology, gpus, "inter", pairs, classes, nbytes)
        if load:
            local = {h: {i: r for i, r in enumerate(m)} for h, m in hosts.items()}
            ks = shifts(len(names))
            rounds["load"] = (len(ks), len(ks))
            for k in ks:
                flows = [
                    (local[h][i], local[names[(j + k) % len(names)]][i])
                    for j, h in enumerate(names)
                    for i in local[h]
                    if i in local[names[(j + k) % len(names)]]
                ]
                steps.append(_bw_step(topology, gpus, "load", flows, [f"loaded shift {k}"] * len(flows), nbytes))
    return Plan(len(gpus), tuple(steps), reps, lat_iters, rounds)


def rank_hosts(topology: Topology) -> dict[int, str]:
    """The host of every rank of ``topology``."""
    return {r: topology.host_of(x) for r, x in enumerate(topology.rank_gpus())}


def check_job(hosts: Mapping[int, str], where: Sequence[str], name: str = "") -> None:
    """Raise :class:`TopologyError` unless the job places ranks as the topology does.

    ``hosts[r]``: rank r's host in the topology; ``where[r]``: where rank r runs (a machine
    and launcher node, :func:`treecoll.collectives.probe.identity`). Ranks of one host
    must run on one machine and ranks of different hosts on different ones.

    >>> check_job({0: "h0", 1: "h0", 2: "h1"}, ["a#0", "a#0", "b#1"])
    >>> check_job({0: "h0", 1: "h1"}, ["a#", "a#"], "emu")
    Traceback (most recent call last):
    ...
    treecoll.topo.errors.TopologyError: topo probe: topology 'emu' puts ranks 0 and 1 on different hosts (h0, h1), \
the job runs them on one machine (a#); give the topology of this job (--topology), or launch one process per host \
of the topology
    """
    if len(where) != len(hosts):
        raise TopologyError(
            f"topo probe: topology {name!r} has {len(hosts)} ranks, the job {len(where)}; "
            f"give the topology of this job (--topology)"
        )
    first_of_host: dict[str, int] = {}
    first_of_place: dict[str, int] = {}
    for r in range(len(where)):
        h, w = hosts[r], where[r]
        if h in first_of_host and where[first_of_host[h]] != w:
            q = first_of_host[h]
            raise TopologyError(
                f"topo probe: topology {name!r} puts ranks {q} and {r} on host {h}, the job runs "
                f"them on two machines ({where[q]}, {w}); give the topology of this job (--topology)"
            )
        if w in first_of_place and hosts[first_of_place[w]] != h:
            q = first_of_place[w]
            raise TopologyError(
                f"topo probe: topology {name!r} puts ranks {q} and {r} on different hosts "
                f"({hosts[q]}, {h}), the job runs them on one machine ({w}); give the topology of "
                f"this job (--topology), or launch one process per host of the topology"
            )
        first_of_host.setdefault(h, r)
        first_of_place.setdefault(w, r)


# ------------------------------------------------------------------------------------------ verdict
def link_name(topology: Topology, a: str, b: str) -> str:
    """A link as the topology names it: a NIC's link to a switch by the NIC (``h3/nic2``), a
    direct link between two hosts' NICs by the hosts (``h1 -> h2``), any other by its ends."""
    g = topology.graph
    ka, kb = g.nodes[a]["kind"], g.nodes[b]["kind"]
    if ka == "nic" and kb == "net_switch":
        return a
    if kb == "nic" and ka == "net_switch":
        return b
    if ka == kb == "nic":
        return f"{g.nodes[a]['host']} -> {g.nodes[b]['host']}"
    return f"{a} -> {b}"


def _host_pair(topology: Topology, a: str, b: str) -> str:
    ha, hb = topology.host_of(a), topology.host_of(b)
    return f"{ha} -> {hb}" if ha != hb else f"{a} -> {b}"


def _median(xs: Iterable[float]) -> float:
    return statistics.median(list(xs))


def _check_records(plan: Plan, records: Sequence[Mapping[str, Any]]) -> None:
    for i, rec in enumerate(records):
        s = rec.get("step")
        if not isinstance(s, int) or not 0 <= s < len(plan.steps):
            raise TopologyError(f"probe record {i}: step expected 0..{len(plan.steps) - 1}, got {s!r}")
        flow = (rec.get("src"), rec.get("dst"))
        if flow not in plan.steps[s].flows:
            raise TopologyError(f"probe record {i}: ranks {flow} are not a transfer of step {s}")
        vals = rec.get("seconds") or []
        if not vals or not all(isinstance(v, (int, float)) and 0 < v < math.inf for v in vals):
            raise TopologyError(f"probe record {i}: seconds expected positive finite times, got {vals!r}")


def assess(
    plan: Plan, topology: Topology, records: Sequence[Mapping[str, Any]], *, threshold: float = THRESHOLD
) -> dict[str, Any]:
    """The verdict on ``records`` of ``plan`` run on ``topology``.

    ``records``: ``{"step": i, "src": rank, "dst": rank, "seconds": [...]}``, one per
    transfer of a ``bw`` step (seconds per repetition) and per pair of a ``lat`` step
    (one-way seconds, half of each round trip). Returns plain data
    ``{"pairs": [...], "slow": [{"a", "b", "measured_gbps", "expected_gbps"}], "summary": {...}}``
    plus ``"links"`` (every assessed directed link, for :func:`calibrate`).
    """
    if not 0 < threshold <= 1:
        raise TopologyError(f"probe threshold: expected a fraction in (0, 1], got {threshold!r}")
    _check_records(plan, records)
    gpus = topology.rank_gpus()
    g = topology.graph
    pairs: list[dict[str, Any]] = []
    best: dict[Link, float] = {}  # directed link -> best ratio of the transfers it limited
    flows_of: dict[Link, int] = {}
    excess: dict[Link, list[float]] = {}  # directed link -> its share of measured latency excess (µs)
    slow_flows = []
    limits: list[tuple[dict[str, Any], tuple[Link, ...]]] = []  # bandwidth pair, its bottleneck links
    for rec in records:
        step = plan.steps[rec["step"]]
        i = step.flows.index((rec["src"], rec["dst"]))
        a, b = gpus[rec["src"]], gpus[rec["dst"]]
        med = _median(rec["seconds"])
        base = {"phase": step.phase, "class": step.classes[i], "a": a, "b": b, "ranks": [rec["src"], rec["dst"]]}
        if step.kind == "lat":
            lat_us = med * 1e6
            pairs.append(
                {**base, "kind": "latency", "lat_us": round(lat_us, 1), "expected_lat_us": round(step.expected[i], 1)}
            )
            p = topology.path(a, b)
            hops = [
                lk for lk, kind in zip(zip(p.nodes[:-1], p.nodes[1:]), p.kinds) if p.nccl != "NET" or kind == "net"
            ] or list(zip(p.nodes[:-1], p.nodes[1:]))
            for lk in hops:
                for d in (lk, lk[::-1]):
                    excess.setdefault(d, []).append((lat_us - step.expected[i]) / len(hops))
            continue
        gbs = step.nbytes[i] / med / 1e9
        ratio = gbs / step.expected[i]
        spread = [step.nbytes[i] / max(rec["seconds"]) / 1e9, step.nbytes[i] / min(rec["seconds"]) / 1e9]
        pairs.append(
            {
                **base,
                "kind": "bandwidth",
                "bytes": step.nbytes[i],
                "measured_gbps": round(gbs, 6),
                "expected_gbps": round(step.expected[i], 6),
                "ratio": round(ratio, 4),
                "spread_gbps": [round(x, 6) for x in spread],
            }
        )
        limits.append((pairs[-1], step.bottlenecks[i]))
        for lk in step.bottlenecks[i]:
            best[lk] = max(best.get(lk, 0.0), ratio)
            flows_of[lk] = flows_of.get(lk, 0) + 1
        if ratio < threshold:
            slow_flows.append((step, i, a, b, gbs))
    links = {
        f"{a}|{b}": {
            "a": a,
            "b": b,
            "ratio": round(r, 4),
            "model_gbps": g.edges[a, b]["bw"],
            "measured_gbps": round(r * g.edges[a, b]["bw"], 6),
            "transfers": flows_of[(a, b)],
        }
        for (a, b), r in best.items()
    }
    for (a, b), xs in excess.items():
        e = links.setdefault(f"{a}|{b}", {"a": a, "b": b, "model_gbps": g.edges[a, b]["bw"]})
        e["lat_us"] = round(max(0.0, float(g.edges[a, b].get("lat", 0.0)) + _median(xs)), 1)
    slow = _slow_links(topology, best, threshold)
    for p, lks in limits:
        p["via_slow"] = any(best[lk] < threshold for lk in lks)
    for step, i, a, b, gbs in slow_flows:
        if all(best[lk] >= threshold for lk in step.bottlenecks[i]):  # no slow link explains it
            ha, hb = topology.host_of(a), topology.host_of(b)
            slow.append(
                {
                    "a": ha if ha != hb else a,
                    "b": hb if ha != hb else b,
                    "measured_gbps": round(gbs, 6),
                    "expected_gbps": round(step.expected[i], 6),
                    "name": _host_pair(topology, a, b),
                }
            )
    names = sorted({s["name"] for s in slow})
    nics = sorted({n for s in slow for n in (s["a"], s["b"]) if n in g and g.nodes[n]["kind"] == "nic"})
    hosts = sorted(
        {h for s in slow for n in (s["a"], s["b"]) for h in ([g.nodes[n].get("host")] if n in g else [n]) if h},
        key=topology.hosts().index,
    )
    summary = {
        "threshold": threshold,
        "units": {"bandwidth": "GB/s (1e9 B/s) per direction", "latency": "us"},
        "plan": plan.as_dict(),
        "links_assessed": len(best),
        "slow_names": names,
        "slow_nics": nics,
        "slow_hosts": hosts,
        "classes": table_rows(pairs),
        "latency": latency_rows(pairs),
    }
    return {
        "pairs": pairs,
        "slow": [{k: s[k] for k in ("a", "b", "measured_gbps", "expected_gbps")} for s in slow],
        "summary": summary,
        "links": list(links.values()),
    }


def _slow_links(topology: Topology, best: Mapping[Link, float], threshold: float) -> list[dict[str, Any]]:
    """One entry per slow link (both directions of a link merged: the worse one's numbers),
    NIC end first."""
    g = topology.graph
    merged: dict[frozenset, dict[str, Any]] = {}
    for (a, b), r in best.items():
        if r >= threshold:
            continue
        if g.nodes[b]["kind"] == "nic" and g.nodes[a]["kind"] != "nic":
            a, b = b, a
        bw = g.edges[a, b]["bw"]
        e = {
            "a": a,
            "b": b,
            "measured_gbps": round(r * bw, 6),
            "expected_gbps": bw,
            "name": link_name(topology, a, b),
            "ratio": r,
        }
        key = frozenset((a, b))
        if key not in merged or r < merged[key]["ratio"]:
            merged[key] = e
    return sorted(merged.values(), key=lambda e: (e["name"], e["a"]))


def table_rows(pairs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per link class: transfers, expected GB/s (median), measured GB/s (median, min, max), ratio (median);
    the transfers a slow link limited (``via_slow``) in a row of their own, ``<class> via slow``."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for p in pairs:
        if p["kind"] == "bandwidth":
            groups.setdefault(p["class"] + (" via slow" if p.get("via_slow") else ""), []).append(p)
    return [
        {
            "class": c,
            "transfers": len(ps),
            "expected_gbps": _median(p["expected_gbps"] for p in ps),
            "measured_gbps": _median(p["measured_gbps"] for p in ps),
            "min_gbps": min(p["measured_gbps"] for p in ps),
            "max_gbps": max(p["measured_gbps"] for p in ps),
            "ratio": round(_median(p["ratio"] for p in ps), 4),
        }
        for c, ps in sorted(groups.items())
    ]


def latency_rows(pairs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per link class: pairs, model one-way µs (median), measured one-way µs (median, min, max)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for p in pairs:
        if p["kind"] == "latency":
            groups.setdefault(p["class"], []).append(p)
    return [
        {
            "class": c,
            "pairs": len(ps),
            "expected_us": _median(p["expected_lat_us"] for p in ps),
            "measured_us": _median(p["lat_us"] for p in ps),
            "min_us": min(p["lat_us"] for p in ps),
            "max_us": max(p["lat_us"] for p in ps),
        }
        for c, ps in groups.items()
    ]


# ------------------------------------------------------------------------------------------ calibrate
def calibrate(topology: Topology, report: Mapping[str, Any], *, date: str) -> Topology:
    """A copy of ``topology`` with the measured ``bw`` / ``lat`` of every link in
    ``report["links"]`` (from :func:`assess`), each marked ``measured: date``, and
    ``meta["probe"]`` = ``{date, threshold, slow}``. Other links keep the model's values."""
    g = nx.DiGraph(topology.graph)
    for e in report.get("links", ()):
        a, b = e["a"], e["b"]
        if not g.has_edge(a, b):
            raise TopologyError(
                f"calibrate: link {a!r} -> {b!r} is not in topology {topology.name!r}; "
                f"probe and calibrate the same topology"
            )
        attrs = dict(g.edges[a, b])
        if "ratio" in e:
            attrs["bw"] = round(e["measured_gbps"], 6) if e["measured_gbps"] > 0 else attrs["bw"]
        if "lat_us" in e:
            attrs["lat"] = e["lat_us"]
        attrs["measured"] = str(date)
        g.add_edge(a, b, **attrs)
    summary = report.get("summary", {})
    meta = dict(topology.meta)
    meta["probe"] = {
        "date": str(date),
        "threshold": summary.get("threshold", THRESHOLD),
        "slow": list(summary.get("slow_names", [])),
        "links_measured": len(report.get("links", ())),
    }
    return Topology(g, name=topology.name, meta=meta)
