"""`treecoll simulate calibrate` (tools/calibration.py): the fit recovers the parameters a synthetic table
was made with (tests/tools/_synthetic_tables.py), moves only what the tables identify, and its profile
predicts other sizes, collectives and scales.
"""

from __future__ import annotations

import json

import pytest
import yaml
from treecoll.collectives.sim.profiles import get_profile
from treecoll.tools import calibration, validation
from treecoll.tools.cli import main
from treecoll.topo.machines import MachineFlags, Nic

from tests.tools._synthetic_tables import TRUTH, synthetic, table, tree_ll


def test_calibration_recovers_known_parameters(tmp_path, capsys):
    """An all_gather on one host of 4 GPUs (NVLink, the ring), a sendrecv between two hosts of one GPU over
    one 200 Gb/s NIC each (the network, point-to-point; the NIC's 25 GB/s, not the 48 GB/s PCIe link
    before it, limits the route) and a sendrecv on the 4-GPU host: the fit finds the factors the tables
    were made with: the links' bandwidths, the NVLink and network hops every family shares, and the
    point-to-point latency the two sendrecv tables show beyond those hops; the tree's latency, which no
    table runs, and the PCIe links, which none is limited by, stay at 1."""
    nic = MachineFlags(nic=Nic(1, 200.0, "slingshot"))
    files = [
        synthetic(tmp_path, 1, 4, TRUTH),
        synthetic(tmp_path, 2, 1, TRUTH, collective="sendrecv", flags=nic),
        synthetic(tmp_path, 1, 4, TRUTH, collective="sendrecv"),
    ]
    d = calibration.calibrate(files, nic, tol=0.002, check=False)
    seen = {k: v for k, v in TRUTH.items() if k != "lat_scale.tree"}
    assert set(seen) <= set(d["fit"]["fitted"])
    # the network's added latency, which the network sendrecv shares with its hop factor, may take a
    # fraction of a µs (the hop factor within 3% of its value); a factor the tables were not made with
    # may move, by less than the fit's tolerance on the others
    extra = set(d["fit"]["fitted"]) - set(seen) - {"hop_lat_us.net"}
    assert d["values"].get("hop_lat_us.net", 0.0) < 0.5
    assert all(d["values"][k] == pytest.approx(1.0, rel=0.01) for k in extra), extra
    for k, v in seen.items():
        assert d["values"][k] == pytest.approx(v, rel=0.03), k
    for k in ("lat_scale.tree", "lat_scale.nvls", "link_scale.pcie"):
        assert d["values"][k] == 1.0 and k in d["fit"]["not_identified"], k
    assert d["fit"]["error_after"] < 0.01 < d["fit"]["error_before"]
    assert d["profile"].fitted == tuple(d["fit"]["fitted"])
    text = calibration.render_calibration(d)
    assert "lat_scale.tree       1.000   default kept: not identified" in text
    assert "hop_scale.net" in text and "proto_max.ll          none   default kept: no protocol switch" in text


def test_a_table_moves_only_the_factors_it_identifies(tmp_path):
    """A sendrecv on one host depends on the NVLink links, the NVLink hops and the point-to-point latency,
    nothing else: made with a network factor and a tree latency as well, its fit moves only factors of
    those (the NVLink links to their value) and leaves the network and the ring's, tree's and NVLS's
    own factors at the default."""
    sr = synthetic(tmp_path, 1, 4, TRUTH, collective="sendrecv")
    d = calibration.calibrate([sr], tol=0.002, check=False)
    assert "link_scale.nvlink" in d["fit"]["fitted"]
    assert set(d["fit"]["fitted"]) <= {"link_scale.nvlink", "hop_scale.nvlink", "lat_scale.p2p"}
    assert d["values"]["link_scale.nvlink"] == pytest.approx(TRUTH["link_scale.nvlink"], rel=0.03)
    assert all(d["values"][f"lat_scale.{f}"] == 1.0 for f in ("ring", "tree", "nvls"))
    assert d["values"]["hop_scale.net"] == d["values"]["link_scale.net"] == 1.0
    assert d["fit"]["error_after"] < 0.01


