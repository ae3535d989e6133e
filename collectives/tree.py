"""Reduction trees over group-local ranks ``0..P-1``.

A :class:`Tree` is a plan: frozen, hashable, validated when built. Data flows
up the tree in a reduce (children to parent, the root holds the result) and
down in a broadcast. ``children[r]`` is ordered: a reduction combines rank
``r``'s value with its children's partial results in that order, which is what
keeps a non-commutative operator in rank order when every subtree covers a
contiguous range of ranks (see :meth:`Tree.is_order_preserving`).

>>> t = Tree.from_parents([-1, 0, 0, 1])
>>> t.root, t.children, t.height
(0, ((1, 2), (3,), (), ()), 2)
>>> t.depth(3), t.sibling_places()
(2, (0, 0, 1, 0))
>>> t.fingerprint() == Tree.from_parents([-1, 0, 0, 1]).fingerprint()
True
>>> Tree.from_parents([-1, 2, 1])
Traceback (most recent call last):
...
treecoll.topo.errors.TreeError: tree: ranks [1, 2] are not connected to the root 0 (a cycle through rank 1)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from treecoll.topo.errors import TreeError

__all__ = ["Tree", "MultiTree", "as_multi"]


@dataclass(frozen=True)
class Tree:
    """A rooted spanning tree over ranks ``0..P-1``.

    Attributes
    ----------
    parents: ``parents[r]`` is rank r's parent, ``-1`` for the root (exactly one).
    children: ``children[r]``, ordered; derived from ``parents`` (ascending
        rank) when not given, else must agree with ``parents``.
    name: the builder that made it (free text; not part of the fingerprint).
    """

    parents: tuple[int, ...]
    children: tuple[tuple[int, ...], ...] = field(default=None)  # type: ignore[assignment]
    name: str = field(default="", compare=False)

    def __post_init__(self):
        parents = tuple(self.parents)
        n = len(parents)
        if n == 0:
            raise TreeError("tree: expected at least one rank, got an empty parent list")
        for r, p in enumerate(parents):
            if not isinstance(p, int) or isinstance(p, bool):
                raise TreeError(f"tree: parent of rank {r} expected an integer, got {p!r}")
            if p != -1 and not 0 <= p < n:
                raise TreeError(f"tree: parent of rank {r} is {p}, expected -1 (root) or a rank in 0..{n - 1}")
            if p == r:
                raise TreeError(f"tree: rank {r} is its own parent")
        roots = [r for r, p in enumerate(parents) if p == -1]
        if len(roots) != 1:
            raise TreeError(f"tree: expected exactly one root (parent -1), got {len(roots)}: ranks {roots[:8]}")
        derived = [[] for _ in range(n)]
        for r, p in enumerate(parents):
            if p >= 0:
                derived[p].append(r)
        if self.children is None:
            children = tuple(tuple(c) for c in derived)
        else:
            children = tuple(tuple(c) for c in self.children)
            if len(children) != n:
                raise TreeError(f"tree: children expected one list per rank ({n}), got {len(children)}")
            for r in range(n):
                if sorted(children[r]) != derived[r]:
                    raise TreeError(
                        f"tree: children of rank {r} are {list(children[r])}, but the parent list gives {derived[r]}"
                    )
        # every rank reaches the root
        seen = {roots[0]}
        stack = [roots[0]]
        while stack:
            u = stack.pop()
            for c in children[u]:
                seen.add(c)
                stack.append(c)
        if len(seen) != n:
            lost = sorted(set(range(n)) - seen)
            raise TreeError(
                f"tree: ranks {lost[:8]} are not connected to the root {roots[0]} (a cycle through rank {lost[0]})"
            )
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "children", children)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_parents(cls, parents: Sequence[int], *, name: str = "") -> Tree:
        """A tree from a parent list (``-1`` marks the root); children in ascending rank."""
        return cls(tuple(int(p) if not isinstance(p, bool) else p for p in parents), name=name)

    @classmethod
    def from_children(cls, children: Sequence[Iterable[int]], *, name: str = "") -> Tree:
        """A tree from ordered child lists; the root is the rank nobody lists."""
        n = len(children)
        parents = [-1] * n
        for p, cs in enumerate(children):
            for c in cs:
                if not isinstance(c, int) or not 0 <= c < n:
                    raise TreeError(f"tree: child {c!r} of rank {p} expected a rank in 0..{n - 1}")
                if parents[c] != -1:
                    raise TreeError(f"tree: rank {c} has two parents, {parents[c]} and {p}")
                parents[c] = p
        return cls(tuple(parents), tuple(tuple(c) for c in children), name=name)

    # ------------------------------------------------------------------ queries
    @property
    def size(self) -> int:
        """Number of ranks P."""
        return len(self.parents)

    @property
    def root(self) -> int:
        """The root rank (holds the result of a reduce; source of a broadcast)."""
        return self.parents.index(-1)

    def depth(self, rank: int) -> int:
        """Number of edges from ``rank`` up to the root."""
        d = 0
        while self.parents[rank] != -1:
            rank = self.parents[rank]
            d += 1
        return d

    @property
    def height(self) -> int:
        """The largest depth."""
        return max(self.depth(r) for r in range(self.size))

    def edges(self) -> tuple[tuple[int, int], ...]:
        """(child, parent) pairs in rank order."""
        return tuple((r, p) for r, p in enumerate(self.parents) if p >= 0)

    def sibling_places(self) -> tuple[int, ...]:
        """Each rank's place (0, 1, ...) among its parent's children; 0 for the root."""
        place = [0] * self.size
        for kids in self.children:
            for i, c in enumerate(kids):
                place[c] = i
        return tuple(place)

    def postorder(self) -> tuple[int, ...]:
        """Ranks, every child before its parent (children in their order)."""
        out: list[int] = []
        stack = [(self.root, False)]
        while stack:
            u, done = stack.pop()
            if done:
                out.append(u)
                continue
            stack.append((u, True))
            for c in reversed(self.children[u]):
                stack.append((c, False))
        return tuple(out)

    def subtree(self, rank: int) -> tuple[int, ...]:
        """Ranks of the subtree rooted at ``rank`` (itself first, then pre-order)."""
        out, stack = [], [rank]
        while stack:
            u = stack.pop()
            out.append(u)
            stack.extend(reversed(self.children[u]))
        return tuple(out)

    def is_order_preserving(self) -> bool:
        """True when combining ``[own, child_0, child_1, ...]`` left to right at every
        rank yields ``x_0 op x_1 op ... op x_{P-1}``: each rank is the smallest of
        its subtree and its children's subtrees are consecutive ascending ranges."""
        for r in range(self.size):
            nxt = r + 1
            for c in self.children[r]:
                sub = self.subtree(c)
                if c != nxt or sorted(sub) != list(range(nxt, nxt + len(sub))):
                    return False
                nxt += len(sub)
        return True

    def fingerprint(self) -> str:
        """A short hash of the parents and the children's order; equal on every rank
        that built the same tree (the name does not count)."""
        text = ",".join(map(str, self.parents)) + "|" + ";".join(",".join(map(str, c)) for c in self.children)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def relabel(self, order: Sequence[int]) -> Tree:
        """The same shape on other ranks: node ``i`` of this tree becomes rank ``order[i]``."""
        n = self.size
        if sorted(order) != list(range(n)):
            raise TreeError(f"tree: relabel order expected a permutation of 0..{n - 1}, got {list(order)[:8]}")
        parents = [-1] * n
        children: list[tuple[int, ...]] = [()] * n
        for i in range(n):
            p = self.parents[i]
            parents[order[i]] = -1 if p == -1 else order[p]
            children[order[i]] = tuple(order[c] for c in self.children[i])
        return Tree(tuple(parents), tuple(children), name=self.name)

    def as_dict(self) -> dict:
        """Plain data: ``{"name", "root", "parents", "children"}``."""
        return {
            "name": self.name,
            "root": self.root,
            "parents": list(self.parents),
            "children": [list(c) for c in self.children],
        }


