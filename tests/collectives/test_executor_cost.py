"""The executor's and the backends' own costs in software (:mod:`treecoll.collectives.executor_cost`): which
backend a placement is planned for, and the fitted costs at, between and beyond the fitted process counts."""

from __future__ import annotations

import pytest
from treecoll.collectives.executor_cost import GLOO_BY_NRANKS, backend_of, executor_cost
from treecoll.collectives.placement import Placement
from treecoll.topo.errors import TreeError

from tests.helpers import shipped


def test_backend_of_cpu_slots_and_gpus():
    """CPU process slots and no topology are planned for gloo, GPUs for NCCL."""
    assert backend_of(Placement(ranks=3)) == "gloo"
    assert backend_of(Placement(shipped("cpu-local"))) == "gloo"
    assert backend_of(Placement(shipped("dgx-h100"))) == "nccl"


def test_unknown_backend_is_named():
    with pytest.raises(TreeError, match=r"executor cost: backend expected one of \['gloo', 'nccl'\], got 'mpi'"):
        executor_cost(Placement(ranks=2), "mpi")


def test_gloo_costs_between_and_beyond_the_fitted_counts():
    """Between two fitted process counts the costs (per message, per native step, per call) are linear in
    the count; outside them, the nearest fitted count's."""

    (p0, s0, n0, c0), (p1, s1, n1, c1) = GLOO_BY_NRANKS[0][:4], GLOO_BY_NRANKS[1][:4]
    assert p1 - p0 >= 2, "two neighbouring fitted counts with a count between them"
    mid = executor_cost(Placement(ranks=(p0 + p1) // 2))
    w = ((p0 + p1) // 2 - p0) / (p1 - p0)
    assert mid.step_s == pytest.approx((1 - w) * s0 + w * s1) and mid.native_step_s == pytest.approx(
        (1 - w) * n0 + w * n1
    )
    assert mid.call_s == pytest.approx((1 - w) * c0 + w * c1)
    assert executor_cost(Placement(ranks=1)).step_s == s0
    p_last, _, n_last, c_last = GLOO_BY_NRANKS[-1][:4]
    beyond = executor_cost(Placement(ranks=4 * p_last))
    assert beyond.native_step_s == n_last and beyond.call_s == c_last