def test_a_latency_fitted_on_the_tree_carries_to_the_ring(tmp_path):
    """Across two hosts of 4 GPUs NCCL's tree runs the small allreduce messages; an allreduce made with the
    network hops 2.5 times NCCL's gives back that shared hop latency, not the tree's own latency, and the
    calibration then predicts an all_gather (a ring, which the allreduce table never ran) of the same
    machine within 5%, where the defaults are 18% off."""
    nic = MachineFlags(nic=Nic(4, 200.0, "slingshot"))
    truth = {"hop_scale.net": 2.5}
    sizes = (1024, 65536)
    ar = synthetic(tmp_path, 2, 4, truth, sizes, collective="allreduce", flags=nic, algos=("ring", "tree"))
    topo = validation.topology_for(validation.cases([ar])[0][0], nic)[0]
    assert [validation.predict(topo, "allreduce", s, ("ring", "tree"), "auto")[1] for s in sizes] == [
        "tree/nccl-ll"
    ] * 2
    d = calibration.calibrate([ar], nic, tol=0.002, check=False)
    # LL's rows alone cannot tell a factor on NCCL's network hop from an added transport latency: the fit
    # puts what it finds on one or both, never on the tree's own factors, and the network hop of LL's
    # tree (5 us and the NIC's latency, times 2.5) comes back within 3%
    assert "hop_scale.net" in d["fit"]["fitted"] and set(d["fit"]["fitted"]) <= {"hop_scale.net", "hop_lat_us.net"}
    default = calibration.calibration_from({}).apply(tree_ll(), "tree").lat_floor_us["net"]
    assert d["profile"].apply(tree_ll(), "tree").lat_floor_us["net"] == pytest.approx(2.5 * default, rel=0.03)
    ag = synthetic(tmp_path, 2, 4, truth, sizes, flags=nic)
    before, after = (validation.validate([ag], p, nic)["files"][0]["geomean_small"] for p in (None, d["profile"]))
    # within 5%: what the fit put on the added latency adds as much to the ring's 2.7 us hop as to the
    # tree's 5 us one, where the factor it was made with adds in proportion
    assert before > 0.15 and after < 0.05


def test_a_protocol_switch_point_is_found_where_the_curve_steps(tmp_path):
    """An all_gather on one host of 4 GPUs made with LL stopping at 6000 bytes (LL128 from 8 KiB on: the
    time steps up from 9.9 to 23 us there) and slower NVLink hops: the fit puts LL's switch point
    between 4 and 8 KiB (every point there predicts the table alike) and recovers the hop factor; LL128's
    switch point stays the simulator's rule."""
    truth = {"proto_max.ll": 6000, "hop_scale.nvlink": 1.5}
    sizes = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
    ag = synthetic(tmp_path, 1, 4, truth, sizes)
    d = calibration.calibrate([ag], tol=0.002, check=False, max_rows=None)
    assert set(d["fit"]["fitted"]) == set(truth)
    assert 4096 <= d["values"]["proto_max.ll"] < 8192
    assert d["values"]["hop_scale.nvlink"] == pytest.approx(1.5, rel=0.03)
    assert d["profile"].proto_max == {"ll": int(d["values"]["proto_max.ll"])} and d["fit"]["error_after"] < 0.01
    assert "proto_max.ll128" in d["fit"]["switch_default"]


def test_a_transport_latency_is_found_and_carries_to_the_tree(tmp_path):
    """An all_gather (the ring) across two hosts of 2 GPUs over Slingshot made with 40 us of transport
    latency per network hop
    (once with LL at 1 and 64 KiB, twice with Simple at 1 and 4 MiB: NCCL adds the net plugin's latency
    twice there): the fit gives back that added latency, not a factor on NCCL's per-hop constants (which
    would scale LL's and Simple's differently), and then predicts the same machine's allreduce (NCCL's
    tree at these sizes, which the table never ran) as it was made, where the defaults are far off."""
    nic = MachineFlags(nic=Nic(2, 200.0, "slingshot"))
    truth = {"hop_lat_us.net": 40.0}
    ag = synthetic(tmp_path, 2, 2, truth, (1024, 65536, 1 << 20, 4 << 20), flags=nic)
    d = calibration.calibrate([ag], nic, tol=0.002, check=False, max_rows=None)
    assert d["fit"]["fitted"] == ["hop_lat_us.net"]
    assert d["values"]["hop_lat_us.net"] == pytest.approx(40.0, rel=0.03)
    assert d["profile"].hop_lat_us == {"net": d["values"]["hop_lat_us.net"]}
    sizes = (1024, 65536)
    ar = synthetic(tmp_path, 2, 2, truth, sizes, collective="allreduce", flags=nic, algos=("ring", "tree"))
    topo = validation.topology_for(validation.cases([ar])[0][0], nic)[0]
    assert [validation.predict(topo, "allreduce", s, ("ring", "tree"), d["profile"])[1] for s in sizes] == [
        "tree/nccl-ll"
    ] * 2
    before, after = (validation.validate([ar], p, nic)["files"][0]["geomean_small"] for p in (None, d["profile"]))
    assert before > 0.5 and after < 0.01


