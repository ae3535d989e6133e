"""NCCL's collectives in the simulator and in its analytic model: every nccl-tests collective on
closed-form cases, rings spread over the NICs, the channels NCCL runs per size, protocol choice."""

from __future__ import annotations

import json

import pytest
from treecoll.collectives.sim import nccl_model as nm
from treecoll.collectives.sim import transports as tr
from treecoll.collectives.sim.engine import Network
from treecoll.collectives.sim.profiles import get_profile
from treecoll.collectives.sim.result import bus_factor
from treecoll.collectives.sim.simulator import (
    PIPELINE_CHUNK_BYTES,
    nccl_hop_profile,
    nccl_rings,
    simulate_algorithm,
    simulate_nccl,
    simulate_p2p,
    simulate_ring,
    staged_bytes,
)
from treecoll.tools.cli import main
from treecoll.topo.errors import CollectiveError, TopologyError, TreeError

from tests.collectives.sim_helpers import ring_topology, star_topology
from treecoll import topo

S = 1 << 24  # 16 MiB


def test_sendrecv_on_one_link_is_bytes_over_bw_plus_latency():
    t = ring_topology(2, bw=50.0, lat=3.0)
    r = simulate_p2p(t, S, collective="sendrecv", profile="ideal")
    assert r.time == pytest.approx(3e-6 + S / 50e9)
    assert r.busbw == pytest.approx(r.algbw) == pytest.approx(S / r.time / 1e9)
    assert simulate_algorithm(t, "p2p", S, collective="sendrecv", profile="ideal").time == pytest.approx(r.time)


def test_alltoall_on_a_switch_sends_p_minus_1_pieces_through_each_uplink():
    P, bw, lat = 4, 100.0, 1.0
    r = simulate_p2p(star_topology(P, bw, lat), S, collective="alltoall", profile="ideal")
    # each GPU sends S / P to each of the P-1 others over its one uplink (and receives as much)
    assert r.time == pytest.approx(2 * lat * 1e-6 + (P - 1) / P * S / (bw * 1e9))
    assert r.busbw == pytest.approx(r.algbw * (P - 1) / P)


@pytest.mark.parametrize(
    "collective, steps, factor", [("allreduce", 6, 2 * 3 / 4), ("allgather", 3, 3 / 4), ("reduce_scatter", 3, 3 / 4)]
)
def test_ring_on_a_uniform_switch(collective, steps, factor):
    P, bw, lat = 4, 100.0, 1.0
    r = simulate_ring(star_topology(P, bw, lat), S, collective=collective, profile="ideal")
    # 2(P-1) (or P-1) steps of S / P bytes, each one switch route of 2 x lat
    assert r.time == pytest.approx(steps * (2 * lat * 1e-6 + S / P / (bw * 1e9)))
    assert r.busbw == pytest.approx(S / r.time / 1e9 * factor)
    assert (S * factor / (bw * 1e9)) < r.time


@pytest.mark.parametrize("collective", ["broadcast", "reduce"])
def test_ring_broadcast_and_reduce_pipeline_chunks_down_the_chain(collective):
    P, bw, lat = 4, 100.0, 1.0
    size = 4 << 20
    r = simulate_ring(star_topology(P, bw, lat), size, collective=collective, profile="ideal", root=2)
    k = size // PIPELINE_CHUNK_BYTES["nccl-simple"]  # 8 chunks of 512 KiB
    # the chain's P-1 hop latencies, then k + P - 2 steps of one chunk
    assert r.time == pytest.approx((P - 1) * 2 * lat * 1e-6 + (k + P - 2) * size / k / (bw * 1e9))
    assert r.busbw == pytest.approx(r.algbw)
    assert r.stats["pipeline_chunks"] == k


def test_every_collective_in_the_nccl_path_and_the_model():
    t = topo.resolve("dgx-h100")
    for c in nm.COLLECTIVES:
        name, r = simulate_nccl(t, 1 << 22, collective=c)
        m = nm.nccl_best(t, None, 1 << 22, c)
        assert r.collective == m["collective"] == c and name in nm.nccl_algos(t, t.rank_gpus(), None, c)
        assert r.busbw == pytest.approx(r.algbw * bus_factor(c, 8))
        assert m["busbw"] == pytest.approx((1 << 22) / m["time"] / 1e9 * bus_factor(c, 8))
        # the simulation and NCCL's model agree within a factor 2 at 4 MiB on one H100 host
        assert 0.5 < r.time / m["time"] < 2.0, c
    with pytest.raises(CollectiveError, match="NCCL collective 'gather'"):
        simulate_nccl(t, 8, collective="gather")
    with pytest.raises(CollectiveError, match="alltoall with algorithm 'ring'"):
        simulate_algorithm(t, "ring", 8, collective="alltoall")


