"""The flow engine's event loop in C: :class:`~treecoll.collectives.sim.engine.FlowEngine` (and the
executor's :class:`~treecoll.collectives.sim.executor.ExecutorEngine`) run by ``csrc/flow_engine.c``.

The C loop is the Python loop of :mod:`treecoll.collectives.sim.engine` event for event: the same
events in the same order (the heaps order events by time, then by when they were pushed; subflow
ends by end, tolerance, subflow, version), the same max-min filling (the operations of
``engine._fill_small``), the same floating-point operations in the same order (built without
``-ffast-math`` and with ``-ffp-contract=off``), so the same numbers to the last bit and the same
counters. Python hands it plain arrays once per run: every rank's steps (kind, chunk, peer, slot,
lane, dependencies), the route of every send (its latency, subroutes, their shares and link ids; routes
are computed before the run, once per pair of GPUs), the links' capacities; it returns every step's
completion time, the bytes per link, the peak scratch per rank, the counters, and the order in which
the run first used each link: the network's links are then numbered in that order, as the Python
loop numbers them as it goes, so results list links in the same order.

The library is built on first use (:func:`treecoll.collectives.native.load_library`); without a C
compiler, or with ``TREECOLL_NATIVE=0``, the Python loop runs and :func:`native_status` says why.
Which loop ran is in the run's ``RawRun.loop`` (``native`` or ``python``) and in the simulators'
``stats["loop"]``. Inside ``with python_loop():`` the Python loop runs whatever the library (the
reference, for comparisons such as ``treecoll selfcheck``'s).

>>> from treecoll import topo
>>> from treecoll.collectives.schedule import Schedule, Step
>>> from treecoll.collectives.sim.engine import FlowEngine, Network
>>> from treecoll.collectives.sim.profiles import get_profile
>>> t = topo.resolve("dgx-h100")
>>> s = Schedule("broadcast", 2, 1, ((Step("send", 0, peer=1),), (Step("recv", 0, peer=0),)), root=0)
>>> raw = FlowEngine(Network(t, get_profile("ideal")), s, [1e9], t.rank_gpus(), [0.0, 0.0]).run()
>>> round(raw.makespan * 1e6, 1), raw.loop == ("native" if native_status()["available"] else "python")
(2697.5, True)
>>> with python_loop():
...     ref = FlowEngine(Network(t, get_profile("ideal")), s, [1e9], t.rank_gpus(), [0.0, 0.0]).run()
>>> ref.loop, ref.makespan == raw.makespan
('python', True)
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
from treecoll.collectives.native import NativeUnavailable, load_library
from treecoll.topo.errors import CollectiveError

__all__ = ["native_status", "python_loop", "run_native", "maxmin_fill"]

SOURCE = Path(__file__).with_name("csrc") / "flow_engine.c"
# no -ffast-math, no fused multiply-adds: the Python loop's numbers to the last bit
_FLAG_SETS = (["-O2", "-ffp-contract=off", "-fno-fast-math"],)
_STATE: dict = {}
#: set inside :func:`python_loop`: run_native declines, the Python loop runs
_PYTHON_LOOP: ContextVar[bool] = ContextVar("treecoll_python_loop", default=False)
_KINDS = {"send": 0, "recv": 1, "reduce": 2}

_P = ctypes.c_void_p
_I = ctypes.c_int64


class _Args(ctypes.Structure):
    """``fe_args`` of csrc/flow_engine.c (field for field)."""

    _fields_ = (
        [(n, _I) for n in ("nranks", "nsteps", "nchunks", "nroutes", "nlinks")]
        + [
            (n, _P)
            for n in (
                "step_off",
                "kind",
                "chunk",
                "peer",
                "slot",
                "lane",
                "dep_ptr",
                "dep_idx",
                "route_of",
                "chunk_f",
                "mem_bw",
                "r_lat",
                "r_sub_ptr",
                "s_share",
                "s_link_ptr",
                "s_links",
                "cap",
            )
        ]
        + [(n, _I) for n in ("reduce_cost", "ordered_pairs", "rendezvous", "lanes", "executor")]
        + [("step_cost", ctypes.c_double)]
        + [(n, _P) for n in ("done_t", "link_bytes", "peak_scratch", "finish", "link_order")]
        + [(n, _I) for n in ("n_order", "transfers", "subflows", "recomputes")]
    )


def _declare(lib: ctypes.CDLL) -> None:
    lib.treecoll_flow_run.argtypes = [ctypes.POINTER(_Args)]
    lib.treecoll_flow_run.restype = ctypes.c_int
    lib.treecoll_maxmin_fill.argtypes = [_I, _P, _P, _P, _I, _P]
    lib.treecoll_maxmin_fill.restype = ctypes.c_int


def _library() -> ctypes.CDLL:
    return load_library(SOURCE, _FLAG_SETS, _STATE, _declare)


@contextmanager
def python_loop() -> Iterator[None]:
    """Inside the block every :class:`~treecoll.collectives.sim.engine.FlowEngine` runs the Python
    loop (the reference), whether or not the C library is available."""
    token = _PYTHON_LOOP.set(True)
    try:
        yield
    finally:
        _PYTHON_LOOP.reset(token)


def native_status() -> dict:
    """``{'available': bool, 'library': path or None, 'reason': str}`` of the C event loop (built on
    first call; ``reason`` says why the Python loop runs instead)."""
    try:
        _library()
    except NativeUnavailable as exc:
        return {"available": False, "library": None, "reason": str(exc)}
    return {"available": True, "library": str(_STATE["path"]), "reason": ""}


def _offsets(lengths) -> np.ndarray:
    """``[0, l0, l0 + l1, ...]`` as int64."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _ints(values, n: int | None = None) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=-1 if n is None else n)


