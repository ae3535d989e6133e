"""treecoll.tools.units: the one size and count parser of every command and benchmark."""

from __future__ import annotations

import argparse
import json

import pytest
from treecoll.tools import units
from treecoll.tools.cli import build_parser, main, walk
from treecoll.topo.errors import TreecollError
from treecoll.topo.fmt import fmt_bytes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8", 8),
        ("8B", 8),
        ("1k", 1024),
        ("1KiB", 1024),
        ("1KB", 1000),
        ("64M", 64 << 20),
        ("64mib", 64 << 20),
        ("2GB", 2 * 10**9),
        ("1GiB", 1 << 30),
        ("1.5MiB", 3 << 19),
        (" 4 KiB ", 4096),
        ("1T", 1 << 40),
        ("1TB", 10**12),
    ],
)
def test_parse_bytes_units(text, expected):
    assert units.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "-4K", "1.2.3", "4 parsecs", "0.3B", "0", "0K", "1e6"])
def test_parse_bytes_rejects_with_one_line(text):
    with pytest.raises(TreecollError, match=r"^size: expected .*got") as e:
        units.parse_bytes(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("0", "--sizes: expected a size of at least 1 B, got '0'"),
        ("", "--sizes: expected one or more sizes, got an empty list ''"),
        (" , ", "--sizes: expected one or more sizes, got an empty list ' , '"),
        ("1K,,2K", "--sizes: expected a comma list of sizes, got an empty item in '1K,,2K'"),
        ("1K,1K", "--sizes: expected each of the sizes once, got '1K' twice in '1K,1K'"),
        ("0:1K", "--sizes: expected a size of at least 1 B, got '0'"),
        ("8K:1K", "--sizes: expected A:B with 1 <= A <= B, got '8K:1K'"),
    ],
)
def test_zero_and_empty_sizes_are_refused(spec, msg):
    with pytest.raises(TreecollError) as e:
        units.parse_sizes(spec, what="--sizes")
    assert str(e.value) == msg


PARSER_MODULES = ("treecoll.tools.units", "treecoll.tools.machine_flags")


def test_every_option_parses_through_tools_units():
    """No `type=int` / `float` / home-made parser left in the command line: every option that takes
    a value (but a fixed set of choices or the command of `emu run`) is parsed by tools.units, so
    zero, negatives, empty text and units read alike everywhere."""
    seen = []
    for path, p in walk(build_parser()):
        for a in p._actions:
            if not isinstance(a, argparse._StoreAction) or a.choices is not None or a.nargs == argparse.REMAINDER:
                continue
            # machine_flags reads machine descriptions (--gpu H100, --nic 8x400G-ib); its counts use units
            assert getattr(a.type, "__module__", None) in PARSER_MODULES, (path, a.option_strings, a.type)
            seen.append((path, a.dest))
    assert len(seen) > 50


