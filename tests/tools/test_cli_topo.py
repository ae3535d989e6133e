"""`treecoll topo ...` through tools.cli.main(argv): golden outputs, --json, exit codes (no shell).

The golden files are only read here; ``tests/tools/golden_cases.py`` lists the commands and
regenerates the files as a separate, explicit step (see its docstring).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from treecoll.tools.cli import main

from tests.tools.golden_cases import CASES, GOLDEN
from treecoll import topo

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("golden", sorted(CASES))
def test_golden(golden, capsys):
    rc, out, err = run(capsys, *CASES[golden])
    assert (rc, err) == (0, "")
    assert out == (GOLDEN / golden).read_text()


def test_matrix_of_dgx_h100_shows_nv18_and_own_nic_pix(capsys):
    rc, out, _ = run(capsys, "topo", "matrix", str(ROOT / "topologies" / "dgx-h100.yaml"), "--json")
    d = json.loads(out)
    codes = {(a, b): d["codes"][i][j] for i, a in enumerate(d["devices"]) for j, b in enumerate(d["devices"])}
    gpus = [x for x in d["devices"] if x.startswith("GPU")]
    assert all(codes[a, b] == "NV18" for a in gpus for b in gpus if a != b)
    assert all(codes[f"GPU{i}", f"NIC{i}"] == "PIX" for i in range(8))
    assert d["numa_affinity"]["GPU5"] == 1 and d["nic_names"]["NIC1"] == "mlx5_3"


@pytest.mark.parametrize(
    "argv",
    [
        ["topo", "show", "default"],
        ["topo", "matrix", "default"],
        ["topo", "path", "default", "r0", "r15"],
        ["topo", "export", "cpu-local", "--format", "dot"],
    ],
)
def test_json_on_every_command(argv, capsys):
    for args in (argv + ["--json"], ["--json"] + argv):
        rc, out, _ = run(capsys, *args)
        assert rc == 0 and isinstance(json.loads(out), dict)


def test_export_yaml_and_json_round_trip(tmp_path, capsys):
    t = topo.resolve("dgx-h100-x2")
    y, j = tmp_path / "t.yaml", tmp_path / "t.json"
    assert run(capsys, "topo", "export", "dgx-h100-x2", "--format", "yaml", "-o", str(y))[0] == 0
    assert topo.load(y) == t
    rc, out, _ = run(capsys, "topo", "export", "dgx-h100-x2", "--format", "json", "-o", str(j), "--json")
    assert rc == 0 and json.loads(out)["output"] == str(j)
    assert topo.Topology.from_dict(json.loads(j.read_text())) == t
    rc, out, _ = run(capsys, "topo", "export", "cpu-local", "--format", "yaml")
    assert rc == 0 and topo.loads(out) == topo.resolve("cpu-local")


def _dgx_h100_with(tmp_path: Path, old: str, new: str) -> Path:
    """The shipped dgx-h100.yaml with its first ``old`` replaced by ``new``, written to a new file."""
    text = (ROOT / "topologies" / "dgx-h100.yaml").read_text()
    f = tmp_path / "variant.yaml"
    f.write_text(text.replace(old, new, 1))
    assert f.read_text() != text
    return f


def test_show_lists_the_nics_transport_latency_when_given(tmp_path, capsys):
    f = _dgx_h100_with(tmp_path, "      bw: 50.0\n", "      bw: 50.0\n      lat: 35.0\n")
    rc, out, _ = run(capsys, "topo", "show", str(f))
    assert rc == 0 and "nic lat  35 us per message" in out
    rc, out, _ = run(capsys, "topo", "show", str(f), "--json")
    assert json.loads(out)["nic_lat_us"] == [35.0, 35.0]
    rc, out, _ = run(capsys, "topo", "show", "dgx-h100", "--json")
    assert "nic_lat_us" not in json.loads(out)


def test_show_states_the_gpus_memory_where_the_topology_does(tmp_path, capsys):
    """The datasheet figures of the shipped file (dgx-h100.yaml: 80 GB, 3350 GB/s) beside the GPU model;
    a file whose GPUs state no capacity shows only the bandwidth, and CPU rank slots nothing."""
    rc, out, _ = run(capsys, "topo", "show", "dgx-h100")
    assert rc == 0 and "gpus     8: 8 x H100-SXM5-80GB (80 GB, 3350 GB/s each)\n" in out
    rc, out, _ = run(capsys, "topo", "show", "dgx-h100", "--json")
    assert json.loads(out)["gpu_memory"] == {"H100-SXM5-80GB": {"mem_gb": 80.0, "mem_bw": 3350.0}}
    f = _dgx_h100_with(tmp_path, " mem_gb: 80,", "")
    rc, out, _ = run(capsys, "topo", "show", str(f))
    assert rc == 0 and "gpus     8: 8 x H100-SXM5-80GB (3350 GB/s each)\n" in out
    rc, out, _ = run(capsys, "topo", "show", "cpu-local", "--json")
    assert "gpu_memory" not in json.loads(out)


def test_dot_groups_each_host_as_a_cluster(capsys):
    _, out, _ = run(capsys, "topo", "export", "dgx-h100-x2", "--format", "dot")
    assert out.count('subgraph "cluster_') == 2
    assert '"h1/gpu7" [shape=box' in out and '"rail0/leaf0" [shape=octagon' in out


def test_draw(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "t.png"
    rc, out, err = run(capsys, "topo", "draw", "dgx-h100-x2", "-o", str(png), "--json")
    assert (rc, err) == (0, "")
    d = json.loads(out)
    assert png.stat().st_size > 1000 and d["hosts_drawn"] == 2 and d["links"] > 100


def test_draw_without_matplotlib_gives_an_install_hint(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, out, err = run(capsys, "topo", "draw", "cpu-local", "-o", str(tmp_path / "x.png"))
    assert rc == 1 and out == ""
    assert err == "treecoll: error: treecoll topo draw needs matplotlib: pip install 'treecoll[plot]'\n"


def test_malformed_yaml_is_one_line_with_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nhosts:\n  - {template: dgx-h100, count: 2\nnetwork: {type: single_switch}\n")
    rc, out, err = run(capsys, "topo", "show", str(bad))
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"treecoll: error: {bad}:4: invalid YAML")
    rc, _, err = run(capsys, "topo", "show", str(bad), "--debug")
    assert rc == 1 and "Traceback" in err
    assert err.splitlines()[-1].endswith(
        "invalid YAML: did not find expected ',' or '}' (while parsing a flow mapping started on line 3)"
    )


def test_bad_values_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  - {template: dgx-h100, count: 2}\nnetwork: {type: fat_tree, leaf_size: 0}\n")
    rc, _, err = run(capsys, "topo", "matrix", str(bad))
    assert rc == 1 and err == (f"treecoll: error: {bad}:3: network.leaf_size: expected an integer >= 1, got 0\n")


@pytest.mark.parametrize(
    "argv,pattern",
    [
        (["topo", "show", "no-such.yaml"], "no-such.yaml: cannot read topology file: no such file"),
        (["topo", "path", "default", "r0", "r99"], r"rank 99: expected an integer in 0..15"),
        (["topo", "path", "default", "h0/gpu0", "spine0"], "path endpoint 'spine0': expected a gpu, nic or cpu"),
        (
            ["topo", "path", "default", "0", "r1"],
            r"endpoint '0': not a node of topology 'dgx-h100-x2'; expected a node id \(h0/gpu0, h0/gpu1, h0/nic0, "
            r".*or a rank r0\.\.r15; a rank is written r0$",
        ),
        (["topo", "path", "default", "r0", "gpu3"], r"endpoint 'gpu3': not a node .* or a rank r0\.\.r15$"),
        (["topo", "matrix", "default", "--host", "h7"], "--host 'h7': not in topology 'dgx-h100-x2'"),
        (["topo", "draw", "default", "-o", "x.png", "--max-hosts", "0"], "--max-hosts: expected a positive integer"),
        (["topo", "frobnicate"], "treecoll topo: argument SUBCOMMAND: invalid choice: 'frobnicate'"),
        (
            ["topo", "show", "default", "--colour"],
            r"treecoll topo show: unrecognized arguments: --colour; see 'treecoll topo show --help'",
        ),
        (["topo", "export", "default"], "the following arguments are required: --format"),
        (["topo", "show"], r"topo show: expected FILE \(a topology YAML, a shipped name or 'default'\), or"),
        (["topo", "show", "default", "--hosts", "2"], "topo show: FILE names the whole machine: expected FILE or"),
        (["topo", "show", "--hosts", "2"], "the GPU model is not known: pass --gpu MODEL"),
        ([], "expected a command, one of topo, decode, generate, tree, simulate, emu, selfcheck"),
    ],
)
def test_user_errors_exit_1_with_one_line(argv, pattern, capsys):
    rc, out, err = run(capsys, *argv)
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("treecoll: error: ") and re.search(pattern, err), err


def test_help_returns_0(capsys):
    rc, out, _ = run(capsys, "topo", "--help")
    assert rc == 0 and "matrix" in out and "export" in out


def test_demo_runs_its_steps(capsys):
    from treecoll.tools import demo

    assert demo.main() == 0
    out = capsys.readouterr().out
    assert out.count("=== ") == len(demo.STEPS) >= 3
    assert "NV18" in out and "PIX" in out and "NCCL NET" in out and "rail0/leaf0" in out


def test_building_the_parser_imports_no_heavy_dependency():
    import subprocess
    import sys

    code = (
        "import sys, tools.cli; tools.cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'triton', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_unbounded_and_malicious_files_are_refused_in_one_line(tmp_path, capsys, monkeypatch):
    huge = tmp_path / "huge.yaml"
    huge.write_text(
        "templates:\n  box: {gpus: {count: 1000000000, numa: 0}, cpus: [{numa: 0}], pcie: {bw: 24.0}}\n"
        "hosts: [{template: box, count: 1}]\n"
    )
    rc, out, err = run(capsys, "topo", "show", str(huge))
    assert (rc, out) == (1, "") and err.count("\n") == 1
    assert err.startswith(
        f"treecoll: error: {huge}:2: templates.box.gpus.count: one host of template 'box' would "
        f"make 1,000,000,001 nodes and 2,000,000,000 directed links: expected at most 1,000,000 "
        f"nodes and 4,000,000 links (the caps)"
    )
    bomb = tmp_path / "bomb.yaml"
    levels = "".join(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))
    bomb.write_text(
        "meta:\n  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + levels
        + "hosts: [{template: dgx-h100, count: 1}]\n"
    )
    rc, out, err = run(capsys, "topo", "export", str(bomb), "--format", "json")
    assert (rc, out) == (1, "") and err.count("\n") == 1
    assert err.startswith(f"treecoll: error: {bomb}:7: invalid YAML: aliases expand the document to ")
    monkeypatch.setenv("TREECOLL_MAX_NODES", "30")
    rc, _, err = run(capsys, "topo", "show", "dgx-h100-x2")
    assert rc == 1 and "hosts[0].count: 2 hosts of template 'dgx-h100'" in err and "at most 30 nodes" in err
    monkeypatch.setenv("TREECOLL_MAX_NODES", "83")  # 2 hosts x 30 nodes + 8 rail leaves + 16 spines = 84
    rc, out, err = run(capsys, "topo", "show", "dgx-h100-x2")
    assert rc == 1 and "8 leaves x 16 spines make 84 nodes and 516 directed links" in err
    monkeypatch.setenv("TREECOLL_MAX_NODES", "84")
    rc, out, _ = run(capsys, "topo", "show", "dgx-h100-x2")
    assert rc == 0 and out.startswith("dgx-h100-x2")


@pytest.mark.parametrize(
    "what, make, message",
    [
        ("directory", lambda p: p.mkdir(), "cannot read topology file: it is a directory; expected a file"),
        ("device", None, r"cannot read topology file: not a regular file \(a character device\); expected a file"),
        ("empty", lambda p: p.write_text(""), r"cannot read topology file: the file is empty \(0 bytes\)"),
        (
            "no GPU",
            lambda p: p.write_text('<system version="1"><cpu numaid="0"/></system>\n'),
            r"expected at least one GPU \(a <gpu> element, or a <pci> of class 0x03\.\.\.\.\), got none",
        ),
        (
            "bad XML",
            lambda p: p.write_text('<system version="1">\n<cpu numaid="x"/></system>\n'),
            r":2: <cpu> #0 numaid expected an integer, got 'x'",
        ),
    ],
)
def test_topo_import_names_the_file_and_what_is_wrong(what, make, message, tmp_path, capsys):
    p = tmp_path / "in.xml"
    if make is None:
        p = "/dev/null"
    else:
        make(p)
    rc, out, err = run(capsys, "topo", "import", str(p))
    assert (rc, out) == (1, "") and err.count("\n") == 1
    assert re.match(rf"treecoll: error: {p}:?\S*:? ?{message}", err) or re.match(
        rf"treecoll: error: {p}{message}", err
    ), err


def test_the_machine_flags_name_a_machine_instead_of_a_file(tmp_path, capsys):
    """topo show/export --hosts/--gpu/--nic: the machine of topo.machines; exported, it is the same
    machine as a file: simulate prints the same table from the file and from the flags."""
    machine = ["--hosts", "2", "--gpu", "H100", "--nic", "8x400G-ib"]
    rc, shown, _ = run(capsys, "topo", "show", *machine)
    assert rc == 0 and shown.startswith("h100-sxm-x2  (2 x h100-sxm (8 GPUs each), NICs 8x400G-ib)  fingerprint ")
    path = tmp_path / "machine.yaml"
    rc, _, _ = run(capsys, "topo", "export", *machine, "--format", "yaml", "-o", str(path))
    assert rc == 0
    rc, out, _ = run(capsys, "topo", "show", str(path))
    assert rc == 0 and out.startswith(f"h100-sxm-x2  ({path})  fingerprint ")
    assert out.split("fingerprint ")[1].split()[0] == shown.split("fingerprint ")[1].split()[0]
    sim = ["simulate", "allreduce", "--algo", "ring,two_level,nccl", "--sizes", "1M", "--json"]
    rows = [json.loads(run(capsys, *sim, *flags)[1])["rows"] for flags in (machine, ["--topology", str(path)])]
    assert rows[0] == rows[1]