def test_nccl_model_closed_forms_for_broadcast_and_allgather():
    t = topo.resolve("dgx-h100")  # 8 GPUs, 18 NVLinks of 20.6 GB/s: 18 ring channels
    b = nm.nccl_predict(t, None, 1 << 30, "ring", "Simple", collective="broadcast")
    # tuning.cc: broadcast ring, sameChannels: base 8.4 + one NVLink hop 3.4 µs; algBw = busBw x nRanks / nRanks
    assert b["lat_us"] == pytest.approx(8.4 + 3.4)
    assert b["model_algbw"] == pytest.approx(18 * 20.6)
    ag = nm.nccl_predict(t, None, 1 << 30, "ring", "Simple", collective="allgather")
    # allgather ring: (n - 1) steps of 3.4 µs; algBw = busBw x n / (n - 1)
    assert ag["lat_us"] == pytest.approx(8.4 + 7 * 3.4)
    assert ag["model_algbw"] == pytest.approx(18 * 20.6 * 8 / 7)
    assert ag["busbw"] == pytest.approx(ag["algbw"] * 7 / 8)
    with pytest.raises(TreeError, match=r"algo for broadcast expected one of \['ring'\], got 'tree'"):
        nm.nccl_predict(t, None, 8, "tree", collective="broadcast")


def test_pat_only_with_one_gpu_per_node():
    t = topo.resolve("dgx-h100-x2")
    assert nm.nccl_algos(t, t.rank_gpus(), None, "allgather") == ("ring",)
    one_per_host = [f"h{i}/gpu0" for i in range(2)]
    assert nm.nccl_algos(t, one_per_host, None, "allgather") == ("ring", "pat")
    pat = nm.nccl_predict(t, one_per_host, 1 << 20, "pat", collective="allgather")
    assert pat["proto"] == "Simple" and pat["lat_us"] > nm.PAT_BASE_LAT
    with pytest.raises(TreeError, match="PAT runs with one GPU per node only"):
        nm.nccl_predict(t, None, 1 << 20, "pat", collective="allgather")


