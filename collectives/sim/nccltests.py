"""Reading nccl-tests output as people post it: tables, the collective, the machine the file names.

:func:`parse` (text in, plain data out) and :func:`read` (a file) return an
:class:`NcclTestsOutput`: the file's :class:`Header` lines and one :class:`Table`
per measured sweep, each with its :class:`Row` s (size, count, type, redop,
root, and time / algbw / busbw / #wrong for the out-of-place and the in-place
run). What the reader copes with, because that is how tables reach us:

* comment lines with or without their ``#`` (documentation renderers strip
  it); lines prefixed by a launcher (``0: `` from ``srun -l``,
  ``[1,0]<stdout>:`` from Open MPI ``--tag-output``, ``[0] `` from MPICH,
  ``kubectl logs --timestamps`` times); any indentation;
* shell prompts, ssh warnings and other chatter around the table;
* the current format (``redop`` and ``root`` columns, ``#wrong``), the old
  one (no ``root`` column but for broadcast and reduce, no ``redop`` for
  all_gather and sendrecv, an ``error`` column) and the per-iteration
  columns of ``-I 1``; a header is not required;
* literal ``...`` elisions (recorded in :attr:`Table.elided`), size-0 rows,
  ``N/A`` in the ``#wrong`` column;
* several tables in one file (a multi-collective log, or one binary sweeping
  several types, operations or roots): one :class:`Table` each;
* truncated tables: the rows present are kept; a row cut mid-line is
  dropped and listed in :attr:`Table.dropped` with its line and why.

The collective is recognised from the table itself (:func:`recognise`): the
``redop`` and ``root`` columns, ``N/A`` in the in-place ``#wrong`` column
(sendrecv and alltoall do not check in-place results), the ``count`` column
(all_gather, reduce_scatter and alltoall print the count per rank), the
busbw/algbw ratio against nccl-tests' bus factors for the number of GPUs, and
the binary's name where the output or the command line prints it
(``all_gather_perf``). Where the evidence leaves more than one collective,
:attr:`Table.collective` is None and :attr:`Table.candidates` lists them; where
the evidence contradicts itself (a busbw/algbw ratio that implies 128 ranks
under a device list of 144), :attr:`Table.warnings` says so. Nothing is
guessed silently.

What the file says about the machine is kept: the device lines (GPU name,
host, local device, PCI id per rank), the ``nThread ... nGpus ... minBytes``
line (:class:`RunInfo`), the NCCL and nccl-tests versions, and the header
lines this project's fixtures carry (``# source:``, ``# machine:``,
``# nccl:``, ``# env:``, ``# note:``). :meth:`Table.machine_facts` hands the
machine part to :func:`treecoll.topo.machines.resolve_machine`.

Sources: nccl-tests (github.com/NVIDIA/nccl-tests) ``src/util.cu``
``writeResultHeader`` / ``writeBenchmarkLinePreamble`` / ``writeBenchmarkLineBody``
(columns, ``%6.2f`` bandwidths, ``N/A`` where a run does not check its result),
``src/*.cu`` ``*GetBw`` (bus factors) and ``*GetCollByteCount`` (per-rank
counts); the old per-test headers from the same repository before commit
51af557 (2022).

Errors (:class:`NcclTestsError`, one line naming the file and line): a file that
cannot be read, and a file in which no table row can be read.

>>> text = '''$ srun -N2 all_reduce_perf -b 1M -e 2M
... # nThread 1 nGpus 1 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1
... # Using devices
... #  Rank  0 Group  0 Pid  4101 on  node-a device  0 [0009:01:00] NVIDIA GH200 120GB
... #  Rank  1 Group  0 Pid  5102 on  node-b device  0 [0009:01:00] NVIDIA GH200 120GB
... #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
...      1048576        262144     float     sum      -1   339.61    3.09    3.09      0   335.85    3.12    3.12      0
...      2097152        524288     float     sum      -1   355.53    5.90    5.90      0   361.77    5.80    5.80      0
... # Out of bounds values : 0 OK
... '''
>>> t = parse(text, "run.log").tables[0]
>>> t.collective, t.nranks, t.hosts(), t.gpu_names()
('allreduce', 2, (('node-a', 1), ('node-b', 1)), ('NVIDIA GH200 120GB',))
>>> r = t.rows[1]
>>> r.size, r.count, r.type, r.redop, r.root, r.out_of_place.time_us, r.in_place.busbw
(2097152, 524288, 'float', 'sum', -1, 355.53, 5.8)
>>> t.evidence[0]
'binary all_reduce_perf'
>>> two = ("0: #  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\\n"
...        "0:  4194304  524288  float  none  -1  101.5  41.31  20.66  N/A  93.90  44.67  22.33  N/A")
>>> parse(two, "x").tables[0].candidates
('allgather', 'alltoall')
>>> parse("hello\\n", "empty.log")
Traceback (most recent call last):
...
treecoll.collectives.sim.nccltests.NcclTestsError: empty.log: no nccl-tests table: expected rows like '1048576 ...
"""

