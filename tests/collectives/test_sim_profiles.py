"""Calibrations (collectives/sim/profiles.py): the factors over the simulator's defaults, their YAML, and how
the simulator applies them to every algorithm family."""

from __future__ import annotations

import pytest
import yaml
from treecoll.collectives.sim import profiles
from treecoll.collectives.sim.profiles import Calibration, get_profile, load_profile, save_profile
from treecoll.collectives.sim.simulator import nccl_hop_profile, simulate_algorithm, simulate_nccl
from treecoll.topo import resolve
from treecoll.topo.errors import CollectiveError


def test_apply_scales_links_by_class_and_latencies_by_family():
    c = Calibration("c", link_scale={"nvlink": 0.5, "net": 0.8}, lat_scale={"tree": 3.0})
    ll = get_profile("nccl-ll")
    t = c.apply(nccl_hop_profile(ll, "tree"), "tree")
    # NCCL's tree LL latencies (tuning.cc: base 6.8 us, hops NVLink 0.6 / PCI 1.0 / NET 5.0 us), times 3
    assert t.name == "nccl-ll" and t.base_lat_us == pytest.approx(3 * 6.8)
    assert t.lat_floor_us == pytest.approx({"nvlink": 1.8, "pci": 3.0, "net": 15.0})
    assert t.nic_lat_mult == pytest.approx(3 * ll.nic_lat_mult)
    # LL's efficiency 0.5 on every kind, times the class's factor (c2c is NVLink's class, smp PCIe's)
    assert [t.efficiency(k) for k in ("nvlink", "c2c", "pcie", "smp", "net")] == pytest.approx(
        [0.25, 0.25, 0.5, 0.5, 0.4]
    )
    r = c.apply(ll, "ring")  # another family: latencies as NCCL's, links as for every family
    assert (r.base_lat_us, r.lat_floor_us, r.bw_eff) == (ll.base_lat_us, ll.lat_floor_us, t.bw_eff)
    assert c.value("lat_scale.tree") == 3.0 and c.value("lat_scale.p2p") == 1.0
    with pytest.raises(CollectiveError, match=r"family expected one of .*, got 'ccl'"):
        c.apply(ll, "ccl")


def test_a_hops_factor_is_every_familys_and_keeps_nccls_own_latencies():
    """``hop_scale.net`` doubles the network hop of every family (NCCL's ring LL 2.7 us, tree LL 5.0 us, the
    NIC latency count) and leaves the NVLink and PCI hops and the base latencies; a ring with one GPU per
    host keeps the tree's network hop (tuning.cc), calibrated or not, so a factor a hair off 1 moves the
    time a hair (no jump between NCCL's latencies and the ring's)."""
    c = Calibration("c", hop_scale={"net": 2.0})
    ll = get_profile("nccl-ll")
    ring, tree = c.apply(ll, "ring"), c.apply(nccl_hop_profile(ll, "tree"), "tree")
    lone = c.apply(nccl_hop_profile(ll, "ring", one_per_host=True), "ring")
    assert (ring.lat_floor_us, tree.lat_floor_us["net"], lone.lat_floor_us["net"]) == (
        {"nvlink": 0.6, "pci": 1.0, "net": 5.4},
        10.0,
        10.0,
    )
    assert (ring.base_lat_us, tree.base_lat_us, ring.nic_lat_mult) == (6.6, 6.8, 2.0)
    two = resolve("dgx-h100-x2")
    for algos in (["tree"], ["ring"]):
        t0 = simulate_nccl(two, 4096, algos=algos, profile=Calibration("one"))[1].time
        t1 = simulate_nccl(two, 4096, algos=algos, profile=Calibration("hair", lat_scale={"tree": 1.0001}))[1].time
        assert t0 == simulate_nccl(two, 4096, algos=algos)[1].time and t0 <= t1 <= t0 * 1.0001, algos


