"""Validation of plain YAML data with errors that name file, line and key path.

A :class:`Doc` wraps one parsed file: its source name, its text and the data
PyYAML built. Checks take the value and its key path (a tuple of keys and list
indices, e.g. ``("hosts", 0, "nvswitch", "links")``) and raise
:class:`~topo.errors.TopologyError` like::

    dgx.yaml:14: templates.dgx.nvswitch.links: expected 4 integers (one per switch), got 3

Line numbers are looked up lazily (only when an error is raised) by composing
the text with PyYAML and walking the node tree along the key path, so a valid
file is parsed once, by the fast C loader when available.

:data:`YAML_LOADER` is PyYAML's safe loader (the C one when available) with
two guards, so that loading time and memory stay proportional to the text:

* nesting deeper than :data:`MAX_YAML_DEPTH` collections is refused before
  anything is built (the C composer recurses once per level and crashes the
  interpreter near 100,000 levels; libyaml's scanner is quadratic in the depth
  of flow collections);
* aliases that expand the document to more than :data:`ALIAS_FLOOR` values and
  more than :data:`ALIAS_RATIO` times the values written (a "billion laughs"
  alias bomb: nine aliases of nine aliases ... make 9**9 values out of 100
  written) are refused before the data is built, as are recursive aliases;
  ordinary aliases (a template reused by anchor) load as usual.

>>> d = Doc("x.yaml", "a:\\n  b: -1\\n", {"a": {"b": -1}})
>>> d.where(("a", "b"))
'x.yaml:2: a.b'
>>> d.number(-1, ("a", "b"))
Traceback (most recent call last):
...
treecoll.topo.errors.TopologyError: x.yaml:2: a.b: expected a positive number, got -1
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import yaml

from .errors import TopologyError
from .limits import Limits

__all__ = ["Doc", "fmt_path", "YAML_LOADER", "MAX_YAML_DEPTH", "ALIAS_FLOOR", "ALIAS_RATIO"]

#: deepest nesting of mappings and sequences accepted (the topology schema needs 6)
MAX_YAML_DEPTH = 100
#: a document may always expand to this many values through aliases ...
ALIAS_FLOOR = 100_000
#: ... and beyond that to at most this many times the values it writes
ALIAS_RATIO = 10
_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the fast C loader when PyYAML has libyaml
_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
Path_ = tuple  # a key path: tuple of str keys and int indices


def _check_depth(text: str) -> None:
    """Refuse nesting deeper than MAX_YAML_DEPTH, reading events only up to the first level too deep."""
    if sum(text.count(c) for c in "[{-:?") <= MAX_YAML_DEPTH:
        return  # every collection starts with one of these characters: it cannot nest deeper
    depth = 0
    for ev in yaml.parse(text, Loader=_BASE_LOADER):
        if isinstance(ev, _OPEN):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested deeper than {MAX_YAML_DEPTH} levels of mappings and lists: expected a "
                    f"topology document (at most a few levels deep)",
                    ev.start_mark,
                )
        elif isinstance(ev, _CLOSE):
            depth -= 1


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [x for kv in node.value for x in kv]
    if isinstance(node, yaml.SequenceNode):
        return node.value
    return []


def _check_aliases(root: yaml.Node) -> None:
    """Refuse recursive aliases and alias expansion beyond the limits (memoised: linear in the composed nodes)."""
    size: dict[int, int] = {}
    order: list[yaml.Node] = []  # post-order: every node after its children
    entered: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        k = id(node)
        if done:
            size[k] = 1 + sum(size[id(c)] for c in _children(node))
            entered.discard(k)
            order.append(node)
            continue
        if k in size:
            continue
        entered.add(k)
        stack.append((node, True))
        for c in _children(node):
            if id(c) in entered:
                raise yaml.constructor.ConstructorError(
                    None, None, "recursive alias (a node that contains itself): expected plain data", c.start_mark
                )
            if id(c) not in size:
                stack.append((c, False))
    limit = max(ALIAS_FLOOR, ALIAS_RATIO * len(size))
    if size[id(root)] <= limit:
        return
    first = next(n for n in order if size[id(n)] > limit)  # the smallest part that is already too big
    raise yaml.constructor.ConstructorError(
        None,
        None,
        f"aliases expand the document to {size[id(root)]:,} values from {len(size):,} written: expected "
        f"at most {limit:,} ({ALIAS_RATIO} times the values written, at least {ALIAS_FLOOR:,}); "
        f"an alias bomb? write the data out instead",
        first.start_mark,
    )


class YAML_LOADER(_BASE_LOADER):  # type: ignore[misc, valid-type]
    """PyYAML's safe loader with the nesting and alias guards of this module; also turns values PyYAML
    cannot build (a date like 2024-13-45, an integer of more than 4300 digits) into marked YAML errors."""

    def __init__(self, stream):
        if hasattr(stream, "read"):
            stream = stream.read()
        if isinstance(stream, (bytes, bytearray)):
            stream = bytes(stream).decode("utf-8-sig")
        _check_depth(stream)
        super().__init__(stream)

    def construct_document(self, node):
        _check_aliases(node)
        return super().construct_document(node)

    def _scalar(self, node, build, what: str):
        try:
            return build(self, node)
        except (ValueError, OverflowError) as e:
            why = str(e).split(";")[0]  # Python's hint on its digit limit does not help a file's author
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {what} {node.value[:40]!r}: {why}", node.start_mark
            ) from None

    def construct_yaml_timestamp(self, node):
        return self._scalar(node, _BASE_LOADER.construct_yaml_timestamp, "the date/time")

    def construct_yaml_int(self, node):
        return self._scalar(node, _BASE_LOADER.construct_yaml_int, "the integer")

    def construct_yaml_float(self, node):
        return self._scalar(node, _BASE_LOADER.construct_yaml_float, "the number")


for _tag, _fn in (
    ("tag:yaml.org,2002:timestamp", YAML_LOADER.construct_yaml_timestamp),
    ("tag:yaml.org,2002:int", YAML_LOADER.construct_yaml_int),
    ("tag:yaml.org,2002:float", YAML_LOADER.construct_yaml_float),
):
    YAML_LOADER.add_constructor(_tag, _fn)


def fmt_path(path: Sequence[Any]) -> str:
    """``("hosts", 0, "gpus")`` -> ``"hosts[0].gpus"``; the empty path is ``"(top level)"``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _type_name(v: Any) -> str:
    if v is None:
        return "nothing (null)"
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(v), type(v).__name__)


