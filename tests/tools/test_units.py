"""tools.units: the one size and count parser of every command and benchmark."""
from __future__ import annotations

import doctest

import pytest

from tools import cmd_tree, units
from topo.errors import TreeError, TreecollError


def test_doctests():
    assert doctest.testmod(units).failed == 0


@pytest.mark.parametrize("text, expected", [
    ("8", 8), ("8B", 8), ("1k", 1024), ("1KiB", 1024), ("1KB", 1000), ("64M", 64 << 20), ("64mib", 64 << 20),
    ("2GB", 2 * 10**9), ("1GiB", 1 << 30), ("1.5MiB", 3 << 19), (" 4 KiB ", 4096), ("1T", 1 << 40), ("1TB", 10**12),
])
def test_parse_bytes_units(text, expected):
    assert units.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "-4K", "1.2.3", "4 parsecs", "0.3B"])
def test_parse_bytes_rejects_with_one_line(text):
    with pytest.raises(TreecollError, match=r"^size: expected .*got") as e:
        units.parse_bytes(text)
    assert "\n" not in str(e.value)


def test_every_command_reads_sizes_alike():
    """`treecoll tree` and `treecoll simulate` used to disagree on MB (10^6 vs 2^20)."""
    from tools import cmd_simulate
    for text in ("64MB", "64MiB", "64M", "4096"):
        assert cmd_tree.parse_bytes(text) == cmd_simulate.parse_sizes(text)[0] == units.parse_bytes(text)
    with pytest.raises(TreeError, match="--bytes: expected"):
        cmd_tree.parse_bytes("lots")


def test_counts_and_ranges():
    assert units.parse_count("128k") == 128_000
    assert units.parse_count("128k", binary=True) == 131_072
    assert units.parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert units.parse_sizes("1K,1MB") == [1024, 10**6]
    with pytest.raises(TreecollError, match="expected A:B with 1 <= A <= B"):
        units.parse_sizes("8K:1K")
    with pytest.raises(TreecollError, match="tokens: expected a count"):
        units.parse_count("1KiB", what="tokens")
    assert units.fmt_bytes(64 << 20) == "64 MiB" and units.fmt_bytes(1000) == "1000 B"