from __future__ import annotations

import math
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from treecoll.topo.errors import TreecollError
from treecoll.topo.files import decode_text, read_text

from .result import bus_factor

if TYPE_CHECKING:
    from treecoll.topo.machines import MachineFacts

__all__ = [
    "NcclTestsError",
    "NcclTestsOutput",
    "Table",
    "Row",
    "Measurement",
    "Device",
    "RunInfo",
    "Header",
    "parse",
    "read",
    "recognise",
    "bus_factor",
    "COLLECTIVES",
    "BINARIES",
    "TYPE_BYTES",
    "MAX_FILE_BYTES",
]

#: the collectives nccl-tests measures that treecoll knows, in the order results list them
COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv")
#: nccl-tests binary -> collective (other binaries, e.g. ``gather_perf``, are recognised and refused)
BINARIES = {
    "all_reduce_perf": "allreduce",
    "all_gather_perf": "allgather",
    "reduce_scatter_perf": "reduce_scatter",
    "alltoall_perf": "alltoall",
    "broadcast_perf": "broadcast",
    "reduce_perf": "reduce",
    "sendrecv_perf": "sendrecv",
}
#: bytes per element of nccl-tests' type names (``test_typenames`` in src/common.cu; ``char``/``int``: NCCL 1)
TYPE_BYTES = {
    "int8": 1,
    "uint8": 1,
    "char": 1,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "half": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "int": 4,
    "float": 4,
    "int64": 8,
    "uint64": 8,
    "double": 8,
}
#: files larger than this are refused before they are read (a day of NCCL_DEBUG=INFO logs is far smaller)
MAX_FILE_BYTES = 256 << 20

_PER_RANK = ("allgather", "reduce_scatter", "alltoall")  # count column = elements per rank
_UNIT = ("broadcast", "reduce", "sendrecv")  # bus factor 1
_NO_INPLACE_CHECK = ("sendrecv", "alltoall")  # in-place #wrong is N/A (reportErrors = !in_place)
_EXAMPLE_ROW = "'1048576  262144  float  sum  -1  63.16  16.60  24.90  0 ...'"


class NcclTestsError(TreecollError, ValueError):
    """An nccl-tests output that cannot be read at all (one line: file, line, what is wrong)."""


# ---------------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Measurement:
    """One run of one size: time in µs, algbw and busbw in GB/s (1e9 B/s) as printed;
    ``wrong``: the ``#wrong`` count (``error`` in the old format), None where nccl-tests printed ``N/A``."""

    time_us: float
    algbw: float
    busbw: float
    wrong: float | None


@dataclass(frozen=True)
class Row:
    """One table row. ``size`` in bytes as nccl-tests prints it (the total for all_gather, reduce_scatter
    and alltoall), ``count`` in elements as printed; ``redop`` / ``root`` None where the format has no
    such column; ``in_place`` None for a row that printed one run only."""

    line: int
    size: int
    count: int
    type: str
    redop: str | None
    root: int | None
    out_of_place: Measurement
    in_place: Measurement | None


@dataclass(frozen=True)
class Device:
    """One ``#  Rank r Group g Pid p on HOST device d [PCI] NAME`` line (``group`` None in the old format)."""

    line: int
    rank: int
    group: int | None
    pid: int
    host: str
    device: int
    pci: str
    name: str


@dataclass(frozen=True)
class RunInfo:
    """The ``# nThread 1 nGpus 1 minBytes 8 maxBytes ... step: 2(factor) ...`` line; ``settings``:
    the ``name: value`` pairs after it (``warmup iters``, ``iters``, ``agg iters``, ``validation``, ...)."""

    line: int
    nthread: int
    ngpus: int
    min_bytes: int
    max_bytes: int
    step: int
    step_kind: str
    settings: tuple[tuple[str, int], ...] = ()

    def setting(self, name: str) -> int | None:
        """A setting by name (``"validation"``), or None when the line does not print it."""
        return next((v for k, v in self.settings if k == name), None)


