"""Shared helpers for tests/topo: the shipped topologies, loaded once per session."""
from __future__ import annotations

import functools
from pathlib import Path

from treecoll import topo

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (ROOT / "topologies").glob("*.yaml"))
FIXTURES = ROOT / "tests" / "fixtures"


@functools.cache
def shipped(name: str) -> topo.Topology:
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
