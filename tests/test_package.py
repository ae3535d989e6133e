"""The distribution as a whole: one package, imports in one direction, every module documented by examples."""
from __future__ import annotations

import doctest
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("_root_conftest", ROOT / "conftest.py")
_layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_layout)
PACKAGES, installed_name = _layout.PACKAGES, _layout.installed_name

MODULES = sorted(n for folder in PACKAGES for p in (ROOT / folder).rglob("*.py")
                 if p.name != "__main__.py" and (n := installed_name(p)))
BENCHMARK = "benchmark script: a run prints a table and writes JSON (docs/benchmarks.md)"
COMMAND = "command-line module: its tests call main([...]) in tests/tools"
#: modules whose examples would need a GPU, root or a process group; each says why
NO_EXAMPLES = {
    "treecoll.attention.decode_cpu": "examples not written yet",
    "treecoll.attention.decode_native": "examples not written yet",
    "treecoll.attention.dist":
        "every function needs a process group or spawns processes (tests/attention/test_dist.py)",
    "treecoll.attention.hf": "needs transformers and a model directory (tests/attention/test_hf.py)",
    "treecoll.tools": "package marker",
    "treecoll.tools.bench_collectives": BENCHMARK,
    "treecoll.tools.bench_decode": BENCHMARK,
    "treecoll.tools.bench_emucluster_decode": BENCHMARK,
    "treecoll.tools.bench_sim_scale": BENCHMARK,
    "treecoll.tools.bench_topo_load": BENCHMARK,
    "treecoll.tools.bench_tree_attention": BENCHMARK,
    "treecoll.tools.cmd_decode": COMMAND,
    "treecoll.tools.cmd_discover": COMMAND,
    "treecoll.tools.cmd_simulate": COMMAND,
    "treecoll.tools.cmd_topo": COMMAND,
    "treecoll.tools.cmd_tree": COMMAND,
    "treecoll.tools.demo": COMMAND,
    "treecoll.tools.demo_decode": COMMAND,
    "treecoll.tools.emucluster": "package marker; its modules carry the examples",
    "treecoll.tools.validate_sim": COMMAND,
}
BARE = re.compile(r"^\s*(?:>>> )?(?:from|import) (?:topo|collectives|attention|tools)\b", re.M)
#: text about how and when the work was done, issue numbers, or files outside the repository (the research
#: notes and design card it was built from); "run A" / "run B" only in capitals ("run a command" is fine)
HISTORY = re.compile(r"(?i:\bsession [0-9]|\bissue #?[0-9]|\.\./shared|shared/reference|shared/fixtures|refuted"
                     r"|/work/|\bDESIGN\.md\b|\b(?:topo|collectives|attention|paper|style)\.md\b)|\brun [AB]\b")


@pytest.mark.parametrize("name", MODULES)
def test_every_module_has_runnable_examples(name):
    """pytest runs every module's doctests (conftest.py); a module without one is listed with its reason."""
    examples = sum(len(t.examples) for t in doctest.DocTestFinder().find(importlib.import_module(name)))
    if name in NO_EXAMPLES:
        assert examples == 0, f"{name} has examples now: remove it from NO_EXAMPLES"
    else:
        assert examples > 0, f"{name}: no docstring example"


def test_nothing_imports_the_folders_as_top_level_packages():
    """Code, tests and docs import ``treecoll.topo``..., never ``topo``: installed, the bare names do not exist."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    bad = [f"{f}:{s.count(chr(10), 0, m.start()) + 1}" for f in files if not f.startswith("tests/fixtures/")
           for s in [(ROOT / f).read_text(encoding="utf-8")] for m in BARE.finditer(s)]
    assert bad == []


def test_importing_the_topology_side_loads_no_torch():
    code = "import sys, treecoll, treecoll.topo, treecoll.tools.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_text_about_history_issues_or_files_outside_the_repository():
    """Docs, docstrings, comments and data describe the software as it is and cite public sources
    (URL, NCCL file and version, paper): no sessions, issue numbers, "run A/B", refuted ideas, or
    paths outside the repository. tests/fixtures are verbatim third-party files; this file holds the pattern."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    bad = []
    for f in files:
        if f.startswith("tests/fixtures/") or f == "tests/test_package.py":
            continue
        try:
            text = (ROOT / f).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):  # binary files (plots); files deleted in the work tree
            continue
        bad += [f"{f}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in HISTORY.finditer(text)]
    assert bad == []
