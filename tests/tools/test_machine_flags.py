"""The machine flags helper (treecoll.tools.machine_flags) and `treecoll simulate validate` on the fixtures."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from treecoll.tools import validate_sim, validation
from treecoll.tools.machine_flags import add_machine_flags, machine_flags, machine_from_args, parse_machine_flags
from treecoll.tools.units import UsageError

FIX = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "nccl-tests"


def _parser():
    p = argparse.ArgumentParser(prog="t")
    add_machine_flags(p)
    return p


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--nic", "8x400G-xyz"],
            "--nic '8x400G-xyz': unknown fabric 'xyz'; expected one of ib, roce, efa, tcpx, "
            "tcpxo, slingshot, socket in COUNTxSPEEDG-FABRIC (e.g. 8x400G-ib",
        ),
        (
            ["--gpu", "H999"],
            "--gpu 'H999': no machine template for this GPU; expected a template (a100-pcie, a100-sxm, ",
        ),
        (["--hosts", "0"], "--hosts: expected a positive integer, got 0"),
        (["--gpus-per-host", "x"], "--gpus-per-host: expected an integer, got 'x'"),
        (["--gpu-nic", "pix"], "--gpu-nic 'pix': expected one of aligned, unaligned (whether each GPU shares"),
    ],
)
def test_bad_flag_values_are_one_line_usage_errors(argv, message):
    with pytest.raises(UsageError) as e:
        _parser().parse_args(argv)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    with pytest.raises(UsageError) as e:
        parse_machine_flags(" ".join(argv))
    assert str(e.value).startswith(message)


def test_flags_to_a_topology_and_the_cli_errors():
    args = _parser().parse_args(["--hosts", "2", "--gpu", "NVIDIA GB200", "--nic", "4x400G-ib"])
    t, m = machine_from_args(args)
    assert m.describe() == "2 x gb200-nvl72 (4 GPUs each), NICs 4x400G-ib" and len(t.gpus()) == 8
    assert machine_flags(argparse.Namespace()).counts_given() is False
    with pytest.raises(UsageError, match="machine flags: unrecognized arguments: --bogus"):
        parse_machine_flags("--hosts 2 --bogus")


def test_gpu_nic_flag_places_the_nics_off_the_gpus_switches():
    """--gpu-nic unaligned: every NIC on its GPU's CPU, on no GPU's PCIe switch (NCCL's PHB, beyond the
    GPUDirect RDMA level PXB); aligned (the default) keeps the template's switch (PIX)."""
    base = "--hosts 2 --gpus-per-host 8 --gpu H200 --nic 8x400G-roce"
    assert parse_machine_flags(base).gpu_nic is None and parse_machine_flags(base + " --gpu-nic Unaligned").gpu_nic == (
        "unaligned"
    )
    for flags, cls in (("", "PIX"), (" --gpu-nic aligned", "PIX"), (" --gpu-nic unaligned", "PHB")):
        t, m = machine_from_args(_parser().parse_args((base + flags).split()))
        g = t.graph
        for gpu in t.rank_gpus():
            peer = "h1/gpu0" if gpu.startswith("h0/") else "h0/gpu0"
            nic = next(n for n in t.path(gpu, peer).nodes if g.nodes[n]["kind"] == "nic")
            assert t.path(gpu, nic).nccl == cls, (flags, gpu, nic)
        assert t.meta["machine"]["gpu_nic"] == (flags.split()[-1] if flags else "aligned")
        nic_switches = [v for v in g["h0/nic0"] if g.nodes[v]["kind"] == "pcie_switch"]
        assert bool(nic_switches) == (cls == "PIX")
    # the template's own NICs move too, and a topology file is whole: --gpu-nic does not go with it
    t, _ = machine_from_args(_parser().parse_args("--hosts 2 --gpu H100 --gpu-nic unaligned".split()))
    assert t.path("h0/gpu3", "h0/nic3").nccl == "PHB"
    with pytest.raises(Exception, match="--gpu-nic"):
        machine_from_args(_parser().parse_args("--topology dgx-h100 --gpu-nic unaligned".split()))


def test_validate_sim_reports_every_table_with_a_status(capsys):
    """A small run: a fit table and a held-out alltoall predicted, held-out tables skipped with the reason
    that applies."""
    files = [
        FIX / "v100pcie-4gpu-1node-allreduce-oldformat.txt",
        FIX / "heldout/h100-8gpu-1node-alltoall.txt",
        FIX / "heldout/gb200-144gpu-36node-allreduce-2rack.txt",
        FIX / "heldout/h200-NAgpu-NAnode-allreduce-aws-p5en-efa-ellipsis.txt",
    ]
    assert validate_sim.main([str(f) for f in files] + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    got = {e["file"]: (e["status"], e["set"], e["health"]) for e in d["files"]}
    assert got == {
        "v100pcie-4gpu-1node-allreduce-oldformat.txt": ("ok", "fit", "unstated"),
        "heldout/h100-8gpu-1node-alltoall.txt": ("ok", "heldout", "unstated"),
        "heldout/gb200-144gpu-36node-allreduce-2rack.txt": ("skipped", "heldout", "healthy"),
        "heldout/h200-NAgpu-NAnode-allreduce-aws-p5en-efa-ellipsis.txt": ("skipped", "heldout", "unstated"),
    }
    reasons = [e["reason"] for e in d["files"]]
    assert reasons[0] == reasons[1] == ""
    assert reasons[2].startswith(
        "the table ran on 128 ranks (busbw/algbw) (the busbw/algbw imply 128 ranks, but "
        "the device lines show rank 143), the machine has 144 GPUs"
    )
    assert reasons[3].startswith("128 GPUs: more than --max-gpus 64 (") and "pass --max-gpus 128" in reasons[3]
    v100, a2a = (e for e in d["files"] if e["status"] == "ok")
    assert len(v100["rows"]) == 25 and v100["machine"] == "1 x v100-pcie (4 GPUs each), NICs the template's"
    assert a2a["collective"] == "alltoall" and d["geomean"]["tables"] == 2
    lo, hi = sorted((v100["geomean_large"], a2a["geomean_large"]))
    assert lo <= d["geomean"]["large"] <= hi  # the total spans both tables


def test_validate_sim_flags_win_and_bad_flags_are_one_line(capsys, tmp_path):
    f = tmp_path / "t.txt"  # no device lines, no index: the machine comes from the flags alone
    f.write_text(
        "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
        "  1048576  262144  float  sum  -1  63.16  16.60  24.90  0  63.08  16.62  24.94  0\n"
    )
    d = validation.validate([f])
    reason = d["files"][0]["reason"]
    assert reason.startswith(f"machine: {f}:1: the file does not say the machine (no complete device list): pass")
    flags = parse_machine_flags("--hosts 1 --gpus-per-host 4 --gpu rtx5090")
    e = validation.validate([f], flags=flags)["files"][0]
    assert e["status"] == "ok" and e["machine"].startswith("1 x rtx5090 (4 GPUs each)") and e["set"] is None
    assert validate_sim.main([str(f), "--nic", "8x400G-xyz"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("treecoll: error: --nic '8x400G-xyz': unknown fabric") and err.count("\n") == 1
