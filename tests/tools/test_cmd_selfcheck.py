"""``treecoll selfcheck``: the CPU run (real processes), its JSON, and a failing path making the exit non-zero."""

import json

import pytest
from treecoll.collectives.builders import BUILDERS
from treecoll.collectives.planner import ALGOS
from treecoll.tools import cmd_selfcheck
from treecoll.tools.cli import main

ROW_KEYS = {"path", "backend", "device", "result", "seconds", "detail"}


@pytest.fixture(scope="module")
def cpu_run():
    """One full run on this machine (kernels, 4 gloo processes, generate over 2, the CUDA paths skipped
    without a GPU)."""
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        code = main(["selfcheck", "--json"])
    return code, json.loads(buf.getvalue())


def test_cpu_run_passes_every_available_path(cpu_run):
    code, d = cpu_run
    failed = [r for r in d["rows"] if r["result"] == "failed"]
    assert code == 0 and d["ok"] is True and failed == []
    assert d["counts"]["passed"] + d["counts"]["skipped"] == len(d["rows"]) and d["counts"]["failed"] == 0
    got = {(r["path"], r["backend"], r["device"]): r for r in d["rows"]}
    # the CPU kernels against the float64 reference, each backend one row
    for backend in ("native", "torch", "triton"):
        r = got[("kernel decode_partial", backend, "cpu")]
        assert r["result"] in ("passed", "skipped") and (r["result"] == "passed" or r["detail"]), r
    assert got[("kernel decode_partial", "torch", "cpu")]["result"] == "passed"
    # the simulator's C event loop against its Python loop
    r = got[("simulator event loop", "native", "cpu")]
    assert r["result"] == "passed" or (r["result"] == "skipped" and "the Python loop runs instead" in r["detail"]), r
    # the executor: every builder and every allreduce algorithm over gloo
    for b in BUILDERS:
        assert got[(f"executor {b}", "gloo", "cpu")]["result"] == "passed"
    for a in ALGOS:
        if a not in ("auto", "tree"):
            assert got[(f"executor algo={a}", "gloo", "cpu")]["result"] == "passed"
    # tree_decode over groups of 2, 3 and 4 processes, every combine
    for p in (2, 3, 4):
        r = got[(f"tree_decode P={p}", "gloo", "cpu")]
        assert r["result"] == "passed" and all(m in r["detail"] for m in cmd_selfcheck.DECODE_METHODS), r
    # model.generate() with tree attention over 2 processes against one process, greedy and sampled
    for mode in ("greedy", "sampled"):
        r = got[(f"generate ({mode})", "gloo", "cpu")]
        assert r["result"] == "passed" and "equal one-process generate()" in r["detail"], r
    import torch

    cuda = [r for r in d["rows"] if r["device"] == "cuda"]
    assert cuda and (torch.cuda.is_available() or all(r["result"] == "skipped" for r in cuda))


def test_json_shape(cpu_run):
    _, d = cpu_run
    assert set(d) == {"rows", "counts", "ok", "seconds", "machine"}
    assert set(d["counts"]) == set(cmd_selfcheck.RESULTS)
    for r in d["rows"]:
        assert set(r) == ROW_KEYS and r["result"] in cmd_selfcheck.RESULTS and r["seconds"] >= 0
        assert r["result"] == "passed" or r["detail"], r  # a skip or a failure says why
    assert {"torch", "cuda_devices", "platform"} <= set(d["machine"])


def _broken_torch_backend(q, k, v, lengths, scale, num_splits, out, block_table):
    from treecoll.attention.decode_cpu import decode_torch

    o, lse = decode_torch(q, k, v, lengths, scale, num_splits=1, out=out, block_table=block_table)
    return o * 1.001, lse  # 1e-3 off: beyond float32's 1e-5, within bf16's 1e-2