@dataclass(frozen=True)
class MultiTree:
    """Several spanning trees over the same ranks, each carrying a share of the message.

    Used by ``double_binary`` (NCCL's two complementary trees, half the bytes
    each) and by the per-rail ``two_level`` (one tree per NIC rail). The trees
    run concurrently; the message's bytes are split by ``shares`` (fractions
    summing to 1).

    >>> m = MultiTree((Tree.from_parents([-1, 0, 1]), Tree.from_parents([1, -1, 1])), (0.5, 0.5))
    >>> m.size, len(m), m.roots
    (3, 2, (0, 1))
    >>> MultiTree((Tree.from_parents([-1, 0]),), (0.7,))
    Traceback (most recent call last):
    ...
    treecoll.topo.errors.TreeError: multitree: shares expected 1 positive fractions summing to 1, got [0.7]
    """

    trees: tuple[Tree, ...]
    shares: tuple[float, ...] = ()
    name: str = field(default="", compare=False)

    def __post_init__(self):
        trees = tuple(self.trees)
        if not trees or not all(isinstance(t, Tree) for t in trees):
            raise TreeError(f"multitree: expected a non-empty sequence of Tree, got {self.trees!r:.80}")
        sizes = {t.size for t in trees}
        if len(sizes) != 1:
            raise TreeError(f"multitree: every tree must span the same ranks, got sizes {sorted(sizes)}")
        shares = tuple(float(s) for s in self.shares) or tuple([1.0 / len(trees)] * len(trees))
        if len(shares) != len(trees) or any(not s > 0 for s in shares) or abs(sum(shares) - 1.0) > 1e-9:
            raise TreeError(
                f"multitree: shares expected {len(trees)} positive fractions summing to 1, got {list(shares)[:8]}"
            )
        object.__setattr__(self, "trees", trees)
        object.__setattr__(self, "shares", shares)

    def __len__(self) -> int:
        return len(self.trees)

    @property
    def size(self) -> int:
        """Number of ranks P."""
        return self.trees[0].size

    @property
    def roots(self) -> tuple[int, ...]:
        """Root of each tree."""
        return tuple(t.root for t in self.trees)

    @property
    def height(self) -> int:
        """Largest height over the trees."""
        return max(t.height for t in self.trees)

    def is_order_preserving(self) -> bool:
        """True when every tree is order preserving (see :meth:`Tree.is_order_preserving`)."""
        return all(t.is_order_preserving() for t in self.trees)

    def fingerprint(self) -> str:
        """A short hash of the trees and their shares (names do not count)."""
        text = "/".join(t.fingerprint() for t in self.trees) + "|" + ",".join(f"{s:.12g}" for s in self.shares)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_dict(self) -> dict:
        """Plain data: ``{"name", "trees": [tree.as_dict()...], "shares"}``."""
        return {"name": self.name, "trees": [t.as_dict() for t in self.trees], "shares": list(self.shares)}


def as_multi(plan: Tree | MultiTree) -> MultiTree:
    """A :class:`MultiTree` view of a tree (one tree, share 1) or a multitree (itself)."""
    if isinstance(plan, MultiTree):
        return plan
    if isinstance(plan, Tree):
        return MultiTree((plan,), (1.0,), name=plan.name)
    raise TreeError(f"plan: expected a Tree or MultiTree, got {type(plan).__name__}")
