"""`treecoll --help` at every level: every subcommand describes itself, every option says what
it takes, enumerations list their values from the registries they come from."""

from __future__ import annotations

import argparse

import pytest
from treecoll.tools.cli import build_parser, main, subcommands, walk


def _options(p: argparse.ArgumentParser):
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        yield a


def test_every_subcommand_has_a_description_and_every_option_help():
    missing = []
    parsers = list(walk(build_parser()))
    for path, p in parsers:
        if not (p.description or "").strip():
            missing.append(f"treecoll {' '.join(path)}: no description")
        for a in _options(p):
            if a.help is None or not str(a.help).strip():
                missing.append(f"treecoll {' '.join(path)} {'/'.join(a.option_strings) or a.dest}: no help")
    assert missing == []
    assert len(parsers) >= 22  # the root, 5 commands and their 16 subcommands


def test_top_level_help_lists_every_subcommand_of_every_command(capsys):
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    root = build_parser()
    for name in subcommands(root):
        for sub in subcommands(dict(walk(root))[(name,)]):
            assert sub in out, (name, sub)
    for expected in ("discover", "import", "hints", "measure", "links"):
        assert expected in out


def _help_of(*path_and_option: str) -> str:
    *path, option = path_and_option
    p = dict(walk(build_parser()))[tuple(path)]
    (a,) = [a for a in p._actions if option in a.option_strings]
    return a.help


def test_enumerations_list_their_values_from_the_registries():
    from treecoll.collectives.builders import BUILDERS, INTER_KINDS, INTRA_KINDS
    from treecoll.collectives.sim.profiles import PROFILES
    from treecoll.collectives.sim.simulator import DTYPE_SIZES
    from treecoll.tools.cmd_simulate import COLLECTIVE_ALGOS

    for cmd in ("allreduce", "decode", "links"):
        assert all(name in _help_of("simulate", cmd, "--profile") for name in PROFILES), cmd
    for where in (
        ("simulate", "allreduce", "--algo"),
        ("simulate", "links", "--algo"),
        ("simulate", "decode", "--tree"),
        ("tree", "build", "--builder"),
    ):
        assert all(name in _help_of(*where) for name in BUILDERS), where
    for collective, (names, _) in COLLECTIVE_ALGOS.items():
        assert all(name in _help_of("simulate", collective, "--algo") for name in names), collective
    assert all(name in _help_of("simulate", "decode", "--dtype") for name in DTYPE_SIZES)
    assert all(name in _help_of("tree", "build", "--intra") for name in INTRA_KINDS)
    assert all(name in _help_of("tree", "build", "--inter") for name in INTER_KINDS)


@pytest.mark.parametrize(
    "argv, msg",
    [
        (
            [],
            "treecoll: error: expected a command, one of topo, decode, generate, tree, simulate, emu, selfcheck; "
            "see 'treecoll --help'",
        ),
        (
            ["tree"],
            "treecoll: error: treecoll tree: expected a command, one of build, show, check, draw, bruteforce; "
            "see 'treecoll tree --help'",
        ),
        (
            ["simulate", "links", "--topology", "default", "--bogus"],
            "treecoll: error: treecoll simulate links: unrecognized arguments: --bogus; "
            "see 'treecoll simulate links --help'",
        ),
    ],
)
def test_missing_command_and_unknown_option_name_the_level(capsys, argv, msg):
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", msg + "\n")
