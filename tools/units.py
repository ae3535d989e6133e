"""Sizes and counts on the command line: one parser for every command and benchmark.

Byte sizes follow nccl-tests and the IEC: a bare ``K`` / ``M`` / ``G`` / ``T``
and ``KiB`` / ``MiB`` / ``GiB`` / ``TiB`` are powers of 1024 (``-b 8 -e 128M``
in nccl-tests is 128 MiB); ``KB`` / ``MB`` / ``GB`` / ``TB`` (with the B) are
SI powers of 1000, as storage vendors write them. ``B`` or no unit is bytes.
Case does not matter. Token counts (sequence lengths) are decimal: ``128k`` is
128,000, ``5.12M`` is 5,120,000 (the Tree Attention paper's sizes).

>>> parse_bytes("64MiB"), parse_bytes("64M"), parse_bytes("64MB"), parse_bytes("4096")
(67108864, 67108864, 64000000, 4096)
>>> parse_sizes("8B:64")
[8, 16, 32, 64]
>>> parse_count("5.12M"), parse_count("32768"), parse_count("16k", binary=True)
(5120000, 32768, 16384)
>>> fmt_bytes(1 << 20), fmt_bytes(3 << 10), fmt_bytes(100)
('1 MiB', '3 KiB', '100 B')
>>> parse_bytes("3 parsecs", what="--bytes")
Traceback (most recent call last):
...
topo.errors.TreecollError: --bytes: expected a size like 4096, 64KiB, 1M (binary) or 2GB (decimal), got '3 parsecs'
"""
from __future__ import annotations

import re

from topo.errors import TreecollError

__all__ = ["parse_bytes", "parse_sizes", "parse_count", "fmt_bytes", "BYTE_UNITS", "COUNT_UNITS"]

#: multipliers of byte sizes (lower-case unit -> bytes)
BYTE_UNITS = {"": 1, "b": 1,
              "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
              "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
              "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
#: multipliers of counts (tokens): decimal, or binary with ``binary=True``
COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
_BINARY_COUNT_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}

_NUMBER = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*")


def _parse(text, units: dict, what: str, example: str, error) -> int:
    m = _NUMBER.fullmatch(str(text))
    if not m or m.group(2).lower() not in units:
        raise error(f"{what}: expected {example}, got {text!r}")
    value = float(m.group(1)) * units[m.group(2).lower()]
    if value != int(value):
        raise error(f"{what}: expected a whole number, got {text!r} = {value:g}")
    return int(value)


def parse_bytes(text, *, what: str = "size", error=TreecollError) -> int:
    """Bytes in ``text`` (see the module docstring for units); ``error`` is raised,
    naming ``what``, for anything else."""
    return _parse(text, BYTE_UNITS, what, "a size like 4096, 64KiB, 1M (binary) or 2GB (decimal)", error)


def parse_count(text, *, what: str = "count", binary: bool = False, error=TreecollError) -> int:
    """A count such as a sequence length: ``"128k"`` -> 128000 (``binary``: 131072)."""
    return _parse(text, _BINARY_COUNT_UNITS if binary else COUNT_UNITS, what,
                  "a count like 32768, 128k or 5.12M", error)


def parse_sizes(spec: str, *, what: str = "sizes", error=TreecollError) -> list[int]:
    """``"8B:1GiB"`` (every power of two from A to B, A doubling) or ``"1K,1MiB"`` (a list)."""
    if ":" in spec:
        a, b = (parse_bytes(x, what=what, error=error) for x in spec.split(":", 1))
        if a < 1 or b < a:
            raise error(f"{what}: expected A:B with 1 <= A <= B, got {spec!r}")
        out = []
        while a <= b:
            out.append(a)
            a *= 2
        return out
    return [parse_bytes(x, what=what, error=error) for x in spec.split(",") if x.strip()]


def fmt_bytes(n: int) -> str:
    """``n`` bytes in the largest binary unit that divides it exactly (``"64 MiB"``)."""
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"