@dataclass(frozen=True)
class Header:
    """The ``# key: value`` lines this project's fixtures start with (None where absent)."""

    source: str | None = None
    machine: str | None = None
    nccl: str | None = None
    env: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class Table:
    """One sweep of one binary (one type, operation and root), with what the file says around it.

    ``source``: the file; ``index``: the table's place in it (0-based); ``line``: where the table
    starts (its header line, else its first row); ``columns``: the header's names (lower case,
    ``#`` dropped; empty without a header). ``collective``: one of :data:`COLLECTIVES`, or None
    with ``candidates`` the ones the evidence leaves (empty when it contradicts itself);
    ``evidence``: what decided, in words. ``nranks``: the GPUs the run used (``nranks_from``
    says which evidence), None when nothing says. ``devices``: the device lines before the table
    (``devices_complete``: ranks 0..n-1 each listed once, nothing elided). ``complete``: the
    table ended as nccl-tests ends one (its footer, or the next sweep); ``elided``: lines of
    ``...`` elisions inside the table; ``dropped``: ``(line, why)`` of rows that could not be
    read (cut mid-line); ``warnings``: contradictions found.
    """

    source: str
    index: int
    line: int
    rows: tuple[Row, ...]
    columns: tuple[str, ...]
    collective: str | None
    candidates: tuple[str, ...]
    evidence: tuple[str, ...]
    nranks: int | None
    nranks_from: str
    binary: str | None = None
    devices: tuple[Device, ...] = ()
    devices_complete: bool = False
    run: RunInfo | None = None
    nccl_version: str | None = None
    tests_version: str | None = None
    avg_busbw: float | None = None
    complete: bool = False
    elided: tuple[int, ...] = ()
    dropped: tuple[tuple[int, str], ...] = ()
    warnings: tuple[str, ...] = ()

    def hosts(self) -> tuple[tuple[str, int], ...]:
        """``((host, GPUs), ...)`` from the device lines, hosts in order of first appearance."""
        counts: dict[str, int] = {}
        for d in self.devices:
            counts[d.host] = counts.get(d.host, 0) + 1
        return tuple(counts.items())

    def gpu_names(self) -> tuple[str, ...]:
        """The distinct GPU names of the device lines, in order of appearance."""
        return tuple(dict.fromkeys(d.name for d in self.devices if d.name))

    def where(self, line: int | None = None) -> str:
        """``"file:line"`` for messages (the table's first line by default)."""
        return f"{self.source}:{self.line if line is None else line}"

    def machine_facts(self) -> MachineFacts:
        """What the file says about the machine, for :func:`treecoll.topo.machines.resolve_machine`:
        hosts only when the device list is complete."""
        from treecoll.topo.machines import MachineFacts

        return MachineFacts(
            source=self.where(),
            hosts=self.hosts() if self.devices_complete else (),
            gpu_names=self.gpu_names(),
            nranks=self.nranks,
        )


@dataclass(frozen=True)
class NcclTestsOutput:
    """A whole file: its header lines and its tables in file order."""

    source: str
    header: Header
    tables: tuple[Table, ...]
    warnings: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------- lines
_PREFIX = re.compile(
    r"""\A(?:
      \s*\[\d{1,9}(?:,\d{1,9})*\]<std(?:out|err)>:?   # Open MPI --tag-output
    | \s*\d{1,9}:\s                                  # srun -l, mpirun --prefix-rank style "0: "
    | \s*\[\d{1,9}\]\s                               # MPICH -prepend-rank "[0] "
    | \s*\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?\s   # kubectl logs --timestamps
    )""",
    re.X,
)
_NTHREAD = re.compile(
    r"nThread\s+(\d{1,9})\s+nGpus\s+(\d{1,9})\s+minBytes\s+(\d{1,20})\s+maxBytes\s+(\d{1,20})"
    r"\s+step:\s*(\d{1,20})\s*\((\w+)\)(.*)"
)
_SETTING = re.compile(r"([A-Za-z][A-Za-z ]{0,40}?):\s*(-?\d{1,12})\b")
_TESTS_VERSION = re.compile(r"nccl-tests version (\S+)(?:.*?nccl-library=(\d{1,9}))?")
_COLL_TEST = re.compile(r"Collective test (starting|concluded):\s*(\S+)")
_NCCL_VERSION = re.compile(r"NCCL version (\S+)")
_DEVICE = re.compile(
    r"Rank\s+(\d{1,9})(?:\s+Group\s+(\d{1,9}))?\s+Pid\s+(\d{1,12})\s+on\s+(\S+)\s+device\s+(\d{1,9})"
    r"\s+\[([^\]]*)\]\s*(.*)"
)
_HEADER_KEY = re.compile(r"(source|machine|nccl|env|note):\s*(.*)")
_OOB = re.compile(r"Out of bounds values\s*:\s*(\d{1,20})")
_AVG = re.compile(r"Avg bus bandwidth\s*:\s*(\S+)")
_ELISION = re.compile(r"(?:\.{3,}|\u2026)|Truncated\b.*", re.I)
_BINARY = re.compile(
    r"\b(all_reduce|all_gather|reduce_scatter|alltoallv?|broadcast|reduce|sendrecv|gather|scatter"
    r"|hypercube)_perf(?:_mpi)?\b"
)
_INT = re.compile(r"-?\d{1,19}")
_FLOAT = re.compile(r"[-+]?(?:\d{1,20}(?:\.\d{0,20})?|\.\d{1,20})(?:[eE]([-+]?\d{1,3}))?")
_WORD = re.compile(r"[A-Za-z_][\w.]{0,40}")
_LEAD = ("size", "count", "type", "redop", "root")
_TIME = ("time", "cputime")
_WRONG = ("#wrong", "wrong", "error")


