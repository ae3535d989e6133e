"""Paths on the shipped topologies against the real `nvidia-smi topo -m` outputs (tests/fixtures/smi)."""

from __future__ import annotations

import pytest

from tests.helpers import FIXTURES, shipped

SMI = FIXTURES / "smi"


def _fixture(name: str) -> dict:
    p = SMI / name
    from treecoll.topo.smi import parse_smi

    return parse_smi(p.read_text(), where=str(p))


def _ours(t, host="h0"):
    """Our matrix keyed like the fixture: GPU<i> and NIC names (mlx5_*) or NIC<k>."""
    g = t.graph
    ends = {}
    for n in t.gpus(host):
        ends[f"GPU{g.nodes[n]['index']}"] = n
    for k, n in enumerate(t.nics(host)):
        ends[g.nodes[n].get("name", f"NIC{k}")] = n
        ends[f"NIC{k}"] = n
    return ends


def _compare(t, fx, rows, cols):
    ends = _ours(t)
    names = fx["names"]  # NICk -> mlx5_k when the fixture has a NIC legend
    diff = []
    for a in rows:
        for b in cols:
            want = fx["codes"][(a, b)]
            got = t.path(ends[names.get(a, a)], ends[names.get(b, b)]).smi
            if got != want:
                diff.append((a, b, want, got))
    return diff


@pytest.mark.parametrize(
    "topology,fixture,with_nics",
    [
        ("dgx-a100", "dgx-a100.txt", True),
        ("dgx-h100", "h100-sxm-8.txt", False),
        ("hgx-b200", "b200-8-gke-a4.txt", True),
        ("pcie-8gpu", "rtx3090-8-pcie-xeon-e5v4.txt", False),
    ],
)
def test_matrix_equals_the_real_nvidia_smi_output(topology, fixture, with_nics):
    t, fx = shipped(topology), _fixture(fixture)
    gpus = fx["gpus"]
    assert len(gpus) == len(t.gpus("h0"))
    assert _compare(t, fx, gpus, gpus) == []
    if with_nics:
        nics = fx["nics"]
        assert len(nics) == len(t.nics("h0"))
        assert _compare(t, fx, gpus, nics) == []
        assert _compare(t, fx, nics, nics) == []


@pytest.mark.parametrize(
    "topology,fixture",
    [
        ("dgx-a100", "dgx-a100.txt"),
        ("dgx-h100", "h100-sxm-8.txt"),
        ("pcie-8gpu", "rtx3090-8-pcie-xeon-e5v4.txt"),
        ("hgx-b200", "b200-8-gke-a4.txt"),
    ],
)
def test_numa_affinity_matches_the_fixture(topology, fixture):
    t, fx = shipped(topology), _fixture(fixture)
    ends = _ours(t)
    got = {gpu: t.node(ends[gpu])["numa"] for gpu in fx["gpus"]}
    assert got == fx["numa_affinity"]


def test_dgx_h100_nvlink_split_and_own_nic():
    t = shipped("dgx-h100")
    counts = sorted(t.link("h0/gpu0", s)["count"] for s in t.nodes("nvswitch"))
    assert counts == [4, 4, 5, 5]
    for g in t.gpus():
        nic = t.nearest_nic(g)
        assert t.node(nic)["rail"] == t.node(g)["index"]
        assert t.path(g, nic).smi == "PIX"
    p = t.path("h0/gpu0", "h0/gpu7")
    assert p.bw == pytest.approx(18 * 20.6) and len(p.routes) == 4
    assert sum(s for _, s in p.routes) == pytest.approx(1.0)


def test_nearest_nic_spreads_ties_like_nccl():
    # DGX A100: GPU0 and GPU1 are both PXB to mlx5_0 and mlx5_1; NCCL gives each GPU its own
    t = shipped("dgx-a100")
    names = [t.node(t.nearest_nic(g))["name"] for g in t.gpus()]
    assert names == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]


