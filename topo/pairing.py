"""Rounds of disjoint pairs: the schedule a link probe measures in (plain data, no I/O).

Measuring every pair of ``n`` endpoints one pair at a time takes ``n (n - 1) / 2``
steps; measuring a *matching* (pairs that share no endpoint) at once takes one.
:func:`round_robin` is the circle method of a round-robin tournament (Berge,
"Graphs and Hypergraphs", 1973; also the schedule of chess and football
leagues): ``n - 1`` rounds for even ``n`` (``n`` for odd ``n``, one endpoint
sitting out each round), every pair exactly once, the pairs of a round disjoint.
:func:`sample_rounds` keeps a seeded subset of the rounds when ``n`` is large:
every round still pairs every endpoint (but one, for odd ``n``), so each
endpoint is measured in every kept round.

>>> round_robin(4)
[[(0, 3), (1, 2)], [(0, 2), (3, 1)], [(0, 1), (2, 3)]]
>>> len(round_robin(5)), sorted(p for r in round_robin(5) for p in map(sorted, r))[:3]
(5, [[0, 1], [0, 2], [0, 3]])
>>> sample_rounds(round_robin(8), 3, seed=1) == sample_rounds(round_robin(8), 3, seed=1)
True
>>> len(sample_rounds(round_robin(8), 3)), len(sample_rounds(round_robin(8), 99))
(3, 7)
>>> shifts(6), shifts(2), shifts(1)
([1, 3], [1], [])
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .errors import TreecollError

__all__ = ["round_robin", "sample_rounds", "shifts", "Round"]

#: one round: pairs ``(a, b)`` of endpoint indices, no index twice
Round = list[tuple[int, int]]


def round_robin(n: int) -> list[Round]:
    """The rounds of a round-robin tournament over endpoints ``0..n-1`` (circle method).

    Endpoint 0 stays put, the others rotate one place per round; for odd ``n`` a
    phantom endpoint is added and whoever meets it sits the round out. Returns
    ``n - 1`` rounds (``n`` for odd ``n``; none for ``n < 2``), each a list of
    pairs ``(a, b)``, ``a != b``; every unordered pair appears in exactly one round.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise TreecollError(f"round_robin: expected a non-negative integer count, got {n!r}")
    if n < 2:
        return []
    m = n + (n % 2)  # with a phantom endpoint m - 1 when n is odd
    ring = list(range(1, m))
    rounds: list[Round] = []
    for _ in range(m - 1):
        seats = [0, *ring]
        pairs = [(seats[i], seats[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(a, b) for a, b in pairs if a < n and b < n])
        ring = ring[-1:] + ring[:-1]
    return rounds


def sample_rounds(rounds: Sequence[Round], budget: int, *, seed: int = 0) -> list[Round]:
    """At most ``budget`` of ``rounds``, chosen with a seeded generator (the same on every rank),
    in their original order; all of them when they fit."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise TreecollError(f"sample_rounds: budget expected a positive number of rounds, got {budget!r}")
    if len(rounds) <= budget:
        return [list(r) for r in rounds]
    keep = sorted(random.Random(seed).sample(range(len(rounds)), budget))
    return [list(rounds[i]) for i in keep]


def shifts(n: int) -> list[int]:
    """The offsets of a loaded exchange among ``n`` endpoints: endpoint ``i`` sends to
    ``(i + k) % n`` for each ``k`` at once. ``1`` (neighbours) and ``n // 2`` (across
    the middle of the ring, where a tapered fabric is thinnest), without repeats."""
    return sorted({k for k in (1, n // 2) if 0 < k < n})
