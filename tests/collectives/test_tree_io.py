"""Tree files (YAML/JSON), NCCL graph XML, and the `treecoll tree` command."""

from __future__ import annotations

import json

import pytest
from treecoll.collectives import MultiTree, Tree, build
from treecoll.collectives.tree_io import load_nccl_graph, load_tree, loads_nccl_graph, loads_tree, save_tree
from treecoll.tools.cli import main
from treecoll.topo.errors import TreeError

from tests.helpers import FIXTURES, ROOT

GRAPH_XML = FIXTURES / "nccl-topo" / "azure-ncv4-graph.xml"


@pytest.mark.parametrize(
    "plan",
    [build("binomial", nranks=6), build("double_binary", nranks=5), Tree.from_children([[2, 1], [], [3], []])],
    ids=["binomial", "dbt", "ordered"],
)
def test_round_trip(plan, tmp_path):
    path = tmp_path / "t.yaml"
    save_tree(plan, path, hosts=[f"h{r // 2}" for r in range(plan.size)])
    f = load_tree(path)
    assert f.plan == plan and f.plan.fingerprint() == plan.fingerprint()
    assert f.hosts == tuple(f"h{r // 2}" for r in range(plan.size))
    js = tmp_path / "t.json"
    js.write_text(json.dumps({"parents": list(build("chain", nranks=3).parents)}))
    assert load_tree(js).plan == build("chain", nranks=3)


def test_forms():
    nested = "nested:\n  rank: 0\n  children:\n    - rank: 1\n    - rank: 2\n      children: [{rank: 3}]\n"
    assert loads_tree(nested).plan.parents == (-1, 0, 0, 2)
    assert loads_tree("children: [[2, 1], [], [], ]").plan.children[0] == (2, 1)
    m = loads_tree("trees:\n  - {parents: [-1, 0], share: 0.25}\n  - {parents: [1, -1], share: 0.75}\n").plan
    assert isinstance(m, MultiTree) and m.shares == (0.25, 0.75)


@pytest.mark.parametrize(
    "text, match",
    [
        ("parents: [-1, 0, 7]\n", r"t.yaml:1: parents\[2\]: expected a rank in 0..2 or -1, got 7"),
        ("name: x\nparents: [-1, -1]\n", r"t.yaml:2: parents: tree: expected exactly one root"),
        ("parents: [-1, 0]\nranks: 3\n", r"t.yaml:2: ranks: expected the tree's 2 ranks, got 3"),
        ("parents: [-1, 0]\nhosts: [a]\n", r"t.yaml:2: hosts: expected 2 host labels"),
        ("parents: [-1]\nchildren: [[]]\n", r"t.yaml:1: \(top level\): expected exactly one of"),
        (
            "trees:\n  - {parents: [-1, 0], share: 0.5}\n  - {parents: [-1, 0], share: 0.2}\n",
            r"t.yaml:1: trees: expected shares summing to 1, got 0.7",
        ),
        ("nested: {rank: 0, children: [{rank: 0}]}\n", r"t.yaml:1: nested.children\[0\].rank: rank 0 appears twice"),
        (
            "parents: [-1, 0\n",
            (
                r"^t.yaml:2: invalid YAML: did not find expected ',' or '\]' \(while parsing a flow "
                r"sequence started on line 1\)$"
            ),
        ),
        ("parents: [-1]\nparents: [-1, 0]\n", r"^t.yaml:2: duplicate key 'parents': each key may appear once"),
        ("parents: [-1, \x07]\n", r"^t.yaml:1: invalid YAML: .*'\\x07'"),
        ("parents: [-1, [[[0]]]]\n", r"^t.yaml:1: parents\[1\]: expected a rank in 0..1 or -1, got a list"),
        ("colour: red\n", r"t.yaml:1: colour: unknown key 'colour'"),
    ],
)
def test_errors_name_file_line_and_key(text, match):
    with pytest.raises(TreeError, match=match):
        loads_tree(text, "t.yaml")


def test_nccl_graph_xml_fixture():
    graphs = load_nccl_graph(GRAPH_XML)
    ring = [g for g in graphs if g.is_ring][0]
    assert ring.channels == ((0, 1, 2, 3), (0, 3, 2, 1))
    s = ring.schedule()
    assert s.collective == "allreduce" and s.nchunks == 8
    assert s.bytes_sent(0, 800) == 2 * 3 * 800 // 4
    trees = [g for g in graphs if not g.is_ring]
    assert trees and all(isinstance(g.plan(), MultiTree) for g in trees)
    assert trees[0].plan().trees[0].parents == (-1, 0, 1, 2)  # NCCL's intra-node chain


