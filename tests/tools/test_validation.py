"""`treecoll simulate validate` and `treecoll simulate calibrate` (tools/validation.py).

The synthetic tables are written as nccl-tests prints them (src/util.cu: size, count, type, redop, root,
time, algbw, busbw, #wrong for the out-of-place and the in-place run; algbw = size / time, busbw = algbw x
(n-1)/n for all_gather) from times the simulator gives with known parameters, so the parameters a fit must
find are known exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from treecoll.collectives.sim.profiles import get_profile
from treecoll.tools import validation
from treecoll.tools.cli import main
from treecoll.topo.machines import MachineFacts, MachineFlags, machine_topology

GPU = "NVIDIA H100 80GB HBM3"
TRUTH = {"eff_net": 0.6, "eff_nvlink": 0.8, "lat_net": 9.0, "lat_nvlink": 2.0}


def _table(hosts: int, per: int, times_us: dict[int, float], head: str = "#") -> str:
    """An all_gather_perf output of ``hosts`` x ``per`` GPUs with the given out-of-place times."""
    n = hosts * per
    lines = [
        "# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 64(factor) warmup iters: 5 iters: 20",
        "# Using devices",
    ]
    lines += [
        f"#  Rank {r:2d} Group  0 Pid {100 + r:5d} on  node{r // per} device {r % per:2d} [0000:{r:02x}:00] {GPU}"
        for r in range(n)
    ]
    lines.append(
        f"{head}       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong"
    )
    for size, t in times_us.items():
        alg = size / t / 1e3
        run = f"{t:8.2f} {alg:7.2f} {alg * (n - 1) / n:7.2f}"
        lines.append(f"{size:12d} {size // (4 * n):12d}     float    none      -1 {run}      0 {run}      0")
    lines.append("# Avg bus bandwidth    : 1.0")
    return "\n".join(lines) + "\n"


def _synthetic(
    tmp_path: Path, hosts: int, per: int, values: dict, sizes=(1024, 65536, 16 << 20, 1 << 30), scale: float = 1.0
) -> Path:
    facts = MachineFacts(hosts=tuple((f"node{h}", per) for h in range(hosts)), gpu_names=(GPU,), nranks=hosts * per)
    topo, _ = machine_topology(MachineFlags(), facts)
    prof = validation.profile_from(values)
    times = {s: validation.predict(topo, "allgather", s, ["ring"], prof)[0] * 1e6 * scale for s in sizes}
    p = tmp_path / f"ag-{hosts}x{per}-{scale}.txt"
    p.write_text(_table(hosts, per, times))
    return p


def test_calibration_recovers_known_parameters(tmp_path):
    """One host of 4 GPUs (NVLink only) and two hosts of 1 GPU (network only): every parameter the two
    tables depend on is identifiable, and the fit finds the values the tables were made with."""
    files = [_synthetic(tmp_path, 1, 4, TRUTH), _synthetic(tmp_path, 2, 1, TRUTH)]
    d = validation.calibrate(files, tol=0.01, check=False)
    assert set(d["fit"]["free"]) >= set(TRUTH) and "lat_pci" in d["fit"]["fixed"]
    for k, v in TRUTH.items():
        assert d["values"][k] == pytest.approx(v, rel=0.03), k
    start = validation.start_values()
    assert d["values"]["lat_pci"] == start["lat_pci"] and d["values"]["eff_pcie"] == start["eff_pcie"]
    assert d["fit"]["rms_log_error_after"] < 0.01 < d["fit"]["rms_log_error_before"]


def test_pattern_search_finds_a_bounded_minimum():
    x, fx, calls = validation.pattern_search(
        lambda v: (v[0] - 3.0) ** 2, [0.0], step=1.0, tol=1e-3, bounds=[(-1.0, 2.0)]
    )
    assert x == [2.0] and fx == 1.0 and calls < 50


def test_validate_json_has_the_documented_shape(tmp_path, capsys):
    f = _synthetic(tmp_path, 1, 4, TRUTH)
    assert main(["simulate", "validate", str(f), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    e = d["files"][0]
    assert {"file", "status", "reason", "collective", "geomean_large", "geomean_small", "rows"} <= set(e)
    assert (e["status"], e["collective"], e["reason"], e["degraded"]) == ("ok", "allgather", "", False)
    assert {"large", "small"} <= set(d["geomean"]) and d["geomean"]["tables"] == 1
    r = e["rows"][-1]
    assert r["size"] == 1 << 30 and r["meas_busbw"] == pytest.approx((1 << 30) / (r["meas_us"] * 1e3) * 3 / 4)
    assert r["error"] == pytest.approx(r["pred_busbw"] / r["meas_busbw"] - 1)
    # the table was made with other parameters than NCCL's defaults: the error is the ratio of the times
    large = [x for x in e["rows"] if x["size"] >= validation.LARGE]
    assert e["geomean_large"] == pytest.approx(large[0]["meas_us"] / large[0]["pred_us"] - 1, rel=1e-6)
    assert d["geomean"]["large"] == pytest.approx(e["geomean_large"])


def test_a_profile_file_predicts_its_own_table_exactly(tmp_path):
    f = _synthetic(tmp_path, 1, 4, TRUTH)
    prof = validation.profile_from(TRUTH, "truth")
    d = validation.validate([f], prof)
    assert d["files"][0]["geomean_large"] < 1e-3 and d["files"][0]["geomean_small"] < 1e-3


def test_degraded_runs_are_marked_and_left_out_of_the_total(tmp_path):
    """Ten times slower than the simulator's own NVLink numbers: below a quarter of the ideal ring."""
    good = _synthetic(tmp_path, 1, 4, TRUTH)
    slow = _synthetic(tmp_path, 1, 4, TRUTH, scale=10.0)
    d = validation.validate([good, slow], validation.profile_from(TRUTH, "truth"))
    ok, bad = d["files"]
    assert not ok["degraded"] and bad["degraded"] and bad["status"] == "ok"
    assert "of the" in bad["reason"] and "links allow" in bad["reason"]
    assert bad["geomean_large"] == pytest.approx(9.0, rel=1e-3)  # measured 10x the predicted time
    assert d["geomean"]["tables"] == 1 and d["geomean"]["large"] < 1e-3
    text = validation.render(d)
    assert "[DEGRADED]" in text and "1 degraded" in text


