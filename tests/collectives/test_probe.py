"""The probe's measuring half over real gloo ranks, and trees built on a probed topology."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from treecoll.collectives import builders
from treecoll.collectives.launch import RankPool
from treecoll.collectives.probe import measure
from treecoll.topo import probe
from treecoll.topo.errors import CollectiveError
from treecoll.topo.model import Topology

from tests.topo.test_probe import UPLINK, cluster

SETTINGS = settings(
    max_examples=30,
    deadline=timedelta(seconds=5),
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def test_measure_on_real_ranks_returns_every_transfer(pool4):
    t = cluster(1, 4)  # the pool's four ranks run on this one machine: one host
    plan = probe.make_plan(t, reps=2, nbytes=64 << 10)
    results = pool4.run(measure, plan, probe.rank_hosts(t), t.name)
    recs = [r for res in results for r in res["records"]]
    want = sorted((i, a, b) for i, s in enumerate(plan.steps) for a, b in s.flows)
    assert sorted((r["step"], r["src"], r["dst"]) for r in recs) == want
    for r in recs:
        step = plan.steps[r["step"]]
        assert len(r["seconds"]) == (plan.reps if step.kind == "bw" else plan.lat_iters)
        assert all(0 < s < 60 for s in r["seconds"])
    report = probe.assess(plan, t, recs)
    rows = report["summary"]["classes"]  # gloo on a busy machine may fall below the model: "via slow"
    assert {c["class"].removesuffix(" via slow") for c in rows} == {"intra-host"}
    assert sum(c["transfers"] for c in rows) == 12  # 6 pairs, both ways


def test_measure_refuses_a_topology_of_other_hosts(pool4):
    t = cluster(2, 2)  # says two hosts; the pool's ranks share one machine
    plan = probe.make_plan(t, reps=1, nbytes=4096)
    with pytest.raises(
        CollectiveError,
        match=r"topology 'c2x2' puts ranks 0 and 2 on different hosts \(h0, h1\), "
        r"the job runs them on one machine",
    ):
        pool4.run(measure, plan, probe.rank_hosts(t), t.name)


def die_mid_probe(rank: int, world: int, plan: probe.Plan, hosts: dict) -> dict:
    """Rank 1 measures the first two steps, then exits without a word; the others go on."""
    if rank == 1:
        import dataclasses

        measure(rank, world, dataclasses.replace(plan, steps=plan.steps[:2]), hosts)
        os._exit(3)
    return measure(rank, world, plan, hosts)


def test_a_rank_dying_mid_probe_ends_in_one_line():
    t = cluster(1, 3)
    plan = probe.make_plan(t, reps=1, nbytes=4096)
    t0 = time.monotonic()
    with RankPool(3, timeout=30.0) as pool, pytest.raises(CollectiveError) as info:
        pool.run(die_mid_probe, plan, probe.rank_hosts(t))
    assert time.monotonic() - t0 < 40
    msg = str(info.value)
    assert "\n" not in msg and "rank 1" in msg, msg


# ----------------------------------------------------------------------------- trees follow the measurements
def with_uplinks(t: Topology, bw: dict[str, float]) -> Topology:
    data = t.to_dict()
    for lk in data["links"]:
        ends = {lk["a"], lk["b"]}
        if "sw0" in ends:
            host = (ends - {"sw0"}).pop().split("/")[0]
            lk["bw"] = bw.get(host, lk["bw"])
    return Topology.from_dict(data)


def _interior_hosts(t: Topology, tree) -> set[str]:
    gpus = t.rank_gpus()
    return {
        t.host_of(gpus[p]) for r, p in enumerate(tree.parents) if p != -1 and t.host_of(gpus[p]) != t.host_of(gpus[r])
    }


@SETTINGS
@given(st.integers(3, 9), st.integers(1, 2), st.data(), st.sampled_from(builders.INTER_KINDS + ("kary:3",)))
def test_two_level_keeps_one_slow_host_out_of_the_interior(hosts, rph, data, inter):
    slow = data.draw(st.integers(0, hosts - 1))
    noise = data.draw(st.lists(st.floats(0.9, 1.1), min_size=hosts, max_size=hosts))
    base = cluster(hosts, rph)
    probed = with_uplinks(base, {f"h{h}": UPLINK * (0.1 if h == slow else noise[h]) for h in range(hosts)})
    tree = builders.two_level(probed, probed.rank_gpus(), hosts * rph, inter=inter, rails=False)
    assert f"h{slow}" not in _interior_hosts(probed, tree)
    if slow != 0:
        assert tree.parents[0] == -1  # rank 0 stays the root when its host is fast
    # measured within noise of each other (a factor sqrt(2)): the tree of the unprobed topology
    fair = with_uplinks(base, {f"h{h}": UPLINK * noise[h] for h in range(hosts)})
    assert (
        builders.two_level(fair, fair.rank_gpus(), hosts * rph, inter=inter, rails=False).parents
        == builders.two_level(base, base.rank_gpus(), hosts * rph, inter=inter, rails=False).parents
    )
