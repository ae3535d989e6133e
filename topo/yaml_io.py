"""Reading and writing topologies as YAML: :func:`load`, :func:`loads`, :func:`save`, :func:`dumps`, :func:`default`.

Two forms (full schema with examples: docs/topology-yaml.md):

* **compact**: ``templates`` (named host templates, :mod:`treecoll.topo.compact`),
  ``hosts`` (groups ``{template, count, names}``) and ``network`` (a network
  template, :mod:`treecoll.topo.network`); a template may also come from another file
  (``template: dgx-h100`` finds ``dgx-h100.yaml`` beside the file or in the
  shipped ``topologies/`` or ``topologies/machines/``, the machine templates of
  :mod:`treecoll.topo.machines`; ``template: ../x/box.yaml`` is a relative path).
* **explicit**: ``nodes: [{id, kind, ...}]`` and ``links: [{a, b, kind, bw,
  lat, count[, directed]}]`` (the format :func:`save` writes, and
  :meth:`Topology.to_dict`). A compact file may add explicit nodes/links.

Every problem in a file is a :class:`~topo.errors.TopologyError` whose message
starts with ``file:line: key.path:``; no traceback escapes for a bad file, and
files are only ever read. The node and link counts a file asks for are checked
against caps before anything is built (:mod:`treecoll.topo.limits`; ``max_nodes`` /
``max_links`` on :func:`load`, :func:`loads` and :func:`resolve`, or the
environment variables ``TREECOLL_MAX_NODES`` / ``TREECOLL_MAX_LINKS``), and the
YAML itself may neither nest deeper than 100 levels nor expand through aliases
beyond ten times its size (:data:`treecoll.topo._schema.YAML_LOADER`).

>>> t = loads('''
... templates:
...   box: {gpus: {count: 2, numa: 0}, cpus: [{numa: 0}], pcie: {bw: 24.0}}
... hosts: [{template: box, count: 2}]
... network: {type: single_switch}
... ''')
Traceback (most recent call last):
...
treecoll.topo.errors.TopologyError: <string>:5: network: a network needs NICs: expected hosts with nics ...
>>> t = loads("hosts: [{template: dgx-h100, count: 2}]\\nnetwork: {type: rail_optimized}\\n")
>>> len(t.gpus()), t.path("h0/gpu0", "h1/gpu0").nccl
(16, 'NET')
>>> loads(dumps(t)) == t
True
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path as FsPath
from typing import IO, Any

import networkx as nx
import yaml

from ._schema import YAML_LOADER, Doc
from .compact import MEM_GB_UNIT, HostTemplate, check_cpulist, expand, parse_template
from .errors import TopologyError
from .files import decode_text, read_text
from .gcpause import gc_paused
from .importers import import_text
from .limits import limits as make_limits
from .model import HOSTED_KINDS, LINK_KINDS, NODE_KINDS, Topology
from .network import add_network

__all__ = [
    "load",
    "loads",
    "save",
    "dumps",
    "default",
    "resolve",
    "SHIPPED_DIR",
    "MACHINES_DIR",
    "NODE_ATTRS",
    "shipped",
    "shipped_names",
]

#: the shipped topologies: the package data ``treecoll.topologies`` (``topologies/`` in a checkout)
SHIPPED_DIR = FsPath(importlib.util.find_spec("treecoll.topologies").origin).parent
#: the shipped one-host machine templates (:mod:`treecoll.topo.machines`), found by name like the topologies
MACHINES_DIR = SHIPPED_DIR / "machines"
TOP_KEYS = ("name", "meta", "templates", "hosts", "network", "nodes", "links")
GROUP_KEYS = ("template", "count", "names")
#: ``measured``: the date a probe measured the link's ``bw`` / ``lat`` (``treecoll topo probe -o``)
LINK_ATTRS = ("a", "b", "kind", "bw", "lat", "count", "directed", "measured")
#: attributes each node kind may carry in the explicit form (besides id, kind, host);
#: keys starting with ``x_`` are free-form extensions kept as they are.
NODE_ATTRS = {
    "gpu": ("index", "pci", "uuid", "model", "mem_bw", "mem_gb", "numa", "sm", "rank", "name", "serial"),
    "nvswitch": ("pci", "assumed", "index", "name", "multicast"),
    "pcie_switch": ("host_bridge", "quadrant", "pci", "name", "vendor", "device", "link_speed", "link_width"),
    "cpu": ("numa", "socket", "affinity", "model", "arch", "vendor", "familyid", "modelid"),
    "nic": ("name", "bw", "pci", "rail", "link_layer", "port", "guid", "numa", "dev", "speed", "lat"),
    "net_switch": ("tier", "rail", "coord", "name", "sharp"),
}
_INT_ATTRS = frozenset({"index", "numa", "sm", "rank", "socket", "rail", "tier", "port", "dev", "quadrant"})
#: positive numbers and their units (``mem_gb``: a GPU's memory capacity, 1 GB = 1e9 bytes)
_POS_ATTRS = {"mem_bw": "GB/s", "bw": "GB/s", "mem_gb": MEM_GB_UNIT}
_NONNEG_ATTRS = {"lat": "µs"}
_BOOL_ATTRS = frozenset({"multicast", "sharp"})


class _Loader(YAML_LOADER):  # type: ignore[misc, valid-type]
    """PyYAML's safe loader that refuses duplicate keys in a mapping."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for k, _ in node.value:
            if isinstance(k, yaml.ScalarNode):
                if k.value in seen:
                    raise _Duplicate(k.value, k.start_mark.line + 1)
                seen.add(k.value)
        return super().construct_mapping(node, deep=deep)


