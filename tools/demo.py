"""``python -m treecoll.tools.demo`` (what ``make demo`` runs): the treecoll tour.

The demo is a list of steps, :data:`STEPS`, each a ``(title, function)``; a
function takes the shared ``state`` dict (steps may leave results there for
later ones) and prints what it shows; a new step is one ``STEPS.append(...)``.

The tour: the embedded default topology (two DGX H100 on a rail-optimized NDR
fat tree): its summary, the ``nvidia-smi topo -m`` matrix of one host and a few
paths, including cross-host ones; then the steps of
:mod:`treecoll.tools.demo_decode` (the tree, simulated tree versus ring, a real
checked decode over processes).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from treecoll.tools.cmd_topo import matrix_data, path_data, render_matrix, render_path, render_show, show_data

from treecoll import topo

__all__ = ["STEPS", "main"]


def step_topology(state: dict) -> None:
    t = state["topology"] = topo.default()
    print(render_show(show_data(t, "topo.default(), shipped as topologies/dgx-h100-x2.yaml")))


def step_matrix(state: dict) -> None:
    print(render_matrix(matrix_data(state["topology"], "h0")))


def step_paths(state: dict) -> None:
    t = state["topology"]
    for a, b, why in [
        ("h0/gpu0", "h0/gpu5", "inside a host: 4 NVSwitches in parallel"),
        ("h0/gpu2", "h0/nic2", "a GPU to its own NIC: one PCIe switch"),
        ("h0/gpu0", "h1/gpu0", "across hosts on the same rail: one leaf switch"),
        ("h0/gpu0", "h1/gpu3", "across hosts and rails: up through a spine"),
    ]:
        print(f"# {why}")
        print(render_path(path_data(t, a, b)))


STEPS: list[tuple[str, Callable[[dict], None]]] = [
    ("The embedded default topology", step_topology),
    ("nvidia-smi topo -m view of host h0", step_matrix),
    ("Paths", step_paths),
]

# --- tree attention: the tree, simulated tree vs ring, a real checked decode ---
from treecoll.tools.demo_decode import STEPS as _DECODE_STEPS  # noqa: E402

STEPS += _DECODE_STEPS


def main(argv: list[str] | None = None) -> int:
    state: dict = {}
    for i, (title, fn) in enumerate(STEPS, 1):
        print(f"=== {i}. {title}")
        t0 = time.perf_counter()
        fn(state)
        print(f"({time.perf_counter() - t0:.2f} s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
