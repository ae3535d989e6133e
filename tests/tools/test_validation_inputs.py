"""simulate validate / calibrate: what the user gives is counted as given, no row or file silently
left out or counted twice."""

from __future__ import annotations

import json
from pathlib import Path

from treecoll.tools.cli import main

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl-tests"


def test_a_row_cut_mid_line_is_named_not_left_out_quietly(tmp_path, capsys):
    """A table pasted up to the middle of its 2048 B row: the rows before it are predicted, and the cut
    row is named (its line, why) in the text and the JSON, not left out without a word."""
    text = (FIX / "a100-4gpu-1node-allreduce.txt").read_text()
    cut = text.index("           2048") + len("           2048           512     float     sum      -1    15.01")
    f = tmp_path / "cut.txt"
    f.write_text(text[:cut])
    line = text[:cut].count("\n") + 1
    assert main(["simulate", "validate", str(f), "--json"]) == 0
    e = json.loads(capsys.readouterr().out)["files"][0]
    assert [r["size"] for r in e["rows"]] == [8 << i for i in range(8)]
    note = f"line {line}: a row left out: row ends after 6 of 13 columns (cut mid-line?)"
    assert note in e["warnings"]
    assert main(["simulate", "validate", str(f)]) == 0
    assert f"   note: {note}\n" in capsys.readouterr().out


def test_a_file_given_twice_is_refused_not_counted_twice(tmp_path, capsys):
    """'total over 2 tables' for one file named twice (overlapping globs, a path written two ways) would
    weigh it twice in the pooled errors and in a calibration fit."""
    f = FIX / "a100-4gpu-1node-allreduce.txt"
    other = FIX.parent / "nccl-tests" / ".." / "nccl-tests" / f.name
    for cmd in (["simulate", "validate"], ["simulate", "calibrate", "-o", str(tmp_path / "p.yaml")]):
        assert main([*cmd, str(f), str(other)]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err == f"treecoll: error: {other}: the same file as {f}, given before; name each file once\n"
