"""Tree files (YAML/JSON), NCCL graph XML, and the `treecoll tree` command."""
from __future__ import annotations

import json

import pytest
from _coll_helpers import FIXTURES, ROOT

from collectives import MultiTree, Tree, build
from collectives.tree_io import load_nccl_graph, load_tree, loads_nccl_graph, loads_tree, save_tree
from tools.cli import main
from topo.errors import TreeError

GRAPH_XML = FIXTURES / "nccl-topo" / "azure-ncv4-graph.xml"


@pytest.mark.parametrize("plan", [build("binomial", nranks=6), build("double_binary", nranks=5),
                                  Tree.from_children([[2, 1], [], [3], []])], ids=["binomial", "dbt", "ordered"])
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


@pytest.mark.parametrize("text, match", [
    ("parents: [-1, 0, 7]\n", r"t.yaml:1: parents\[2\]: expected a rank in 0..2 or -1, got 7"),
    ("name: x\nparents: [-1, -1]\n", r"t.yaml:2: parents: tree: expected exactly one root"),
    ("parents: [-1, 0]\nranks: 3\n", r"t.yaml:2: ranks: expected the tree's 2 ranks, got 3"),
    ("parents: [-1, 0]\nhosts: [a]\n", r"t.yaml:2: hosts: expected 2 host labels"),
    ("parents: [-1]\nchildren: [[]]\n", r"t.yaml:1: \(top level\): expected exactly one of"),
    ("trees:\n  - {parents: [-1, 0], share: 0.5}\n  - {parents: [-1, 0], share: 0.2}\n",
     r"t.yaml:1: trees: expected shares summing to 1, got 0.7"),
    ("nested: {rank: 0, children: [{rank: 0}]}\n", r"t.yaml:1: nested.children\[0\].rank: rank 0 appears twice"),
    ("parents: [-1, 0\n", r"t.yaml:2: invalid YAML/JSON"),
    ("colour: red\n", r"t.yaml:1: colour: unknown key 'colour'"),
])
def test_errors_name_file_line_and_key(text, match):
    with pytest.raises(TreeError, match=match):
        loads_tree(text, "t.yaml")


@pytest.mark.skipif(not GRAPH_XML.exists(), reason="../shared/fixtures not present")
def test_nccl_graph_xml_fixture():
    graphs = load_nccl_graph(GRAPH_XML)
    ring = [g for g in graphs if g.is_ring][0]
    assert ring.channels == ((0, 1, 2, 3), (0, 3, 2, 1))
    s = ring.schedule()
    assert s.collective == "allreduce" and s.nchunks == 8
    assert s.bytes_sent(0, 800) == 2 * 3 * 800 // 4
    trees = [g for g in graphs if not g.is_ring]
    assert trees and all(isinstance(g.plan(), MultiTree) for g in trees)
    assert trees[0].plan().trees[0].parents == (-1, 0, 1, 2)     # NCCL's intra-node chain


def test_nccl_graph_errors():
    with pytest.raises(TreeError, match="g.xml: root element expected <graphs>"):
        loads_nccl_graph("<graph/>", "g.xml")
    with pytest.raises(TreeError, match=r"channel\[0\]: expected ranks 0..1 each once"):
        loads_nccl_graph('<graphs><graph id="0" pattern="4"><channel><gpu dev="0"/><gpu dev="0"/></channel>'
                         '</graph></graphs>', "g.xml")


# ---------------------------------------------------------------------- CLI
def test_cli_build_two_level_on_dgx_h100_x16(capsys, tmp_path):
    out = tmp_path / "tree.yaml"
    assert main(["tree", "build", "--topology", str(ROOT / "topologies" / "dgx-h100-x16.yaml"), "--builder", "two_level",
                 "-o", str(out)]) == 0
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
    assert d["over_topology"] and d["edges_drawn"] == 3      # every edge of the 4-rank chain, over the host
    assert png.stat().st_size > 1000
    alone = tmp_path / "alone.png"
    assert main(["tree", "draw", str(f), "-o", str(alone), "--json"]) == 0
    assert "over_topology" not in json.loads(capsys.readouterr().out) and alone.stat().st_size > 1000
    # two hosts drawn: the two_level tree's inter-host edge is drawn too
    two = tmp_path / "two.yaml"
    assert main(["tree", "build", "--topology", "dgx-h100-x2", "--builder", "two_level", "-o", str(two)]) == 0
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


@pytest.mark.skipif(not GRAPH_XML.exists(), reason="../shared/fixtures not present")
def test_cli_show_nccl_graph(capsys):
    assert main(["tree", "show", str(GRAPH_XML)]) == 0
    assert "graph 0 ring (pattern 4): 0 1 2 3; 0 3 2 1" in capsys.readouterr().out
