"""Every number the tool prints for one case is the number every other command prints for it, and
a command's text shows what its ``--json`` holds, under a label that says which model made it.

Covered elsewhere, not repeated: ``tree build`` against ``simulate allreduce`` and ``simulate
decode`` for the 16512 B state on the default topology (tests/collectives/test_predictor.py
``test_commands_print_one_number_per_case``), ``make demo`` against the commands it quotes
(tests/tools/test_demo.py). Here: the shipped machines of one and two hosts and the NVL72 rack,
8 B to 16 MiB, both modes; the tree file commands, ``simulate links``, the decode model's other
combines, ``tree bruteforce``; text against JSON. In-process through ``cli.main`` (fast).
"""

from __future__ import annotations

import functools
import json
import re

import pytest
from treecoll.tools.cli import main

from treecoll import topo

#: (topology, sizes): few sizes per topology keep this file fast; together 8 B, 64 KiB, 1 MiB, 16 MiB
CASES = [
    ("default", (8, 64 << 10, 1 << 20, 16 << 20)),
    ("dgx-h100", (64 << 10, 16 << 20)),
    ("pcie-8gpu", (8, 1 << 20)),
    ("gb200-nvl72", (1 << 20,)),
]
MODES = ("executor", "in-kernel")


def _run(capsys, *argv) -> tuple[dict, str]:
    """(``--json`` data, text) of one command, each from its own run."""
    argv = [str(a) for a in argv]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    return data, capsys.readouterr().out


def _us(x: float) -> str:
    return f"{x:.1f} us"


@functools.cache
def _mem_bw(name: str) -> float:
    from treecoll.collectives.sim.result import mem_bw_of

    t = topo.resolve(name)
    return min(mem_bw_of(t, t.rank_gpus()))


def _predicted_text(p: dict) -> list[str]:
    """The pieces of tree build / show / check text that show ``predicted`` (the JSON)."""
    pieces = [f"{c} {_us(p[c]['time_us'])} (" for c in ("reduce", "broadcast", "allreduce") if c in p]
    if "nccl" in p:
        pieces.append(
            "NCCL's own allreduce (its tuning model): "
            + ", ".join(f"{a} {v['proto']} {_us(v['time_us'])}" for a, v in p["nccl"].items())
        )
    pieces.append(f"allreduce lower bound {_us(p['lower_bound_allreduce_us'])}")
    if "cost_model_allreduce_us" in p:
        pieces.append(f"collectives.cost: allreduce {_us(p['cost_model_allreduce_us'])}")
    return pieces


def _table_cells(text: str, data: dict) -> None:
    """The ``simulate <collective>`` table's rows are the JSON's, at the printed precision."""
    rows = [ln for ln in text.splitlines() if re.match(r"^\s+\d+ \|", ln)]
    assert len(rows) == len(data["rows"])
    for ln, r in zip(rows, data["rows"]):
        cells = [c.split() for c in ln.split("|")]
        assert cells[0] == [str(r["size"])]
        for a, c in zip(data["algos"], cells[1:]):
            v = r["algos"][a]
            assert c == [f"{v['time_us']:.1f}", f"{v['algbw']:.2f}", f"{v['busbw']:.2f}"], (a, ln)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("name", "sizes"), CASES)
