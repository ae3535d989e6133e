"""Machine templates, GPU names and machine flags -> topologies (treecoll.topo.machines)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from treecoll.topo import machines
from treecoll.topo.errors import TopologyError
from treecoll.topo.machines import (
    FABRICS,
    GPU_VARIANTS,
    MACHINES,
    Machine,
    MachineFacts,
    MachineFlags,
    machine_topology,
    parse_nic,
    resolve_gpu,
    resolve_machine,
)
from treecoll.topo.yaml_io import MACHINES_DIR, SHIPPED_DIR, shipped, shipped_names

from treecoll import topo

ROOT = Path(__file__).resolve().parents[2]
# expected per template: (GPUs, model, sm, NVLink GB/s per GPU per direction (0: none), NICs, NIC GB/s)
# NVLink: links x NCCL's per-link bandwidth (topo.h: SM80 20.0, SM90 20.6, SM100 40.1)
TEMPLATES = {
    "h100-sxm": (8, "H100-SXM5-80GB", 90, 18 * 20.6, 8, 50.0),
    "h200-sxm": (8, "H200-SXM-141GB", 90, 18 * 20.6, 8, 50.0),
    "h100-pcie": (8, "H100-PCIe-80GB", 90, 0, 0, None),
    "h20": (8, "H20", 90, 18 * 20.6, 0, None),
    "hgx-b200": (8, "B200", 100, 18 * 40.1, 8, 50.0),
    "gb200-nvl72": (4, "B200 (GB200)", 100, 18 * 40.1, 4, 50.0),
    "gh200": (1, "GH200", 90, 0, 0, None),
    "gh200-x4": (4, "GH200", 90, 18 * 20.6, 4, 25.0),
    "a100-sxm": (8, "A100-SXM4-80GB", 80, 12 * 20.0, 8, 25.0),
    "a100-sxm-4": (4, "A100-SXM4-80GB", 80, 12 * 20.0, 0, None),
    "a100-pcie": (8, "A100-PCIE-80GB", 80, 0, 0, None),
    "a10g": (8, "A10G", 86, 0, 1, 12.5),
    "l40s": (8, "L40S", 89, 0, 0, None),
    "rtx4090": (8, "GeForce-RTX-4090", 89, 0, 0, None),
    "rtx5090": (8, "GeForce-RTX-5090", 120, 0, 0, None),
    "v100-pcie": (4, "V100-PCIE-32GB", 70, 0, 0, None),
}


def _nvlink_out(t, gpu: str) -> float:
    return sum(d["bw"] for _, _, d in t.graph.out_edges(gpu, data=True) if d["kind"] == "nvlink")


def test_the_name_table_and_the_files_agree():
    assert sorted(mt.name for mt in MACHINES) == sorted(TEMPLATES)
    files = sorted(p.stem for p in MACHINES_DIR.glob("*.yaml"))
    assert files == sorted(n for n in TEMPLATES if n not in ("hgx-b200", "gb200-nvl72"))
    assert set(files) <= set(shipped_names()) and {"hgx-b200", "dgx-h100-x2"} <= set(shipped_names())
    for mt in MACHINES:
        assert resolve_gpu(mt.name).template == mt.name
        for n in (*mt.names, *mt.aliases):  # every name resolves to a template of that name
            assert mt.name in {resolve_gpu(n, g).template for g in range(1, mt.gpus + 1)}, n
    for name, by_count in machines.UNNAMED.items():
        assert all(t in TEMPLATES for t in by_count.values()), name
    assert all(machines._key(n) in machines._NAMES for n in machines.GPU_VARIANTS)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_every_template_loads_by_name_with_its_numbers(name):
    ngpu, model, sm, nvl, nnic, nic_bw = TEMPLATES[name]
    t = topo.resolve(name)
    gpus = t.gpus(t.hosts()[0])
    assert len(gpus) == ngpu == next(mt.gpus for mt in MACHINES if mt.name == name)
    g = t.node(gpus[0])
    assert (g["model"], g["sm"]) == (model, sm) and g["mem_bw"] > 0
    assert _nvlink_out(t, gpus[0]) == pytest.approx(nvl)
    nics = t.nics(t.hosts()[0])
    assert len(nics) == nnic and all(t.node(n)["bw"] == nic_bw for n in nics)
    if name in ("gb200-nvl72", "hgx-b200"):
        return
    text = shipped(name).read_text()
    assert "Sources" in text  # (no paths outside the repository: tests/test_package.py)
    assert shipped(name).parent == MACHINES_DIR


def test_templates_are_usable_by_the_compact_form(tmp_path):
    """``template: h100-sxm`` in a user's file finds the shipped machine template."""
    f = tmp_path / "mine.yaml"
    f.write_text(
        "hosts: [{template: h100-sxm, count: 2}, {template: l40s, count: 1}]\nnetwork: {type: rail_optimized}\n"
    )
    t = topo.load(f)
    assert len(t.gpus()) == 24 and t.path("h0/gpu0", "h1/gpu0").nccl == "NET"
    assert t.path("h2/gpu0", "h2/gpu1").nccl == "PIX"  # two L40S behind one PCIe switch
    with pytest.raises(TopologyError, match=r"shipped topology 'nope': not found; expected one of \[.*'a10g'"):
        shipped("nope")
    assert SHIPPED_DIR / "machines" == MACHINES_DIR


