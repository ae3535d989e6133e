"""Topology files in other formats, recognised by their content: NCCL topology XML, ``nvidia-smi topo -m`` text.

:func:`import_file` reads one (``treecoll topo import``); :func:`import_text`
is the recognition step, which :func:`treecoll.topo.yaml_io.resolve` also uses
before it reads a file as YAML.

>>> import_text("name: two", "t.yaml") is None     # neither XML nor nvidia-smi text: the caller decides
True
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import TopologyError
from .files import read_text
from .model import Topology
from .nccl_xml import import_xml, looks_like_nccl_graph, looks_like_nccl_xml
from .smi import import_smi, looks_like_smi

__all__ = ["import_file", "import_text"]


def import_text(
    text: str, where: str, *, host: str = "host0", max_nodes: int | None = None, max_links: int | None = None
) -> Topology | None:
    """The topology in ``text`` (read from file ``where``) when it is an NCCL topology XML or
    ``nvidia-smi topo -m`` output, else None (an NCCL graph file is an error). ``max_nodes`` /
    ``max_links``: the caps of :mod:`treecoll.topo.limits`."""
    name = Path(where).stem
    if looks_like_nccl_xml(text):
        return import_xml(text, host=host, name=name, source=where, max_nodes=max_nodes, max_links=max_links)
    if looks_like_smi(text):
        return import_smi(text, host=host, name=name, source=where, max_nodes=max_nodes, max_links=max_links)
    if looks_like_nccl_graph(text):
        raise TopologyError(
            f"{where}: expected an NCCL topology XML (<system ...>), got an NCCL graph file (<graphs>, "
            "NCCL_GRAPH_FILE: rings and trees); read it with 'treecoll tree show' or 'tree check', and dump "
            "the topology with NCCL_TOPO_DUMP_FILE"
        )
    return None


def import_file(
    path: str | os.PathLike, *, host: str = "host0", max_nodes: int | None = None, max_links: int | None = None
) -> Topology:
    """An NCCL topology XML or ``nvidia-smi topo -m`` text, detected by content.

    Errors name the file (and the line where there is one); a path that is a
    directory, a device or an empty file gets its own message; an import that
    yields no GPU is an error. ``max_nodes`` / ``max_links``: the caps of
    :mod:`treecoll.topo.limits`.
    """
    where = os.fspath(path)
    t = import_text(read_text(where, "topology file"), where, host=host, max_nodes=max_nodes, max_links=max_links)
    if t is None:
        raise TopologyError(
            f"{where}: expected an NCCL topology XML (<system ...>) or 'nvidia-smi topo -m' output, got neither"
        )
    return t
