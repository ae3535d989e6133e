"""`treecoll simulate` and the validation helpers (tools/validation.py, tools/validate_sim.py) on small inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from treecoll.collectives.sim.nccl_model import nccl_predict
from treecoll.tools import cmd_simulate, validate_sim, validation
from treecoll.tools.cli import main
from treecoll.topo.errors import CollectiveError

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "nccl-tests"


def test_parse_sizes_and_tokens():
    assert cmd_simulate.parse_sizes("8B:64") == [8, 16, 32, 64]
    assert cmd_simulate.parse_sizes("1K,1MiB") == [1024, 1 << 20]
    with pytest.raises(CollectiveError, match="--sizes: expected a size like .* got '3 parsecs'"):
        cmd_simulate.parse_sizes("3 parsecs")


def test_bad_seq_len_is_one_line(capsys):
    assert main(["simulate", "decode", "--topology", "dgx-h100", "--seq-len", "12 parsecs"]) != 0
    err = capsys.readouterr().err.strip()
    assert "--seq-len: expected a count like 32768, 128k or 5.12M, got '12 parsecs'" in err and "\n" not in err


DECODE_H100 = ["simulate", "decode", "--topology", "dgx-h100", "--heads", "16", "--head-dim", "128", "--seq-len"]


def test_simulate_decode_refuses_a_context_no_method_fits(capsys):
    """1e15 tokens over 8 H100s of 80 GB: a K/V shard alone is 2 x 1.25e14 tokens x 16 x 128 x 2 B per
    GPU; one line naming the methods, their memory and the GPU's, exit 1, and the longest context that
    fits: 80e9 B less each rank's query and state, over 8192 B of K/V a token, times 8 GPUs."""
    assert main([*DECODE_H100, "1000000000000000"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("treecoll: error: --seq-len 1000000000000000: tree: 1024000.00 TB, gather: ")
    assert "ring: 2048000.00 TB per GPU, the H100-SXM5-80GB has 80 GB; expected at most " in err
    longest = int(err.split("expected at most ")[1].split()[0])
    assert 8 * ((80e9 - 2 * 16 * 128 * 4 - 4 * 16 * 129) // 8192) - 8 <= longest <= 8 * (80e9 // 8192)
    assert main([*DECODE_H100, str(longest), "--json"]) == 0
    assert main([*DECODE_H100, str(longest + 8)]) == 1  # one more token per GPU
    capsys.readouterr()


def test_simulate_decode_leaves_out_the_methods_that_do_not_fit(capsys):
    """50M tokens on 8 H100s: ring holds two 6.25M-token K/V blocks, 102.4 GB, the combines one, 51.2 GB."""
    assert main([*DECODE_H100, "50M"]) == 0
    out = capsys.readouterr().out
    note = "does not fit, left out of the comparison: ring: 102.40 GB per GPU, the H100-SXM5-80GB has 80 GB"
    assert out.count(note) == 1 and "faster than ring attention" not in out
    assert main([*DECODE_H100, "50M", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert run["mem_capacity_bytes"] == 80e9 and run["mem_gpu_model"] == "H100-SXM5-80GB"
    assert {m: r["fits"] for m, r in run["methods"].items()} == {
        "tree": True,
        "gather": True,
        "allreduce3": True,
        "ring": False,
    }
    assert run["methods"]["ring"]["peak_mem_bytes"] > 80e9 >= run["methods"][run["auto"]]["peak_mem_bytes"]
    assert "speedup_auto_vs_ring" not in run and "speedup_tree_vs_ring" not in run


def test_simulate_allreduce_json(capsys):
    rc = main(
        [
            "simulate",
            "allreduce",
            "--topology",
            "dgx-h100-x2",
            "--algo",
            "ring,two_level,nccl",
            "--sizes",
            "1K:4K",
            "--json",
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["size"] for r in d["rows"]] == [1024, 2048, 4096] and d["nranks"] == 16
    for r in d["rows"]:
        for a in ("ring", "two_level", "nccl"):
            v = r["algos"][a]
            assert v["busbw"] == pytest.approx(r["size"] / (v["time_us"] * 1e-6) / 1e9 * 2 * 15 / 16)


MACHINE = ["--hosts", "2", "--gpu", "NVIDIA H100 80GB HBM3", "--nic", "8x400G-ib"]


def test_simulate_on_a_machine_of_flags_is_the_machine_topology(capsys):
    """--hosts/--gpu/--nic build the machine (topo.machines.machine_topology) and simulate on it: the same
    numbers as the Python API on that machine, the machine named in the header and in the JSON."""
    from treecoll.topo.machines import MachineFlags, machine_topology, parse_nic

    topology, machine = machine_topology(MachineFlags(hosts=2, gpu="NVIDIA H100 80GB HBM3", nic=parse_nic("8x400G-ib")))
    want = cmd_simulate.allreduce_data(topology, ["ring", "tree", "nccl"], [65536, 1 << 26])
    argv = ["simulate", "allreduce", *MACHINE, "--algo", "ring,tree,nccl", "--sizes", "64K,64M"]
    assert main([*argv, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["machine"] == machine.describe() == "2 x h100-sxm (8 GPUs each), NICs 8x400G-ib"
    assert got["topology"] == topology.name and got["nranks"] == 16
    assert got["rows"] == json.loads(json.dumps(want["rows"]))
    assert main(argv) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head == f"# allreduce on {topology.name} ({machine.describe()}) (16 ranks), flow simulation"
    assert main(["simulate", "decode", *MACHINE, "--seq-len", "1M", "--ranks", "8"]) == 0
    assert f"# decode step on {topology.name} ({machine.describe()}): 8 GPUs (1 host)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--hosts", "2"], "the GPU model is not known: pass --gpu MODEL"),
        (["--gpu", "H100"], "the number of hosts is not known (8 GPUs per host of h100-sxm): pass --hosts N"),
        (["--topology", "dgx-h100-x2", "--hosts", "2"], "--topology names the whole machine: expected it alone"),
        (["--hosts", "2", "--gpu", "H999"], "--gpu 'H999': no machine template for this GPU"),
    ],
)
def test_simulate_machine_flags_that_do_not_name_a_machine_are_one_line(flags, message, capsys):
    assert main(["simulate", "allreduce", *flags, "--sizes", "1M"]) != 0
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err


def test_simulate_decode_and_links_text(capsys):
    assert (
        main(
            [
                "simulate",
                "decode",
                "--topology",
                "dgx-h100",
                "--seq-len",
                "32k",
                "--heads",
                "32",
                "--head-dim",
                "128",
                "--kv-heads",
                "8",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "allreduce3" in out and "gather" in out and "does not fit" not in out
    assert 'auto (tree_decode\'s combine="auto"): gather, ' in out and "x faster than ring attention" in out
    assert main(["simulate", "links", "--topology", "dgx-h100", "--algo", "ring", "--size", "1MiB", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("nvlink ") >= 3 and "busbw" in out


def test_simulate_user_error_is_one_line(capsys):
    assert main(["simulate", "allreduce", "--topology", "dgx-h100", "--sizes", "8X"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("treecoll: error: --sizes: expected a size like 4096") and "got '8X'" in err
    assert err.count("\n") == 1


def test_unknown_algo_lists_every_valid_name(capsys):
    assert main(["simulate", "allreduce", "--topology", "dgx-h100", "--algo", "ring,bogus", "--sizes", "1K"]) == 1
    err = capsys.readouterr().err
    assert "--algo 'bogus': unknown; expected one of ['ring', 'tree', 'nvls', 'p2p', 'nccl'] or a tree builder" in err
    assert "'two_level'" in err and err.count("\n") == 1
    assert main(["simulate", "links", "--topology", "dgx-h100", "--algo", "nvls", "--size", "1MiB"]) == 0
    assert "nvls allreduce" in capsys.readouterr().out


@pytest.mark.parametrize("collective", sorted(cmd_simulate.COLLECTIVE_ALGOS))
def test_each_collective_refuses_the_algorithms_it_does_not_run_on(collective, capsys):
    """An algorithm a collective has no model for is refused up front, naming what it does run on;
    every name the error offers runs."""
    offered, trees = cmd_simulate.COLLECTIVE_ALGOS[collective]
    refused = [a for a in cmd_simulate.SIM_ALGOS if a not in offered] + ([] if trees else ["two_level"])
    assert refused, collective
    for algo in refused:
        assert main(["simulate", collective, "--topology", "dgx-h100", "--algo", algo, "--sizes", "1K"]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"treecoll: error: --algo {algo!r}: {collective} runs on ") and err.count("\n") == 1
        assert "applies to" in err
    names = ",".join(offered + (("two_level",) if trees else ()))
    assert main(["simulate", collective, "--topology", "dgx-h100", "--algo", names, "--sizes", "1K", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["algos"] == names.split(",")


def _case(name):
    return validation.cases([FIXTURES / name])[0][0]


def test_validate_reads_both_formats_and_skips_with_reason(tmp_path):
    old = _case("v100pcie-4gpu-1node-allreduce-oldformat.txt")
    assert old.table.nranks == 4 and (old.table.rows[0].size, old.table.rows[0].out_of_place.time_us) == (8, 13.37)
    assert len(old.table.rows) == 25
    trunc = _case("a100-16gpu-2node-allreduce-aws-p4de-efa.txt")  # no device lines: the index's flags say it
    topo, desc, _ = validation.topology_for(trunc)
    assert desc == "2 x a100-sxm (8 GPUs each), NICs 4x100G-efa" and len(topo.gpus()) == 16
    assert trunc.table.rows[-1].size == 2147483648 and trunc.table.rows[-1].out_of_place.time_us == 51406.0
    odd = tmp_path / "odd.txt"
    odd.write_text("# machine: a toaster\n        8     2   float  sum  -1  1.0  0.0  0.0  0  1.0  0.0  0.0  0\n")
    d = validation.validate([odd])
    assert "the file does not say the machine" in d["files"][0]["reason"]
    assert "--hosts N --gpus-per-host G --gpu MODEL" in d["files"][0]["reason"]


def test_validation_offers_nvls_where_nccl_does():
    """DGX H100 (NVSwitch, sm 90): NVLSTree wins at 1 GiB, as NCCL's tuner picks it; the GH200 quad's
    direct NVLinks (a stand-in switch with multicast: false) and NCCL_ALGO=Ring leave it out."""
    h100 = _case("h100-16gpu-2node-allreduce.txt")
    topo = validation.topology_for(h100)[0]
    algos = validation.algorithms(h100, "allreduce", topo)[0]
    assert algos == ["ring", "tree", "nvls"]
    t, label = validation.predict(topo, "allreduce", 1 << 30, ["ring", "nvls"], "auto")
    assert label == "nvls_tree/nccl-nvls" and (1 << 30) / t / 1e9 * 30 / 16 > 440
    # NCCL's own estimate leaves out its pipeline fill (3% at 1 GiB); the model's run time adds it as the simulator does
    assert validation.nccl_model_time(topo, "allreduce", 1 << 30, algos) == pytest.approx(t, rel=0.04)
    run = nccl_predict(topo, None, 1 << 30, algo="nvls")["run_time_us"] * 1e-6
    assert run == pytest.approx(t, rel=0.01)
    ring = _case("h100-16gpu-2node-allreduce-ring.txt")
    assert validation.algorithms(ring, "allreduce", validation.topology_for(ring)[0])[0] == ["ring"]
    gh = _case("gh200-8gpu-2node-allreduce-slingshot.txt")
    assert validation.algorithms(gh, "allreduce", validation.topology_for(gh)[0])[0] == ["ring", "tree"]


def test_validate_sim_is_the_command_over_folders(tmp_path):
    assert validate_sim.expand(["--json"])[-1] == "--json"
    assert len(validate_sim.expand([])) == len(list(FIXTURES.rglob("*.txt")))
    sub = tmp_path / "d"
    sub.mkdir()
    (sub / "b.txt").write_text("x")
    (sub / "a.txt").write_text("x")
    assert validate_sim.expand([str(sub), "--hosts", "2"]) == [str(sub / "a.txt"), str(sub / "b.txt"), "--hosts", "2"]


def test_decode_verdict_names_what_auto_means_in_each_mode():
    from treecoll.tools.cmd_simulate import decode_verdict

    r = {"auto": "gather", "speedup_auto_vs_ring": 50.0, "speedup_tree_vs_ring": 2.0, "mode": "executor"}
    assert decode_verdict(r) == [
        'auto (tree_decode\'s combine="auto"): gather, 50.0x faster than ring attention',
        "treecoll's tree combine: 2.0x faster than ring attention",
    ]
    inside = decode_verdict({**r, "auto": "tree", "mode": "in-kernel"})
    assert inside == [
        "fastest combine with the tree inside NCCL (tree_decode runs it from Python): tree, 50.0x faster than "
        "ring attention"
    ]
    assert decode_verdict({"auto": "allreduce3", "mode": "executor"}) == [
        'auto (tree_decode\'s combine="auto"): allreduce3'
    ]


def test_per_rank_collectives_run_the_sizes_nccl_tests_runs(capsys):
    """nccl-tests' size of allgather, reduce_scatter and alltoall is the whole buffer, rounded down to
    whole elements per rank (src/common.cu setupArgs, src/all_gather.cu AllGatherGetCollByteCount:
    recvcount = (count / nranks) * nranks): on 16 ranks of float32, 8 B is 0 B (not run) and 1000 B
    is 960 B. The table shows the size simulated and says which sizes were rounded."""
    argv = ["simulate", "allgather", "--ranks", "16", "--sizes", "8,1000,1024", "--algo", "ring"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["size"] for r in d["rows"]] == [960, 1024]
    assert d["rounded"] == [{"requested": 8, "size": 0}, {"requested": 1000, "size": 960}]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "# sizes as nccl-tests runs them (whole float32 elements on each of 16 ranks, rounded down): "
        "8 -> 0 (not run), 1000 -> 960\n" in out
    )
    assert main(["simulate", "allgather", "--ranks", "16", "--sizes", "8,16", "--algo", "ring"]) == 1
    assert capsys.readouterr().err == (
        "treecoll: error: --sizes: expected at least one size of 64 B or more (allgather on 16 ranks: whole "
        "float32 elements per rank), got 8, 16\n"
    )
