"""nvidia-smi topo -m import: every real paste rebuilds a host whose own matrix prints the same codes."""

from pathlib import Path

import pytest
from treecoll.topo.smi import import_smi, parse_smi, render_smi

from treecoll import topo

FIX = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "smi"
FILES = sorted(FIX.glob("*.txt"))


def _check_round_trip(t, parsed):
    cols = t.meta["columns"]
    for (a, b), code in parsed["codes"].items():
        want = "SYS" if code == "SOC" else code
        assert t.path(cols[a], cols[b]).smi == want, (a, b)


@pytest.mark.parametrize("f", FILES, ids=lambda p: p.name)
def test_every_fixture_prints_back_its_codes(f):
    text = f.read_text()
    t = import_smi(str(f))
    p = parse_smi(text)
    assert t.meta["smi_mismatches"] == []
    _check_round_trip(t, p)
    assert len(t.gpus()) == len(p["gpus"]) and len(t.nics()) == len(p["nics"])
    # the rendered matrix parses back to the same codes (up to NIC naming)
    again = parse_smi(render_smi(t))
    label = {**{d: d for d in p["gpus"]}}
    nic_ids = list(t.nics())
    for i, n in enumerate(nic_ids):
        label[f"NIC{i}"] = next(c for c, v in t.meta["columns"].items() if v == n)
    assert {(label[a], label[b]): c for (a, b), c in again["codes"].items()} == {
        k: ("SYS" if v == "SOC" else v) for k, v in p["codes"].items()
    }


def test_structures_are_the_expected_ones():
    b200 = import_smi(str(FIX / "b200-8-gke-a4.txt"))
    assert len(b200.nodes("nvswitch")) == 1 and b200.node(b200.nodes("nvswitch")[0])["assumed"]
    assert {b200.node(n)["name"] for n in b200.nics()} == {f"mlx5_{i}" for i in range(8)}  # NIC legend
    assert {b200.node(g)["numa"] for g in b200.gpus()} == {0, 1}
    cube = import_smi(str(FIX / "dgx1-v100-hybrid-cube.txt"))
    assert not cube.nodes("nvswitch") and len(cube.links("nvlink")) == 2 * 16  # 16 direct bonded pairs
    p = cube.path("host0/gpu0", "host0/gpu5")
    assert (p.smi, p.nccl) == ("SYS", "NVB")  # NVLink through a GPU: NCCL uses it, nvidia-smi shows PCIe
    a100 = import_smi(str(FIX / "dgx-a100.txt"))
    assert a100.node("host0/cpu3")["affinity"] == "48-63,176-191"
    rtx = import_smi(str(FIX / "rtx5090-2.txt"))
    assert rtx.node("host0/gpu0")["numa"] == 0 and "x_gpu_numa" not in rtx.node("host0/gpu0")


ANSI = (
    "\x1b[4m\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tSOC\tPHB\t0-7\t0\t\tN/A\n"
    "GPU1\tSOC\t X \tSOC\t8-15\t1\t\tN/A\n"
    "NIC0\tPHB\tSOC\t X \n\nLegend:\n\n  X    = Self\n"
    "  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)\n\n"
    "NIC Legend:\n\n  NIC0: mlx5_bond_0\n"
)


def test_ansi_legacy_soc_and_nic_legend():
    p = parse_smi(ANSI)
    assert p["devices"] == ["GPU0", "GPU1", "NIC0"] and p["legacy"] and p["names"]["NIC0"] == "mlx5_bond_0"
    assert p["cpu_affinity"] == {"GPU0": "0-7", "GPU1": "8-15"} and p["numa_affinity"] == {"GPU0": 0, "GPU1": 1}
    t = import_smi(ANSI)
    assert t.meta["legacy_legend"] and t.meta["smi_mismatches"] == []
    assert t.path("host0/gpu0", "host0/gpu1").smi == "SYS"


def test_inconsistent_matrix_is_reported_not_hidden():
    text = "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\tPIX\nGPU1\tPIX\t X \tPXB\nGPU2\tPIX\tPXB\t X \n"
    t = import_smi(text)
    # single linkage at the PIX level puts all three GPUs under one switch: GPU1-GPU2 can only be PIX
    assert t.meta["smi_mismatches"] == [
        "GPU1-GPU2: PXB expected, structure gives PIX",
        "GPU2-GPU1: PXB expected, structure gives PIX",
    ]


@pytest.mark.parametrize(
    "bad, msg",
    [
        ("hello\n", "expected an 'nvidia-smi topo -m' matrix"),
        ("\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tPIX\t X \n", r"column 'GPU1': expected one of X, SYS, SOC.*got 'FOO'"),
        ("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU7\tPIX\t X \n", "row 'GPU7': expected one of the header's devices"),
        ("\tGPU0\tGPU1\nGPU0\t X \tPIX\n", r"rows missing for \['GPU1'\]"),
        ("\tGPU0\tGPU1\nGPU0\tPIX\t X \nGPU1\tPIX\t X \n", "'X' expected exactly on the diagonal"),
    ],
)
def test_errors_name_line_and_column(bad, msg):
    with pytest.raises(topo.TopologyError, match=msg):
        parse_smi(bad)


def test_import_file_detects_the_format(tmp_path):
    f = tmp_path / "m.txt"
    f.write_text(ANSI)
    assert topo.import_file(f).meta["source"].startswith("nvidia-smi:")
    x = tmp_path / "t.xml"
    x.write_text('<system version="1"><cpu numaid="0"><pci busid="0000:01:00.0" class="0x030200"/></cpu></system>')
    assert topo.import_file(x).meta["source"] == f"nccl-xml:{x}"
    x.write_text('<system version="1"><cpu numaid="0"/></system>')
    with pytest.raises(topo.TopologyError, match=rf"^{x}: expected at least one GPU"):
        topo.import_file(x)
    y = tmp_path / "junk.txt"
    y.write_text("nothing here")
    with pytest.raises(topo.TopologyError, match="expected an NCCL topology XML"):
        topo.import_file(y)