def test_tree_build_and_simulate_allreduce_print_the_same_numbers(capsys, name, sizes, mode):
    """Per size: tree build's allreduce of two_level is simulate's two_level column, the least of
    its NCCL tuning-model times is simulate's ``nccl`` column with that algorithm and protocol (and
    the ``auto`` column where it hands the allreduce to NCCL), its reduce and broadcast are simulate
    reduce's and broadcast's two_level columns, and each command's text shows its JSON; simulate's
    ``ring``/``tree`` columns (flow simulation) and ``nccl`` (tuning model) are labelled apart."""
    sizes_arg = ",".join(map(str, sizes))
    sim, sim_text = _run(
        capsys,
        "simulate",
        "allreduce",
        "--topology",
        name,
        "--algo",
        "ring,tree,two_level,auto,nccl",
        "--sizes",
        sizes_arg,
        "--mode",
        mode,
    )
    _table_cells(sim_text, sim)
    predicted = {}
    assert "# ring, tree: NCCL's algorithms, in-kernel, flow simulation" in sim_text
    assert "# nccl: what NCCL's tuner picks, by its tuning model (not simulated)" in sim_text
    for row in sim["rows"]:
        n = row["size"]
        built, text = _run(
            capsys, "tree", "build", "--topology", name, "--builder", "two_level", "--bytes", n, "--mode", mode
        )
        p = built["predicted"]
        for piece in _predicted_text(p):
            assert piece in text, piece
        cell = row["algos"]
        assert p["allreduce"]["time_us"] == cell["two_level"]["time_us"]
        if mode == "executor":  # one per-message cost, printed alike
            assert p["step_cost_us"] == sim["executor"]["step_cost_us"]
            each = f"treecoll's executor on {p['backend']}: {p['step_cost_us']:.1f} us per message"
            assert each in text and each in sim_text
        best = min(p["nccl"], key=lambda a: p["nccl"][a]["time_us"])
        assert p["nccl"][best]["time_us"] == pytest.approx(cell["nccl"]["time_us"], rel=1e-12)
        assert cell["nccl"]["how"] == f"{best}/{p['nccl'][best]['proto']}"
        if cell["auto"]["how"] == "nccl all_reduce":  # auto hands the allreduce to NCCL: NCCL's own number
            assert cell["auto"]["time_us"] == pytest.approx(cell["nccl"]["time_us"], rel=1e-12)
        predicted[n] = p
    # tree build's reduce and broadcast (printed for one root: not for one tree per rail) are simulate
    # reduce's and broadcast's two_level columns
    one_root = ",".join(str(n) for n, p in predicted.items() if "reduce" in p)
    for coll in ("reduce", "broadcast") if one_root else ():
        other, _ = _run(
            capsys, "simulate", coll, "--topology", name, "--algo", "two_level", "--sizes", one_root, "--mode", mode
        )
        for row in other["rows"]:
            assert row["algos"]["two_level"]["time_us"] == predicted[row["size"]][coll]["time_us"], (coll, row["size"])


@pytest.mark.parametrize("mode", MODES)
def test_tree_show_and_check_print_what_tree_build_printed(capsys, tmp_path, mode):
    """The tree file tree build writes: tree show and tree check predict it as tree build did (the same
    JSON, the same text), and tree check's ``auto`` is tree build --builder auto's allreduce (in-kernel:
    simulate's auto column too)."""
    f = tmp_path / "auto.yaml"
    case = ("--topology", "pcie-8gpu", "--bytes", 1 << 20, "--mode", mode)
    built, text = _run(capsys, "tree", "build", "--builder", "auto", *case, "-o", f)
    shown, shown_text = _run(capsys, "tree", "show", f, *case)
    checked, checked_text = _run(capsys, "tree", "check", f, *case)
    assert shown["predicted"] == checked["predicted"] == built["predicted"]
    pieces = _predicted_text(built["predicted"])
    assert all(x in shown_text and x in checked_text for x in pieces)
    assert checked["auto"]["allreduce_us"] == built["predicted"]["allreduce"]["time_us"]
    assert checked["ratio_to_auto"] == 1.0
    assert f"allreduce {_us(checked['auto']['allreduce_us'])}; this tree is 1.00x of it" in checked_text
    assert "the auto builder's tree (" in checked_text  # in executor mode not simulate's auto column
    if mode == "in-kernel":  # where simulate's auto column is the auto builder's tree too
        sim, _ = _run(capsys, "simulate", "allreduce", "--algo", "auto", "--sizes", 1 << 20, *case[:2], *case[4:])
        assert sim["rows"][0]["algos"]["auto"]["time_us"] == checked["auto"]["allreduce_us"]


