"""Cost model (alpha-beta with link sharing) and the NCCL-parity predictor."""

from __future__ import annotations

import math

import networkx as nx
import pytest
from treecoll.collectives import MultiTree, Tree, build
from treecoll.collectives.cost import CostModel, p2p_time, reduce_time, uniform_topology
from treecoll.collectives.sim.nccl_model import ll128_enabled, nccl_predict
from treecoll.topo import Topology
from treecoll.topo.errors import TreeError

from tests.helpers import SHIPPED, shipped


def _pcie_pair_topology():
    """Two GPUs behind one PCIe switch (12 GB/s, 0.5 us per link), mem_bw 1000 GB/s."""
    g = nx.DiGraph()
    g.add_node("h/pcisw0", kind="pcie_switch", host="h")
    for i in range(3):
        g.add_node(f"h/gpu{i}", kind="gpu", host="h", index=i, mem_bw=1000.0)
        for a, b in ((f"h/gpu{i}", "h/pcisw0"), ("h/pcisw0", f"h/gpu{i}")):
            g.add_edge(a, b, kind="pcie", bw=12.0, lat=0.5, count=1)
    return Topology(g, name="pcie3")


def test_point_to_point_is_alpha_beta_on_the_path():
    t = _pcie_pair_topology()
    p = t.path("h/gpu0", "h/gpu1")
    assert p2p_time(t, "h/gpu0", "h/gpu1", 12e6) == pytest.approx(p.lat * 1e-6 + 12e6 / (p.bw * 1e9))
    cm = CostModel(t)
    assert cm.p2p(0, 1, 12e6) == pytest.approx(1e-6 + 1e-3)
    assert reduce_time(1000.0, 1e9) == pytest.approx(3e-3)
    assert cm.reduce_cost(0, 1e9) == pytest.approx(3e-3)


def test_link_sharing_divides_bandwidth():
    cm = CostModel(_pcie_pair_topology())
    alone = cm.rates([(1, 0)])[(1, 0)]
    both = cm.rates([(1, 0), (2, 0)])  # share the switch -> gpu0 link
    assert alone == pytest.approx(12e9)
    assert both[(1, 0)] == pytest.approx(6e9) and both[(2, 0)] == pytest.approx(6e9)
    assert cm.rates([(1, 0), (0, 2)])[(1, 0)] == pytest.approx(12e9)  # other directions do not share


def test_nvswitch_parallel_routes_share_per_link():
    t = shipped("dgx-h100")
    cm = CostModel(t)
    p = cm.path(1, 0)
    assert len(p.routes) == 4 and cm.rates([(1, 0)])[(1, 0)] == pytest.approx(p.bw * 1e9)
    fan_in = cm.rates([(i, 0) for i in range(1, 8)])
    assert fan_in[(1, 0)] == pytest.approx(p.bw * 1e9 / 7)


def test_tree_time_formulas():
    """The executor's schedule on three GPUs of one PCIe switch (12 GB/s, 0.5 us per link,
    mem_bw 1000 GB/s), in closed form."""
    cm = CostModel(_pcie_pair_topology(), msg_overhead=0.0)
    chain = Tree.from_parents([-1, 0, 1])
    n = 1e6
    hop = cm.p2p(1, 0, n)
    red = cm.reduce_cost(0, n)
    assert cm.tree_time(chain, n, "reduce") == pytest.approx(2 * (hop + red))
    assert cm.tree_time(chain, n, "broadcast") == pytest.approx(2 * hop)
    # pipelining: K chunks -> first chunk's path + (K - 1) bottleneck stages; in steady state a rank
    # receives the next chunk while it reduces this one (posted ahead), so a stage is the longer of the
    # two, the latency overlapping the previous chunk's transfer on the pair's connection
    k = 10
    m = n / k
    first = cm.p2p(1, 0, m) + cm.reduce_cost(0, m)
    stage = max(m / (cm.path(1, 0).bw * 1e9), cm.reduce_cost(0, m))
    assert cm.tree_time(chain, n, "reduce", k) == pytest.approx(2 * first + (k - 1) * stage)
    # a message costs its rank o: the leaf's send, the middle rank's receive (posted at once, in
    # parallel with the leaf's send) and send, the root's receive
    o = 1e-5
    cmo = CostModel(_pcie_pair_topology(), msg_overhead=o)
    assert cmo.tree_time(chain, 8, "reduce") == pytest.approx(2 * (o + cm.p2p(1, 0, 8) + cm.reduce_cost(0, 8)))
    assert cm.tree_time(chain, 64e6, "allreduce", 32) < cm.tree_time(chain, 64e6, "allreduce", 1)
    with pytest.raises(TreeError, match="collective expected one of"):
        cm.tree_time(chain, n, "scatter")
    with pytest.raises(TreeError, match="tree has 2 ranks, the model 3"):
        cm.tree_time(Tree.from_parents([-1, 0]), n)