def test_the_index_health_marks_a_table_degraded():
    fix = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests"
    c = validation.cases([fix / "heldout" / "gh200-8gpu-2node-allreduce-slingshot-nocxi-degraded.txt"])[0][0]
    topo = validation.topology_for(c)[0]
    why = validation.degraded(c, topo, "allreduce", [])
    assert why.startswith("degraded: the source says so (run with the CXI container hook disabled")


def test_skipped_tables_name_the_flag_that_fixes_them(tmp_path, capsys):
    # all_gather and alltoall print the same columns when validation is off (N/A)
    row = "  4194304  131072  float  none  -1  101.5  41.31  36.15  N/A  93.90  44.67  39.09  N/A\n"
    amb = tmp_path / "amb.txt"
    amb.write_text(row)
    e = validation.validate([amb])["files"][0]
    assert e["status"] == "skipped" and "pass --collective allgather" in e["reason"]
    e = validation.validate([amb], collective="allgather")["files"][0]
    assert "the file does not say the machine" in e["reason"] and "--gpu MODEL" in e["reason"]
    e = validation.validate([amb], flags=MachineFlags(hosts=1, gpus_per_host=8, gpu="H100"), collective="allgather")[
        "files"
    ][0]
    assert e["status"] == "ok" and e["nranks"] == 8
    e = validation.validate([amb], flags=MachineFlags(hosts=1, gpus_per_host=4, gpu="H100"), collective="allgather")[
        "files"
    ][0]
    assert "ran on 8 ranks" in e["reason"] and "--gpus-per-host" in e["reason"]
    e = validation.validate([amb], flags=MachineFlags(hosts=1, gpus_per_host=8, gpu="H100"), collective="alltoall")[
        "files"
    ][0]
    assert e["status"] == "ok" and e["collective"] == "alltoall"  # alltoall is predicted too


