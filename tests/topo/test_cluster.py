"""Multi-host assembly over torch.distributed (gloo, real processes, 4 ranks pretending to be 2 hosts)."""

import io
import json
import os
import sys
from pathlib import Path

import pytest
from treecoll.collectives import launch
from treecoll.topo import Topology
from treecoll.topo.cluster import assemble, host_identity

WORKER = Path(__file__).with_name("_cluster_worker.py")


def _run(tmp_path, env_of_rank, world=4, network=None, output=None):
    """Every rank's result: the worker started as ``world`` commands with torchrun's variables
    (``output``: a StringIO that gets their output lines, tagged ``[r<rank>] ``)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "NCCL_", "TREECOLL_"))}
    base["NETWORK"] = json.dumps(network) if network else ""
    port = launch.free_port()
    envs = [{**base, **launch.rendezvous_env(r, world, "127.0.0.1", port), **env_of_rank(r)} for r in range(world)]
    out, log = tmp_path / "ranks.json", io.StringIO() if output is None else output
    res = launch.run_commands(
        [[sys.executable, str(WORKER), str(out)]] * world, envs, timeout=120, tag_output=True, stdout=log, stderr=log
    )
    assert res.returncode == 0, log.getvalue()[-2000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(180)
def test_four_processes_two_hosts_identical_everywhere(tmp_path):
    res = _run(tmp_path, lambda r: {"TREECOLL_HOST_ID": "a" if r < 2 else "b"})
    prints = {x["fingerprint"] for x in res}
    assert len(prints) == 1, prints
    t = Topology.from_dict(res[0]["topology"])
    assert t.hosts() == ("h0", "h1")
    assert t.gpus_per_host() == {"h0": 2, "h1": 2}
    assert [t.host_of(t.gpu_of_rank(r)) for r in range(4)] == ["h0", "h0", "h1", "h1"]
    assert t.path(t.gpu_of_rank(0), t.gpu_of_rank(2)).nccl == "NET"
    assert t.path(t.gpu_of_rank(0), t.gpu_of_rank(1)).nccl != "NET"
    assert t.meta["network"] == "one switch at the NICs' speed"
    assert [n for n in t.nodes("net_switch")] == ["leaf0"]


@pytest.mark.timeout(180)
def test_probe_warnings_are_logged_once_by_rank_zero(tmp_path):
    """Two hosts without NVML: each host's notice is logged once, both by rank 0 (not by every prober)."""
    log = io.StringIO()
    res = _run(tmp_path, lambda r: {"TREECOLL_HOST_ID": "a" if r < 2 else "b", "BROKEN_NVML": "1"}, output=log)
    assert len({x["fingerprint"] for x in res}) == 1
    notices = [line for line in log.getvalue().splitlines() if "no NVML" in line]
    want = "NVML: expected a working NVIDIA driver, got RuntimeError: no driver here); topology is a CPU-only host"
    assert notices == [
        f"[r0] treecoll: no NVML ({want}",
        f"[r0] treecoll: no NVML ({want} (host h1, probed by rank 2)",
    ], log.getvalue()


@pytest.mark.timeout(180)
def test_interleaved_hosts_slurm_addr_tree(tmp_path):
    addr = {0: "core.sw1.n0", 1: "core.sw2.n1", 2: "core.sw1.n0", 3: "core.sw2.n1"}
    res = _run(
        tmp_path,
        lambda r: {
            "TREECOLL_HOST_ID": f"x{r % 2}",
            "SLURM_TOPOLOGY_ADDR": addr[r],
            "SLURM_TOPOLOGY_ADDR_PATTERN": "switch.switch.node",
        },
    )
    assert len({x["fingerprint"] for x in res}) == 1
    t = Topology.from_dict(res[0]["topology"])
    # ranks 0 and 2 share host x0 = h0 (its lowest rank is 0)
    assert [t.host_of(t.gpu_of_rank(r)) for r in range(4)] == ["h0", "h1", "h0", "h1"]
    sw = {t.node(n)["name"]: (n, t.node(n)["tier"]) for n in t.nodes("net_switch")}
    assert sw["core"][1] == 1 and sw["sw1"][1] == 0 and sw["sw2"][1] == 0
    p = t.path(t.gpu_of_rank(0), t.gpu_of_rank(1))
    assert sw["core"][0] in p.nodes and p.nccl == "NET"