def test_whitespace_collapsed_paste_still_parses():
    text = (FIX / "b200-8-gke-a4.txt").read_text()
    collapsed = "\n".join(" ".join(ln.split()) for ln in text.splitlines())
    a, b = parse_smi(text), parse_smi(collapsed)
    assert a["codes"] == b["codes"] and b["numa_affinity"]["GPU4"] == 1 and b["cpu_affinity"]["GPU0"] == "0-55,112-167"


# ---------------------------------------------------------------- real pastes kept in the repository (tests/topo/smi)
DATA = Path(__file__).resolve().parent / "smi"
PASTES = sorted(DATA.glob("*.txt"))


def test_the_repository_pastes_are_there():
    assert [p.name for p in PASTES] == [
        "glued-header-mlx5.txt",
        "go-gpuallocator-17-rtx4090x8.txt",
        "nvidia-forum-68452-skylake-1socket.txt",
        "quda-669-8gpu-mlx5.txt",
        "r7525-2xa100-epyc.txt",
    ]


@pytest.mark.parametrize("f", PASTES, ids=lambda p: p.name)
def test_every_repository_paste_round_trips_exactly(f):
    p = parse_smi(f.read_text(), where=str(f))
    t = import_smi(f)
    assert t.meta["smi_mismatches"] == [] and t.meta["source"] == f"nvidia-smi:{f}"
    _check_round_trip(t, p)
    assert (len(t.gpus()), len(t.nics())) == (len(p["gpus"]), len(p["nics"]))
    again = parse_smi(render_smi(t))  # the rendered matrix (NICs renamed NIC<k> in column order) says the same
    label = dict(
        zip(
            again["devices"],
            [c for c, _ in sorted(t.meta["columns"].items(), key=lambda kv: list(t.gpus() + t.nics()).index(kv[1]))],
        )
    )
    assert {(label[a], label[b]): c for (a, b), c in again["codes"].items()} == {
        k: ("SYS" if v == "SOC" else v) for k, v in p["codes"].items()
    }


def test_r7525_gpus_of_one_numa_node_are_sys_apart_through_two_quadrants():
    t = import_smi(DATA / "r7525-2xa100-epyc.txt")
    assert t.nodes("cpu") == ("host0/cpu0", "host0/cpu1")  # NUMA 1 from the matrix; the NIC's socket gets id 0
    assert {t.node(g)["numa"] for g in t.gpus()} == {1}
    tops = {g: next(n for n in t.graph.successors(g) if t.node(n)["kind"] == "pcie_switch") for g in t.gpus()}
    assert sorted(t.node(s)["quadrant"] for s in tops.values()) == [0, 1]  # one I/O-die quadrant each
    p = t.path("host0/gpu0", "host0/gpu1")
    assert (p.smi, p.nccl) == ("SYS", "PHB")  # nvidia-smi's view; NCCL sees one NUMA node
    assert p.nodes == ("host0/gpu0", tops["host0/gpu0"], "host0/cpu1", tops["host0/gpu1"], "host0/gpu1")
    nic = t.nics()[0]
    assert t.node(nic)["name"] == "mlx5_0" and t.path("host0/gpu0", nic).nccl == "SYS"  # the other socket


def test_a_real_4090_box_with_sys_inside_each_numa_node():
    t = import_smi(DATA / "go-gpuallocator-17-rtx4090x8.txt")
    gpus = t.gpus()
    assert [t.node(g)["numa"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(t.path(a, b).smi == "SYS" for a in gpus for b in gpus if a != b)
    nic0, nic1 = t.nics()
    assert (
        t.path(gpus[6], nic0).smi == "PHB"
        and t.path(nic0, nic1).smi == "PIX"
        and t.nearest_nic(gpus[6]) in (nic0, nic1)
    )
    assert t.node("host0/cpu1")["affinity"] == "56-111,168-223"


def test_the_row_labels_read_a_header_that_glues_nic_names():
    p = parse_smi((DATA / "glued-header-mlx5.txt").read_text())
    assert p["devices"] == ["GPU0", "GPU1", "GPU2", "GPU3", "mlx5_0", "mlx5_1", "mlx5_2"]
    assert p["codes"][("mlx5_1", "mlx5_2")] == "PIX" and p["codes"][("GPU2", "mlx5_2")] == "PHB"
    t = import_smi(DATA / "glued-header-mlx5.txt")
    assert [t.node(n)["name"] for n in t.nics()] == ["mlx5_0", "mlx5_1", "mlx5_2"]
    bad = "\tGPU0\tmlx5_0mlx5_9\nGPU0\t X \tPIX\tPIX\nmlx5_0\tPIX\t X \tPIX\nmlx5_1\tPIX\tPIX\t X \n"
    with pytest.raises(topo.TopologyError, match=r"^<text>:3: row 'mlx5_0': expected one of the header's devices"):
        parse_smi(bad)  # a glued header must be the concatenation of the row labels


def test_nics_named_in_the_header_of_older_versions():
    p = parse_smi((DATA / "quda-669-8gpu-mlx5.txt").read_text())
    assert p["nics"] == ["mlx5_0"] and p["cpu_affinity"]["GPU4"] == "14-27" and p["numa_affinity"] == {}
    t = import_smi(DATA / "nvidia-forum-68452-skylake-1socket.txt")
    assert [t.node(n)["name"] for n in t.nics()] == ["mlx5_0", "mlx5_1"]
    assert t.path("host0/gpu0", t.nics()[0]).smi == "SYS"