class _Duplicate(Exception):
    def __init__(self, key: str, line: int):
        self.key, self.line = key, line


def _parse(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except _Duplicate as e:
        raise TopologyError(
            f"duplicate key {e.key!r}: each key may appear once in a mapping", where=f"{source}:{e.line}"
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        what = e.problem or e.context or "cannot parse"
        if e.context and e.problem:
            started = (
                f" started on line {e.context_mark.line + 1}"
                if e.context_mark and mark and e.context_mark.line != mark.line
                else ""
            )
            what = f"{e.problem} ({e.context}{started})"
        raise TopologyError(f"invalid YAML: {what}", where=f"{source}{line}") from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, max(e.position, 0)) + 1
        ch = e.character if isinstance(e.character, str) else chr(e.character)
        raise TopologyError(f"invalid YAML: {e.reason}: {ch!r}", where=f"{source}:{line}") from None
    except yaml.YAMLError as e:
        raise TopologyError(f"invalid YAML: {' '.join(str(e).split())}", where=source) from None


# ---------------------------------------------------------------------------------------- public API
def load(
    path_or_stream: str | os.PathLike | IO[str], *, max_nodes: int | None = None, max_links: int | None = None
) -> Topology:
    """Read a topology from a YAML file path or an open text stream.

    ``max_nodes`` / ``max_links`` raise (or lower) the caps on the topology's
    size for this call (:mod:`treecoll.topo.limits`).
    """
    if hasattr(path_or_stream, "read"):
        source = getattr(path_or_stream, "name", "<stream>")
        return loads(path_or_stream.read(), source=str(source), max_nodes=max_nodes, max_links=max_links)
    p = FsPath(path_or_stream)
    return loads(_read(p), source=str(p), base_dir=p.resolve().parent, max_nodes=max_nodes, max_links=max_links)


def _read(p: FsPath) -> str:
    return read_text(p, "topology file", hint=f"; shipped topologies are in {SHIPPED_DIR} and its machines/")


def loads(
    text: str,
    source: str = "<string>",
    base_dir: str | os.PathLike | None = None,
    *,
    max_nodes: int | None = None,
    max_links: int | None = None,
) -> Topology:
    """Read a topology from YAML text (or UTF-8 bytes); ``source`` names it in errors, ``base_dir``
    resolves relative template paths (default: the current directory); ``max_nodes`` /
    ``max_links``: see :func:`load`."""
    lim = make_limits(max_nodes, max_links)
    if isinstance(text, (bytes, bytearray)):
        text = decode_text(bytes(text), source, "topology")
    if not isinstance(text, str):
        raise TopologyError(f"expected YAML text, got {type(text).__name__}", where=source)
    if "\r\n" in text:  # CRLF: same lines, and the fast reader of saved files applies
        text = text.replace("\r\n", "\n")
    try:
        fast = _fast_explicit(text)
        if fast is not None:
            data, lines = fast
            doc = Doc(source, text, data, lines=lines, limits=lim)
        else:
            doc = Doc(source, text, _parse(text, source), limits=lim)
        return _build(doc, FsPath(base_dir) if base_dir else FsPath.cwd(), set())
    except TopologyError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError) as e:
        # a guard: a malformed file must never produce a traceback, even through a checker's blind spot
        raise TopologyError(
            f"cannot read topology ({type(e).__name__}: {e}); please report this file", where=source
        ) from None


