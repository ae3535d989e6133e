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
too: one line, exit code 1. ``main(argv)`` is what tests call.

>>> main(["topo", "path", "default", "h0/gpu0", "h0/gpu1", "--json"])  # doctest: +ELLIPSIS
{...NV18...}
0
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from typing import Any, Callable, Sequence

from topo.errors import TreecollError

__all__ = ["main", "build_parser", "common_options", "emit", "UsageError", "COMMANDS"]

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
        return 130
    except BrokenPipeError:  # `treecoll ... | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
