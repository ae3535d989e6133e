"""The flow-level engine behind :mod:`treecoll.collectives.sim`: links, routes, max-min sharing, events.

Model
-----
* Every directed link of the :class:`~topo.Topology` is a resource of
  capacity ``bw × 1e9 × efficiency[kind]`` bytes/s (``efficiency`` from the
  :class:`~collectives.sim_profiles.Profile`, 1.0 in the ideal profile), times
  what NCCL's transports deliver over it except in the ideal profile
  (:func:`~treecoll.collectives.sim.transports.link_factor`: a NIC's fabric,
  host memory across a CPU's root complex).
* A transfer of ``n`` bytes between two GPUs follows ``Topology.path(a, b).routes``:
  one *subflow* per parallel route carrying ``share × n`` bytes (an H100
  reaches its 4 NVSwitches with 5/5/4/4 links: 4 subflows).
* Concurrent subflows share each link max-min fairly (progressive filling,
  :func:`maxmin_rates`); rates are recomputed whenever a subflow starts or
  ends (events at the same instant are handled together, one recomputation),
  for the subflows connected through shared links to the links where that
  happened: max-min allocation splits over such components, so the others
  keep their rates, and an event costs the size of its component, not the
  number of subflows in flight.
* A transfer started at ``t0`` drains at ``t1`` (all its subflows done); its
  data has fully arrived at ``t1 + lat``, where ``lat`` is the summed link
  latency of the route, floored by the profile's per-step latency of the
  route class (``nvlink``, ``pci``, ``net``), plus the ``lat`` of the route's
  sending NIC (the transport's own latency; times the profile's
  ``nic_lat_mult``). One transfer alone over one link therefore takes
  ``lat + n / bw``.
* NCCL's LL protocol across hosts (``staged_bytes``, :class:`Network`): the
  sender's GPU writes each step into its host memory and the NIC sends it from
  there (:meth:`Network.staged_seconds`): a route
  through a NIC runs from that CPU's memory to the NIC and on, and its latency
  adds the time the GPU takes to write one step of ``staged_bytes`` there (the
  GPU to CPU route alone).
* With ``ordered_pairs`` (gloo over TCP: one socket per pair of ranks), the
  messages from one rank to another travel in order over one connection: a
  send to a peer whose previous message is still draining waits for it, so
  the chunks of a pipelined tree arrive one after another, the first early,
  instead of all together at the end of a fair share. Without it (NCCL: a
  message's chunks spread over several channels per pair) concurrent
  messages share the links max-min fairly like any other flows.
* With ``rendezvous``, a message's data moves only once the receiver has
  posted the matching recv (gloo's pairs and NCCL's p2p wait for the
  receiver's buffer; a receiver that posts its recvs late throttles its
  senders). With ``ordered_pairs`` too, such a message holds up the ones
  behind it on the connection. Without it, data flows as soon as it is sent
  and waits at the receiver.
* Schedules run with the semantics of :mod:`treecoll.collectives.schedule`: steps of a
  rank start in list order once their ``deps`` are complete (with ``lanes``:
  in list order within each of the rank's lanes, the lanes independent of
  each other, as NCCL's split tree kernels run a tree's up and down phases;
  ``ordered_pairs`` then keeps one connection per lane, as NCCL channels); a send starts a
  transfer (with ``ordered_pairs``: after the pair's earlier messages) and
  completes when it drains (the send buffer is free); a recv
  completes when it is posted and its matching send's data has arrived; a
  reduce occupies the rank's GPU for ``3 × chunk_bytes / mem_bw`` seconds
  (read two operands, write one; reduces of one rank run one at a time).
* Scratch memory: a recv into slot ``s >= 1`` holds ``chunk_bytes`` from the
  moment the recv is posted until the reduce that consumes that (chunk, slot)
  completes; the peak of the sum per rank is reported.

Memory is linear in links used plus subflows plus steps (no P×P tables).
Everything is deterministic: ties are broken by insertion order.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import cast

import numpy as np
from treecoll.topo import Topology
from treecoll.topo.errors import CollectiveError

from ..schedule import Schedule, Step
from .profiles import Profile
from .transports import NIC_CHANNELS, gpu_direct, host_buffer, link_factor

__all__ = [
    "Network",
    "Route",
    "maxmin_rates",
    "FlowEngine",
    "concurrent_times",
    "drain_times",
    "RawRun",
    "route_class",
]

_REL_EPS = 1e-9
_heappush = heapq.heappush


def route_class(nccl: str) -> str:
    """Latency class of a path from its NCCL class: ``net``, ``nvlink`` or ``pci``."""
    if nccl == "NET":
        return "net"
    if nccl in ("NVL", "NVB", "LOC"):
        return "nvlink"
    return "pci"


@dataclass(frozen=True)
class Route:
    """A resolved GPU-to-GPU route: ``sub_lists`` (each subroute's link ids) with ``sub_shares``
    (their shares of the bytes), ``lat`` in s; ``subroutes`` = ((link ids array, share), ...).

    For the event engine, the subroutes with a share > 0, one subflow each: ``link_lists`` (their
    link ids), ``share_list`` (their shares) and ``min_caps`` (each one's least link capacity,
    bytes/s, when the route was numbered by a :class:`Network`)."""

    lat: float
    cls: str
    nccl: str
    sub_lists: tuple[tuple[int, ...], ...]
    sub_shares: tuple[float, ...]
    link_lists: tuple[tuple[int, ...], ...] = ()
    share_list: tuple[float, ...] = ()
    min_caps: tuple[float, ...] = ()

    @classmethod
    def of(
        cls_: type[Route],
        subroutes: Sequence[tuple[Sequence[int], float]],
        lat: float,
        cls: str,
        nccl: str,
        cap: Sequence[float] | None = None,
    ) -> Route:
        """The route of ``subroutes`` = ``[(link ids, share), ...]`` with its engine fields; ``cap``: the
        capacity of each link id."""
        lists = tuple([tuple(ids) for ids, _ in subroutes])
        shares = tuple([float(share) for _, share in subroutes])
        used = tuple([ls for ls, share in zip(lists, shares) if share > 0])
        mins = () if cap is None else tuple([min([cap[lk] for lk in ls]) for ls in used])
        return cls_(lat, cls, nccl, lists, shares, used, tuple([sh for sh in shares if sh > 0]), mins)

    @cached_property
    def subroutes(self) -> tuple[tuple[np.ndarray, float], ...]:
        """``((link ids array, share), ...)`` of every subroute."""
        return tuple((np.array(ls, dtype=np.int64), sh) for ls, sh in zip(self.sub_lists, self.sub_shares))


class Network:
    """The links a simulation touches, as integer ids with capacities (bytes/s).

    Links are numbered lazily, the first time a route uses them, so memory is
    linear in the links actually used.
    """

    def __init__(self, topology: Topology, profile: Profile, staged_bytes: float = 0.0):
        """``staged_bytes``: bytes of one network step a GPU writes into (reads from) its host memory where
        NCCL's net transport keeps the step's buffer there (:meth:`host_staged`, :meth:`staged_seconds`;
        0: none)."""
        self.topology = topology
        self.profile = profile
        self.staged_bytes = staged_bytes
        self._ll_send = profile.name == "nccl-ll"  # LL's send buffer: host memory even with GPUDirect RDMA
        self._host_memory: dict[str, str | None] = {}  # GPU -> the CPU holding its host buffers (host_buffer)
        self._gdr: dict[tuple[str, str], bool] = {}  # (GPU, NIC) -> GPUDirect RDMA (transports.gpu_direct)
        self._ids: dict[tuple[str, str], int] = {}
        self.ends: list[tuple[str, str]] = []
        self.kinds: list[str] = []
        self._cap = np.zeros(256)  # grown by doubling; the first len(ends) entries are used
        self.cap_list: list[float] = []  # the same capacities as Python floats (read one by one)
        self._eff: dict[str, float] = {}  # link kind -> the profile's efficiency
        self._transports = profile.name != "ideal"  # the ideal profile: the links as written
        # NICs carry NIC_CHANNELS connections each, NVLSTree's kernels more (transports.NET_CHANNEL_BW)
        self._nic_channels = None if profile.name == "nccl-nvls" else NIC_CHANNELS
        self._routes: dict[tuple[str, str], Route] = {}
        self._host_rep: dict[str, str] = {}  # host -> its class's representative (RouteTable.host_class)
        # (class representative, local GPU names) -> the route inside any host of the class, host names left out
        self._in_host: dict[tuple[str, str, str], tuple] = {}
        self._class_edges: dict[str, dict[tuple[str, str], int]] = {}  # class -> local edge -> index
        self._class_edge_list: dict[str, list[tuple[str, str]]] = {}  # class -> local edges by index
        self._host_links: dict[str, dict[int, int]] = {}  # host -> local edge index -> link id

    def link_id(self, a: str, b: str) -> int:
        i = self._ids.get((a, b))
        if i is None:
            d = self.topology.link(a, b)
            kind = d["kind"]
            eff = self._eff.get(kind)
            if eff is None:
                eff = self._eff[kind] = self.profile.efficiency(kind)
            i = len(self.ends)
            self._ids[(a, b)] = i
            self.ends.append((a, b))
            self.kinds.append(kind)
            if i == len(self._cap):
                self._cap = np.concatenate([self._cap, np.zeros_like(self._cap)])
            if self._transports:  # what NCCL's transports deliver over the link (NIC fabric, host memory)
                eff *= link_factor(self.topology, a, b, self._nic_channels)
            c = float(d["bw"]) * 1e9 * eff
            self._cap[i] = c
            self.cap_list.append(c)
        return i

    def renumber(self, order: np.ndarray) -> None:
        """Number the links anew: link ``order[k]`` becomes link ``k`` (``order``: a permutation of the
        ids). The routes kept so far are forgotten (they named the old ids)."""
        L = len(self.ends)
        ol = np.asarray(order, dtype=np.int64).tolist()
        new = [0] * L
        for k, i in enumerate(ol):
            new[i] = k
        self.ends = [self.ends[i] for i in ol]
        self.kinds = [self.kinds[i] for i in ol]
        self.cap_list = [self.cap_list[i] for i in ol]
        self._cap[:L] = np.asarray(self.cap_list)
        self._ids = {e: i for i, e in enumerate(self.ends)}
        self._host_links = {h: {e: new[i] for e, i in d.items()} for h, d in self._host_links.items()}
        self._routes = {}

    @property
    def cap(self) -> np.ndarray:
        """Capacity of each numbered link, bytes/s (a view: index it, do not keep it across new links)."""
        return self._cap[: len(self.ends)]

    def link_load(self, transfers: Iterable[tuple[str, str, float]]) -> np.ndarray:
        """Bytes each numbered link carries for ``transfers`` = ``[(src_gpu, dst_gpu, nbytes)]``."""
        ids, w = [], []
        for a, b, n in transfers:
            for lk, share in self.route(a, b).subroutes:
                ids.append(lk)
                w.append(np.full(len(lk), n * share))
        out = np.zeros(len(self.ends))
        if ids:
            np.add.at(out, np.concatenate(ids), np.concatenate(w))
        return out

    def _nic_lat(self, nodes) -> float:
        """Seconds the sending NIC's transport adds to a route (its ``lat`` × the profile's ``nic_lat_mult``)."""
        g = self.topology.graph.nodes
        for n in nodes:
            if g[n].get("kind") == "nic":
                return float(g[n].get("lat", 0.0)) * 1e-6 * self.profile.nic_lat_mult
        return 0.0

    def route(self, a: str, b: str) -> Route:
        """The route between GPUs ``a`` and ``b`` (cached). Inside a host built like an earlier one
        (:meth:`~treecoll.topo.routes.RouteTable.host_class`), the route of the same GPUs of that
        host with its links renamed, as :meth:`Topology.path` answers it."""
        r = self._routes.get((a, b))
        if r is None:
            r = self._routes[(a, b)] = self._route_in_host(a, b) or self._new_route(a, b)
        return r

    def _route_in_host(self, a: str, b: str) -> Route | None:
        """The route of ``a`` to ``b`` inside one host from the route of the same GPUs in a host of its
        class (:meth:`~treecoll.topo.routes.RouteTable.host_class`: hosts built alike have the same
        routes inside them, renamed), links numbered in route order (None: not inside one host)."""
        found = self.host_template(a, b)
        if found is None:
            return None
        tpl, ha, rep = found
        subs, shares, used, used_shares, lat, cls, nccl = tpl
        get = self.host_links(ha).get
        lists = []
        for idx in subs:  # (Route.of's fields, made from the class's template)
            ids = tuple(map(get, idx))
            if None in ids:
                ids = tuple([self._host_link(ha, rep, e) if i is None else i for e, i in zip(idx, ids)])
            lists.append(ids)
        link_lists = tuple([lists[j] for j in used])
        cap = self.cap_list.__getitem__
        mins = tuple([min(map(cap, ls)) for ls in link_lists])
        return Route(lat, cls, nccl, tuple(lists), shares, link_lists, used_shares, mins)

    def host_links(self, host: str) -> dict[int, int]:
        """Link ids of ``host`` numbered so far, by local edge index of its class (:meth:`host_template`)."""
        return self._host_links.setdefault(host, {})

    def host_link_array(self, host: str, rep: str, edges: Sequence[int]) -> np.ndarray:
        """The link ids of ``host`` (of ``rep``'s class) by local edge index (-1: not numbered), the local
        ``edges`` numbered now where they are not yet."""
        own = self.host_links(host)
        arr = np.full(len(self._class_edge_list[rep]), -1, dtype=np.int64)
        for e in edges:
            i = own.get(e)
            arr[e] = self._host_link(host, rep, e) if i is None else i
        return arr

    def host_template(self, a: str, b: str) -> tuple[tuple, str, str] | None:
        """``(template, host, class representative)`` of the route of ``a`` to ``b`` inside one host (None:
        not inside one host). The template, shared by the hosts of the class: ``(subroutes as local edge
        indices, shares, indices of the subroutes with a share > 0, their shares, lat s, route class, NCCL
        class)``; a local edge's link in a host: :meth:`host_links`, numbered by :meth:`_host_link`."""
        node = self.topology.graph._node  # the node attribute dicts (NodeView's lookups cost more)
        ha = node[a].get("host")
        if ha is None or node[b].get("host") != ha:
            return None
        rep = self._host_rep.get(ha)
        if rep is None:
            rep = self._host_rep[ha] = self.topology.routes.host_class(ha)
        k = len(ha)
        key = (rep, a[k:], b[k:])
        tpl = self._in_host.get(key)
        if tpl is None:
            p = self.topology.path(a, b)
            if not all(n.startswith(ha + "/") for nodes, _ in p.routes for n in nodes):
                return None  # a route out of the host and back: not named by its host
            edges = self._class_edges.setdefault(rep, {})  # local edge -> its index in the class
            subs = tuple(
                [
                    tuple([edges.setdefault((x[k:], y[k:]), len(edges)) for x, y in zip(nodes, nodes[1:])])
                    for nodes, _ in p.routes
                ]
            )
            self._class_edge_list[rep] = list(edges)
            shares = tuple([float(share) for _, share in p.routes])
            used = tuple([j for j, share in enumerate(shares) if share > 0])
            tpl = (subs, shares, used, tuple([shares[j] for j in used]), self._lat(p), route_class(p.nccl), p.nccl)
            self._in_host[key] = tpl
        return tpl, ha, rep

    def _host_link(self, host: str, rep: str, e: int) -> int:
        """The id of local edge ``e`` of ``rep``'s class (:meth:`_route_in_host`) in ``host``, numbered now if new."""
        x, y = self._class_edge_list[rep][e]
        i = self._host_links[host][e] = self.link_id(host + x, host + y)
        return i

    def _lat(self, p) -> float:
        """Seconds of route latency of path ``p`` (module docstring)."""
        lat = max(p.lat * 1e-6, self.profile.step_lat(route_class(p.nccl))) + self._nic_lat(p.nodes)
        if self.staged_bytes > 0 and route_class(p.nccl) == "net":
            send, recv = self.host_staged(p.nodes)
            if send:
                lat += self.staged_seconds(p.nodes[0], self.staged_bytes)
            if recv:
                lat += self.staged_seconds(p.nodes[-1], self.staged_bytes, read=True)
        return lat

    def _new_route(self, a: str, b: str) -> Route:
        """The route of ``a`` to ``b`` from :meth:`Topology.path`, its links numbered."""
        p = self.topology.path(a, b)
        routes = p.routes
        if self.staged_bytes > 0 and route_class(p.nccl) == "net":
            routes = self._via_host_memory(a, b, routes, *self.host_staged(p.nodes))
        subs = [(list(zip(nodes, nodes[1:])), share) for nodes, share in routes]
        return self._numbered(subs, self._lat(p), route_class(p.nccl), p.nccl)

    def host_staged(self, nodes: Sequence[str]) -> tuple[bool, bool]:
        """``(send, receive)``: whether the sending and the receiving GPU of a route across hosts (its
        ``nodes``, GPU to GPU) hold the network step's buffer in host memory. NCCL's net transport
        decides per side (src/transport/net.cc ``sendSetup`` and ``recvSetup`` call
        src/graph/paths.cc ``ncclTopoCheckGdr``, :func:`~treecoll.collectives.sim.transports.gpu_direct`):
        without GPUDirect RDMA between a GPU and its NIC every protocol's buffer of that side is in host
        memory (``sendProxyConnect``, ``recvProxyConnect``); with it only LL's send buffer is
        (``sendProxyConnect``: ``p != NCCL_PROTO_LL && resources->useGdr``)."""
        node = self.topology.graph.nodes
        nics = [n for n in nodes if node[n].get("kind") == "nic"]
        if not nics:
            return False, False
        return (self._ll_send or not self._gpu_direct(nodes[0], nics[0]), not self._gpu_direct(nodes[-1], nics[-1]))

    def _gpu_direct(self, gpu: str, nic: str) -> bool:
        key = (gpu, nic)
        v = self._gdr.get(key)
        if v is None:
            v = self._gdr[key] = gpu_direct(self.topology, gpu, nic)
        return v

    def staged_seconds(self, gpu: str, nbytes: float, *, read: bool = False) -> float:
        """Seconds ``gpu`` takes to write one step of ``nbytes`` into its host memory (:meth:`host_memory`),
        or with ``read`` to read one from there, over the route between them (its latency, plus the bytes
        at its slowest link as the route's protocol and transports deliver it; 0 where there is no such
        route): what NCCL adds to
        every step it sends over the network from a buffer in host memory (:meth:`host_staged`), and to
        every step it receives into one. Its proxy hands a step to the NIC only once the GPU has written
        it (with LL once every 16-byte line of the step carries the step's flag), and a receiving GPU
        reads a step once the NIC has written it (src/transport/net.cc ``sendProxyProgress``,
        ``recvProxyProgress``), so the copy and the network of one step run one after the other, not
        overlapped. With GPUDirect RDMA the NIC reads and writes device memory as the GPU works. NCCL's
        tuner has no such term (src/graph/tuning.cc: its LL bandwidth over the network is the ring's
        times 0.5, capped by ``llMaxBws``, and nothing depends on GPUDirect RDMA).

        >>> from treecoll.topo.machines import MachineFlags, Nic, machine_topology
        >>> from treecoll.collectives.sim.profiles import get_profile
        >>> t, _ = machine_topology(MachineFlags(hosts=2, gpus_per_host=1, gpu="H200", nic=Nic(1, 400.0, "roce")))
        >>> # NCCL's PCI hop with LL (1.0 us) + 32 KiB over PCIe Gen5 (48 GB/s) into the CPU (x 0.57) with LL's
        >>> # 8 data bytes a line (x 0.5): 1.0 + 2.4 us
        >>> round(Network(t, get_profile("nccl-ll")).staged_seconds("h0/gpu0", 32768) * 1e6, 2)
        3.4
        """
        cpu = self.host_memory(gpu)
        if cpu is None or nbytes <= 0:
            return 0.0
        r = self.route(cpu, gpu) if read else self.route(gpu, cpu)
        cap = min(r.min_caps, default=0.0)
        return r.lat + nbytes / cap if cap > 0 else 0.0

    def host_memory(self, gpu: str) -> str | None:
        """The CPU whose memory holds ``gpu``'s host buffers
        (:func:`~treecoll.collectives.sim.transports.host_buffer`, kept per GPU)."""
        if gpu not in self._host_memory:
            self._host_memory[gpu] = host_buffer(self.topology, gpu)
        return self._host_memory[gpu]

    def _via_host_memory(
        self, a: str, b: str, routes: Sequence[tuple[Sequence[str], float]], send: bool, recv: bool
    ) -> list:
        """``routes`` of a send of GPU ``a`` to GPU ``b`` across hosts as they run through host memory
        (:func:`~treecoll.collectives.sim.transports.host_buffer`): with ``send`` each one's part up to
        its first NIC replaced by the route of ``a``'s CPU to that NIC (the NIC reads the staged step
        there), with ``recv`` its part after its last NIC by the route of that NIC to ``b``'s CPU (the NIC
        writes the step there; ``b`` reads it, :meth:`staged_seconds`)."""
        src = self.host_memory(a) if send else None
        dst = self.host_memory(b) if recv else None
        if src is None and dst is None:
            return list(routes)
        node = self.topology.graph.nodes
        path = self.topology.path
        out = []
        for nodes, share in routes:
            nics = [j for j, n in enumerate(nodes) if node[n].get("kind") == "nic"]
            nodes = tuple(nodes)
            if nics and dst is not None:
                nodes = nodes[: nics[-1]] + path(nodes[nics[-1]], dst).nodes
            if nics and src is not None:
                nodes = path(src, nodes[nics[0]]).nodes + nodes[nics[0] + 1 :]
            out.append((nodes, share))
        return out

    def _numbered(self, subs: list, lat: float, cls: str, nccl: str) -> Route:
        """The route whose subroutes ``subs`` = ``[(edges (a, b), share), ...]``, links numbered in order."""
        known, link_id = self._ids.get, self.link_id
        out = []
        for edges, share in subs:
            ids = [known(e) for e in edges]
            if None in ids:
                ids = [link_id(*e) if i is None else i for e, i in zip(edges, ids)]
            out.append((ids, share))
        return Route.of(out, lat, cls, nccl, self.cap_list)


def maxmin_rates(flow: np.ndarray, link: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max-min fair rates by progressive filling.

    ``flow[i]`` uses ``link[i]`` (an incidence list; ids are arbitrary
    integers), ``cap[link id]`` in bytes/s. Every iteration raises all
    unfrozen flows equally until some links saturate, then freezes the flows
    crossing them. Returns ``(flow ids (sorted, unique), rates in bytes/s)``.

    >>> f = np.array([0, 1, 1]); l = np.array([0, 0, 1])
    >>> maxmin_rates(f, l, np.array([10.0, 2.0]))[1].tolist()
    [8.0, 2.0]
    """
    uf, fi = np.unique(flow, return_inverse=True)
    ul, li = np.unique(link, return_inverse=True)
    return uf, _fill(fi, li, cap[ul].astype(np.float64), len(uf))


def _fill(fi: np.ndarray, li: np.ndarray, rem: np.ndarray, nf: int) -> np.ndarray:
    """Progressive filling on dense ids: flows 0..nf-1, links 0..len(rem)-1 (``rem`` is consumed)."""
    nl = len(rem)
    rate = np.zeros(nf)
    frozen = np.zeros(nf, dtype=bool)
    act = np.ones(len(fi), dtype=bool)
    level = 0.0
    lia = li
    fia = fi
    while len(lia):
        cnt = np.bincount(lia, minlength=nl)
        share = np.where(cnt > 0, rem / np.maximum(cnt, 1), np.inf)
        m = max(float(share.min()), 0.0)
        bott = share <= m * (1 + _REL_EPS) + 1e-12
        rem -= cnt * m
        np.maximum(rem, 0.0, out=rem)
        level += m
        hit = fia[bott[lia]]
        rate[hit] = level
        frozen[hit] = True
        act = ~frozen[fia]
        lia = lia[act]
        fia = fia[act]
    return rate


def _dense(ids: np.ndarray, scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(unique ids, dense index of each entry)`` without sorting: the ids in an order of first
    appearance, ``scratch`` an int array longer than the largest id (its contents are overwritten).

    Progressive filling does not depend on how flows and links are numbered, so this numbering
    gives :func:`_fill` the same rates as :func:`maxmin_rates`'s sorted one, in linear time.

    >>> u, i = _dense(np.array([7, 3, 7, 5]), np.zeros(8, dtype=np.int64))
    >>> sorted(u.tolist()), u[i].tolist()
    ([3, 5, 7], [7, 3, 7, 5])
    """
    n = len(ids)
    scratch[ids] = np.arange(n)
    rep = scratch[ids]  # one position per distinct id
    first = np.zeros(n, dtype=bool)
    first[rep] = True
    dense = np.cumsum(first) - 1
    return ids[first], dense[rep]


#: components up to this many link incidences are filled in Python (numpy's per-call cost dominates below)
_PY_FILL_MAX = 96


def _fill_small(flow_links: list[tuple[int, ...]], cap: Sequence[float] | dict[int, float]) -> list[float]:
    """:func:`_fill` on a small component, in Python: the same operations on the same numbers (counts
    of unfrozen flows per link, the least share, every link's capacity less count x share), so the
    same rates to the last bit. ``flow_links[i]``: the link ids of flow ``i``; ``cap[link id]``: its
    capacity (a list or a dict).

    >>> _fill_small([(0,), (0, 1)], {0: 10.0, 1: 2.0})
    [8.0, 2.0]
    """
    nf = len(flow_links)
    rate = [0.0] * nf
    index: dict[int, int] = {}  # link id -> dense index
    users: list[list[int]] = []
    cnt: list[int] = []
    dense = []
    for f, ls in enumerate(flow_links):
        row = []
        for lk in ls:
            j = index.get(lk)
            if j is None:
                j = index[lk] = len(cnt)
                cnt.append(0)
                users.append([])
            cnt[j] += 1
            users[j].append(f)
            row.append(j)
        dense.append(row)
    left_cap = [cap[lk] for lk in index]
    frozen = [False] * nf
    left = nf
    live = range(len(cnt))
    level = 0.0
    while left:
        share = [left_cap[j] / cnt[j] for j in live]
        m = max(min(share), 0.0)
        thr = m * (1 + _REL_EPS) + 1e-12
        bott = [j for j, s in zip(live, share) if s <= thr]
        for j in live:
            v = left_cap[j] - cnt[j] * m
            left_cap[j] = v if v > 0.0 else 0.0
        level += m
        for j in bott:
            for f in users[j]:
                if not frozen[f]:
                    frozen[f] = True
                    rate[f] = level
                    left -= 1
                    for l2 in dense[f]:
                        cnt[l2] -= 1
        live = [j for j in live if cnt[j] > 0]
    return rate


def _fill_disjoint(min_caps: list[float]) -> list[float]:
    """:func:`_fill_small` on flows that share no link, ``min_caps[i]`` the least capacity of flow ``i``'s
    links: the same operations on the same numbers. Each link has one flow, so a link's share is its
    capacity left, and a flow's least share is its least link's (subtracting the level's step and
    clamping at 0 keep the order of two numbers), so the same rates to the last bit.

    >>> _fill_disjoint([10.0, 2.0, 2.0])
    [10.0, 2.0, 2.0]
    """
    rate = [0.0] * len(min_caps)
    left = min_caps[:]
    live = range(len(min_caps))
    level = 0.0
    while live:
        m = max(min([left[f] for f in live]), 0.0)
        thr = m * (1 + _REL_EPS) + 1e-12
        level += m
        rest = []
        for f in live:
            if left[f] <= thr:
                rate[f] = level
            else:
                v = left[f] - m
                left[f] = v if v > 0.0 else 0.0
                rest.append(f)
        live = rest
    return rate


def drain_times(net: Network, links: Sequence[np.ndarray], sizes: Sequence[float]) -> np.ndarray:
    """Seconds each subflow takes to drain when all start together, rates from one max-min allocation.

    ``links[i]``: the link ids (array) subflow ``i`` crosses; ``sizes[i]``: its bytes.
    """
    drain = np.zeros(len(sizes))
    if not len(sizes):
        return drain
    flows = np.concatenate([np.full(len(ids), i, dtype=np.int64) for i, ids in enumerate(links)])
    uf, rate = maxmin_rates(flows, np.concatenate(links), net.cap)
    sz = np.asarray(sizes, dtype=np.float64)[uf]
    drain[uf] = np.where(sz > 0, sz / np.maximum(rate, 1e-300), 0.0)
    return drain


def concurrent_times(net: Network, transfers: Iterable[tuple[str, str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """``(latency, drain)`` in seconds of transfers that all start together, rates from one max-min allocation.

    ``transfers``: iterable of ``(src_gpu, dst_gpu, nbytes)``. ``drain`` is
    the largest ``bytes / rate`` over a transfer's subflows, ``latency`` its
    route latency; the transfer completes after their sum. Used for lockstep
    phases (every step of a uniform ring moves the same set of transfers).
    """
    links, sizes, owner, lats = [], [], [], []
    tlist = list(transfers)
    for t_i, (a, b, n) in enumerate(tlist):
        r = net.route(a, b)
        lats.append(r.lat)
        for ids, share in r.subroutes:
            links.append(ids)
            sizes.append(n * share)
            owner.append(t_i)
    drain = np.zeros(len(tlist))
    np.maximum.at(drain, np.asarray(owner, dtype=np.int64), drain_times(net, links, sizes))
    return np.asarray(lats, dtype=np.float64), drain


@dataclass
class RawRun:
    """What :meth:`FlowEngine.run` measured; :mod:`treecoll.collectives.sim` turns it into a result."""

    makespan: float
    finish: list
    link_bytes: np.ndarray
    peak_scratch: list
    transfers: int
    subflows: int
    recomputes: int
    loop: str = "python"  # which event loop ran: "python" or "native" (collectives.sim.engine_native)


class _Flows:
    """The subflows of a run: per subflow (ids 0, 1, ... in the order added, never reused) its bytes
    left as of ``t_last``, its rate since then, its size, transfer, links and whether it still drains;
    per link id, the subflows draining over it. Python lists: the engine reads and writes them one
    subflow at a time, on the few subflows a rate update touches."""

    def __init__(self) -> None:
        self.n = 0
        self.rem: list[float] = []  # bytes left at t_last
        self.t_last: list[float] = []
        self.rate: list[float] = []
        self.size: list[float] = []
        self.xfer: list[int] = []
        self.alive: list[bool] = []
        self.ver: list[int] = []  # bumped at every rate change: older heap entries are stale
        self.lists: list[tuple[int, ...]] = []
        self.min_cap: list[float] = []  # the least capacity of the subflow's links
        self.on_link: list[set[int]] = []  # link id -> the subflows draining over it
        self.pending: list = []  # (route, bytes, transfer) queued by add_route, not yet in the lists

    def add_route(self, route: Route, nbytes: float, xfer: int) -> int:
        """Queue one subflow per used subroute of ``route`` carrying ``share × nbytes`` for transfer
        ``xfer``; returns how many. They join at the next :meth:`flush` (in the order queued), before
        anything reads them."""
        k = len(route.link_lists)
        if k:
            self.pending.append((route, nbytes, xfer))
        return k

    def flush(self, now: float, nlinks: int, touched: set[int] | None = None) -> None:
        """Move the queued subflows into the lists (ids in queue order); their links are added to ``touched``."""
        if not self.pending:
            return
        if touched is None:
            touched = set()
        queued, self.pending = self.pending, []
        on_link = self.on_link
        if len(on_link) < nlinks:
            on_link.extend(set() for _ in range(nlinks - len(on_link)))
        first = f = self.n
        rem, size, lists, xfer, min_cap = self.rem, self.size, self.lists, self.xfer, self.min_cap
        for route, nbytes, xi in queued:
            ns = [share * nbytes for share in route.share_list]
            rem.extend(ns)
            size.extend(ns)
            lists.extend(route.link_lists)
            min_cap.extend(route.min_caps)
            xfer.extend([xi] * len(ns))
            for lst in route.link_lists:
                for lk in lst:
                    on_link[lk].add(f)
                f += 1
                touched.update(lst)
        added = f - first
        self.t_last.extend([now] * added)
        self.rate.extend([0.0] * added)  # 0 until the next allocation
        self.alive.extend([True] * added)
        self.ver.extend([0] * added)
        self.n = f


def _lane_queues(steps) -> list[list[int]]:
    """Step indices of one rank per lane, lanes in ascending order, each in list order."""
    by_lane: dict[int, list[int]] = {}
    for i, s in enumerate(steps):
        by_lane.setdefault(s.lane, []).append(i)
    return [by_lane[ln] for ln in sorted(by_lane)]


#: event kinds on the engine's heap: a transfer's data has arrived; a reduce has finished
_ARRIVAL, _REDUCE_DONE = 0, 1


def _recv_indices(steps, rank: int) -> list[int]:
    """For each step of ``rank``: ``k`` for its k-th recv of that (sender, chunk), -1 for other steps.

    A message is named ``(src, dst, chunk, k)``: the k-th send of ``chunk`` from ``src`` to ``dst``
    matches the k-th recv of it."""
    seen: dict[tuple[int, int, int], int] = {}
    out = []
    for s in steps:
        if s.kind == "recv":
            key = (s.peer, rank, s.chunk)
            out.append(seen.get(key, 0))
            seen[key] = out[-1] + 1
        else:
            out.append(-1)
    return out


class FlowEngine:
    """One run of a schedule on a :class:`Network`, with the semantics of the module docstring.

    ``chunk_bytes[c]``: bytes of chunk ``c``; ``rank_gpus[r]``: rank ``r``'s GPU; ``mem_bw[r]``:
    its memory bandwidth in bytes/s (0: free reduces, as with ``reduce_cost=False``).
    ``ordered_pairs``: one in-order connection per (sender, receiver) pair; ``rendezvous``: a message
    moves once its receiver has posted the matching recv; ``lanes``: each step lane of a rank issues
    in order on its own, not after the other lanes' earlier steps.

    The state of the run is the engine's fields: per rank, what has completed and what may issue
    next; per message, where it waits; the subflows and their rates; the event heap and the clock.
    :meth:`run` runs it to the end, once: with the C loop of
    :mod:`~treecoll.collectives.sim.engine_native` where it can be built (the same numbers), else
    with the Python loop below.

    >>> from treecoll import topo
    >>> from treecoll.collectives.schedule import Schedule, Step
    >>> from treecoll.collectives.sim.profiles import get_profile
    >>> t = topo.resolve("dgx-h100")
    >>> s = Schedule("broadcast", 2, 1, ((Step("send", 0, peer=1),), (Step("recv", 0, peer=0),)), root=0)
    >>> raw = FlowEngine(Network(t, get_profile("ideal")), s, [1e9], t.rank_gpus(), [0.0, 0.0]).run()
    >>> round(raw.makespan * 1e6, 1), raw.transfers, raw.subflows   # 0.6 us + 1 GB over 370.8 GB/s
    (2697.5, 1, 4)
    """

    #: whether each rank's sends and receives are issued by one CPU thread (ExecutorEngine)
    issues_from_cpu = False

    def __init__(
        self,
        net: Network,
        schedule: Schedule,
        chunk_bytes: Sequence[float],
        rank_gpus: Sequence[str],
        mem_bw: Sequence[float],
        *,
        reduce_cost: bool = True,
        ordered_pairs: bool = False,
        rendezvous: bool = False,
        lanes: bool = False,
    ):
        P = schedule.nranks
        if len(rank_gpus) < P:
            raise CollectiveError(f"simulate: expected a GPU for each of {P} ranks, got {len(rank_gpus)}")
        self.net = net
        self.nranks = P
        self.steps = schedule.steps
        self.chunk_bytes = chunk_bytes
        self._chunk_f = [float(b) for b in chunk_bytes]  # the same, as floats
        self.rank_gpus = rank_gpus
        self.mem_bw = mem_bw
        self.reduce_cost = reduce_cost
        self.ordered_pairs = ordered_pairs
        self.rendezvous = rendezvous
        self.lanes = lanes
        self._ran = False

    def run(self) -> RawRun:
        """Run the schedule to its end: what it measured. Raises :class:`CollectiveError` when the
        schedule cannot progress."""
        if self._ran:
            raise CollectiveError("simulate: a FlowEngine runs once; build a new one")
        self._ran = True
        from .engine_native import run_native

        native = run_native(self)
        if native is not None:
            return RawRun(**native, loop="native")
        self._start_python_loop()
        for r in range(self.nranks):
            self._advance(r, 0.0)
        while True:
            if self.changed:
                self._update_rates()
            t_next = min(self._next_drain(), self.heap[0][0] if self.heap else np.inf)
            if t_next == np.inf:
                break
            self._drain_until(t_next)
            self._pop_due_events()
        self._check_all_done()
        return self._result()

    def _start_python_loop(self) -> None:
        """The state of the Python loop (the C loop keeps its own)."""
        # per rank: the time each step completed (None: not yet), and the in-order streams it issues
        # from: one, or one per lane (NCCL's split tree: up and down run concurrently)
        P, steps, lanes = self.nranks, self.steps, self.lanes
        nsteps = [len(s) for s in steps]
        self.done_t: list[list[float | None]] = [[None] * n for n in nsteps]
        self.queues = [_lane_queues(steps[r]) if lanes else [range(nsteps[r])] for r in range(P)]
        self.pos = [[0] * len(q) for q in self.queues]  # next position in each stream
        self.ready = [set(range(len(q))) for q in self.queues]  # streams whose head may start now
        self.blocked_on: dict[tuple[int, int], list[int]] = {}  # (rank, step) -> streams waiting for it
        self.compute_free = [0.0] * P  # when each rank's GPU can start a reduce
        self.recv_k = [_recv_indices(steps[r], r) for r in range(P)]
        # messages, named (src, dst, chunk, k)
        self.send_count: dict[tuple[int, int, int], int] = {}
        # connection -> (step, Step, message) of the sends waiting for it (present while one drains)
        self.pair_queue: dict[tuple[int, int, int], deque[tuple[int, Step, tuple]]] = {}
        self.posted: set[tuple] = set()  # messages whose recv is posted (rendezvous)
        self.held: dict[tuple, tuple] = {}  # message -> (rank, step, Step) of its send, until posted
        self.arrived: dict[tuple, float] = {}  # message -> arrival time, until its recv is posted
        self.waiting: dict[tuple, tuple[int, int]] = {}  # message -> (rank, step) of its posted recv
        # scratch memory: per rank, (time, +bytes / -bytes) events and the bytes held per (chunk, slot)
        self.scratch_ev: list[list[tuple[float, float]]] = [[] for _ in range(P)]
        self.open_slot: list[dict[tuple[int, int], float]] = [{} for _ in range(P)]
        # transfers and their subflows
        self.flows = _Flows()
        self.x_pending: list[int] = []  # subflows left per transfer
        self.x_info: list[tuple] = []  # per transfer: (src rank, step, message, lat)
        self.dirty: set[int] = set()  # link ids where a subflow ended since the last rate update
        self.changed = False  # whether the rates need an update
        self.recomputes = 0
        # when each draining subflow ends at its current rate and when it is within the drain
        # tolerance of that end: a heap of (end, within tolerance, subflow, version), entries of older
        # versions stale
        self.fin_heap: list[tuple[float, float, int, int]] = []
        self._lscratch = np.zeros(0, dtype=np.int64)
        # events: (time, sequence number, kind, a, b) and the clock
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.now = 0.0

    # ------------------------------------------------------------------ the clock
    def _push(self, t: float, kind: int, a: int, b: int = 0) -> None:
        seq = self.seq
        self.seq = seq + 1
        _heappush(self.heap, (t, seq, kind, a, b))

    def _update_rates(self) -> None:
        """New max-min rates for the subflows connected (through shared links) to a link where a
        subflow started or ended; the others keep theirs (max-min allocation splits over such
        components, so this is the allocation of all subflows)."""
        fl = self.flows
        dirty = self.dirty
        fl.flush(self.now, len(self.net.ends), dirty)
        comp, ninc, nused = self._component(dirty)
        dirty.clear()
        if comp:
            if ninc == nused:  # no link carries two subflows of the component
                rates = _fill_disjoint([self.flows.min_cap[f] for f in comp])
            else:
                rates = self._rates_of(comp, ninc)
            self._set_rates(comp, rates)
        self.recomputes += 1
        self.changed = False

    def _component(self, links: set[int]) -> tuple[list[int], int, int]:
        """The draining subflows connected to ``links`` through shared links, their link incidences and
        the links they use.

        Breadth first, a whole frontier of links at a time with set operations (the rates do not
        depend on the order of the subflows: :meth:`_rates_of`)."""
        fl = self.flows
        on_link, lists = fl.on_link, fl.lists
        seen_l = set(links)
        frontier = seen_l
        seen_f: set[int] = set()
        union = set().union
        while frontier:
            new_f = union(*[on_link[lk] for lk in frontier])
            new_f -= seen_f
            if not new_f:
                break
            seen_f |= new_f
            frontier = union(*[lists[f] for f in new_f])
            frontier -= seen_l
            seen_l |= frontier
        comp = list(seen_f)
        return comp, sum(map(len, map(lists.__getitem__, comp))), sum(map(bool, map(on_link.__getitem__, seen_l)))

    def _rates_of(self, comp: list[int], ninc: int) -> list[float]:
        """Max-min rates of the subflows ``comp`` (a whole component, ``ninc`` link incidences) on the
        links' capacities (the filling does not depend on the order of flows or links)."""
        lists = self.flows.lists
        cap = self.net.cap_list
        one = lists[comp[0]]
        if len(comp) == 1 and len(set(one)) == len(one):  # one subflow: its slowest link (the filling's 0.0 + it)
            return [max(min(cap[lk] for lk in one), 0.0)]
        if ninc <= _PY_FILL_MAX:
            return _fill_small([lists[f] for f in comp], cap)
        cap = self.net.cap
        inc_l = np.fromiter(chain.from_iterable(map(lists.__getitem__, comp)), dtype=np.int64, count=ninc)
        fi = np.repeat(np.arange(len(comp)), [len(lists[f]) for f in comp])
        if len(self._lscratch) < len(self.net.ends):
            self._lscratch = np.zeros(2 * len(self.net.ends), dtype=np.int64)
        ul, li = _dense(inc_l, self._lscratch)
        return _fill(fi, li, cap[ul].astype(np.float64), len(comp)).tolist()

    def _set_rates(self, comp: list[int], rates: list[float]) -> None:
        """Give the subflows ``comp`` their new ``rates``: the bytes each has left are brought up to
        now, and its end (and its drain tolerance's) is pushed on the heaps."""
        fl, now = self.flows, self.now
        rem, t_last, rate, size, ver = fl.rem, fl.t_last, fl.rate, fl.size, fl.ver
        fin_heap = self.fin_heap
        push = heapq.heappush
        for f, r in zip(comp, rates):
            old = rate[f]
            if r == old:
                continue
            if old > 0.0:
                rem[f] -= old * (now - t_last[f])
            t_last[f] = now
            rate[f] = r
            v = ver[f] = ver[f] + 1
            if r > 0.0:
                left = rem[f]
                push(fin_heap, (now + left / r, now + (left - (_REL_EPS * size[f] + 1e-6)) / r, f, v))

    def _next_drain(self) -> float:
        """When the next draining subflow ends at the current rates (inf: none drains)."""
        heap, ver, alive = self.fin_heap, self.flows.ver, self.flows.alive
        while heap:
            t, _, f, v = heap[0]
            if v == ver[f] and alive[f]:
                return t
            heapq.heappop(heap)
        return np.inf

    def _drain_until(self, t_next: float) -> None:
        """Move the clock to ``t_next``; the subflows within the drain tolerance of their end by then
        end (handled in the order they were added), and so do the transfers they finish."""
        self.now = now = t_next
        heap, fl = self.fin_heap, self.flows
        ver, alive = fl.ver, fl.alive
        fin = []
        pop = heapq.heappop
        while heap:
            _, within, f, v = heap[0]
            if v != ver[f] or not alive[f]:
                pop(heap)
            elif within <= now:
                pop(heap)
                fin.append(f)
            else:
                break
        if not fin:
            return
        fin.sort()
        self.changed = True
        lists, on_link, rem, dirty, x_pending, xfer = fl.lists, fl.on_link, fl.rem, self.dirty, self.x_pending, fl.xfer
        for f in fin:
            alive[f] = False
            rem[f] = 0.0
            for lk in lists[f]:
                on_link[lk].discard(f)
            dirty.update(lists[f])
        for f in fin:
            xi = xfer[f]
            x_pending[xi] -= 1
            if x_pending[xi] == 0:
                self._transfer_drained(xi, now)

    def _pop_due_events(self) -> None:
        """Handle every event due now (within the clock's tolerance), in heap order."""
        heap, now = self.heap, self.now
        until = now + (now * _REL_EPS + 1e-15)
        pop, x_info = heapq.heappop, self.x_info
        while heap and heap[0][0] <= until:
            _, _, kind, a, b = pop(heap)
            if kind == _ARRIVAL:
                self._deliver(x_info[a][2], now)
            else:
                self._complete(a, b, now)
                if self.ready[a]:
                    self._advance(a, now)

    # ------------------------------------------------------------------ steps of the ranks
    def _advance(self, r: int, t: float) -> None:
        """Start every step of rank ``r`` that can start at ``t``: each ready stream issues in order
        until its head waits for a dependency (the stream is ready again when that completes)."""
        lst, dt, rd, ps, queues = self.steps[r], self.done_t[r], self.ready[r], self.pos[r], self.queues[r]
        start_send, post_recv, start_reduce = self._start_send, self._post_recv, self._start_reduce
        while rd:
            qi = min(rd) if len(rd) > 1 else next(iter(rd))  # lowest lane first: deterministic
            rd.discard(qi)
            q = queues[qi]
            n = len(q)
            while ps[qi] < n:
                i = q[ps[qi]]
                s = lst[i]
                wait = None
                for d in s.deps:
                    if dt[d] is None:
                        wait = d
                        break
                if wait is not None:
                    self.blocked_on.setdefault((r, wait), []).append(qi)
                    break
                ps[qi] += 1
                kind = s.kind
                if kind == "send":
                    start_send(r, i, s, t)
                elif kind == "recv":
                    post_recv(r, i, s, t)
                else:
                    start_reduce(r, i, s, t)

    def _complete(self, r: int, i: int, t: float) -> None:
        """Step ``i`` of rank ``r`` completed at ``t``: wake the streams waiting for it; a reduce frees
        the scratch slot it consumed."""
        self.done_t[r][i] = t
        if self.blocked_on:
            unblocked = self.blocked_on.pop((r, i), None)
            if unblocked:
                self.ready[r].update(unblocked)
        s = self.steps[r][i]
        if s.kind == "reduce":
            b = self.open_slot[r].pop((s.chunk, s.slot), None)
            if b is not None:
                self.scratch_ev[r].append((t, -b))

    def _start_reduce(self, r: int, i: int, s: Step, t: float) -> None:
        """A reduce takes ``3 × chunk_bytes / mem_bw`` on the rank's GPU, one at a time."""
        mem_bw = self.mem_bw[r]
        dur = 3.0 * self.chunk_bytes[s.chunk] / mem_bw if (self.reduce_cost and mem_bw > 0) else 0.0
        begin = max(t, self.compute_free[r])
        if dur == 0.0 and begin <= t:
            self._complete(r, i, t)
        else:
            self.compute_free[r] = begin + dur
            self._push(begin + dur, _REDUCE_DONE, r, i)

    def _post_recv(self, r: int, i: int, s: Step, t: float) -> None:
        """A recv into slot >= 1 holds scratch until its reduce; it completes when its data has arrived
        (with ``rendezvous``, posting it lets a held send move)."""
        if s.slot > 0:
            b = self._chunk_f[s.chunk]
            self.scratch_ev[r].append((t, b))
            slots = self.open_slot[r]
            slots[(s.chunk, s.slot)] = slots.get((s.chunk, s.slot), 0.0) + b
        key = (s.peer, r, s.chunk, self.recv_k[r][i])
        if self.rendezvous:
            self.posted.add(key)
            h = self.held.pop(key, None)
            if h is not None:
                self._transmit(h[0], h[1], h[2], key, t)
        if key in self.arrived:
            self._complete(r, i, max(t, self.arrived.pop(key)))
        else:
            self.waiting[key] = (r, i)

    def _deliver(self, key: tuple, t: float) -> None:
        """Message ``key``'s data has arrived at ``t``: its posted recv completes, or it waits for one."""
        w = self.waiting.pop(key, None)
        if w is None:
            self.arrived[key] = t
        else:
            self._complete(w[0], w[1], t)
            if self.ready[w[0]]:
                self._advance(w[0], t)

    # ------------------------------------------------------------------ messages
    def _conn(self, r: int, s: Step) -> tuple[int, int, int]:
        """The connection a send goes over: one per (sender, receiver), per lane with ``lanes`` (NCCL channels)."""
        return (r, s.peer, s.lane if self.lanes else 0)

    def _start_send(self, r: int, i: int, s: Step, t: float) -> None:
        """Name the message; with ``ordered_pairs`` it goes after the connection's earlier messages."""
        peer, chunk = s.peer, s.chunk
        key0 = (r, peer, chunk)
        k = self.send_count.get(key0, 0)
        self.send_count[key0] = k + 1
        key = (r, peer, chunk, k)
        if self.ordered_pairs and self._chunk_f[chunk] > 0:
            conn = (r, peer, s.lane if self.lanes else 0)  # self._conn(r, s)
            q = self.pair_queue.get(conn)
            if q is not None:  # the connection is busy: go after its earlier messages
                q.append((i, s, key))
                return
            self.pair_queue[conn] = deque()
        self._send_when_posted(r, i, s, key, t)

    def _send_when_posted(self, r: int, i: int, s: Step, key: tuple, t: float) -> None:
        """With ``rendezvous``, data moves only once the receiver has posted the matching recv."""
        if self.rendezvous and key not in self.posted and self._chunk_f[s.chunk] > 0:
            self.held[key] = (r, i, s)
            return
        self._transmit(r, i, s, key, t)

    def _transmit(self, r: int, i: int, s: Step, key: tuple, t: float) -> None:
        """The message's data starts to move: one subflow per route of the pair (none for 0 bytes)."""
        route = self.net.route(self.rank_gpus[r], self.rank_gpus[s.peer])
        n = self._chunk_f[s.chunk]
        xi = len(self.x_info)
        self.x_info.append((r, i, key, route.lat))
        cnt = 0
        if n > 0:
            cnt = self.flows.add_route(route, n, xi)
        self.x_pending.append(cnt)
        if cnt == 0:
            self._complete(r, i, t)
            self._push(t + route.lat, _ARRIVAL, xi)
            self._release(self._conn(r, s), t)
        else:
            self.changed = True

    def _transfer_drained(self, xi: int, now: float) -> None:
        """Transfer ``xi`` has left its sender: the send completes, the data arrives a route latency
        later, and the connection takes its next message."""
        r, i, _, lat = self.x_info[xi]
        self._complete(r, i, now)
        self._push(now + lat, _ARRIVAL, xi)
        self._release(self._conn(r, self.steps[r][i]), now)
        if self.ready[r]:
            self._advance(r, now)

    def _release(self, conn: tuple, t: float) -> None:
        """The connection ``conn`` is free: start its next waiting message, if any."""
        q = self.pair_queue.get(conn)
        if q:
            i, s, key = q.popleft()
            self._send_when_posted(conn[0], i, s, key, t)
        elif q is not None:
            del self.pair_queue[conn]

    # ------------------------------------------------------------------ the end
    def _check_all_done(self) -> None:
        for r, done in enumerate(self.done_t):
            for i, d in enumerate(done):
                if d is None:
                    self._unfinished(r, i)

    def _unfinished(self, r: int, i: int) -> None:
        """Raise: step ``i`` of rank ``r`` (the first in rank order) never completed."""
        raise CollectiveError(
            f"simulate: rank {r} never completed step {i} ({self.steps[r][i].kind}); the schedule cannot progress"
        )

    def _peak_scratch(self) -> list[float]:
        """Per rank, the largest sum of scratch bytes held at any time."""
        peaks = []
        for ev in self.scratch_ev:
            ev.sort(key=lambda e: (e[0], e[1]))
            cur = peak = 0.0
            for _, b in ev:
                cur += b
                peak = max(peak, cur)
            peaks.append(peak)
        return peaks

    def _result(self) -> RawRun:
        finish = [max(cast("list[float]", done), default=0.0) for done in self.done_t]  # all done by now
        link_bytes = np.zeros(len(self.net.ends))
        fl = self.flows
        fl.flush(self.now, len(self.net.ends))
        if fl.n:
            nl = np.fromiter(map(len, fl.lists), dtype=np.int64, count=fl.n)
            # bincount adds the weights in input order, as np.add.at does: the same sums
            link_bytes = np.bincount(
                np.fromiter(chain.from_iterable(fl.lists), dtype=np.int64, count=int(nl.sum())),
                np.repeat(np.asarray(fl.size), nl),
                minlength=len(self.net.ends),
            )
        return RawRun(
            max(finish, default=0.0), finish, link_bytes, self._peak_scratch(), len(self.x_info), fl.n, self.recomputes
        )
