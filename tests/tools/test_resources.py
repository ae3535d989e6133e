"""Commands that start processes check them against this machine's cores and memory first."""

from __future__ import annotations

import pytest
from treecoll.tools import cmd_decode, resources
from treecoll.tools.cli import main
from treecoll.tools.units import UsageError

GIB = 1 << 30


def test_limits_exactly_at_the_edges():
    base = resources.PROCESS_BASELINE_BYTES
    # cores: 4 per core, the 4th per core still fine
    assert resources.check_processes(12, option="x", cores=3, memory=100 * GIB)["max_processes"] == 12
    with pytest.raises(UsageError, match=r"^x: expected at most 12 processes on this machine \(3 cores x 4 per core\)"):
        resources.check_processes(13, option="x", cores=3, memory=100 * GIB)
    # memory: baseline + data per process + extra once, compared with what is available
    need = 4 * (base + GIB) + 2 * GIB
    plan = resources.check_processes(4, option="x", per_process_bytes=GIB, extra_bytes=2 * GIB, cores=2, memory=need)
    assert plan["memory_needed_bytes"] == need
    with pytest.raises(UsageError, match=r"in one of them\); pass --oversubscribe to start them anyway$"):
        resources.check_processes(4, option="x", per_process_bytes=GIB, extra_bytes=2 * GIB, cores=2, memory=need - 1)
    # --oversubscribe: both limits waived, the numbers still reported
    plan = resources.check_processes(1000, option="x", cores=2, memory=GIB, oversubscribe=True)
    assert plan["oversubscribe"] and plan["memory_needed_bytes"] == 1000 * base


def test_machine_readings_are_sane():
    import os

    assert 1 <= resources.usable_cores() <= (os.cpu_count() or 1)
    mem = resources.available_memory()
    assert mem is None or mem > 0


def _no_processes(monkeypatch):
    """Fail the test if anything tries to start the ranks."""
    from treecoll.collectives import launch

    def refuse(*a, **k):
        raise AssertionError("processes were started")

    monkeypatch.setattr(launch.RankPool, "__init__", refuse)
    monkeypatch.setattr(cmd_decode, "decode_data", refuse)


def test_decode_nproc_1000_is_refused_before_any_process(capsys, monkeypatch):
    _no_processes(monkeypatch)
    monkeypatch.setattr(resources, "usable_cores", lambda: 2)
    assert main(["decode", "--nproc", "1000"]) == 1
    assert capsys.readouterr().err == (
        "treecoll: error: --nproc 1000: expected at most 8 processes on this machine "
        "(2 cores x 4 per core); pass --oversubscribe to start them anyway\n"
    )


def test_decode_that_does_not_fit_in_memory_is_refused(capsys, monkeypatch):
    _no_processes(monkeypatch)
    monkeypatch.setattr(resources, "usable_cores", lambda: 64)
    monkeypatch.setattr(resources, "available_memory", lambda: 16 * GIB)
    # 1M tokens, 2 layers, 8 kv heads x 128, bf16: 8.2 GB of K/V in all, a quarter per rank, the whole on rank 0
    assert main(["decode", "--nproc", "4", "--seq-len", "1M"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "treecoll: error: --nproc 4: expected processes that fit in the 16 GiB of memory available, got an estimated "
    ) and err.endswith("; pass --oversubscribe to start them anyway\n")
    cfg = {
        "seq_len": 10**6,
        "batch": 1,
        "layers": 2,
        "heads": 32,
        "kv_heads": 8,
        "head_dim": 128,
        "new_tokens": 16,
        "dtype": "bfloat16",
        "block_size": 256,
        "methods": ["tree", "ring", "allreduce3"],
        "check": True,
    }
    est = cmd_decode.memory_estimate(cfg, 4)
    tokens = 10**6 + 16 + 1
    per_token = 2 * 8 * 128 * 2  # K and V, one layer
    # rank 0 holds blocks 0, 4, 8, ... of 256 tokens: one per whole cycle of 4 blocks, and the first of the rest
    full, rest = divmod(tokens, 1024)
    assert est["cache_per_rank"] == 2 * per_token * (full * 256 + min(rest, 256))
    assert est["reference"] == 2 * per_token * tokens + 8 * 4 * 32 * 130
    assert est["transient_per_rank"] == est["cache_per_rank"] + 8 * 4 * 32 * 130  # ring: 2 of 2 layers' shards


def test_oversubscribe_lets_it_start(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(resources, "usable_cores", lambda: 1)
    monkeypatch.setattr(cmd_decode, "decode_data", lambda cfg, nproc, timeout: started.append(nproc) or {})
    monkeypatch.setattr(cmd_decode, "render", lambda d: "")
    assert main(["decode", "--nproc", "6", "--seq-len", "64", "--oversubscribe"]) == 0
    assert started == [6]


def test_emu_run_checks_its_ranks_before_creating_anything(capsys, monkeypatch):
    from treecoll.tools.emucluster import netns, runner

    monkeypatch.setattr(resources, "usable_cores", lambda: 2)
    monkeypatch.setattr(runner, "run", lambda *a, **k: pytest.fail("ranks were started"))
    monkeypatch.setattr(netns, "create", lambda *a, **k: pytest.fail("a cluster was created"))
    assert main(["emu", "run", "--hosts", "2", "--ranks-per-host", "5", "--", "true"]) == 1
    assert capsys.readouterr().err == (
        "treecoll: error: --hosts 2 x --ranks-per-host 5 = 10 processes: expected at most 8 processes on this "
        "machine (2 cores x 4 per core); pass --oversubscribe to start them anyway\n"
    )


@pytest.mark.parametrize(
    "module, argv, msg",
    [
        ("treecoll.tools.bench_collectives", ["--procs", "2", "9"], "--procs 9: expected at most 8 processes"),
        (
            "treecoll.tools.bench_tree_attention",
            ["--nprocs", "9", "--tokens", "1k"],
            "--nprocs 9: expected at most 8 processes",
        ),
        ("treecoll.tools.bench_emucluster", ["--shapes", "3x3"], "--shapes 3x3: expected at most 8 processes"),
        (
            "treecoll.tools.bench_emucluster_decode",
            ["--shapes", "2x2,1x9"],
            "--shapes 1x9: expected at most 8 processes",
        ),
    ],
)
def test_benchmarks_check_their_process_counts(capsys, monkeypatch, module, argv, msg):
    import importlib

    from treecoll.tools.cli import script_main

    monkeypatch.setattr(resources, "usable_cores", lambda: 2)
    mod = importlib.import_module(module)
    assert script_main(mod.main, argv) == 1
    out, err = capsys.readouterr()
    assert msg in err and err.count("\n") == 1 and "Traceback" not in err
