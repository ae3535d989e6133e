"""Validation of plain YAML data with errors that name file, line and key path.

A :class:`Doc` wraps one parsed file: its source name, its text and the data
PyYAML built. Checks take the value and its key path (a tuple of keys and list
indices, e.g. ``("hosts", 0, "nvswitch", "links")``) and raise
:class:`~topo.errors.TopologyError` like::

    dgx.yaml:14: templates.dgx.nvswitch.links: expected 4 integers (one per switch), got 3

Line numbers are looked up lazily (only when an error is raised) by composing
the text with PyYAML and walking the node tree along the key path, so a valid
file is parsed once, by the fast C loader when available.

>>> d = Doc("x.yaml", "a:\\n  b: -1\\n", {"a": {"b": -1}})
>>> d.where(("a", "b"))
'x.yaml:2: a.b'
>>> d.number(-1, ("a", "b"))
Traceback (most recent call last):
...
topo.errors.TopologyError: x.yaml:2: a.b: expected a positive number, got -1
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import yaml

from .errors import TopologyError

__all__ = ["Doc", "fmt_path", "YAML_LOADER"]

#: the fast C loader when PyYAML was built with libyaml
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
Path_ = tuple  # a key path: tuple of str keys and int indices


def fmt_path(path: Sequence[Any]) -> str:
    """``("hosts", 0, "gpus")`` -> ``"hosts[0].gpus"``; the empty path is ``"(top level)"``."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _type_name(v: Any) -> str:
    if v is None:
        return "nothing (null)"
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def _show(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return _type_name(v)
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


class Doc:
    """One source file (or string) being validated; see the module docstring."""

    def __init__(self, source: str, text: str, data: Any, lines: dict | None = None):
        self.source = source
        self.text = text
        self.data = data
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

    # ----------------------------------------------------------------- checks
    def mapping(self, v: Any, path: Sequence[Any], *, required: Iterable[str] = (),
                optional: Iterable[str] = ()) -> dict:
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
