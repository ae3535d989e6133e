"""`treecoll simulate validate` (tools/validation.py) on synthetic and real nccl-tests tables (the
synthetic ones: tests/tools/_synthetic_tables.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from treecoll.tools import calibration, validation
from treecoll.tools.cli import main
from treecoll.topo.machines import MachineFlags

from tests.tools._synthetic_tables import TRUTH, synthetic


def test_old_profile_versions_load_with_the_new_parameters_at_their_defaults(tmp_path):
    """A version-1 and a version-2 calibration file (written before hop_lat_us and proto_bw) load, with no
    added latency and LL's and LL128's bandwidth as NCCL's; a latency out of its bounds is one line."""
    from treecoll.collectives.sim.profiles import load_profile
    from treecoll.topo.errors import CollectiveError

    v1 = tmp_path / "v1.yaml"
    v1.write_text("name: old\nkind: calibration\nlink_scale: {net: 0.8}\nlat_scale: {ring: 1.5}\nfitted: []\n")
    v2 = tmp_path / "v2.yaml"
    v2.write_text("name: old\nkind: calibration\nversion: 2\nhop_scale: {net: 2.0}\nproto_max: {ll: 4096}\n")
    for f in (v1, v2):
        p = load_profile(f)
        assert p.value("hop_lat_us.net") == 0.0 and p.value("proto_bw.ll") == 1.0 and p.hop_lat_us == {}
    assert load_profile(v1).value("link_scale.net") == 0.8 and load_profile(v2).proto_max == {"ll": 4096}
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nkind: calibration\nversion: 3\nhop_lat_us: {net: 5000}\n")
    with pytest.raises(CollectiveError, match=r"hop_lat_us.net expected a latency in µs in \[0, 1000\], got 5000"):
        load_profile(bad)


def test_remembered_times_are_the_simulated_ones():
    """Every predicted row of a validation equals a fresh simulation (simulate_nccl): the fastest of the
    algorithms, with the defaults and with a calibration; a calibration of all factors 1 predicts each
    algorithm as the defaults do; a second validation, from the memory, prints the same numbers."""
    from treecoll.collectives.sim.simulator import simulate_nccl

    name = "heldout/h100-8gpu-1node-allreduce-aws-p5-batch-tagoutput.txt"
    case = validation.cases([FIX / name])[0][0]
    topo = validation.topology_for(case)[0]
    algos = validation.algorithms(case, "allreduce", topo)[0]
    cal = calibration.calibration_from({"lat_scale.ring": 1.7, "link_scale.nvlink": 0.9})
    ones = calibration.calibration_from({})
    keep = {1024, 65536, 1 << 20}.__contains__  # small sizes: the tree's flow simulation is quick there
    for prof in ("auto", cal, ones):
        validation.clear_cache()
        first = validation.validate([FIX / name], prof, keep=keep)["files"][0]["rows"]
        assert len(first) == 3 and first == validation.validate([FIX / name], prof, keep=keep)["files"][0]["rows"]
        for r in first:
            a, sim = simulate_nccl(topo, r["size"], profile=prof, algos=algos)
            assert (r["pred_us"], r["algo"]) == (sim.time * 1e6, f"{sim.algorithm if a == 'nvls' else a}/{sim.profile}")
    for a in algos:
        assert simulate_nccl(topo, 1 << 20, profile=ones, algos=[a])[1].time == (
            simulate_nccl(topo, 1 << 20, profile="auto", algos=[a])[1].time
        )


