"""Repository-wide pytest configuration: doctests of every module, imported by their package name.

The repository keeps one folder per room (``topo/``, ``collectives/``, ...) while the
installed names are ``treecoll.topo``, ``treecoll.collectives``, ... (a package-dir
mapping in pyproject.toml).  pytest's own ``--doctest-modules`` would import
``topo/model.py`` as the top-level module ``topo.model``, a second copy beside
``treecoll.topo.model``; this collector imports each file by its installed name, so the
doctests run against the objects users get.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

import pytest
from _pytest.doctest import DoctestModule

# The Triton kernels run on CPU tensors under the Triton interpreter, which ``triton.jit``
# selects when a kernel module is imported: set it before any test or doctest imports one.
# With an NVIDIA driver present the kernels run compiled.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent
#: folder -> installed package name (pyproject.toml's [tool.setuptools.package-dir])
PACKAGES = {
    "topo": "treecoll.topo",
    "collectives": "treecoll.collectives",
    "attention": "treecoll.attention",
    "tools": "treecoll.tools",
    "treecoll": "treecoll",
}


def installed_name(path: Path) -> str | None:
    """``topo/model.py`` -> ``"treecoll.topo.model"``; None outside the packages."""
    rel = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else None
    if rel is None or rel.parts[0] not in PACKAGES or rel.suffix != ".py":
        return None
    parts = [PACKAGES[rel.parts[0]], *rel.parts[1:-1]]
    if rel.stem != "__init__":
        parts.append(rel.stem)
    return ".".join(parts)


class PackageDoctestModule(DoctestModule):
    """A module's doctests, the module imported under its installed name."""

    def _getobj(self):
        return importlib.import_module(installed_name(self.path))


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.name == "__main__.py" or installed_name(file_path) is None:
        return None
    return PackageDoctestModule.from_parent(parent, path=file_path)
