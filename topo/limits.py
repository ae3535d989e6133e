"""Caps on the size of a topology, checked before anything is allocated.

A compact YAML file multiplies: ``hosts: [{template: dgx-h100, count: N}]``
makes 31 N nodes and 138 N directed links, a template's ``gpus.count`` or a fat
tree's ``spines`` make one node each, every leaf links to every spine. A typo
in one number must not fill the machine's memory, so every reader computes the
node and link counts a file asks for (before building them) and refuses counts
above the caps with a :class:`~topo.errors.TopologyError` naming file, line,
key, the counts and the caps.

Default caps: :data:`DEFAULT_MAX_NODES` nodes and :data:`DEFAULT_MAX_LINKS`
directed links (a link listed once in a file is two directed links). The
largest shipped topology (``dgx-h100-x1024``, 8192 GPUs) has 30,992 nodes and
141,312 directed links; a 16,384-GPU cluster of the same hosts about twice
that; the caps allow some thirty times more. To load something larger, raise
the caps for one call (``topo.load(path, max_nodes=..., max_links=...)``, the
same keywords on ``loads``, ``resolve`` and ``import_file``) or for every
program through the environment: ``TREECOLL_MAX_NODES`` and
``TREECOLL_MAX_LINKS`` (integers; the command line reads them too).

>>> lim = limits(max_nodes=100)
>>> lim.max_nodes, lim.max_links == DEFAULT_MAX_LINKS
(100, True)
>>> lim.excess(150, 10, "3 hosts of 50 nodes")
'3 hosts of 50 nodes make 150 nodes and 10 directed links: expected at most 100 nodes and 4,000,000 links \
(the caps); to load it anyway raise the caps: topo.load(..., max_nodes=N, max_links=M) or the environment \
variables TREECOLL_MAX_NODES / TREECOLL_MAX_LINKS'
>>> lim.excess(99, 10, "x") is None
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import TopologyError

__all__ = ["DEFAULT_MAX_LINKS", "DEFAULT_MAX_NODES", "ENV_MAX_LINKS", "ENV_MAX_NODES", "Limits", "limits"]

#: default cap on the nodes of one topology
DEFAULT_MAX_NODES = 1_000_000
#: default cap on the directed links of one topology
DEFAULT_MAX_LINKS = 4_000_000
ENV_MAX_NODES = "TREECOLL_MAX_NODES"
ENV_MAX_LINKS = "TREECOLL_MAX_LINKS"


@dataclass(frozen=True)
class Limits:
    """The caps in force for one read: ``max_nodes`` nodes, ``max_links`` directed links."""

    max_nodes: int = DEFAULT_MAX_NODES
    max_links: int = DEFAULT_MAX_LINKS

    def excess(self, nodes: int, links: int, what: str) -> str | None:
        """The error message when ``nodes`` or ``links`` (what ``what`` makes) exceed the caps, else None."""
        if nodes <= self.max_nodes and links <= self.max_links:
            return None
        return (
            f"{what} make {nodes:,} nodes and {links:,} directed links: expected at most {self.max_nodes:,} "
            f"nodes and {self.max_links:,} links (the caps); to load it anyway raise the caps: "
            f"topo.load(..., max_nodes=N, max_links=M) or the environment variables {ENV_MAX_NODES} / "
            f"{ENV_MAX_LINKS}"
        )


def _cap(value: int | None, name: str, env: Mapping[str, str], var: str, default: int) -> int:
    if value is None:
        text = env.get(var)
        if text is None or not text.strip():
            return default
        try:
            value = int(text.strip().replace(",", "_"))
        except ValueError:
            raise TopologyError(
                f"{var}={text!r}: expected a positive integer (a cap on the {name} of a topology), got {text!r}"
            ) from None
        if value < 1:
            raise TopologyError(f"{var}={text!r}: expected a positive integer, got {value}")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TopologyError(f"max_{name}: expected a positive integer, got {value!r}")
    return value


def limits(max_nodes: int | None = None, max_links: int | None = None, env: Mapping[str, str] | None = None) -> Limits:
    """The caps for one read: the keywords when given, else the environment variables, else the defaults."""
    env = os.environ if env is None else env
    return Limits(
        _cap(max_nodes, "nodes", env, ENV_MAX_NODES, DEFAULT_MAX_NODES),
        _cap(max_links, "links", env, ENV_MAX_LINKS, DEFAULT_MAX_LINKS),
    )
