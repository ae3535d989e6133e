"""Model queries on every shipped topology (tests/topo/_shipped.py loads each once)."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
from treecoll.topo import TopologyError

from tests.helpers import SHIPPED, shipped
from treecoll import topo

EXPECTED = {  # name: (hosts, GPUs per host, NICs per host)
    "cpu-local": (2, 2, 1),
    "dgx-a100": (1, 8, 12),
    "dgx-h100": (1, 8, 8),
    "dgx-h100-x2": (2, 8, 8),
    "dgx-h100-x16": (16, 8, 8),
    "dgx-h100-x1024": (1024, 8, 8),
    "gb200-nvl72": (18, 4, 4),
    "hgx-b200": (1, 8, 8),
    "pcie-8gpu": (1, 8, 0),
}


def test_every_shipped_file_is_listed():
    assert sorted(EXPECTED) == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_queries_on_shipped(name):
    t = shipped(name)
    hosts, per_host, nics = EXPECTED[name]
    assert len(t.hosts()) == hosts
    assert set(t.gpus_per_host().values()) == {per_host}
    assert len(t.gpus()) == hosts * per_host == len(t.rank_gpus())
    assert all(len(t.nics(h)) == nics for h in t.hosts()[:4])
    for r, g in enumerate(t.rank_gpus()[:16]):
        assert t.gpu_of_rank(r) == g and t.node(g)["kind"] == "gpu"
        assert t.host_of(g) == t.node(g)["host"]
    h0 = t.hosts()[0]
    gpus = t.gpus(h0)
    for a, b in itertools.combinations(gpus, 2):
        p, q = t.path(a, b), t.path(b, a)
        assert p.nodes[0] == a and p.nodes[-1] == b and p.hops == len(p.kinds) >= 1
        assert p.bw > 0 and p.lat >= 0
        assert (p.nccl, p.smi, p.bw) == (q.nccl, q.smi, q.bw)
        assert p.smi in ("PIX", "PXB", "PHB", "NODE", "SYS") or p.smi.startswith("NV")
    for g in gpus:
        nic = t.nearest_nic(g)
        assert (nic is None) == (nics == 0)
        if nic:
            assert t.host_of(nic) == h0
    if hosts > 1:
        last = t.hosts()[-1]
        p = t.path(t.gpus(h0)[0], t.gpus(last)[0])
        # NVL72 trays share one NVLink domain (18 NVLinks per GPU); elsewhere hosts meet over the network,
        # where nvidia-smi (one host's view) has no code
        assert (p.nccl, p.smi) == (("NVL", "NV18") if name == "gb200-nvl72" else ("NET", None))
        assert sum(len(g) for g in t.leaf_groups()) == hosts


def test_leaf_groups_of_clusters():
    assert shipped("dgx-h100-x16").leaf_groups() == (tuple(f"h{i}" for i in range(16)),)
    groups = shipped("dgx-h100-x1024").leaf_groups()
    assert len(groups) == 32 and {len(g) for g in groups} == {32}
    assert shipped("dgx-h100-x1024").leaves_of("h33") == tuple(sorted(f"rail{r}/leaf1" for r in range(8)))


def test_topology_is_immutable_and_ranks_remap():
    t = shipped("cpu-local")
    with pytest.raises(nx.NetworkXError, match="Frozen graph can't be modified"):
        t.graph.add_node("x")
    with pytest.raises(TypeError):
        t.node("h0/gpu0")["index"] = 5
    u = t.with_ranks(["h1/gpu1", "h1/gpu0", "h0/gpu1", "h0/gpu0"])
    assert u.rank_gpus() == ("h1/gpu1", "h1/gpu0", "h0/gpu1", "h0/gpu0") and u != t
    assert t.rank_gpus()[0] == "h0/gpu0"
    with pytest.raises(TopologyError, match=r"rank 9: expected an integer in 0\.\.3"):
        t.gpu_of_rank(9)
    with pytest.raises(TopologyError, match=r"node 'h7/gpu0': not in topology 'cpu-local'"):
        t.node("h7/gpu0")


def test_equality_ignores_meta_but_not_attributes():
    t = shipped("dgx-h100")
    d = t.to_dict()
    d["meta"] = {"note": "x"}
    assert topo.Topology.from_dict(d) == t
    d["links"][0]["bw"] = d["links"][0]["bw"] * 2
    assert topo.Topology.from_dict(d) != t