def test_multitree_halves_the_bytes_per_tree():
    cm = CostModel(nranks=4, msg_overhead=0.0)
    m = build("double_binary", nranks=4)
    one = cm.tree_time(m.trees[0], 32e6, "reduce", 8)
    both = cm.tree_time(MultiTree((m.trees[0], m.trees[0].relabel([1, 0, 3, 2]))), 32e6, "reduce", 8)
    assert both < one
    assert cm.best_nchunks(m, 8)[0] == 1


def _lb_gpus(t):
    """The GPUs a lower-bound test uses: every GPU, or the first hosts up to 32 GPUs."""
    gpus = t.rank_gpus()
    if len(gpus) > 32:
        hosts = []
        for g in gpus:
            if t.host_of(g) not in hosts:
                hosts.append(t.host_of(g))
        keep = set(hosts[: max(2, 32 // (len(gpus) // len(hosts)))])
        gpus = tuple(g for g in gpus if t.host_of(g) in keep)
    return gpus


@pytest.mark.parametrize("name", SHIPPED)
def test_lower_bound_holds_for_every_algorithm_shown(name):
    """``tree build`` prints the lower bound next to the builders' predictions and NCCL's
    (ring, tree, nvls): it must bound every one of them, at every size."""
    from treecoll.collectives.sim.nccl_model import nccl_algos

    t = shipped(name)
    gpus = _lb_gpus(t)
    cm = CostModel(t, gpus)
    plans = [build(b, t, gpus) for b in ("chain", "binomial", "kary:3", "star", "double_binary")]
    two_hosts = len({t.host_of(g) for g in gpus}) > 1
    try:
        nccl = nccl_algos(t, gpus)
        nccl_predict(t, gpus, 8, "ring")
    except TreeError:  # CPU rank slots: no NCCL
        nccl = ()
    for nbytes in (8, 64 << 10, 4 << 20, 1 << 30):
        lb = cm.lower_bound(nbytes)
        assert lb > 0
        shown = {f"nccl {a}": nccl_predict(t, gpus, nbytes, a)["time"] for a in nccl}
        shown.update({p.name: cm.best_nchunks(p, nbytes)[1] for p in plans})
        shown["two_level"] = cm.best_nchunks(build("two_level", t, gpus, nbytes=nbytes), nbytes)[1]
        if two_hosts:
            shown["two_level rails"] = cm.best_nchunks(build("two_level", t, gpus, nbytes=nbytes, rails=True), nbytes)[
                1
            ]
        shown["ring"], shown["rsag"] = cm.ring_time(nbytes), cm.rsag_time(nbytes)
        below = {k: v for k, v in shown.items() if v < lb}
        assert not below, (nbytes, lb, below)


def _port(t) -> float:
    """GB/s of the slowest GPU's links, the smaller direction."""
    g = t.graph
    return min(
        min(sum(d["bw"] for _, _, d in g.out_edges(x, data=True)), sum(d["bw"] for _, _, d in g.in_edges(x, data=True)))
        for x in t.rank_gpus()
    )


def test_lower_bound_per_gpu_volume_with_and_without_in_network_reduction():
    """Point to point: 2 (P-1)/P n through a GPU's links; NVLS (the NVSwitches reduce): n."""
    n = 1 << 30
    for name, nvls in (("dgx-h100", True), ("hgx-b200", True), ("dgx-a100", False), ("pcie-8gpu", False)):
        t = shipped(name)
        cm = CostModel(t)
        assert cm.in_network_reduction() is nvls
        vol = n if nvls else 2 * 7 / 8 * n
        assert cm.lower_bound(n) == pytest.approx(vol / (_port(t) * 1e9), rel=1e-12), name
    # two hosts: each host's n bytes leave through its 8 NICs (their network links), n bytes arrive
    t = shipped("dgx-h100-x2")
    nics = sum(t.node(x)["bw"] for x in t.nics("h0"))
    assert nics == 8 * 50.0
    assert CostModel(t).lower_bound(n) == pytest.approx(max(n / (nics * 1e9), n / (_port(t) * 1e9)), rel=1e-12)


def test_uniform_topology_defaults():
    t = uniform_topology(4)
    assert len(t.rank_gpus()) == 4 and t.path(t.rank_gpus()[0], t.rank_gpus()[1]).bw == 12.0
    with pytest.raises(TreeError, match="nranks expected >= 1"):
        uniform_topology(0)


# ---------------------------------------------------------------------- NCCL model
def _switch_host(nodes: int, gpus: int, sm: int = 90, nic_lat: float = 0.0):
    """``nodes`` hosts of ``gpus`` H100s on NVSwitch (one link bw 20.6), one 50 GB/s NIC per GPU
    (``nic_lat``: the NIC's transport latency in µs, omitted when 0)."""
    g = nx.DiGraph()

    def bi(a, b, **d):
        g.add_edge(a, b, **d)
        g.add_edge(b, a, **d)

    g.add_node("leaf0", kind="net_switch", tier=0)
    for h in range(nodes):
        sw = f"h{h}/nvswitch0"
        g.add_node(sw, kind="nvswitch", host=f"h{h}")
        for i in range(gpus):
            gid = f"h{h}/gpu{i}"
            g.add_node(gid, kind="gpu", host=f"h{h}", index=i, sm=sm, mem_bw=3350.0)
            bi(gid, sw, kind="nvlink", bw=18 * 20.6, lat=0.3, count=18)
            nic = f"h{h}/nic{i}"
            g.add_node(nic, kind="nic", host=f"h{h}", bw=50.0, **({"lat": nic_lat} if nic_lat else {}))
            bi(gid, nic, kind="pcie", bw=48.0, lat=0.5, count=1)
            bi(nic, "leaf0", kind="net", bw=50.0, lat=1.0, count=1)
    return Topology(g, name=f"{nodes}x{gpus}")


def test_nccl_latencies_match_the_reference_examples():
    """NCCL's latency model (tuning.cc baseLat + hwLat per step) worked out by hand for 8 GPUs on
    one NVSwitch host and 16 such hosts (latencyInter 0)."""
    one = _switch_host(1, 8)
    lat = {
        (a, p): nccl_predict(one, None, 8, a, p)["lat_us"] for a in ("ring", "tree") for p in ("LL", "LL128", "Simple")
    }
    assert lat[("ring", "LL")] == pytest.approx(15.0) and lat[("ring", "LL128")] == pytest.approx(40.6)
    assert lat[("ring", "Simple")] == pytest.approx(56.0)
    assert lat[("tree", "LL")] == pytest.approx(15.2) and lat[("tree", "LL128")] == pytest.approx(31.5)
    assert lat[("tree", "Simple")] == pytest.approx(64.4)
    big = _switch_host(16, 8)
    assert nccl_predict(big, None, 8, "ring", "LL")["lat_us"] == pytest.approx(311.6)
    assert nccl_predict(big, None, 8, "ring", "Simple")["lat_us"] == pytest.approx(1190.0)
    assert nccl_predict(big, None, 8, "tree", "LL")["lat_us"] == pytest.approx(55.2)
    assert nccl_predict(big, None, 8, "tree", "Simple")["lat_us"] == pytest.approx(176.4)


@pytest.mark.parametrize("algo, inter_steps", [("ring", 2 * (4 - 1)), ("tree", 2 * 2)])
def test_nccl_model_adds_the_nics_latency_per_inter_node_step(algo, inter_steps):
    """NCCL adds the net plugin's latency (a NIC's ``lat``) to every inter-node step, twice
    with Simple (the flush): ring allreduce 2 (nNodes - 1) steps, tree 2 log2(nNodes)."""
    plain, efa = _switch_host(4, 8), _switch_host(4, 8, nic_lat=75.0)
    for proto, times in (("LL", 1), ("LL128", 1), ("Simple", 2)):
        d = nccl_predict(efa, None, 8, algo, proto)["lat_us"] - nccl_predict(plain, None, 8, algo, proto)["lat_us"]
        assert d == pytest.approx(inter_steps * times * 75.0)
    one = _switch_host(1, 8, nic_lat=75.0)  # one host: no network step, no plugin latency
    assert nccl_predict(one, None, 8, algo)["lat_us"] == nccl_predict(_switch_host(1, 8), None, 8, algo)["lat_us"]


def test_ll128_only_where_nccl_enables_it():
    """NCCL 2.30 enables LL128 by default only over NVLink inside hosts, PCIe-switch-close NICs
    across hosts and one compute capability (tuning.cc); a PCIe-only box gets LL and Simple."""
    from treecoll.collectives.sim.simulator import _profiles

    nv, pcie = _switch_host(2, 8), _pcie_pair_topology()
    assert ll128_enabled(nv, nv.rank_gpus()) and not ll128_enabled(pcie, pcie.rank_gpus())
    assert not ll128_enabled(_switch_host(1, 4, sm=60), _switch_host(1, 4, sm=60).rank_gpus())
    mixed = _switch_host(1, 2, sm=80)
    g = mixed.graph.copy()
    g.nodes["h0/gpu1"]["sm"] = 86
    assert not ll128_enabled(Topology(g), ["h0/gpu0", "h0/gpu1"])
    names = [p.name for p in _profiles("auto", 1 << 20, pcie, pcie.rank_gpus())]
    assert names == ["nccl-ll", "nccl-simple"]
    assert [p.name for p in _profiles("auto", 1 << 20, nv, nv.rank_gpus())] == ["nccl-ll", "nccl-ll128", "nccl-simple"]
    for size in (8, 1 << 16, 1 << 20, 1 << 24, 1 << 30):
        assert nccl_predict(pcie, None, size, "ring")["proto"] != "LL128"
    assert nccl_predict(nv, None, 1 << 22, "ring")["proto"] == "LL128"  # enabled, and the fastest here


def test_nccl_protocol_choice_and_bandwidth():
    t = _switch_host(1, 8)
    small, large = nccl_predict(t, None, 8, "ring"), nccl_predict(t, None, 1 << 30, "ring")
    assert small["proto"] == "LL" and large["proto"] == "Simple"
    # ring Simple: busBw = nChannels * bw = 18 x 20.6; algBw = busBw * n / (2 (n-1))
    assert large["nchannels"] == 18
    assert large["model_algbw"] == pytest.approx(18 * 20.6 * 8 / 14)
    assert large["busbw"] == pytest.approx(large["algbw"] * 14 / 8)
    assert large["time_us"] == pytest.approx(large["lat_us"] + (1 << 30) / (1000 * large["model_algbw"]))
    tree = nccl_predict(t, None, 1 << 30, "tree", "Simple")
    # tree Simple: min(busBw * 0.92, nCh * perChMaxTreeBw[Hopper][N1] = 38.7) * 0.5; no correction from
    # log2(size / 64) = 24 on (tuning.cc applies treeCorrectionFactor for logSize < 23), 0.9 at 256 MiB (22)
    assert tree["model_algbw"] == pytest.approx(min(18 * 20.6 * 0.92, 18 * 38.7) * 0.5)
    tree22 = nccl_predict(t, None, 1 << 28, "tree", "Simple")
    assert tree22["model_algbw"] == pytest.approx(min(18 * 20.6 * 0.92, 18 * 38.7) * 0.5 * 0.9)
    assert set(small["protocols"]) == {"LL", "LL128", "Simple"}
    with pytest.raises(TreeError, match=r"algo for allreduce expected one of \[.*'collnet'\], got 'bogus'"):
        nccl_predict(t, None, 8, "bogus")
    with pytest.raises(TreeError, match="proto expected one of"):
        nccl_predict(t, None, 8, "ring", "LL64")


@pytest.mark.parametrize("name, links, link_bw", [("dgx-h100", 18, 20.6), ("dgx-a100", 12, 20.0)])
def test_nccl_model_on_shipped_topologies(name, links, link_bw):
    """Ring Simple on one NVSwitch host of 8 GPUs, 64 MiB, by NCCL's formulas: one channel per NVLink
    (SM90 20.6 GB/s, SM80 20.0 GB/s each, topo.h), busBw = nCh x bw, algBw = busBw x 8 / 14,
    latency baseLat 8.4 + 14 steps x 3.4 us (NVLink Simple), time = lat + bytes / (1000 algBw) us."""
    r = nccl_predict(shipped(name), None, 1 << 26, "ring", "Simple")
    algbw = links * link_bw * 8 / 14
    assert r["nchannels"] == links and r["lat_us"] == pytest.approx(8.4 + 14 * 3.4)
    assert r["time_us"] == pytest.approx(8.4 + 14 * 3.4 + (1 << 26) / (1000 * algbw), rel=1e-12)


def test_nccl_model_is_finite_on_other_shipped_topologies():
    for name in ("pcie-8gpu", "dgx-h100-x2", "gb200-nvl72"):
        r = nccl_predict(shipped(name), None, 1 << 26, "ring")
        assert math.isfinite(r["time"]) and r["time"] > 0 and r["busbw"] > 0
    with pytest.raises(
        TreeError,
        match=r"nccl model: rank slot 'h0/gpu0' is a CPU process \(model 'cpu-process'\); "
        r"NCCL and its tuning model apply to NVIDIA GPUs only",
    ):
        nccl_predict(shipped("cpu-local"), None, 8, "ring")