def test_a_table_without_small_messages_shows_its_latency_where_its_curve_is_flat(tmp_path):
    """An all_gather across two hosts of 2 GPUs over Slingshot from 1 MiB on, made with 100 us of transport latency: its
    1 and 2 MiB rows take about the same time (the latency), and the fit finds the latency there (within
    6%: three rows, LL128 and Simple trading places as it moves), then predicts the small messages of the
    machine's allreduce, which the table never had, within 5% where the defaults are 9 times too fast."""
    nic = MachineFlags(nic=Nic(2, 200.0, "slingshot"))
    truth = {"hop_lat_us.net": 100.0}
    ag = synthetic(tmp_path, 2, 2, truth, (1 << 20, 2 << 20, 4 << 20, 64 << 20), flags=nic)
    case = validation.cases([ag])[0][0]
    assert [r.size for r in calibration._flat_rows(validation.row_sizes(case, None))] == [1 << 20, 2 << 20]
    d = calibration.calibrate([ag], nic, tol=0.002, check=False)
    assert d["fit"]["fitted"] == ["hop_lat_us.net"]
    assert d["values"]["hop_lat_us.net"] == pytest.approx(100.0, rel=0.06)
    ar = synthetic(tmp_path, 2, 2, truth, (1024, 65536), collective="allreduce", flags=nic, algos=("ring", "tree"))
    before, after = (validation.validate([ar], p, nic)["files"][0]["geomean_small"] for p in (None, d["profile"]))
    assert before > 1.0 and after < 0.05


def test_a_latency_across_hosts_goes_to_the_network_not_the_hops_within_a_host(tmp_path):
    """An all_gather across two hosts of 4 GPUs over Slingshot from 4 MiB on (no small messages), made with 30 us of
    transport latency per network hop: its 4 and 8 MiB rows are flat, and the ring's six NVLink hops could hold that
    latency as well as its two network hops. The fit puts it on the network's transport, where it was
    made (an NVLink hop within half to twice NCCL's, its pull back larger than the network's), and then
    predicts the machine's small allreduce messages (the tree, which crosses the network twice and NVLink
    little) within 5%, where the defaults are far off. Over InfiniBand the fit adds no transport latency."""
    nic = MachineFlags(nic=Nic(4, 200.0, "slingshot"))
    truth = {"hop_lat_us.net": 30.0}
    ag = synthetic(tmp_path, 2, 4, truth, (4 << 20, 8 << 20, 16 << 20, 64 << 20, 256 << 20), flags=nic)
    d = calibration.calibrate([ag], nic, tol=0.002, check=False)
    assert d["fit"]["fitted"] == ["hop_lat_us.net"]
    assert d["values"]["hop_lat_us.net"] == pytest.approx(30.0, rel=0.05)
    assert d["values"]["hop_scale.nvlink"] == 1.0
    assert calibration.fit_bounds()["hop_scale.nvlink"] == (0.5, 2.0)
    ar = synthetic(tmp_path, 2, 4, truth, (1024, 65536), collective="allreduce", flags=nic, algos=("ring", "tree"))
    before, after = (validation.validate([ar], p, nic)["files"][0]["geomean_small"] for p in (None, d["profile"]))
    assert before > 1.0 and after < 0.05
    # over InfiniBand NCCL's network latencies are the transport's own: no latency is added to them
    ib = MachineFlags(nic=Nic(4, 200.0, "ib"))
    (tmp_path / "ib").mkdir()
    ag = synthetic(tmp_path / "ib", 2, 4, truth, (4 << 20, 8 << 20, 16 << 20, 64 << 20, 256 << 20), flags=ib)
    d = calibration.calibrate([ag], ib, tol=0.002, check=False)
    assert d["values"]["hop_lat_us.net"] == 0.0 and d["fit"]["infiniband_default"] == ["hop_lat_us.net"]
    assert "hop_lat_us.net       0.000   default kept: InfiniBand" in calibration.render_calibration(d)


