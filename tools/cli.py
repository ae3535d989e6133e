"""The ``treecoll`` command line: a small, stable dispatcher over subcommand modules.

Adding a subcommand (``tree``, ``simulate``, ``decode``, ``emu``, ...)
----------------------------------------------------------------------
Write a module exposing two functions and add ONE line to :data:`COMMANDS`::

    def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        p = subparsers.add_parser("tree", help="...")   # may add its own sub-subparsers
        common_options(p)                               # --json / --debug after the command too
        ...
        return p

    def run(args) -> int:
        data = {...}                          # 1. build a plain dict (JSON-serialisable)
        return emit(args, data, render_text)  # 2. --json prints it, else render_text(data) -> str

Rules every command follows: user errors raise a :class:`treecoll.topo.errors.TreecollError`
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
import math
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from treecoll.tools.units import UsageError, positive
from treecoll.topo.errors import TreecollError

__all__ = [
    "main",
    "build_parser",
    "common_options",
    "emit",
    "UsageError",
    "COMMANDS",
    "output_path",
    "walk",
    "subcommands",
    "refuse_empty_values",
    "guarded",
    "script_main",
    "write_output",
    "atomic_output",
    "positive",
    "REPLACES",
    "IMAGE_SUFFIXES",
]

#: subcommand modules, in the order ``--help`` lists them (one line per module)
COMMANDS = [
    "treecoll.tools.cmd_topo",
    "treecoll.tools.cmd_decode",
    "treecoll.tools.cmd_generate",
    "treecoll.tools.cmd_tree",
    "treecoll.tools.cmd_simulate",
    "treecoll.tools.emucluster.cli",
    "treecoll.tools.cmd_selfcheck",
]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and sys.exit(2)
        names = subcommands(self)
        if names and message.startswith("the following arguments are required: "):
            message = f"expected a command, one of {', '.join(names)}"
        where = "" if self.prog == "treecoll" else f"{self.prog}: "
        raise UsageError(f"{where}{message}; see '{self.prog} --help'")


def subcommands(parser: argparse.ArgumentParser) -> list[str]:
    """The subcommand names of ``parser``, in the order its help lists them."""
    return [name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices]


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)parser of ``parser`` with its command path: ``(("topo", "show"), parser)``, ..."""
    yield path, parser
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from walk(sub, (*path, name))


def common_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--json`` and ``--debug`` to a (sub)parser, so they work after the command name too."""
    p.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON instead of text"
    )
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of an error")
    return p


def _strict(data: Any) -> Any:
    """``data`` with every NaN or infinite float as None: JSON (RFC 8259) has no NaN nor Infinity,
    and parsers such as jq refuse them (an algbw over a zero time is infinite)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _strict(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_strict(v) for v in data]
    return data


def emit(args: argparse.Namespace, data: Any, render: Callable[[Any], str] | None = None) -> int:
    """Print ``data`` as JSON (``--json``; a NaN or infinite number is null) or through ``render``
    (text); returns 0."""
    if getattr(args, "json", False) or render is None:
        print(json.dumps(_strict(data), indent=2, ensure_ascii=False, default=str, allow_nan=False))
    else:
        text = render(data)
        print(text, end="" if text.endswith("\n") else "\n")
    return 0


#: appended to the help of every option naming a file to write
REPLACES = "(replaced if it exists)"
#: image formats matplotlib's Agg backend writes (``savefig`` infers the format from the suffix)
IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")


def output_path(
    path: str, option: str = "-o", *, inputs: Sequence[str | None] = (), suffixes: Sequence[str] | None = None
) -> str:
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
        raise UsageError(
            f"{where}: expected a file name, got a directory; name a file inside it, "
            f"e.g. {p / ('out' + (suffixes[0] if suffixes else ''))}"
        )
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise UsageError(
            f"{where}: expected a file name ending in {', '.join(suffixes)}, got "
            f"{repr(p.suffix) if p.suffix else 'no suffix'}"
        )
    parent = p.parent
    if not parent.exists():
        raise UsageError(
            f"{where}: expected an existing directory, got {str(parent)!r} which does not exist; "
            f"create it first (mkdir -p {parent})"
        )
    if not parent.is_dir():
        raise UsageError(f"{where}: expected {str(parent)!r} to be a directory, got a file")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{where}: expected a writable location, got permission denied")
    for inp in inputs:
        if inp is not None and p.exists() and Path(inp).exists():
            with contextlib.suppress(OSError):
                if os.path.samefile(p, inp):
                    raise UsageError(
                        f"{where}: expected a new file, got the input file {inp} itself "
                        f"(writing would destroy it); choose another name"
                    )
    return str(path)


