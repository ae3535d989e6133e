"""treecoll.tools.emucluster: parsing, placement and topology everywhere; real namespaces when root.

The cluster tests need root (CAP_NET_ADMIN), iproute2 and tc tbf; without
them they skip with the reason. They create clusters with their own ids
(``t<pid>...``), touch no address outside those namespaces and loopback, and
check that nothing with the id is left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from treecoll.tools.emucluster import cli, measure, netns, runner, topology
from treecoll.tools.emucluster.netns import EmuClusterError

REPO = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------- no privileges needed


@pytest.mark.parametrize(
    "text,bps", [("1gbit", 10**9), ("10Gbit", 10**10), ("2.5mbit", 2_500_000), ("100kbit", 100_000), (64000, 64000)]
)
def test_parse_rate(text, bps):
    assert netns.parse_rate(text) == bps
    assert netns.parse_rate(netns.format_rate(bps)) == bps


@pytest.mark.parametrize("text", ["1gbps", "fast", "", "-1gbit", "1000"])
def test_parse_rate_rejects(text):
    with pytest.raises(EmuClusterError, match=r"rate: expected"):
        netns.parse_rate(text)


def test_parse_pair_rate():
    assert netns.parse_pair_rate("h1-h0=100mbit", 3) == ((0, 1), 10**8)
    with pytest.raises(EmuClusterError, match=r"expected two different hosts in 0\.\.1"):
        netns.parse_pair_rate("0-2=1gbit", 2)
    with pytest.raises(EmuClusterError, match=r"expected A-B=RATE"):
        netns.parse_pair_rate("0:1=1gbit", 2)


def test_host_rate_parsing_and_topology():
    assert netns.parse_host_rate("h2=100mbit", 4) == (2, 10**8)
    with pytest.raises(EmuClusterError, match=r"--host-rate '4=1gbit': expected a host in 0\.\.3, got 4"):
        netns.parse_host_rate("4=1gbit", 4)
    with pytest.raises(EmuClusterError, match=r"--host-rate: expected H=RATE"):
        netns.parse_host_rate("2:1gbit", 4)
    s = netns.ClusterSpec("a", 3, 10**9, host_rates={2: 10**8})
    assert [s.uplink_rate(h) for h in range(3)] == [10**9, 10**9, 10**8]
    args = cli.build_parser().parse_args(["up", "--hosts", "4", "--host-rate", "2=100mbit"])
    assert cli._host_rates(args) == {2: 10**8}
    # the fault is the cluster's, not the model's: the link keeps --rate, meta records the host's rate
    t = topology.build_topology(4, 1, 10**9, host_rates={2: 10**8})
    assert t.link("h2/nic0", "sw0")["bw"] == t.link("h0/nic0", "sw0")["bw"]
    assert t.meta["host_rates"] == {"2": 10**8}


def test_spec_validation():
    with pytest.raises(EmuClusterError, match=r"cluster id: expected 1-8 characters"):
        netns.ClusterSpec("Bad_Id", 2)
    with pytest.raises(EmuClusterError, match=r"--hosts: expected an integer in 1\.\.64, got 0"):
        netns.ClusterSpec("a", 0)
    s = netns.ClusterSpec("a", 3, pair_rates={(1, 2): 10**8, (0, 1): 10**9})
    assert list(s.pair_rates) == [(0, 1), (1, 2)]


def test_placement():
    assert topology.placement(2, 3, "blocked") == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert topology.placement(2, 3, "interleaved") == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
    with pytest.raises(EmuClusterError, match=r"--placement: expected one of \['blocked', 'interleaved'\]"):
        topology.placement(2, 2, "random")


def test_topology_shape_and_ranks():
    t = topology.build_topology(2, 3, 10**9, placement_mode="interleaved", pair_rates={(0, 1): 10**8})
    assert t.hosts() == ("h0", "h1")
    assert t.gpus_per_host() == {"h0": 3, "h1": 3}
    # interleaved: rank r on host r % 2, local r // 2
    assert [t.host_of(g) for g in t.rank_gpus()] == ["h0", "h1"] * 3
    assert t.rank_gpus()[4] == "h0/p2"
    up = t.link("h0/nic0", "sw0")
    assert up["kind"] == "net" and up["bw"] == pytest.approx(0.125 * 1448 / 1514, rel=1e-5)
    assert t.link("sw0", "h1/nic0")["bw"] == up["bw"]
    assert t.link("h1/nic0", "h0/nic0")["bw"] == pytest.approx(0.0125 * 1448 / 1514, rel=1e-5)
    assert t.link("h0/p1", "h0/cpu0")["bw"] == topology.LOOPBACK_GBS
    assert t.meta["rate_bps"] == 10**9 and t.meta["placement"] == "interleaved"


def test_topology_yaml_roundtrip(tmp_path):
    t = topology.build_topology(2, 2, 10**10)
    p = topology.save_topology(t, tmp_path / "emu.yaml")
    try:
        from treecoll.topo import yaml_io

        back = yaml_io.load(p)
    except (ImportError, AttributeError):
        import yaml
        from treecoll.topo.model import Topology

        back = Topology.from_dict(yaml.safe_load(p.read_text()))
    assert back == t


def test_missing_ip_and_privilege_messages(monkeypatch):
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None)
    with pytest.raises(EmuClusterError, match=r"needs `ip` \(iproute2\) on PATH; install it"):
        netns.check_prerequisites()
    monkeypatch.setattr(netns.shutil, "which", lambda tool: "/usr/sbin/" + tool)
    monkeypatch.setattr(netns, "_has_cap_net_admin", lambda: False)
    with pytest.raises(EmuClusterError, match=r"needs root \(CAP_NET_ADMIN"):
        netns.check_prerequisites()
    ok, why = netns.namespaces_available()
    assert not ok and "needs root" in why


def test_cli_errors_are_one_line(capsys, monkeypatch):
    monkeypatch.setattr(netns, "_has_cap_net_admin", lambda: False)
    rc = cli.main(["up", "--hosts", "2"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and err.startswith("error: emulated cluster: needs root")
    rc = cli.main(["run", "--hosts", "2", "--ranks-per-host", "1", "--"])
    assert rc == 1 and "expected a command after `--`" in capsys.readouterr().err


def test_cli_mounts_under_a_parent_parser():
    import argparse

    parser = argparse.ArgumentParser(prog="treecoll")
    parser.add_argument("--json", action="store_true")
    sub = parser.add_subparsers(dest="cmd")
    cli.add_parser(sub)
    args = parser.parse_args(
        [
            "--json",
            "emu",
            "run",
            "--hosts",
            "2",
            "--ranks-per-host",
            "2",
            "--placement",
            "interleaved",
            "--",
            "python",
            "-c",
            "pass",
        ]
    )
    assert args.func is cli.run and args.json is True and args.emu_cmd == "run"
    assert args.command[-3:] == ["python", "-c", "pass"] and args.placement == "interleaved"


def test_mounted_in_treecoll_cli(monkeypatch, capsys):
    from treecoll.tools import cli as main_cli

    assert "treecoll.tools.emucluster.cli" in main_cli.COMMANDS
    assert main_cli.main(["emu", "up", "--hosts", "0"]) == 1
    assert capsys.readouterr().err.strip() == "treecoll: error: --hosts: expected a positive integer, got 0"
    assert main_cli.main(["emu", "run", "--hosts", "2", "--ranks-per-host", "1", "--rate", "fast", "--", "x"]) == 1
    assert "--rate: expected a number with a unit" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real namespaces
AVAILABLE, WHY = netns.namespaces_available()
needs_netns = pytest.mark.skipif(not AVAILABLE, reason=f"emulated cluster unavailable: {WHY}")

WORKER = textwrap.dedent("""
    import datetime, json, os, sys, torch, torch.distributed as dist
    out = sys.argv[1]
    rank = int(os.environ["RANK"])
    if len(sys.argv) > 2 and rank == int(sys.argv[2]):
        sys.exit(3)                      # fail on purpose before joining the group
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    w = dist.get_world_size()
    def tx():
        return int(open("/sys/class/net/emu0/statistics/tx_bytes").read())
    x = torch.arange(1 << 17, dtype=torch.float64) * (rank + 1)      # 1 MiB
    t0 = tx(); dist.all_reduce(x); dist.barrier(); t_ar = tx() - t0
    ok = bool(torch.equal(x, torch.arange(1 << 17, dtype=torch.float64) * (w * (w + 1) // 2)))
    # same-host exchange: ranks 0 and 2 share host 0 under interleaved placement
    y = torch.ones(1 << 20, dtype=torch.float64)                      # 8 MiB
    t0 = tx()
    if rank == 0: dist.send(y, 2)
    elif rank == 2: dist.recv(y, 0)
    dist.barrier(); t_p2p = tx() - t0
    json.dump({"rank": rank, "ok": ok, "host": os.environ["TREECOLL_EMU_HOST"],
               "local": os.environ["LOCAL_RANK"], "ifname": os.environ["GLOO_SOCKET_IFNAME"],
               "tx_allreduce": t_ar, "tx_p2p": t_p2p, "y": float(y.sum())},
              open(os.path.join(out, f"r{rank}.json"), "w"))
    dist.destroy_process_group()
""")


def _leftovers(cid: str) -> list[str]:
    st = netns.status()
    found = [ns for ns in st["namespaces"] if ns.startswith(f"{netns.PREFIX}-{cid}-")]
    found += [f"link {x}" for x in st["root_links"]]
    found += [f"state {c['id']}" for c in st["clusters"] if c["id"] == cid]
    qd = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    found += [f"root qdisc {ln}" for ln in qd.splitlines() if netns.PREFIX in ln or netns.UPLINK in ln]
    return found


def _cid(tag: str) -> str:
    return f"t{tag}{os.getpid() % 100000}"


@needs_netns
@pytest.mark.timeout(120)
def test_allreduce_across_two_hosts(tmp_path):
    cid = _cid("a")
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    state = netns.create(netns.ClusterSpec(cid, 2, 10**9))
    try:
        res = runner.launch(
            state, [sys.executable, str(worker), str(tmp_path)], 2, placement_mode="interleaved", timeout=90
        )
    finally:
        netns.destroy(cid)
    assert res.returncode == 0, res
    recs = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(4)]
    assert all(r["ok"] for r in recs)
    assert [r["host"] for r in recs] == ["0", "1", "0", "1"]
    assert [r["local"] for r in recs] == ["0", "0", "1", "1"]
    assert {r["ifname"] for r in recs} == {netns.UPLINK}
    # gloo's allreduce crossed the shaped uplink: a ring over 4 ranks moves 2*(3/4) * 1 MiB per rank
    assert all(r["tx_allreduce"] >= 1 << 20 for r in recs), [r["tx_allreduce"] for r in recs]
    # 8 MiB between two ranks of host 0 stayed on loopback (only barrier packets on the uplink)
    assert recs[0]["y"] == recs[2]["y"] == float(1 << 20)
    assert recs[0]["tx_p2p"] < 256 * 1024 and recs[2]["tx_p2p"] < 256 * 1024, recs
    assert _leftovers(cid) == []


@needs_netns
@pytest.mark.timeout(120)
def test_failing_rank_kills_the_others_and_cleans_up(tmp_path):
    cid = _cid("f")
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    cmd = [
        sys.executable,
        "-m",
        "treecoll.tools.emucluster",
        "run",
        "--id",
        cid,
        "--hosts",
        "2",
        "--ranks-per-host",
        "2",
        "--placement",
        "interleaved",
        "--timeout",
        "90",
        "--topology-out",
        str(tmp_path / "emu.yaml"),
        "--",
        sys.executable,
        str(worker),
        str(tmp_path),
        "1",
    ]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=110)
    assert p.returncode == 3, p.stderr[-2000:]
    assert "rank 1 exited with 3; other ranks killed" in p.stderr
    assert not list(tmp_path.glob("r*.json"))  # the others never finished: they were killed
    assert "h1/nic0" in (tmp_path / "emu.yaml").read_text()
    assert _leftovers(cid) == []


@needs_netns
@pytest.mark.timeout(60)
def test_timeout_kills_ranks():
    cid = _cid("o")
    res = runner.run(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        hosts=2,
        ranks_per_host=1,
        cid=cid,
        timeout=1.0,
        grace=1.0,
    )
    assert res.timed_out and res.returncode == runner.TIMEOUT_EXIT
    assert all(c is not None and c != 0 for c in res.returncodes)
    assert res.seconds < 10
    assert _leftovers(cid) == []


@needs_netns
@pytest.mark.timeout(60)
def test_crash_leftovers_are_swept():
    # a cluster whose owner died (a crashed `run`) is removed by the next create
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cid = _cid("c")
    netns.create(netns.ClusterSpec(cid, 2, 10**8), owner_pid=dead.pid)
    assert _leftovers(cid)
    assert any(ns.startswith(f"{netns.PREFIX}-{cid}-") for ns in netns.sweep_stale())
    assert _leftovers(cid) == []
    # without a state file, `down --id` still finds the namespaces by prefix
    netns.create(netns.ClusterSpec(cid, 2, 10**8))
    (netns.state_dir() / f"{cid}.json").unlink()
    assert cli.main(["down", "--id", cid]) == 0
    assert _leftovers(cid) == []


def _tbf_burst(rate_bps: int) -> int:
    """The bucket size (bytes) the cluster gives tbf at ``rate_bps``, read from the tc command it runs."""
    argv = netns._tbf("ns", "dev", rate_bps)
    return int(argv[argv.index("burst") + 1])


#: relative margin above the highest payload rate (see :func:`_tcp_payload_bounds`)
FIRST_READ_SLACK = 0.002


def _tcp_payload_bounds(rate_bps: int, payload: int) -> tuple[float, float]:
    """(lowest, highest) Gbit/s of TCP payload that one stream of ``payload`` bytes can show through a
    tbf shaper at ``rate_bps``, timed from the receiver's first byte to its last.

    tbf charges every frame its length from the Ethernet header on (a GSO packet as its segments,
    qdisc_pkt_len); at MTU 1500 with TCP timestamps a segment carries 1448 payload bytes in 1514:
    the sustained payload rate is rate x 1448/1514 (0.9564 Gbit/s at 1 Gbit/s). The bucket is full
    when the stream starts (the pings before it leave the link idle), so its ``burst`` bytes pass at
    once, and the receiver's clock starts only after its first read (at most one 64 KiB GSO packet):
    those bytes take no measured time, raising the rate by (burst + 64 KiB) / bytes on the wire at
    most; :data:`FIRST_READ_SLACK` more allows for a first read that returns more than one packet
    (a 16 MiB stream at 1 Gbit/s once measured 0.96688 against 0.96680). The lower bound leaves
    5% for a sender starved of CPU on a loaded 2-core machine: the
    best of three runs measured 0.947-0.965 Gbit/s at 1 Gbit/s (16 MiB) and 0.097-0.0985 at
    100 Mbit/s (2 MiB) with the load average at 2.
    """
    sustained = rate_bps * 1448 / 1514 / 1e9
    wire = payload * 1514 / 1448
    return 0.95 * sustained, sustained * (1 + (_tbf_burst(rate_bps) + 64 * 1024) / wire) * (1 + FIRST_READ_SLACK)


@needs_netns
@pytest.mark.timeout(60)
def test_shaped_rate_and_pair_link():
    cid = _cid("r")
    netns.create(netns.ClusterSpec(cid, 3, 10**9, {(0, 2): 10**8}))
    try:
        lo = measure.measure_pair(cid, 0, 0, 64 << 20, pings=10)
        up = max((measure.measure_pair(cid, 0, 1, 16 << 20, pings=10) for _ in range(3)), key=lambda m: m["gbit_s"])
        pair = max((measure.measure_pair(cid, 2, 0, 2 << 20, pings=10) for _ in range(3)), key=lambda m: m["gbit_s"])
    finally:
        netns.destroy(cid)
    low, high = _tcp_payload_bounds(10**9, 16 << 20)
    assert (round(low, 4), round(high, 4)) == (0.9086, 0.9687)
    assert low <= up["gbit_s"] <= high, up
    low, high = _tcp_payload_bounds(10**8, 2 << 20)
    assert (round(low, 5), round(high, 5)) == (0.09086, 0.10156)
    assert low <= pair["gbit_s"] <= high, pair
    # loopback inside a host is not shaped: faster than any link shaped at 1gbit could be
    assert lo["gbit_s"] > 2.0, lo
    assert _leftovers(cid) == []


@needs_netns
@pytest.mark.timeout(120)
def test_probe_names_the_slow_host_and_the_tree_leaves_it_out(tmp_path):
    """4 hosts at 1gbit, host 2 at 100mbit: the probe (threshold 0.4), run as the job, names h2 alone within 60 s
    (the job's --timeout), and two_level on the calibrated topology keeps h2 out of the interior."""
    from treecoll.collectives import builders
    from treecoll.topo import yaml_io

    cid = _cid("p")
    out = tmp_path / "probed.yaml"
    cmd = [
        sys.executable,
        "-m",
        "treecoll.tools.emucluster",
        "run",
        "--id",
        cid,
        "--hosts",
        "4",
        "--ranks-per-host",
        "1",
        "--rate",
        "1gbit",
        "--host-rate",
        "2=100mbit",
        "--timeout",
        "60",
        "--",
        sys.executable,
        "-m",
        "treecoll.tools.cli",
        "topo",
        "probe",
        "--json",
        "--threshold",  # gloo's TCP over tbf-shaped veths moves 55-85% of the shaped rate on a 2-vCPU VM
        "0.4",  # (the healthy links, loaded steps lowest); h2 moves 10%
        "-o",
        str(out),
    ]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stderr[-2000:]
    assert time.monotonic() - t0 < 75  # the job's own 60 s plus making and removing the cluster
    r = json.loads(p.stdout)
    assert set(r) == {"pairs", "slow", "summary"}
    assert r["summary"]["slow_hosts"] == ["h2"] and r["summary"]["slow_nics"] == ["h2/nic0"]
    (slow,) = r["slow"]
    assert (slow["a"], slow["b"]) == ("h2/nic0", "sw0")
    # 100 Mbit/s of payload is a tenth of the modelled 1 Gbit/s one (0.1196 GB/s): well below 40 %
    assert slow["expected_gbps"] == pytest.approx(0.125 * 1448 / 1514, rel=1e-5)
    assert slow["measured_gbps"] < 0.25 * slow["expected_gbps"]
    probed = yaml_io.load(out)
    assert probed.link("sw0", "h2/nic0")["bw"] < 0.25 * probed.link("sw0", "h0/nic0")["bw"]
    assert probed.link("sw0", "h2/nic0")["measured"]
    gpus = probed.rank_gpus()
    tree = builders.two_level(probed, gpus, 4, rails=False)
    assert not [r for r, p in enumerate(tree.parents) if p != -1 and probed.host_of(gpus[p]) == "h2"], tree
    assert _leftovers(cid) == []