def _show(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return _type_name(v)
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


class Doc:
    """One source file (or string) being validated; see the module docstring."""

    def __init__(self, source: str, text: str, data: Any, lines: dict | None = None, limits: Limits | None = None):
        self.source = source
        self.text = text
        self.data = data
        self.limits = limits or Limits()  # caps on nodes and links (topo.limits)
        self._lines = lines  # optional {(key, index): line} known without composing
        self._root = None

    # ----------------------------------------------------------------- places
    def line(self, path: Sequence[Any]) -> int | None:
        """1-based line of the deepest node of ``path`` found in the text (None if unknown)."""
        if self._lines is not None and len(path) >= 2 and tuple(path[:2]) in self._lines:
            return self._lines[tuple(path[:2])]
        if self._root is None:
            try:
                self._root = yaml.compose(self.text, Loader=YAML_LOADER) or False
            except yaml.YAMLError:
                self._root = False
        node, line = self._root, None
        if node:
            line = node.start_mark.line + 1
        for p in path:
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if isinstance(k, yaml.ScalarNode) and k.value == str(p):
                        line, node = k.start_mark.line + 1, v
                        break
                else:
                    break
            elif isinstance(node, yaml.SequenceNode) and isinstance(p, int) and 0 <= p < len(node.value):
                node = node.value[p]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def where(self, path: Sequence[Any]) -> str:
        """``"file:line: key.path"`` for messages."""
        line = self.line(path)
        loc = f"{self.source}:{line}" if line else self.source
        return f"{loc}: {fmt_path(path)}"

    def fail(self, path: Sequence[Any], message: str):
        """Raise TopologyError located at ``path``."""
        raise TopologyError(message, where=self.where(path))

    def budget(self, path: Sequence[Any], nodes: int, links: int, what: str) -> None:
        """Fail at ``path`` when ``nodes`` / ``links`` (what ``what`` makes) exceed :attr:`limits`."""
        msg = self.limits.excess(nodes, links, what)
        if msg is not None:
            self.fail(path, msg)

    # ----------------------------------------------------------------- checks
    def mapping(
        self, v: Any, path: Sequence[Any], *, required: Iterable[str] = (), optional: Iterable[str] = ()
    ) -> dict:
        """Check ``v`` is a mapping with all ``required`` keys and no key outside required+optional."""
        if not isinstance(v, dict):
            self.fail(path, f"expected a mapping, got {_type_name(v)}")
        required = tuple(required)
        allowed = set(required) | set(optional)
        for k in v:
            if not isinstance(k, str) or k not in allowed:
                self.fail((*path, k), f"unknown key {k!r}: expected one of {sorted(allowed)}")
        for k in required:
            if k not in v:
                self.fail(path, f"missing key {k!r}: required keys are {list(required)}")
        return v

    def number(self, v: Any, path: Sequence[Any], *, positive: bool = True, unit: str = "") -> float:
        """A real number (> 0 when ``positive``, else >= 0), returned as float."""
        u = f" ({unit})" if unit else ""
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            self.fail(path, f"expected a {'positive' if positive else 'non-negative'} number{u}, got {_show(v)}")
        if (positive and not v > 0) or (not positive and v < 0) or v == float("inf"):
            self.fail(path, f"expected a {'positive' if positive else 'non-negative'} number{u}, got {_show(v)}")
        return float(v)

    def integer(self, v: Any, path: Sequence[Any], *, minimum: int | None = None) -> int:
        """An integer (``minimum`` inclusive)."""
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(path, f"expected an integer, got {_show(v)}")
        if minimum is not None and v < minimum:
            self.fail(path, f"expected an integer >= {minimum}, got {v}")
        return v

    def boolean(self, v: Any, path: Sequence[Any]) -> bool:
        """``true`` or ``false``."""
        if not isinstance(v, bool):
            self.fail(path, f"expected true or false, got {_show(v)}")
        return v

    def string(self, v: Any, path: Sequence[Any]) -> str:
        """A non-empty string."""
        if not isinstance(v, str) or not v:
            self.fail(path, f"expected a non-empty string, got {_show(v)}")
        return v

    def seq(self, v: Any, path: Sequence[Any], *, length: int | None = None, what: str = "items") -> list:
        """A list (of exactly ``length`` entries when given)."""
        if not isinstance(v, list):
            self.fail(path, f"expected a list of {what}, got {_show(v)}")
        if length is not None and len(v) != length:
            self.fail(path, f"expected {length} {what}, got {len(v)}")
        return v

    def per_item(self, v: Any, path: Sequence[Any], count: int, check, *, what: str) -> list:
        """A scalar (the same for all ``count`` items) or a list of exactly ``count`` of them."""
        if isinstance(v, list):
            self.seq(v, path, length=count, what=what)
            return [check(x, (*path, i)) for i, x in enumerate(v)]
        x = check(v, path)
        return [x] * count

    def index_list(self, v: Any, path: Sequence[Any], bound: int, *, what: str) -> list[int]:
        """A list of distinct indices in ``0..bound-1``."""
        self.seq(v, path, what=f"{what} indices")
        out = []
        for i, x in enumerate(v):
            self.integer(x, (*path, i), minimum=0)
            if x >= bound:
                self.fail((*path, i), f"expected a {what} index in 0..{bound - 1}, got {x}")
            if x in out:
                self.fail((*path, i), f"{what} {x} listed twice")
            out.append(x)
        return out