def test_a_switch_point_stops_a_protocol_above_it(dgx):
    """``proto_max.ll``: LL runs up to that size and not above; absent, the simulator's rule (LL up to 8 MiB)."""
    c = Calibration("c", proto_max={"ll": 4096})
    assert [c.runs("nccl-ll", n) for n in (4096, 4097)] == [True, False]
    assert c.runs("nccl-simple", 1) is None and Calibration("d").runs("nccl-ll", 1 << 30) is None
    small = simulate_algorithm(dgx, "ring", 1024, profile=c)
    above = simulate_algorithm(dgx, "ring", 8192, profile=c)
    assert small.profile == "nccl-ll" and above.profile != "nccl-ll"
    assert simulate_algorithm(dgx, "ring", 8192).profile == "nccl-ll"
    with pytest.raises(CollectiveError, match=r"proto_max.ll expected bytes in \[64, \d+\], got 1"):
        Calibration("c", proto_max={"ll": 1})
    with pytest.raises(CollectiveError, match=r"proto_max.simple: expected one of \['ll', 'll128'\]"):
        Calibration("c", proto_max={"simple": 4096})


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"link_scale": {"nvlink": 5.0}}, r"link_scale.nvlink expected a factor in \[0.1, 2\], got 5.0"),
        ({"lat_scale": {"ring": 0.0}}, r"lat_scale.ring expected a factor in \[0.1, 20\], got 0.0"),
        ({"hop_scale": {"nvlink": 5.0}}, r"hop_scale.nvlink expected a factor in \[0.25, 4\], got 5.0"),
        ({"hop_scale": {"dsl": 2.0}}, r"hop_scale.dsl: expected one of \['nvlink', 'pci', 'net'\]"),
        ({"link_scale": {"infiniband": 1.0}}, r"link_scale.infiniband: expected one of \['nvlink', 'pcie', 'net'\]"),
        ({"fitted": ("lat_scale.nccl",)}, r"fitted: unknown parameter 'lat_scale.nccl'"),
    ],
)
def test_a_bad_calibration_is_refused(kw, match):
    with pytest.raises(CollectiveError, match=match):
        Calibration("c", **kw)


def test_calibration_yaml_round_trip_and_old_files(tmp_path):
    c = Calibration("mine", link_scale={"net": 0.7}, lat_scale={"p2p": 2.0}, fitted=("link_scale.net",), source="s")
    save_profile(c, tmp_path / "c.yaml", fit={"rows": 4})
    back = load_profile(tmp_path / "c.yaml")
    assert isinstance(back, Calibration) and back == c and back.fitted == ("link_scale.net",)
    c2 = Calibration("m2", hop_scale={"net": 3.0}, proto_max={"ll": 45000}, fitted=("proto_max.ll",))
    save_profile(c2, tmp_path / "c2.yaml")
    assert yaml.safe_load((tmp_path / "c2.yaml").read_text())["version"] == profiles.SCHEMA_VERSION
    assert load_profile(tmp_path / "c2.yaml") == c2
    # a version-1 calibration (no version key, no hop_scale or proto_max) still loads
    (tmp_path / "v1.yaml").write_text("name: v1\nkind: calibration\nlink_scale: {net: 0.7}\nlat_scale: {ring: 2.0}\n")
    v1 = load_profile(tmp_path / "v1.yaml")
    assert v1.value("lat_scale.ring") == 2.0 and v1.value("hop_scale.net") == 1.0 and v1.proto_max == {}
    # a plain profile file (what earlier versions of calibrate wrote) still loads as a plain profile
    (tmp_path / "old.yaml").write_text(
        "name: old\nbase_lat_us: 8.4\nlat_floor_us: {nvlink: 3.0}\nbw_eff: {nvlink: 0.9}\nfit: {rows: 3}\n"
    )
    old = load_profile(tmp_path / "old.yaml")
    assert type(old) is profiles.Profile and old.efficiency("nvlink") == 0.9 and old.step_lat("nvlink") == 3e-6


@pytest.mark.parametrize(
    "text, match",
    [
        ("name: x\nlink_scale: {net: 0.5}\nbw_eff: {net: 0.5}\n", r"key 'bw_eff': it belongs to a plain profile"),
        ("name: x\nbw_eff: {net: 0.5}\nlat_scale_p2p: 2\n", r"key 'lat_scale_p2p': an unknown key"),
        ("name: x\nkind: tuner\n", r"kind expected 'calibration' or 'profile', got 'tuner'"),
        ("name: x\nlat_scale: {p2p: 100}\n", r"lat_scale.p2p expected a factor in \[0.1, 20\], got 100"),
        ("name: [x\n", r"not YAML"),
        ("name: x\nversion: 7\nlat_scale: {p2p: 2}\n", r"version expected one of \[1, 2, 3\], got 7; write it again"),
    ],
)
def test_a_bad_profile_file_is_one_line_naming_file_and_key(tmp_path, text, match):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(CollectiveError, match=match) as e:
        load_profile(f)
    assert str(e.value).startswith(f"profile file {str(f)!r}: ") and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def dgx():
    return resolve("dgx-h100")


def test_a_calibration_of_ones_is_the_defaults(dgx):
    """Every factor 1: every family, every protocol, NVLS with NCCL's constants, exactly as ``auto``."""
    ones = Calibration("ones")
    for coll, size in (("allreduce", 1 << 10), ("allreduce", 1 << 28), ("allgather", 1 << 20), ("alltoall", 1 << 20)):
        a = simulate_nccl(dgx, size, collective=coll, profile="auto")
        b = simulate_nccl(dgx, size, collective=coll, profile=ones)
        assert (a[0], a[1].time) == (b[0], b[1].time), (coll, size)