@contextlib.contextmanager
def atomic_output(path: str, option: str = "-o") -> Iterator[str]:
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
    for listed in sub._choices_actions:  # the top-level help lists every subcommand of a command
        names = subcommands(sub.choices[listed.dest])
        if names:
            listed.help = f"{listed.help}: {', '.join(names)}"
    for _, p in walk(parser):
        p.set_defaults(_prog=p.prog)  # the deepest parser's name, for errors found after parsing
    refuse_empty_values(parser)
    return parser


def refuse_empty_values(parser: argparse.ArgumentParser) -> None:
    """Give every text option and positional of ``parser`` (and its subcommands) that has no parser
    of its own :func:`treecoll.tools.units.text_arg`: an empty ``--topology ""`` or ``--id ""`` is an error,
    never a silent default (or every cluster)."""
    from treecoll.tools.units import text_arg

    for _, p in walk(parser):
        for a in p._actions:
            if (
                isinstance(a, argparse._StoreAction)
                and a.type is None
                and a.choices is None
                and a.nargs not in (argparse.REMAINDER, 0)
            ):
                name = "/".join(a.option_strings) or a.metavar or a.dest
                a.type = text_arg(name, "a value")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``treecoll`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return guarded(lambda: _dispatch(argv), debug=_wants_debug(argv))


def script_main(main_fn: Callable[[list[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run a benchmark script's ``main_fn(argv)`` under the command line's error rules
    (:func:`guarded`, the script's file name in the message); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return guarded(lambda: main_fn(argv), debug=_wants_debug(argv), prog=Path(sys.argv[0]).name or "treecoll")


def _wants_debug(argv: list[str]) -> bool:
    return "--debug" in (argv[: argv.index("--")] if "--" in argv else argv)


def _dispatch(argv: list[str]) -> int:
    try:
        args, extra = build_parser().parse_known_args(argv)
    except SystemExit as e:  # --help / --version
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    if extra:
        raise UsageError(f"{args._prog}: unrecognized arguments: {' '.join(extra)}; see '{args._prog} --help'")
    return int(args._module.run(args) or 0)


def guarded(fn: Callable[[], int], *, debug: bool = False, prog: str = "treecoll") -> int:
    """``fn()``'s exit code; a user error (a :class:`TreecollError`, a file that cannot be read)
    is one line on stderr and exit code 1, Ctrl-C one line and 130; ``debug`` adds the traceback."""
    try:
        return int(fn() or 0)
    except TreecollError as e:
        if debug:
            traceback.print_exc()
        msg = " ".join(str(e).split("\n"))
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `treecoll ... | head`
        return 0
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        # a file the user named that a reader without its own check could not read or write
        if isinstance(e, OSError) and not e.filename:
            raise  # not about a file: a bug or the network, keep the traceback
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {_io_message(e)}", file=sys.stderr)
        return 1


def _io_message(e: OSError | UnicodeDecodeError | yaml.YAMLError) -> str:
    """One line for an I/O error that escaped a command: names the file where Python knows it."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        m = e.problem_mark
        return f"{m.name}:{m.line + 1}: invalid YAML: {e.problem}; fix the syntax at column {m.column + 1}"
    if isinstance(e, yaml.YAMLError):
        return "invalid YAML: " + " ".join(str(e).split())
    if isinstance(e, UnicodeDecodeError):
        return (
            f"input file: expected UTF-8 text, got byte 0x{e.object[e.start]:02x} at offset {e.start}; "
            f"save the file as UTF-8"
        )
    name = f"{e.filename}: " if getattr(e, "filename", None) else ""
    return f"{name}cannot read or write: {e.strerror or e}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
