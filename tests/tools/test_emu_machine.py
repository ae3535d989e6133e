"""treecoll.tools.emucluster.machine: the emulating machine's cores as a roofline next to the simulator."""

from __future__ import annotations

import pytest
from treecoll.collectives import compile_plan
from treecoll.tools.emucluster import machine
from treecoll.topo.errors import TreecollError


def test_fit_recovers_rate_and_message_cost():
    truth = machine.MachineModel(1.5e9, 80e-6)
    samples = [
        (b, m, truth.time(b, m))
        for b, m in [
            (
                4e6,
                24,
            ),
            (64e6, 24),
            (16e6, 200),
            (1e6, 60),
        ]
    ]
    got = machine.fit(samples, "synthetic")
    assert got.copy_rate == pytest.approx(1.5e9, rel=1e-9)
    assert got.msg_cost == pytest.approx(80e-6, rel=1e-9)
    assert got.predict(1.0, 4e6, 24) == 1.0  # the link binds: simulator's time
    assert got.predict(1e-3, 4e6, 24) == pytest.approx(truth.time(4e6, 24))


def test_fit_refuses_what_it_cannot_tell_apart():
    with pytest.raises(TreecollError, match="expected >= 2 calibration samples with different bytes per message"):
        machine.fit([(1e6, 10, 0.01), (2e6, 20, 0.02)])
    with pytest.raises(TreecollError, match="non-positive cost per byte"):
        machine.fit([(1e6, 10, 0.02), (100e6, 10, 0.01)], "shrinking")  # more bytes, less time


def test_schedule_work_counts_every_send():
    n, p = 1 << 20, 4
    ring = compile_plan(None, "allreduce", p, algo="ring", nranks=p)
    total, msgs = machine.schedule_work(ring, n)
    assert total == 2 * (p - 1) * n  # 2(P-1) chunks of n/P per rank (reduce-scatter, all-gather), P ranks
    assert msgs == p * 2 * (p - 1)  # one message per chunk sent


def test_local_bytes_split_by_host_and_charged_at_the_loopback_rate():
    n, p = 1 << 20, 4
    ring = compile_plan(None, "allreduce", p, algo="ring", nranks=p)
    total, msgs = machine.schedule_work(ring, n)
    assert machine.local_bytes(ring, n, [0, 1, 0, 1]) == 0  # interleaved: every hop crosses
    blocked = machine.local_bytes(ring, n, [0, 0, 1, 1])  # hops 0->1 and 2->3 stay inside
    assert blocked == total // 2
    m = machine.MachineModel(1e9, 0.0, "t", local_rate=4e9)
    assert m.time(total, msgs, blocked) == pytest.approx(total / 2 / 1e9 + total / 2 / 4e9)
    assert machine.MachineModel(1e9, 0.0).time(total, msgs, blocked) == pytest.approx(total / 1e9)
    # calibration samples with local bytes: their loopback time is taken off before the fit
    truth = machine.MachineModel(1.5e9, 80e-6, local_rate=4e9)
    samples = [(b, k, truth.time(b, k, b / 2), b / 2) for b, k in [(4e6, 24), (64e6, 24), (16e6, 200)]]
    got = machine.fit(samples, "blocked", local_rate=4e9)
    assert (got.copy_rate, got.msg_cost, got.local_rate) == pytest.approx((1.5e9, 80e-6, 4e9), rel=1e-9)
    with pytest.raises(TreecollError, match="need local_rate"):
        machine.fit(samples, "blocked")
    with pytest.raises(TreecollError, match="local_rate > 0"):
        machine.MachineModel(1e9, 0.0, local_rate=0.0)


def test_machine_model_bound_fits_every_row_of_the_fastest_rate():
    """An in-sample bound: rows made by a known (C, C_loop, o) are recovered exactly and all fit;
    a row the form cannot follow is reported among the worst; slower rates are ignored."""
    from treecoll.tools.bench_emucluster import machine_model_bound

    c, cl, o = 2e9, 4e9, 100e-6

    def row(method, b, local, m, sim=0.0, scale=1.0):
        t = ((b - local) / c + local / cl + m * o) * scale
        return {
            "method": method,
            "bytes": b,
            "time": t,
            "predicted": sim,
            "work": {"bytes": b, "local_bytes": local, "messages": m},
        }

    rows = [
        row("gloo", 8 << 20, 0, 24),
        row("ring", 32 << 20, 0, 96),
        row("two_level", 16 << 20, 8 << 20, 320),
        row("binomial", 4 << 20, 1 << 20, 40),
        row("tiny", 1 << 10, 0, 4),
    ]
    fast = {"rate_bps": 10e9, "rows": rows}
    slow = {"rate_bps": 1e9, "rows": [row("gloo", 8 << 20, 0, 24, scale=5.0)]}
    b = machine_model_bound([fast, slow])
    assert b["rows"] == 4 and b["within_25pct"] == 4  # 1 KiB row below min_bytes, slow case ignored
    assert b["s_per_cross_byte"] == pytest.approx(1 / c) and b["s_per_message"] == pytest.approx(o)
    rows.append(row("odd", 8 << 20, 0, 24, scale=3.0))  # the work of the gloo row, 3x its time
    b = machine_model_bound([fast])
    assert "odd" in [w["method"] for w in b["worst"]] and b["within_25pct"] < b["rows"] == 5
    assert machine_model_bound([{"rate_bps": 1.0, "rows": rows[:2]}]) is None


def test_repetitions_fill_the_budget_for_short_collectives():
    from treecoll.tools.bench_emucluster import MAX_REPS, repetitions

    assert repetitions(64 << 20, 0.8, 7, 1.0) == 7  # long: the floor
    assert repetitions(1 << 20, 0.05, 7, 1.0) == 20  # 1 s / 50 ms
    assert repetitions(1 << 20, 0.001, 7, 1.0) == MAX_REPS  # capped
    assert repetitions(4096, 0.5, 3, 1.0) == 10  # below 1 MiB at least 10
    assert repetitions(1 << 20, 0.001, 7, 0.0) == 7  # no budget: exactly --reps
