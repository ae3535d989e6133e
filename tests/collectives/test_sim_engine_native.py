"""The flow engine's C event loop (collectives/sim/engine_native.py) against the Python loop, the
reference: the same results to the last bit (times, per-rank finish times, bytes per link in the same
link order, the busiest links, peak scratch, counters), for the flow engine and the executor's engine;
and the Python loop, with the same answer, where the C library cannot be built."""

from __future__ import annotations

import functools

import pytest
from treecoll.collectives import builders
from treecoll.collectives import compile as compile_
from treecoll.collectives.placement import Placement
from treecoll.collectives.sim import engine_native
from treecoll.collectives.sim.executor import predict_schedule
from treecoll.collectives.sim.simulator import NCCL_TREE_RUN, simulate

from treecoll import topo


@functools.cache
def _topology(name: str):
    return topo.resolve(name)


def _native_or_skip():
    status = engine_native.native_status()
    if not status["available"]:
        pytest.skip(f"the native loop is unavailable: {status['reason']}")


def _both(monkeypatch, run):
    """``run()`` with the Python loop, then with the C loop."""
    with engine_native.python_loop():
        ref = run()
    return ref, run()


def _same(a, b) -> None:
    assert (a.stats["loop"], b.stats["loop"]) == ("python", "native")
    assert a.time == b.time and a.finish == b.finish  # bit for bit
    assert list(a.link_bytes.items()) == list(b.link_bytes.items())  # the same links in the same order
    assert a.busiest == b.busiest and a.peak_scratch == b.peak_scratch and a.kind_bytes == b.kind_bytes
    counters = ("transfers", "subflows", "rate_updates")
    assert [a.stats[k] for k in counters] == [b.stats[k] for k in counters]


@pytest.mark.parametrize(
    ("builder", "nbytes", "topology"),
    [
        ("two_level", 1 << 20, "dgx-h100-x2"),
        ("two_level", 1 << 26, "dgx-h100-x2"),
        ("kary:2", 3 << 20, "dgx-h100-x2"),
        ("chain", 1 << 16, "pcie-8gpu"),
        ("binomial", 0, "pcie-8gpu"),
    ],
)
def test_executor_predictions_are_the_same_with_both_loops(monkeypatch, builder, nbytes, topology):
    _native_or_skip()
    p = Placement(_topology(topology), None)
    _same(*_both(monkeypatch, lambda: predict_schedule(p, builder, nbytes, backend="gloo")))


@pytest.mark.parametrize("step_cost", [0.0, 3e-6, -1e-7])
def test_executor_step_costs_are_the_same_with_both_loops(monkeypatch, step_cost):
    # no cost (a rank's deferred steps tie), a small one, and one the C loop orders on its heap alone
    _native_or_skip()
    p = Placement(_topology("dgx-h100-x2"), None)
    _same(*_both(monkeypatch, lambda: predict_schedule(p, "two_level", 1 << 22, step_cost=step_cost)))


@pytest.mark.parametrize(
    "run",
    [
        {"profile": "nccl-simple", **NCCL_TREE_RUN},
        {"profile": "nccl-ll128", "lanes": True},
        {"ordered_pairs": True, "rendezvous": True},
        {"rendezvous": True},
        {},
    ],
)
def test_flow_simulations_are_the_same_with_both_loops(monkeypatch, run):
    _native_or_skip()
    t = _topology("dgx-h100-x2")
    sched = compile_.compile_plan(builders.build("double_binary", t), "allreduce", 3)
    _same(*_both(monkeypatch, lambda: simulate(t, sched, 5 << 20, **run)))


@pytest.mark.parametrize(
    ("env", "reason"),
    [({"CC": "/nonexistent/cc"}, "no C compiler: '/nonexistent/cc' is not on PATH"), ({"TREECOLL_NATIVE": "0"}, "")],
)
def test_without_the_library_the_python_loop_gives_the_same_answer(monkeypatch, env, reason):
    t = _topology("dgx-h100-x2")
    sched = compile_.compile_plan(builders.build("kary:2", t), "allreduce", 2)
    with monkeypatch.context() as mp:
        mp.setattr(engine_native, "_STATE", {})  # forget the loaded library
        for name, value in env.items():
            mp.setenv(name, value)
        status = engine_native.native_status()
        assert not status["available"] and status["library"] is None
        assert (reason or "disabled by TREECOLL_NATIVE=0") in status["reason"]
        fallback = simulate(t, sched, 1 << 20, ordered_pairs=True, rendezvous=True)
    assert fallback.stats["loop"] == "python"
    _native_or_skip()
    native = simulate(t, sched, 1 << 20, ordered_pairs=True, rendezvous=True)
    assert native.stats["loop"] == "native"
    assert (fallback.time, fallback.finish, fallback.link_bytes) == (native.time, native.finish, native.link_bytes)
