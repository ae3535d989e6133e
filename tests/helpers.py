"""Helpers shared by the test packages: the repository's paths and the shipped topologies, loaded once.

Tests import them by package name (``from tests.helpers import shipped``): ``tests`` and
its folders are packages, which pytest imports under their full names with the
repository root on ``sys.path`` (pytest's recommended layout for the default
``prepend`` import mode). Fixtures live in the conftest.py files beside the tests.
"""

from __future__ import annotations

import functools
import textwrap
from pathlib import Path

from treecoll import topo

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (ROOT / "topologies").glob("*.yaml"))
FIXTURES = ROOT / "tests" / "fixtures"


@functools.cache
def shipped(name: str) -> topo.Topology:
    """The shipped topology ``name`` (``topologies/<name>.yaml``), loaded once per session."""
    return topo.load(ROOT / "topologies" / f"{name}.yaml")


#: a small compact cluster (2 hosts x 2 GPUs, one NIC each, one switch) that bad-input tests edit
BOX = """templates:
  box:
    gpus: {count: 2, numa: 0, model: G}
    cpus: [{numa: 0}]
    pcie: {bw: 24.0}
    nics: {count: 1, bw: 25.0, numa: 0}
hosts: [{template: box, count: 2}]
network: {type: single_switch}
"""

#: a larger compact cluster (2 hosts x 4 GPUs, 2 NVSwitches, 2 sockets, 2 PCIe switches, 2 NICs) the YAML tests edit
BOX4 = textwrap.dedent("""\
    name: t
    templates:
      box:
        gpus: {count: 4, model: X, mem_bw: 100.0}
        nvswitch: {count: 2, links: [3, 3], link_bw: 10.0}
        cpus:
          - {numa: 0, socket: 0}
          - {numa: 1, socket: 1}
        smp: {bw: 8.0}
        pcie:
          bw: 24.0
          switches:
            - {cpu: 0, gpus: [0, 1], nics: [0]}
            - {cpu: 1, gpus: [2, 3], nics: [1]}
        nics: {count: 2, bw: 25.0}
    hosts:
      - {template: box, count: 2}
    network: {type: single_switch}
    """)


def edit(old: str, new: str, text: str = BOX4) -> str:
    """``text`` (default :data:`BOX4`) with the first ``old`` replaced by ``new`` (``old`` must be there)."""
    assert old in text, old
    return text.replace(old, new, 1)
