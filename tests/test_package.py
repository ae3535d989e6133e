"""The distribution as a whole: one package, imports in one direction, every module documented by examples."""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import inspect
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

FILES = {
    n: p
    for folder in PACKAGES
    for p in (ROOT / folder).rglob("*.py")
    if p.name != "__main__.py" and (n := installed_name(p))
}
MODULES = sorted(FILES)
BENCHMARK = "benchmark script: a run prints a table and writes JSON (docs/benchmarks.md)"
COMMAND = "command-line module: its tests call main([...]) in tests/tools"
#: modules whose examples would need a GPU, root or a process group; each says why
NO_EXAMPLES = {
    "treecoll.attention.dist": "needs a process group or the torch profiler (tests/attention/test_dist.py)",
    "treecoll.tools": "package marker",
    "treecoll.tools.bench": "package marker; its modules carry the examples",
    "treecoll.tools.bench_collectives": BENCHMARK,
    "treecoll.tools.bench_decode": BENCHMARK,
    "treecoll.tools.bench_topo_load": BENCHMARK,
    "treecoll.tools.bench_tree_attention": BENCHMARK,
    "treecoll.tools.cmd_decode": COMMAND,
    "treecoll.tools.cmd_discover": COMMAND,
    "treecoll.tools.cmd_topo": COMMAND,
    "treecoll.tools.cmd_tree": COMMAND,
    "treecoll.tools.demo": COMMAND,
    "treecoll.tools.demo_decode": COMMAND,
    "treecoll.tools.emucluster": "package marker; its modules carry the examples",
    "treecoll.tools.validate_sim": COMMAND,
}
BARE = re.compile(
    r"^\s*(?:>>> )?(?:from|import) "
    r"(?:topo|collectives|attention|tools|test_\w+|topo_fakes|helpers)\b",
    re.M,
)
#: text about how and when the work was done, issue numbers, or files outside the repository (the research
#: notes and design card it was built from); "run A" / "run B" only in capitals ("run a command" is fine)
HISTORY = re.compile(
    r"(?i:\bsession [0-9]|\bissue #?[0-9]|\.\./shared|shared/reference|shared/fixtures|refuted"
    r"|/work/|\bDESIGN\.md\b|\b(?:topo|collectives|attention|paper|style)\.md\b)|\brun [AB]\b"
)


@pytest.mark.parametrize("name", MODULES)
def test_every_module_has_runnable_examples(name):
    """pytest runs every module's doctests (conftest.py); a module without one is listed with its reason."""
    examples = sum(len(t.examples) for t in doctest.DocTestFinder().find(importlib.import_module(name)))
    if name in NO_EXAMPLES:
        assert examples == 0, f"{name} has examples now: remove it from NO_EXAMPLES"
    else:
        assert examples > 0, f"{name}: no docstring example"


