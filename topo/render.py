"""Pictures of a topology: Graphviz DOT text and a matplotlib drawing.

:func:`to_dot` returns DOT text in which every host is a ``cluster_<host>``
subgraph (its GPUs, switches, CPUs and NICs), network and rack-level switches
sit outside, and each bidirectional link appears once labelled
``<kind> <bw> GB/s``. :func:`draw` lays hosts out side by side (GPUs on a row,
NVSwitches above, CPUs and NICs below) with the network switches in rows
above them by tier; matplotlib is optional (``pip install 'treecoll[plot]'``).

>>> from treecoll import topo
>>> dot = to_dot(topo.load(topo.shipped("cpu-local")))
>>> dot.splitlines()[0], dot.splitlines()[4]
('graph "cpu-local" {', '  subgraph "cluster_h0" {')
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .errors import MissingDependency

if TYPE_CHECKING:
    from .model import Topology

__all__ = ["to_dot", "draw", "NODE_STYLE"]

#: DOT shape and fill colour per node kind
NODE_STYLE = {
    "gpu": ("box", "#76b900"),
    "nvswitch": ("hexagon", "#9ecae1"),
    "pcie_switch": ("diamond", "#dddddd"),
    "cpu": ("box3d", "#fdd0a2"),
    "nic": ("ellipse", "#c6dbef"),
    "net_switch": ("octagon", "#bcbddc"),
}
_EDGE_COLOR = {"nvlink": "#76b900", "c2c": "#31a354", "pcie": "#636363", "smp": "#e6550d", "net": "#3182bd"}


def _q(s: str) -> str:
    return json.dumps(str(s))


def _pairs(topo: Topology):
    g = topo.graph
    for a, b, d in g.edges(data=True):
        if g.has_edge(b, a) and g.edges[b, a] == d and b < a:
            continue
        yield a, b, d, g.has_edge(b, a) and g.edges[b, a] == d


def to_dot(topo: Topology) -> str:
    """DOT text of the whole topology (one ``cluster_<host>`` per host)."""
    g = topo.graph
    out = [
        f"graph {_q(topo.name or 'topology')} {{",
        "  graph [rankdir=TB, fontsize=10];",
        "  node [style=filled, fontsize=9];",
        "  edge [fontsize=8];",
    ]

    def node_line(n: str, indent: str) -> str:
        d = g.nodes[n]
        shape, color = NODE_STYLE[d["kind"]]
        label = n.split("/", 1)[1] if d.get("host") else n
        extra = d.get("model") or d.get("name") or ""
        if extra:
            label += "\\n" + str(extra)
        return f'{indent}{_q(n)} [shape={shape}, fillcolor={_q(color)}, label="{label}"];'

    for h in topo.hosts():
        out.append(f"  subgraph {_q('cluster_' + h)} {{")
        out.append(f"    label={_q(h)}; style=rounded;")
        out.extend(node_line(n, "    ") for n in topo.nodes(host=h))
        out.append("  }")
    out.extend(node_line(n, "  ") for n, d in g.nodes(data=True) if not d.get("host"))
    for a, b, d, both in _pairs(topo):
        label = f"{d['kind']} {d['bw']:g} GB/s"
        style = f"color={_q(_EDGE_COLOR.get(d['kind'], 'black'))}, label={_q(label)}"
        out.append(f"  {_q(a)} -- {_q(b)} [{style}{'' if both else ', dir=forward'}];")
    out.append("}")
    return "\n".join(out) + "\n"


def draw(
    topo: Topology,
    path: str,
    *,
    max_hosts: int = 8,
    dpi: int = 120,
    overlay: list[tuple[str, str, str]] | None = None,
    title: str | None = None,
) -> dict:
    """Draw the first ``max_hosts`` hosts and the switches they reach into ``path`` (PNG, SVG, PDF).

    ``overlay``: extra directed edges ``(node_a, node_b, color)`` drawn as thick
    arrows over the topology (``treecoll tree draw`` puts a tree's edges there,
    child to parent); edges with an endpoint outside the drawn hosts are skipped.
    Returns plain data: ``{"output", "hosts_drawn", "hosts_total", "nodes", "links", "overlay"}``.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependency("matplotlib", "treecoll topo draw", extra="plot") from None
    g = topo.graph
    hosts = list(topo.hosts())[:max_hosts]
    keep = set()
    pos: dict[str, tuple[float, float]] = {}
    x0 = 0.0
    for h in hosts:
        rows = {"nvswitch": 3.0, "gpu": 2.0, "pcie_switch": 1.2, "cpu": 0.4, "nic": -0.4}
        width = max(1, len(topo.gpus(h)), len(topo.nics(h)))
        for kind, y in rows.items():
            ns = topo.nodes(kind, h)
            for i, n in enumerate(ns):
                pos[n] = (x0 + (i + 0.5) * width / max(len(ns), 1), y)
                keep.add(n)
        x0 += width + 1.5
    others = [n for n, d in g.nodes(data=True) if not d.get("host") and any(nb in keep for nb in g.successors(n))]
    seen_up = set(others)
    for n in others:  # spines etc. above the leaves
        seen_up.update(s for s in g.successors(n) if not g.nodes[s].get("host"))
    by_tier: dict[float, list[str]] = {}
    for n in sorted(seen_up):
        d = g.nodes[n]
        y = 4.5 + 1.2 * d.get("tier", 0) if d["kind"] == "net_switch" else 3.8
        by_tier.setdefault(y, []).append(n)
    for y, ns in by_tier.items():
        for i, n in enumerate(ns):
            pos[n] = ((i + 0.5) * max(x0, 1) / len(ns), y)
            keep.add(n)
    fig, ax = plt.subplots(figsize=(min(4 + 0.6 * x0, 40), 6))
    nlinks = 0
    drawn_kinds = set()
    for a, b, d, _ in _pairs(topo):
        if a in pos and b in pos:
            drawn_kinds.add(d["kind"])
            (xa, ya), (xb, yb) = pos[a], pos[b]
            ax.plot([xa, xb], [ya, yb], color=_EDGE_COLOR.get(d["kind"], "black"), lw=0.6, alpha=0.6, zorder=1)
            nlinks += 1
    drawn_overlay = 0
    for a, b, color in overlay or ():
        if a in pos and b in pos:
            (xa, ya), (xb, yb) = pos[a], pos[b]
            bend = 0.25 if ya == yb else 0.0  # same-row edges (GPU to GPU) arc above the row
            ax.annotate(
                "",
                xy=(xb, yb),
                xytext=(xa, ya),
                zorder=3,
                arrowprops=dict(arrowstyle="-|>", color=color, lw=1.8, alpha=0.9, connectionstyle=f"arc3,rad={-bend}"),
            )
            drawn_overlay += 1
    for n, (x, y) in pos.items():
        ax.scatter(
            [x], [y], s=60, color=NODE_STYLE[g.nodes[n]["kind"]][1], edgecolors="black", linewidths=0.4, zorder=2
        )
    for h in hosts:
        xs = [pos[n][0] for n in topo.nodes(host=h)]
        ax.text(sum(xs) / len(xs), -1.0, h, ha="center", fontsize=8)
    from matplotlib.lines import Line2D

    kinds = sorted({g.nodes[n]["kind"] for n in pos}, key=list(NODE_STYLE).index)
    handles = [
        Line2D([], [], marker="o", ls="", color=NODE_STYLE[k][1], markeredgecolor="black", label=k) for k in kinds
    ]
    handles += [Line2D([], [], color=c, label=k) for k, c in _EDGE_COLOR.items() if k in drawn_kinds]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    ax.set_title(title or f"{topo.name}: {len(hosts)} of {len(topo.hosts())} hosts")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return {
        "output": str(path),
        "hosts_drawn": len(hosts),
        "hosts_total": len(topo.hosts()),
        "nodes": len(pos),
        "links": nlinks,
        "overlay": drawn_overlay,
    }
