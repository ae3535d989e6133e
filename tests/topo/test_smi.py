"""nvidia-smi topo -m import: every real paste rebuilds a host whose own matrix prints the same codes."""
from pathlib import Path

import pytest

import topo
from topo.smi import import_smi, parse_smi, render_smi

FIX = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "smi"
FILES = sorted(FIX.glob("*.txt")) if FIX.exists() else []


def _check_round_trip(t, parsed):
    cols = t.meta["columns"]
    for (a, b), code in parsed["codes"].items():
        want = "SYS" if code == "SOC" else code
        assert t.path(cols[a], cols[b]).smi == want, (a, b)


@pytest.mark.skipif(not FILES, reason="../shared/fixtures/smi not present")
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
    assert {(label[a], label[b]): c for (a, b), c in again["codes"].items()} == \
        {k: ("SYS" if v == "SOC" else v) for k, v in p["codes"].items()}


@pytest.mark.skipif(not FILES, reason="fixtures absent")
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


ANSI = ("\x1b[4m\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tSOC\tPHB\t0-7\t0\t\tN/A\n"
        "GPU1\tSOC\t X \tSOC\t8-15\t1\t\tN/A\n"
        "NIC0\tPHB\tSOC\t X \n\nLegend:\n\n  X    = Self\n"
        "  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)\n\n"
        "NIC Legend:\n\n  NIC0: mlx5_bond_0\n")


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
    assert t.meta["smi_mismatches"] and "GPU1-GPU2: PXB expected" in t.meta["smi_mismatches"][0]


@pytest.mark.parametrize("bad, msg", [
    ("hello\n", "expected an 'nvidia-smi topo -m' matrix"),
    ("\tGPU0\tGPU1\nGPU0\t X \tFOO\nGPU1\tPIX\t X \n", r"column 'GPU1': expected one of X, SYS, SOC.*got 'FOO'"),
    ("\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU7\tPIX\t X \n", "row 'GPU7': expected one of the header's devices"),
    ("\tGPU0\tGPU1\nGPU0\t X \tPIX\n", r"rows missing for \['GPU1'\]"),
    ("\tGPU0\tGPU1\nGPU0\tPIX\t X \nGPU1\tPIX\t X \n", "'X' expected exactly on the diagonal"),
])
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


@pytest.mark.skipif(not FILES, reason="fixtures absent")
def test_whitespace_collapsed_paste_still_parses():
    text = (FIX / "b200-8-gke-a4.txt").read_text()
    collapsed = "\n".join(" ".join(ln.split()) for ln in text.splitlines())
    a, b = parse_smi(text), parse_smi(collapsed)
    assert a["codes"] == b["codes"] and b["numa_affinity"]["GPU4"] == 1 and b["cpu_affinity"]["GPU0"] == "0-55,112-167"