@pytest.mark.parametrize(
    "argv, key",
    [
        (["tree", "build", "--topology", "cpu-local", "--builder", "chain", "--bytes", "TEXT"], ("bytes",)),
        (["simulate", "links", "--topology", "cpu-local", "--algo", "ring", "--size", "TEXT"], ("size",)),
        (
            ["simulate", "allreduce", "--topology", "cpu-local", "--algo", "ring", "--sizes", "TEXT"],
            ("rows", 0, "size"),
        ),
    ],
)
@pytest.mark.parametrize("text", ["64MB", "64MiB", "64M", "4096"])
def test_every_command_reads_sizes_alike(capsys, argv, key, text):
    """`treecoll tree` and `treecoll simulate` used to disagree on MB (10^6 vs 2^20)."""
    assert main([text if a == "TEXT" else a for a in argv] + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for k in key:
        d = d[k]
    assert d == units.parse_bytes(text)


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["simulate", "allreduce", "--sizes", "0"], "--sizes: expected a size of at least 1 B, got '0'"),
        (["simulate", "allreduce", "--sizes", ""], "--sizes: expected one or more sizes, got an empty list ''"),
        (["simulate", "links", "--top", "-1"], "--top: expected a positive integer, got -1"),
        (["simulate", "links", "--top", "0"], "--top: expected a positive integer, got 0"),
        (["simulate", "links", "--size", "0"], "--size: expected a size of at least 1 B, got '0'"),
        (["simulate", "decode", "--seq-len", "0"], "--seq-len: expected a count of at least 1, got '0'"),
        (["simulate", "decode", "--seq-len", ""], "--seq-len: expected one or more counts, got an empty list ''"),
        (["simulate", "decode", "--heads", "0"], "--heads: expected a positive integer, got 0"),
        (["simulate", "allreduce", "--ranks", "0"], "--ranks: expected a positive integer, got 0"),
        (
            ["tree", "build", "--topology", "default", "--builder", "chain", "--bytes", "0"],
            "--bytes: expected a size of at least 1 B, got '0'",
        ),
        (
            ["tree", "check", "x.yaml", "--topology", "default", "--bytes", ""],
            "--bytes: expected a size like 4096, 64KiB, 1M (binary) or 2GB (decimal), got ''",
        ),
        (
            ["topo", "draw", "default", "-o", "x.png", "--max-hosts", "-2"],
            "--max-hosts: expected a positive integer, got -2",
        ),
        (["emu", "measure", "--bytes", "0"], "--bytes: expected a size of at least 1 B, got '0'"),
        (
            ["topo", "export", "default", "--format", "yaml", "-o", ""],
            "-o/--output: expected a value, got an empty string",
        ),
        (["topo", "matrix", "default", "--host", " "], "--host: expected a value, got an empty string"),
        (["topo", "show", ""], "FILE: expected a value, got an empty string"),
        (["emu", "down", "--id", ""], "--id: expected a value, got an empty string"),
        (["simulate", "allreduce", "--algo", ""], "--algo: expected a value, got an empty string"),
    ],
)
def test_zero_empty_and_negative_are_one_line_errors_before_any_work(capsys, argv, msg):
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"treecoll: error: {msg}\n")


def test_counts_and_ranges():
    assert units.parse_count("128k") == 128_000
    assert units.parse_count("128k", binary=True) == 131_072
    assert units.parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert units.parse_sizes("1K,1MB") == [1024, 10**6]
    assert units.parse_counts("32k, 1M") == [32_000, 1_000_000]
    assert units.parse_shapes("2x2,3X1", what="--shapes") == [(2, 2), (3, 1)]
    with pytest.raises(TreecollError, match="tokens: expected a count"):
        units.parse_count("1KiB", what="tokens")
    with pytest.raises(TreecollError, match="^tokens: expected a count of at least 1, got '0'$"):
        units.parse_count("0", what="tokens")
    with pytest.raises(units.UsageError, match=r"^--shapes 2x0: expected a positive integer, got 0$"):
        units.parse_shapes("2x0", what="--shapes")
    assert fmt_bytes(units.parse_bytes("64MiB")) == "64 MiB" and fmt_bytes(units.parse_bytes("1000")) == "1000 B"


def test_argparse_types_raise_usage_errors_argparse_does_not_swallow():
    """A type error from tools.units reaches the dispatcher as itself (its one line), not as
    argparse's generic "invalid value"."""
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=units.int_arg("--n"))
    with pytest.raises(units.UsageError, match=r"^--n: expected an integer, got 'x'$"):
        p.parse_args(["--n", "x"])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("99999999999999999", 99999999999999999),  # above 2**53: a float would make it 10**17
        ("9007199254740993", 2**53 + 1),
        ("3.000000000000000001K", None),  # 3072.000000000000001024: not whole, a float would say 3072
        ("0.1KB", 100),
        ("9223372036854775807", 2**63 - 1),
    ],
)
def test_parse_bytes_is_exact(text, expected):
    if expected is None:
        with pytest.raises(TreecollError, match="expected a whole number"):
            units.parse_bytes(text)
    else:
        assert units.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["9223372036854775808", "9" * 400, "1e400"])
def test_sizes_and_counts_beyond_64_bits_are_one_line_errors(text):
    for parse in (units.parse_bytes, units.parse_count):
        with pytest.raises(TreecollError, match=r"^x: expected .*, got '9*|^x: expected .*1e400") as e:
            parse(text, what="x")
        assert "\n" not in str(e.value) and len(str(e.value)) < 200