def _strip_prefix(line: str) -> str:
    for _ in range(3):
        m = _PREFIX.match(line)
        if not m:
            break
        line = line[m.end() :]
    return line


def _number(tok: str) -> tuple[float, float] | None:
    """``(value, half of the last printed digit)`` of a printed number, or None."""
    m = _FLOAT.fullmatch(tok)
    if not m:
        return None
    v = float(tok)
    if not math.isfinite(v):
        return None
    mant = tok.split("e")[0].split("E")[0]
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    exp = int(m.group(1)) if m.group(1) else 0
    return v, 0.5 * 10.0 ** (exp - decimals)


@dataclass
class _Layout:
    """Where a row's fields are: the lead columns (size count type [redop] [root]) and one run's columns."""

    lead: tuple[str, ...]
    group: tuple[str, ...]
    groups: int = 2

    @property
    def width(self) -> int:
        return len(self.lead) + self.groups * len(self.group)


_GROUP4 = ("time", "algbw", "busbw", "#wrong")


def _header_layout(tokens: list[str]) -> _Layout | None:
    names = [t.lstrip("#").lower() for t in tokens]
    times = [i for i, t in enumerate(names) if t in _TIME]
    if not times or any(n not in _LEAD for n in names[: times[0]]) or names[:3] != ["size", "count", "type"]:
        return None
    end = times[1] if len(times) > 1 else len(names)
    group = tuple("#wrong" if n in _WRONG else n for n in names[times[0] : end])
    if not {"algbw", "busbw"} <= set(group):
        return None
    return _Layout(tuple(names[: times[0]]), group, 2 if len(times) > 1 else 1)


def _infer_layout(tokens: list[str]) -> _Layout:
    """The layout of a row printed without a header line."""
    lead = ["size", "count", "type"]
    i = 3
    if len(tokens) > i and _WORD.fullmatch(tokens[i]) and tokens[i] != "N/A":
        lead.append("redop")
        i += 1
    rest = len(tokens) - i
    if rest >= 5 and _INT.fullmatch(tokens[i]) and rest % 4 == 1:  # a root before whole runs of 4 columns
        lead.append("root")
    return _Layout(tuple(lead), _GROUP4)


class _RowError(Exception):
    pass


def _measure(vals: list[str], group: tuple[str, ...]) -> tuple[Measurement, list[tuple[float, float, float, float]]]:
    got: dict[str, tuple[float, float]] = {}
    wrong: float | None = None
    for name, tok in zip(group, vals):
        if name == "#wrong":
            if tok.upper() == "N/A":
                wrong = None
            else:
                w = _number(tok)
                if w is None:
                    raise _RowError(f"expected a number or N/A in column #wrong, got {tok!r}")
                wrong = w[0]
        elif name in ("time", "cputime", "algbw", "busbw"):
            v = _number(tok)
            if v is None or v[0] < 0:
                raise _RowError(f"expected a number >= 0 in column {name}, got {tok!r}")
            got["time" if name == "cputime" else name] = v
    t, a, b = got["time"], got["algbw"], got["busbw"]
    return Measurement(t[0], a[0], b[0], wrong), [(a[0], a[1], b[0], b[1])]


def _parse_row(tokens: list[str], lay: _Layout, no: int) -> tuple[Row, list]:
    nlead = len(lay.lead)
    if len(tokens) < lay.width:
        raise _RowError(f"row ends after {len(tokens)} of {lay.width} columns (cut mid-line?)")
    lead = dict(zip(lay.lead, tokens[:nlead]))
    for key in ("size", "count"):
        if not _INT.fullmatch(lead[key]) or lead[key].startswith("-"):
            raise _RowError(f"expected a whole number in column {key}, got {lead[key]!r}")
    if not _WORD.fullmatch(lead["type"]):
        raise _RowError(f"expected a type name (float, double, ...) in column type, got {lead['type']!r}")
    redop = lead.get("redop")
    if redop is not None and not _WORD.fullmatch(redop):
        raise _RowError(f"expected an operation name (sum, none, ...) in column redop, got {redop!r}")
    root = lead.get("root")
    if root is not None and not _INT.fullmatch(root):
        raise _RowError(f"expected an integer in column root, got {root!r}")
    g = len(lay.group)
    runs, bws = [], []
    for k in range(lay.groups):
        m, bw = _measure(tokens[nlead + k * g : nlead + (k + 1) * g], lay.group)
        runs.append(m)
        bws.extend(bw)
    row = Row(
        no,
        int(lead["size"]),
        int(lead["count"]),
        lead["type"],
        redop,
        None if root is None else int(root),
        runs[0],
        runs[1] if len(runs) > 1 else None,
    )
    return row, bws


