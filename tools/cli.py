"""The ``treecoll`` command line: a small, stable dispatcher over subcommand modules.

Adding a subcommand (``tree``, ``simulate``, ``decode``, ``emu``, ...)
----------------------------------------------------------------------
Write a module exposing two functions and add ONE line to :data:`COMMANDS`::

    def add_parser(subparsers) -> argparse.ArgumentParser:
        p = subparsers.add_parser("tree", help="...")   # may add its own sub-subparsers
        common_options(p)                               # --json / --debug after the command too
        ...
        return p

    def run(args) -> int:
        data = {...}                          # 1. build a plain dict (JSON-serialisable)
        return emit(args, data, render_text)  # 2. --json prints it, else render_text(data) -> str

Rules every command follows: user errors raise a :class:`topo.errors.TreecollError`
subclass (the dispatcher prints ONE line on stderr and returns 1; ``--debug``
adds the traceback); ``run`` returns an exit code and never calls ``sys.exit``;
no output other than through ``emit`` (or a file the user asked for);
heavy imports (torch, triton, matplotlib) happen inside ``run``, never at
module import, since every command module is imported to build the parser
(``treecoll topo ...`` must stay fast and work without torch; a test checks).
Command-line syntax errors (unknown option, missing argument) are user errors
too: one line, exit code 1. Ctrl-C is one line and exit code 130. ``main(argv)``
is what tests call.

Files the user asks a command to write (``-o``, ``--plot``, ``--xml``) go
through :func:`output_path` before any work (its directory exists, it is not a
directory, not one of the command's input files, an image has an image suffix)
and :func:`write_output` (written whole or not at all). An existing output file
is replaced; every such option says "(replaced if it exists)" in ``--help``
(:data:`REPLACES`).

>>> main(["topo", "path", "default", "h0/gpu0", "h0/gpu1", "--json"])  # doctest: +ELLIPSIS
{...NV18...}
0
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from topo.errors import TreecollError

__all__ = ["main", "build_parser", "common_options", "emit", "UsageError", "COMMANDS", "output_path",
           "write_output", "atomic_output", "positive", "REPLACES", "IMAGE_SUFFIXES"]

#: subcommand modules, in the order ``--help`` lists them (one line per module)
COMMANDS = [
    "tools.cmd_topo",
    "tools.cmd_decode",
    "tools.cmd_tree",
    "tools.cmd_simulate",
    "tools.emucluster.cli",
]


class UsageError(TreecollError):
    """A command-line syntax error (argparse's complaints, as one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and sys.exit(2)
        raise UsageError(f"{self.prog}: {message}; see '{self.prog} --help'")


def common_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--json`` and ``--debug`` to a (sub)parser, so they work after the command name too."""
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print the result as JSON instead of text")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the traceback of an error")
    return p


def emit(args: argparse.Namespace, data: Any, render: Callable[[Any], str] | None = None) -> int:
    """Print ``data`` as JSON (``--json``) or through ``render`` (text); returns 0."""
    if getattr(args, "json", False) or render is None:
        print(json.dumps(data, indent=2, ensure_ascii=False, default=str))
    else:
        text = render(data)
        print(text, end="" if text.endswith("\n") else "\n")
    return 0


#: appended to the help of every option naming a file to write
REPLACES = "(replaced if it exists)"
#: image formats matplotlib's Agg backend writes (``savefig`` infers the format from the suffix)
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")


def positive(option: str, value, *, minimum: int = 1, maximum: int | None = None) -> None:
    """Raise :class:`UsageError` unless ``minimum <= value <= maximum``:
    ``"--ranks: expected a positive integer, got 0"``."""
    if value < minimum:
        want = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise UsageError(f"{option}: expected {want}, got {value}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{option}: expected at most {maximum}, got {value}")


def output_path(path: str, option: str = "-o", *, inputs: Sequence[str | None] = (),
                suffixes: Sequence[str] | None = None) -> str:
    """Check a file the user asked a command to write, before the command does any work.

    Raises :class:`UsageError` (one line naming ``option``) when the path is a
    directory, its directory does not exist or is not writable, it is the same
    file as one of ``inputs`` (writing would destroy what the user gave), or its
    suffix is not in ``suffixes``. Returns ``path``; an existing file is replaced.
    """
    p = Path(path)
    where = f"{option} {path}"
    if not str(path).strip():
        raise UsageError(f"{option}: expected a file name, got an empty string")
    if p.is_dir():
        raise UsageError(f"{where}: expected a file name, got a directory; name a file inside it, "
                         f"e.g. {p / ('out' + (suffixes[0] if suffixes else ''))}")
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise UsageError(f"{where}: expected a file name ending in {', '.join(suffixes)}, got "
                         f"{repr(p.suffix) if p.suffix else 'no suffix'}")
    parent = p.parent
    if not parent.exists():
        raise UsageError(f"{where}: expected an existing directory, got {str(parent)!r} which does not exist; "
                         f"create it first (mkdir -p {parent})")
    if not parent.is_dir():
        raise UsageError(f"{where}: expected {str(parent)!r} to be a directory, got a file")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{where}: expected a writable location, got permission denied")
    for inp in inputs:
        if inp is not None and p.exists() and Path(inp).exists():
            with contextlib.suppress(OSError):
                if os.path.samefile(p, inp):
                    raise UsageError(f"{where}: expected a new file, got the input file {inp} itself "
                                     f"(writing would destroy it); choose another name")
    return str(path)


@contextlib.contextmanager
def atomic_output(path: str, option: str = "-o"):
    """Yield a temporary path beside ``path`` (same suffix); when the block succeeds it
    replaces ``path``, else it is removed: a failed write never leaves ``path`` half written."""
    p = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=p.suffix, dir=p.parent)
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot write: {e.strerror or e}") from None
    os.close(fd)
    try:
        yield tmp
        try:
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, p)
        except OSError as e:
            raise UsageError(f"{option} {path}: cannot write: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_output(path: str, text: str, option: str = "-o") -> int:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all; returns the bytes written."""
    data = text.encode("utf-8")
    with atomic_output(path, option) as tmp:
        try:
            Path(tmp).write_bytes(data)
        except OSError as e:
            raise UsageError(f"{option} {path}: cannot write: {e.strerror or e}") from None
    return len(data)


def build_parser() -> argparse.ArgumentParser:
    """The full parser: global options plus every module of :data:`COMMANDS`."""
    parser = _Parser(prog="treecoll", description="Topology-aware collectives and Tree Attention decoding.")
    parser.add_argument("--json", action="store_true", default=False, help="print results as JSON")
    parser.add_argument("--debug", action="store_true", default=False, help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        mod = importlib.import_module(name)
        p = mod.add_parser(sub)
        p.set_defaults(_module=mod)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``treecoll`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help / --version
            return int(e.code or 0) if not isinstance(e.code, str) else 1
        debug = getattr(args, "debug", False)
        return int(args._module.run(args) or 0)
    except TreecollError as e:
        if debug:
            traceback.print_exc()
        msg = " ".join(str(e).split("\n"))
        print(f"treecoll: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("treecoll: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `treecoll ... | head`
        return 0
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        # a file the user named that a reader without its own check could not read or write
        if isinstance(e, OSError) and not e.filename:
            raise  # not about a file: a bug or the network, keep the traceback
        if debug:
            traceback.print_exc()
        print(f"treecoll: error: {_io_message(e)}", file=sys.stderr)
        return 1


def _io_message(e: OSError | UnicodeDecodeError | yaml.YAMLError) -> str:
    """One line for an I/O error that escaped a command: names the file where Python knows it."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        m = e.problem_mark
        return f"{m.name}:{m.line + 1}: invalid YAML: {e.problem}; fix the syntax at column {m.column + 1}"
    if isinstance(e, yaml.YAMLError):
        return "invalid YAML: " + " ".join(str(e).split())
    if isinstance(e, UnicodeDecodeError):
        return (f"input file: expected UTF-8 text, got byte 0x{e.object[e.start]:02x} at offset {e.start}; "
                f"save the file as UTF-8")
    name = f"{e.filename}: " if getattr(e, "filename", None) else ""
    return f"{name}cannot read or write: {e.strerror or e}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
