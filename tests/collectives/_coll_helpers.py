"""Shared helpers for tests/collectives: shipped topologies (loaded once), paths."""
from __future__ import annotations

import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.stem for p in (ROOT / "topologies").glob("*.yaml"))
FIXTURES = ROOT / "tests" / "fixtures"
#: shipped topologies with one host and at most 8 GPUs (brute-force optimality)
SMALL = ("cpu-local", "dgx-a100", "dgx-h100", "hgx-b200", "pcie-8gpu")


@functools.cache
def shipped(name: str):
    from treecoll import topo
    return topo.load(ROOT / "topologies" / f"{name}.yaml")