def test_validate_json_has_the_documented_shape(tmp_path, capsys):
    f = synthetic(tmp_path, 1, 4, TRUTH)
    assert main(["simulate", "validate", str(f), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    e = d["files"][0]
    assert {"file", "status", "reason", "collective", "geomean_large", "geomean_small", "rows"} <= set(e)
    assert (e["status"], e["collective"], e["reason"], e["degraded"]) == ("ok", "allgather", "", False)
    assert {"large", "small"} <= set(d["geomean"]) and d["geomean"]["tables"] == 1
    r = e["rows"][-1]
    assert r["size"] == 1 << 30 and r["meas_busbw"] == pytest.approx((1 << 30) / (r["meas_us"] * 1e3) * 3 / 4)
    assert r["error"] == pytest.approx(r["pred_busbw"] / r["meas_busbw"] - 1)
    # the table was made with other factors than the defaults: the error is the geometric mean of the
    # ratios of the times (busbw is size / time times one factor)
    large = [x for x in e["rows"] if x["size"] >= validation.LARGE]
    logs = [abs(math.log(x["meas_us"] / x["pred_us"])) for x in large]
    assert len(large) == 2 and e["geomean_large"] == pytest.approx(math.exp(sum(logs) / 2) - 1, rel=1e-6)
    assert e["geomean_large"] > 0.1
    assert d["geomean"]["large"] == pytest.approx(e["geomean_large"])


def test_a_profile_file_predicts_its_own_table_exactly(tmp_path):
    f = synthetic(tmp_path, 1, 4, TRUTH)
    prof = calibration.calibration_from(TRUTH, "truth")
    d = validation.validate([f], prof)
    assert d["files"][0]["geomean_large"] < 1e-3 and d["files"][0]["geomean_small"] < 1e-3


def test_degraded_runs_are_marked_and_left_out_of_the_total(tmp_path):
    """Ten times slower than the simulator's own NVLink numbers: below a quarter of the ideal ring."""
    good = synthetic(tmp_path, 1, 4, TRUTH)
    slow = synthetic(tmp_path, 1, 4, TRUTH, scale=10.0)
    d = validation.validate([good, slow], calibration.calibration_from(TRUTH, "truth"))
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


def test_a_run_slower_at_a_smaller_size_is_degraded():
    """b200-16gpu-2node-allgather: 2 MiB took 1753.7 us, 4 MiB 933.6 us (1.88 x, over the 1.5 rule)."""
    fix = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests"
    c = validation.cases([fix / "b200-16gpu-2node-allgather.txt"])[0][0]
    why = validation.degraded(c, None, "allgather", [])
    assert why.startswith("degraded: 2097152 B took 1753.7 us, 1.9 x the 933.6 us of 4194304 B")
    # the rule's edges: latency-bound sizes below 1 MiB and a ratio of exactly 1.5 are not flagged
    assert validation.slower_than_larger([(512 << 10, 300.0), (2 << 20, 100.0)]) is None
    assert validation.slower_than_larger([(1 << 20, 150.0), (2 << 20, 100.0)]) is None
    assert validation.slower_than_larger([(1 << 20, 151.0), (3 << 20, 130.0), (2 << 20, 100.0)]) == (
        (1 << 20, 151.0),
        (2 << 20, 100.0),
    )
    # a size 1.5 x larger is not "twice as large or more"
    assert validation.slower_than_larger([(2 << 20, 200.0), (3 << 20, 100.0)]) is None


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


FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests"
#: tables whose busbw/algbw ratio was printed for another GPU count than their source describes
#: (tests/fixtures/README.md): skipped with the rank count and the flags to pass
INCONSISTENT = {
    "heldout/a100-128gpu-16node-allreduce-ib-oldformat.txt": 32,
    "heldout/gb200-144gpu-36node-allreduce-2rack.txt": 128,
    "heldout/h100-64gpu-8node-allreduce-ib-sharp-ellipsis.txt": 96,
}
#: tables the validator calls degraded by their own times though their source states no health: a size
#: of 1 MiB or more slower than 1.5 x a size twice as large (validation.slower_than_larger)
SLOWER = {"b200-16gpu-2node-allgather.txt"}


@pytest.mark.parametrize("name", sorted(p.relative_to(FIX).as_posix() for p in FIX.rglob("*.txt")))
def test_every_fixture_table_is_accepted(name):
    """Every real table: collective recognised, machine built from the file and its index flags, GPU count
    matching (no rows simulated here: keep nothing); only the three inconsistent tables are skipped; degraded:
    those the index calls so and those slower at a size than at one twice as large."""
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
        assert e["degraded"] == (health == "degraded" or name in SLOWER)


def test_several_tables_in_one_file_are_validated_apart(tmp_path, capsys):
    one = synthetic(tmp_path, 1, 4, TRUTH).read_text()
    two = tmp_path / "two.txt"
    two.write_text(one + one.replace("# nThread", "# Collective test starting: all_gather_perf\n# nThread"))
    d = validation.validate([two], calibration.calibration_from(TRUTH, "truth"))
    assert [(e["table"], e["status"], e["collective"]) for e in d["files"]] == [
        (0, "ok", "allgather"),
        (1, "ok", "allgather"),
    ]
    assert d["geomean"]["tables"] == 2
    assert main(["simulate", "validate", str(tmp_path / "missing.txt")]) == 1
    err = capsys.readouterr().err
    assert "missing.txt: cannot read nccl-tests output: no such file" in err and err.count("\n") == 1
    for bad, says in ((tmp_path, "it is a directory"), ("/dev/null", "not a regular file (a character device)")):
        assert main(["simulate", "validate", str(bad)]) == 1
        err = capsys.readouterr().err
        assert f"{bad}: cannot read nccl-tests output: {says}" in err and err.count("\n") == 1


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


def test_a_broken_index_is_one_line(tmp_path, capsys):
    f = synthetic(tmp_path, 1, 4, TRUTH, sizes=(1024,))
    (tmp_path / "tables.yaml").write_text("a: [unclosed\n")
    assert main(["simulate", "validate", str(f)]) == 1
    err = capsys.readouterr().err
    assert "tables.yaml: cannot read the index of tables" in err and err.count("\n") == 1


def test_flags_win_over_the_device_lines(tmp_path, capsys):
    """The file's device lines say one host of 4 GPUs; the command line says two hosts of 2: the flags win."""
    f = synthetic(tmp_path, 1, 4, TRUTH, sizes=(1024, 1 << 30))
    assert (
        main(["simulate", "validate", str(f), "--hosts", "2", "--gpus-per-host", "2", "--nic", "2x400G-ib", "--json"])
        == 0
    )
    e = json.loads(capsys.readouterr().out)["files"][0]
    assert e["status"] == "ok" and e["machine"] == "2 x h100-sxm (2 GPUs each), NICs 2x400G-ib"


def test_an_unreadable_file_is_listed_as_skipped(tmp_path, capsys):
    good = synthetic(tmp_path, 1, 4, TRUTH, sizes=(1024,))
    bad = tmp_path / "chatter.txt"
    bad.write_text("no table here\n")
    assert main(["simulate", "validate", str(good), str(bad)]) == 0
    out = capsys.readouterr().out
    assert "skipped (1):" in out and f"{bad}: no nccl-tests table" in out and "total over 1 tables" in out


def test_nothing_predicted_exits_1_and_names_each_file_once(tmp_path, capsys):
    empty, chatter = tmp_path / "empty.txt", tmp_path / "chatter.txt"
    empty.write_text("")
    chatter.write_text("no table here\n")
    assert main(["simulate", "validate", str(empty), str(chatter), "--gpu", "H100"]) == 1
    out = capsys.readouterr().out
    skipped = out.split("skipped (2):\n")[1].split("\n\n")[0].splitlines()
    assert [line.strip().split(":")[0] for line in skipped] == [str(empty), str(chatter)]
    assert all(line.count(str(tmp_path)) == 1 and "?" not in line for line in skipped), skipped
    assert "total over 0 tables" in out
    assert main(["simulate", "calibrate", str(empty), "--gpu", "H100", "-o", str(tmp_path / "p.yaml")]) == 1
    err = capsys.readouterr().err
    assert "no table row to fit" in err and err.count(str(empty)) == 1, err
