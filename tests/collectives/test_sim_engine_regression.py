"""The flow engine gives the same numbers as before it became a class (collectives.sim.engine.FlowEngine).

EXPECTED holds the outputs of the engine as it was before its state moved into the fields of
``FlowEngine`` (a single ``run_schedule`` function with closures), recorded by running that code on
these exact cases: time, sum of the per-rank finish times, bytes per link kind, the largest peak
scratch, and the engine's counters (transfers, subflows, rate updates; None for the lockstep ring and
NVLS models, which do not run the event engine but share its network and max-min allocation). The
refactoring must keep them: times to 1e-12 relative, bytes and counters exactly, with the Python event
loop and with the C one (``collectives/sim/engine_native.py``). (Multi-host
lockstep rings are no longer pinned here: they now follow NCCL's per-NIC channel layout,
tested in test_sim_nccl.py.)
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
from treecoll.collectives import builders
from treecoll.collectives import compile as compile_
from treecoll.collectives.sim.nvls import simulate_nvls
from treecoll.collectives.sim.profiles import get_profile
from treecoll.collectives.sim.simulator import NCCL_TREE_RUN, simulate, simulate_ring

from treecoll import topo

GLOO = {"ordered_pairs": True, "rendezvous": True}

# name -> (time s, sum of finish s, kind_bytes, max peak scratch B, (transfers, subflows, rate updates)),
# recorded from the pre-refactor engine (see the module docstring)
EXPECTED = {
    "two_level x2 allreduce 16MiB k8 nccl-tree": (
        0.00010412760859521165,
        0.001560864838556731,
        {"net": 67108864, "nvlink": 939524096, "pcie": 134217728},
        2359296.0,
        (1920, 7296, 54),
    ),
    "two_level x16 allreduce 64MiB k4 nccl-tree": (
        0.001596030589756717,
        0.1811793236096799,
        {"net": 4026531840, "nvlink": 30064771072, "pcie": 8053063680},
        75497472.0,
        (8128, 29632, 138),
    ),
    "kary:2 x2 reduce 1MiB k4 ideal": (
        3.9509069211869435e-05,
        0.0002298141494546683,
        {"net": 8388608, "nvlink": 27262976, "pcie": 8388608},
        2097152.0,
        (60, 216, 52),
    ),
    "chain h1 broadcast 8MiB k8 gloo": (
        4.3790248112189864e-05,
        0.00027413661272923407,
        {"nvlink": 117440512},
        0.0,
        (56, 224, 63),
    ),
    "binomial pcie allreduce 4MiB k4 gloo": (
        0.0018509796410256408,
        0.013481658358974358,
        {"pcie": 167772160, "smp": 8388608},
        8388608.0,
        (56, 56, 55),
    ),
    "double_binary x2 allreduce 32MiB k2 lanes": (
        0.0019179578904755805,
        0.02977627895650023,
        {"net": 402653184, "nvlink": 1744830464, "pcie": 536870912},
        33554432.0,
        (120, 432, 72),
    ),
    "star pcie reduce 0B": (2.4999999999999998e-06, 2.4999999999999998e-06, {}, 0.0, (7, 0, 0)),
    "ring schedule x2 allreduce 1MiB engine": (
        0.00016373696431757067,
        0.0025726370644640864,
        {"net": 15728640, "nvlink": 55050240, "pcie": 15728640},
        65536.0,
        (480, 1740, 139),
    ),
    "rsag h1 allreduce 2MiB rendezvous": (
        1.274085277431612e-05,
        0.00010192682219452896,
        {"nvlink": 58720256},
        1835008.0,
        (112, 448, 4),
    ),
    "two_level x2 allreduce 1GiB k16 ll128-tree": (
        0.00600308307934818,
        0.09604932926957091,
        {"net": 4294967296, "nvlink": 60129542144, "pcie": 8589934592},
        75497472.0,
        (3840, 14592, 121),
    ),
    "kary:4 x2 allreduce 64KiB k1 ll-tree": (
        3.3228330231101424e-05,
        0.00044646810476605287,
        {"net": 1572864, "nvlink": 3145728, "pcie": 1572864},
        262144.0,
        (30, 102, 21),
    ),
    "ring lockstep pcie reduce_scatter 8MiB": (
        0.0012353386666666666,
        0.009882709333333335,
        {"pcie": 176160768, "smp": 14680064},
        1048576.0,
        (None, None, None),
    ),
    # recorded before NCCL's NVLS pipeline fill was modelled; the fill (one 8 MiB loop of 32: 16 channels x
    # 8 heads x 64 KiB chunks, collectives.sim.nccl_model.nvls_fill) is added to the drain (time - 25 us) below
    "nvls h1 256MiB": (0.000983150542547116, 0.007865204340376929, {"nvlink": 4831838208}, 0.0, (None, None, None)),
    "nvls_tree x2 1GiB ideal": (
        0.003267711844660195,
        0.05228338951456312,
        {"net": 4294967296, "nvlink": 38654705664, "pcie": 8589934592},
        0.0,
        (None, None, None),
    ),
}


@functools.cache
def _topology(name: str):
    return topo.resolve(name)


def _schedule(t, algo: str, collective: str, nchunks: int, **kw):
    opts = {"nbytes": 1 << 24} if algo == "two_level" else {}
    return compile_.compile_plan(builders.build(algo, t, **opts), collective, nchunks, **kw)


def _run(name: str):
    h1, h2, h16, pcie = (_topology(n) for n in ("dgx-h100", "dgx-h100-x2", "dgx-h100-x16", "pcie-8gpu"))
    tree = {p: get_profile(p).for_tree_allreduce() for p in ("nccl-ll128", "nccl-ll")}
    # the LL case as the engine ran it then: without the host-memory staging the simulator now gives NCCL's LL
    # across hosts (a model input, Network's staged_bytes, keyed on the profile's name; tested in test_sim_nccl.py)
    tree["nccl-ll"] = dataclasses.replace(tree["nccl-ll"], name="ll-tree")
    runs = {
        "two_level x2 allreduce 16MiB k8 nccl-tree": lambda: simulate(
            h2,
            _schedule(h2, "two_level", "allreduce", 8, forward_lag=0),
            1 << 24,
            profile="nccl-simple",
            **NCCL_TREE_RUN,
        ),
        "two_level x16 allreduce 64MiB k4 nccl-tree": lambda: simulate(
            h16,
            _schedule(h16, "two_level", "allreduce", 4, forward_lag=0),
            1 << 26,
            profile="nccl-simple",
            **NCCL_TREE_RUN,
        ),
        "kary:2 x2 reduce 1MiB k4 ideal": lambda: simulate(h2, _schedule(h2, "kary:2", "reduce", 4), 1 << 20),
        "chain h1 broadcast 8MiB k8 gloo": lambda: simulate(
            h1, _schedule(h1, "chain", "broadcast", 8), 1 << 23, **GLOO
        ),
        "binomial pcie allreduce 4MiB k4 gloo": lambda: simulate(
            pcie, _schedule(pcie, "binomial", "allreduce", 4), 1 << 22, **GLOO
        ),
        "double_binary x2 allreduce 32MiB k2 lanes": lambda: simulate(
            h2, _schedule(h2, "double_binary", "allreduce", 2), 1 << 25, profile="nccl-ll128", lanes=True
        ),
        "star pcie reduce 0B": lambda: simulate(pcie, _schedule(pcie, "star", "reduce", 1), 0),
        "ring schedule x2 allreduce 1MiB engine": lambda: simulate(
            h2, compile_.compile_ring_allreduce(16), 1 << 20, profile="nccl-simple"
        ),
        "rsag h1 allreduce 2MiB rendezvous": lambda: simulate(
            h1, compile_.compile_rsag_allreduce(8), 1 << 21, rendezvous=True
        ),
        "two_level x2 allreduce 1GiB k16 ll128-tree": lambda: simulate(
            h2,
            _schedule(h2, "two_level", "allreduce", 16, forward_lag=0),
            1 << 30,
            profile=tree["nccl-ll128"],
            **NCCL_TREE_RUN,
        ),
        "kary:4 x2 allreduce 64KiB k1 ll-tree": lambda: simulate(
            h2,
            _schedule(h2, "kary:4", "allreduce", 1, forward_lag=0),
            1 << 16,
            profile=tree["nccl-ll"],
            **NCCL_TREE_RUN,
        ),
        "ring lockstep pcie reduce_scatter 8MiB": lambda: simulate_ring(pcie, 1 << 23, collective="reduce_scatter"),
        "nvls h1 256MiB": lambda: simulate_nvls(h1, 1 << 28),
        "nvls_tree x2 1GiB ideal": lambda: simulate_nvls(h2, 1 << 30, profile="ideal"),
    }
    return runs[name]()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_engine_outputs_equal_the_pre_refactor_engine(name, loop):
    """Both event loops (the ``loop`` fixture: Python, and C where it builds) keep the numbers."""
    time_s, finish_sum, kind_bytes, peak, counters = EXPECTED[name]
    if name == "nvls h1 256MiB":
        fill = (time_s - 25e-6) / 32
        time_s, finish_sum = time_s + fill, finish_sum + 8 * fill
    r = _run(name)
    assert r.time == pytest.approx(time_s, rel=1e-12, abs=0)
    assert sum(r.finish) == pytest.approx(finish_sum, rel=1e-12, abs=0)
    assert r.kind_bytes == kind_bytes
    assert max(r.peak_scratch, default=0.0) == peak
    assert tuple(r.stats.get(k) for k in ("transfers", "subflows", "rate_updates")) == counters
    assert r.stats.get("loop") == (loop if counters[0] is not None else None)
