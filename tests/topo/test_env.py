"""Environment hints: valid values parse, invalid ones name the variable."""

import pytest
from treecoll.topo.env import EFFECTS, expand_hostlist, hints, hints_report

from treecoll import topo


def test_empty_environment():
    h = hints({})
    assert h.p2p_level is None and h.launcher is None and h.nodelist is None and not h.ib_disable


@pytest.mark.parametrize(
    "env, field, value",
    [
        ({"NCCL_P2P_LEVEL": "nvl"}, "p2p_level", "NVL"),
        ({"NCCL_P2P_LEVEL": "2"}, "p2p_level", "PXB"),  # legacy integers: 0 LOC 1 PIX 2 PXB 3 PHB 4 SYS
        ({"NCCL_P2P_LEVEL": "7"}, "p2p_level", "SYS"),  # > 4 means SYS
        ({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}, "p2p_level", "LOC"),
        ({"NCCL_NET_GDR_LEVEL": "PHB"}, "net_gdr_level", "PHB"),
        ({"NCCL_SHM_DISABLE": "1"}, "shm_disable", True),
        ({"NCCL_IB_DISABLE": "0"}, "ib_disable", False),
        ({"NCCL_CROSS_NIC": "0"}, "cross_nic", 0),
        ({"NCCL_HOSTID": "node-a"}, "host_id", "node-a"),
        ({"NCCL_HOSTID": "node-a", "TREECOLL_HOST_ID": "fake"}, "host_id", "fake"),
        ({"CUDA_VISIBLE_DEVICES": "2, GPU-8932f937"}, "cuda_visible_devices", ("2", "GPU-8932f937")),
        ({"CUDA_VISIBLE_DEVICES": ""}, "cuda_visible_devices", ()),
        ({"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, "cuda_device_order", "PCI_BUS_ID"),
        ({"NCCL_TOPO_FILE": "/x.xml"}, "topo_file", "/x.xml"),
        ({"SLURM_JOB_NODELIST": "gnode[10,20,25-26]"}, "nodelist", ("gnode10", "gnode20", "gnode25", "gnode26")),
        (
            {
                "SLURM_TOPOLOGY_ADDR": "root_switch.CELL1.iswi1r4s0c1l1.belenos386",
                "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.switch.node",
            },
            "topology_addr",
            ("root_switch", "CELL1", "iswi1r4s0c1l1"),
        ),
        ({"SLURM_TOPOLOGY_ADDR": "traverse"}, "topology_addr", ()),
    ],
)
def test_valid_values(env, field, value):
    assert getattr(hints(env), field) == value


def test_ib_hca_syntax():
    f = hints({"NCCL_IB_HCA": "mlx5_1:1,mlx5_2"}).ib_hca
    assert f.selects("mlx5_1", 1) and f.selects("mlx5_10", 1) and not f.selects("mlx5_1", 2) and f.selects("mlx5_2", 2)
    assert not f.selects("mlx5_3", 1)
    ex = hints({"NCCL_IB_HCA": "^=mlx5_1"}).ib_hca
    assert ex.exclude and ex.exact and not ex.selects("mlx5_1") and ex.selects("mlx5_10")
    rails = hints({"NCCL_IB_HCA": "=mlx5_0:1:0:0,mlx5_1:1:0:1"}).ib_hca  # NCCL 2.30 rail/plane fields
    assert rails.entries == (("mlx5_0", 1), ("mlx5_1", 1)) and rails.rail_of("mlx5_1") == 0
    assert rails.rail_of("mlx5_2") is None
    s = hints({"NCCL_SOCKET_IFNAME": "^docker,lo"}).socket_ifname
    assert not s.selects("docker0") and s.selects("eth0")


def test_launchers():
    t = hints({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1"})
    assert (t.launcher, t.rank, t.world_size, t.local_rank, t.local_world_size, t.node_rank) == (
        "torchrun",
        5,
        8,
        1,
        4,
        1,
    )
    s = hints(
        {
            "SLURM_PROCID": "3",
            "SLURM_NTASKS": "4",
            "SLURM_LOCALID": "1",
            "SLURM_NODEID": "1",
            "SLURM_NTASKS_PER_NODE": "2",
        }
    )
    assert (s.launcher, s.rank, s.world_size, s.local_rank, s.local_world_size, s.node_rank) == ("slurm", 3, 4, 1, 2, 1)
    o = hints(
        {
            "OMPI_COMM_WORLD_RANK": "0",
            "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        }
    )
    assert (o.launcher, o.world_size, o.local_world_size) == ("openmpi", 2, 2)
    both = hints({"RANK": "1", "SLURM_PROCID": "7"})
    assert both.launcher == "torchrun" and both.rank == 1  # torchrun's variables win inside an srun step


@pytest.mark.parametrize(
    "env, msg",
    [
        ({"NCCL_P2P_LEVEL": "FAST"}, r"NCCL_P2P_LEVEL='FAST': expected one of LOC, NVL, PIX, PXB, PHB, SYS"),
        ({"NCCL_NET_GDR_LEVEL": "-1"}, r"NCCL_NET_GDR_LEVEL='-1': expected one of"),
        ({"NCCL_P2P_DISABLE": "yes"}, r"NCCL_P2P_DISABLE='yes': expected 0 or 1"),
        ({"NCCL_CROSS_NIC": "3"}, r"NCCL_CROSS_NIC='3': expected an integer 0..2"),
        ({"NCCL_IB_HCA": "mlx5_0:x"}, r"NCCL_IB_HCA='mlx5_0:x': port of 'mlx5_0' expected a positive integer"),
        ({"NCCL_IB_HCA": "mlx5_0,,mlx5_1"}, r"NCCL_IB_HCA=.*empty entry"),
        ({"NCCL_IB_HCA": "mlx5_0:1:a"}, r"rail/plane of 'mlx5_0' expected an integer"),
        ({"NCCL_SOCKET_IFNAME": "eth0:1"}, r"NCCL_SOCKET_IFNAME='eth0:1': expected interface names without ':port'"),
        ({"CUDA_DEVICE_ORDER": "SLOWEST"}, r"CUDA_DEVICE_ORDER='SLOWEST': expected PCI_BUS_ID or FASTEST_FIRST"),
        ({"RANK": "-1"}, r"RANK='-1': expected an integer >= 0"),
        ({"WORLD_SIZE": "0", "RANK": "0"}, r"WORLD_SIZE='0': expected an integer >= 1"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, r"rank=4: expected less than world_size=4"),
        ({"SLURM_PROCID": "two"}, r"SLURM_PROCID='two': expected an integer"),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "x"}, r"OMPI_COMM_WORLD_LOCAL_SIZE='x'"),
        ({"SLURM_JOB_NODELIST": "a[1-3"}, r"SLURM_JOB_NODELIST='a\[1-3': expected balanced brackets"),
        ({"SLURM_JOB_NODELIST": "a[3-1]"}, r"range '3-1' expected N or N-M with N <= M"),
        ({"SLURM_TOPOLOGY_ADDR": "a..b"}, r"SLURM_TOPOLOGY_ADDR='a..b': expected dot-separated names"),
        (
            {"SLURM_TOPOLOGY_ADDR": "a.b", "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node"},
            r"SLURM_TOPOLOGY_ADDR_PATTERN=.*expected 2 parts",
        ),
    ],
)
def test_invalid_values_name_the_variable(env, msg):
    with pytest.raises(topo.TopologyError, match=msg):
        hints(env)


def test_hostlist_expansion():
    assert expand_hostlist("n[001-003]") == ("n001", "n002", "n003")
    assert expand_hostlist("r[1-2]-n[1,3],login") == ("r1-n1", "r1-n3", "r2-n1", "r2-n3", "login")
    assert expand_hostlist("single") == ("single",)


def test_hints_report_lists_set_variables_with_effects():
    r = hints_report({"NCCL_P2P_LEVEL": "PIX", "SLURM_PROCID": "0", "PATH": "/bin"})
    assert [x["variable"] for x in r["set"]] == ["NCCL_P2P_LEVEL", "SLURM_PROCID"]
    assert r["set"][0]["effect"] == EFFECTS["NCCL_P2P_LEVEL"] and "host memory" in r["set"][0]["effect"]
    assert r["parsed"]["p2p_level"] == "PIX" and "NCCL_IB_HCA" in r["unset"]
    assert all(EFFECTS[k] for k in EFFECTS)
    r = hints_report({"TREECOLL_MAX_NODES": "2000000"})
    assert r["set"] == [{"variable": "TREECOLL_MAX_NODES", "value": "2000000", "effect": EFFECTS["TREECOLL_MAX_NODES"]}]
    with pytest.raises(topo.TopologyError, match=r"^TREECOLL_MAX_LINKS='-5': expected a positive integer, got -5$"):
        hints_report({"TREECOLL_MAX_LINKS": "-5"})


def test_transport_and_gdr_follow_the_levels():
    from treecoll.topo.env import gdr, transport

    t = topo.load(__import__("pathlib").Path(__file__).resolve().parents[2] / "topologies" / "dgx-a100.yaml")
    same_top = t.path("h0/gpu0", "h0/gpu1")  # PXB on PCIe, but NVLink wins
    assert transport(same_top.nccl) == "p2p"
    classes = {"PIX": "p2p", "PXB": "p2p", "PHB": "shm", "SYS": "shm", "NET": "net"}
    assert {c: transport(c) for c in classes} == classes
    assert transport("SYS", amd_two_gpus=True) == "p2p"
    assert transport("PIX", hints({"NCCL_P2P_DISABLE": "1"})) == "shm"
    assert transport("NVL", hints({"NCCL_P2P_LEVEL": "LOC"})) == "shm"
    assert transport("PHB", hints({"NCCL_P2P_LEVEL": "PHB"})) == "p2p"
    assert transport("PHB", hints({"NCCL_SHM_DISABLE": "1"})) == "net"
    nic = t.path("h0/gpu0", t.nearest_nic("h0/gpu0"))
    assert nic.nccl == "PXB" and gdr(nic.nccl) and not gdr(nic.nccl, hints({"NCCL_NET_GDR_LEVEL": "PIX"}))
    assert not gdr("SYS") and not gdr("P2C", c2c=False) and not gdr("PIX", hints({"NCCL_NET_GDR_LEVEL": "LOC"}))
