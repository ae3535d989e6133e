"""The analytic engine (collectives.sim.analytic) against the flow engine where both run, and its command-line face."""

from __future__ import annotations

import json

import pytest
from treecoll.collectives.sim.analytic import ANALYTIC_ABOVE_GPUS, analytic_allreduce, choose_engine
from treecoll.collectives.sim.simulator import simulate_algorithm, simulate_nccl_algorithm, simulate_ring
from treecoll.tools.cli import main
from treecoll.topo.errors import CollectiveError

from tests.helpers import shipped
from treecoll import topo

#: the tree model's largest relative difference from the flow engine on 16 hosts (fitted on 4 and 8;
#: two_level at 1 MiB, the worst case, is 3.6% fast)
TREE_BOUND = 0.05


@pytest.mark.parametrize("size", [1 << 16, 1 << 20, 1 << 30])
def test_ring_equals_the_lockstep_ring(size):
    """The sample (one leaf group) carries the same step as the whole ring; the hop chain adds up alike."""
    for name in ("dgx-h100-x2", "dgx-h100-x16"):
        t = shipped(name)
        a = analytic_allreduce(t, "ring", size, profile="nccl-simple")
        assert a.time == pytest.approx(simulate_ring(t, size, profile="nccl-simple").time, rel=1e-9)
        assert a.stats["engine"] == "analytic"


#: 12 DGX H100 in 3 leaf groups of 4: the ring crosses between groups 3 times
GROUPS = "name: g3\nhosts: [{template: dgx-h100, count: 12}]\nnetwork: {type: rail_optimized, su_hosts: 4, spines: 2}\n"


@pytest.mark.parametrize("size", [1 << 16, 1 << 30])
def test_ring_from_a_sample_of_leaf_groups_equals_the_lockstep_ring(size, monkeypatch):
    """A sample of 2 of the 3 leaf groups: the hops between groups take the longer route (through the
    spines), counted per crossing (3 in the full ring, 2 in the sample)."""
    from treecoll.collectives.sim import analytic

    monkeypatch.setattr(analytic, "RING_SAMPLE_HOSTS", 9)
    t = topo.loads(GROUPS)
    a = analytic_allreduce(t, "ring", size, profile="nccl-simple")
    assert a.stats["model"] == "lockstep ring, 8-host sample"
    assert a.time == pytest.approx(simulate_ring(t, size, profile="nccl-simple").time, rel=1e-9)


@pytest.mark.parametrize("algo", ["two_level", "tree"])
@pytest.mark.parametrize("size", [1 << 16, 1 << 20, 1 << 26])
def test_trees_stay_near_the_flow_engine_on_16_hosts(algo, size):
    """The flow engine's answer for the same name: NCCL's tree (simulate_nccl_algorithm, rails from
    4 MiB) for ``tree``, the builder for ``two_level``."""
    t = shipped("dgx-h100-x16")
    a = analytic_allreduce(t, algo, size)
    f = simulate_nccl_algorithm(t, algo, size)
    assert abs(a.time / f.time - 1) <= TREE_BOUND
    assert a.stats["engine"] == "analytic" and len(a.stats["sample_time_s"]) == 2


def test_small_clusters_are_the_flow_engine_itself():
    t = shipped("dgx-h100-x2")
    a = analytic_allreduce(t, "two_level", 1 << 20)
    assert a.time == simulate_algorithm(t, "two_level", 1 << 20).time and a.stats["engine"] == "flow"


def test_auto_is_the_faster_tree():
    t = shipped("dgx-h100-x16")
    a = analytic_allreduce(t, "auto", 1 << 20)
    both = [analytic_allreduce(t, x, 1 << 20).time for x in ("two_level", "tree")]
    assert a.time == min(both)


def test_choices_and_refusals():
    assert choose_engine("auto", ANALYTIC_ABOVE_GPUS) == "flow"
    assert choose_engine("auto", ANALYTIC_ABOVE_GPUS + 1) == "analytic"
    with pytest.raises(CollectiveError, match="engine 'fast': expected one of"):
        choose_engine("fast", 8)
    t = shipped("dgx-h100-x2")
    with pytest.raises(CollectiveError, match="algorithm 'kary:4' is not modelled"):
        analytic_allreduce(t, "kary:4", 1 << 20)
    with pytest.raises(CollectiveError, match=r"the same number of GPUs on every host, got \[3, 8\]"):
        analytic_allreduce(t, "ring", 1 << 20, ranks=t.rank_gpus()[:11])


def test_the_command_names_its_engine(capsys):
    assert (
        main(
            [
                "simulate",
                "allreduce",
                "--topology",
                "dgx-h100-x16",
                "--algo",
                "ring,nccl",
                "--sizes",
                "1M",
                "--engine",
                "analytic",
                "--json",
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert d["engine"] == "analytic" and d["rows"][0]["algos"]["ring"]["how"].endswith("(analytic)")
    assert main(["simulate", "allreduce", "--topology", "dgx-h100-x2", "--algo", "ring", "--sizes", "1M"]) == 0
    assert "flow simulation" in capsys.readouterr().out.splitlines()[0]
    assert (
        main(
            [
                "simulate",
                "allreduce",
                "--topology",
                "dgx-h100-x2",
                "--algo",
                "nvls",
                "--sizes",
                "1M",
                "--engine",
                "analytic",
            ]
        )
        != 0
    )
    err = capsys.readouterr().err.strip()
    assert "--algo nvls: not modelled by the analytic engine" in err and "\n" not in err


@pytest.mark.parametrize(
    "extra, says",
    [
        # executor mode: collectives.allreduce(x), NCCL's own allreduce where the model says it is faster
        ((), "auto: what collectives.allreduce(x) runs, the backend's own allreduce where faster"),
        # in-kernel: the tree the auto builder picks, run inside NCCL
        (("--mode", "in-kernel"), "auto: the tree builder auto's tree"),
        # the analytic engine: the faster of two_level and the double binary tree (no tree search)
        (("--engine", "analytic"), "auto: the faster of two_level and tree)"),
    ],
)
def test_the_auto_column_says_what_it_is_in_every_mode(capsys, extra, says):
    """The column 'auto' is three different quantities (at 1 GiB on 128 GPUs: 6045.8, 10004.2 and 13152.1
    us); the header names the one printed, and the analytic engine says why it is in-kernel."""
    argv = ["simulate", "allreduce", "--topology", "dgx-h100-x16", "--algo", "auto", "--sizes", "1M", *extra]
    assert main(argv) == 0
    head = capsys.readouterr().out.splitlines()[1]
    assert head.startswith("# auto: ") and says in head
    if "analytic" in extra:
        assert "in-kernel mode (the analytic engine models NCCL's kernels only" in head