def test_nccl_graph_errors():
    with pytest.raises(TreeError, match="g.xml: root element expected <graphs>"):
        loads_nccl_graph("<graph/>", "g.xml")
    with pytest.raises(TreeError, match=r"channel\[0\]: expected ranks 0..1 each once"):
        loads_nccl_graph(
            '<graphs><graph id="0" pattern="4"><channel><gpu dev="0"/><gpu dev="0"/></channel></graph></graphs>',
            "g.xml",
        )


# ---------------------------------------------------------------------- CLI
def test_cli_build_two_level_on_dgx_h100_x16(capsys, tmp_path):
    out = tmp_path / "tree.yaml"
    assert (
        main(
            [
                "tree",
                "build",
                "--topology",
                str(ROOT / "topologies" / "dgx-h100-x16.yaml"),
                "--builder",
                "two_level",
                "--rails",
                "no",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "edges: 15 NET, 112 NVL; inter-host edges: 15" in text
    assert "├── r8 h1/gpu0  [NET" in text and "r1 h0/gpu1  [NVL nvlink" in text
    assert load_tree(out).plan.size == 128
    assert main(["tree", "show", str(out), "--topology", "dgx-h100-x16", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["inter_host_edges"] == 15 and data["edge_classes"] == {"NET": 15, "NVL": 112}
    edges = data["trees"][0]["edges"]
    assert all(e["kinds"] == ["nvlink"] for e in edges if not e["inter_host"])


def test_cli_show_check_draw(capsys, tmp_path):
    f = tmp_path / "t.yaml"
    save_tree(build("chain", nranks=4), f)
    assert main(["tree", "show", str(f)]) == 0
    assert "└── r1" in capsys.readouterr().out
    assert main(["tree", "check", str(f), "--topology", "dgx-h100", "--ranks", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] and d["ratio_to_auto"] >= 1.0 - 1e-9
    bad = tmp_path / "bad.yaml"
    save_tree(build("chain", nranks=4), bad, hosts=["x", "x", "x", "x"])
    assert main(["tree", "check", str(bad), "--topology", "dgx-h100", "--ranks", "4"]) == 1
    assert "file says host 'x'" in capsys.readouterr().out
    pytest.importorskip("matplotlib")
    png = tmp_path / "t.png"
    assert main(["tree", "draw", str(f), "--topology", "dgx-h100", "-o", str(png), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["over_topology"] and d["edges_drawn"] == 3  # every edge of the 4-rank chain, over the host
    assert png.stat().st_size > 1000
    alone = tmp_path / "alone.png"
    assert main(["tree", "draw", str(f), "-o", str(alone), "--json"]) == 0
    assert "over_topology" not in json.loads(capsys.readouterr().out) and alone.stat().st_size > 1000
    # two hosts drawn: the two_level tree's inter-host edge is drawn too
    two = tmp_path / "two.yaml"
    assert (
        main(["tree", "build", "--topology", "dgx-h100-x2", "--builder", "two_level", "--rails", "no", "-o", str(two)])
        == 0
    )
    capsys.readouterr()
    assert main(["tree", "draw", str(two), "--topology", "dgx-h100-x2", "-o", str(png), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["edges_drawn"] == 15


def test_cli_errors(capsys):
    assert main(["tree", "build", "--topology", "dgx-h100", "--builder", "nope"]) == 1
    assert "builder 'nope': unknown; valid names are" in capsys.readouterr().err
    assert main(["tree", "build", "--topology", "dgx-h100", "--builder", "chain", "--bytes", "lots"]) == 1
    assert "--bytes: expected a size" in capsys.readouterr().err
    assert main(["tree", "show", "/nonexistent.yaml"]) == 1
    assert "cannot read tree file" in capsys.readouterr().err


def test_cli_show_nccl_graph(capsys):
    assert main(["tree", "show", str(GRAPH_XML)]) == 0
    assert "graph 0 ring (pattern 4): 0 1 2 3; 0 3 2 1" in capsys.readouterr().out


# ---------------------------------------------------------------------- tree files into the executor
def _allreduce_ranks(n, tree):
    import torch
    from treecoll.collectives.execute import CollectiveOptions, allreduce
    from treecoll.collectives.local import run_ranks

    xs = [torch.full((6,), float(r + 1)) for r in range(n)]
    opts = CollectiveOptions(nchunks=2, timeout=10)
    return run_ranks(n, lambda r, t: allreduce(xs[r], tree=tree, options=opts, _transport=t))


def test_executor_takes_tree_objects_files_and_paths(tmp_path, monkeypatch):
    import pathlib

    from treecoll.collectives.ops import resolve_op
    from treecoll.collectives.placement import Placement
    from treecoll.collectives.planner import Planner

    multi = MultiTree((Tree.from_parents([-1, 0, 0, 2]), Tree.from_parents([2, 0, -1, 2])), (0.25, 0.75))
    path = tmp_path / "two.yaml"
    save_tree(multi, path, hosts=["h0", "h0", "h1", "h1"])
    nested = tmp_path / "nested.yml"
    nested.write_text("nested: {rank: 0, children: [{rank: 3}, {rank: 1, children: [{rank: 2}]}]}\n")
    monkeypatch.chdir(tmp_path)
    for tree in (multi, load_tree(path), str(path), path, "two.yaml", pathlib.PurePath("two.yaml"), "nested.yml"):
        assert all(v.tolist() == [10.0] * 6 for v in _allreduce_ranks(4, tree)), tree

    planner = Planner()

    def plan(tree, topology=None):
        return planner.plan_for(
            tree, collective="allreduce", nbytes=8, placement=Placement(topology, 4), op=resolve_op("sum")
        )

    assert plan(str(path)) == multi and plan(path) == multi and plan(load_tree(path)) == multi
    assert plan("nested.yml").parents == (-1, 0, 1, 0)
    # a file edited between calls is read again
    save_tree(Tree.from_parents([-1, 0, 1, 2]), path)
    assert plan(str(path)).parents == (-1, 0, 1, 2)
    # host labels are checked against the topology's placement of the ranks
    from treecoll import topo

    cpu = topo.resolve("cpu-local")  # h0/gpu0, h0/gpu1, h1/gpu0, h1/gpu1
    save_tree(multi, path, hosts=["a", "a", "b", "b"])
    assert plan(str(path), topology=cpu) == multi
    save_tree(multi, path, hosts=["a", "b", "a", "b"])
    with pytest.raises(
        TreeError,
        match=r"two.yaml: hosts: ranks 0 and 1 are labelled 'a' and 'b', but topology "
        r"'cpu-local' puts both on host 'h0'; the file was made for another rank",
    ):
        plan(str(path), topology=cpu)
    save_tree(multi, path, hosts=["a", "a", "a", "b"])
    with pytest.raises(
        TreeError,
        match=r"two.yaml: hosts: ranks 0 and 2 are both labelled 'a', but topology "
        r"'cpu-local' puts them on hosts 'h0' and 'h1'",
    ):
        plan(str(path), topology=cpu)


def test_executor_tree_argument_errors(tmp_path, monkeypatch):
    from treecoll.collectives.tree_io import resolve_tree_arg

    monkeypatch.chdir(tmp_path)
    names = r"\['auto', 'binomial', 'chain', 'double_binary', 'kary', 'star', 'two_level'\]"
    with pytest.raises(
        TreeError,
        match=rf"^tree 'mytree.yaml': no such tree file, and not a builder name "
        rf"\(valid builder names are {names}\)$",
    ):
        _allreduce_ranks(2, "mytree.yaml")
    with pytest.raises(TreeError, match=r"^tree 'trees/mine': no such tree file, and not a builder name"):
        resolve_tree_arg("trees/mine")
    with pytest.raises(TreeError, match=rf"^builder 'binomal': unknown; valid names are {names}$"):
        _allreduce_ranks(2, "binomal")
    with pytest.raises(
        TreeError,
        match=r"^tree: expected a Tree, MultiTree, loaded tree file \(TreeFile\), tree "
        r"file path or builder name, got int$",
    ):
        _allreduce_ranks(2, 3)
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(TreeError, match=r"d.yaml: cannot read tree file: expected a file, got a directory"):
        _allreduce_ranks(2, "d.yaml")
    save_tree(build("chain", nranks=3), tmp_path / "three.json")
    with pytest.raises(
        TreeError,
        match=r"^three.json: tree 'chain': spans 3 ranks, the group has 4; build it for "
        r"4 ranks$",
    ):
        _allreduce_ranks(4, "three.json")
    # a file named like a builder is not read in its place; "./name" reads it
    save_tree(build("star", nranks=3), tmp_path / "chain")
    assert resolve_tree_arg("chain") == "chain" and resolve_tree_arg("./chain").plan == build("star", nranks=3)
