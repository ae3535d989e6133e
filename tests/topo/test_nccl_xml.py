"""NCCL topology XML import/export round trips on the real vendor files; NCCL graph XML."""

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from treecoll.topo.nccl_xml import cpulist_to_mask, export_xml, import_xml, mask_to_cpulist, parse_graph_xml
from treecoll.topo.smi import import_smi, smi_matrix

from treecoll import topo

FIX = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "nccl-topo"
FILES = sorted(FIX.glob("*-topo.xml"))


@pytest.mark.parametrize("f", FILES, ids=lambda p: p.name)
def test_every_file_imports_and_round_trips(f):
    t = import_xml(f, require_gpus=False)  # aws-g5-48xl lists only PCIe bridges
    text = export_xml(t)
    t2 = import_xml(text, require_gpus=False)
    assert t2 == t  # import -> export -> import is the identity
    assert export_xml(t2) == text  # and the export is stable
    if t.gpus():
        assert topo.loads(topo.dumps(t)) == t  # the YAML form keeps the preserved attributes too
    else:  # a partial vendor file (PCIe bridges only) has no ranks: the YAML form refuses it
        with pytest.raises(topo.TopologyError, match=r"expected at least one node of kind gpu, got none"):
            topo.loads(topo.dumps(t))
    src = ET.parse(f).getroot()
    out = ET.fromstring(text)

    # every attribute of every cpu/pci element of the source comes back (busids normalised to lower case)
    def attrs(root):
        return sorted(
            (e.tag, tuple(sorted((k, v.lower() if k == "busid" else v) for k, v in e.attrib.items())))
            for e in root.iter()
            if e.tag in ("cpu", "pci", "gpu", "net", "nvlink")
        )

    assert attrs(out) == attrs(src)


def test_an_exported_topology_keeps_its_nic_numbers():
    """A topology whose NICs are not in bus id order (nvidia-smi's DGX A100: mlx5_4 and mlx5_5 are nic8 and
    nic9) comes back from its NCCL XML with every NIC under its number and name: the export writes the number
    as the <net dev> (NCCL's net device index) and the import numbers NICs by it, so the matrix (and its NIC
    legend) is the same."""
    t = import_smi(FIX.parent / "smi" / "dgx-a100.txt")
    names = {n: t.node(n)["name"] for n in t.nics()}
    assert names["host0/nic8"] == "mlx5_4"
    back = import_xml(export_xml(t))
    assert {n: back.node(n)["name"] for n in back.nics()} == names
    assert smi_matrix(back) == smi_matrix(t)


def _codes(t):
    ids, m = smi_matrix(t)
    return {(a, b): m[i][j] for i, a in enumerate(ids) for j, b in enumerate(ids)}


@pytest.mark.parametrize("name", ["aws-p4d-24xl-topo.xml", "aws-p4de-24xl-topo.xml"])
def test_p4d_matrix(name):
    t = import_xml(FIX / name, host="p4d")
    c = _codes(t)
    gpu = {t.node(n)["pci"]: n for n in t.gpus()}
    nic = {t.node(n)["pci"]: n for n in t.nics()}
    g0, g1, g2, g4 = gpu["0000:10:1c.0"], gpu["0000:10:1d.0"], gpu["0000:20:1c.0"], gpu["0000:90:1c.0"]
    assert c[g0, g1] == "PIX" and c[g0, nic["0000:10:1b.0"]] == "PIX"  # one switch: 2 GPUs + 1 EFA
    assert c[g0, g2] == "PHB" and c[g0, nic["0000:20:1b.0"]] == "PHB"  # other switch, same socket
    assert c[g0, g4] == "SYS" and c[g0, nic["0000:90:1b.0"]] == "SYS"  # other socket
    assert t.path(g0, g4).bw == 10.0  # SKL_QPI_BW: Intel family 6 model 85
    assert t.node("p4d/cpu0")["affinity"] == "0-23,48-71"


@pytest.mark.parametrize(
    ("name", "model", "mem_gb"),
    [("aws-p4d-24xl-topo.xml", "A100-SXM4-40GB", 40.0), ("aws-p4de-24xl-topo.xml", "A100-SXM4-80GB", 80.0)],
)
def test_a_gpus_memory_comes_from_its_pci_device_id(name, model, mem_gb):
    """NCCL's XML names a GPU only by its PCI device id (0x20b0, 0x20b2 on these AWS files): the model, and
    from the model's machine template its memory capacity, which the decode model checks fits."""
    from treecoll.attention.cost import mem_capacity

    t = import_xml(FIX / name, host="p4d")
    assert {(t.node(g)["model"], t.node(g)["mem_gb"]) for g in t.gpus()} == {(model, mem_gb)}
    assert mem_capacity(t, t.rank_gpus()) == (mem_gb * 1e9, model)