def _fast_explicit(text: str) -> tuple[dict, dict] | None:
    """Parse the line-per-item explicit form that :func:`dumps` writes with ``json``.

    Returns ``(data, {(section, index): line})`` or None when the text has any
    other shape (then full YAML parsing takes over). Item lines are JSON flow
    mappings, which YAML reads the same way.
    """
    lines = text.split("\n")
    head: list[str] = []
    items: dict[str, list[str]] = {}
    where: dict[tuple[str, int], int] = {}
    cur = None
    for no, ln in enumerate(lines, 1):
        if cur is None and ln not in ("nodes:", "links:"):
            if ln.startswith(("-", " ")):
                return None
            head.append(ln)
        elif ln in ("nodes:", "links:"):
            cur = ln[:-1]
            if cur in items:
                return None
            items[cur] = []
        elif ln.startswith("- {"):
            where[(cur, len(items[cur]))] = no
            items[cur].append(ln[2:])
        elif ln.strip() and not ln.lstrip().startswith("#"):
            return None
    if "nodes" not in items:
        return None
    try:
        data = yaml.load("\n".join(head), Loader=_Loader) or {}
        if not isinstance(data, dict) or "nodes" in data or "links" in data:
            return None
        for k, v in items.items():
            data[k] = json.loads("[" + ",".join(v) + "]", object_pairs_hook=_unique_pairs)
    except (yaml.YAMLError, _Duplicate, ValueError):
        return None
    return data, where


def _rank(doc: Doc, p: tuple, kind: str, r: int, ranks: dict[int, int]) -> None:
    if kind != "gpu":
        doc.fail((*p, "rank"), f"only GPUs carry a rank, got a {kind}")
    if r in ranks:
        doc.fail((*p, "rank"), f"rank {r} is given to two GPUs, nodes[{ranks[r]}] and nodes[{p[1]}]")
    ranks[r] = p[1]