def test_run_channels_follow_the_thread_threshold():
    # enqueue.cc: one channel fewer while nBytes < nc x nThreads x threshold (Simple 64 B, 512 threads)
    for size in (1, 1 << 10, 1 << 15, 1 << 16, 1 << 18, 1 << 20, 1 << 30):
        nc, have = nm.run_channels(size, "ring", "Simple", 16, 16)
        assert have == 32
        assert nc == max(1, min(32, size // (512 * 64)))
    # ring LL: threshold 8 B x nRanks
    assert nm.run_channels(16 * 8 * 512 * 4, "ring", "LL", 16, 16) == (4, 32)
    small = nm.nccl_predict(topo.resolve("dgx-h100"), None, 1 << 16, "ring", "Simple")
    assert small["run_channels"] < small["nchannels"] and small["run_time_us"] > small["time_us"]


def test_protocol_choice_is_monotone_in_size():
    for name in ("dgx-h100", "dgx-h100-x2", "dgx-a100"):
        t = topo.resolve(name)
        for c in ("allreduce", "allgather", "broadcast"):
            for algo in nm.nccl_algos(t, t.rank_gpus(), None, c):
                if algo in ("nvls", "p2p"):
                    continue
                chosen = [nm.nccl_predict(t, None, 1 << k, algo, collective=c)["proto"] for k in range(3, 34, 2)]
                idx = [nm.PROTOS.index(p) for p in chosen]
                assert idx == sorted(idx), (name, c, algo, chosen)
                assert chosen[0] == "LL" and chosen[-1] == "Simple"


def test_rings_enter_and_leave_every_host_through_one_nic():
    t = topo.resolve("dgx-h100-x2")
    gpus = t.rank_gpus()
    rings = nccl_rings(t, gpus, 8)
    nics_used = set()
    for c, ring in enumerate(rings):
        assert sorted(s for s, _, _ in ring) == sorted(gpus)
        for src, dst, via in ring:
            if t.host_of(src) == t.host_of(dst):
                assert via is None
                continue
            exit_nic = t.nearest_nic(via or src)
            assert exit_nic == t.nics(t.host_of(src))[c]  # channel c: the host's NIC c, out ...
            assert t.nearest_nic(dst) == t.nics(t.host_of(dst))[c]  # ... and in, on the same rail
            nics_used.add(exit_nic)
    assert len(nics_used) == 16  # every NIC of both hosts


def test_ring_stays_on_its_rail():
    t = topo.resolve("dgx-h100-x2")
    r = simulate_ring(t, 1 << 26, profile="ideal")
    assert r.kind_bytes.get("net", 0) > 0
    # rail-aligned: no byte goes up to a spine switch
    assert not [k for k in r.link_bytes if "spine" in k]


def test_ring_busbw_on_16_dgx_h100_reaches_the_nccl_model_asymptote():
    t = topo.resolve("dgx-h100-x16")
    r = simulate_ring(t, 1 << 30, profile="nccl-simple")
    model = nm.nccl_predict(t, None, 1 << 30, "ring", "Simple")
    asymptote = model["model_algbw"] * bus_factor("allreduce", 128)  # NCCL's nChannels x bw: 370.8 GB/s
    assert asymptote == pytest.approx(18 * 20.6)
    # NCCL's ring over all 8 NICs per host: within 80-100% of the model's asymptotic bus bandwidth, and
    # within 15% of its prediction at 1 GiB (which adds its latencies)
    assert 0.8 * asymptote <= r.busbw <= asymptote
    assert r.busbw == pytest.approx(model["busbw"], rel=0.15)
    assert r.busbw > 5 * 50  # more than 5 of a host's 8 NICs of 50 GB/s: the channels use every NIC


def test_simulate_cli_runs_every_collective(capsys):
    for c in ("broadcast", "alltoall", "reduce_scatter"):
        assert main(["simulate", c, "--topology", "dgx-h100", "--sizes", "1M", "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["collective"] == c
        for v in d["rows"][0]["algos"].values():
            assert v["busbw"] == pytest.approx((1 << 20) / (v["time_us"] * 1e-6) / 1e9 * bus_factor(c, 8))


SHARP_TWO_DGX = """
name: sharp2
hosts:
  - {template: dgx-h100, count: 2}
network:
  type: rail_optimized
  sharp: true
"""


def test_collnet_where_the_network_reduces(tmp_path):
    f = tmp_path / "sharp2.yaml"
    f.write_text(SHARP_TWO_DGX)
    t = topo.load(f)
    switches = [d for _, d in t.graph.nodes(data=True) if d["kind"] == "net_switch"]
    assert switches and all(d.get("sharp") is True for d in switches)
    assert nm.collnet_available(t, t.rank_gpus()) and "collnet" in nm.nccl_algos(t, t.rank_gpus())
    plain = topo.resolve("dgx-h100-x2")
    assert not nm.collnet_available(plain, plain.rank_gpus()) and "collnet" not in nm.nccl_algos(
        plain, plain.rank_gpus()
    )
    r = nm.nccl_predict(t, None, 1 << 30, "collnet")
    # CollNetDirect: 8 heads (NICs) x min(50 GB/s, 370.8 / 8), GPU/NIC factor 1, x 0.85 (Hopper), algBw x 0.5
    assert r["collnet"] == "direct" and r["proto"] == "Simple"
    assert r["model_algbw"] == pytest.approx(370.8 * 0.85 * 0.5)
    lat_nic = max(float(t.node(c).get("lat") or 0.0) for c in t.nics("h0"))
    assert r["lat_us"] == pytest.approx(2 * (3.7 + 7 * 0.4) + 31.0 + 2 * lat_nic)
    name, _ = simulate_nccl(t, 1 << 20)  # the simulator offers what it simulates: not CollNet
    assert name != "collnet"
    with pytest.raises(TreeError, match="CollNet needs several hosts"):
        nm.nccl_predict(plain, None, 8, "collnet")
    f.write_text(SHARP_TWO_DGX.replace("sharp: true", "sharp: maybe"))
    with pytest.raises(TopologyError, match="network.sharp: expected true or false, got .maybe."):
        topo.load(f)


def test_tuner_choice_simulates_what_nccls_tuner_picks():
    t = topo.resolve("dgx-h100-x2")
    for size in (1 << 16, 1 << 20):
        pick = nm.nccl_best(t, None, size)
        name, r = simulate_nccl(t, size, choose="tuner")
        assert name == pick["algo"]
        assert r.profile == {"LL": "nccl-ll", "LL128": "nccl-ll128", "Simple": "nccl-simple"}[pick["proto"]]
        assert r.time >= simulate_nccl(t, size)[1].time  # never faster than the fastest simulated
    with pytest.raises(CollectiveError, match="choose expected 'fastest' or 'tuner', got 'best'"):
        simulate_nccl(t, 8, choose="best")


def test_alltoall_model_uses_nvlink_across_the_hosts_of_one_nvlink_domain():
    t = topo.resolve("gb200-nvl72")  # 4-GPU trays, one NVLink domain
    gpus = t.rank_gpus()[:16]
    assert len({t.host_of(g) for g in gpus}) == 4
    r = nm.nccl_predict(t, gpus, 1 << 30, "p2p", collective="alltoall")
    # every peer over NVLink: busbw = algbw (n-1)/n -> the NVLink path bandwidth, less the latency
    bw = min(t.path(gpus[0], b).bw for b in gpus[1:])
    assert r["busbw"] == pytest.approx(bw, rel=0.02) and r["busbw"] < bw


def test_tree_chunks_per_channel_as_nccl_sizes_them():
    # enqueue.cc calcCollChunking: one buffer step per chunk (4 MiB / 8 Simple; LL 64 KiB / 2; LL128 614400 x 15/16)
    assert nm.PROTO_CHUNK_BYTES == {"LL": 32768, "LL128": 576000, "Simple": 524288}
    assert nm.tree_chunk(1 << 20, "Simple", 64, 8, 64) == 524288  # only LL128 shrinks
    # LL128, 2 nodes x 8: nsteps 1 + 1 + 0.8 = 2.8; a channel's 1 MiB is under 2.8 x 64 / 8 = 22.4 chunks of
    # 576000, 288000, 144000 (halved while > 128 KiB) -> 72000; 1 MiB / 72000 = 14 >= 2.8 x 16 / 8: stays
    assert nm.tree_chunk(16 << 20, "LL128", 16, 2, 16) == 72000
    # a big share keeps the full chunk: 64 MiB / 576000 = 116 chunks >= 22.4
    assert nm.tree_chunk(1 << 30, "LL128", 16, 2, 16) == 576000


def test_simulated_nccl_tree_pipelines_a_chunk_per_channel():
    t = topo.resolve("dgx-h100-x2")
    g = t.rank_gpus()
    # 2 hosts, 8 NICs: NCCL's graph has 18 channels (370.8 / 20.6), duplicated to 36, all running at 64 MiB
    slice_ = nm.tree_slice_bytes(t, g, 64 << 20, "Simple")
    assert slice_ == 36 * 524288
    k = -(-(64 << 20) // slice_)  # 4 steps of 36 chunks of 512 KiB
    from treecoll.collectives import builders
    from treecoll.collectives import compile as compile_
    from treecoll.collectives.sim.profiles import get_profile
    from treecoll.collectives.sim.simulator import NCCL_TREE_RUN, simulate

    tree = builders.build("two_level", t, nbytes=64 << 20, intra="chain")
    sched = compile_.compile_plan(tree, "allreduce", k, forward_lag=0)
    prof = nccl_hop_profile(get_profile("nccl-simple"), "tree").for_tree_allreduce()
    want = simulate(t, sched, 64 << 20, profile=prof, **NCCL_TREE_RUN).time
    got = simulate_algorithm(t, "two_level", 64 << 20, profile="nccl-simple", intra="chain")
    assert got.time == pytest.approx(want, rel=1e-12)


def test_nccl_hop_latencies_per_algorithm_and_one_rank_per_node():
    from treecoll.collectives.sim.profiles import get_profile
    from treecoll.topo.machines import MachineFlags, machine_topology, parse_nic

    # tuning.cc: a tree's hops (base 6.8, NVLink 0.6, PCI 1.0, NET 5.0 us with LL) differ from a ring's (NET 2.7)
    tree = nccl_hop_profile(get_profile("nccl-ll"), "tree")
    assert (tree.base_lat_us, tree.lat_floor_us) == (6.8, {"nvlink": 0.6, "pci": 1.0, "net": 5.0})
    assert nccl_hop_profile(get_profile("nccl-simple"), "ring") == get_profile("nccl-simple")
    calibrated = get_profile("nccl-ll").__class__("mine", 1.0, {"net": 1.0})
    assert nccl_hop_profile(calibrated, "tree") is calibrated  # a profile of one's own is used as it is
    # one GPU per node: the ring's two network hops (route 4.7 us) take the tree's 5.0 us, as NCCL models them
    t = machine_topology(MachineFlags(hosts=2, gpus_per_host=1, gpu="H100", nic=parse_nic("1x400G-ib")))[0]
    assert t.path(*t.rank_gpus()).lat == pytest.approx(4.7)
    # the simulation also writes each LL step into host memory first (net.cc sendProxyConnect): one copy over
    # the GPU's PCIe route into its CPU per network hop, NCCL's PCI hop with LL (8 bytes: no time to speak of)
    pci = max(t.path(t.rank_gpus()[0], "h0/cpu0").lat, nm.HW_LAT["PCI"]["ring"][nm.PROTOS.index("LL")]) * 1e-6
    r = simulate_ring(t, 8, profile="nccl-ll")
    assert r.time == pytest.approx(6.6e-6 + 2 * (5.0e-6 + pci), abs=5e-9)
    assert nm.nccl_predict(t, None, 8, algo="ring", proto="LL")["lat_us"] == pytest.approx(6.6 + 2 * 5.0)


@pytest.mark.parametrize("change", [False, True])
def test_nccl_model_asks_each_kind_of_host_once_and_answers_as_for_every_host(change):
    """Hosts built alike are asked about once (``_host_kinds``); the model's answers are those of a route
    table that searches every host on its own, also when one host differs (one GPU's NVLinks at half speed)."""
    import networkx as nx
    from treecoll.topo.routes import RouteTable

    t = topo.resolve("dgx-h100-x16")
    if change:
        g = nx.DiGraph(t.graph)
        gpu = "h3/gpu2"
        for n in [n for n in g.successors(gpu) if g.nodes[n]["kind"] == "nvswitch"]:
            g.edges[gpu, n]["bw"] = g.edges[n, gpu]["bw"] = g.edges[gpu, n]["bw"] / 2
        t = topo.Topology(g, name="dgx-h100-x16-changed")
    alone = topo.Topology(t.graph, name=t.name)
    vars(alone)["routes"] = RouteTable(alone.graph, alone.name, alike=False)
    gpus = t.rank_gpus()
    kinds = nm._host_kinds(t, nm._by_host(t, gpus))
    assert list(kinds) == (["h0", "h3"] if change else ["h0"])
    assert list(nm._host_kinds(alone, nm._by_host(alone, gpus))) == list(t.hosts())
    assert nm._inputs(t, gpus, None) == nm._inputs(alone, gpus, None)
    total = nm._inputs(t, gpus, None)[3]  # the slower NVLinks bound the ring bandwidth
    assert (total < nm._inputs(topo.resolve("dgx-h100-x16"), gpus, None)[3]) == change
    assert nm.ll128_enabled(t, gpus) == nm.ll128_enabled(alone, gpus)
    for size in (1 << 16, 1 << 26):
        for algo in ("ring", "tree", "nvls"):
            assert nm.nccl_predict(t, None, size, algo) == nm.nccl_predict(alone, None, size, algo)


def _machine(text: str):
    from treecoll.tools.machine_flags import parse_machine_flags
    from treecoll.topo.machines import machine_topology

    return machine_topology(parse_machine_flags(text), None)[0]


def test_a_ring_through_host_memory_runs_at_the_shm_factor_of_pcie():
    """4 RTX 5090 on their own PCIe Gen5 root ports of one socket (48 GB/s, topo.h): every ring hop goes
    GPU -> switch -> CPU -> switch -> GPU, through host memory (NCCL's SHM, path PHB beyond P2P level
    PXB); each GPU's hop crosses two root-complex links at 0.57 x 48 = 27.36 GB/s, one hop per link,
    so the ring's busbw tends to 27.36 GB/s. The ideal profile keeps the links as written: 48."""
    t = _machine("--hosts 1 --gpus-per-host 4 --gpu rtx5090")
    g = t.rank_gpus()
    hop = t.path(g[0], g[1]).nodes
    assert [tr.link_factor(t, a, b) for a, b in zip(hop, hop[1:])] == [1.0, tr.SHM_BW_FACTOR, tr.SHM_BW_FACTOR, 1.0]
    size = 1 << 30
    r = simulate_ring(t, size, profile="nccl-simple")
    assert r.busbw == pytest.approx(0.57 * 48.0, rel=2e-3)  # 6 steps of latency are < 0.1 % of 39 ms
    assert simulate_ring(t, size, profile="ideal").busbw == pytest.approx(48.0, rel=1e-3)  # link latencies only


def test_a_roce_nic_carries_two_channels_of_16_gb_s():
    """Two H200 hosts, one GPU each, one 400 Gb/s NIC (50 GB/s) beside it: the 2-rank ring allreduce
    moves each byte once per direction through the NIC (busbw = per-direction rate). RoCE: NCCL's 2
    channels per NIC at 16 GB/s each, 32 GB/s; InfiniBand: the 48 GB/s PCIe Gen5 link to the NIC bounds
    it below the NIC's 50. NVLSTree's kernels (profile nccl-nvls) are not held to the channel limit."""
    size = 8 << 30
    roce = _machine("--hosts 2 --gpus-per-host 1 --gpu H200 --nic 1x400G-roce")
    ib = _machine("--hosts 2 --gpus-per-host 1 --gpu H200 --nic 1x400G-ib")
    nic = roce.nics(roce.hosts()[0])[0]
    up = next(v for v in roce.graph[nic] if roce.graph.edges[nic, v]["kind"] == "net")
    assert tr.net_efficiency(roce.node(nic)) == 1.0
    assert tr.link_factor(roce, nic, up) == pytest.approx(2 * 16.0 / 50.0)
    assert tr.link_factor(roce, nic, up, None) == 1.0
    assert simulate_ring(roce, size, profile="nccl-simple").busbw == pytest.approx(32.0, rel=2e-3)
    assert simulate_ring(ib, size, profile="nccl-simple").busbw == pytest.approx(48.0, rel=2e-3)
    # NCCL's own tuner sees the line rates: its ring's bandwidth is the same on both fabrics
    assert nm.nccl_predict(roce, None, size)["model_algbw"] == nm.nccl_predict(ib, None, size)["model_algbw"]


def test_a_roce_nic_adds_its_latency_to_every_network_step():
    """NCCL's 2-rank ring allreduce with LL, one rank per host: base 6.6 us plus 2 network steps, each
    the tree's NET latency 5.0 us (ppn 1) plus the NIC's reported latency once (LL; tuning.cc): 16.6 us
    over InfiniBand (no reported latency), 16.6 + 2 x lat over RoCE (its fabric's lat per message)."""
    from treecoll.topo.machines import FABRICS

    roce = _machine("--hosts 2 --gpus-per-host 1 --gpu H200 --nic 1x400G-roce")
    ib = _machine("--hosts 2 --gpus-per-host 1 --gpu H200 --nic 1x400G-ib")
    assert FABRICS["roce"].lat > 0 and roce.node("h0/nic0")["lat"] == FABRICS["roce"].lat
    assert nm.nccl_predict(ib, None, 1024, proto="LL")["lat_us"] == pytest.approx(16.6)
    assert nm.nccl_predict(roce, None, 1024, proto="LL")["lat_us"] == pytest.approx(16.6 + 2 * FABRICS["roce"].lat)


def test_ll_across_hosts_stages_each_step_through_host_memory():
    """NCCL's net transport keeps LL's send buffer in host memory (net.cc sendProxyConnect) and sends a step
    once all of it is written (sendProxyProgress). Two H200 hosts, one GPU each, one 400G InfiniBand NIC on
    the GPU's PCIe switch: the 2-rank LL ring allgather of S moves S / 2 per rank, on NCCL's 4 channels
    (2 per NIC, doubled; enqueue.cc keeps them from 32 KiB on). The GPU writes one step of every channel
    (S / 8 each, at most 32 KiB) into host memory through the switch's root-complex link (48 GB/s x 0.57,
    x 0.5 for LL's 8 data bytes a line: w = 13.68 GB/s) before the NIC reads the data back through that
    link at the same rate: time = 6.6 us base + 5.0 us network hop (the tree's, one rank per host)
    + the PCIe route's latency of the write (NCCL's PCI hop with LL, tuning.cc hwLat)
    + 4 min(S / 8, 32 KiB) / w + (S / 2) / w."""
    ib = _machine("--hosts 2 --gpus-per-host 1 --gpu H200 --nic 1x400G-ib")
    w = 48e9 * tr.SHM_BW_FACTOR * 0.5
    g = ib.rank_gpus()
    pci = max(ib.path(g[0], "h0/cpu0").lat, nm.HW_LAT["PCI"]["ring"][nm.PROTOS.index("LL")]) * 1e-6
    for size in (1 << 16, 1 << 20):
        assert nm.ring_run(ib, ib.rank_gpus(), size, "LL")[1] == 4
        want = (6.6 + 5.0) * 1e-6 + pci + 4 * min(size / 8, 32768) / w + size / 2 / w
        assert simulate_ring(ib, size, collective="allgather", profile="nccl-ll").time == pytest.approx(want, rel=1e-9)
    # LL128 and Simple send from device memory (GPUDirect RDMA): the NIC reads the GPU through its switch
    simple = simulate_ring(ib, 1 << 20, collective="allgather", profile="nccl-simple")
    assert simple.time == pytest.approx((8.4 + 14.0) * 1e-6 + (1 << 19) / 48e9, rel=1e-9)
    # the staged route: from host memory to the NIC, its latency adding one step written by the GPU
    plain, staged = Network(ib, get_profile("nccl-ll")), Network(ib, get_profile("nccl-ll"), 32768.0)
    write = max(ib.path(g[0], "h0/cpu0").lat * 1e-6, get_profile("nccl-ll").step_lat("pci")) + 32768 / w
    assert staged.route(g[0], g[1]).lat - plain.route(g[0], g[1]).lat == pytest.approx(write, rel=1e-9)
    assert staged.route(g[0], g[1]).min_caps == pytest.approx((w,)) and plain.route(g[0], g[1]).min_caps == (24e9,)
    assert staged.host_staged(ib.path(g[0], g[1]).nodes) == (True, False)  # GPUDirect RDMA receives into the GPU
    assert staged_bytes(get_profile("nccl-simple"), 65536) == 65536 and staged_bytes(get_profile("ideal"), 1) == 0
    simple_nets = [Network(ib, get_profile("nccl-simple"), b) for b in (0.0, 32768.0)]  # device memory: nothing staged
    assert simple_nets[0].route(g[0], g[1]) == simple_nets[1].route(g[0], g[1])
    # a Grace CPU reaches its memory over NVLink-C2C: nothing to stage
    gb = topo.resolve("gb200-nvl72")
    assert tr.host_buffer(gb, gb.rank_gpus()[0]) is None
    assert Network(gb, get_profile("nccl-ll")).staged_seconds(gb.rank_gpus()[0], 32768) == 0.0


def test_without_gpudirect_rdma_every_protocol_stages_both_sides_through_host_memory():
    """Two H200 hosts, one GPU and one 400G InfiniBand NIC each; with --gpu-nic unaligned the NIC is on the
    CPU, beyond the GPUDirect RDMA level PXB (paths.cc ncclTopoCheckGdr), so NCCL's net transport keeps
    every protocol's buffers in host memory on both sides (net.cc sendProxyConnect, recvProxyConnect).
    The 2-rank Simple ring allgather of S moves S / 2 a rank in one step; unaligned, the sender first
    writes its S / 2 (4 channels of S / 8, under Simple's 512 KiB step) into host memory and the receiver
    reads them back, each over its GPU's PCIe route into the CPU (48 GB/s x SHM_BW_FACTOR, the route's
    latency NCCL's PCI hop with Simple, tuning.cc hwLat): exactly 2 x (PCI latency + (S / 2) / w) more
    than aligned, where the NIC reads and writes the GPU (its own link to the CPU at its rate: the network
    part is the same)."""
    base = "--hosts 2 --gpus-per-host 1 --gpu H200 --nic 1x400G-ib"
    aligned, unaligned = _machine(base), _machine(base + " --gpu-nic unaligned")
    g = unaligned.rank_gpus()
    assert unaligned.path(g[0], "h0/nic0").nccl == "PHB" and aligned.path(g[0], "h0/nic0").nccl == "PIX"
    assert not tr.gpu_direct(unaligned, g[0], "h0/nic0") and tr.gpu_direct(aligned, g[0], "h0/nic0")
    w = float(unaligned.link(g[0], "h0/pcisw0")["bw"]) * 1e9 * tr.SHM_BW_FACTOR
    pci = max(unaligned.path(g[0], "h0/cpu0").lat, nm.HW_LAT["PCI"]["ring"][nm.PROTOS.index("Simple")]) * 1e-6
    for size in (1 << 16, 1 << 20):
        a = simulate_ring(aligned, size, collective="allgather", profile="nccl-simple").time
        u = simulate_ring(unaligned, size, collective="allgather", profile="nccl-simple").time
        assert u - a == pytest.approx(2 * (pci + size / 2 / w), rel=1e-9)
    net = Network(unaligned, get_profile("nccl-simple"), 32768.0)
    assert net.host_staged(unaligned.path(g[0], g[1]).nodes) == (True, True)
    # the staged route runs from the sender's host memory to the receiver's
    ends = [net.ends[i] for i in net.route(g[0], g[1]).sub_lists[0]]
    assert ends[0][0] == "h0/cpu0" and ends[-1][1] == "h1/cpu0"


def test_gpudirect_tcpxo_runs_what_googles_nccl_environment_allows():
    """Google's NCCL environment for GPUDirect-TCPX(O) sets NCCL_PROTO=Simple, NCCL_ALGO=Ring,Tree and (TCPXO)
    NCCL_NVLS_ENABLE=0. Two H100 hosts, one GPU each: NCCL's tree allreduce of 1 KiB then runs Simple,
    base 8.4 us plus 2 network hops of the tree's Simple NET latency 14 us = 36.4 us, where over InfiniBand
    it runs LL, 6.8 + 2 x 5.0 = 16.8 us (tuning.cc). On 2 x 8 H100 the NVLSTree NCCL offers over InfiniBand
    is not offered over TCPXO; on one host (no network) nothing changes."""
    tcpxo = _machine("--hosts 2 --gpus-per-host 1 --gpu H100 --nic 1x200G-tcpxo")
    ib = _machine("--hosts 2 --gpus-per-host 1 --gpu H100 --nic 1x200G-ib")
    t, i = nm.nccl_predict(tcpxo, None, 1024, algo="tree"), nm.nccl_predict(ib, None, 1024, algo="tree")
    assert (t["proto"], t["lat_us"]) == ("Simple", pytest.approx(36.4))
    assert (i["proto"], i["lat_us"]) == ("LL", pytest.approx(16.8))
    assert nm.nccl_protocols(tcpxo, tcpxo.rank_gpus()) == ("Simple",)
    assert (
        simulate_algorithm(tcpxo, "ring", 1024).profile == "nccl-simple" != simulate_algorithm(ib, "ring", 1024).profile
    )
    big = _machine("--hosts 2 --gpu H100 --nic 8x200G-tcpxo")
    big_ib = _machine("--hosts 2 --gpu H100 --nic 8x400G-ib")
    assert nm.nccl_algos(big, big.rank_gpus()) == ("ring", "tree")
    assert "nvls" in nm.nccl_algos(big_ib, big_ib.rank_gpus())
    one = big.rank_gpus()[:8]
    assert nm.fabric_env(big, one) is None and "nvls" in nm.nccl_algos(big, one)
    assert nm.nccl_protocols(big, one) == ("LL", "LL128", "Simple")


def test_a_socket_nic_runs_at_its_fabric_efficiency():
    """Two L40S hosts, one GPU each, one 100 Gb/s interface (12.5 GB/s) on NCCL's socket transport: the
    2-rank ring's busbw tends to 0.65 x 12.5 = 8.125 GB/s (the PCIe path to the NIC is wider)."""
    t = _machine("--hosts 2 --gpus-per-host 1 --gpu L40S --nic 1x100G-socket")
    assert simulate_ring(t, 8 << 30, profile="nccl-simple").busbw == pytest.approx(0.65 * 12.5, rel=2e-3)


def test_ring_search_finds_nccls_channels_on_nvswitch_hosts():
    # search.cc, one host: from the fastest speed within a GPU's NVLink total, as many channels as fit;
    # slower speeds are kept only for a larger channels x speed; then the channels are doubled at half speed.
    # H100 (18 x 20.6 = 370.8): 6 x 60 = 360 (9 x 40 and 12 x 30 are no larger), doubled -> 12 x 30
    assert nm.ring_search_channels(370.8, 2) == (12, 30.0)
    # A100 (12 x 20 = 240): 6 x 40 reaches the total, doubled -> 12 x 20
    assert nm.ring_search_channels(240.0, 1) == (12, 20.0)
    # Hopper keeps channels of less than 50 GB/s undoubled beyond 4: 100 GB/s -> 2 x 50, doubled -> 4 x 25
    assert nm.ring_search_channels(100.0, 2) == (4, 25.0)
    # a speed under 25 GB/s is not doubled: 20 GB/s -> 1 x 20
    assert nm.ring_search_channels(20.0, 2) == (1, 20.0)
    # slower speeds win with a larger total: 100 GB/s on Ampere: 2 x 40 = 80, 3 x 30 = 90, 5 x 20 = 100 (the
    # total: the search stops), not doubled under 25 GB/s
    assert nm.ring_search_channels(100.0, 1) == (5, 20.0)


def test_p2p_channels_grow_with_the_message_as_nccl_splits_it():
    t = topo.resolve("dgx-h100")
    s = nm.p2p_setup(t, t.rank_gpus())
    # 24 channels (2 x 12 of the ring search) -> 32; a peer gets 2 per NVLink (36 -> 64 -> 32); an
    # operation starts on 32 / 8 ranks = 4 channels
    assert (s["channels"], s["per_peer"], s["min"], s["chunk"], s["nodes"]) == (32, 32, 4, 512 << 10, 1)
    # parts of 64 KiB (chunk / 8) up to 16 MiB (chunk x 32): a channel per 64 KiB up to 4, then doubled
    # while a part is over 16 MiB: 128 MiB -> 8 x 16 MiB, 256 MiB -> 16, 512 MiB -> 32, then 32 at most
    sizes = [64 << 10, 100 << 10, 1 << 20, 64 << 20, (64 << 20) + 1, 128 << 20, 256 << 20, 512 << 20, 4 << 30]
    assert [nm.p2p_channels(x, s) for x in sizes] == [1, 2, 4, 4, 8, 8, 16, 32, 32]
    assert nm.p2p_protocol(16 << 10, 1) == "LL" and nm.p2p_protocol((16 << 10) + 1, 1) == "Simple"


def test_p2p_across_hosts_takes_network_channels():
    t = topo.resolve("dgx-h100-x2")
    s = nm.p2p_setup(t, t.rank_gpus())
    # a 400 Gb/s NIC (50 GB/s) takes ceil(50 / 14) = 4 channels per peer (paths.cc); parts of 64 KiB to 128 KiB
    assert s["nodes"] == 2 and s["chunk"] == 128 << 10 and s["per_peer"] == 4
    # one part of 64 KiB on one channel; a large operation on every channel of the peer
    assert [nm.p2p_channels(x, s) for x in (64 << 10, 1 << 30)] == [1, 4]


def test_sendrecv_runs_at_its_channels_rate_on_nvlink():
    t = topo.resolve("dgx-h100")
    S = 64 << 20
    r = simulate_algorithm(t, "p2p", S, collective="sendrecv")
    # 4 channels of one NVLink each (20.6 GB/s): 82.4 GB/s, far under the 370.8 GB/s path
    assert r.profile == "nccl-simple"
    assert S / (4 * 20.6e9) <= r.time <= S / (4 * 20.6e9) + 30e-6
    # 512 MiB runs on 32 channels: the path bounds it
    big = simulate_algorithm(t, "p2p", 512 << 20, collective="sendrecv")
    assert S * 8 / (32 * 20.6e9) < S * 8 / (370.8e9) <= big.time
    # the ideal profile (no NCCL channels) is not held to them
    assert simulate_algorithm(t, "p2p", S, collective="sendrecv", profile="ideal").time < S / 300e9


def test_p2p_runs_ll_or_simple_as_nccl_chooses():
    t = topo.resolve("dgx-h100")
    # 16 KiB on 1 channel: LL (<= 1 x 16 KiB); 32 KiB on 1 channel: Simple; never LL128
    assert simulate_algorithm(t, "p2p", 16 << 10, collective="sendrecv").profile == "nccl-ll"
    assert simulate_algorithm(t, "p2p", 32 << 10, collective="sendrecv").profile == "nccl-simple"
    # alltoall: one operation is a rank's share per peer (8 ranks: 1 MiB / 8 = 128 KiB on 2 channels: Simple)
    assert simulate_algorithm(t, "p2p", 1 << 20, collective="alltoall").profile == "nccl-simple"
    assert simulate_algorithm(t, "p2p", 64 << 10, collective="alltoall").profile == "nccl-ll"


def test_p2p_model_takes_the_same_channels():
    t = topo.resolve("dgx-h100")
    S = 64 << 20
    r = nm.nccl_predict(t, None, S, "p2p", collective="sendrecv")
    # Simple latency (ring base 8.4 + NVLink hop 3.4 us) plus 64 MiB over 4 channels of 20.6 GB/s
    assert r["time_us"] == pytest.approx(8.4 + 3.4 + S / (4 * 20.6e3))
    sim = simulate_algorithm(t, "p2p", S, collective="sendrecv")
    assert sim.time == pytest.approx(r["time"], rel=0.05)
