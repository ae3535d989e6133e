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
#: modules whose examples would need a GPU, root or a process group; each says why
NO_EXAMPLES = {
    "treecoll.attention": "examples not written yet",
    "treecoll.attention.baselines": "examples not written yet",
    "treecoll.attention.decode_cpu": "examples not written yet",
    "treecoll.attention.decode_native": "examples not written yet",
    "treecoll.attention.dist": "every function needs a process group or spawns processes (tests/attention/test_dist.py)",
    "treecoll.attention.hf": "needs transformers and a model directory (tests/attention/test_hf.py)",
    "treecoll.attention.kv_cache": "examples not written yet",
    "treecoll.attention.model": "examples not written yet",
    "treecoll.attention.reference": "examples not written yet",
    "treecoll.attention.validate": "examples not written yet",
    "treecoll.collectives": "examples not written yet",
    "treecoll.tools": "package marker",
    "treecoll.tools.bench_collectives": "benchmark script: a run prints a table and writes JSON; tests/tools runs its quick mode",
    "treecoll.tools.bench_decode": "benchmark script: a run prints a table and writes JSON; tests/tools runs its quick mode",
    "treecoll.tools.bench_emucluster_decode": "benchmark script: a run prints a table and writes JSON; tests/tools runs its quick mode",
    "treecoll.tools.bench_sim_scale": "benchmark script: a run prints a table and writes JSON; tests/tools runs its quick mode",
    "treecoll.tools.bench_topo_load": "benchmark script: a run prints a table and writes JSON; tests/tools runs its quick mode",
    "treecoll.tools.bench_tree_attention": "benchmark script: a run prints a table and writes JSON; tests/tools runs its quick mode",
    "treecoll.tools.cmd_decode": "command-line module: its tests call main([...]) in tests/tools",
    "treecoll.tools.cmd_discover": "command-line module: its tests call main([...]) in tests/tools",
    "treecoll.tools.cmd_simulate": "command-line module: its tests call main([...]) in tests/tools",
    "treecoll.tools.cmd_topo": "command-line module: its tests call main([...]) in tests/tools",
    "treecoll.tools.cmd_tree": "command-line module: its tests call main([...]) in tests/tools",
    "treecoll.tools.demo": "command-line module: its tests call main([...]) in tests/tools",
    "treecoll.tools.demo_decode": "command-line module: its tests call main([...]) in tests/tools",
    "treecoll.tools.emucluster": "package marker; its modules carry the examples",
    "treecoll.tools.validate_sim": "command-line module: its tests call main([...]) in tests/tools",
}
BARE = re.compile(r"^\s*(?:>>> )?(?:from|import) (?:topo|collectives|attention|tools)\b", re.M)


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
