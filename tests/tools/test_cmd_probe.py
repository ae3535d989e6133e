"""`treecoll topo probe` through tools.cli.main(argv): bad input in one line before any rank starts, and
one local run with real ranks (--nproc 2) writing JSON, the calibrated topology and the plot."""

from __future__ import annotations

import json

import pytest
from treecoll.tools.cli import main

from treecoll import topo

JOB_VARS = (
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TREECOLL_EMU_TOPOLOGY",
)


@pytest.fixture(autouse=True)
def no_job(monkeypatch):
    for k in JOB_VARS:
        monkeypatch.delenv(k, raising=False)


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            [],
            "topo probe: expected a distributed job (torchrun, treecoll emu run, any env:// launcher) or --nproc N, "
            "got neither",
        ),
        (
            ["--nproc", "1"],
            "topo probe: expected at least 2 ranks to measure between, got 1; launch 2 or more "
            "(torchrun --nproc-per-node 2, or --nproc 2)",
        ),
        (
            ["--nproc", "3", "--topology", "cpu-local"],
            "topo probe: topology 'cpu-local' (cpu-local) has 4 ranks, the "
            "job 3; give the topology of this job (--topology)",
        ),
        (["--nproc", "2", "--threshold", "70"], "--threshold: expected a fraction in (0, 1] such as 0.7, got '70'"),
        (["--nproc", "2", "--plot", "x.txt"], "--plot x.txt: expected a file name ending in .png"),
    ],
)
def test_bad_input_is_one_line(capsys, argv, message):
    rc, out, err = run(capsys, "topo", "probe", *argv)
    assert rc == 1 and out == "" and err.count("\n") == 1
    assert message in err


def test_one_rank_job_is_refused(capsys, monkeypatch):
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(k, v)
    rc, _, err = run(capsys, "topo", "probe", "--topology", "cpu-local")
    assert rc == 1 and "expected at least 2 ranks to measure between, got 1" in err


def test_an_existing_output_is_kept_without_force(capsys, tmp_path):
    out = tmp_path / "probed.yaml"
    out.write_text("mine\n")
    rc, _, err = run(capsys, "topo", "probe", "--nproc", "2", "-o", str(out))
    assert rc == 1 and f"-o {out}: expected a new file, got an existing one; pass --force" in err
    assert out.read_text() == "mine\n"


def test_local_run_writes_json_topology_and_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "probed.yaml", tmp_path / "probe.png"
    rc, text, err = run(
        capsys,
        "topo",
        "probe",
        "--nproc",
        "2",
        "--reps",
        "1",
        "--bytes",
        "256KiB",
        "--json",
        "-o",
        str(out),
        "--plot",
        str(png),
    )
    assert rc == 0, err
    d = json.loads(text)
    assert set(d) == {"pairs", "slow", "summary"}
    assert all(set(s) == {"a", "b", "measured_gbps", "expected_gbps"} for s in d["slow"])
    # one host of two processes: one round, both directions, one latency pair
    assert sorted((p["kind"], tuple(p["ranks"])) for p in d["pairs"]) == [
        ("bandwidth", (0, 1)),
        ("bandwidth", (1, 0)),
        ("latency", (0, 1)),
    ]
    assert d["summary"]["plan"]["rounds"] == {"intra": {"measured": 1, "of": 1}}
    assert d["summary"]["output"] == str(out) and d["summary"]["plot"] == str(png)
    t = topo.load(out)
    measured = [(a, b) for a, b, x in t.graph.edges(data=True) if "measured" in x]
    assert sorted(measured) == [("h0/cpu0", "h0/p0"), ("h0/cpu0", "h0/p1"), ("h0/p0", "h0/cpu0"), ("h0/p1", "h0/cpu0")]
    assert png.stat().st_size > 1000
