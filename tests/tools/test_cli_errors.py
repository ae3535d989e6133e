"""Bad input on the command line: one line on stderr naming what is wrong and where, exit code 1
(130 for Ctrl-C), never a traceback, and no file the user gave is lost or overwritten.

In-process through ``treecoll.tools.cli.main(argv)`` (fast); one subprocess test for Ctrl-C.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from treecoll.tools import cli
from treecoll.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def error(capsys, *argv) -> str:
    """The one error line of a failing command (asserts exit code 1, one line, no traceback)."""
    rc, out, err = run(capsys, *argv)
    assert rc == 1, (rc, out, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("treecoll: error: "), err
    return lines[0].removeprefix("treecoll: error: ")


@pytest.fixture
def files(tmp_path):
    d = {
        "dir": tmp_path / "adir",
        "missing_dir": tmp_path / "nodir",
        "keep": tmp_path / "keep.txt",
        "nonutf8": tmp_path / "nonutf8.yaml",
        "topo": tmp_path / "mine.yaml",
        "tree": tmp_path / "t.yaml",
    }
    d["dir"].mkdir()
    d["keep"].write_text("keep me\n")
    d["nonutf8"].write_bytes(b"\xff\xfe\x00bad")
    d["topo"].write_text((ROOT / "topologies" / "cpu-local.yaml").read_text())
    d["tree"].write_text("name: chain\nranks: 4\nparents: [-1, 0, 1, 2]\n")
    return d


# ------------------------------------------------------------------ files to write
@pytest.mark.parametrize(
    "argv, name",
    [
        (["topo", "export", "default", "--format", "yaml", "-o"], "x.yaml"),
        (["topo", "draw", "default", "-o"], "x.png"),
        (["tree", "build", "--topology", "default", "--builder", "chain", "-o"], "x.yaml"),
        (["simulate", "allreduce", "--topology", "cpu-local", "--sizes", "1K", "--plot"], "x.png"),
    ],
)
def test_output_into_missing_directory_or_onto_a_directory(capsys, files, argv, name):
    o = argv[-1]
    msg = error(capsys, *argv, files["missing_dir"] / name)
    missing = files["missing_dir"]
    assert msg == (
        f"{o} {missing / name}: expected an existing directory, got "
        f"{str(missing)!r} which does not exist; create it first (mkdir -p {missing})"
    )
    msg = error(capsys, *argv, files["dir"])
    assert msg.startswith(f"{o} {files['dir']}: expected a file name, got a directory; name a file inside it")
    msg = error(capsys, *argv, files["keep"] / name)
    assert msg == f"{o} {files['keep'] / name}: expected {str(files['keep'])!r} to be a directory, got a file"
    assert files["keep"].read_text() == "keep me\n" and not os.listdir(files["dir"])


def test_export_refuses_to_overwrite_its_own_input(capsys, files):
    before = files["topo"].read_text()
    msg = error(capsys, "topo", "export", files["topo"], "--format", "dot", "-o", files["topo"])
    assert msg == (
        f"-o {files['topo']}: expected a new file, got the input file {files['topo']} itself "
        "(writing would destroy it); choose another name"
    )
    assert files["topo"].read_text() == before


def test_output_replaces_an_existing_file_and_help_says_so(capsys, files):
    rc, out, _ = run(capsys, "topo", "export", "cpu-local", "--format", "json", "-o", files["keep"])
    assert rc == 0 and json.loads(files["keep"].read_text())["name"] == "cpu-local"
    assert not [p for p in files["keep"].parent.iterdir() if p.name.startswith(".keep.txt.")]  # no temp left
    for argv in (
        ["topo", "export", "--help"],
        ["topo", "draw", "--help"],
        ["tree", "build", "--help"],
        ["tree", "draw", "--help"],
    ):
        rc, out, _ = run(capsys, *argv)
        assert rc == 0 and cli.REPLACES in " ".join(out.split()), argv


@pytest.mark.parametrize("argv", [["topo", "draw", "default"], ["tree", "draw", "TREE"]])
def test_image_output_needs_an_image_suffix(capsys, files, argv):
    argv = [str(files["tree"]) if a == "TREE" else a for a in argv]
    msg = error(capsys, *argv, "-o", files["dir"].parent / "x.foo")
    assert msg.endswith(
        "expected a file name ending in .png, .svg, .pdf, .jpg, .jpeg, .eps, .ps, .tif, .tiff, .webp, got '.foo'"
    )
    msg = error(capsys, *argv, "-o", files["keep"])
    assert msg.endswith("got '.txt'") and files["keep"].read_text() == "keep me\n"


def test_tree_build_writes_json_for_a_json_name_and_rejects_other_suffixes(capsys, files, tmp_path):
    rc, _, _ = run(capsys, "tree", "build", "--topology", "cpu-local", "--builder", "chain", "-o", tmp_path / "t.json")
    assert rc == 0 and json.loads((tmp_path / "t.json").read_text())["parents"] == [-1, 0, 1, 2]
    msg = error(capsys, "tree", "build", "--topology", "cpu-local", "--builder", "chain", "-o", tmp_path / "t.txt")
    assert msg == f"-o {tmp_path / 't.txt'}: expected a file name ending in .yaml, .yml, .json, got '.txt'"


# ------------------------------------------------------------------ files to read
def test_tree_file_not_utf8_or_a_directory(capsys, files):
    assert error(capsys, "tree", "show", files["nonutf8"]) == (
        f"{files['nonutf8']}: cannot read tree file: expected UTF-8 text, got byte 0xff at offset 0; "
        "save the file as UTF-8"
    )
    assert error(capsys, "tree", "show", files["dir"]) == (
        f"{files['dir']}: cannot read tree file: expected a file, got a directory"
    )


# ------------------------------------------------------------------ numbers
@pytest.mark.parametrize(
    "argv, msg",
    [
        (
            ["tree", "build", "--topology", "default", "--builder", "chain", "--ranks", "0"],
            "--ranks: expected a positive integer, got 0",
        ),
        (
            ["tree", "build", "--topology", "default", "--builder", "chain", "--ranks", "-3"],
            "--ranks: expected a positive integer, got -3",
        ),
        (
            ["tree", "draw", "TREE", "--topology", "default", "-o", "OUT.png", "--max-hosts", "0"],
            "--max-hosts: expected a positive integer, got 0",
        ),
        (
            ["simulate", "links", "--topology", "cpu-local", "--ranks", "5"],
            "--ranks: expected at most 4 (the GPUs of topology 'cpu-local'), got 5",
        ),
        (
            ["simulate", "decode", "--topology", "cpu-local", "--tree", "ring"],
            "--tree 'ring': unknown; expected a tree builder ['auto', 'binomial', 'chain', 'double_binary', 'kary', "
            "'star', 'two_level'] (e.g. kary:4)",
        ),
        (
            ["simulate", "allreduce", "--topology", "cpu-local", "--profile", "fastest"],
            "--profile 'fastest': expected auto, ideal, nccl-ll, nccl-ll128, nccl-simple or a profile YAML file, "
            "got an unknown name",
        ),
        (
            ["simulate", "allreduce", "--topology", "cpu-local", "--algo", "ring,ring"],
            "--algo: expected each of the algorithms once, got 'ring' twice in 'ring,ring'",
        ),
    ],
)
def test_numbers_out_of_range(capsys, files, argv, msg):
    argv = [str(files["tree"]) if a == "TREE" else str(files["dir"].parent / a) if a == "OUT.png" else a for a in argv]
    assert error(capsys, *argv) == msg


# ------------------------------------------------------------------ Ctrl-C
def test_keyboard_interrupt_is_one_line_and_exit_130(capsys, monkeypatch):
    import treecoll.tools.cmd_topo as cmd_topo

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cmd_topo, "run", interrupted)
    rc, out, err = run(capsys, "topo", "show", "default")
    assert (rc, out, err) == (130, "", "treecoll: interrupted\n")


def _strict_json(text: str):
    """JSON as RFC 8259 defines it: no NaN, Infinity or -Infinity (jq and most parsers refuse them)."""

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_json_of_no_number_is_strict_json(capsys):
    """A rate of a zero time (no number): --json says null, as JSON has no Infinity or NaN, and
    keeps the finite numbers beside it."""
    import argparse
    import math

    assert cli.emit(argparse.Namespace(json=True), {"time_us": 0.0, "algbw": math.inf, "x": [math.nan, 1.5]}) == 0
    assert _strict_json(capsys.readouterr().out) == {"time_us": 0.0, "algbw": None, "x": [None, 1.5]}


def test_a_collective_on_one_rank_is_refused(capsys):
    """One rank moves no data: simulate says so in one line rather than print rates of nothing."""
    msg = error(capsys, "simulate", "allreduce", "--ranks", "1", "--sizes", "1MiB", "--algo", "two_level")
    assert "one rank moves no data" in msg and "expected at least 2 ranks" in msg