def test_azure_files_matrices():
    nd4 = import_xml(FIX / "azure-ndv4-topo.xml")
    c = _codes(nd4)
    g = {nd4.node(n)["pci"]: n for n in nd4.gpus()}
    assert c[g["0003:00:00.0"], g["0004:00:00.0"]] == "PIX" and c[g["0003:00:00.0"], g["0001:00:00.0"]] == "SYS"
    assert nd4.path(g["0003:00:00.0"], g["0001:00:00.0"]).bw == 16.0  # AMD_BW
    nd5 = import_xml(FIX / "azure-ndv5-topo.xml")
    g5 = {nd5.node(n)["pci"]: n for n in nd5.gpus()}
    p = nd5.path(g5["0001:00:00.0"], g5["0002:00:00.0"])
    assert (p.smi, p.nccl, p.bw) == ("PHB", "PHB", 48.0)  # Gen5 x16; one virtual switch per GPU
    assert nd5.path(g5["0001:00:00.0"], g5["0009:00:00.0"]).bw == 22.0  # SRP_QPI_BW (model 143)
    nd2 = import_xml(FIX / "azure-ndv2-topo.xml")
    assert len(nd2.gpus()) == 8 and _codes(nd2)[nd2.gpus()[0], nd2.gpus()[1]] == "PHB"
    nc4 = import_xml(FIX / "azure-ncv4-topo.xml")
    assert [nc4.node(n)["index"] for n in nc4.gpus()] == [0, 1, 2, 3] and nc4.node(nc4.nics()[0])["name"] == "eth0"
    assert nc4.node(nc4.nics()[0])["bw"] == 12.5  # speed 100000 Mb/s / 8000
    assert not nc4.links("nvlink")  # NVLink "to itself" is preserved but not modelled
    g5xl = import_xml(FIX / "aws-g5-48xl-topo.xml", require_gpus=False)
    assert g5xl.gpus() == () and len(g5xl.nodes("pcie_switch")) == 9  # partial: bare bridges only
    with pytest.raises(topo.TopologyError, match=r"aws-g5-48xl-topo\.xml: expected at least one GPU .*got none"):
        import_xml(FIX / "aws-g5-48xl-topo.xml")  # an import without GPUs gives no ranks: refused by default


FULL = """<system version="1">
  <cpu numaid="0" host_hash="0x1" affinity="0000ffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:16:00.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16" foo="bar">
      <pci busid="0000:18:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="90" rank="0" gdr="1">
          <nvlink target="0000:05:00.0" count="5" tclass="0x068000"/>
          <nvlink target="0000:06:00.0" count="13" tclass="0x068000"/>
        </gpu>
      </pci>
      <pci busid="0000:19:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="90" rank="1" gdr="1" mlopart="0">
          <future kind="x"/>
          <nvlink target="0000:05:00.0" count="5" tclass="0x068000"/>
          <nvlink target="0000:06:00.0" count="13" tclass="0x068000"/>
          <c2c bw="22500" count="10"/>
        </gpu>
      </pci>
      <pci busid="0000:1a:00.0" class="0x020700" link_speed="32.0 GT/s PCIe" link_width="16">
        <nic><net name="mlx5_0" dev="0" speed="400000" port="1"
                   latency="0.000000" guid="0xa87c" maxconn="131072" gdr="1" rail="0"/></nic>
      </pci>
      <pcilink target="0000:17:00.0"/>
    </pci>
  </cpu>
  <cpu numaid="-1" host_hash="0x2" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:98:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="90" rank="2" gdr="1"><nvlink target="fffffff:ff:ff.0" count="18" tclass="0x068000"/></gpu>
    </pci>
  </cpu>
</system>
"""


def test_full_dump_switches_c2c_unknown_attrs_and_multi_host():
    t = import_xml(FULL, host="n")
    assert t.hosts() == ("n-0", "n-1")  # two host_hash values: a multi-host (MNNVL) dump
    assert [t.link("n-0/gpu0", f"n-0/nvswitch{k}")["count"] for k in (0, 1)] == [5, 13]
    path01 = t.path("n-0/gpu0", "n-0/gpu1")
    assert path01.smi == "NV18" and path01.bw == pytest.approx(18 * 20.6)
    assert t.link("n-0/gpu1", "n-0/cpu0")["bw"] == 225.0 and t.link("n-0/gpu1", "n-0/cpu0")["count"] == 10
    assert t.node("n-1/nvswitch0")["assumed"] is True and t.node("n-1/cpu0")["numa"] == 0
    sw = t.node("n-0/pcisw0")
    assert sw["x_nccl"]["pci"]["foo"] == "bar"
    assert sw["x_nccl"]["children"] == [{"tag": "pcilink", "target": "0000:17:00.0"}]
    assert t.node("n-0/nic0")["x_nccl"]["net"]["guid"] == "0xa87c" and t.node("n-0/nic0")["rail"] == 0
    out = export_xml(t, host="n-1")
    assert 'numaid="-1"' in out and 'target="fffffff:ff:ff.0"' in out
    t0 = export_xml(t, host="n-0")
    assert 'foo="bar"' in t0 and "<pcilink" in t0 and '<c2c bw="22500" count="10"/>' in t0
    assert '<future kind="x"/>' in t0 and 'mlopart="0"' in t0
    assert import_xml(t0, host="n-0") == import_xml(export_xml(import_xml(t0, host="n-0")), host="n-0")


