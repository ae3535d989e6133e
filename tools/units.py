"""Sizes, counts and numbers on the command line: one parser for every command and benchmark.

Byte sizes follow nccl-tests and the IEC: a bare ``K`` / ``M`` / ``G`` / ``T``
and ``KiB`` / ``MiB`` / ``GiB`` / ``TiB`` are powers of 1024 (``-b 8 -e 128M``
in nccl-tests is 128 MiB); ``KB`` / ``MB`` / ``GB`` / ``TB`` (with the B) are
SI powers of 1000, as storage vendors write them. ``B`` or no unit is bytes.
Case does not matter. Token counts (sequence lengths) are decimal: ``128k`` is
128,000, ``5.12M`` is 5,120,000 (the Tree Attention paper's sizes).

Zero, negative and empty values are refused: every size, count and process
number a command takes is at least 1 unless the option says otherwise.
Options take these parsers as argparse ``type=`` through the ``*_arg``
factories (:func:`size_arg`, :func:`sizes_arg`, :func:`count_arg`,
:func:`counts_arg`, :func:`int_arg`, :func:`seconds_arg`); a bad value raises
:class:`UsageError`, which the ``treecoll`` dispatcher prints as one line.

>>> parse_bytes("64MiB"), parse_bytes("64M"), parse_bytes("64MB"), parse_bytes("4096")
(67108864, 67108864, 64000000, 4096)
>>> parse_sizes("8B:64")
[8, 16, 32, 64]
>>> parse_count("5.12M"), parse_count("32768"), parse_count("16k", binary=True)
(5120000, 32768, 16384)
>>> parse_counts("32k,1M", what="--seq-len")
[32000, 1000000]
>>> parse_bytes("3 parsecs", what="--bytes")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
treecoll.topo.errors.TreecollError: --bytes: expected a size like 4096, 64KiB, 1M (binary) or 2GB ..., got '3 parsecs'
>>> parse_sizes("0", what="--sizes")
Traceback (most recent call last):
...
treecoll.topo.errors.TreecollError: --sizes: expected a size of at least 1 B, got '0'
>>> int_arg("--nproc")("-2")
Traceback (most recent call last):
...
treecoll.tools.units.UsageError: --nproc: expected a positive integer, got -2
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

from treecoll.topo.errors import TreecollError

#: the exception class a parser raises: TreecollError or a subclass (UsageError, CollectiveError ...)
ErrorType = type[TreecollError]

__all__ = [
    "parse_bytes",
    "parse_sizes",
    "parse_count",
    "parse_counts",
    "parse_int",
    "parse_seconds",
    "parse_list",
    "parse_shapes",
    "parse_fraction",
    "fraction_arg",
    "positive",
    "size_arg",
    "sizes_arg",
    "count_arg",
    "counts_arg",
    "int_arg",
    "ints_arg",
    "seconds_arg",
    "shapes_arg",
    "text_arg",
    "UsageError",
    "BYTE_UNITS",
    "COUNT_UNITS",
]


class UsageError(TreecollError):
    """A command-line error: a bad option value, or argparse's complaint, as one line."""


#: multipliers of byte sizes (lower-case unit -> bytes)
BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
#: multipliers of counts (tokens): decimal, or binary with ``binary=True``
COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}
_BINARY_COUNT_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}

_NUMBER = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*")
_SIZE_EXAMPLE = "a size like 4096, 64KiB, 1M (binary) or 2GB (decimal)"
_COUNT_EXAMPLE = "a count like 32768, 128k or 5.12M"


#: the largest size or count a parser returns: a signed 64-bit integer (torch's numel, NCCL's size_t counts)
MAX_VALUE = 2**63 - 1


def _shown(text) -> str:
    """``text`` as an error message quotes it: whole, or its start and its length when long."""
    text = str(text)
    return repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"


def _parse(text, units: dict, what: str, example: str, error, minimum: int, unit: str) -> int:
    m = _NUMBER.fullmatch(str(text))
    if not m or m.group(2).lower() not in units:
        raise error(f"{what}: expected {example}, got {_shown(text)}")
    value = Fraction(m.group(1)) * units[m.group(2).lower()]  # exact: a float loses digits above 2**53
    if value > MAX_VALUE:
        raise error(f"{what}: expected at most {MAX_VALUE:,}{unit} (a 64-bit integer), got {_shown(text)}")
    if value.denominator != 1:
        raise error(f"{what}: expected a whole number, got {text!r} = {float(value):g}")
    if value < minimum:
        raise error(f"{what}: expected a {'size' if unit else 'count'} of at least {minimum}{unit}, got {text!r}")
    return int(value)


