"""The docstring examples of the discovery modules run."""
import doctest
import importlib

import pytest


@pytest.mark.parametrize("mod", ["topo.nvml", "topo.sysfs", "topo.env", "topo.hostgraph", "topo.nccl_xml",
                                 "topo.smi", "topo.discover", "topo.cluster"])
def test_doctests(mod):
    res = doctest.testmod(importlib.import_module(mod))
    assert res.failed == 0


def test_import_topo_stays_light():
    import subprocess
    import sys
    code = "import sys, topo; topo.discover; print('torch' in sys.modules, 'pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
    assert out == ["False", "False"]