@pytest.mark.parametrize("fabric", sorted(FABRICS))
def test_flags_build_a_machine_on_each_fabric(fabric):
    m = resolve_machine(MachineFlags(hosts=2, gpu="H100", nic=parse_nic(f"8x200G-{fabric}")))
    t = m.topology()
    assert (len(t.hosts()), len(t.gpus())) == (2, 16) and t.meta["machine"]["fabric"] == fabric
    nics = t.nics("h0")
    assert len(nics) == 8
    for k, n in enumerate(nics):
        d = t.node(n)
        assert d["bw"] == 25.0 and d["link_layer"] == FABRICS[fabric].link_layer and d["rail"] == k
        assert d.get("lat") == FABRICS[fabric].lat
    assert t.path("h0/gpu3", "h0/nic3").nccl == "PIX"  # NIC k beside GPU k
    assert t.path("h0/gpu0", "h1/gpu0").nccl == "NET"


def test_nic_placement_follows_the_gpus():
    # 32 NICs on 8 GPUs (AWS p5): four per GPU's PCIe switch
    t = resolve_machine(MachineFlags(hosts=2, gpu="NVIDIA H100 80GB HBM3", nic=parse_nic("32x100G-efa"))).topology()
    assert len(t.nics("h0")) == 32 and all(t.path("h0/gpu1", f"h0/nic{k}").nccl == "PIX" for k in range(4, 8))
    assert t.node("h0/nic0")["lat"] == 75.0
    # 4 NICs on 8 A100 (p4de): one per GPU pair's switch
    t = resolve_machine(MachineFlags(hosts=2, gpu="A100", nic=parse_nic("4x100G-efa"))).topology()
    assert [t.path("h0/gpu2", f"h0/nic{k}").nccl for k in range(4)] == ["PHB", "PIX", "SYS", "SYS"]
    # GH200: the NIC on Grace's PCIe, the GPU on Grace's C2C
    t = resolve_machine(MachineFlags(hosts=2, gpu="GH200", nic=parse_nic("1x200G-slingshot"))).topology()
    assert t.path("h0/gpu0", "h0/nic0").nccl == "P2C" and t.node("h0/nic0")["link_layer"] == "Slingshot"


def test_gpus_per_host_trims_the_template_and_refuses_more():
    m = resolve_machine(MachineFlags(hosts=2, gpus_per_host=1, gpu="B200", nic=parse_nic("1x400G-roce")))
    t = m.topology()
    assert len(t.gpus()) == 2 and t.path("h0/gpu0", "h0/nic0").nccl == "PIX"
    with pytest.raises(TopologyError, match=r"--gpus-per-host 16: the machine template hgx-b200 has 8 GPUs"):
        resolve_machine(MachineFlags(hosts=1, gpus_per_host=16, gpu="B200")).topology()


def test_gb200_racks_are_nvlink_domains_of_18_trays():
    t = resolve_machine(MachineFlags(hosts=36, gpus_per_host=4, gpu="GB200", nic=parse_nic("4x400G-ib"))).topology()
    assert len(t.gpus()) == 144
    assert t.path("h0/gpu0", "h17/gpu3").nccl == "NVL"  # one rack
    assert t.path("h0/gpu0", "h18/gpu0").nccl == "NET"  # the next rack: over the network


