"""Custom trees: our YAML/JSON tree files, and NCCL_GRAPH_FILE XML channels.

Tree file (YAML or JSON, one of ``parents``, ``children``, ``nested``, ``trees``)::

    name: my-tree                      # optional
    ranks: 4                           # optional, checked against the tree
    hosts: [h0, h0, h1, h1]            # optional rank -> host labels
    parents: [-1, 0, 0, 2]             # parent per rank, -1 = root
    # children: [[1, 2], [], [3], []]  # or ordered child lists per rank
    # nested: {rank: 0, children: [{rank: 1}, {rank: 2, children: [{rank: 3}]}]}
    # trees:                           # or several trees with message shares
    #   - {parents: [-1, 0, 0, 2], share: 0.5}
    #   - {nested: {...}, share: 0.5}

Errors are :class:`TreeError` naming ``file:line: key.path``.

The executor's ``tree=`` takes a :class:`Tree` / :class:`MultiTree`, a
:class:`TreeFile`, a tree file path or a builder name:
:func:`resolve_tree_arg` says which (a string naming a registered builder is
that builder; else a string naming an existing file, or ending in ``.yaml``,
``.yml`` or ``.json``, is a path).
:func:`dumps_tree` writes ``parents`` (plus ``children`` when a rank's child
order is not ascending), so a file round-trips exactly.

NCCL graph XML (``NCCL_GRAPH_FILE``, dumped by ``NCCL_GRAPH_DUMP_FILE``):
``<graphs><graph id pattern nchannels ...><channel><gpu dev= [rank=]/>...``.
Pattern 4 (RING) channels are ring orders; patterns 1-3 (trees) are NCCL's
intra-node chains (``treeIntra``: up = previous GPU, down = next), so a tree
channel becomes a chain :class:`Tree` and the channels of a graph a
:class:`MultiTree` with equal shares. GPU ``rank`` attributes give the rank,
else the device index does (one host). topo does not provide a graph-XML
parser (``treecoll.topo.nccl_xml`` reads NCCL_TOPO_FILE system XML), so the small
parser lives here.

>>> f = loads_tree("parents: [-1, 0, 0, 2]\\nhosts: [a, a, b, b]\\n")
>>> f.plan.children, f.hosts
(((1, 2), (), (3,), ()), ('a', 'a', 'b', 'b'))
>>> loads_tree("parents: [-1, 0, 5]", "t.yaml")
Traceback (most recent call last):
...
treecoll.topo.errors.TreeError: t.yaml:1: parents[2]: expected a rank in 0..2 or -1, got 5
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

import yaml
from treecoll.topo import Topology
from treecoll.topo._schema import Doc, _show
from treecoll.topo.errors import TopologyError, TreeError

from .builders import BUILDERS
from .compile import compile_allreduce, compile_ring_allreduce, merge_schedules
from .schedule import Schedule
from .tree import MultiTree, Tree

__all__ = [
    "TreeFile",
    "load_tree",
    "loads_tree",
    "dumps_tree",
    "save_tree",
    "NcclGraph",
    "load_nccl_graph",
    "loads_nccl_graph",
    "resolve_tree_arg",
    "TREE_SUFFIXES",
]

FORMS = ("parents", "children", "nested", "trees")
#: file name suffixes of tree files (YAML or JSON)
TREE_SUFFIXES = (".yaml", ".yml", ".json")
#: deepest ``nested`` tree a file may hold (a deeper one is a chain better written as ``parents``)
MAX_NESTED_DEPTH = 256


class _Doc(Doc):
    def fail(self, path, message):
        raise TreeError(f"{self.where(path)}: {message}")


@dataclass(frozen=True)
class TreeFile:
    """A loaded tree file: the plan (Tree or MultiTree), optional host labels, name, and
    ``source`` (the file it was read from, for messages)."""

    plan: Tree | MultiTree
    hosts: tuple[str, ...] | None = None
    name: str = ""
    source: str = field(default="", compare=False)

    def check_hosts(self, topology: Topology, gpus: Sequence[str]) -> None:
        """Raise :class:`TreeError` unless the host labels group the ranks as ``topology``
        places ``gpus`` (GPU id per rank): ranks sharing a label share a host and the other
        way round. Labels are names only (``[a, a, b, b]`` fits hosts ``h0, h0, h1, h1``)."""
        if self.hosts is None:
            return
        where = self.source or "tree file"
        by_label: dict[str, tuple[int, str]] = {}
        by_host: dict[str, tuple[int, str]] = {}
        for r, (label, gpu) in enumerate(zip(self.hosts, gpus)):
            host = topology.host_of(gpu)
            first, first_host = by_label.setdefault(label, (r, host))
            other, other_label = by_host.setdefault(host, (r, label))
            if first_host != host:
                problem = (
                    f"ranks {first} and {r} are both labelled {label!r}, but topology {topology.name!r} "
                    f"puts them on hosts {first_host!r} and {host!r}"
                )
            elif other_label != label:
                problem = (
                    f"ranks {other} and {r} are labelled {other_label!r} and {label!r}, but topology "
                    f"{topology.name!r} puts both on host {host!r}"
                )
            else:
                continue
            raise TreeError(
                f"{where}: hosts: {problem}; the file was made for another rank -> GPU mapping: "
                f"rebuild it (treecoll tree build) or pass the ranks= it was made for"
            )


def _rank(doc: _Doc, v: Any, path, n: int, allow_root: bool = False) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not (0 <= v < n or (allow_root and v == -1)):
        doc.fail(path, f"expected a rank in 0..{n - 1}{' or -1' if allow_root else ''}, got {_show(v)}")
    return v


def _one(doc: _Doc, d: dict, path: tuple, name: str) -> Tree:
    forms = [k for k in ("parents", "children", "nested") if k in d]
    if len(forms) != 1:
        doc.fail(path, f"expected exactly one of 'parents', 'children', 'nested', got {forms or 'none'}")
    form = forms[0]
    fp = (*path, form)
    try:
        if form == "parents":
            ps = doc.seq(d[form], fp, what="parent ranks")
            parents = [_rank(doc, p, (*fp, i), len(ps), allow_root=True) for i, p in enumerate(ps)]
            return Tree.from_parents(parents, name=name)
        if form == "children":
            cs = doc.seq(d[form], fp, what="child lists")
            lists = []
            for i, c in enumerate(cs):
                doc.seq(c, (*fp, i), what="child ranks")
                lists.append([_rank(doc, x, (*fp, i, j), len(cs)) for j, x in enumerate(c)])
            return Tree.from_children(lists, name=name)
        # nested
        order: dict[int, list[int]] = {}
        seen: list[int] = []

        def walk(node, p, parent):
            if len(p) > 2 * MAX_NESTED_DEPTH:
                doc.fail(
                    p,
                    f"expected a nested tree at most {MAX_NESTED_DEPTH} levels deep; write deep trees "
                    f"(chains) as 'parents' lists",
                )
            doc.mapping(node, p, required=("rank",), optional=("children",))
            r = node["rank"]
            if isinstance(r, bool) or not isinstance(r, int) or r < 0:
                doc.fail((*p, "rank"), f"expected a non-negative integer rank, got {_show(r)}")
            if r in seen:
                doc.fail((*p, "rank"), f"rank {r} appears twice in the nested tree")
            seen.append(r)
            order[r] = []
            if parent is not None:
                order[parent].append(r)
            kids = node.get("children", [])
            doc.seq(kids, (*p, "children"), what="child nodes")
            for i, k in enumerate(kids):
                walk(k, (*p, "children", i), r)

        walk(d[form], fp, None)
        n = len(seen)
        if sorted(seen) != list(range(n)):
            missing = sorted(set(range(n)) - set(seen))
            doc.fail(fp, f"expected ranks 0..{n - 1} each once, missing {missing[:8]}")
        return Tree.from_children([order[r] for r in range(n)], name=name)
    except TreeError as e:
        if str(e).startswith(doc.source):
            raise
        raise TreeError(f"{doc.where(fp)}: {e}") from None


def loads_tree(text: str, source: str = "<string>") -> TreeFile:
    """Parse a tree file's text (YAML or JSON); ``source`` names it in errors."""
    from treecoll.topo.nccl_xml import looks_like_nccl_graph
    from treecoll.topo.yaml_io import _parse  # the one YAML reader: one-line errors naming file and line

    if looks_like_nccl_graph(text):
        raise TreeError(
            f"{source}: expected a tree file (YAML or JSON: parents, children, nested or trees), got an NCCL "
            "graph file (<graphs>, NCCL_GRAPH_FILE); 'treecoll tree show' lists its graphs and channels"
        )
    try:
        data = _parse(text, source)
    except TopologyError as e:
        raise TreeError(str(e)) from None
    doc = _Doc(source, text, data)
    doc.mapping(data, (), optional=("name", "ranks", "hosts", "description", *FORMS))
    name = data.get("name", "") or ""
    if not isinstance(name, str):
        doc.fail(("name",), f"expected a string, got {_show(name)}")
    if "trees" in data:
        others = [k for k in ("parents", "children", "nested") if k in data]
        if others:
            doc.fail((others[0],), "expected either 'trees' or one tree at the top level, not both")
        items = doc.seq(data["trees"], ("trees",), what="trees")
        if not items:
            doc.fail(("trees",), "expected at least one tree")
        trees, shares = [], []
        for i, it in enumerate(items):
            doc.mapping(it, ("trees", i), optional=("parents", "children", "nested", "share", "name"))
            trees.append(_one(doc, it, ("trees", i), it.get("name", f"{name}/{i}")))
            shares.append(doc.number(it["share"], ("trees", i, "share")) if "share" in it else None)
        if any(s is None for s in shares):
            if not all(s is None for s in shares):
                doc.fail(("trees",), "expected a share on every tree or on none")
            shares = [1.0 / len(trees)] * len(trees)
        total = sum(shares)
        if abs(total - 1.0) > 1e-6:
            doc.fail(("trees",), f"expected shares summing to 1, got {total:g}")
        sizes = {t.size for t in trees}
        if len(sizes) != 1:
            doc.fail(("trees",), f"expected every tree over the same ranks, got sizes {sorted(sizes)}")
        plan: Tree | MultiTree = MultiTree(tuple(trees), tuple(s / total for s in shares), name=name)
    else:
        plan = _one(doc, data, (), name)
    n = plan.size
    if "ranks" in data:
        want = doc.integer(data["ranks"], ("ranks",), minimum=1)
        if want != n:
            doc.fail(("ranks",), f"expected the tree's {n} ranks, got {want}")
    hosts = None
    if "hosts" in data:
        hs = doc.seq(data["hosts"], ("hosts",), length=n, what="host labels (one per rank)")
        hosts = tuple(doc.string(h, ("hosts", i)) for i, h in enumerate(hs))
    return TreeFile(plan, hosts, name)


