"""The NVML adapter: typed N/A values, the pitfalls listed in treecoll.topo.nvml, CUDA vs NVML order."""

import pytest
from treecoll.topo.nvml import NA, NVLINK_VERSION_GENERATION, GpuInfo, Nvml, NVMLUnavailable, cuda_order, norm_busid

from tests.topo.topo_fakes import FakePynvml, load


def test_na_is_a_falsy_singleton():
    from treecoll.topo.nvml import NotAvailable

    assert NotAvailable() is NA and not NA and str(NA) == "N/A"


@pytest.mark.parametrize(
    "raw, want",
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),
        (b"00000008:01:00.0", "0008:01:00.0"),
        ("0000:18:00.0", "0000:18:00.0"),
        ("FFFFFFFF:FF:FF.0", None),
        ("fffffff:ff:ff.0", None),
        ("", None),
        (b"\x00", None),
        ("00000000:00:00.0", None),
        ("garbage", None),
        ("ffff:ff:01.0", "ffff:ff:01.0"),
    ],
)
def test_busid_normalisation(raw, want):
    assert norm_busid(raw) == want


def test_version_enum_maps_to_generation():
    # nvml.h: 1_0=1, 2_0=2, 2_2=3, 3_0=4, 3_1=5, 4_0=6, 5_0=7 (A100 answers 5 = NVLink 3)
    assert [NVLINK_VERSION_GENERATION[v] for v in (1, 2, 3, 4, 5, 6, 7)] == [1, 2, 2, 3, 3, 4, 5]


def test_open_failure_is_nvml_unavailable():
    rec = load("pcie-8gpu")
    rec["nvml"]["init_error"] = "library_not_found"
    with pytest.raises(NVMLUnavailable, match="NVML: expected a working NVIDIA driver, got NVMLError"):
        Nvml.open(FakePynvml(rec))


def test_h100_links_and_gpu_info():
    nv = Nvml.open(FakePynvml(load("dgx-h100")))
    g = nv.gpu(0)
    assert (g.pci, g.sm, g.name) == ("0000:1b:00.0", 90, "NVIDIA H100 80GB HBM3")
    assert g.mem_bw == pytest.approx(3352.3, abs=0.1)  # 2619 MHz x 2 x 5120 bit / 8
    assert g.numa is NA  # NumaNodeId only answers on coherent (Grace) systems
    assert g.cpus[:2] == [0, 1] and 112 in g.cpus
    links = nv.nvlinks(0)
    assert len(links) == 18 and {ln.generation for ln in links} == {4}
    assert [sum(1 for ln in links if ln.remote_pci == f"0000:0{k}:00.0") for k in (5, 6, 7, 8)] == [5, 5, 4, 4]
    assert nv.p2p(0, 1) == "OK" and nv.fabric(0) is NA and nv.c2c(0) is NA
    assert nv.notes == []


def test_link_loop_stops_at_invalid_argument_and_not_supported():
    rec = load("gb200-tray")
    fake = FakePynvml(rec)
    nv = Nvml.open(fake)
    assert len(nv.nvlinks(0)) == 18 and fake.calls["nvmlDeviceGetNvLinkState"] == 19
    assert all(ln.remote_pci is None for ln in nv.nvlinks(1))
    box = Nvml.open(FakePynvml(load("pcie-8gpu")))
    assert box.nvlinks(0) == [] and box.notes == []


def test_unexpected_link_error_is_noted_not_raised():
    rec = load("dgx-h100")
    rec["nvml"]["gpus"][0]["links"] = rec["nvml"]["gpus"][0]["links"][:3]
    rec["nvml"]["gpus"][0]["link_error"] = "driver_not_loaded"
    nv = Nvml.open(FakePynvml(rec))
    assert len(nv.nvlinks(0)) == 3 and "NVLink 3 state failed" in nv.notes[0]


def test_fabric_info_v_first_and_deprecated_fallback():
    rec = load("gb200-tray")
    fake = FakePynvml(rec)
    f = Nvml.open(fake).fabric(2)
    assert (f.clique_id, f.state, f.cluster_uuid) == (32766, 3, "8f1a7c2e-6b4d-4e3a-9c5f-0123456789ab")
    assert fake.calls.get("nvmlDeviceGetGpuFabricInfo", 0) == 0

    class OldPynvml(FakePynvml):  # a pynvml without the V call
        nvmlDeviceGetGpuFabricInfoV = None

    old = OldPynvml(rec)
    assert Nvml.open(old).fabric(0).clique_id == 32766
    assert old.calls["nvmlDeviceGetGpuFabricInfo"] == 1
    assert Nvml.open(fake).c2c(0) == (10, 22500)


def test_p2p_index_literal_not_the_tuple_bug():
    # nvidia-ml-py 13.615.71 defines NVML_P2P_CAPS_INDEX_READ = (0,): the adapter passes 0
    seen = []
    rec = load("pcie-8gpu")
    fake = FakePynvml(rec)
    fake.nvmlDeviceGetP2PStatus = lambda a, b, cap: seen.append(cap) or 2
    assert Nvml.open(fake).p2p(0, 1) == "GNS" and seen == [0]


def _g(i, bus, uuid, sm=90):
    return GpuInfo(i, uuid, bus, "x", 0, sm, NA, NA, NA)


def test_cuda_order_and_visible_devices():
    gpus = [_g(0, "0000:c3:00.0", "GPU-aaa"), _g(1, "0000:1b:00.0", "GPU-bbb"), _g(2, "0000:43:00.0", "GPU-ccc", 80)]
    assert cuda_order(gpus, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == [1, 2, 0]
    assert cuda_order(gpus, {}) == [1, 0, 2]  # FASTEST_FIRST: sm 90 before sm 80, ties by bus id
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert cuda_order(gpus, {**env, "CUDA_VISIBLE_DEVICES": "2,0"}) == [0, 1]
    assert cuda_order(gpus, {**env, "CUDA_VISIBLE_DEVICES": "GPU-cc,GPU-a"}) == [2, 0]
    assert cuda_order(gpus, {**env, "CUDA_VISIBLE_DEVICES": "0,7,1"}) == [1]  # stops at the first invalid
    assert cuda_order(gpus, {**env, "CUDA_VISIBLE_DEVICES": ""}) == []
    assert cuda_order(gpus, {**env, "CUDA_VISIBLE_DEVICES": "MIG-GPU-aaa/1/0"}) == []
