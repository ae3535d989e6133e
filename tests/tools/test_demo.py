"""`make demo` prints, for every case it shows, the number the matching `treecoll` command prints."""

from __future__ import annotations

import json

import pytest
from treecoll.tools import demo_decode
from treecoll.tools.cli import main

from treecoll import topo


def _demo_and_cli(capsys, argv, case, step, topology) -> tuple[dict, str]:
    """(the command's --json data, the demo step's text), after checking that the demo's
    computation gives exactly the command's data and the step shows the command line."""
    assert main(list(argv) + ["--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert case(topology) == cli
    step({"topology": topology})
    out = capsys.readouterr().out
    assert out.startswith("$ treecoll " + " ".join(argv) + "\n")
    return cli, out


@pytest.fixture(scope="module")
def default():
    return topo.default()


def test_tree_section_is_tree_build(capsys, default):
    cli, out = _demo_and_cli(capsys, demo_decode.TREE_ARGV, demo_decode.tree_case, demo_decode.step_tree, default)
    p = cli["predicted"]
    assert (
        f"predicted for {demo_decode.STATE_BYTES} B, executor mode (treecoll's executor on nccl: "
        f"{p['step_cost_us']:.1f} us per message, flow simulation): reduce {p['reduce']['time_us']:.1f} us"
    ) in out
    assert f"allreduce {p['allreduce']['time_us']:.1f} us" in out


def test_simulated_section_is_simulate_decode(capsys, default):
    cli, out = _demo_and_cli(
        capsys, demo_decode.SIMULATE_ARGV, demo_decode.simulate_case, demo_decode.step_simulate, default
    )
    rows = out.split("ring/auto\n")[1].splitlines()[1 : 1 + len(cli["runs"])]
    for row, r in zip(rows, cli["runs"]):
        m = r["methods"]
        assert row.split() == [
            str(r["shape"]["seq_len"]),
            *(f"{m[name]['time_s'] * 1e6:.1f}" for name in ("tree", "gather", "allreduce3", "ring")),
            r["auto"],
            f"{r['speedup_auto_vs_ring']:.1f}",
        ]
        # auto is the fastest combine the command prints, and its ratio is ring's step over it
        combines = {name: m[name]["time_s"] for name in ("tree", "gather", "allreduce3")}
        assert r["auto"] == min(combines, key=combines.get)
        assert r["speedup_auto_vs_ring"] == pytest.approx(m["ring"]["time_s"] / combines[r["auto"]], rel=1e-12)
    # the same tree allreduce appears in both sections, the same number
    tree_cli = json.loads((main(list(demo_decode.TREE_ARGV) + ["--json"]), capsys.readouterr().out)[1])
    assert all(
        r["methods"]["tree"]["combine_s"] * 1e6
        == pytest.approx(tree_cli["predicted"]["allreduce"]["time_us"], rel=1e-9)
        for r in cli["runs"]
    )
    assert "executor mode" in out


def test_the_demo_decode_is_checked_like_the_command(monkeypatch):
    """The real decode of the demo passes the process and memory check of `treecoll decode` first."""
    from treecoll.tools import cmd_decode, resources

    monkeypatch.setattr(resources, "usable_cores", lambda: 1)
    monkeypatch.setattr(resources, "available_memory", lambda: 1 << 30)
    monkeypatch.setattr(cmd_decode, "decode_data", lambda *a, **k: pytest.fail("processes were started"))
    with pytest.raises(resources.UsageError, match=r"^--nproc 4: expected processes that fit in the 1 GiB"):
        demo_decode.step_decode({})