def _read_text(path: str | os.PathLike, what: str) -> tuple[str, str]:
    """(text, name) of a file, or a one-line TreeError naming it."""
    p = FsPath(path)
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except IsADirectoryError:
        raise TreeError(f"{p}: cannot read {what}: expected a file, got a directory") from None
    except OSError as e:
        raise TreeError(f"{p}: cannot read {what}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TreeError(
            f"{p}: cannot read {what}: expected UTF-8 text, got byte 0x{e.object[e.start]:02x} "
            f"at offset {e.start}; save the file as UTF-8"
        ) from None


def load_tree(path: str | os.PathLike) -> TreeFile:
    """Read a tree file (YAML or JSON)."""
    text, source = _read_text(path, "tree file")
    f = loads_tree(text, source)
    return TreeFile(f.plan, f.hosts, f.name, source)


def _load_cached(path: str | os.PathLike, files: Any) -> TreeFile:
    """:func:`load_tree`, through ``files`` (a mapping with ``get``, e.g. the planner's
    LRU; None: no cache): re-read only when the file changed (its mtime, size or inode)."""
    if files is None:
        return load_tree(path)
    try:
        st = os.stat(path)
    except OSError:
        return load_tree(path)  # the one-line error naming the file
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size, st.st_ino)
    hit = files.get(key)
    if hit is None:
        hit = files[key] = load_tree(path)
    return hit