def test_a_net_plugins_latency_becomes_the_nics_lat():
    """<net latency="..."> (µs; NCCL adds it per inter-node step) is the NIC's ``lat``; 0 means none."""
    assert "lat" not in import_xml(FULL, host="n").node("n-0/nic0")
    t = import_xml(FULL.replace('latency="0.000000"', 'latency="75.000000"'), host="n")
    assert t.node("n-0/nic0")["lat"] == 75.0
    assert import_xml(export_xml(t, host="n-0"), host="n-0").node("n-0/nic0")["lat"] == 75.0
    plain = topo.load(Path(__file__).resolve().parents[2] / "topologies" / "dgx-h100.yaml")
    g = plain.graph.copy()
    g.nodes["h0/nic0"]["lat"] = 35.0
    assert 'latency="35.000000"' in export_xml(topo.Topology(g, name="x"))
    for bad in ("fast", "-1", "inf"):
        with pytest.raises(
            topo.TopologyError,
            match=rf"<net name='mlx5_0'> latency: expected a number >= 0 \(µs\), "
            rf"got '{bad}'",
        ):
            import_xml(FULL.replace('latency="0.000000"', f'latency="{bad}"'), host="n")


def test_export_of_a_yaml_topology_is_readable_again():
    t = topo.load(Path(__file__).resolve().parents[2] / "topologies" / "dgx-h100.yaml")
    text = export_xml(t)
    root = ET.fromstring(text)
    for el in root.iter("pci"):
        assert {"busid", "class", "link_speed", "link_width"} <= set(el.attrib)
    for el in root.iter("gpu"):
        assert {"dev", "sm", "rank", "gdr"} <= set(el.attrib)
    back = import_xml(text, host="h0")
    assert len(back.gpus()) == 8 and len(back.nics()) == 8
    assert back.path("h0/gpu0", "h0/gpu5").smi == "NV18"
    assert cpulist_to_mask("0-55,112-167").endswith("00ffffff,ffffffff")
    assert mask_to_cpulist(cpulist_to_mask("3,9-11")) == "3,9-11"


@pytest.mark.parametrize(
    "bad, msg",
    [
        ("<system version='1'><cpu><pci busid='0000:01:00.0'/></cpu></system>", "attribute numaid is required"),
        ("<system version='2'></system>", r"<system version> expected \"1\""),
        ("<graphs/>", "root element expected <system>"),
        ("<system version='1'><cpu numaid='0'><pci class='0x030200'/></cpu>", "expected well-formed XML"),
        ("<system version='1'><cpu numaid='0'><pci class='0x030200'/></cpu></system>", "attribute busid is required"),
        ("<system version='1'><cpu numaid='zero'/></system>", "numaid expected an integer"),
    ],
)
def test_errors_name_the_problem(bad, msg):
    with pytest.raises(topo.TopologyError, match=msg):
        import_xml(bad)


def test_missing_file():
    with pytest.raises(topo.TopologyError, match="cannot read the NCCL topology file"):
        import_xml("/nonexistent/topo.xml")


def test_graph_file_parses_to_plain_data():
    d = parse_graph_xml(FIX / "azure-ncv4-graph.xml")
    assert [g["pattern_name"] for g in d["graphs"]] == ["ring", "balanced_tree", "tree"]
    ring = d["graphs"][0]
    assert ring["nchannels"] == 2 and [c["gpus"] for c in ring["channels"]] == [[0, 1, 2, 3], [0, 3, 2, 1]]
    assert (ring["typeintra"], ring["speedintra"], ring["channels"][0]["net_in"]) == ("SYS", 12.0, None)
    assert len(d["graphs"][2]["channels"]) == 4
    text = (
        '<graphs version="1"><graph id="0" pattern="4" nchannels="1"><channel><net dev="1"/>'
        '<gpu dev="0" rank="8"/><gpu dev="1" rank="9"/><net dev="1"/></channel></graph></graphs>'
    )
    ch = parse_graph_xml(text)["graphs"][0]["channels"][0]
    assert ch == {"gpus": [0, 1], "ranks": [8, 9], "net_in": 1, "net_out": 1}
    with pytest.raises(topo.TopologyError, match="speedintra expected a number"):
        parse_graph_xml('<graphs><graph speedintra="fast"/></graphs>')


