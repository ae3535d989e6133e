"""Shared helpers for tests/topo: the shipped topologies, loaded once per session."""
from __future__ import annotations

import functools
from pathlib import Path

import topo

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (ROOT / "topologies").glob("*.yaml"))
FIXTURES = ROOT / ".." / "shared" / "fixtures"


@functools.lru_cache(maxsize=None)
def shipped(name: str) -> topo.Topology:
    return topo.load(ROOT / "topologies" / f"{name}.yaml")