def _looks_like_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.startswith(("~", ".")) or FsPath(text).suffix.lower() in TREE_SUFFIXES


def resolve_tree_arg(tree: Any, *, files: Any = None) -> Any:
    """What a ``tree=`` argument of the executor (and of ``tree_decode``) names: None, a
    :class:`Tree` / :class:`MultiTree` or :class:`TreeFile` (returned as given), a builder
    name (a ``str`` returned as given) or a tree file (a :class:`TreeFile`; with ``files``,
    a cache such as the planner's, read again only when the file changes).

    A string is a builder name when its part before ``:`` is registered
    (``"kary:4"``, ``"auto"``; a file of that name needs ``"./name"`` or a
    ``pathlib.Path``); otherwise it is a path when it names an existing file or
    ends in ``.yaml``, ``.yml`` or ``.json``. An ``os.PathLike`` is always a path.

    >>> resolve_tree_arg("kary:4")
    'kary:4'
    >>> resolve_tree_arg("my/tree.yaml")
    Traceback (most recent call last):
    ...
    treecoll.topo.errors.TreeError: tree 'my/tree.yaml': no such tree file, and not a builder name (...)
    """
    if tree is None or isinstance(tree, (Tree, MultiTree, TreeFile)):
        return tree
    if isinstance(tree, os.PathLike):
        return _load_cached(tree, files)
    if not isinstance(tree, str):
        raise TreeError(
            f"tree: expected a Tree, MultiTree, loaded tree file (TreeFile), tree file path or builder "
            f"name, got {type(tree).__name__}"
        )
    if tree.partition(":")[0] in BUILDERS:
        return tree
    if os.path.isfile(tree) or (FsPath(tree).suffix.lower() in TREE_SUFFIXES and os.path.exists(tree)):
        return _load_cached(tree, files)
    if _looks_like_path(tree):
        raise TreeError(
            f"tree {tree!r}: no such tree file, and not a builder name (valid builder names are {sorted(BUILDERS)})"
        )
    return tree  # the builder registry names the valid builders


