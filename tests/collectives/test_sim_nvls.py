"""NVLS / NVLSTree: the simulator (collectives.sim.nvls) and NCCL's model of it (collectives.sim.nccl_model)."""

from __future__ import annotations

import pytest
from treecoll.collectives.sim import nccl_model as nm
from treecoll.collectives.sim.nvls import simulate_nvls
from treecoll.collectives.sim.simulator import simulate_algorithm
from treecoll.topo import yaml_io
from treecoll.topo.errors import CollectiveError, TopologyError, TreeError

from tests.collectives.sim_helpers import ring_topology, star_topology

GIB = 1 << 30


def _two_boxes(multicast: str = "") -> str:
    """2 hosts x 4 GPUs on one NVSwitch (2 links x 25 GB/s each), one 50 GB/s NIC per GPU, no latencies."""
    return f"""
name: two-boxes
templates:
  box:
    gpus: {{count: 4, sm: 90, mem_bw: 3000.0}}
    nvswitch: {{count: 1, links: 2, link_bw: 25.0, lat: 0.0{multicast}}}
    cpus: [{{numa: 0}}]
    pcie: {{bw: 64.0, lat: 0.0, switches: [{{cpu: 0, gpus: [0, 1, 2, 3], nics: [0, 1, 2, 3]}}]}}
    nics: {{count: 4, bw: 50.0}}
hosts: [{{template: box, count: 2}}]
network: {{type: rail_optimized}}
"""


@pytest.mark.parametrize("n", [2, 4, 8])
def test_one_domain_ideal_is_lat_plus_s_times_n_plus_1_over_n_over_b(n):
    topo = star_topology(n, bw=100.0, lat=1.5)
    for size in (8, 1 << 20, 3 * GIB):
        r = simulate_nvls(topo, size, profile="ideal")
        assert r.time == pytest.approx(3e-6 + size * (n + 1) / n / 100e9, rel=1e-12)
        assert r.algorithm == "nvls" and r.peak_scratch == (0.0,) * n
        up = sum(v for k, v in r.link_bytes.items() if k.endswith("->h/sw"))
        down = sum(v for k, v in r.link_bytes.items() if k.startswith("h/sw->"))
        assert up == down == pytest.approx(n * size * (n + 1) / n, rel=1e-9)


def test_nccl_profile_applies_the_switch_efficiency_and_nccl_latency():
    h100 = yaml_io.resolve("dgx-h100")  # 18 NVLinks x 20.6 GB/s per GPU over 4 switches
    r = simulate_nvls(h100, GIB)
    b = 18 * 20.6e9 * 0.85  # nvlsEfficiency, Hopper
    # pipeline fill: 16 channels x 8 heads x 128 KiB chunks = 16 MiB loops, 2 stages: one loop of 64
    assert r.time == pytest.approx(25e-6 + GIB * 9 / 8 / b * (1 + 1 / 64), rel=1e-9)
    assert r.profile == "nccl-nvls" and r.kind_bytes == {"nvlink": pytest.approx(8 * 2 * GIB * 9 / 8, rel=1e-9)}
    b200 = yaml_io.resolve("hgx-b200")  # Blackwell: 0.74; 24 channels, 1 GiB < 64 x 192 x 128 KiB: 64 KiB chunks
    drain = GIB * 9 / 8 / (18 * 40.1e9 * 0.74)
    assert simulate_nvls(b200, GIB).time == pytest.approx(25e-6 + drain * (1 + 24 * 8 * 65536 / GIB), rel=1e-9)
    # through simulate_algorithm, with NCCL's auto protocol choice (NVLS: Simple only)
    assert simulate_algorithm(h100, "nvls", GIB).time == r.time


def test_nvls_tree_across_two_hosts_moves_one_shard_each_way_per_nic():
    topo = yaml_io.loads(_two_boxes(), source="<two-boxes>")
    size = GIB
    r = simulate_nvls(topo, size, profile="ideal")
    assert r.algorithm == "nvls_tree" and r.stats["domains"] == 2 and r.stats["tree_height"] == 1
    # double binary tree of 2 domains: half of shard i up one tree and down the other, both ways
    nic_out = [v for k, v in r.link_bytes.items() if k.startswith("h0/nic") and "->h0/" not in k]
    assert len(nic_out) == 4 and all(v == pytest.approx(size / 4) for v in nic_out)
    # NVLink carries S (n+1)/n each way per GPU; the bottleneck is the 50 GB/s NVLink bond
    assert r.kind_bytes["nvlink"] == pytest.approx(8 * 2 * size * 5 / 4, rel=1e-9)
    assert r.time == pytest.approx(size * 5 / 4 / 50e9, rel=1e-3)