GPU_NAMES_SEEN = {  # every GPU name printed in tests/fixtures/nccl-tests, with the GPUs per host of its table
    ("NVIDIA A100-SXM4-80GB", 4): "a100-sxm-4",
    ("NVIDIA A100-SXM4-80GB", 8): "a100-sxm",
    ("NVIDIA B200", 8): "hgx-b200",
    ("NVIDIA B200", 2): "hgx-b200",
    ("NVIDIA B200", 1): "hgx-b200",
    ("NVIDIA GB200", 4): "gb200-nvl72",
    ("NVIDIA Graphics Device", 4): "gb200-nvl72",
    ("NVIDIA GH200 120GB", 4): "gh200-x4",
    ("NVIDIA GH200 120GB", 1): "gh200",
    ("NVIDIA H100 80GB HBM3", 8): "h100-sxm",
    ("NVIDIA H200", 8): "h200-sxm",
    ("NVIDIA H200", 1): "h200-sxm",
    ("NVIDIA L40S", 1): "l40s",
    ("NVIDIA GeForce RTX 4090", 2): "rtx4090",
    ("NVIDIA GeForce RTX 4090", 4): "rtx4090",
    ("NVIDIA GeForce RTX 5090", 4): "rtx5090",
    ("Tesla V100-PCIE-32GB", 4): "v100-pcie",
}


def test_every_gpu_name_of_the_fixtures_resolves():
    from treecoll.collectives.sim.nccltests import read

    seen = set()
    for p in (ROOT / "tests" / "fixtures" / "nccl-tests").rglob("*.txt"):
        t = read(p).tables[0]
        if t.devices_complete:
            seen |= {(n, g) for n in t.gpu_names() for _, g in t.hosts()}
        else:
            seen |= {(n, g) for n in t.gpu_names() for g in (4, 8) if (n, g) in GPU_NAMES_SEEN}
    assert {n for n, _ in seen} == {n for n, _ in GPU_NAMES_SEEN}
    for (name, g), template in GPU_NAMES_SEEN.items():
        assert resolve_gpu(name, g).template == template, name
    assert resolve_gpu("geforce rtx-4090").template == "rtx4090"  # case, dashes, prefixes
    assert dict(resolve_gpu("NVIDIA A100-SXM4-40GB", 8).overrides) == {
        "model": "A100-SXM4-40GB",
        "mem_bw": 1555.0,
        "mem_gb": 40.0,
    }
    t = resolve_machine(MachineFlags(hosts=1, gpus_per_host=8, gpu="NVIDIA A100-SXM4-40GB")).topology()
    assert (t.node("h0/gpu0")["mem_bw"], t.node("h0/gpu0")["mem_gb"]) == (1555.0, 40.0)
    t = resolve_machine(MachineFlags(hosts=1, gpus_per_host=4, gpu="Tesla V100-PCIE-16GB")).topology()
    assert (t.node("h0/gpu0")["model"], t.node("h0/gpu0")["mem_gb"]) == ("V100-PCIE-16GB", 16.0)


#: the memory (GB) in the names the GPU variants and templates are sold and printed under
_NAMED_GB = re.compile(r"(\d+)\s*GB", re.I)


def test_every_shipped_gpu_has_a_memory_capacity():
    """Every GPU of every shipped topology and machine template carries mem_gb (CPU-only rank slots,
    model cpu-process, are processes, not GPUs); where the model's name states its memory, they agree."""
    files = sorted(SHIPPED_DIR.glob("*.yaml")) + sorted(MACHINES_DIR.glob("*.yaml"))
    assert len(files) > 20
    for f in files:
        t = topo.load(f)
        for g in t.nodes("gpu"):
            node = t.node(g)
            if node.get("model") == "cpu-process":
                continue
            assert node.get("mem_gb", 0) > 0, (f.name, g)
            named = _NAMED_GB.search(node.get("model", ""))
            if named:
                assert node["mem_gb"] == float(named.group(1)), (f.name, g)
    for name, variant in GPU_VARIANTS.items():
        assert variant["mem_gb"] == float(_NAMED_GB.search(name).group(1)), name


