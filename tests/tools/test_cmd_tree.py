"""`treecoll tree check`: a tree that covers fewer ranks than the topology does not pass quietly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from treecoll.tools.cli import main


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def tree8(tmp_path):
    """A star over 8 ranks, host labels of one DGX H100."""
    f = tmp_path / "t8.yaml"
    f.write_text("name: star8\nranks: 8\nhosts: [h0, h0, h0, h0, h0, h0, h0, h0]\nparents: [-1, 0, 0, 0, 0, 0, 0, 0]\n")
    return f


def test_a_tree_over_part_of_the_topology_fails_without_ranks(capsys, tree8):
    rc, out, err = run(capsys, "tree", "check", tree8, "--topology", "dgx-h100-x2")
    assert (rc, err) == (1, "")
    assert out == (
        f"{tree8}: does not fit\n"
        "  the tree has 8 ranks, topology 'dgx-h100-x2' has 16 GPUs: ranks 8..15 (h1/gpu0 .. h1/gpu7) "
        "would have no tree; pass --ranks 8 if the tree is meant for the first 8 GPUs\n"
    )
    rc, out, _ = run(capsys, "tree", "check", tree8, "--topology", "dgx-h100-x2", "--json")
    d = json.loads(out)
    assert (rc, d["ok"], d["ranks"], d["topology_gpus"]) == (1, False, 8, 16)


def test_ranks_says_the_tree_is_meant_for_the_first_gpus(capsys, tree8):
    rc, out, _ = run(capsys, "tree", "check", tree8, "--topology", "dgx-h100-x2", "--ranks", "8", "--json")
    d = json.loads(out)
    assert (rc, d["ok"], d["problems"]) == (0, True, [])
    assert d["gpus"] == [f"h0/gpu{i}" for i in range(8)] and d["topology_gpus"] == 16
    # the whole topology of one host: no --ranks needed
    rc, out, _ = run(capsys, "tree", "check", tree8, "--topology", "dgx-h100")
    assert rc == 0 and out.rstrip().endswith("OK: the tree fits the topology")


@pytest.mark.parametrize(
    "ranks, rc, expected",
    [
        ("4", 1, "  the tree has 8 ranks, --ranks says 4\n"),
        ("40", 1, "treecoll: error: --ranks: expected at most 16 (the GPUs of topology 'dgx-h100-x2'), got 40\n"),
        ("0", 1, "treecoll: error: --ranks: expected a positive integer, got 0\n"),
    ],
)
def test_ranks_that_do_not_match(capsys, tree8, ranks, rc, expected):
    got_rc, out, err = run(capsys, "tree", "check", tree8, "--topology", "dgx-h100-x2", "--ranks", ranks)
    assert got_rc == rc and expected in (out + err)


def test_a_tree_larger_than_the_topology(capsys, tmp_path):
    f = tmp_path / "t12.yaml"
    f.write_text("ranks: 12\nparents: [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n")
    rc, out, _ = run(capsys, "tree", "check", f, "--topology", "dgx-h100")
    assert (rc, out) == (1, f"{f}: does not fit\n  the tree has 12 ranks, topology 'dgx-h100' has 8 GPUs\n")
    rc, _, err = run(capsys, "tree", "show", f, "--topology", "dgx-h100")
    assert (rc, err) == (
        1,
        "treecoll: error: ranks: expected a count in 1..8 (the GPUs of topology 'dgx-h100'), "
        "got 12; pass fewer ranks or a larger topology\n",
    )


def test_build_names_the_model_of_its_predictions(capsys):
    from treecoll.collectives.executor_cost import executor_cost
    from treecoll.collectives.placement import Placement

    from tests.helpers import shipped

    rc, out, _ = run(capsys, "tree", "build", "--topology", "cpu-local", "--builder", "chain", "--bytes", "4K")
    step = executor_cost(Placement(shipped("cpu-local"))).step_s  # gloo's, fitted at its process count
    assert (
        rc == 0
        and (
            "predicted for 4096 B, executor mode (treecoll's executor on gloo: "
            f"{step * 1e6:.1f} us per message, flow simulation): "
        )
        in out
    )
    rc, out, _ = run(
        capsys, "tree", "build", "--topology", "cpu-local", "--builder", "chain", "--bytes", "4K", "--mode", "in-kernel"
    )
    assert rc == 0 and "predicted for 4096 B, in-kernel mode (the tree inside NCCL" in out
    rc, _, err = run(capsys, "tree", "build", "--topology", "dgx-h100", "--builder", "chain", "--ranks", "9")
    assert (rc, err) == (1, "treecoll: error: --ranks: expected at most 8 (the GPUs of topology 'dgx-h100'), got 9\n")


def test_bruteforce_symmetry_reduction_finds_the_least_of_every_tree(capsys):
    """Both enumerations are exhaustive: the least over every rooted tree equals the least over the trees
    up to symmetry, and the printed best tree scores that least under the cost model."""
    from treecoll.collectives.cost import CostModel
    from treecoll.collectives.tree import Tree

    from treecoll import topo

    base = ("tree", "bruteforce", "--topology", "pcie-8gpu", "--ranks", "4", "--sizes", "8,1MiB", "--json")
    rows = {}
    for trees in ("all", "symmetry"):
        rc, out, err = run(capsys, *base, "--trees", trees)
        assert (rc, err) == (0, "")
        rows[trees] = json.loads(out)["rows"]
    t = topo.resolve("pcie-8gpu")
    model = CostModel(t, t.rank_gpus()[:4])
    for full, reduced in zip(rows["all"], rows["symmetry"]):
        assert full["brute_force_us"] == pytest.approx(reduced["brute_force_us"], rel=1e-12)
        for r in (full, reduced):
            tree = Tree.from_parents(r["best_parents"])
            assert model.best_ordered(tree, r["bytes"])[2] * 1e6 == pytest.approx(r["brute_force_us"], rel=1e-12)
            assert r["gap_ns"] == pytest.approx((r["auto_us"] - r["brute_force_us"]) * 1e3, rel=1e-9, abs=1e-9)
    # 8 B: latency bound, every message costing its rank the executor's o: a star's root handles its
    # 2 (P - 1) = 6 messages in a row, a binomial tree's root 4; auto's binomial is the best
    assert rows["all"][0]["auto"] == "binomial" and rows["all"][0]["gap_ns"] == 0.0


def test_bruteforce_refuses_more_ranks_than_it_can_enumerate(capsys):
    rc, out, err = run(capsys, "tree", "bruteforce", "--topology", "dgx-h100-x2", "--ranks", "9")
    assert (rc, out) == (1, "")
    assert err == "treecoll: error: --ranks: expected at most 8, got 9\n"


GRAPH = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-topo" / "azure-ncv4-graph.xml"


def test_an_nccl_graph_file_where_a_tree_file_is_expected_says_what_it_is(capsys, tmp_path):
    """tree show lists an NCCL_GRAPH_FILE's graphs; tree check and tree draw take tree files: given the
    graph file (or a copy not named .xml) they say what it is, not '(top level): expected a mapping'."""
    copy = tmp_path / "graph.txt"
    copy.write_text(GRAPH.read_text())
    for argv in (
        ("tree", "check", GRAPH, "--topology", "default", "--ranks", "4"),
        ("tree", "check", copy, "--topology", "default", "--ranks", "4"),
        ("tree", "draw", GRAPH, "-o", tmp_path / "g.png"),
    ):
        rc, out, err = run(capsys, *argv)
        assert (rc, out) == (1, "")
        assert err == (
            f"treecoll: error: {argv[2]}: expected a tree file (YAML or JSON: parents, children, nested or "
            "trees), got an NCCL graph file (<graphs>, NCCL_GRAPH_FILE); 'treecoll tree show' lists its "
            "graphs and channels\n"
        )
    rc, out, err = run(capsys, "tree", "show", copy)
    assert (rc, err) == (0, "") and out.startswith("graph 0 ring (pattern 4): 0 1 2 3; 0 3 2 1\n")
    rc, out, err = run(capsys, "tree", "show", GRAPH, "--topology", "default")  # not a silently ignored flag
    assert (rc, out, err) == (
        1,
        "",
        f"treecoll: error: tree show {GRAPH}: an NCCL graph file is listed, not predicted: drop --topology\n",
    )


@pytest.mark.parametrize("option", [("--bytes", "1GiB"), ("--mode", "in-kernel")])
def test_show_refuses_prediction_options_without_a_topology(capsys, tree8, option):
    """Without --topology tree show predicts nothing: --bytes or --mode would be ignored without a word."""
    rc, out, err = run(capsys, "tree", "show", tree8, *option)
    assert (rc, out) == (1, "")
    assert err == (
        f"treecoll: error: tree show: {option[0]} applies to the predictions, which need --topology; "
        "pass --topology or drop it\n"
    )
    rc, out, err = run(capsys, "tree", "show", tree8, *option, "--topology", "dgx-h100")
    assert (rc, err) == (0, "") and "predicted for" in out


def test_draw_refuses_a_topology_option_without_a_topology(capsys, tree8, tmp_path):
    """Without --topology tree draw draws ranks by depth: --max-hosts would be ignored without a word; a
    picture has no predictions, so --bytes is not one of its options."""
    png = tmp_path / "t.png"
    rc, out, err = run(capsys, "tree", "draw", tree8, "-o", png, "--max-hosts", "2")
    assert (rc, out) == (1, "") and not png.exists()
    assert err == (
        "treecoll: error: tree draw: --max-hosts applies to the topology picture, which needs --topology; "
        "pass --topology or drop it\n"
    )
    rc, out, err = run(capsys, "tree", "draw", tree8, "-o", png, "--bytes", "1GiB")
    assert (rc, out) == (1, "") and "unrecognized arguments: --bytes 1GiB" in err and not png.exists()


def test_bruteforce_all_refuses_more_trees_than_it_can_score(capsys):
    """--trees all scores P^(P-1) trees per size: 8^7 = 2,097,152 at 8 ranks (7^6 = 117,649 at 7 took
    23 s here), 9^8 = 43 million at 9: refused before any work, naming the modes that reduce them."""
    rc, out, err = run(capsys, "tree", "bruteforce", "--topology", "pcie-8gpu", "--ranks", "8", "--trees", "all")
    assert (rc, out) == (1, "")
    assert err == (
        "treecoll: error: tree bruteforce --trees all: 8 ranks make 2,097,152 rooted trees (8^7) per size: "
        "expected at most 1,000,000; pass --trees symmetry (exhaustive up to the topology's automorphisms) "
        "or fewer --ranks\n"
    )


MACHINE = ["--hosts", "2", "--gpu", "H100", "--nic", "8x400G-ib"]


def test_tree_commands_take_a_machine_of_flags_as_a_topology(capsys, tmp_path):
    """--hosts/--gpu/--nic name the machine (topo.machines.machine_topology) wherever --topology does:
    the tree built on it is the one built on the same machine written as a YAML file."""
    from treecoll.topo import dumps
    from treecoll.topo.machines import MachineFlags, machine_topology, parse_nic

    topology, _ = machine_topology(MachineFlags(hosts=2, gpu="H100", nic=parse_nic("8x400G-ib")))
    path = tmp_path / "machine.yaml"
    path.write_text(dumps(topology))
    build = ["tree", "build", "--builder", "two_level", "--bytes", "1M", "--json"]
    assert main([*build, *MACHINE]) == 0
    from_flags = json.loads(capsys.readouterr().out)
    assert main([*build, "--topology", str(path)]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert from_flags["topology"] == topology.name and from_flags["gpus"] == from_file["gpus"]
    for key in ("trees", "edge_classes", "inter_host_edges", "predicted"):
        assert from_flags[key] == from_file[key], key
    tree = tmp_path / "t.yaml"
    assert main(["tree", "build", "--builder", "two_level", *MACHINE, "-o", str(tree)]) == 0
    assert main(["tree", "check", str(tree), *MACHINE]) == 0
    assert "OK: the tree fits the topology" in capsys.readouterr().out


@pytest.mark.parametrize("cmd", [["build", "--builder", "two_level"], ["check", "TREE"], ["bruteforce"]])
def test_a_tree_command_without_a_machine_names_the_flags(cmd, capsys, tree8):
    argv = ["tree", *[str(tree8) if c == "TREE" else c for c in cmd]]
    assert main(argv) != 0
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"tree {cmd[0]}: expected the machine: --topology FILE|name, or --hosts N --gpu MODEL" in err