@pytest.mark.timeout(180)
def test_a_failing_probe_fails_every_rank_instead_of_hanging(tmp_path):
    res = _run(
        tmp_path,
        lambda r: {"TREECOLL_HOST_ID": "a" if r < 2 else "b", **({"NCCL_P2P_LEVEL": "FAST"} if r == 2 else {})},
    )
    assert all("error" in x for x in res)
    assert {x["error"] for x in res} == {
        "DiscoveryError: discover_cluster: rank 2 (probe of host h1) failed: "
        "TopologyError: NCCL_P2P_LEVEL='FAST': expected one of LOC, NVL, PIX, "
        "PXB, PHB, SYS or an integer 0..4"
    }


def test_assemble_network_section_and_host_identity():
    from treecoll.topo.discover import cpu_only_host

    probes = []
    for i in range(2):
        g = cpu_only_host(f"h{i}", {0: "0-1"}, 2)
        probes.append({"topology": Topology(g).to_dict(), "identity": f"id{i}"})
    t = assemble(probes, [(0, None), (0, None), (1, None), (1, None)], network={"type": "single_switch"})
    assert t.meta["network"].startswith("network section")
    nic = t.nics("h0")[0]
    assert t.node(nic)["x_assumed"] is True and t.node(nic)["rail"] == 0
    assert host_identity({"TREECOLL_HOST_ID": "z", "NCCL_HOSTID": "y"}) == "z"
    assert host_identity({"NCCL_HOSTID": "y"}) == "y"
    assert host_identity({}) != host_identity({"NCCL_HOSTID": "y"})


def test_assemble_gb200_trays_share_the_nvlink_domain(tmp_path):
    from tests.topo.topo_fakes import FakePynvml, build_sysfs, load
    from treecoll import topo

    probes = []
    for i, clique in enumerate((7, 7, 9)):
        rec = load("gb200-tray")
        for gd in rec["nvml"]["gpus"]:
            gd["fabric"]["cliqueId"] = clique
        root = build_sysfs(tmp_path / f"t{i}", rec["sysfs"])
        t = topo.discover(sysfs_root=str(root), nvml=FakePynvml(rec), env={}, host=f"h{i}")
        probes.append({"topology": t.to_dict(), "identity": f"tray{i}"})
    c = assemble(probes, [(h, None) for h in range(3) for _ in range(4)])
    p = c.path("h0/gpu0", "h1/gpu3")
    assert (p.nccl, p.smi) == ("NVL", "NV18")  # multi-node NVLink inside one clique
    assert c.path("h0/gpu0", "h2/gpu0").nccl == "NET"  # other clique: over the network
    assert {n.split("/")[0] for n in c.nodes("nvswitch")} == {"nvl0", "nvl1"}
    assert [c.host_of(c.gpu_of_rank(r)) for r in (0, 4, 8)] == ["h0", "h1", "h2"]


def test_assemble_maps_ranks_by_gpu_uuid_then_cuda_ordinal(tmp_path):
    from tests.topo.topo_fakes import FakePynvml, build_sysfs, load
    from treecoll import topo

    rec = load("dgx-h100")
    root = build_sysfs(tmp_path, rec["sysfs"])
    t = topo.discover(
        sysfs_root=str(root),
        nvml=FakePynvml(rec),
        env={"CUDA_VISIBLE_DEVICES": "4,5,6,7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        host="h0",
    )
    probe = [{"topology": t.to_dict()}]
    uuid7 = t.node("h0/gpu7")["uuid"]
    c = assemble(probe, [(0, uuid7), (0, 0), (0, None)])
    assert [c.gpu_of_rank(r) for r in range(3)] == ["h0/gpu7", "h0/gpu4", "h0/gpu5"]
    from treecoll.topo.errors import DiscoveryError

    with pytest.raises(DiscoveryError, match="rank 8: host h0 has 8 GPUs for 9 ranks"):
        assemble(probe, [(0, None)] * 9)