def test_nvls_tree_nccl_cap_and_nccl_model_agree_on_two_dgx_h100():
    topo = yaml_io.resolve("dgx-h100-x2")
    big = 16 * GIB
    r = simulate_nvls(topo, big)
    cap_busbw = 8 * 57.7  # perChMaxNVLSTreeBws Hopper, 2 nodes, 8 channels
    assert r.busbw == pytest.approx(cap_busbw, rel=0.01) and r.busbw <= cap_busbw
    m = nm.nccl_predict(topo, None, big, "nvls")
    assert m["algo"] == "nvls_tree" and m["proto"] == "Simple" and m["nchannels"] == 8
    assert m["model_algbw"] == pytest.approx(8 * 57.7 * 16 / 30)
    assert m["lat_us"] == pytest.approx(25.0 + 2 * 20.9)
    assert m["time"] == pytest.approx(r.time, rel=0.01)


def test_nccl_model_nvls_one_node_from_the_search_speeds():
    h100 = yaml_io.resolve("dgx-h100")
    m = nm.nccl_predict(h100, None, GIB, "nvls")
    # bwIntra: largest sm90 search speed with 9 x speed <= 370.8 GB/s -> 40; busBw = 8 x 40 x 0.85 x 7/8 x 2
    assert m["model_algbw"] == pytest.approx(8 * 40 * 0.85 * 7 / 8 * 2 * 8 / 14)
    assert m["lat_us"] == 25.0 and m["nnodes"] == 1
    b200 = nm.nccl_predict(yaml_io.resolve("hgx-b200"), None, GIB, "nvls")
    assert b200["model_algbw"] == pytest.approx(8 * 80 * 0.74 * 7 / 8 * 2 * 8 / 14)  # 721.8 / 9 -> 80
    assert nm.nccl_algos(h100, h100.rank_gpus()) == ("ring", "tree", "nvls")
    with pytest.raises(TreeError, match="Simple protocol only"):
        nm.nccl_predict(h100, None, GIB, "nvls", "LL")


def test_nvl72_is_one_nvls_domain():
    nvl = yaml_io.resolve("gb200-nvl72")
    doms = nm.nvls_domains(nvl, nvl.rank_gpus())
    assert [len(d) for d in doms] == [72]
    assert nm.nccl_predict(nvl, None, GIB, "nvls")["nchannels"] == 32  # NCCL_MAX_NVLS_ARITY


def test_where_nvls_cannot_run_the_error_says_why():
    a100 = yaml_io.resolve("dgx-a100")
    with pytest.raises(CollectiveError, match=r"compute capability 9.0 or later on every GPU, got sm 80"):
        simulate_nvls(a100, GIB)
    assert nm.nccl_algos(a100, a100.rank_gpus()) == ("ring", "tree")
    with pytest.raises(CollectiveError, match=r"has no NVSwitch"):
        simulate_algorithm(ring_topology(4), "nvls", GIB)
    no_mc = yaml_io.loads(_two_boxes(", multicast: false"), source="<no-mc>")
    with pytest.raises(CollectiveError, match=r"multicast: false"):
        simulate_nvls(no_mc, GIB)
    h100 = yaml_io.resolve("dgx-h100")
    with pytest.raises(CollectiveError, match=r"Simple protocol only, got profile 'nccl-ll'"):
        simulate_nvls(h100, GIB, profile="nccl-ll")
    with pytest.raises(CollectiveError, match=r"allreduce only, got collective 'allgather'"):
        simulate_algorithm(h100, "nvls", GIB, collective="allgather")
    with pytest.raises(CollectiveError, match=r"at least 2 GPUs per NVLink domain"):
        simulate_nvls(h100, GIB, ranks=["h0/gpu0"])


def test_multicast_key_in_yaml():
    topo = yaml_io.loads(_two_boxes(", multicast: false"), source="<no-mc>")
    assert topo.node("h0/nvswitch0")["multicast"] is False
    again = yaml_io.loads(yaml_io.dumps(topo), source="<again>")
    assert again.node("h1/nvswitch0")["multicast"] is False
    with pytest.raises(TopologyError, match=r"templates.box.nvswitch.multicast: expected true or false, got 1"):
        yaml_io.loads(_two_boxes(", multicast: 1"), source="<bad>")