def test_calibrate_never_replaces_a_file_without_force(tmp_path, capsys):
    f = _synthetic(tmp_path, 1, 4, TRUTH, sizes=(1024, 1 << 30))
    out = tmp_path / "p.yaml"
    out.write_text("keep me\n")
    assert main(["simulate", "calibrate", str(f), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "the file exists; pass --force" in err and err.count("\n") == 1 and out.read_text() == "keep me\n"
    assert main(["simulate", "calibrate", str(f), "-o", str(f), "--force"]) == 1  # an input is never written
    assert main(["simulate", "calibrate", str(f), "-o", str(out), "--force"]) == 0
    text = capsys.readouterr().out
    assert "eff_nvlink" in text and f"saved {out}" in text
    prof = get_profile(str(out))
    assert prof.name == "p" and prof.efficiency("nvlink") == pytest.approx(TRUTH["eff_nvlink"], rel=0.03)
    assert yaml.safe_load(out.read_text())["fit"]["files"] == [str(f)]
    assert main(["simulate", "validate", str(f), "--profile", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["profile"] == "p" and d["files"][0]["geomean_large"] < 0.03


FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests"
#: tables whose busbw/algbw ratio was printed for another GPU count than their source describes
#: (tests/fixtures/README.md): skipped with the rank count and the flags to pass
INCONSISTENT = {
    "heldout/a100-128gpu-16node-allreduce-ib-oldformat.txt": 32,
    "heldout/gb200-144gpu-36node-allreduce-2rack.txt": 128,
    "heldout/h100-64gpu-8node-allreduce-ib-sharp-ellipsis.txt": 96,
}


@pytest.mark.parametrize("name", sorted(p.relative_to(FIX).as_posix() for p in FIX.rglob("*.txt")))
def test_every_fixture_table_is_accepted(name):
    """Every real table: collective recognised, machine built from the file and its index flags, GPU count
    matching (no rows simulated here: keep nothing); only the three inconsistent tables are skipped."""
    d = validation.validate([FIX / name], max_gpus=None, keep=lambda size: False)
    (e,) = d["files"]
    health = yaml.safe_load((FIX / "tables.yaml").read_text())[name]["health"]
    if name in INCONSISTENT:
        assert e["status"] == "skipped" and f"ran on {INCONSISTENT[name]} ranks" in e["reason"]
        assert "pass --hosts N --gpus-per-host G" in e["reason"]
    else:
        assert e["status"] == "ok" and e["collective"] in name.replace("-", "_").replace(
            "reducescatter", "reduce_scatter"
        )
        assert e["degraded"] == (health == "degraded")


def test_several_tables_in_one_file_are_validated_apart(tmp_path, capsys):
    one = _synthetic(tmp_path, 1, 4, TRUTH).read_text()
    two = tmp_path / "two.txt"
    two.write_text(one + one.replace("# nThread", "# Collective test starting: all_gather_perf\n# nThread"))
    d = validation.validate([two], validation.profile_from(TRUTH, "truth"))
    assert [(e["table"], e["status"], e["collective"]) for e in d["files"]] == [
        (0, "ok", "allgather"),
        (1, "ok", "allgather"),
    ]
    assert d["geomean"]["tables"] == 2
    assert main(["simulate", "validate", str(tmp_path / "missing.txt")]) == 1
    err = capsys.readouterr().err
    assert "missing.txt: no such file; expected an nccl-tests output" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "name, flagged",
    [
        ("heldout/rtx4090-2gpu-1node-allreduce-pcie-k8s.txt", True),
        ("heldout/rtx4090-4gpu-1node-allreduce-pcie-docker.txt", True),
        ("heldout/h100-80gpu-10node-sendrecv.txt", False),
        ("heldout/h100-8gpu-1node-alltoall.txt", False),
        ("h100-16gpu-2node-allreduce-ring.txt", False),
    ],
)
def test_the_busbw_rule_on_real_tables(name, flagged):
    """The RTX 4090 boxes reach 3.85 and 2.59 GB/s busbw at 2 GiB (the files' last rows) on PCIe Gen4 links;
    the 80-GPU sendrecv's 15 GB/s goes through one 400 Gb/s NIC per host pair (50 GB/s): not degraded."""
    from treecoll.collectives.sim.nccltests import bus_factor

    c = validation.cases([FIX / name])[0][0]
    topo = validation.topology_for(c, max_gpus=None)[0]
    n = len(topo.rank_gpus())
    rows = [
        {"size": r.size, "meas_busbw": r.size / (r.out_of_place.time_us * 1e3) * bus_factor(c.table.collective, n)}
        for r in c.table.rows
        if r.size > 0
    ]
    why = validation.degraded(c, topo, c.table.collective, rows)
    assert bool(why) == flagged, why
    if flagged:
        assert why.startswith(f"degraded: busbw {rows[-1]['meas_busbw']:.2f} GB/s at {rows[-1]['size']} B is ")


def test_calibrating_a_slow_machine_reports_its_own_error(tmp_path):
    """A run ten times slower than the links: degraded for validate, but calibrate's before/after count it
    (the profile is that machine's own) and the fit brings its error down."""
    slow = _synthetic(tmp_path, 1, 4, TRUTH, sizes=(1024, 1 << 30), scale=10.0)
    d = validation.calibrate([slow], tol=0.01)
    assert d["before"]["tables"] == d["after"]["tables"] == 1
    assert d["before"]["large"] > 5 and d["after"]["large"] < 0.05 and d["after"]["small"] < 0.05


def test_a_broken_index_is_one_line(tmp_path, capsys):
    f = _synthetic(tmp_path, 1, 4, TRUTH, sizes=(1024,))
    (tmp_path / "tables.yaml").write_text("a: [unclosed\n")
    assert main(["simulate", "validate", str(f)]) == 1
    err = capsys.readouterr().err
    assert "tables.yaml: cannot read the index of tables" in err and err.count("\n") == 1


def test_flags_win_over_the_device_lines(tmp_path, capsys):
    """The file's device lines say one host of 4 GPUs; the command line says two hosts of 2: the flags win."""
    f = _synthetic(tmp_path, 1, 4, TRUTH, sizes=(1024, 1 << 30))
    assert (
        main(["simulate", "validate", str(f), "--hosts", "2", "--gpus-per-host", "2", "--nic", "2x400G-ib", "--json"])
        == 0
    )
    e = json.loads(capsys.readouterr().out)["files"][0]
    assert e["status"] == "ok" and e["machine"] == "2 x h100-sxm (2 GPUs each), NICs 2x400G-ib"


def test_an_unreadable_file_is_listed_as_skipped(tmp_path, capsys):
    good = _synthetic(tmp_path, 1, 4, TRUTH, sizes=(1024,))
    bad = tmp_path / "chatter.txt"
    bad.write_text("no table here\n")
    assert main(["simulate", "validate", str(good), str(bad)]) == 0
    out = capsys.readouterr().out
    assert "skipped (1):" in out and f"{bad}: no nccl-tests table" in out and "total over 1 tables" in out
