"""``treecoll simulate validate`` over folders: the simulator against every nccl-tests table of the repository.

    python -m treecoll.tools.validate_sim [FILES or DIRS ...] [options of treecoll simulate validate]

A thin wrapper of ``treecoll simulate validate`` (:mod:`treecoll.tools.validation`):
folders are searched recursively for ``*.txt`` tables, and without any path
it validates every table of tests/fixtures/nccl-tests/ (its ``heldout/``
folder included). Every other argument goes to the command unchanged. The
error table per set (``fit`` and ``heldout`` tables apart, leave-one-out
calibration) is the benchmark :mod:`treecoll.tools.bench_validate`.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO / "tests" / "fixtures" / "nccl-tests"

__all__ = ["main", "expand", "DEFAULT_DIR"]


def expand(args: list[str]) -> list[str]:
    """``args`` with every existing folder replaced by its ``*.txt`` files (sorted, recursive) and the
    fixture tables added when no argument names a file or folder."""
    out, paths = [], 0
    for a in args:
        p = Path(a)
        if not a.startswith("-") and p.is_dir():
            out.extend(str(q) for q in sorted(p.rglob("*.txt")) if q.is_file())
            paths += 1
        else:
            out.append(a)
            paths += not a.startswith("-") and p.is_file()
    if not paths:
        out = [str(q) for q in sorted(DEFAULT_DIR.rglob("*.txt"))] + out
    return out


def main(argv: list[str] | None = None) -> int:
    from treecoll.tools.cli import main as cli_main

    return cli_main(["simulate", "validate", *expand(list(sys.argv[1:] if argv is None else argv))])


if __name__ == "__main__":
    sys.exit(main())