def test_cross_host_paths_on_the_rail_optimized_cluster():
    t = shipped("dgx-h100-x16")
    same_rail = t.path("h0/gpu3", "h15/gpu3")
    assert same_rail.nccl == "NET" and same_rail.smi is None
    assert [n for n in same_rail.nodes if "leaf" in n or "spine" in n] == ["rail3/leaf0"]
    cross = t.path("h0/gpu3", "h15/gpu4")
    sw = [n for n in cross.nodes if "leaf" in n or "spine" in n]
    assert sw[0] == "rail3/leaf0" and sw[1].startswith("spine") and sw[2] == "rail4/leaf0"
    assert cross.hops == same_rail.hops + 2
    assert cross.lat > same_rail.lat
    # symmetric class and bandwidth
    back = t.path("h15/gpu4", "h0/gpu3")
    assert (back.nccl, back.bw, back.hops) == (cross.nccl, cross.bw, cross.hops)


def test_gb200_nvl72_one_nvlink_domain():
    t = shipped("gb200-nvl72")
    assert len(t.hosts()) == 18 and len(t.gpus()) == 72
    p = t.path("tray0/gpu0", "tray17/gpu3")
    assert (p.nccl, p.smi) == ("NVL", "NV18") and len(p.routes) == 18
    assert p.bw == pytest.approx(18 * 40.1)
    assert t.link("tray0/gpu1", "tray0/cpu0")["kind"] == "c2c"
    nic = t.path("tray0/gpu1", "tray0/nic0")  # C2C to Grace, then PCIe: NCCL P2C, nvidia-smi SYS (as a real tray)
    assert (nic.nccl, nic.smi, nic.kinds) == ("P2C", "SYS", ("c2c", "pcie"))


def test_cpu_local_is_four_rank_slots_with_a_slow_network():
    t = shipped("cpu-local")
    assert t.rank_gpus() == ("h0/gpu0", "h0/gpu1", "h1/gpu0", "h1/gpu1")
    intra, inter = t.path("h0/gpu0", "h0/gpu1"), t.path("h0/gpu1", "h1/gpu0")
    assert intra.nccl == "PHB" and inter.nccl == "NET"
    assert inter.bw < intra.bw


@pytest.mark.parametrize(
    "network,hosts",
    [
        ("{type: torus, dims: [4, 2, 2]}", 16),
        ("{type: fat_tree, leaf_size: 3, oversubscription: 2, spines: 2}", 6),
        ("{type: rail_optimized, su_hosts: 2, spines: 3}", 6),
    ],
)
def test_network_routes_are_shortest_and_deterministic(network, hosts):
    import networkx as nx

    from tests.helpers import edit
    from treecoll import topo

    text = edit("count: 2}", f"count: {hosts}}}").replace("{type: single_switch}", network)
    t, again = topo.loads(text), topo.loads(text)
    g = t.graph
    net = g.subgraph([n for n, d in g.nodes(data=True) if d["kind"] == "net_switch"])
    used = set()
    for a in t.nics():
        for b in t.nics():
            if t.host_of(a) == t.host_of(b):
                continue
            p = t.path(a, b)
            assert p.nodes == again.path(a, b).nodes
            sw_a = [s for s in g.successors(a) if s in net]
            sw_b = [s for s in g.successors(b) if s in net]
            shortest = min(nx.shortest_path_length(net, x, y) for x in sw_a for y in sw_b) + 2
            assert p.hops == shortest and all(k == "net" for k in p.kinds)
            used.update(p.nodes[1:-1])
    assert len(used) > 1  # equal-cost choices are spread, not all on one switch


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100", "hgx-b200", "pcie-8gpu", "gb200-nvl72", "dgx-h100-x2"])
def test_one_search_per_gpu_gives_the_one_target_routes(name):
    """nearest_nic fills the PCIe route table with one BFS per GPU; every route must equal
    the one-target search (nodes, kinds, classes, bandwidth, latency)."""
    t = shipped(name)
    fresh = shipped(name)
    for gpu in t.gpus():
        host = t.host_of(gpu)
        targets = t.nics(host) + t.nodes(kind="cpu", host=host)
        t.routes._pci_routes_from(gpu, targets)
        for nic in targets:
            assert t.routes._pci[(gpu, nic)] == fresh.routes._pci_search(gpu, nic)
