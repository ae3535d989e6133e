"""The placement object, the one rank rule, and the planner's bounded caches.

Groups (equality by the group object, nothing kept alive after destroy) run with real
processes in test_gloo.py."""

from __future__ import annotations

import pytest
from treecoll.collectives import CostModel, build
from treecoll.collectives.placement import Placement, as_placement
from treecoll.collectives.planner import LRU, Planner
from treecoll.collectives.sim.simulator import simulate_algorithm
from treecoll.topo import resolve
from treecoll.topo.errors import CollectiveError, PlacementError
from treecoll.topo.ranks import resolve_gpus

T = resolve("dgx-h100-x2")  # 2 hosts x 8 GPUs: h0/gpu0..7 are ranks 0..7, h1/gpu0..7 ranks 8..15


def test_an_int_is_a_count_a_sequence_names_gpus():
    assert resolve_gpus(T, 2) == ("h0/gpu0", "h0/gpu1")  # the first two ranks
    assert resolve_gpus(T, [2]) == ("h0/gpu2",)  # topology rank 2
    assert resolve_gpus(T, [9, "h0/gpu1"]) == ("h1/gpu1", "h0/gpu1")
    assert resolve_gpus(T, None) == T.rank_gpus() and len(resolve_gpus(T)) == 16
    # every place that takes ranks applies the same rule
    assert T.with_ranks(2).rank_gpus() == ("h0/gpu0", "h0/gpu1")
    assert T.with_ranks([9, 8]).rank_gpus() == ("h1/gpu1", "h1/gpu0")
    assert CostModel(T, 2).gpus == ("h0/gpu0", "h0/gpu1") and CostModel(T, [2]).gpus == ("h0/gpu2",)
    assert Placement(T, 3).gpus == ("h0/gpu0", "h0/gpu1", "h0/gpu2")


@pytest.mark.parametrize(
    "ranks, message",
    [
        (0, r"^ranks: expected a count in 1\.\.16 \(the GPUs of topology 'dgx-h100-x2'\), got 0"),
        (17, r"^ranks: expected a count in 1\.\.16 .*, got 17; pass fewer ranks or a larger topology$"),
        ([0, 16], r"^ranks\[1\]: expected a topology rank in 0\.\.15 of topology 'dgx-h100-x2', got 16$"),
        (["h0/gpu0", "h0/nic0"], r"^ranks\[1\]: expected a GPU of topology 'dgx-h100-x2' .*, got 'h0/nic0'$"),
        ([1, "h0/gpu1"], r"^ranks\[1\]: GPU 'h0/gpu1' is already rank 0; each GPU takes one rank$"),
        ([], r"^ranks: expected at least one GPU, got an empty sequence$"),
        ("h0/gpu0", r"^ranks: expected None, a count or a sequence .*, got str 'h0/gpu0'$"),
        (True, r"^ranks: expected None, a count or a sequence .*, got bool True$"),
    ],
)
def test_bad_ranks_are_one_line_errors(ranks, message):
    with pytest.raises(PlacementError, match=message):
        Placement(T, ranks)


def test_placement_is_frozen_hashable_and_compared_by_what_it_places():
    p = Placement(T, 4)
    same = Placement(T, ["h0/gpu0", "h0/gpu1", "h0/gpu2", "h0/gpu3"])
    assert p == same and hash(p) == hash(same) and {p: 1}[same] == 1
    assert p != Placement(T, [0, 1, 2, 8]) and p != Placement(T, 5) and p != Placement(ranks=4)
    assert p != Placement(T.with_ranks([1, 0, 2, 3]), 4)  # another topology (fingerprint)
    assert p.plan_key == (T.fingerprint(), p.gpus, 4) and p.group is None
    with pytest.raises(AttributeError, match="Placement is frozen"):
        p.nranks = 5
    with pytest.raises(AttributeError, match="Placement is frozen"):
        del p.gpus
    assert repr(p) == "Placement(topology='dgx-h100-x2', nranks=4 (h0/gpu0..h0/gpu3), group=default)"


def test_without_a_topology_a_placement_is_a_count():
    p = Placement(ranks=8)
    assert (p.topology, p.gpus, p.nranks) == (None, None, 8)
    with pytest.raises(PlacementError, match=r"^placement: expected a topology, a rank count or a process group"):
        Placement()
    with pytest.raises(PlacementError, match=r"^placement: without a topology ranks expected a count, got list"):
        Placement(None, ["h0/gpu0"])
    with pytest.raises(PlacementError, match=r"^placement: ranks expected a count >= 1, got 0$"):
        Placement(ranks=0)
    with pytest.raises(PlacementError, match=r"^placement: topology expected a Topology or None, got str$"):
        Placement("dgx-h100-x2")


def test_the_boundary_converts_loose_arguments_once():
    p = Placement(T, 4)
    assert as_placement(p) is p and as_placement(T, 4) == p and as_placement(T, nranks=4) == p
    assert as_placement(None, nranks=3) == Placement(ranks=3)
    with pytest.raises(PlacementError, match=r"^cost model: got a Placement and loose ranks/group"):
        CostModel(p, 2)
    with pytest.raises(PlacementError, match=r"^builder 'chain': maps 4 ranks, expected 3"):
        build("chain", p, nranks=3)
    # the builders, the cost model and the simulator take a placement as they take a topology
    assert build("two_level", p, nbytes=1 << 20) == build("two_level", T, 4, nbytes=1 << 20)
    assert CostModel(p).gpus == p.gpus
    assert simulate_algorithm(p, "ring", 1 << 20).time == simulate_algorithm(T, "ring", 1 << 20, ranks=4).time
    with pytest.raises(PlacementError, match=r"^simulate ring: expected a placement with a topology"):
        simulate_algorithm(Placement(ranks=4), "ring", 1 << 20)


def test_planner_caches_are_bounded_and_clearable():
    planner = Planner(max_entries=2)
    p = Placement(ranks=6)
    scheds = [
        planner.schedule_for(name, collective="allreduce", nbytes=4096, placement=p, algo="tree")[1]
        for name in ("chain", "binomial", "kary:3")
    ]
    assert len(planner.schedules) == 2 and len(planner.plans) == 2  # the oldest went first
    assert planner.schedule_for("kary:3", collective="allreduce", nbytes=4096, placement=p, algo="tree")[1] is scheds[2]
    assert (
        planner.schedule_for("chain", collective="allreduce", nbytes=4096, placement=p, algo="tree")[1] is not scheds[0]
        and planner.schedules.keys()[-1][0] == planner.plans.values()[-1].fingerprint()
    )
    assert len(planner) > 0
    planner.clear()
    assert len(planner) == 0 and len(planner.schedules) == 0
    lru = LRU(2)
    lru["a"], lru["b"] = 1, 2
    assert lru.get("a") == 1 and lru.get("zz", 0) == 0
    lru["c"] = 3
    assert lru.keys() == ["a", "c"]  # "b" was the least recently used
    with pytest.raises(CollectiveError, match=r"^cache: maxsize expected >= 1, got 0$"):
        LRU(0)