def _step_arrays(engine: Any) -> dict:
    """Every rank's steps as flat arrays (global step ``g = step_off[r] + i``)."""
    flat = list(chain.from_iterable(engine.steps))
    S = len(flat)
    deps = [s.deps for s in flat]  # one pass per field: faster than transposing rows of fields
    return {
        "step_off": _offsets([len(s) for s in engine.steps]),
        "kind": np.fromiter(map(_KINDS.__getitem__, [s.kind for s in flat]), dtype=np.int8, count=S),
        "chunk": _ints([s.chunk for s in flat], S),
        "peer": _ints([s.peer for s in flat], S),
        "slot": _ints([s.slot for s in flat], S),
        "lane": _ints([s.lane for s in flat], S),
        "dep_ptr": _offsets(_ints(map(len, deps), S)),
        "dep_idx": _ints(chain.from_iterable(deps)),
    }


def _route_arrays(engine: Any, a: dict) -> dict:
    """The route of every send step (one per pair of GPUs, computed now) as flat arrays: per route its
    latency and subroutes, per subroute its share and link ids. A route inside a host is its class's
    template (:meth:`~treecoll.collectives.sim.engine.Network.host_template`) on the host's links, made
    for all the hosts of a template at once."""
    P = engine.nranks
    S = len(a["kind"])
    rank = np.repeat(np.arange(P, dtype=np.int64), np.diff(a["step_off"]))
    sends = np.nonzero(a["kind"] == 0)[0]
    pairs, which = np.unique(rank[sends] * P + a["peer"][sends], return_inverse=True)
    route_of = np.full(S, -1, dtype=np.int64)
    route_of[sends] = which.reshape(-1)
    gpus, net = engine.rank_gpus, engine.net
    template, route = net.host_template, net.route
    n = len(pairs)
    nsub = np.zeros(n, dtype=np.int64)
    lat = np.zeros(n)
    between: list[tuple[int, Any]] = []  # (route index, Route) of the routes between hosts
    groups: dict[int, tuple[tuple, str, list[int], list[str]]] = {}  # template -> (it, class, routes, hosts)
    for j, code in enumerate(pairs.tolist()):
        ga, gb = gpus[code // P], gpus[code % P]
        found = template(ga, gb)
        if found is None:
            r = route(ga, gb)
            between.append((j, r))
            nsub[j], lat[j] = len(r.sub_shares), r.lat
            continue
        tpl, host, rep = found
        g = groups.get(id(tpl))
        if g is None:
            g = groups[id(tpl)] = (tpl, rep, [], [])
        g[2].append(j)
        g[3].append(host)
        nsub[j], lat[j] = len(tpl[0]), tpl[4]
    r_sub_ptr = _offsets(nsub)
    s_share = np.zeros(int(r_sub_ptr[-1]))
    s_len = np.zeros(int(r_sub_ptr[-1]), dtype=np.int64)
    for tpl, _, js, _ in groups.values():
        at = r_sub_ptr[js][:, None] + np.arange(len(tpl[0]))
        s_share[at] = tpl[1]
        s_len[at] = [len(sub) for sub in tpl[0]]
    for j, r in between:
        at = slice(int(r_sub_ptr[j]), int(r_sub_ptr[j + 1]))
        s_share[at] = r.sub_shares
        s_len[at] = [len(sub) for sub in r.sub_lists]
    s_link_ptr = _offsets(s_len)
    s_links = np.zeros(int(s_link_ptr[-1]), dtype=np.int64)
    links_of = _host_link_arrays(net, groups.values())
    for tpl, _, js, hosts in groups.values():
        edges = np.fromiter(chain.from_iterable(tpl[0]), dtype=np.int64)
        ids = np.stack([links_of[h] for h in hosts])[:, edges]
        s_links[s_link_ptr[r_sub_ptr[js]][:, None] + np.arange(len(edges))] = ids
    for j, r in between:
        s_links[int(s_link_ptr[r_sub_ptr[j]]) : int(s_link_ptr[r_sub_ptr[j + 1]])] = list(
            chain.from_iterable(r.sub_lists)
        )
    return {
        "route_of": route_of,
        "r_lat": lat,
        "r_sub_ptr": r_sub_ptr,
        "s_share": s_share,
        "s_link_ptr": s_link_ptr,
        "s_links": s_links,
    }


def _host_link_arrays(net: Any, groups) -> dict[str, np.ndarray]:
    """Per host with routes inside it, the link id of each local edge of its class (-1: unused), the
    edges its routes use numbered now (:meth:`~treecoll.collectives.sim.engine.Network.host_links`)."""
    used: dict[str, set[int]] = {}  # host -> local edges its routes cross
    rep_of: dict[str, str] = {}
    for tpl, rep, _, hosts in groups:
        edges = set(chain.from_iterable(tpl[0]))
        for h in hosts:
            used.setdefault(h, set()).update(edges)
            rep_of[h] = rep
    return {h: net.host_link_array(h, rep_of[h], sorted(edges)) for h, edges in used.items()}


def run_native(engine: Any) -> dict | None:
    """Run ``engine`` (a fresh :class:`~treecoll.collectives.sim.engine.FlowEngine` or ExecutorEngine)
    with the C loop: the fields of its ``RawRun`` (``makespan``, ``finish``, ``link_bytes``,
    ``peak_scratch``, ``transfers``, ``subflows``, ``recomputes``), or None when the library is
    unavailable (:func:`native_status`). Raises what the Python loop raises when the schedule cannot
    progress."""
    if _PYTHON_LOOP.get():
        return None
    try:
        lib = _library()
    except NativeUnavailable:
        return None
    a = _step_arrays(engine)
    a.update(_route_arrays(engine, a))
    net = engine.net
    L = len(net.ends)
    a["cap"] = np.ascontiguousarray(net.cap, dtype=np.float64)
    a["chunk_f"] = np.asarray(engine._chunk_f, dtype=np.float64).reshape(-1)
    a["mem_bw"] = np.asarray([float(m) for m in engine.mem_bw[: engine.nranks]], dtype=np.float64).reshape(-1)
    S, P = len(a["kind"]), engine.nranks
    out = {
        "done_t": np.empty(S),
        "link_bytes": np.empty(L),
        "peak_scratch": np.empty(P),
        "finish": np.empty(P),
        "link_order": np.empty(L, dtype=np.int64),
    }
    arrays = {**a, **out}
    args = _Args(
        nranks=P,
        nsteps=S,
        nchunks=len(a["chunk_f"]),
        nroutes=len(a["r_lat"]),
        nlinks=L,
        reduce_cost=int(bool(engine.reduce_cost)),
        ordered_pairs=int(bool(engine.ordered_pairs)),
        rendezvous=int(bool(engine.rendezvous)),
        lanes=int(bool(engine.lanes)),
        executor=int(engine.issues_from_cpu),
        step_cost=float(getattr(engine, "step_cost", 0.0)),
        **{k: v.ctypes.data for k, v in arrays.items()},
    )
    rc = lib.treecoll_flow_run(ctypes.byref(args))
    if rc != 0:
        raise CollectiveError(
            f"simulate: the native event loop ran out of memory on {S} steps of {P} ranks; "
            "simulate fewer ranks or chunks"
        )
    done = out["done_t"]
    if np.isnan(done).any():
        g = int(np.flatnonzero(np.isnan(done))[0])
        r = int(np.searchsorted(a["step_off"], g, side="right") - 1)
        engine._unfinished(r, g - int(a["step_off"][r]))
    order = out["link_order"][: args.n_order]
    if len(order) < L:  # links of routes no transfer used (cannot happen: every send transmits)
        order = np.concatenate([order, np.setdiff1d(np.arange(L), order)])
    net.renumber(order)
    finish = out["finish"].tolist()
    return {
        "makespan": max(finish, default=0.0),
        "finish": finish,
        "link_bytes": out["link_bytes"][order],
        "peak_scratch": out["peak_scratch"].tolist(),
        "transfers": args.transfers,
        "subflows": args.subflows,
        "recomputes": args.recomputes,
    }


def maxmin_fill(flow_links: list[tuple[int, ...]], cap: list[float]) -> list[float]:
    """The C loop's max-min filling of subflows alone, as ``engine._fill_small(flow_links, cap)``
    computes it (``flow_links[i]``: the link ids of subflow ``i``, ``cap[link id]`` bytes/s); raises
    :class:`~treecoll.collectives.native.NativeUnavailable` without the library.

    >>> maxmin_fill([(0,), (0, 1)], [10.0, 2.0]) if native_status()["available"] else [8.0, 2.0]
    [8.0, 2.0]
    """
    lib = _library()
    ptr = _offsets([len(ls) for ls in flow_links])
    links = _ints(chain.from_iterable(flow_links))
    caps = np.asarray(cap, dtype=np.float64).reshape(-1)
    rate = np.zeros(len(flow_links))
    if lib.treecoll_maxmin_fill(
        len(flow_links), ptr.ctypes.data, links.ctypes.data, caps.ctypes.data, len(caps), rate.ctypes.data
    ):
        raise CollectiveError(f"maxmin_fill: the native filling ran out of memory on {len(flow_links)} subflows")
    return rate.tolist()