# Excerpt (attributes shortened) of the structure of aliyun/SimAI SimCCL/test/topo_8A100_4CX6.xml, an
# 8x A100 HGX NCCL dump: three levels of Broadcom PEX bridges above each GPU, a bonded NIC straight
# under the CPU, another beside GPU1 one level down.
# every GPU: two NVLinks to each of the six NVSwitches
A100_NVLINKS = "\n".join(
    f'              <nvlink target="0000:{bus}:00.0" count="2" tclass="0x068000"/>'
    for bus in ("c3", "c0", "c2", "c5", "c1", "c4")
)
SIMAI = f"""<system version="1">
  <cpu numaid="0" affinity="00000000,ffffffff,00000000,ffffffff"
       arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="106">
    <pci busid="0000:06:00.0" class="0x020000" link_speed="16 GT/s" link_width="16">
      <nic><net name="mlx5_bond_0" dev="0" speed="200000" port="1" gdr="1"/></nic>
    </pci>
    <pci busid="0000:0c:00.0" class="0x060400" vendor="0x1000" device="0xc010" link_speed="16 GT/s" link_width="16">
      <pci busid="0000:0e:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
        <pci busid="0000:11:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
          <pci busid="0000:13:00.0" class="0x030200"
               vendor="0x10de" device="0x20b2" link_speed="16 GT/s" link_width="16">
            <gpu dev="0" sm="80" rank="0" gdr="1">
{A100_NVLINKS}
            </gpu>
          </pci>
        </pci>
      </pci>
      <pci busid="0000:15:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
        <pci busid="0000:17:00.0" class="0x060400" link_speed="16 GT/s" link_width="16">
          <pci busid="0000:19:00.0" class="0x030200"
               vendor="0x10de" device="0x20b2" link_speed="16 GT/s" link_width="16">
            <gpu dev="1" sm="80" rank="1" gdr="1">
{A100_NVLINKS}
            </gpu>
          </pci>
        </pci>
        <pci busid="0000:1a:00.0" class="0x020000" link_speed="16 GT/s" link_width="16">
          <nic><net name="mlx5_bond_1" dev="1" speed="200000" port="1" gdr="1"/></nic>
        </pci>
      </pci>
    </pci>
  </cpu>
</system>
"""


def test_full_a100_dump_structure():
    t = import_xml(SIMAI, host="a")
    assert import_xml(export_xml(t), host="a") == t
    assert len(t.nodes("nvswitch")) == 6 and len(t.nodes("pcie_switch")) == 5  # 0c, 0e, 11, 15, 17
    p = t.path("a/gpu0", "a/gpu1")
    assert (p.smi, p.nccl, p.bw) == ("NV12", "NVL", pytest.approx(240.0))  # 6 switches x 2 links x 20 GB/s
    bond = {t.node(n)["name"]: n for n in t.nics()}
    assert t.path("a/gpu1", bond["mlx5_bond_1"]).smi == "PXB" and t.path("a/gpu0", bond["mlx5_bond_1"]).smi == "PXB"
    assert t.path("a/gpu0", bond["mlx5_bond_0"]).smi == "PHB" and t.nearest_nic("a/gpu1") == bond["mlx5_bond_1"]
    assert t.node("a/gpu0")["model"] == "A100-SXM4-80GB" and t.node(bond["mlx5_bond_0"])["bw"] == 25.0


def test_an_nccl_graph_file_given_as_a_topology_says_what_it_is():
    """NCCL_GRAPH_FILE XML (<graphs>: channels of rings and trees) is no topology: topo import names it
    and the commands that read it (tree show/check), and how to get the topology instead."""
    from treecoll.topo.errors import TopologyError

    f = FIX / "azure-ncv4-graph.xml"
    for load in (topo.import_file, topo.resolve):  # topo import, and every command's FILE
        with pytest.raises(TopologyError) as e:
            load(str(f))
        assert str(e.value) == (
            f"{f}: expected an NCCL topology XML (<system ...>), got an NCCL graph file (<graphs>, NCCL_GRAPH_FILE: "
            "rings and trees); read it with 'treecoll tree show' or 'tree check', and dump the topology with "
            "NCCL_TOPO_DUMP_FILE"
        )