# ---------------------------------------------------------------------------------------------- parsing
@dataclass
class _Block:
    """What a run prints before its table(s): settings, devices, versions, binary."""

    run: RunInfo | None = None
    devices: list[Device] = field(default_factory=list)
    devices_elided: bool = False
    tests_version: str | None = None
    nccl_version: str | None = None
    binary: str | None = None
    used: bool = False  # a table took this block's facts


@dataclass
class _Open:
    """A table being read."""

    line: int
    layout: _Layout | None
    columns: tuple[str, ...]
    block: _Block
    binary_hint: str | None
    rows: list[Row] = field(default_factory=list)
    bws: list[list] = field(default_factory=list)
    elided: list[int] = field(default_factory=list)
    dropped: list[tuple[int, str]] = field(default_factory=list)
    avg_busbw: float | None = None
    complete: bool = False


class _Reader:
    def __init__(self, source: str):
        self.source = source
        self.header: dict[str, str] = {}
        self.block = _Block()
        self.hint: str | None = None  # a binary named by chatter (a command line) before a table
        self.open: _Open | None = None
        self.done: list[_Open] = []
        self.warnings: list[str] = []

    # -- blocks and tables
    def _fresh_block(self) -> None:
        if self.block.used or self.open is not None:
            self._close()
            self.block = _Block()

    def _close(self, complete: bool = False) -> None:
        t = self.open
        if t is None:
            return
        t.complete = t.complete or complete
        if t.rows:
            self.done.append(t)
            t.block.used = True
            self.hint = None
        self.open = None

    def _open(self, no: int, layout: _Layout | None, columns: tuple[str, ...]) -> None:
        self._close()
        if self.block.used:
            prev = self.block
            self.block = _Block(
                run=prev.run,
                devices=prev.devices,
                devices_elided=prev.devices_elided,
                tests_version=prev.tests_version,
                nccl_version=prev.nccl_version,
                binary=prev.binary,
            )
        self.open = _Open(no, layout, columns, self.block, self.hint)

    # -- one line
    def feed(self, no: int, raw: str) -> None:
        s = _strip_prefix(raw).strip()
        if not s:
            return
        comment = s.startswith("#")
        body = s.lstrip("#").strip() if comment else s
        if not body:
            return
        tokens = body.split()
        if comment:
            m = _HEADER_KEY.fullmatch(body)
            if m and not self.done and self.open is None:
                self.header.setdefault(m.group(1), m.group(2).strip())
                return
        if self._meta(no, body, tokens):
            return
        if tokens[0].isdigit() and len(tokens) >= 2 and tokens[1].isdigit() and not comment:
            self._row(no, tokens)
            return
        if self.open is None or not self.open.rows:
            b = _BINARY.findall(body)
            if b:
                self.hint = b[-1] + "_perf"

    def _meta(self, no: int, body: str, tokens: list[str]) -> bool:
        """Lines nccl-tests prints around its tables; True when ``body`` was one."""
        m = _NTHREAD.match(body)
        if m:
            self._fresh_block()
            settings = tuple((k.strip().lower(), int(v)) for k, v in _SETTING.findall(m.group(7)))
            self.block.run = RunInfo(
                no,
                int(m.group(1)),
                int(m.group(2)),
                int(m.group(3)),
                int(m.group(4)),
                int(m.group(5)),
                m.group(6),
                settings,
            )
            return True
        m = _TESTS_VERSION.match(body)
        if m:
            self._fresh_block()
            self.block.tests_version = m.group(1)
            if m.group(2):
                self.block.nccl_version = self.block.nccl_version or _nccl_code(int(m.group(2)))
            return True
        m = _COLL_TEST.match(body)
        if m:
            if m.group(1) == "starting":
                if self.block.binary is not None or self.block.used:
                    self._fresh_block()
                self.block.binary = m.group(2)
            else:
                self._close(complete=True)
            return True
        m = _DEVICE.match(body)
        if m:
            if self.open is not None or self.block.used:
                self._fresh_block()
            g = m.group
            self.block.devices.append(
                Device(
                    no, int(g(1)), None if g(2) is None else int(g(2)), int(g(3)), g(4), int(g(5)), g(6), g(7).strip()
                )
            )
            return True
        m = _NCCL_VERSION.match(body)
        if m:
            self.block.nccl_version = m.group(1)
            return True
        if _ELISION.fullmatch(body):
            if self.open is not None:
                self.open.elided.append(no)
            else:
                self.block.devices_elided = True
            return True
        m = _OOB.match(body)
        if m:
            return True
        m = _AVG.match(body)
        if m:
            if self.open is not None:
                v = _number(m.group(1))
                self.open.avg_busbw = v[0] if v else None
            self._close(complete=True)
            return True
        if body == "Using devices" or body.startswith("Reducing maxBytes"):
            return True
        if tokens[0].lower() in ("size", "#size") and len(tokens) >= 3:
            lay = _header_layout(tokens)
            if lay is not None:
                self._open(no, lay, tuple(t.lstrip("#").lower() for t in tokens))
                return True
        if tokens[0] == "(B)" or ("out-of-place" in tokens and "in-place" in tokens):
            if tokens[0] != "(B)" and self.open is not None and self.open.rows:
                self._close()
            return True
        return False

    def _row(self, no: int, tokens: list[str]) -> None:
        t = self.open
        lay = t.layout if t is not None and t.layout is not None else _infer_layout(tokens)
        try:
            row, bws = _parse_row(tokens, lay, no)
        except _RowError as e:
            if t is not None:
                t.dropped.append((no, str(e)))
            return
        if t is not None and t.rows:
            last = t.rows[-1]
            if (row.type, row.redop, row.root) != (last.type, last.redop, last.root) or row.size < last.size:
                layout, columns = t.layout, t.columns
                self._close(complete=True)
                self._open(no, layout, columns)
                t = self.open
        if t is None:
            self._open(no, None, ())
            t = self.open
        if t.layout is None:  # no header: the first row read fixes the layout of the table
            t.layout = lay
        t.rows.append(row)
        t.bws.append(bws)

    # -- the result
    def result(self) -> NcclTestsOutput:
        dropped_open = self.open.dropped if self.open is not None else []
        self._close()
        if not self.done:
            where = f"{self.source}:{dropped_open[0][0]}" if dropped_open else self.source
            why = f" ({dropped_open[0][1]})" if dropped_open else ""
            raise NcclTestsError(
                f"{where}: no nccl-tests table{why}: expected rows like {_EXAMPLE_ROW} (size, "
                f"count, type, ... time, algbw, busbw per run)"
            )
        header = Header(**{k: self.header.get(k) for k in ("source", "machine", "nccl", "env", "note")})
        file_hint = _header_binary(header)
        tables = tuple(_finish(self.source, i, t, file_hint) for i, t in enumerate(self.done))
        return NcclTestsOutput(self.source, header, tables, tuple(self.warnings))


