"""Link sharing: the rates of transfers that run at the same time over one topology's links.

Units: bytes/s out (rates), GB/s in (the topology's link bandwidths), seconds of latency.

Transfers that run at the same time share each directed link they cross. Every
transfer is a *flow* (i, j) from rank i's GPU to rank j's over the parallel routes
of its path (:attr:`treecoll.topo.Path.routes`, each with its traffic share); a
link's *load* is the sum of the shares of the routes crossing it, and a route gets
``link.bw * share / load`` of each link, its rate being the minimum over its links;
a flow's rate is the sum over its routes. Without contention this is exactly
``Path.bw``.

:class:`Links` numbers the links of one topology's ranks and keeps what every
:class:`~treecoll.collectives.cost.CostModel` of that topology object and those
ranks shares (:func:`links_of`): each pair's route entry, flow rates, and tree
times.

>>> from treecoll.collectives.cost import uniform_topology
>>> t = uniform_topology(4)                        # 4 ports of 12 GB/s on one switch
>>> links = Links(t, t.rank_gpus(), step_overhead=0.0)
>>> links.rates([(0, 1)])                          # alone: the path's bandwidth, bytes/s
{(0, 1): 12000000000.0}
>>> links.rates([(0, 1), (2, 1)])                  # two flows into GPU 1 share its port
{(0, 1): 6000000000.0, (2, 1): 6000000000.0}
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
from treecoll.topo import Topology
from treecoll.topo.routes import rename_node

from .placement import Placement

__all__ = ["Links", "links_of", "SHARED_LINKS", "SHARED_TIMES", "SMALL_RATES", "CLASS_FLOWS"]

#: the link ids, route shares per link and links per route of a ``Links.pairs`` entry
_IDS, _SHARES, _LENS = itemgetter(1), itemgetter(2), itemgetter(3)
#: topologies (with their ranks) whose :class:`Links` are kept; the oldest goes first beyond it
SHARED_LINKS = 4
#: tree times a :class:`Links` keeps
SHARED_TIMES = 4096
#: link incidences up to which :meth:`Links.rates` sums in Python
SMALL_RATES = 64
#: flows from which :meth:`Links.rates_array` prices the flows inside hosts built alike once per class
CLASS_FLOWS = 512


class Links:
    """The routes of one topology's ranks as numbered links, and the rates of flows sharing them:
    what every :class:`~treecoll.collectives.cost.CostModel` of the same topology object and ranks
    reads (:func:`links_of`), found on first use and kept.

    ``pairs``: (i, j) -> (latency s plus ``step_overhead``, link ids of every route in turn, the
    route's share for each of them, links per route, path bandwidth GB/s). ``rate_memo``: a
    model's tree edge rates (:meth:`~treecoll.collectives.tree_timing.TreeTiming.tree_rates`), ring
    and rsag flow rates. ``times``: tree times, stepped through or in closed form
    (:meth:`~treecoll.collectives.cost.CostModel.tree_times`), by (how, plan, bytes, collective,
    per-message cost, chunks), at most :data:`SHARED_TIMES`. ``net``: the simulator's view of the
    links (:meth:`~treecoll.collectives.cost.CostModel._network`).
    """

    def __init__(self, topology: Topology, gpus: Sequence[str], step_overhead: float) -> None:
        self.topology, self.gpus, self.step_overhead = topology, tuple(gpus), float(step_overhead)
        self.pairs: dict[tuple[int, int], tuple] = {}
        self.rate_memo: dict = {}
        self.times: dict[tuple, float] = {}
        self.net: Any = None
        self.ends: list[tuple[str, str]] = []  # link id -> (node, node)
        self._ids: dict[tuple[str, str], int] = {}
        self._bw = np.zeros(64)  # link id -> GB/s, grown by doubling
        self._hosts: list[str | None] | None = None  # the host of each rank's GPU (:meth:`_host_facts`)
        self._reps: list[str | None] = []  # the host standing for each rank's host's class
        self._rep_names: list[str] = []  # each rank's GPU as the same GPU of that host
        self._inside: dict[tuple[str, str], bool] = {}  # a class's GPUs -> their routes stay in the host
        self._homes: dict[int, tuple | None] = {}  # link id -> (host, its ends in the class's host)
        self._crossings: dict[tuple[int, int], tuple] = {}  # a pair's links inside hosts, as _homes gives them
        self._by_name: dict[tuple[str, str], tuple] = {}  # a host class's GPUs -> their entry
        self._moves: dict[str, dict[int, int]] = {}  # host -> its class's link ids -> its own

    def link_id(self, u: str, v: str) -> int:
        """The number of the directed link u -> v (numbered on first use)."""
        i = self._ids.get((u, v))
        if i is None:
            i = self._ids[(u, v)] = len(self.ends)
            self.ends.append((u, v))
            if i == len(self._bw):
                self._bw = np.concatenate([self._bw, np.zeros_like(self._bw)])
            self._bw[i] = self.topology.graph._succ[u][v]["bw"]
        return i

    def _host_facts(self) -> None:
        """Each rank's host, its host's class (:meth:`~treecoll.topo.routes.RouteTable.host_class`:
        the host itself when none) and its GPU's name in the host standing for that class."""
        node, routes = self.topology.graph._node, self.topology.routes
        self._hosts = [node[x].get("host") for x in self.gpus]
        reps: dict[str, str | None] = {}
        self._reps, self._rep_names = [], []
        for x, h in zip(self.gpus, self._hosts):
            rep = None if h is None else reps.get(h)
            if h is not None and rep is None:
                rep = reps[h] = routes.host_class(h)
            self._reps.append(rep)
            self._rep_names.append(x if rep is None or rep == h else rename_node(x, h, rep))

    def _in_class(self, i: int, j: int) -> bool:
        """Whether ranks i and j sit in one host that another host stands for (built alike)."""
        if self._hosts is None:
            self._host_facts()
        h = self._hosts[i]
        return h is not None and h == self._hosts[j] and self._reps[i] != h

    def _class_entry(self, i: int, j: int) -> tuple:
        """The ``pairs`` entry of the GPUs of ranks i and j (one host, :meth:`_in_class`) in the host
        standing for their host's class."""
        key = (self._rep_names[i], self._rep_names[j])
        base = self._by_name.get(key)
        if base is None:
            base = self._by_name[key] = self._entry(*key)
        return base

    def pair(self, i: int, j: int) -> tuple:
        """The ``pairs`` entry of ranks i -> j, made and kept. Inside a host built like an earlier one
        (:meth:`~treecoll.topo.routes.RouteTable.host_class`), that host's entry on its links renamed,
        as the route table renames its routes."""
        if self._in_class(i, j):
            base = self._class_entry(i, j)
            entry = (base[0], self._moved(base[1], self._reps[i], self._hosts[i]), *base[2:])
        else:
            entry = self._entry(self.gpus[i], self.gpus[j])
        self.pairs[(i, j)] = entry
        return entry

    def latency(self, i: int, j: int) -> float:
        """The ``pairs`` entry's latency of ranks i -> j (inside a host built alike: its class's, without
        numbering the host's own links)."""
        entry = self.pairs.get((i, j))
        if entry is None:
            entry = self._class_entry(i, j) if self._in_class(i, j) else self.pair(i, j)
        return entry[0]

    def _moved(self, ids: tuple[int, ...], rep: str, host: str) -> tuple[int, ...]:
        """Links ``ids`` of host ``rep`` as the same links of ``host`` (built alike)."""
        moved = self._moves.get(host)
        if moved is None:
            moved = self._moves[host] = {}
        out = []
        for x in ids:
            y = moved.get(x)
            if y is None:
                u, v = self.ends[x]
                y = moved[x] = self.link_id(rename_node(u, rep, host), rename_node(v, rep, host))
            out.append(y)
        return tuple(out)

    def _entry(self, a: str, b: str) -> tuple:
        """A ``pairs`` entry from the path between GPUs a and b."""
        p = self.topology.path(a, b)
        ids: list[int] = []
        shares: list[float] = []
        lens: list[int] = []
        known, link_id = self._ids.get, self.link_id
        for nodes, share in p.routes:
            route = [known(e) for e in zip(nodes, nodes[1:])]
            if None in route:
                route = [link_id(u, v) if i is None else i for (u, v), i in zip(zip(nodes, nodes[1:]), route)]
            ids.extend(route)
            shares.extend([share] * (len(nodes) - 1))
            lens.append(len(nodes) - 1)
        return (p.lat * 1e-6 + self.step_overhead, tuple(ids), tuple(shares), tuple(lens), p.bw)

    def remember(self, key: tuple, seconds: float) -> float:
        """Keep a tree time under ``key`` in ``times`` (emptied when it holds :data:`SHARED_TIMES`)."""
        if len(self.times) >= SHARED_TIMES:
            self.times.clear()
        self.times[key] = seconds
        return seconds

    def kept_rates(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()`` kept under ``key`` in ``rate_memo`` (emptied past 256 entries)."""
        memo = self.rate_memo
        hit = memo.get(key)
        if hit is None:
            if len(memo) > 256:
                memo.clear()
            hit = memo[key] = make()
        return hit

    def rates(self, flows: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
        """Bytes/s of each of the concurrent ``flows`` (:meth:`~treecoll.collectives.cost.CostModel.rates`):
        a link's load is the sum of the shares of the routes crossing it, a route gets
        ``bw * share / load`` of each of its links, the least of them, and a flow the sum over its
        routes. The sums run in the
        order of the flows and of their routes, so every rate is the same number whatever the
        vector length."""
        if not flows:
            return {}
        got = self.rates_array(flows)
        return got if isinstance(got, dict) else dict(zip(flows, got.tolist()))

    def rates_array(self, flows: list[tuple[int, int]]) -> np.ndarray | dict[tuple[int, int], float]:
        """:meth:`rates` of ``flows`` (not empty) as an array in their order, or, for flows crossing at
        most :data:`SMALL_RATES` links, as :meth:`rates` returns them (summed in Python). From
        :data:`CLASS_FLOWS` flows, the flows inside hosts built alike are priced once per class
        (:meth:`_rates_by_class`)."""
        if len(flows) >= CLASS_FLOWS:
            got = self._rates_by_class(flows)
            if got is not None:
                return got
        return self._rates_plain(flows)

    def _rates_by_class(self, flows: list[tuple[int, int]]) -> np.ndarray | None:
        """:meth:`rates_array` of ``flows`` with the flows inside a host priced once for every host of
        its class with the same flows in the same order (their GPUs named as in the class's host),
        where nothing else crosses the links of those flows: a link's load then sums the same shares
        in the same order in every such host, so each flow gets the number the whole list would give
        it. The other flows are priced together, in their order. None: no host to share."""
        if self._hosts is None:
            self._host_facts()
        hosts, reps, names = self._hosts, self._reps, self._rep_names
        own: dict[str, list[int]] = defaultdict(list)  # host -> positions of the flows inside it
        rest: list[int] = []
        for at, (i, j) in enumerate(flows):
            h = hosts[i]
            (own[h] if h is not None and h == hosts[j] else rest).append(at)
        alike: dict[tuple, list[str]] = defaultdict(list)
        for h, where in own.items():
            alike[(reps[flows[where[0]][0]], tuple((names[flows[a][0]], names[flows[a][1]]) for a in where))].append(h)
        shared = [(key, hs) for key, hs in alike.items() if len(hs) > 1 and all(map(self._stays_in, key[1]))]
        if not shared:
            return None
        for hs in (hs for key, hs in alike.items() if len(hs) == 1 or (key, hs) not in shared):
            rest.extend(a for h in hs for a in own[h])
        # links inside shared hosts that the other flows cross, named in their class's host
        crossed: dict[str, set] = defaultdict(set)
        for f in {flows[a] for a in rest}:
            homes = self._crossings.get(f)
            if homes is None:
                ids = (self.pairs.get(f) or self.pair(*f))[1]
                homes = self._crossings[f] = tuple(h for h in map(self._home, ids) if h is not None)
            for host, link in homes:
                crossed[host].add(link)
        out = np.empty(len(flows))
        for (_, pairs), hs in shared:
            used = {self.ends[lk] for ra_rb in pairs for lk in self._by_name_entry(ra_rb)[1]}
            apart = [h for h in hs if not crossed.get(h) or not crossed[h] & used]
            rest.extend(a for h in hs if h not in apart for a in own[h])
            if apart:
                first = [flows[a] for a in own[apart[0]]]
                got = self._rates_plain(first)
                values = np.array([got[f] for f in first]) if isinstance(got, dict) else got
                for h in apart:
                    out[own[h]] = values
        if rest:
            rest.sort()
            some = [flows[a] for a in rest]
            got = self._rates_plain(some)
            out[rest] = np.array([got[f] for f in some]) if isinstance(got, dict) else got
        return out

    def _by_name_entry(self, names: tuple[str, str]) -> tuple:
        """The ``pairs`` entry of two GPUs of a class's host, by name (made and kept)."""
        base = self._by_name.get(names)
        if base is None:
            base = self._by_name[names] = self._entry(*names)
        return base

    def _stays_in(self, names: tuple[str, str]) -> bool:
        """Whether every route between two GPUs of a class's host stays inside that host."""
        hit = self._inside.get(names)
        if hit is None:
            node = self.topology.graph._node
            host = node[names[0]].get("host")
            ends = (self.ends[lk] for lk in self._by_name_entry(names)[1])
            hit = self._inside[names] = all(node[u].get("host") == host == node[v].get("host") for u, v in ends)
        return hit

    def _home(self, lk: int) -> tuple | None:
        """(host, the link's ends named in the host standing for its class) of a link inside a host;
        None for a link between hosts or switches."""
        if lk in self._homes:
            return self._homes[lk]
        u, v = self.ends[lk]
        node = self.topology.graph._node
        h = node[u].get("host")
        home = None
        if h is not None and node[v].get("host") == h:
            rep = self.topology.routes.host_class(h)
            home = (h, (u, v) if rep == h else (rename_node(u, h, rep), rename_node(v, h, rep)))
        self._homes[lk] = home
        return home

    def _rates_plain(self, flows: list[tuple[int, int]]) -> np.ndarray | dict[tuple[int, int], float]:
        """:meth:`rates_array` of ``flows`` all together."""
        entries = list(map(self.pairs.get, flows))
        if None in entries:
            entries = [e or self.pairs.get(f) or self.pair(*f) for f, e in zip(flows, entries)]
        # the flows' link ids, shares and links per route, one after another (concatenated in C)
        ids: list[int] = list(chain.from_iterable(map(_IDS, entries)))
        shares: list[float] = list(chain.from_iterable(map(_SHARES, entries)))
        per_route = list(map(_LENS, entries))
        lens: list[int] = list(chain.from_iterable(per_route))
        nroutes: list[int] = list(map(len, per_route))
        if len(ids) <= SMALL_RATES:
            return self._rates_small(flows, ids, shares, lens)
        link = np.array(ids, dtype=np.intp)
        share = np.array(shares)
        load = np.bincount(link, weights=share)
        per_link = self._bw[link] * share / load[link]
        starts = np.zeros(len(lens), dtype=np.intp)
        np.cumsum(lens[:-1], out=starts[1:])
        per_route = np.minimum.reduceat(per_link, starts)
        most = max(nroutes)
        if most == 1:
            per_flow = per_route
        else:  # each flow's routes summed in their order (0 + a + b ..., as Python's sum)
            counts = np.array(nroutes)
            first = np.zeros(len(flows), dtype=np.intp)
            np.cumsum(counts[:-1], out=first[1:])
            table = np.zeros((len(flows), most))
            table[np.repeat(np.arange(len(flows)), counts), np.arange(len(per_route)) - np.repeat(first, counts)] = (
                per_route
            )
            per_flow = table[:, 0].copy()
            for c in range(1, most):
                per_flow += table[:, c]
        return per_flow * 1e9

    def _rates_small(
        self, flows: list[tuple[int, int]], ids: list[int], shares: list[float], lens: list[int]
    ) -> dict[tuple[int, int], float]:
        """:meth:`rates` in Python (numpy's per-call cost dominates below :data:`SMALL_RATES` links):
        the same operations in the same order, so the same numbers. ``ids``, ``shares``, ``lens``:
        the flows' link ids, shares and links per route, as :meth:`rates` lists them."""
        load: dict[int, float] = defaultdict(float)
        for lk, share in zip(ids, shares):
            load[lk] += share
        bw = self._bw
        out = {}
        i = r = 0
        for f in flows:
            total = 0
            for _ in range(len(self.pairs[f][3])):
                n = lens[r]
                total += min(float(bw[lk]) * sh / load[lk] for lk, sh in zip(ids[i : i + n], shares[i : i + n]))
                i += n
                r += 1
            out[f] = total * 1e9
        return out


#: (topology object, ranks, step overhead) -> their :class:`Links`, the few most recent
_LINKS: dict[tuple, Links] = {}
_LINKS_LOCK = threading.Lock()


def links_of(placement: Placement, topology: Topology, gpus: Sequence[str], step_overhead: float) -> Links:
    """The :class:`Links` every cost model of ``placement``'s topology object (without one: the
    uniform topology of its rank count) and ranks shares: made on first use, kept for the
    :data:`SHARED_LINKS` most recent."""
    key = (id(placement.topology) if placement.topology is not None else None, tuple(gpus), float(step_overhead))
    with _LINKS_LOCK:
        links = _LINKS.get(key)
        if links is None or (placement.topology is not None and links.topology is not placement.topology):
            while len(_LINKS) >= SHARED_LINKS:
                del _LINKS[next(iter(_LINKS))]
            links = _LINKS[key] = Links(topology, gpus, step_overhead)
    return links