def _tree_dict(t: Tree) -> dict:
    d: dict[str, Any] = {"parents": list(t.parents)}
    if any(list(c) != sorted(c) for c in t.children):
        d = {"children": [list(c) for c in t.children]}
    return d


def dumps_tree(
    plan: Tree | MultiTree, *, hosts: Sequence[str] | None = None, name: str | None = None, fmt: str = "yaml"
) -> str:
    """Text of a tree file: ``fmt="yaml"`` (flow-style lists, one key per line) or ``"json"``."""
    if fmt not in ("yaml", "json"):
        raise TreeError(f"tree file format: expected 'yaml' or 'json', got {fmt!r}")
    out: dict[str, Any] = {}
    nm = name if name is not None else plan.name
    if nm:
        out["name"] = nm
    out["ranks"] = plan.size
    if hosts is not None:
        if len(hosts) != plan.size:
            raise TreeError(f"tree file: hosts expected {plan.size} labels (one per rank), got {len(hosts)}")
        out["hosts"] = list(hosts)
    if isinstance(plan, MultiTree):
        out["trees"] = [{**_tree_dict(t), "share": s} for t, s in zip(plan.trees, plan.shares)]
    else:
        out.update(_tree_dict(plan))
    if fmt == "json":
        return json.dumps(out, indent=1) + "\n"
    return yaml.safe_dump(out, sort_keys=False, default_flow_style=None, width=1 << 16)


