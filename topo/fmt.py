"""Numbers as people read them: byte sizes, durations and plain-text tables (the one formatter).

The other direction, text to numbers, is :mod:`treecoll.tools.units` (the one parser).
This module lives in ``topo``, the bottom of ``topo <- collectives <- attention <-
tools``, so that every room formats alike without importing the command line.

* :func:`fmt_bytes`: binary units by default (``KiB`` = 1024 B, as sizes are given:
  nccl-tests' ``-b 8 -e 128M``), decimal with ``si=True`` (``kB`` = 1000 B, beside
  rates in GB/s = 1e9 B/s). A size that is a whole number of its unit prints
  without decimals (``64 MiB``), any other with ``digits`` decimals (``1.50 KiB``).
* :func:`fmt_seconds`: seconds in ``s``, ``ms``, ``us`` or ``ns``, whichever puts
  the value in 1..1000.
* :func:`table`: a header, a rule and one line per row; numbers right-aligned.

>>> fmt_bytes(64 << 20), fmt_bytes(3 << 10), fmt_bytes(100), fmt_bytes(1536), fmt_bytes(1 << 40)
('64 MiB', '3 KiB', '100 B', '1.50 KiB', '1 TiB')
>>> fmt_bytes(90_820, si=True), fmt_bytes(8.13e9, si=True), fmt_bytes(16_000, si=True), fmt_bytes(999.4, si=True)
('90.82 kB', '8.13 GB', '16 kB', '999 B')
>>> fmt_seconds(2.5e-6), fmt_seconds(0.0123), fmt_seconds(4.2), fmt_seconds(0)
('2.50 us', '12.30 ms', '4.20 s', '0 s')
>>> print(table([["ring", 65536, 45.61], ["two_level", 1 << 20, 18.7]], ["algo", "bytes", "time us"],
...             formats=[None, None, ".1f"]))
algo         bytes  time us
---------  -------  -------
ring         65536     45.6
two_level  1048576     18.7
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .errors import TreecollError

__all__ = ["fmt_bytes", "fmt_seconds", "table", "BINARY_UNITS", "SI_UNITS"]

#: (unit, bytes), largest first: powers of 1024 (IEC)
BINARY_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
#: (unit, bytes), largest first: powers of 1000 (SI)
SI_UNITS = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3))
_TIME_UNITS = (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9))


def fmt_bytes(n: float, *, si: bool = False, digits: int = 2) -> str:
    """``n`` bytes in the largest unit it reaches (binary, or decimal with ``si``);
    a whole number of that unit prints without decimals, anything else with ``digits``."""
    for unit, size in SI_UNITS if si else BINARY_UNITS:
        if n >= size:
            whole = n % size == 0
            return f"{int(n // size)} {unit}" if whole else f"{n / size:.{digits}f} {unit}"
    return f"{n:.0f} B"


def fmt_seconds(t: float, *, digits: int = 2) -> str:
    """``t`` seconds in the unit (s, ms, us, ns) that puts it in 1..1000 (``"12.30 ms"``)."""
    if t == 0 or not math.isfinite(t):
        return f"{t:g} s"
    for unit, size in _TIME_UNITS:
        if abs(t) >= size:
            return f"{t / size:.{digits}f} {unit}"
    return f"{t / 1e-9:.{digits}f} ns"


def _cell(value: object, spec: str | None) -> str:
    if value is None:
        return "-"
    if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def table(
    rows: Sequence[Sequence[object]],
    header: Sequence[str],
    *,
    formats: Sequence[str | None] | None = None,
    sep: str = "  ",
) -> str:
    """Plain-text table of ``rows`` (one sequence of cells per row) under ``header``.

    ``formats``: a format spec per column for numeric cells (``".1f"``; None keeps
    ``str``); ``None`` cells print ``-``. A column is right-aligned when every
    cell in it is a number, left-aligned otherwise."""
    formats = list(formats) if formats is not None else [None] * len(header)
    if len(formats) != len(header) or any(len(r) != len(header) for r in rows):
        raise TreecollError(
            f"table: expected {len(header)} cells per row and format, got rows of "
            f"{sorted({len(r) for r in rows})} and {len(formats)} formats"
        )
    cells = [[_cell(v, formats[i]) for i, v in enumerate(r)] for r in rows]
    numeric = [
        all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) and bool(rows) for i in range(len(header))
    ]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]

    def line(values: Sequence[str]) -> str:
        return sep.join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in cells])