def test_the_pci_id_table_agrees_with_the_templates():
    """NCCL's XML names a GPU by its PCI device id (topo.hostgraph.GPU_PCI_IDS: model, memory bandwidth,
    sm, capacity): where a shipped template or variant has the same model, every number is the template's."""
    from treecoll.topo.hostgraph import GPU_PCI_IDS

    files = sorted(SHIPPED_DIR.glob("*.yaml")) + sorted(MACHINES_DIR.glob("*.yaml"))
    facts = {}
    for f in files:
        for temp in (yaml.safe_load(f.read_text()).get("templates") or {}).values():
            g = temp["gpus"]
            facts.setdefault(g["model"], (g.get("mem_bw"), g.get("sm"), g.get("mem_gb")))
    for v in GPU_VARIANTS.values():
        facts.setdefault(v["model"], (v.get("mem_bw"), None, v.get("mem_gb")))
    matched = 0
    for model, mem_bw, sm, mem_gb in GPU_PCI_IDS.values():
        if model in facts:
            want = facts[model]
            assert (mem_bw, mem_gb) == (want[0], want[2]) and want[1] in (None, sm), (model, want)
            matched += 1
    assert matched >= 6


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: parse_nic("8x400G-xyz"),
            "--nic '8x400G-xyz': unknown fabric 'xyz'; expected one of ib, roce, efa, "
            "tcpx, tcpxo, slingshot, socket in COUNTxSPEEDG-FABRIC",
        ),
        (lambda: parse_nic("8x400"), "--nic '8x400': expected COUNTxSPEEDG-FABRIC (e.g. 8x400G-ib"),
        (lambda: parse_nic("0x400G-ib"), "--nic '0x400G-ib': expected 1 to 256 NICs per host, got 0"),
        (lambda: resolve_gpu("H999"), "--gpu 'H999': no machine template for this GPU; expected a template (a100-pcie"),
        (lambda: resolve_gpu("NVIDIA H200 NVL"), "--gpu 'NVIDIA H200 NVL': no machine template for this GPU"),
        (
            lambda: resolve_gpu("NVIDIA Graphics Device", 8),
            "the driver did not name this GPU; it is read only as (4 GPUs per host: gb200-nvl72), got 8 GPUs per host",
        ),
        (
            lambda: resolve_gpu("NVIDIA GH200 120GB"),
            "several machine templates have this GPU (1: gh200, 4: gh200-x4 "
            "GPUs per host); pass --gpus-per-host G or --gpu TEMPLATE",
        ),
        (lambda: resolve_gpu("GH200", 8), "'GH200': 8 GPUs per host; the machine templates of this GPU hold at most 4"),
        (
            lambda: resolve_machine(MachineFlags(hosts=2, gpu="L40S")).topology(),
            "2 hosts of l40s: the template lists no NICs; pass --nic COUNTxSPEEDG-FABRIC",
        ),
        (
            lambda: resolve_machine(
                MachineFlags(), MachineFacts("t.log:3", hosts=(("a", 8), ("b", 4)), gpu_names=("B200",))
            ),
            "t.log:3: the hosts have different GPU counts [4, 8]",
        ),
        (
            lambda: resolve_machine(
                MachineFlags(), MachineFacts("t.log:3", hosts=(("a", 1),), gpu_names=("B200", "H200"))
            ),
            "t.log:3: the device lines name several GPUs",
        ),
        (
            lambda: resolve_machine(MachineFlags(gpu="H100"), MachineFacts("t.log:3")),
            "t.log:3: the number of hosts is not known (8 GPUs per host of h100-sxm): pass --hosts N",
        ),
        (
            lambda: resolve_machine(MachineFlags(hosts=2), MachineFacts("t.log:3")),
            "t.log:3: the GPU model is not known: pass --gpu MODEL [--gpus-per-host G], or --topology FILE|name",
        ),
        (
            lambda: machine_topology(MachineFlags(topology="dgx-h100", hosts=2)),
            "--topology names the whole machine: expected it alone",
        ),
    ],
)
def test_bad_flags_are_one_line_errors(call, message):
    with pytest.raises(TopologyError) as e:
        call()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_facts_fill_what_the_flags_leave_and_flags_win():
    facts = MachineFacts("t.log:9", hosts=(("a", 8), ("b", 8)), gpu_names=("NVIDIA H200",), nranks=16)
    m = resolve_machine(MachineFlags(nic=parse_nic("8x400G-ib")), facts)
    assert (m.template, m.hosts, m.gpus_per_host, m.notes) == ("h200-sxm", 2, 8, ())
    m = resolve_machine(MachineFlags(hosts=4, gpu="B200"), facts)  # flags win over the file
    assert (m.template, m.hosts, m.gpus_per_host) == ("hgx-b200", 4, 8)
    assert m.notes[-1] == "the table ran on 16 ranks; the machine has 4 x 8 = 32 GPUs"
    # no device lines: the ranks and the GPUs per host give the hosts
    m = resolve_machine(MachineFlags(gpus_per_host=8, gpu="H200"), MachineFacts("t.log:9", nranks=128))
    assert m.hosts == 16 and m.notes[0] == "hosts: 16 = 128 ranks / 8 GPUs per host"
    t, none = machine_topology(MachineFlags(topology="dgx-h100-x2"))
    assert none is None and len(t.gpus()) == 16
    doc = Machine("a10g", 1, 4, None, "A10G").document()
    assert doc["templates"]["a10g"]["gpus"]["count"] == 4 and yaml.safe_dump(doc)
