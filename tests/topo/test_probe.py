"""The link probe's plain-data half: the pairing schedule, the plan, the verdict and the calibrated topology.

Synthetic measurements come from a ground truth computed here, independently of the probe's own
model: on one switch, a transfer between hosts runs at the least of its sender's uplink over the
transfers leaving that host in the step, its receiver's uplink over the transfers entering it, and
the 4 GB/s host links over the transfers sharing them.
"""

from __future__ import annotations

import itertools
import random
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from treecoll.topo import probe
from treecoll.topo.errors import TopologyError, TreecollError
from treecoll.topo.model import Topology
from treecoll.topo.pairing import round_robin, sample_rounds, shifts

from treecoll import topo

SETTINGS = settings(
    max_examples=60,
    deadline=timedelta(seconds=2),
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
HOST_BW = 4.0  # p - cpu and cpu - nic links, GB/s
UPLINK = 0.125  # nic - sw0, GB/s


def cluster(hosts: int, rph: int = 1, uplink: float = UPLINK) -> Topology:
    """``hosts`` hosts of ``rph`` rank processes, one NIC each on one switch (ranks host by host)."""
    nodes, links = [{"id": "sw0", "kind": "net_switch"}], []
    for h in range(hosts):
        nodes += [
            {"id": f"h{h}/cpu0", "kind": "cpu", "host": f"h{h}"},
            {"id": f"h{h}/nic0", "kind": "nic", "host": f"h{h}"},
        ]
        links += [
            {"a": f"h{h}/cpu0", "b": f"h{h}/nic0", "kind": "pcie", "bw": HOST_BW, "lat": 1.0},
            {"a": f"h{h}/nic0", "b": "sw0", "kind": "net", "bw": uplink, "lat": 2.0},
        ]
        for j in range(rph):
            nodes.append({"id": f"h{h}/p{j}", "kind": "gpu", "host": f"h{h}", "index": j, "rank": h * rph + j})
            links.append({"a": f"h{h}/p{j}", "b": f"h{h}/cpu0", "kind": "pcie", "bw": HOST_BW, "lat": 1.0})
    return Topology.from_dict({"name": f"c{hosts}x{rph}", "nodes": nodes, "links": links})


def truth_gbs(step: probe.Step, rph: int, uplink: dict[int, float]) -> list[float]:
    """What each transfer of a bandwidth step runs at on the real cluster (module doc)."""
    out_n: dict[int, int] = {}
    in_n: dict[int, int] = {}
    for a, b in step.flows:
        if a // rph != b // rph:
            out_n[a // rph] = out_n.get(a // rph, 0) + 1
            in_n[b // rph] = in_n.get(b // rph, 0) + 1
    rates = []
    for a, b in step.flows:
        ha, hb = a // rph, b // rph
        if ha == hb:
            rates.append(HOST_BW)
        else:
            rates.append(min(uplink[ha] / out_n[ha], uplink[hb] / in_n[hb], HOST_BW / out_n[ha], HOST_BW / in_n[hb]))
    return rates


def records(plan: probe.Plan, rph: int, uplink: dict[int, float], noise: random.Random) -> list[dict]:
    out = []
    for i, s in enumerate(plan.steps):
        if s.kind == "bw":
            for (a, b), n, gbs in zip(s.flows, s.nbytes, truth_gbs(s, rph, uplink)):
                out.append(
                    {
                        "step": i,
                        "src": a,
                        "dst": b,
                        "seconds": [n / (gbs * 1e9) * noise.uniform(0.9, 1.1) for _ in range(plan.reps)],
                    }
                )
        else:
            out += [{"step": i, "src": a, "dst": b, "seconds": [50e-6, 60e-6]} for a, b in s.flows]
    return out


# ----------------------------------------------------------------------------- pairing
@SETTINGS
@given(st.integers(0, 70))
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n):
    rounds = round_robin(n)
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)
    met = [frozenset(p) for r in rounds for p in r]
    assert sorted(met, key=sorted) == sorted((frozenset(p) for p in itertools.combinations(range(n), 2)), key=sorted)
    for r in rounds:
        ends = [x for p in r for x in p]
        assert len(ends) == len(set(ends)), r  # disjoint
        assert len(r) == n // 2  # everybody plays (one sits out when n is odd)


@SETTINGS
@given(st.integers(2, 60), st.integers(1, 20), st.integers(0, 5))
def test_sample_rounds_keeps_whole_rounds_in_order(n, budget, seed):
    full = round_robin(n)
    kept = sample_rounds(full, budget, seed=seed)
    assert len(kept) == min(budget, len(full))
    idx = [full.index(r) for r in kept]
    assert idx == sorted(idx) and len(set(idx)) == len(idx)
    assert kept == sample_rounds(full, budget, seed=seed)


def test_shifts_and_bad_counts():
    assert shifts(4) == [1, 2] and shifts(3) == [1] and shifts(0) == []
    with pytest.raises(TreecollError, match=r"round_robin: expected a non-negative integer"):
        round_robin(-1)


# ----------------------------------------------------------------------------- plan
@SETTINGS
@given(st.integers(1, 6), st.integers(1, 3), st.integers(1, 20))
def test_plan_steps_use_every_rank_at_most_once_each_way(hosts, rph, max_rounds):
    if hosts * rph < 2:
        return
    t = cluster(hosts, rph)
    plan = probe.make_plan(t, reps=1, max_rounds=max_rounds, nbytes=4096)
    intra, inter = set(), set()
    for s in plan.steps:
        srcs, dsts = [a for a, _ in s.flows], [b for _, b in s.flows]
        assert len(set(srcs)) == len(srcs) and len(set(dsts)) == len(dsts), s
        if s.kind == "lat":
            ends = srcs + dsts
            assert len(set(ends)) == len(ends), s
            (intra if s.phase == "intra" else inter).update(frozenset(p) for p in s.flows)
    host_rounds = len(round_robin(hosts))
    if max_rounds >= max(host_rounds, len(round_robin(rph))):  # nothing sampled: every pair measured
        assert intra == {
            frozenset((h * rph + i, h * rph + j))
            for h in range(hosts)
            for i, j in itertools.combinations(range(rph), 2)
        }
        assert {frozenset((a // rph, b // rph)) for a, b in map(tuple, inter)} == {
            frozenset(p) for p in itertools.combinations(range(hosts), 2)
        }
    if hosts > 1:
        assert plan.rounds["inter"] == (min(max_rounds, host_rounds), host_rounds)
        assert [s.phase for s in plan.steps].count("load") == len(shifts(hosts))


def test_plan_budget_for_many_hosts():
    """64 hosts: 16 of 63 rounds, 3 steps each, and 2 loaded steps; the model's transfer time is stated."""
    plan = probe.make_plan(cluster(64), reps=3)
    assert plan.rounds == {"inter": (16, 63), "load": (2, 2)}
    assert len(plan.steps) == 3 * 16 + 2
    # a transfer moves what the uplink carries in 20 ms (2.5 MB, rounded up to 4 KiB pages); a loaded one too
    assert {n for s in plan.steps if s.kind == "bw" for n in s.nbytes} == {2_502_656}
    bw_steps = sum(s.kind == "bw" for s in plan.steps)
    lat_steps = len(plan.steps) - bw_steps
    assert plan.budget_seconds == pytest.approx(bw_steps * 3 * 2_502_656 / 0.125e9 + lat_steps * 11 * 2 * 8e-6)


def test_plan_refuses_one_rank_and_bad_numbers():
    with pytest.raises(TopologyError, match=r"probe: expected at least 2 ranks in topology 'c1x1', got 1"):
        probe.make_plan(cluster(1))
    with pytest.raises(TopologyError, match=r"probe reps: expected a positive integer, got 0"):
        probe.make_plan(cluster(2), reps=0)


def test_expected_shares_an_overloaded_uplink():
    t = cluster(3, 2)
    # both ranks of h0 send to h1 at once: the two flows share h0's and h1's uplinks
    (e1, b1), (e2, _) = probe.expected(t, [("h0/p0", "h1/p0"), ("h0/p1", "h1/p1")])
    assert e1 == e2 == pytest.approx(UPLINK / 2)
    assert set(b1) == {("h0/nic0", "sw0"), ("sw0", "h1/nic0")}
    ((e3, b3),) = probe.expected(t, [("h0/p0", "h0/p1")])
    assert e3 == HOST_BW and set(b3) == {("h0/p0", "h0/cpu0"), ("h0/cpu0", "h0/p1")}


# ----------------------------------------------------------------------------- verdict
@SETTINGS
@given(st.integers(3, 7), st.integers(1, 2), st.data(), st.floats(0.05, 0.5), st.integers(0, 10**6))
def test_one_slow_uplink_is_found_and_nothing_else(hosts, rph, data, factor, seed):
    slow = data.draw(st.integers(0, hosts - 1))
    t = cluster(hosts, rph)
    plan = probe.make_plan(t, reps=3)
    uplink = {h: UPLINK * (factor if h == slow else 1.0) for h in range(hosts)}
    r = probe.assess(plan, t, records(plan, rph, uplink, random.Random(seed)))
    assert r["summary"]["slow_nics"] == [f"h{slow}/nic0"]
    assert r["summary"]["slow_hosts"] == [f"h{slow}"]
    assert r["summary"]["slow_names"] == [f"h{slow}/nic0"]
    assert [(s["a"], s["b"]) for s in r["slow"]] == [(f"h{slow}/nic0", "sw0")]
    rows = r["summary"]["classes"]  # the glance table: transfers a slow link limited apart
    assert all(x["ratio"] <= factor / 0.9 for x in rows if x["class"].endswith(" via slow"))
    assert all(x["ratio"] >= 1 / 1.1 for x in rows if not x["class"].endswith(" via slow"))
    assert sum(x["transfers"] for x in rows) == sum(len(s.flows) for s in plan.steps if s.kind == "bw")
    (s,) = r["slow"]
    assert s["expected_gbps"] == UPLINK
    assert factor * UPLINK / 1.1 <= s["measured_gbps"] <= factor * UPLINK / 0.9  # times within 10%


@SETTINGS
@given(st.integers(2, 7), st.integers(1, 2), st.integers(0, 10**6))
def test_clean_measurements_flag_nothing(hosts, rph, seed):
    t = cluster(hosts, rph)
    plan = probe.make_plan(t, reps=3)
    r = probe.assess(plan, t, records(plan, rph, dict.fromkeys(range(hosts), UPLINK), random.Random(seed)))
    assert r["slow"] == [] and r["summary"]["slow_hosts"] == []
    assert all(1 / 1.1 <= p["ratio"] <= 1 / 0.9 for p in r["pairs"] if p["kind"] == "bandwidth")
    assert set(r) == {"pairs", "slow", "summary", "links"}


def test_two_hosts_one_slow_names_both_ends():
    """With two hosts nothing tells the two uplinks apart: both are named."""
    t = cluster(2)
    plan = probe.make_plan(t, reps=1)
    r = probe.assess(plan, t, records(plan, 1, {0: UPLINK, 1: UPLINK / 10}, random.Random(0)))
    assert r["summary"]["slow_nics"] == ["h0/nic0", "h1/nic0"]


def test_assess_refuses_records_of_another_plan():
    t = cluster(3)
    plan = probe.make_plan(t, reps=1)
    with pytest.raises(TopologyError, match=r"probe record 0: step expected 0\.\.\d+, got 99"):
        probe.assess(plan, t, [{"step": 99, "src": 0, "dst": 1, "seconds": [1.0]}])
    with pytest.raises(TopologyError, match=r"probe record 0: ranks \(0, 0\) are not a transfer of step 1"):
        probe.assess(plan, t, [{"step": 1, "src": 0, "dst": 0, "seconds": [1.0]}])
    with pytest.raises(TopologyError, match=r"seconds expected positive finite times"):
        probe.assess(plan, t, [{"step": 1, "src": 1, "dst": 2, "seconds": [0.0]}])
    with pytest.raises(TopologyError, match=r"threshold: expected a fraction"):
        probe.assess(plan, t, [], threshold=1.5)


def test_link_names():
    t = cluster(2)
    assert probe.link_name(t, "sw0", "h1/nic0") == "h1/nic0"
    assert probe.link_name(t, "h0/p0", "h0/cpu0") == "h0/p0 -> h0/cpu0"


def test_check_job_two_machines_for_one_host():
    with pytest.raises(TopologyError, match=r"puts ranks 0 and 1 on host h0, the job runs them on two machines"):
        probe.check_job({0: "h0", 1: "h0"}, ["a#0", "b#1"], "x")
    with pytest.raises(TopologyError, match=r"topology 'x' has 2 ranks, the job 3"):
        probe.check_job({0: "h0", 1: "h0"}, ["a#", "a#", "a#"], "x")


# ----------------------------------------------------------------------------- calibrate
def test_calibrated_topology_carries_the_measurements_and_round_trips():
    t = cluster(4)
    plan = probe.make_plan(t, reps=3)
    uplink = {0: UPLINK, 1: UPLINK, 2: UPLINK / 10, 3: UPLINK}
    r = probe.assess(plan, t, records(plan, 1, uplink, random.Random(1)))
    c = probe.calibrate(t, r, date="2026-01-02T03:04:05Z")
    for d in (("h2/nic0", "sw0"), ("sw0", "h2/nic0")):
        assert UPLINK / 10 / 1.1 <= c.link(*d)["bw"] <= UPLINK / 10 / 0.9 and c.link(*d)["measured"].startswith("2026")
    assert UPLINK / 1.1 <= c.link("h0/nic0", "sw0")["bw"] <= UPLINK / 0.9
    # latency: 50-60 µs one way measured against 4 x 1 µs + 2 x 2 µs modelled, the excess over the 2 net hops
    assert c.link("h0/nic0", "sw0")["lat"] == pytest.approx(2.0 + (55.0 - 8.0) / 2, abs=0.1)
    assert "measured" not in c.link("h0/p0", "h0/cpu0") and c.link("h0/p0", "h0/cpu0") == t.link("h0/p0", "h0/cpu0")
    assert c.meta["probe"] == {
        "date": "2026-01-02T03:04:05Z",
        "threshold": 0.7,
        "slow": ["h2/nic0"],
        "links_measured": 8,
    }
    back = topo.loads(topo.dumps(c))
    assert back == c and back.link("sw0", "h2/nic0")["measured"] == "2026-01-02T03:04:05Z"


def test_calibrate_refuses_another_topology():
    t = cluster(3)
    r = {"links": [{"a": "h9/nic0", "b": "sw0", "ratio": 1.0, "measured_gbps": 1.0}]}
    with pytest.raises(TopologyError, match=r"calibrate: link 'h9/nic0' -> 'sw0' is not in topology 'c3x1'"):
        probe.calibrate(t, r, date="d")


def test_yaml_measured_must_be_text():
    text = topo.dumps(cluster(2)).replace('"kind": "net"', '"kind": "net", "measured": 5', 1)
    with pytest.raises(TopologyError, match=r"links\[\d+\]\.measured: expected a non-empty string, got 5"):
        topo.loads(text)