def test_a_protocol_bandwidth_is_found_and_carries_to_the_allreduce(tmp_path):
    """Two hosts of one GPU over one 400 Gb/s NIC each: an all_gather made with LL at a sixth of its default
    bandwidth (the time rises with the size from 8 KiB on, as on a real two-rank run) gives back that
    factor, and then predicts the machine's allreduce (the ring with LL, twice the bytes per rank) as it
    was made, where the defaults are off."""
    nic = MachineFlags(nic=Nic(1, 400.0, "roce"))
    truth = {"proto_bw.ll": 0.16}
    sizes = (1024, 16384, 65536)
    ag = synthetic(tmp_path, 2, 1, truth, sizes, flags=nic)
    d = calibration.calibrate([ag], nic, tol=0.002, check=False, max_rows=None)
    assert d["fit"]["fitted"] == ["proto_bw.ll"]
    assert d["values"]["proto_bw.ll"] == pytest.approx(0.16, rel=0.03)
    ar = synthetic(tmp_path, 2, 1, truth, sizes, collective="allreduce", flags=nic, algos=("ring", "tree"))
    before, after = (validation.validate([ar], p, nic)["files"][0]["geomean_small"] for p in (None, d["profile"]))
    assert before > 0.1 and after < 0.01


def test_pattern_search_finds_a_bounded_minimum():
    x, fx, calls = calibration.pattern_search(
        lambda v: (v[0] - 3.0) ** 2, [0.0], step=1.0, tol=1e-3, bounds=[(-1.0, 2.0)]
    )
    assert x == [2.0] and fx == 1.0 and calls < 50


