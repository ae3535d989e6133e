"""sysfs reader on synthetic trees (root is a parameter)."""

import pytest
from treecoll.topo import sysfs

from tests.topo.topo_fakes import build_sysfs, load


@pytest.fixture
def h100(tmp_path):
    return str(build_sysfs(tmp_path, load("dgx-h100")["sysfs"]))


def test_switch_chain_and_host_bridge(h100):
    d = sysfs.read_pci(h100, "0000:1b:00.0")
    # pci0000:15 / 15:01.0 (root port) / 16:00.0 (upstream) / 17:01.0 (downstream) / 1b:00.0
    assert d.switches == ("0000:16:00.0",) and d.root_port == "0000:15:01.0" and d.host_bridge == "0000:15"
    assert (d.cls, d.numa, d.bw, d.downtrained) == (0x030200, 0, 48.0, False)
    assert sysfs.read_pci(h100, "0000:ff:00.0") is None


def test_two_level_switches_nearest_first(tmp_path):
    root = build_sysfs(tmp_path, load("dgx-a100")["sysfs"])
    d = sysfs.read_pci(root, "0000:07:00.0")
    assert d.switches == ("0000:04:00.0", "0000:02:00.0") and d.numa == 3


def test_downtrained_and_numa_minus_one(tmp_path):
    root = build_sysfs(tmp_path, load("h200-vm")["sysfs"])
    d = sysfs.read_pci(root, "0000:0a:00.0")
    assert d.downtrained and d.numa is None and d.switches == () and d.bw == 48.0


def test_nics_ports_rates_and_netdev_folding(h100):
    nics = sysfs.nics(h100)
    assert [n.name for n in nics][:2] == ["mlx5_0", "mlx5_10"]
    n0 = next(n for n in nics if n.name == "mlx5_0")
    assert (n0.kind, n0.pci, n0.port, n0.rate, n0.link_layer, n0.netdev) == (
        "ib",
        "0000:18:00.0",
        1,
        400.0,
        "InfiniBand",
        "ibp24s0",
    )
    assert not [n for n in nics if n.kind == "net"]  # ibp* netdevs folded into their verbs devices


def test_ethernet_virtio_and_virtual_interfaces(tmp_path):
    spec = {
        "pci": [{"path": ["pci0000:00", "0000:00:03.0"], "class": "0x020000", "numa": -1}],
        "net": [{"name": "eth0", "pci": "0000:00:03.0", "speed": 25000}, {"name": "docker0"}],
    }
    root = build_sysfs(tmp_path, spec)
    (root / "sys/class/net/lo").mkdir()
    nics = sysfs.nics(root)
    assert [(n.name, n.kind, n.pci, n.rate) for n in nics] == [("eth0", "net", "0000:00:03.0", 25.0)]


def test_numa_nodes_and_cpulists(h100, tmp_path):
    assert sysfs.numa_nodes(h100) == {0: "0-55,112-167", 1: "56-111,168-223"}
    assert sysfs.numa_nodes(tmp_path / "nothing") == {} and sysfs.pci_devices(tmp_path / "nothing") == {}
    assert sysfs.parse_cpulist("0-2,7,9-10") == [0, 1, 2, 7, 9, 10] and sysfs.parse_cpulist("x") == []


@pytest.mark.parametrize(
    "speed, width, bw",
    [
        ("2.5 GT/s", 1, 0.1875),
        ("8 GT/s", 16, 12.0),
        ("16.0 GT/s PCIe", 8, 12.0),
        ("64.0 GT/s PCIe", 16, 96.0),
        ("Unknown", 16, 12.0),
    ],
)
def test_pcie_bw_is_nccls(speed, width, bw):
    assert sysfs.pcie_bw(speed, width) == bw
