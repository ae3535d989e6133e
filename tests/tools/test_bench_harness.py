"""treecoll.tools.bench.harness: the options, timing order, JSON record and plot every benchmark shares."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from treecoll.tools.bench import emulated
from treecoll.tools.bench.harness import Benchmark, interleaved, paired_ratio, summary
from treecoll.tools.units import UsageError

REPO = Path(__file__).resolve().parents[2]


def test_interleaved_rounds_setup_hooks_and_combine():
    log = []
    times = interleaved(
        {"a": lambda x: log.append(("a", x)), "b": lambda: log.append(("b", None))},
        {"a": 3, "b": 1},
        warmup=1,
        setup={"a": lambda: len(log)},
        before=lambda n: log.append(("before", n)),
        after=lambda n: log.append(("after", n)),
        combine=lambda t: [[2.0 * len(row)] * len(row) for row in t],
    )
    calls = [c for c in log if c[0] in "ab"]
    # one warm-up each, then round 1 (a, b), then a alone; setup's result reaches the case
    assert [c[0] for c in calls] == ["a", "b", "a", "b", "a", "a"]
    assert [x for name, x in calls if name == "a"] == [0, 6, 12, 15]  # 3 log lines per call before
    assert log[:3] == [("before", "a"), ("a", 0), ("after", "a")]
    assert times == {"a": [6.0, 6.0, 6.0], "b": [2.0]}


def test_paired_ratio_and_summary():
    assert paired_ratio([1.0, 10.0, 3.0], [2.0, 5.0, 3.0]) == 1.0  # ratios 0.5, 2, 1
    assert summary([0.3, 0.1, 0.2, 0.4]) == {"median": 0.25, "min": 0.1, "reps": 4}
    with pytest.raises(UsageError, match=r"^paired_ratio: expected two equally long, non-empty series, got 2 and 1$"):
        paired_ratio([1.0, 2.0], [1.0])


def test_options_aliases_and_json_record(tmp_path, capsys):
    bench = Benchmark(
        "bench_x",
        "What it measures.\n\nDetails.",
        repeats=4,
        json="x.json",
        plot="x.png",
        quick="small run",
        aliases={"--repeats": ["--reps"], "--json": ["--json-out"]},
    )
    out = tmp_path / "sub" / "r.json"
    args = bench.parse(["--reps", "7", "--json-out", str(out), "--quick", "--plot", ""])
    assert (args.repeats, args.json, args.quick, args.plot) == (7, str(out), True, "")
    assert bench.parser.description == "What it measures."
    assert bench.write_json({"rows": [1, 2]}, args.json) == out
    assert capsys.readouterr().out == f"wrote {out}\n"
    data = json.loads(out.read_text())
    assert data["rows"] == [1, 2]
    meta = data["meta"]
    assert meta["benchmark"] == "bench_x"
    assert meta["command"] == f"python -m treecoll.tools.bench_x --reps 7 --json-out {out} --quick --plot ''"
    assert meta["machine"]["cores"] == os.cpu_count() and meta["machine"]["memory_bytes"] > 0
    assert meta["machine"]["cpu"] and meta["date"].endswith("+00:00")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert meta["git_commit"].split("+")[0] == head
    assert bench.write_json({}, "") is None and bench.plot("", lambda ax: None) == "no --plot"
    with pytest.raises(UsageError, match=r"^--repeats: expected a positive integer, got 0$"):
        bench.parse(["--repeats", "0"])


def test_plot_writes_the_figure(tmp_path):
    pytest.importorskip("matplotlib")
    bench = Benchmark("bench_x", "x", plot="x.png")
    path = tmp_path / "p.png"
    assert bench.plot(path, lambda ax: ax.plot([1, 2], [3, 4])) is None
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_emulated_methods_are_checked(capsys):
    import argparse

    p = argparse.ArgumentParser(prog="bench")
    emulated.add_options(p, ("gloo", "ring"), rates="1gbit", timeout=9, op_timeout=3)
    args = p.parse_args(["--methods", "ring,tree"])
    with pytest.raises(SystemExit):
        emulated.parse_methods(p, args, ("gloo", "ring"))
    assert "--methods: expected names from ['gloo', 'ring'], got ['tree']" in capsys.readouterr().err
    with pytest.raises(emulated.Unavailable, match="no topology YAML"):
        emulated.load_topology(None)
