"""The docstring examples of every module of topo run, and every module has some (a module without
examples would pass a check of ``failed == 0`` whatever it does)."""
import doctest
import importlib
import pkgutil

import pytest

import topo

MODULES = ["topo"] + sorted(f"topo.{m.name}" for m in pkgutil.iter_modules(topo.__path__))


def test_the_list_covers_the_package():
    assert {"topo.nvml", "topo.sysfs", "topo.env", "topo.hostgraph", "topo.nccl_xml", "topo.smi", "topo.discover",
            "topo.cluster", "topo.paths", "topo.model", "topo.files", "topo.limits"} <= set(MODULES)


@pytest.mark.parametrize("mod", MODULES)
def test_doctests(mod):
    res = doctest.testmod(importlib.import_module(mod))
    assert res.failed == 0 and res.attempted > 0, res


def test_import_topo_stays_light():
    import subprocess
    import sys
    code = "import sys, topo; topo.discover; print('torch' in sys.modules, 'pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
    assert out == ["False", "False"]