def parse_bytes(text: str | float, *, what: str = "size", error: ErrorType = TreecollError, minimum: int = 1) -> int:
    """Bytes in ``text`` (see the module docstring for units), at least ``minimum``;
    ``error`` is raised, naming ``what``, for anything else."""
    return _parse(text, BYTE_UNITS, what, _SIZE_EXAMPLE, error, minimum, " B")


def parse_count(
    text: str | float, *, what: str = "count", binary: bool = False, error: ErrorType = TreecollError, minimum: int = 1
) -> int:
    """A count such as a sequence length: ``"128k"`` -> 128000 (``binary``: 131072), at least ``minimum``."""
    return _parse(text, _BINARY_COUNT_UNITS if binary else COUNT_UNITS, what, _COUNT_EXAMPLE, error, minimum, "")


def parse_list(spec: str, *, what: str, kind: str = "names", error: ErrorType = TreecollError) -> list[str]:
    """The stripped items of a comma list (``"ring, tree"`` -> ``["ring", "tree"]``); an empty
    list, an empty item or an item given twice is an error naming ``what``."""
    items = [x.strip() for x in str(spec).split(",")]
    if not any(items):
        raise error(f"{what}: expected one or more {kind}, got an empty list {spec!r}")
    if not all(items):
        raise error(f"{what}: expected a comma list of {kind}, got an empty item in {spec!r}")
    twice = sorted({x for x in items if items.count(x) > 1})
    if twice:
        raise error(f"{what}: expected each of the {kind} once, got {', '.join(map(repr, twice))} twice in {spec!r}")
    return items


def parse_sizes(spec: str, *, what: str = "sizes", error: ErrorType = TreecollError) -> list[int]:
    """``"8B:1GiB"`` (every power of two from A to B, A doubling) or ``"1K,1MiB"`` (a list)."""
    if ":" in str(spec):
        a, b = (parse_bytes(x, what=what, error=error) for x in spec.split(":", 1))
        if b < a:
            raise error(f"{what}: expected A:B with 1 <= A <= B, got {spec!r}")
        out = []
        while a <= b:
            out.append(a)
            a *= 2
        return out
    return [parse_bytes(x, what=what, error=error) for x in parse_list(spec, what=what, kind="sizes", error=error)]


def parse_counts(
    spec: str, *, what: str = "counts", binary: bool = False, error: ErrorType = TreecollError
) -> list[int]:
    """A comma list of counts (``"32k,1M"``), each as :func:`parse_count` reads it."""
    items = parse_list(spec, what=what, kind="counts", error=error)
    return [parse_count(x, what=what, binary=binary, error=error) for x in items]


def positive(
    option: str, value: float, *, minimum: int = 1, maximum: int | None = None, error: ErrorType | None = None
) -> None:
    """Raise :class:`UsageError` (or ``error``) unless ``minimum <= value <= maximum``:
    ``"--ranks: expected a positive integer, got 0"``."""
    error = error or UsageError
    if value < minimum:
        want = (
            "a positive integer"
            if minimum == 1
            else "a non-negative integer"
            if minimum == 0
            else f"an integer >= {minimum}"
        )
        raise error(f"{option}: expected {want}, got {value}")
    if maximum is not None and value > maximum:
        raise error(f"{option}: expected at most {maximum}, got {value}")


