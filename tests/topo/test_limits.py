"""Caps on a topology's size (topo.limits): counted before anything is built, exact, overridable."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from treecoll.topo import TopologyError
from treecoll.topo.limits import DEFAULT_MAX_LINKS, DEFAULT_MAX_NODES, limits

from tests.helpers import BOX
from treecoll import topo

ROOT = Path(__file__).resolve().parents[2]
# a DGX H100 host (topologies/dgx-h100.yaml), counted by hand: 8 GPUs + 4 NVSwitches + 2 CPUs + 8 PCIe switches
# + 8 NICs = 30 nodes; links: 8 x 4 GPU-NVSwitch + 1 SMP + 8 switch-CPU + 8 GPU-switch + 8 NIC-switch = 57 pairs
DGX_NODES, DGX_PAIRS = 30, 57


def rail_cluster(hosts: int, su: int, spines: int) -> tuple[int, int]:
    """Nodes and directed links of ``hosts`` DGX H100 on a rail-optimized fat tree, counted by hand:
    8 rail leaves per scalable unit, every leaf linked to every spine, one NIC-leaf link per NIC."""
    leaves = 8 * -(-hosts // su)
    return hosts * DGX_NODES + leaves + spines, 2 * (hosts * DGX_PAIRS + 8 * hosts + leaves * spines)


def peak_mb(fn) -> float:
    """Peak Python memory (MB) while ``fn`` runs and raises TopologyError (checked)."""
    tracemalloc.start()
    try:
        with pytest.raises(TopologyError):
            fn()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "edit, where, counts",
    [
        (
            ("count: 2, numa", "count: 1000000000, numa"),
            r"<string>:3: templates\.box\.gpus\.count: one host of template 'box' would",
            "1,000,000,001 nodes and 2,000,000,000 directed links",
        ),
        (
            ("count: 2}]", "count: 1000000000}]"),
            r"<string>:7: hosts\[0\]\.count: 1,000,000,000 hosts of template 'box' \(4 nodes and 6 directed links each",
            "4,000,000,000 nodes and 6,000,000,000 directed links",
        ),
        (
            ("count: 1, bw", "count: 1000000000, bw"),
            r"<string>:6: templates\.box\.nics\.count:",
            "1,000,000,003 nodes and 2,000,000,004 directed links",
        ),
        (
            ("    pcie:", "    nvswitch: {count: 1000000, links: 1, link_bw: 20.0}\n    pcie:"),
            r"<string>:5: templates\.box\.nvswitch\.count:",
            "1,000,004 nodes and 4,000,006 directed links",
        ),
        (
            (
                "cpus: [{numa: 0}]",
                "cpus: [" + ", ".join(f"{{numa: {i}}}" for i in range(2001)) + "]\n    smp: {bw: 10.0}",
            ),
            r"<string>:4: templates\.box\.cpus:",
            "2,001 nodes and 4,002,000 directed links",
        ),  # the full SMP mesh
        (
            ("{type: single_switch}", "{type: fat_tree, leaf_size: 1, spines: 1000000000}"),
            r"<string>:8: network\.spines: the hosts and a network of 2 leaves x 1,000,000,000 spines",
            "1,000,000,010 nodes and 4,000,000,016 directed links",
        ),
    ],
)
def test_counts_that_multiply_are_refused_before_allocation(edit, where, counts):
    text = BOX.replace(*edit)
    assert text != BOX
    with pytest.raises(
        TopologyError,
        match=rf"^{where}.* make {counts}: expected at most 1,000,000 nodes and "
        rf"4,000,000 links \(the caps\); to load it anyway raise the caps",
    ):
        topo.loads(text)
    assert peak_mb(lambda: topo.loads(text)) < 20  # refused before the nodes were made


def test_a_tiny_oversubscription_is_refused_not_turned_into_infinite_uplinks():
    text = BOX.replace("{type: single_switch}", "{type: fat_tree, leaf_size: 4, oversubscription: 1.0e-300}")
    with pytest.raises(
        TopologyError,
        match=r"^<string>:8: network\.oversubscription: 4 ports per leaf / "
        r"oversubscription 1e-300 ask for 4e\+300 uplink ports per leaf: "
        r"expected at most 4,000,000 \(the links cap\)$",
    ):
        topo.loads(text)


def test_the_count_is_exact_on_the_largest_shipped_cluster():
    nodes, links = rail_cluster(1024, 32, 16)
    assert (nodes, links) == (30992, 141312)
    p = ROOT / "topologies" / "dgx-h100-x1024.yaml"
    t = topo.load(p, max_nodes=nodes, max_links=links)  # exactly at the caps: loads
    assert (t.graph.number_of_nodes(), t.graph.number_of_edges()) == (nodes, links)
    with pytest.raises(
        TopologyError,
        match=r"dgx-h100-x1024\.yaml:22: network\.spines: the hosts and a network of "
        r"256 leaves x 16 spines make 30,992 nodes and 141,312 directed links: "
        r"expected at most 30,991 nodes",
    ):
        topo.load(p, max_nodes=nodes - 1)


def test_default_caps_leave_room_for_16384_gpus_and_more():
    nodes, links = rail_cluster(2048, 32, 16)  # 16,384 GPUs
    assert nodes * 16 < DEFAULT_MAX_NODES and links * 14 < DEFAULT_MAX_LINKS
    text = "hosts: [{template: dgx-h100, count: 2048}]\nnetwork: {type: rail_optimized, su_hosts: 32, spines: 16}\n"
    with pytest.raises(
        TopologyError,
        match=r"hosts\[0\]\.count: 2,048 hosts of template 'dgx-h100' \(30 nodes and "
        r"114 directed links each",
    ):
        topo.loads(text, max_nodes=2048 * DGX_NODES - 1)  # refused at the group: the count is the hand count


def test_explicit_lists_count_too(monkeypatch):
    text = topo.dumps(topo.loads(BOX))
    with pytest.raises(
        TopologyError,
        match=r"^<string>:\d+: nodes: 9 nodes and 8 links listed .* make 9 nodes and "
        r"16 directed links: expected at most 8 nodes",
    ):
        topo.loads(text, max_nodes=8)
    assert len(topo.loads(text, max_nodes=9, max_links=16).gpus()) == 4


def test_environment_variables_set_the_caps_and_keywords_win(monkeypatch):
    monkeypatch.setenv("TREECOLL_MAX_NODES", "8")
    with pytest.raises(TopologyError, match="expected at most 8 nodes"):
        topo.loads(BOX)
    assert len(topo.loads(BOX, max_nodes=9).gpus()) == 4
    monkeypatch.setenv("TREECOLL_MAX_NODES", "1_000")
    monkeypatch.setenv("TREECOLL_MAX_LINKS", "15")
    with pytest.raises(TopologyError, match="expected at most 1,000 nodes and 15 links"):
        topo.loads(BOX)
    monkeypatch.setenv("TREECOLL_MAX_LINKS", "lots")
    with pytest.raises(TopologyError, match=r"^TREECOLL_MAX_LINKS='lots': expected a positive integer"):
        topo.loads(BOX)
    with pytest.raises(TopologyError, match=r"^max_nodes: expected a positive integer, got 0$"):
        limits(max_nodes=0)


def test_importers_take_the_caps(tmp_path):
    from treecoll.topo.nccl_xml import export_xml, import_xml
    from treecoll.topo.smi import import_smi, render_smi

    t = topo.load(ROOT / "topologies" / "dgx-h100.yaml")
    with pytest.raises(TopologyError, match=r"^<string>: \d+ XML elements and 2 CPUs .*expected at most 10 nodes"):
        import_xml(export_xml(t), max_nodes=10)
    with pytest.raises(
        TopologyError,
        match=r"^m\.txt: 16 devices make 64 nodes and 608 directed links: expected at "
        r"most 10 nodes",
    ):
        import_smi(render_smi(t), source="m.txt", max_nodes=10)
    f = tmp_path / "m.txt"
    f.write_text(render_smi(t))
    with pytest.raises(TopologyError, match=rf"^{f}: 16 devices"):
        topo.import_file(f, max_nodes=10)
    with pytest.raises(TopologyError, match=rf"^{f}: 16 devices"):
        topo.resolve(str(f), max_nodes=10)
