"""treecoll topo discover / import / hints."""

import json
from pathlib import Path

from treecoll.tools.cli import main

from treecoll import topo

FIX = Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def test_discover_on_this_machine_is_a_cpu_only_host(capsys, tmp_path):
    out = tmp_path / "me.yaml"
    assert main(["topo", "discover", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and "fingerprint" in text
    t = topo.load(out)
    assert t.gpus() and all(t.node(g).get("model") == "cpu-process" or t.node(g).get("pci") for g in t.gpus())
    assert main(["topo", "show", str(out)]) == 0  # the foundation's commands read a discovered topology


def test_discover_json_and_xml(capsys, tmp_path):
    x = tmp_path / "me.xml"
    assert main(["topo", "discover", "--xml", str(x), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["written"] == str(x) and d["gpus"] >= 1 and isinstance(d["notes"], list)
    assert x.read_text().startswith("<system")


def test_import_detects_format(capsys, tmp_path):
    assert main(["topo", "import", str(FIX / "smi" / "dgx-a100.txt"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["gpus"] == 8 and d["matrix"]["codes"][0][1] == "NV12" and d["notes"] == []
    y = tmp_path / "p4d.yaml"
    assert main(["topo", "import", str(FIX / "nccl-topo" / "aws-p4d-24xl-topo.xml"), "-o", str(y)]) == 0
    assert "PIX" in capsys.readouterr().out
    assert main(["topo", "matrix", str(y)]) == 0 and "SYS" in capsys.readouterr().out
    assert main(["topo", "path", str(FIX / "nccl-topo" / "aws-p4d-24xl-topo.xml"), "host0/gpu0", "host0/gpu1"]) == 0


def test_hints(capsys, monkeypatch):
    for k in ("NCCL_P2P_LEVEL", "RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("NCCL_IB_HCA", "^mlx5_1")
    assert main(["topo", "hints"]) == 0
    assert "NCCL_IB_HCA" in capsys.readouterr().out
    monkeypatch.setenv("NCCL_P2P_LEVEL", "FAST")
    assert main(["topo", "hints"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NCCL_P2P_LEVEL='FAST'" in err[0]


def test_import_missing_file(capsys):
    assert main(["topo", "import", "/nonexistent.xml"]) == 1
    assert "no such file" in capsys.readouterr().err


def test_discover_refuses_a_directory_output_before_discovering(capsys, tmp_path, monkeypatch):
    called = []
    monkeypatch.setattr(topo, "discover", lambda **kw: called.append(kw))
    assert main(["topo", "discover", "-o", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"-o {tmp_path}: expected a file name, got a directory" in err
    assert called == []  # refused before any work


def test_discover_refuses_a_missing_sysfs_root(capsys, tmp_path):
    assert main(["topo", "discover", "--sysfs-root", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert f"sysfs root {tmp_path / 'nope'}: expected a directory holding sys/" in err and "no such directory" in err


def test_discover_refuses_a_sysfs_root_without_sys(capsys, tmp_path, monkeypatch):
    """--sysfs-root names the directory holding sys/ (as / does); given sys/ itself or any directory
    without it, the discovery would read nothing of the host and answer a bare CPU-only host."""
    from treecoll.topo.errors import TopologyError

    called = []

    def fake(**kw):
        called.append(kw)
        raise TopologyError("discovery reached")

    monkeypatch.setattr(topo, "discover", fake)
    (tmp_path / "sys" / "bus").mkdir(parents=True)
    for wrong in (tmp_path / "sys", tmp_path / "sys" / "bus"):
        assert main(["topo", "discover", "--sysfs-root", str(wrong)]) == 1
        err = capsys.readouterr().err
        assert err == (
            f"treecoll: error: --sysfs-root {wrong}: expected a directory holding sys/ (as / does), got a "
            f"directory without it; pass the directory above sys/\n"
        )
    assert called == []
    assert main(["topo", "discover", "--sysfs-root", str(tmp_path)]) == 1  # the directory above sys/: fine
    assert capsys.readouterr().err == "treecoll: error: discovery reached\n"
    assert called == [{"sysfs_root": str(tmp_path), "host": None}]