def _unique_pairs(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        raise ValueError("duplicate key")
    return d


def dumps(topology: Topology) -> str:
    """The explicit form as YAML text: one flow mapping per node and per link."""
    d = topology.to_dict()
    out = [
        "# treecoll topology, explicit form (written by topo.save; topo.load reads it back)",
        f"name: {_flow(d['name'])}",
    ]
    if d.get("meta"):
        out.append(f"meta: {_flow(d['meta'])}")
    out.append("nodes:")
    out.extend(f"- {_item(n)}" for n in d["nodes"])
    out.append("links:")
    out.extend(f"- {_item(lk)}" for lk in d["links"])
    return "\n".join(out) + "\n"


def save(topology: Topology, path_or_stream: str | os.PathLike | IO[str]) -> None:
    """Write the explicit form to a path or text stream; ``load`` reads back an equal Topology."""
    text = dumps(topology)
    if hasattr(path_or_stream, "write"):
        path_or_stream.write(text)
        return
    try:
        FsPath(path_or_stream).write_text(text, encoding="utf-8")
    except OSError as e:
        raise TopologyError(f"cannot write topology file: {e}", where=str(path_or_stream)) from None


#: the shipped topology :func:`default` loads
DEFAULT_NAME = "dgx-h100-x2"


def default() -> Topology:
    """The default topology: two DGX H100 on a rail-optimized NDR fat tree (``topologies/dgx-h100-x2.yaml``)."""
    return load(shipped(DEFAULT_NAME))


def shipped_names() -> list[str]:
    """The names of every shipped topology: ``topologies/*.yaml`` and the machine templates
    ``topologies/machines/*.yaml``."""
    return sorted(x.stem for d in (SHIPPED_DIR, MACHINES_DIR) if d.is_dir() for x in d.glob("*.yaml"))


def _shipped_file(name: str) -> FsPath | None:
    file = name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"
    if "/" in file or os.sep in file:
        return None
    return next((p for p in (SHIPPED_DIR / file, MACHINES_DIR / file) if p.is_file()), None)


def shipped(name: str) -> FsPath:
    """Path of a shipped topology by name (``"dgx-h100"`` -> ``topologies/dgx-h100.yaml``; a machine
    template such as ``"h100-sxm"`` -> ``topologies/machines/h100-sxm.yaml``)."""
    p = _shipped_file(name)
    if p is None:
        raise TopologyError(f"shipped topology {name!r}: not found; expected one of {shipped_names()}")
    return p


def resolve(spec: str | os.PathLike, *, max_nodes: int | None = None, max_links: int | None = None) -> Topology:
    """A topology named the way the command line names one.

    ``"default"`` is :func:`default`; an existing path is loaded (YAML; an
    NCCL topology XML or ``nvidia-smi topo -m`` text, recognised by content,
    through :func:`treecoll.topo.importers.import_text`); otherwise a shipped name
    (``"dgx-h100-x16"``). A directory, a device and an empty file get their own
    one-line errors. ``max_nodes`` / ``max_links``: see :func:`load`.
    """
    s = str(spec)
    if s == "default":
        return default()
    caps = {"max_nodes": max_nodes, "max_links": max_links}
    p = FsPath(s)
    if p.is_file() and p.suffix.lower() not in (".yaml", ".yml"):  # another format, recognised by content
        where = os.fspath(p)
        text = read_text(where, "topology file")
        other = import_text(text, where, **caps)
        return other if other is not None else loads(text, source=where, base_dir=p.resolve().parent, **caps)
    if not p.is_file() and _shipped_file(s) is not None:
        return load(shipped(s), **caps)
    return load(p, **caps)  # a YAML file, or the one-line error saying why the path cannot be read


# ---------------------------------------------------------------------------------------- flow writer
def _item(d: dict) -> str:
    """One node or link as a JSON flow mapping; YAML-safe floats (see :func:`_flow`) when needed."""
    s = json.dumps(d, ensure_ascii=False, allow_nan=False, default=str) if _plain(d) else None
    return s if s is not None and "e-" not in s and "e+" not in s else _flow(d)


def _plain(d: dict) -> bool:
    return all(
        type(v) in (str, int, float, bool) and v == v and v not in (float("inf"), float("-inf")) for v in d.values()
    )


def _flow(v: Any) -> str:
    """One-line YAML for plain data; JSON-compatible, floats always with a '.' so YAML 1.1 reads floats."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_flow(str(k))}: {_flow(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_flow(x) for x in v) + "]"
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return {True: ".nan"}.get(v != v, ".inf" if v > 0 else "-.inf")
        r = repr(v)
        if "e" in r and "." not in r:
            r = r.replace("e", ".0e")
        return r
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    return json.dumps(str(v))


# ---------------------------------------------------------------------------------------- building
@gc_paused()  # a graph of 100,000 GPUs: millions of dicts, no reference cycles
def _build(doc: Doc, base: FsPath, visiting: set) -> Topology:
    data = doc.data
    d = doc.mapping(data, (), optional=TOP_KEYS)
    if "hosts" not in d and "nodes" not in d:
        doc.fail((), "expected 'hosts' (compact form) or 'nodes' and 'links' (explicit form)")
    name = d.get("name", "")
    if not isinstance(name, str):
        doc.fail(("name",), f"expected a string, got {name!r}")
    meta = doc.mapping(d["meta"], ("meta",), optional=d["meta"]) if "meta" in d else None
    g = nx.DiGraph()
    groups: dict[str, str] = {}
    if "hosts" in d:
        groups = _compact(doc, d, base, visiting, g)
    elif "network" in d or "templates" in d:
        doc.fail(("network" if "network" in d else "templates",), "only valid with 'hosts' (compact form)")
    if "nodes" in d or "links" in d:
        _explicit(doc, d, g)
        groups = {}  # explicit nodes and links may change any host
    if not any(kind == "gpu" for _, kind in g.nodes(data="kind")):
        doc.fail(
            ("nodes",) if "nodes" in d else ("hosts",),
            "expected at least one node of kind gpu, got none: a topology without GPUs has no ranks "
            "(a CPU-only host has one gpu-kind rank slot per process, see topologies/cpu-local.yaml)",
        )
    try:
        return Topology._adopt(g, name=name, meta=meta, host_groups=groups or None)
    except TopologyError as e:
        raise TopologyError(str(e), where=doc.source) from None


#: the longest host name a ``names`` pattern may make (a DNS name's limit, RFC 1035)
MAX_HOST_NAME = 253


def _compact(doc: Doc, d: dict, base: FsPath, visiting: set, g: nx.DiGraph) -> dict[str, str]:
    """Add the hosts and the network of compact form ``d`` to ``g``; returns ``{host: template}`` for
    the hosts built alike by construction (their template's copies, whose links leave them only from
    their NICs into the network: not those on rack-level NVLink switches)."""
    local = doc.mapping(d.get("templates", {}), ("templates",), optional=d.get("templates") or ())
    cache: dict[str, HostTemplate] = {}
    groups: dict[str, str] = {}
    host_nics = []
    seen_hosts: set[str] = set()
    made = (0, 0)  # nodes and directed links the groups so far make (networkx counts edges in O(nodes))
    hi = 0
    for gi, grp in enumerate(doc.seq(d["hosts"], ("hosts",), what="host groups")):
        gp = ("hosts", gi)
        grp = doc.mapping(grp, gp, required=("template",), optional=GROUP_KEYS)
        ref = doc.string(grp["template"], (*gp, "template"))
        if ref not in cache:
            cache[ref] = _template(doc, local, ref, (*gp, "template"), base, visiting)
        ht = cache[ref]
        count = doc.integer(grp.get("count", 1), (*gp, "count"), minimum=1)
        made = _host_budget(doc, (*gp, "count"), made, ht, count)
        pattern = doc.string(grp.get("names", "h{i}"), (*gp, "names"))
        if "{i}" not in pattern and "{j}" not in pattern and count > 1:
            doc.fail(
                (*gp, "names"),
                f"expected a pattern with {{i}} (cluster index) or {{j}} (index in the group) "
                f"for {count} hosts, got {pattern!r}",
            )
        names = []
        for j in range(count):
            h = pattern.replace("{i}", str(hi)).replace("{j}", str(j))
            if len(h) > MAX_HOST_NAME:
                doc.fail((*gp, "names"), f"host name of {len(h):,} characters: expected at most {MAX_HOST_NAME}")
            if "/" in h or h in seen_hosts:
                doc.fail(
                    (*gp, "names"),
                    f"host name {h!r} is {'used twice' if h in seen_hosts else 'invalid'}: "
                    f"expected unique names without '/'",
                )
            seen_hosts.add(h)
            names.append(h)
            hi += 1
        expand(g, ht, names)
        if not ht.rack_switches:
            groups.update(dict.fromkeys(names, ref))
        nics = [(n, a["rail"], a["bw"]) for n, a in ht.nics() if "rail" in a]
        host_nics.extend((h, [(f"{h}/{n}", r, bw) for n, r, bw in nics]) for h in names)
    if "network" in d:
        add_network(doc, d["network"], ("network",), g, host_nics)
    elif len(host_nics) > 1:
        doc.fail(
            ("hosts",),
            f"{len(host_nics)} hosts need a 'network' (one of single_switch, fat_tree, rail_optimized, torus)",
        )
    return groups


def _host_budget(doc: Doc, path: tuple, made: tuple[int, int], ht: HostTemplate, count: int) -> tuple[int, int]:
    """Refuse ``count`` more hosts of ``ht`` when the graph would outgrow the caps (before building them);
    ``made``: the nodes and links of the groups before; returns the totals with these hosts."""
    per_nodes, per_links = len(ht.nodes), 2 * (len(ht.links) + len(ht.rack_links))
    domains = 1 if ht.domain_hosts is None else -(-count // ht.domain_hosts)
    nodes = made[0] + count * per_nodes + ht.rack_switches * domains
    links = made[1] + count * per_links
    doc.budget(
        path,
        nodes,
        links,
        f"{count:,} hosts of template {ht.name!r} ({per_nodes} nodes and {per_links} "
        f"directed links each, with the hosts before them)",
    )
    return nodes, links


def _template(doc: Doc, local: dict, ref: str, path: tuple, base: FsPath, visiting: set) -> HostTemplate:
    """Resolve ``template: ref``: this file's templates, else a file (NAME.yaml or a path)."""
    if ref in local:
        return parse_template(doc, local[ref], ("templates", ref), ref)
    is_path = ref.endswith((".yaml", ".yml")) or "/" in ref
    if is_path:
        candidates = [base / ref]
    else:
        candidates = [base / f"{ref}.yaml", SHIPPED_DIR / f"{ref}.yaml", MACHINES_DIR / f"{ref}.yaml"]
    fp = next((c for c in candidates if c.is_file()), None)
    if fp is None:
        doc.fail(
            path,
            f"unknown template {ref!r}: expected one of this file's templates {sorted(local)} or a file "
            f"{' or '.join(str(c) for c in candidates)}",
        )
    key = str(fp.resolve())
    if key in visiting:
        doc.fail(path, f"template {ref!r}: {fp} refers back to itself")
    text = _read(fp)
    other = Doc(str(fp), text, _parse(text, str(fp)), limits=doc.limits)
    od = other.mapping(other.data, (), optional=TOP_KEYS)
    temps = other.mapping(od.get("templates", {}), ("templates",), optional=od.get("templates") or ())
    name = FsPath(ref).stem if is_path else ref
    if name not in temps:
        if len(temps) != 1:
            doc.fail(path, f"template {ref!r}: {fp} defines templates {sorted(temps)}; expected one named {name!r}")
        name = next(iter(temps))
    return parse_template(other, temps[name], ("templates", name), name)


def _explicit(doc: Doc, d: dict, g: nx.DiGraph) -> None:
    nodes = doc.seq(d.get("nodes", []), ("nodes",), what="nodes")
    links = doc.seq(d.get("links", []), ("links",), what="links")
    doc.budget(
        ("nodes",),
        g.number_of_nodes() + len(nodes),
        g.number_of_edges() + 2 * len(links),
        f"{len(nodes):,} nodes and {len(links):,} links listed (with the ones expanded from hosts)",
    )
    ranks: dict[int, int] = {}
    for i, nd in enumerate(nodes):
        p = ("nodes", i)
        if not isinstance(nd, dict):
            doc.fail(p, f"expected a mapping {{id, kind, ...}}, got {type(nd).__name__}")
        kind = nd.get("kind")
        if kind not in NODE_KINDS:
            doc.fail((*p, "kind"), f"expected one of {list(NODE_KINDS)}, got {kind!r}")
        allowed = ("id", "kind", "host") + NODE_ATTRS[kind]
        for k in nd:
            if not (isinstance(k, str) and (k in allowed or k.startswith("x_"))):
                doc.fail(
                    (*p, k),
                    f"unknown key {k!r} for a {kind}: expected one of {sorted(allowed)} "
                    f"or an extension key starting with 'x_'",
                )
        if "id" not in nd:
            doc.fail(p, "missing key 'id'")
        nid = doc.string(nd["id"], (*p, "id"))
        if nid in g:
            doc.fail((*p, "id"), f"duplicate node id {nid!r}")
        if kind in HOSTED_KINDS and "host" not in nd:
            doc.fail(p, f"missing key 'host': a {kind} belongs to a host")
        if "host" in nd:
            doc.string(nd["host"], (*p, "host"))
        if nd.get("affinity") is not None:
            check_cpulist(doc, doc.string(nd["affinity"], (*p, "affinity")), (*p, "affinity"))
        for k, v in nd.items():
            if k in _INT_ATTRS:
                doc.integer(v, (*p, k), minimum=0)
                if k == "rank":
                    _rank(doc, p, kind, v, ranks)
            elif k in _POS_ATTRS:
                doc.number(v, (*p, k), unit=_POS_ATTRS[k])
            elif k in _NONNEG_ATTRS:
                doc.number(v, (*p, k), positive=False, unit=_NONNEG_ATTRS[k])
            elif k in _BOOL_ATTRS:
                doc.boolean(v, (*p, k))
        attrs = {k: v for k, v in nd.items() if k != "id"}
        g.add_node(nid, **attrs)
    if ranks and len(ranks) != max(ranks) + 1:
        missing = sorted(set(range(max(ranks) + 1)) - set(ranks))
        doc.fail(
            ("nodes", ranks[max(ranks)], "rank"),
            f"ranks must be 0..P-1, each on one GPU: rank {max(ranks)} is given but ranks {missing[:8]} are not",
        )
    pairs: set[tuple[str, str]] = set()
    for i, ld in enumerate(links):
        p = ("links", i)
        ld = doc.mapping(ld, p, required=("a", "b", "kind", "bw"), optional=LINK_ATTRS)
        a, b = ld["a"], ld["b"]
        for k in ("a", "b"):
            if not isinstance(ld[k], str) or ld[k] not in g:
                doc.fail(
                    (*p, k),
                    f"dangling link end {ld[k]!r}: expected the id of a node listed in nodes (or expanded from hosts)",
                )
        if a == b:
            doc.fail(p, f"a link cannot join {a!r} to itself")
        if ld["kind"] not in LINK_KINDS:
            doc.fail((*p, "kind"), f"expected one of {list(LINK_KINDS)}, got {ld['kind']!r}")
        attrs = {"kind": ld["kind"], "bw": ld["bw"]}
        doc.number(ld["bw"], (*p, "bw"), unit="GB/s")
        if "lat" in ld:
            doc.number(ld["lat"], (*p, "lat"), positive=False, unit="µs")
            attrs["lat"] = ld["lat"]
        if "count" in ld:
            attrs["count"] = doc.integer(ld["count"], (*p, "count"), minimum=1)
        if "measured" in ld:
            attrs["measured"] = doc.string(ld["measured"], (*p, "measured"))
        directed = ld.get("directed", False)
        if not isinstance(directed, bool):
            doc.fail((*p, "directed"), f"expected true or false, got {directed!r}")
        for u, v in ((a, b),) if directed else ((a, b), (b, a)):
            if (u, v) in pairs or g.has_edge(u, v):
                doc.fail(p, f"duplicate link {u!r} -> {v!r}: each pair is listed once (both directions)")
            pairs.add((u, v))
            g.add_edge(u, v, **attrs)