def parse_int(
    text: str | float, *, what: str, minimum: int = 1, maximum: int | None = None, error: ErrorType | None = None
) -> int:
    """A plain integer (no unit) in ``minimum..maximum``."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise (error or UsageError)(f"{what}: expected an integer, got {text!r}") from None
    positive(what, value, minimum=minimum, maximum=maximum, error=error)
    return value


def parse_seconds(text: str | float, *, what: str, error: ErrorType | None = None) -> float:
    """A finite number of seconds > 0."""
    try:
        value = float(str(text).strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise (error or UsageError)(f"{what}: expected a positive number of seconds, got {text!r}")
    return value


def parse_fraction(text: str | float, *, what: str, error: ErrorType | None = None) -> float:
    """A fraction in (0, 1] (``0.7``): a share, a threshold.

    >>> parse_fraction("0.7", what="--threshold")
    0.7
    >>> parse_fraction("70", what="--threshold")
    Traceback (most recent call last):
    ...
    treecoll.tools.units.UsageError: --threshold: expected a fraction in (0, 1] such as 0.7, got '70'
    """
    try:
        value = float(str(text).strip())
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise (error or UsageError)(f"{what}: expected a fraction in (0, 1] such as 0.7, got {text!r}")
    return value


# ------------------------------------------------------------------ argparse types
def _named(fn: Callable, name: str) -> Callable:
    fn.__name__ = name  # argparse names the type in some messages
    return fn


def size_arg(option: str) -> Callable[[str], int]:
    """argparse ``type=`` for one byte size (``--bytes 64MiB``)."""
    return _named(lambda text: parse_bytes(text, what=option, error=UsageError), "size")


def sizes_arg(option: str) -> Callable[[str], list[int]]:
    """argparse ``type=`` for ``A:B`` or a comma list of sizes (``--sizes 8B:1GiB``)."""
    return _named(lambda text: parse_sizes(text, what=option, error=UsageError), "sizes")


def count_arg(option: str, *, binary: bool = False) -> Callable[[str], int]:
    """argparse ``type=`` for one count (``--seq-len 1M``)."""
    return _named(lambda text: parse_count(text, what=option, binary=binary, error=UsageError), "count")


def counts_arg(option: str, *, binary: bool = False) -> Callable[[str], list[int]]:
    """argparse ``type=`` for a comma list of counts (``--seq-len 32k,1M``)."""
    return _named(lambda text: parse_counts(text, what=option, binary=binary, error=UsageError), "counts")


def int_arg(option: str, *, minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """argparse ``type=`` for a plain integer in ``minimum..maximum`` (``--nproc 4``)."""
    return _named(lambda text: parse_int(text, what=option, minimum=minimum, maximum=maximum), "int")


def ints_arg(option: str, *, minimum: int = 1) -> Callable[[str], list[int]]:
    """argparse ``type=`` for a comma list of plain integers (``--nprocs 2,4``)."""
    return _named(
        lambda text: [
            parse_int(x, what=option, minimum=minimum)
            for x in parse_list(text, what=option, kind="integers", error=UsageError)
        ],
        "ints",
    )


def text_arg(option: str, what: str = "a name") -> Callable[[str], str]:
    """argparse ``type=`` for a file name, id or name: any text but an empty or blank one (an empty
    ``--topology ""`` must not silently mean the default, nor ``--id ""`` every cluster)."""

    def parse(text: str) -> str:
        if not str(text).strip():
            raise UsageError(f"{option}: expected {what}, got an empty string")
        return text

    return _named(parse, "text")


def parse_shapes(spec: str, *, what: str, error: ErrorType | None = None) -> list[tuple[int, int]]:
    """A comma list of ``HOSTSxRANKS`` shapes: ``"2x2,2x3"`` -> ``[(2, 2), (2, 3)]``, both at least 1."""
    error = error or UsageError
    out = []
    for item in parse_list(spec, what=what, kind="shapes", error=error):
        parts = item.lower().split("x")
        if len(parts) != 2:
            raise error(f"{what}: expected HOSTSxRANKS like 2x3, got {item!r}")
        out.append(tuple(parse_int(x, what=f"{what} {item}", error=error) for x in parts))
    return out


def shapes_arg(option: str) -> Callable[[str], list[tuple[int, int]]]:
    """argparse ``type=`` for a comma list of ``HOSTSxRANKS`` (``--shapes 2x2,2x3``)."""
    return _named(lambda text: parse_shapes(text, what=option), "shapes")


def fraction_arg(option: str) -> Callable[[str], float]:
    """argparse ``type=`` for a fraction in (0, 1] (``--threshold 0.7``)."""
    return _named(lambda text: parse_fraction(text, what=option), "fraction")


def seconds_arg(option: str) -> Callable[[str], float]:
    """argparse ``type=`` for a positive, finite number of seconds (``--timeout 600``)."""
    return _named(lambda text: parse_seconds(text, what=option), "seconds")