def test_nothing_imports_the_folders_as_top_level_packages():
    """Code, tests and docs import ``treecoll.topo``..., never ``topo``, and tests import ``tests.x``, never a bare
    test module: installed, or run from another directory, the bare names do not exist."""
    files = subprocess.run(
        ["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    bad = [
        f"{f}:{s.count(chr(10), 0, m.start()) + 1}"
        for f in files
        if not f.startswith("tests/fixtures/")
        for s in [(ROOT / f).read_text(encoding="utf-8")]
        for m in BARE.finditer(s)
    ]
    assert bad == []


def test_importing_the_topology_side_loads_no_torch():
    code = "import sys, treecoll, treecoll.topo, treecoll.tools.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _tracked(pattern: str = "*.py") -> list[str]:
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", pattern],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted(f for f in set(files) if not f.startswith("tests/fixtures/") and (ROOT / f).exists())


def _lines_matching(files, regex) -> list[str]:
    return [
        f"{f}:{n}: {line.strip()}"
        for f in files
        for n, line in enumerate((ROOT / f).read_text(encoding="utf-8").splitlines(), 1)
        if regex.search(line)
    ]


#: how processes start: only the launcher (treecoll.collectives.launch) starts ranks
STARTS_PROCESSES = re.compile(
    r"\bmp\.spawn\(|multiprocessing\.(?:spawn|Process)\b|\.Process\(|start_processes\(|"
    r"\bget_context\(|\bos\.fork\(|\bos\.(?:spawn|exec)\w*\("
)
SUBPROCESS = re.compile(r"\bsubprocess\.(?:Popen|run|call|check_call|check_output)\(")
#: files that run a subprocess for something other than a rank, and what for
SUBPROCESS_USES = {
    "collectives/native.py": "runs the C compiler that builds the native libraries (decode kernel, simulator loop)",
    "tools/bench/harness.py": "asks git for the commit a benchmark ran from",
    "tools/bench_sim_scale.py": "times the simulate command as a user runs it, and its load and simulation apart",
    "tools/emucluster/netns.py": "runs ip and tc to build the emulated cluster",
    "tools/emucluster/measure.py": "an iperf-like server and client inside two namespaces",
    "tools/emucluster/runner.py": "asks for a free port inside a namespace",
    "tests/test_package.py": "git ls-files, and imports in a fresh interpreter",
    "tests/test_docs.py": "the pages' example scripts, each as python name.py",
    "tests/attention/test_decode.py": "an import in a fresh interpreter",
    "tests/attention/test_decode_triton.py": "compiles a kernel in a fresh interpreter",
    "tests/tools/test_cli_topo.py": "the command line in a fresh interpreter",
    "tests/tools/test_cmd_generate.py": "torchrun (python -m torch.distributed.run) starting treecoll generate",
    "tests/tools/test_bench_harness.py": "asks git for the commit the benchmark JSON must name",
    "tests/tools/test_emucluster.py": "the emu command as a user runs it, tc, a process that exits",
    "tests/collectives/test_launch.py": "parents of ranks, killed to check that their ranks die with them",
}


def test_only_the_launcher_starts_ranks():
    """Ranks start through treecoll.collectives.launch (spawn, RankPool, join, run_commands) alone: every
    other module that runs a subprocess is listed with what for, and none starts processes otherwise."""
    files = [f for f in _tracked() if f != "collectives/launch.py"]
    assert _lines_matching(files, STARTS_PROCESSES) == []
    users = {line.split(":")[0] for line in _lines_matching(files, SUBPROCESS)}
    assert sorted(users - set(SUBPROCESS_USES)) == []


#: a byte formatter: a unit name as a string of its own (a table of units), or a size divided by a
#: power of 1000 or 1024 and printed with a byte unit
BYTE_FORMATTING = re.compile(
    r"""["'](?:KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB)["']|"""
    r"""\{[^{}]*/\s*\(?\s*(?:1\s*<<\s*\d+|1e\d+|1[0-9_]*\s*\*\*\s*\d+|2\s*\*\*\s*\d+|\d{4,}|[A-Z]{2}B|[A-Z]iB)\b"""
    r"""[^{}]*\}\s?(?:KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB)(?![/\w])"""
)
#: modules that still print sizes their own way (remove each once it uses treecoll.topo.fmt)
BYTE_FORMATTING_TO_PORT: set[str] = set()


def test_one_byte_formatter():
    """Sizes are printed by treecoll.topo.fmt.fmt_bytes alone (binary or SI units)."""
    files = [
        f for f in _tracked() if f.split("/")[0] in PACKAGES and f != "topo/fmt.py" and f not in BYTE_FORMATTING_TO_PORT
    ]
    assert _lines_matching(files, BYTE_FORMATTING) == []
    # the check finds what it looks for
    assert BYTE_FORMATTING.search('for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20)):')
    assert BYTE_FORMATTING.search('return f"{n / (1 << 20):.0f} MiB"')
    assert BYTE_FORMATTING.search('f"{x / 1e6:8.3f} MB"') and not BYTE_FORMATTING.search('f"{x / 1e9:.2f} GB/s"')


#: a test that still reaches tests/collectives/sim_helpers.py through sys.path (remove it once it imports
#: ``tests.collectives.sim_helpers`` by name)
SYS_PATH_TO_PORT: set[str] = set()


def test_no_module_edits_sys_path():
    """Modules, scripts and tests import treecoll and the test helpers by name (tests/ is a package tree)."""
    edits = re.compile(r"\bsys\.path\s*(?:\.(?:insert|append|extend)\(|\[[^\]]*\]\s*=|\+=|=)")
    assert _lines_matching([f for f in _tracked() if f not in SYS_PATH_TO_PORT], edits) == []


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


#: import circles tolerated for now, each with its reason (the test fails once one is gone: remove it here)
ALLOWED_CYCLES: dict[frozenset[str], str] = {}


def imported_modules(name: str, source: str, modules) -> set[str]:
    """The modules of ``modules`` that module ``name`` imports anywhere in ``source``: at the top, inside
    functions, under ``if TYPE_CHECKING`` (an import moved into a function still ties the two modules).
    ``from package import sub`` counts ``package.sub`` when it is a module, else ``package``."""
    is_package = name in modules and FILES.get(name, Path()).name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{up}.{base}" if base else up
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def test_the_import_finder_sees_imports_inside_functions():
    modules = {"treecoll.topo", "treecoll.topo.model", "treecoll.topo.paths", "treecoll.collectives.sim.engine"}
    src = (
        "from .paths import Path\ndef f():\n    from treecoll.collectives.sim import engine\n    import treecoll.topo\n"
    )
    assert imported_modules("treecoll.topo.model", src, modules) == {
        "treecoll.topo.paths",
        "treecoll.collectives.sim.engine",
        "treecoll.topo",
    }


def test_no_import_circles():
    """Modules import each other one way: no circle among treecoll's modules, imports inside functions included."""
    import networkx as nx

    g = nx.DiGraph()
    for name, path in FILES.items():
        g.add_node(name)
        g.add_edges_from((name, t) for t in imported_modules(name, path.read_text(encoding="utf-8"), FILES))
    circles = {frozenset(c) for c in nx.strongly_connected_components(g) if len(c) > 1}
    assert sorted(sorted(c) for c in circles - set(ALLOWED_CYCLES)) == []
    assert [sorted(c) for c in ALLOWED_CYCLES if c not in circles] == [], "gone: remove it from ALLOWED_CYCLES"


def public_functions(name: str):
    """``(qualified name, function)`` of the public functions of module ``name``: the names in its
    ``__all__`` (or, without one, its module-level names without a leading underscore) that are functions
    defined in a treecoll module, and the methods of such classes (``__init__`` and ``__call__`` included;
    properties by their getter). A function re-exported elsewhere is found once, where it is defined."""
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    for attr in exported if exported is not None else [n for n in vars(module) if not n.startswith("_")]:
        obj = getattr(module, attr, None)
        defined_in = getattr(obj, "__module__", "") or ""
        if not defined_in.startswith("treecoll") or (exported is None and defined_in != name):
            continue
        if inspect.isfunction(obj):
            yield f"{defined_in}.{obj.__qualname__}", obj
        elif inspect.isclass(obj):
            for method, raw in vars(obj).items():
                if method.startswith("_") and method not in ("__init__", "__call__"):
                    continue
                fn = raw.fget if isinstance(raw, property) else getattr(raw, "__func__", raw)
                if inspect.isfunction(fn):
                    yield f"{defined_in}.{obj.__qualname__}.{method}", fn


def unannotated(fn) -> list[str]:
    """The parameters of ``fn`` without an annotation (``self``/``cls`` aside), and ``return`` if its result
    has none (``__init__`` aside)."""
    sig = inspect.signature(fn)
    params = [p for i, p in enumerate(sig.parameters.values()) if not (i == 0 and p.name in ("self", "cls"))]
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty and fn.__name__ != "__init__":
        missing.append("return")
    return missing


def test_the_annotation_finder_sees_missing_hints():
    def typed(a: int, *rest: str, flag: bool = False) -> int: ...
    def loose(a, b: int = 1): ...

    assert unannotated(typed) == [] and unannotated(loose) == ["a", "return"]


def test_public_functions_have_type_hints():
    """Every public function and method of treecoll's public modules annotates its parameters and result."""
    found: dict[str, list[str]] = {}
    for name in MODULES:
        if any(part.startswith("_") for part in name.split(".")):
            continue
        for qualname, fn in public_functions(name):
            if missing := unannotated(fn):
                found[qualname] = missing
    assert found == {}