def test_simulate_links_is_the_in_kernel_column(capsys):
    """simulate links runs the algorithm simulate allreduce runs in-kernel (NCCL's ring and tree, a
    tree builder's tree), the same time, and its text shows its JSON."""
    n = 1 << 20
    sim, _ = _run(
        capsys,
        "simulate",
        "allreduce",
        "--topology",
        "default",
        "--algo",
        "ring,tree,two_level",
        "--sizes",
        n,
        "--mode",
        "in-kernel",
    )
    for algo in ("ring", "tree", "two_level"):
        links, text = _run(capsys, "simulate", "links", "--topology", "default", "--algo", algo, "--size", n)
        assert links["time_us"] == sim["rows"][0]["algos"][algo]["time_us"], algo
        assert links["profile"] == sim["rows"][0]["algos"][algo]["how"]
        assert f": {_us(links['time_us'])}, busbw {links['busbw']:.2f} GB/s ({links['profile']}, in-kernel" in text


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["default", "pcie-8gpu"])
def test_decode_combines_are_the_collectives_the_commands_print(capsys, name, mode):
    """simulate decode's combines for the 4 b H (D + 1) B packed state (b 1, H 32, D 128): the tree is
    tree build's allreduce of the same tree (one tree, no rails) in the same mode; gather is simulate
    allgather's ring of the P states plus the local merge ((P + 1) states read and written at the GPU's
    memory bandwidth); allreduce3 is three of NCCL's allreduces (max and denominators of 4 b H B, numerators
    of 4 b H D B), each the fastest of simulate allreduce's ring, tree and nvls columns; the text shows the
    JSON."""
    state = 4 * 32 * 129
    dec, text = _run(
        capsys,
        "simulate",
        "decode",
        "--topology",
        name,
        "--seq-len",
        "32k",
        "--heads",
        32,
        "--kv-heads",
        8,
        "--head-dim",
        128,
        "--mode",
        mode,
    )
    r = dec["runs"][0]
    P, m = r["nranks"], r["methods"]
    for k, v in m.items():
        assert re.search(
            rf"^{k} +{v['time_s'] * 1e6:.1f} +{v['local_s'] * 1e6:.1f} +{v['combine_s'] * 1e6:.1f} ", text, re.M
        ), k
    built, _ = _run(
        capsys,
        "tree",
        "build",
        "--topology",
        name,
        "--builder",
        "two_level",
        "--rails",
        "no",
        "--bytes",
        state,
        "--mode",
        mode,
    )
    assert m["tree"]["combine_s"] * 1e6 == pytest.approx(built["predicted"]["allreduce"]["time_us"], rel=1e-12)
    gather, _ = _run(capsys, "simulate", "allgather", "--topology", name, "--algo", "ring", "--sizes", P * state)
    merge_us = (P + 1) * state / _mem_bw(name) * 1e6  # mem_bw_of: B/s
    ring_us = gather["rows"][0]["algos"]["ring"]["time_us"]
    assert m["gather"]["combine_s"] * 1e6 == pytest.approx(ring_us + merge_us, rel=1e-12)
    nvls = ",nvls" if "nvls" in built["predicted"]["nccl"] else ""
    ar, _ = _run(
        capsys, "simulate", "allreduce", "--topology", name, "--algo", f"ring,tree{nvls}", "--sizes", "128,16384"
    )
    fastest = {row["size"]: min(v["time_us"] for v in row["algos"].values()) for row in ar["rows"]}
    assert m["allreduce3"]["combine_s"] * 1e6 == pytest.approx(2 * fastest[128] + fastest[16384], rel=1e-12)
    assert "gather and allreduce3: NCCL's own collectives, its fastest algorithm in the flow simulation" in text


def test_bruteforce_says_which_model_its_numbers_are(capsys):
    """tree bruteforce's times are the closed-form cost model auto's search scores (not tree build's flow
    simulation nor its stepped-through cost model): its text says so and shows its JSON."""
    from treecoll.collectives.builders import build
    from treecoll.collectives.cost import CostModel

    t = topo.resolve("pcie-8gpu")
    gpus = t.rank_gpus()[:4]
    data, text = _run(capsys, "tree", "bruteforce", "--topology", "pcie-8gpu", "--ranks", 4, "--sizes", "8,1M")
    model = CostModel(t, gpus)
    assert "closed-form cost model" in text
    for r in data["rows"]:
        auto = build("auto", t, gpus, nbytes=r["bytes"], model=model)
        assert r["auto_us"] == model.best_nchunks(auto, r["bytes"])[1] * 1e6
        assert f"brute force {r['brute_force_us']:.3f} us" in text and f"auto {r['auto_us']:.3f} us" in text