def _nccl_code(code: int) -> str:
    """NCCL's version code (``nccl-library=22902``) as a version: 2.29.2 (codes before 2.9: 2.8.4 = 2804)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _header_binary(h: Header) -> str | None:
    """The one binary the fixture header lines name (their command line), or None."""
    found = {b for v in (h.machine, h.env, h.note) if v for b in _BINARY.findall(v)}
    return f"{found.pop()}_perf" if len(found) == 1 else None


# ---------------------------------------------------------------------------------------------- recognition
def _ratio_interval(bws: list[list]) -> tuple[float, float] | None:
    """The busbw/algbw interval every printed measurement allows (printed digits are rounded)."""
    lo, hi, ratios = 0.0, math.inf, []
    for row in bws:
        for a, ea, b, eb in row:
            if a - ea <= 0 or b <= 0:
                continue
            lo = max(lo, max(b - eb, 0.0) / (a + ea))
            hi = min(hi, (b + eb) / (a - ea))
            if a >= 1.0:
                ratios.append(b / a)
    if not ratios:
        return None
    if lo <= hi * (1 + 1e-7):  # nccl-tests prints busbw = algbw x factor: the intervals of all rows meet
        return lo * (1 - 1e-7), hi * (1 + 1e-7)
    m = statistics.median(ratios)
    return m * 0.99, m * 1.01


def _nranks_by_ratio(collective: str, lo: float, hi: float) -> tuple[int, float] | None:
    """``(smallest, largest)`` GPU counts (``math.inf`` unbounded) whose bus factor lies in [lo, hi], or None."""
    if collective in _UNIT:
        return (1, math.inf) if lo <= 1.0 <= hi else None
    scale = 2.0 if collective == "allreduce" else 1.0  # factor = scale (n-1)/n: n = scale / (scale - f)
    nlo = scale / (scale - lo) if lo < scale else math.inf
    nhi = scale / (scale - hi) if hi < scale else math.inf
    first, last = max(2, math.ceil(nlo - 1e-9)), nhi
    if hi < 1e-9:  # busbw 0 at every size: one rank
        return 1, 1
    return (first, last) if first <= last + 1e-9 else None


def _count_ranks(rows: tuple[Row, ...]) -> tuple[int | None, str | None]:
    """size / (count x type size): 1 where the count is the whole buffer, the GPU count where it is per
    rank; ``(None, why)`` where the rows disagree (a hand-edited column)."""
    ks: dict[int, list[int]] = {}
    for r in rows:
        tb = TYPE_BYTES.get(r.type)
        if tb is None or r.size <= 0 or r.count <= 0:
            continue
        k = r.size / (r.count * tb)
        key = round(k) if abs(k - round(k)) < 1e-9 and round(k) >= 1 else -1
        ks.setdefault(key, []).append(r.line)
    if not ks:
        return None, None
    if len(ks) == 1 and -1 not in ks:
        return next(iter(ks)), None
    lines = sorted(ln for v in ks.values() for ln in v)
    return None, f"the count column disagrees with size / type size between rows (lines {lines[0]}..{lines[-1]})"


def recognise(
    rows: tuple[Row, ...],
    columns: tuple[str, ...],
    binary: str | None,
    *,
    nranks: int | None = None,
    bws: list | None = None,
) -> tuple[str | None, tuple[str, ...], tuple[str, ...], list[str]]:
    """Which collective a table measured: ``(collective or None, candidates, evidence, warnings)``.

    ``columns``: the header's names (empty without a header: the rows' own fields decide);
    ``binary``: a binary name the output printed; ``nranks``: the GPU count when the device lines
    give it; ``bws``: per row ``[(algbw, ±, busbw, ±), ...]`` (from the printed digits; default:
    the rows' values to two decimals).

    >>> row = Row(1, 8388608, 2097152, "float", "sum", -1, Measurement(101.5, 82.65, 144.64, 0),
    ...           Measurement(99.0, 84.73, 148.28, 0))
    >>> recognise((row,), (), None)[:2]
    ('allreduce', ('allreduce',))
    """
    cand = list(COLLECTIVES)
    ev: list[str] = []
    warn: list[str] = []
    if bws is None:
        bws = [[(m.algbw, 0.005, m.busbw, 0.005) for m in (r.out_of_place, r.in_place) if m] for r in rows]

    def keep(allowed, why: str) -> None:
        nonlocal cand
        new = [c for c in cand if c in allowed]
        if new != cand:
            ev.append(why)
        cand = new

    has_root = "root" in columns or any(r.root is not None for r in rows)
    has_redop = "redop" in columns or any(r.redop is not None for r in rows)
    roots = {r.root for r in rows if r.root is not None}
    if has_root and roots and min(roots) >= 0:
        keep(("broadcast", "reduce"), f"root {min(roots)}")
    elif has_root and roots == {-1}:
        keep([c for c in COLLECTIVES if c not in ("broadcast", "reduce")], "root -1")
    elif not has_root:
        keep([c for c in COLLECTIVES if c not in ("broadcast", "reduce")], "no root column")
    redops = {r.redop for r in rows if r.redop is not None}
    if has_redop and redops == {"none"}:
        keep(("allgather", "alltoall", "broadcast"), "redop none")
    elif has_redop and redops and "none" not in redops:
        keep(("allreduce", "reduce_scatter", "reduce", "sendrecv"), f"redop {sorted(redops)[0]}")
    elif not has_redop:
        keep(("allgather", "sendrecv", "broadcast"), "no redop column (old format)")
    oop = [r.out_of_place.wrong for r in rows]
    inp = [r.in_place.wrong for r in rows if r.in_place is not None]
    if inp and any(w is not None for w in oop) and all(w is None for w in inp):
        keep(_NO_INPLACE_CHECK, "in-place #wrong N/A")
    elif any(w is not None for w in inp):
        keep([c for c in COLLECTIVES if c not in _NO_INPLACE_CHECK], "in-place #wrong checked")
    k, why = _count_ranks(rows)
    if why:
        warn.append(why)
    elif k == 1 and (nranks is None or nranks > 1):
        keep(("allreduce", "broadcast", "reduce", "sendrecv"), "count = size / type size")
    elif k is not None and k > 1:
        keep(_PER_RANK, f"count = size / ({k} x type size)")
        if nranks is not None and nranks != k:
            warn.append(f"the count column implies {k} ranks, the device lines list {nranks}")
    interval = _ratio_interval(bws)
    if interval is not None:
        lo, hi = interval
        if nranks is not None:
            keep(
                [c for c in cand if lo <= bus_factor(c, nranks) <= hi],
                f"busbw/algbw {(lo + hi) / 2:.4f} with {nranks} ranks",
            )
        else:
            keep([c for c in cand if _nranks_by_ratio(c, lo, hi) is not None], f"busbw/algbw {(lo + hi) / 2:.4f}")
    if binary is not None:
        b = BINARIES.get(binary)
        if b is None:
            return (
                None,
                (),
                (*ev, f"binary {binary}"),
                [*warn, f"{binary}: not one of the collectives treecoll reads ({', '.join(BINARIES)})"],
            )
        if b in cand:
            return b, (b,), (f"binary {binary}", *ev), warn
        return (
            None,
            tuple(dict.fromkeys((b, *cand))),
            (f"binary {binary}", *ev),
            [*warn, f"the binary {binary} and the table's columns ({'; '.join(ev)}) disagree"],
        )
    if len(cand) == 1:
        return cand[0], tuple(cand), tuple(ev), warn
    if not cand:
        warn.append(f"the columns contradict each other ({'; '.join(ev)})")
    return None, tuple(cand), tuple(ev), warn


def _ranks(
    cands: tuple[str, ...], t: _Open, devices: tuple[Device, ...], complete: bool, warn: list[str]
) -> tuple[int | None, str]:
    """The GPU count and which evidence gave it (``cands``: the collective, or the candidates when it is
    ambiguous; the count and ratio tests count only where every candidate agrees); contradictions
    become warnings."""
    n_dev = len(devices) if complete else None
    n_min = max((d.rank for d in devices), default=-1) + 1
    run = t.block.run
    per_proc = run.nthread * run.ngpus if run is not None and run.nthread > 0 and run.ngpus > 0 else None
    n_count = _count_ranks(tuple(t.rows))[0] if cands and all(c in _PER_RANK for c in cands) else None
    n_ratio = None
    interval = _ratio_interval(t.bws)
    if cands and interval is not None and not any(c in _UNIT for c in cands):
        fits = {_nranks_by_ratio(c, *interval) for c in cands}
        rng = fits.pop() if len(fits) == 1 else None
        if rng is not None and math.floor(rng[1] + 1e-9) == rng[0]:  # one whole number fits
            n_ratio = rng[0]
    found = [
        (n, why)
        for n, why in ((n_dev, "device lines"), (n_count, "count column"), (n_ratio, "busbw/algbw"))
        if n is not None
    ]
    if not found:
        return None, ""
    n, src = found[0]
    for m, why in found[1:]:
        if m != n:
            warn.append(f"the {why} imply {m} ranks, the {src} {n}")
    if n_dev is None and n < n_min:
        warn.append(f"the {src} imply {n} ranks, but the device lines show rank {n_min - 1}")
    if per_proc and n % per_proc:
        warn.append(f"{n} ranks is not a multiple of nThread x nGpus = {per_proc} per process")
    return n, src


def _finish(source: str, index: int, t: _Open, file_hint: str | None) -> Table:
    blk = t.block
    devices = tuple(blk.devices)
    complete = bool(devices) and not blk.devices_elided and sorted(d.rank for d in devices) == list(range(len(devices)))
    rows = tuple(t.rows)
    binary = blk.binary or t.binary_hint or file_hint
    coll, cand, ev, warn = recognise(rows, t.columns, binary, nranks=len(devices) if complete else None, bws=t.bws)
    if blk.binary is None and binary is not None and coll is None and cand and BINARIES.get(binary) == cand[0]:
        # a command line or the fixture header named it; the table disagrees: do not trust the hint
        coll2, cand2, ev2, warn2 = recognise(
            rows, t.columns, None, nranks=len(devices) if complete else None, bws=t.bws
        )
        if coll2 is not None:
            coll, cand, ev, warn = (
                coll2,
                cand2,
                ev2,
                [*warn2, f"ignored the binary {binary} named outside the output: the table is {coll2}"],
            )
            binary = None
    n, src = _ranks((coll,) if coll else cand, t, devices, complete, warn)
    return Table(
        source=source,
        index=index,
        line=t.line,
        rows=rows,
        columns=t.columns,
        collective=coll,
        candidates=cand,
        evidence=ev,
        nranks=n,
        nranks_from=src,
        binary=binary,
        devices=devices,
        devices_complete=complete,
        run=blk.run,
        nccl_version=blk.nccl_version,
        tests_version=blk.tests_version,
        avg_busbw=t.avg_busbw,
        complete=t.complete,
        elided=tuple(t.elided),
        dropped=tuple(t.dropped),
        warnings=tuple(warn),
    )


# ---------------------------------------------------------------------------------------------- entry points
def parse(text: str | bytes, source: str = "<text>") -> NcclTestsOutput:
    """Read nccl-tests output from ``text`` (or UTF-8 bytes); ``source`` names it in messages. Raises
    :class:`NcclTestsError` when no table row can be read."""
    if isinstance(text, (bytes, bytearray)):
        text = decode_text(bytes(text), source, "nccl-tests output", error=NcclTestsError)
    if not isinstance(text, str):
        raise NcclTestsError(f"{source}: expected text, got {type(text).__name__}")
    reader = _Reader(source)
    for no, line in enumerate(text.split("\n"), 1):
        reader.feed(no, line.rstrip("\r"))
    return reader.result()


def read(path: str | os.PathLike) -> NcclTestsOutput:
    """Read an nccl-tests output file (UTF-8 text, at most :data:`MAX_FILE_BYTES`)."""
    p = Path(path)
    try:
        size = p.stat().st_size if p.is_file() else 0
    except OSError:
        size = 0
    if size > MAX_FILE_BYTES:
        raise NcclTestsError(
            f"{p}: {size:,} bytes: expected an nccl-tests output of at most {MAX_FILE_BYTES:,} "
            f"bytes; cut the table out of the log"
        )
    return parse(read_text(p, "nccl-tests output", error=NcclTestsError), str(p))
