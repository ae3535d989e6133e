"""treecoll.topo.fmt: the one formatter of byte sizes, durations and tables."""

from __future__ import annotations

import pytest
from treecoll.topo.errors import TreecollError
from treecoll.topo.fmt import fmt_bytes, fmt_seconds, table


@pytest.mark.parametrize(
    "n, si, text",
    [
        (0, False, "0 B"),
        (1023, False, "1023 B"),
        (1024, False, "1 KiB"),
        (1025, False, "1.00 KiB"),
        (3 << 19, False, "1.50 MiB"),
        (64 << 30, False, "64 GiB"),
        (5 << 40, False, "5 TiB"),
        (999, True, "999 B"),
        (1000, True, "1 kB"),
        (16_510, True, "16.51 kB"),
        (100_700_000, True, "100.70 MB"),
        (8_130_000_000, True, "8.13 GB"),
        (2 * 10**12, True, "2 TB"),
        (123.6, True, "124 B"),
    ],
)
def test_bytes_in_the_largest_unit_reached(n, si, text):
    assert fmt_bytes(n, si=si) == text


def test_digits_and_seconds():
    assert fmt_bytes(1 << 20 | 1, digits=4) == "1.0000 MiB"
    assert [fmt_seconds(t) for t in (1.5, 2e-3, 3.25e-6, 4e-9, 6e-12)] == [
        "1.50 s",
        "2.00 ms",
        "3.25 us",
        "4.00 ns",
        "0.01 ns",
    ]
    assert fmt_seconds(float("nan")) == "nan s" and fmt_seconds(-0.5) == "-500.00 ms"


def test_table_aligns_numbers_right_and_text_left():
    out = table([["a", 1, None], ["bbb", 22.25, 3]], ["name", "x", "n"], formats=[None, ".1f", None])
    assert out.splitlines() == ["name     x  n", "----  ----  -", "a      1.0  -", "bbb   22.2  3"]
    with pytest.raises(TreecollError, match=r"^table: expected 2 cells per row and format, got rows of \[1\]"):
        table([["x"]], ["a", "b"])