def test_a_broken_kernel_fails_the_command(monkeypatch, capsys):
    """A kernel 1e-3 off fails the float32 cases (tolerance 1e-5) and passes the 16-bit ones (1e-2):
    the row names the float32 case, the exit code is 1, the text says so."""
    from treecoll.attention import decode as decode_mod
    from treecoll.attention.decode_gpu import selfcheck_cases

    monkeypatch.setitem(decode_mod.DECODE_BACKENDS, "torch", _broken_torch_backend)
    cases = [c for c in selfcheck_cases() if c["name"] in ("llama8b-b1-8k", "llama8b-b1-32k-fp32")]
    monkeypatch.setitem(
        cmd_selfcheck.CHECKS,
        "kernels",
        (
            ("kernel decode_partial", "torch", "cpu"),
            lambda a: [cmd_selfcheck._check_kernel_cases("torch", "cpu", cases)],
        ),
    )
    assert main(["selfcheck", "--only", "kernels", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    (r,) = d["rows"]
    assert d["ok"] is False and r["result"] == "failed"
    assert r["detail"].startswith("llama8b-b1-32k-fp32: max rel err 1.0e-03 > 1e-05"), r
    assert "llama8b-b1-8k" not in r["detail"]
    assert main(["selfcheck", "--only", "kernels"]) == 1
    assert "0 passed, 1 failed, 0 skipped" in capsys.readouterr().out


def test_a_group_that_cannot_run_is_one_failed_row(monkeypatch, capsys):
    def boom(args):
        raise RuntimeError("no such backend")

    monkeypatch.setitem(cmd_selfcheck.CHECKS, "gloo", (("executor and tree_decode", "gloo", "cpu"), boom))
    assert main(["selfcheck", "--only", "gloo", "--json"]) == 1
    (r,) = json.loads(capsys.readouterr().out)["rows"]
    assert (r["path"], r["result"], r["detail"]) == (
        "executor and tree_decode",
        "failed",
        "RuntimeError: no such backend",
    )


def _native_loop_off_by(monkeypatch, dt):
    from treecoll.collectives.sim import engine_native

    real = engine_native.run_native

    def shifted(engine):
        fields = real(engine)
        if fields is not None:
            fields["makespan"] += dt
        return fields

    monkeypatch.setattr(engine_native, "run_native", shifted)


def test_simulator_loop_row_passes_and_fails_on_the_last_bit(monkeypatch, capsys):
    """The simulator group compares the C loop with the Python loop to the last bit: 1e-15 s on one
    run's time fails it, naming the run; without the library the row is skipped with the reason."""
    from treecoll.collectives.sim import engine_native

    if not engine_native.native_status()["available"]:
        pytest.skip("the C event loop cannot be built here")
    assert main(["selfcheck", "--only", "simulator", "--json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)["rows"]
    assert r["result"] == "passed" and "= the Python loop to the last bit" in r["detail"], r
    with monkeypatch.context() as mp:
        _native_loop_off_by(mp, 1e-15)
        assert main(["selfcheck", "--only", "simulator", "--json"]) == 1
    (r,) = json.loads(capsys.readouterr().out)["rows"]
    assert r["result"] == "failed" and r["detail"].startswith("the C loop differs from the Python loop on "), r
    with monkeypatch.context() as mp:
        mp.setattr(engine_native, "_STATE", {"error": "no C compiler: 'cc' is not on PATH"})
        assert main(["selfcheck", "--only", "simulator", "--json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)["rows"]
    assert (r["result"], r["detail"]) == ("skipped", "the Python loop runs instead: no C compiler: 'cc' is not on PATH")


def test_generate_hook_is_used_when_installed(monkeypatch, capsys):
    import sys
    import types

    mod = types.ModuleType("fake_generate")
    mod.selfcheck = lambda nproc: [cmd_selfcheck.row("generate", "gloo", "cpu", "passed", 0.5, f"{nproc} procs")]
    monkeypatch.setitem(sys.modules, "fake_generate", mod)
    monkeypatch.setattr(cmd_selfcheck, "GENERATE_HOOK", "fake_generate:selfcheck")
    assert main(["selfcheck", "--only", "generate", "--json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)["rows"]
    assert (r["result"], r["detail"]) == ("passed", "2 procs")


@pytest.mark.parametrize(
    "argv, msg",
    [
        (
            ["--only", "kernels,bogus"],
            "--only: expected a comma list of kernels, simulator, gloo, generate, cuda, got 'kernels,bogus'",
        ),
        (["--nproc", "1"], "--nproc: expected an integer >= 2, got 1"),
        (["--timeout", "0"], "--timeout"),
    ],
)
def test_bad_options_are_one_line(capsys, argv, msg):
    assert main(["selfcheck", *argv]) == 1
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