def test_nvls_run_follows_nccls_channel_and_chunk_tuning():
    from treecoll.topo.machines import MachineFlags, machine_topology, parse_nic

    def run(name=None, **flags):
        t = yaml_io.resolve(name) if name else machine_topology(MachineFlags(**flags))[0]
        return nm.nvls_run(t, t.rank_gpus())

    # nvls.cc: Hopper 16 channels and 128 KiB chunks; NVLSTree's largest chunk the chunk below 4 nodes
    assert run("dgx-h100") == {"channels": 16, "chunk": 128 << 10, "tree_max_chunk": 128 << 10, "heads": 8, "nodes": 1}
    assert run("dgx-h100-x16")["tree_max_chunk"] == 64 << 10  # 16 nodes: 64 KiB
    assert run("hgx-b200")["channels"] == 24  # NVLS_NCHANNELS_SM100_NVL
    # ncclNvlsTreeSm100Tuning: 2 nodes, 400G NICs (50 GB/s >= 48) behind PCIe switches, 8 per node: 32 channels, 64 KiB
    b200x2 = run(hosts=2, gpus_per_host=8, gpu="B200", nic=parse_nic("8x400G-ib"))
    assert b200x2 == {"channels": 32, "chunk": 128 << 10, "tree_max_chunk": 64 << 10, "heads": 8, "nodes": 2}


def test_nvls_chunk_and_pipeline_fill_by_hand():
    one = {"channels": 16, "chunk": 128 << 10, "tree_max_chunk": 128 << 10, "heads": 8, "nodes": 1}
    ops = 16 * 8
    # enqueue.cc calcCollChunking, NVLS: 64 KiB below 64 ops chunks, 32 KiB below 8 ops, 16 KiB below 2 ops
    assert nm.nvls_chunk(64 * ops * (128 << 10), one) == 128 << 10
    assert nm.nvls_chunk(64 * ops * (128 << 10) - 1, one) == 64 << 10
    assert nm.nvls_chunk(8 * ops * (64 << 10) - 1, one) == 32 << 10
    assert nm.nvls_chunk(2 * ops * (32 << 10) - 1, one) == 16 << 10
    # NVLSTree (tree chunk 64 KiB): 32 KiB below one ops chunk
    tree = dict(one, nodes=2, tree_max_chunk=64 << 10)
    assert nm.nvls_chunk(1 << 30, tree) == 64 << 10 and nm.nvls_chunk(ops * (64 << 10) - 1, tree) == 32 << 10
    # fill: (stages - 1) loops of channels x heads x chunk, at most (stages - 1) drains
    assert nm.nvls_fill(1 << 30, one) == pytest.approx(ops * (128 << 10) / (1 << 30))  # 2 stages, 64 loops
    assert nm.nvls_fill(1 << 30, tree) == pytest.approx(2 * ops * (64 << 10) / (1 << 30))  # 3 stages
    assert nm.nvls_fill(1 << 10, tree) == 2.0 and nm.nvls_fill(0, tree) == 0.0


def test_nvls_tree_time_on_two_dgx_h100_is_latency_drain_and_two_loops_of_fill():
    t = yaml_io.resolve("dgx-h100-x2")
    size = 64 << 20  # 16 channels x 8 heads x 128 KiB: 16 MiB loops, 4 of them; 3 stages: 2 loops of fill
    r = simulate_nvls(t, size)
    model = nm.nccl_predict(t, None, size, algo="nvls")
    drain = r.time - r.stats["pipeline_fill_s"] - (model["lat_us"] * 1e-6)
    assert r.stats["pipeline_fill_s"] == pytest.approx(drain * 2 / 4, rel=1e-9)
    # the NCCL model's run time adds the same fill to its own drain
    m_drain = model["time_us"] - model["lat_us"]
    assert model["run_time_us"] == pytest.approx(model["time_us"] + m_drain / 2, rel=1e-9)


def test_nvls_domains_are_kept_per_topology_and_ranks_and_each_caller_gets_its_own_lists():
    from treecoll.collectives import in_network

    t = yaml_io.resolve("dgx-h100-x2")
    gpus = t.rank_gpus()
    first = in_network.nvls_domains(t, gpus)
    assert first == [list(gpus[:8]), list(gpus[8:])]
    first[0].clear()  # the caller's copy: the kept answer is untouched
    assert in_network.nvls_domains(t, gpus) == [list(gpus[:8]), list(gpus[8:])]
    odd = gpus[:3] + gpus[8:11] + gpus[11:12]  # 3 GPUs on one host, 4 on the other
    for _ in range(2):  # the kept refusal is raised again, the same message
        with pytest.raises(TreeError, match=r"different GPU counts \[3, 4\]"):
            in_network.nvls_domains(t, odd)
    other = yaml_io.resolve("dgx-h100-x2")  # another object: asked again, the same answer
    assert in_network.nvls_domains(other, other.rank_gpus()) == [list(gpus[:8]), list(gpus[8:])]