def tree_format(path: str | os.PathLike) -> str:
    """``"json"`` for a ``.json`` path, else ``"yaml"``."""
    return "json" if FsPath(path).suffix.lower() == ".json" else "yaml"


def save_tree(
    plan: Tree | MultiTree, path: str | os.PathLike, *, hosts: Sequence[str] | None = None, name: str | None = None
) -> None:
    """Write :func:`dumps_tree` to ``path`` (JSON for a ``.json`` path, else YAML)."""
    FsPath(path).write_text(dumps_tree(plan, hosts=hosts, name=name, fmt=tree_format(path)), encoding="utf-8")


# ---------------------------------------------------------------------- NCCL graph XML
@dataclass(frozen=True)
class NcclGraph:
    """One ``<graph>``: its id, pattern (number and name), channels (orders of ranks)."""

    id: int
    pattern: int
    kind: str
    channels: tuple[tuple[int, ...], ...]
    attrs: dict

    @property
    def is_ring(self) -> bool:
        return self.pattern == 4

    def plan(self) -> MultiTree | Tree:
        """Tree patterns: one chain per channel (NCCL's intra-node tree), equal shares."""
        trees = []
        for ch in self.channels:
            parents = [-1] * len(ch)
            for a, b in zip(ch, ch[1:]):
                parents[b] = a
            trees.append(Tree.from_parents(parents, name=f"nccl-graph{self.id}"))
        return trees[0] if len(trees) == 1 else MultiTree(tuple(trees), name=f"nccl-graph{self.id}")

    def schedule(self) -> Schedule:
        """Ring pattern: one ring allreduce per channel, side by side; trees: the chains' allreduce."""
        n = len(self.channels[0])
        if self.is_ring:
            rings = [compile_ring_allreduce(n, order=list(ch)) for ch in self.channels]
            return merge_schedules(rings, name=f"nccl-graph{self.id}/ring-allreduce")
        return compile_allreduce(self.plan())


def loads_nccl_graph(text: str, source: str = "<string>") -> tuple[NcclGraph, ...]:
    """Parse NCCL_GRAPH_FILE XML text into its graphs (parsing by
    :func:`treecoll.topo.nccl_xml.parse_graph_xml`; this adds the checks a plan needs)."""
    from treecoll.topo.nccl_xml import parse_graph_xml

    try:
        data = parse_graph_xml(text, source=source)
    except TopologyError as e:
        raise TreeError(str(e)) from None
    out = []
    for gi, g in enumerate(data["graphs"]):
        where = f"{source}: graphs/graph[{gi}]"
        channels = []
        for ci, ch in enumerate(g["channels"]):
            ranks = tuple(r if r is not None else d for r, d in zip(ch["ranks"], ch["gpus"]))
            if not ranks:
                raise TreeError(f"{where}/channel[{ci}]: expected at least one <gpu>")
            channels.append(ranks)
        if not channels:
            raise TreeError(f"{where}: expected at least one <channel>")
        n = len(channels[0])
        for ci, ch in enumerate(channels):
            if sorted(ch) != list(range(n)):
                raise TreeError(f"{where}/channel[{ci}]: expected ranks 0..{n - 1} each once, got {list(ch)}")
        attrs = {k: v for k, v in g.items() if k not in ("channels",)}
        out.append(NcclGraph(g["id"], g["pattern"], g["pattern_name"], tuple(channels), attrs))
    if not out:
        raise TreeError(f"{source}: expected at least one <graph>")
    return tuple(out)


def load_nccl_graph(path: str | os.PathLike) -> tuple[NcclGraph, ...]:
    """Read an NCCL_GRAPH_FILE."""
    return loads_nccl_graph(*_read_text(path, "NCCL graph file"))