def test_each_family_reads_only_its_own_latency_factor(dgx):
    """A factor on one family's latency moves that family's small-message time and no other family's."""
    for family, algo, coll in (
        ("ring", "ring", "allreduce"),
        ("tree", "two_level", "allreduce"),
        ("nvls", "nvls", "allreduce"),
        ("p2p", "p2p", "sendrecv"),
    ):
        slow = Calibration("slow", lat_scale={family: 4.0})
        for other, oalgo, ocoll in (("ring", "ring", "allreduce"), ("p2p", "p2p", "alltoall")):
            base = simulate_algorithm(dgx, oalgo, 4096, collective=ocoll).time
            t = simulate_algorithm(dgx, oalgo, 4096, collective=ocoll, profile=slow).time
            assert (t > 1.5 * base) == (other == family), (family, other)
        if family not in ("ring", "p2p"):
            base = simulate_algorithm(dgx, algo, 4096, collective=coll).time
            assert simulate_algorithm(dgx, algo, 4096, collective=coll, profile=slow).time > 1.5 * base


def test_nvls_keeps_nccls_constants_under_a_calibration(dgx):
    """NVLS at 1 GiB is bandwidth-bound on the NVSwitch links at NCCL's nvlsEfficiency: an NVLink factor of
    0.5 halves that bandwidth, so the time (less its latency) doubles."""
    base = simulate_algorithm(dgx, "nvls", 1 << 30)
    half = simulate_algorithm(dgx, "nvls", 1 << 30, profile=Calibration("h", link_scale={"nvlink": 0.5}))
    lat = 25e-6  # NCCL's NVLS step latency (the profile's nvlink floor), unscaled by a link factor
    assert base.stats["nvls_efficiency"] == pytest.approx(0.85) and half.stats["nvls_efficiency"] == pytest.approx(
        0.425
    )
    assert (half.time - lat) == pytest.approx(2 * (base.time - lat), rel=1e-9)


def test_a_familys_bandwidth_factor_scales_that_family_only():
    """``bw_scale.tree`` multiplies the tree's efficiency on every link kind on top of the link factors
    (LL 0.5 x NVLink 0.5 x 0.8 = 0.2), a ring of the same calibration keeps the links' alone; it
    round-trips through YAML and is refused out of its bounds or for a family without one."""
    c = Calibration("c", link_scale={"nvlink": 0.5}, bw_scale={"tree": 0.8})
    ll = get_profile("nccl-ll")
    assert c.apply(ll, "tree").efficiency("nvlink") == pytest.approx(0.2)
    assert c.apply(ll, "tree").efficiency("net") == pytest.approx(0.4)
    assert c.apply(ll, "ring").efficiency("nvlink") == pytest.approx(0.25)
    assert c.value("bw_scale.tree") == 0.8 and c.value("bw_scale.nvls") == 1.0
    with pytest.raises(CollectiveError, match=r"bw_scale.ring: expected one of \['tree', 'nvls'\]"):
        Calibration("c", bw_scale={"ring": 0.5})
    with pytest.raises(CollectiveError, match=r"bw_scale.nvls expected a factor in \[0.1, 2\], got 3"):
        Calibration("c", bw_scale={"nvls": 3})


def test_nvlstree_cap_scales_with_the_nvls_bandwidth_factor():
    """Across two H100 hosts NVLSTree at 1 GiB is held by NCCL's per-channel cap (57.7 GB/s per channel on
    2 nodes, tuning.cc perChMaxNVLSTreeBws): a bandwidth factor of 0.5 on NVLS halves the cap and the
    NVLink efficiency together, so the bandwidth part of the time doubles; the links' factors leave
    the cap as it is. The pipeline fill is a fixed fraction of the drain, so it doubles too."""
    two = resolve("dgx-h100-x2")
    base = simulate_algorithm(two, "nvls", 1 << 30)
    half = simulate_algorithm(two, "nvls", 1 << 30, profile=Calibration("h", bw_scale={"nvls": 0.5}))
    drain = (1 << 30) / (min(32, 8) * 57.7e9 * 16 / 30)
    # the pipeline fill is a fraction of the drain fixed by the size and the channels (nccl_model.nvls_fill)
    fill = base.stats["pipeline_fill_s"]
    assert 0 < fill < drain
    lat = base.time - drain - fill
    assert lat > 0 and (half.time - lat) == pytest.approx(2 * (base.time - lat), rel=1e-6)