def test_calibrate_never_replaces_a_file_without_force(tmp_path, capsys):
    f = synthetic(tmp_path, 1, 4, TRUTH, sizes=(1024, 1 << 30))
    out = tmp_path / "p.yaml"
    out.write_text("keep me\n")
    assert main(["simulate", "calibrate", str(f), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "the file exists; pass --force" in err and err.count("\n") == 1 and out.read_text() == "keep me\n"
    assert main(["simulate", "calibrate", str(f), "-o", str(f), "--force"]) == 1  # an input is never written
    assert main(["simulate", "calibrate", str(f), "-o", str(out), "--force"]) == 0
    text = capsys.readouterr().out
    assert "link_scale.nvlink" in text and f"saved {out}" in text
    prof = get_profile(str(out))
    assert prof.name == "p" and prof.value("link_scale.nvlink") == pytest.approx(TRUTH["link_scale.nvlink"], rel=0.03)
    saved = yaml.safe_load(out.read_text())
    assert saved["fit"]["files"] == [str(f)] and saved["kind"] == "calibration"
    assert saved["fitted"] == list(prof.fitted) and "hop_scale.nvlink" in saved["fitted"]
    assert saved["version"] == 3 and saved["hop_scale"]["nvlink"] == pytest.approx(TRUTH["hop_scale.nvlink"], rel=0.03)
    assert main(["simulate", "validate", str(f), "--profile", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["profile"] == "p" and d["files"][0]["geomean_large"] < 0.03
    assert main(["simulate", "calibrate", str(f), "-o", str(out), "--force", "--no-check", "--json"]) == 0
    d = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert d["saved"] == str(out) and d["profile"]["name"] == "p" and "link_scale" in d["profile"]


def test_calibrating_a_slow_machine_reports_its_own_error(tmp_path):
    """A run five times slower than the links: degraded for validate, but calibrate's before/after count it
    (the profile is that machine's own) and the fit brings its error down."""
    slow = synthetic(tmp_path, 1, 4, TRUTH, sizes=(1024, 1 << 30), scale=5.0)
    d = calibration.calibrate([slow], tol=0.01)
    assert d["before"]["tables"] == d["after"]["tables"] == 1
    assert d["before"]["large"] > 4 and d["after"]["large"] < 0.05 and d["after"]["small"] < 0.05


def test_rows_the_tree_runs_beyond_the_fit_leave_the_links_at_their_defaults(tmp_path):
    """A two-host allreduce over TCPXO (2 x 4 GPUs, 4 x 200 Gb/s NICs) made with 20 us of transport latency:
    from 64 MiB on NCCL's tree is the fastest (it moves each host's message over the NICs once, a ring
    twice), which the fit does not simulate from 4 MiB on. Those rows are left out of the fit and said so
    (fitted with the ring in the tree's place they would make the links faster); the small rows give back
    the latency, the links stay at their defaults, and the machine's all_gather (the ring, the links
    alone at large sizes) is predicted as it was made."""
    from treecoll.collectives.sim.simulator import nccl_hop_profile

    nic = MachineFlags(nic=Nic(4, 200.0, "tcpxo"))
    truth = {"hop_lat_us.net": 20.0}
    sizes = (1024, 65536, 64 << 20, 256 << 20)
    ar = synthetic(tmp_path, 2, 4, truth, sizes, collective="allreduce", flags=nic, algos=("ring", "tree"))
    topo = validation.topology_for(validation.cases([ar])[0][0], nic)[0]
    assert [validation.predict(topo, "allreduce", s, ("ring", "tree"), "auto")[1].split("/")[0] for s in sizes] == [
        "tree"
    ] * 4
    d = calibration.calibrate([ar], nic, tol=0.002, check=False)
    assert [x["sizes"] for x in d["left_out"]] == [[64 << 20, 256 << 20]]
    # Simple's rows alone cannot tell a factor on NCCL's network hop from an added transport latency: the fit
    # puts the latency on one or both; the tree's network hop with Simple comes back within 3%
    assert set(d["fit"]["fitted"]) <= {"hop_scale.net", "hop_lat_us.net"}
    simple = nccl_hop_profile(get_profile("nccl-simple"), "tree")
    made = calibration.calibration_from(truth).apply(simple, "tree").lat_floor_us["net"]
    assert d["profile"].apply(simple, "tree").lat_floor_us["net"] == pytest.approx(made, rel=0.03)
    assert all(d["values"][f"link_scale.{k}"] == 1.0 for k in ("nvlink", "pcie", "net"))
    assert "not fitted: " in calibration.render_calibration(d) and "NCCL's tree is the fastest" in (
        calibration.render_calibration(d)
    )
    ag = synthetic(tmp_path, 2, 4, truth, (64 << 20, 256 << 20), flags=nic)
    assert validation.validate([ag], d["profile"], nic)["files"][0]["geomean_large"] < 0.01


def test_over_infiniband_a_latency_one_family_shows_stays_that_familys(tmp_path):
    """Over InfiniBand every per-hop latency of the model is NCCL's own (tuning.cc hwLat NVLINK, PCI, NET). An
    all_gather across two hosts of 4 GPUs (the ring alone) made with the ring's latencies 2.5 times NCCL's
    (a run whose ring is configured apart, e.g. NCCL_MIN_CTAS) gives it back on the ring's own factor, not
    on the NVLink hop every family shares: the hops stay at their defaults, and the machine's small
    allreduce messages (the tree, which the table never ran) are predicted as the defaults predict them."""
    ib = MachineFlags(nic=Nic(4, 400.0, "ib"))
    truth = {"lat_scale.ring": 2.5}
    ag = synthetic(tmp_path, 2, 4, truth, (1024, 65536, 64 << 20, 256 << 20), flags=ib)
    d = calibration.calibrate([ag], ib, tol=0.002, check=False)
    assert d["fit"]["fitted"] == ["lat_scale.ring"]
    assert d["values"]["lat_scale.ring"] == pytest.approx(2.5, rel=0.03)
    assert all(d["values"][f"hop_scale.{k}"] == 1.0 for k in ("nvlink", "pci", "net"))
    ar = synthetic(tmp_path, 2, 4, truth, (1024, 65536), collective="allreduce", flags=ib, algos=("ring", "tree"))
    assert validation.validate([ar], d["profile"], ib)["files"][0]["geomean_small"] < 0.01


def test_a_protocol_that_runs_at_none_of_the_sizes_is_found(tmp_path):
    """An all_gather across two hosts of 4 GPUs over InfiniBand from 1 MiB on, made with LL and LL128 stopping at
    512 KiB (Simple at every size of the table: 59.9 us at 1 MiB, where LL would take about half): no bend of
    the curve shows it, and the fit gives back both switch points below the first size (every point between
    512 KiB and 1 MiB predicts the table alike), no latency; the machine's small allreduce messages (LL's, the
    tree) are then predicted as they were made."""
    ib = MachineFlags(nic=Nic(4, 400.0, "ib"))
    truth = {"proto_max.ll": 512 << 10, "proto_max.ll128": 512 << 10}
    ag = synthetic(tmp_path, 2, 4, truth, (1 << 20, 2 << 20, 4 << 20, 64 << 20, 256 << 20), flags=ib)
    d = calibration.calibrate([ag], ib, tol=0.002, check=False)
    assert sorted(d["fit"]["fitted"]) == ["proto_max.ll", "proto_max.ll128"] and d["fit"]["error_after"] < 0.01
    assert all(512 << 10 <= d["values"][k] < 1 << 20 for k in truth)
    ar = synthetic(tmp_path, 2, 4, truth, (1024, 65536), collective="allreduce", flags=ib, algos=("ring", "tree"))
    assert validation.validate([ar], d["profile"], ib)["files"][0]["geomean_small"] < 0.01


def test_a_row_the_run_slowed_down_once_is_not_fitted(tmp_path):
    """An all_gather on one host of 4 GPUs made with NVLink hops 1.5 times NCCL's, its 2 KiB row three times
    slower (as a run slows down once: larger sizes take a third of its time): the fit leaves that row out and
    says so, and gives back the hop factor as from the table without the glitch."""
    truth = {"hop_scale.nvlink": 1.5}
    sizes = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
    ag = synthetic(tmp_path, 1, 4, truth, sizes, glitch={2048: 3.0})
    d = calibration.calibrate([ag], tol=0.002, check=False)
    assert d["left_out"] == [{"file": str(ag), "sizes": [2048], "reason": calibration.GLITCH_REASON}]
    assert d["fit"]["fitted"] == ["hop_scale.nvlink"] and d["fit"]["error_after"] < 0.01
    assert d["values"]["hop_scale.nvlink"] == pytest.approx(1.5, rel=0.03)


def test_a_row_whose_two_runs_disagree_is_noisy_and_counts_nowhere(tmp_path, capsys):
    """nccl-tests times each size out of place and in place; a row whose two times are more than 1.5x apart
    (here the in-place run 3x slower; in a real 2-node H100 table the 8-byte allreduce took 68.52 us out of
    place and 24.70 in place) is printed with both and marked, and neither the table's error, the total nor
    the fit counts it; 1.4x apart counts as usual."""
    sizes = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
    truth = {"hop_scale.nvlink": 1.5}
    clean = synthetic(tmp_path, 1, 4, truth, sizes)
    times = {int(line.split()[0]): float(line.split()[5]) for line in clean.read_text().splitlines() if line[:1] == " "}
    bad = tmp_path / "noisy.txt"
    bad.write_text(table(1, 4, times, in_place={2048: 3 * times[2048], 4096: 1.4 * times[4096]}))
    d, ref = validation.validate([bad]), validation.validate([clean])
    rows = {r["size"]: r for r in d["files"][0]["rows"]}
    assert rows[2048]["noisy"] and rows[2048]["meas_inplace_us"] == pytest.approx(3 * times[2048], abs=0.01)
    assert [s for s, r in rows.items() if r["noisy"]] == [2048]
    kept = [r for r in ref["files"][0]["rows"] if r["size"] != 2048]
    assert d["files"][0]["geomean_small"] == pytest.approx(validation._errors(kept)[1], rel=1e-9)
    assert d["geomean"]["small"] == pytest.approx(d["files"][0]["geomean_small"])
    assert main(["simulate", "validate", str(bad)]) == 0
    out = capsys.readouterr().out
    assert (
        f"noisy: 2048 B took {rows[2048]['meas_us']:g} us out of place and {rows[2048]['meas_inplace_us']:g} in place"
        in out
    )
    marked = [line.split()[0] for line in out.splitlines() if line.endswith("  noisy")]
    assert marked == ["2048"]
    assert "(0 degraded and 0 skipped left out; 1 noisy row not counted)" in out
    fit = calibration.calibrate([bad], tol=0.002, check=False)
    assert {"file": str(bad), "sizes": [2048], "reason": calibration.NOISY_REASON} in fit["left_out"]
    assert fit["values"]["hop_scale.nvlink"] == pytest.approx(1.5, rel=0.03)
