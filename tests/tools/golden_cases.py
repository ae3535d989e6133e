"""The `treecoll` commands whose exact output tests/tools/golden/ holds, and how to regenerate it.

The tests only read the golden files. After an intended change of an output,
regenerate them as a separate step and review the diff before committing:

    .venv/bin/python -m tests.tools.golden_cases        # from the repository root
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "golden"

#: golden file name -> the command line whose standard output it holds
CASES = {
    "topo_show_dgx-h100-x2.txt": ["topo", "show", "dgx-h100-x2"],
    "topo_matrix_dgx-h100.txt": ["topo", "matrix", "dgx-h100"],
    "topo_matrix_gb200_tray3.txt": ["topo", "matrix", "gb200-nvl72", "--host", "tray3"],
    "topo_path_default_cross_rail.txt": ["topo", "path", "default", "h0/gpu0", "h1/gpu3"],
    "topo_path_cpu-local_ranks.txt": ["topo", "path", "cpu-local", "r0", "r1"],
    "topo_export_dot_cpu-local.txt": ["topo", "export", "cpu-local", "--format", "dot"],
    "topo_show_cpu-local.json": ["topo", "show", "cpu-local", "--json"],
}


def regenerate() -> list[str]:
    """Run every case and write its output to its golden file; returns the files that changed."""
    from treecoll.tools.cli import main

    changed = []
    for name, argv in CASES.items():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(list(argv))
        if rc != 0:
            raise SystemExit(f"{name}: treecoll {' '.join(argv)} exited with {rc}")
        path = GOLDEN / name
        if not path.exists() or path.read_text() != buf.getvalue():
            path.write_text(buf.getvalue())
            changed.append(name)
    return changed


if __name__ == "__main__":
    changed = regenerate()
    print("changed: " + (", ".join(changed) or "nothing"), file=sys.stderr)
