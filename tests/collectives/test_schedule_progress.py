"""Every schedule the planner may run completes: each candidate of ``auto`` (``builders._candidates``, the
tree ``auto`` returns) compiled for allreduce, reduce and broadcast at 1, 2, 3, 4 and 8 chunks, run through the
executor simulation (:func:`treecoll.collectives.sim.executor.simulate_executor_schedule`: in-order
connections per pair of ranks, a message held until its receive is posted).

The simulation holds a message that waits for its receive in front of the later messages of the same
pair. gloo does not: its TCP pair keeps the sends waiting for a receive per tag and sends each when the
peer posts that tag's receive (``localPendingSend_`` and ``NOTIFY_RECV_READY`` in
https://github.com/facebookincubator/gloo ``gloo/transport/tcp/pair.cc``), and the executor tags every
chunk. Where the two orders of a pair's messages differ (the sender's sends against the receiver's
receives, which several trees sharing a pair in opposite directions produce), the simulation can stall
while gloo completes; the real-process test below runs such schedules.
"""

from __future__ import annotations

from functools import cache

import pytest
from treecoll.collectives import builders
from treecoll.collectives.compile import compile_plan
from treecoll.collectives.executor_cost import executor_cost
from treecoll.collectives.placement import Placement
from treecoll.collectives.sim.executor import simulate_executor_schedule
from treecoll.collectives.tree import as_multi
from treecoll.topo.errors import CollectiveError
from treecoll.topo.yaml_io import shipped as shipped_path

from treecoll import topo

COLLECTIVES = ("allreduce", "reduce", "broadcast")
CHUNKS = (1, 2, 3, 4, 8)


@cache
def _loaded(name: str):
    return topo.load(shipped_path(name))


def candidate_schedules(topology: str, ranks: int | tuple[int, ...], nbytes: int):
    """(label, plan, collective, root, chunks, schedule) for every candidate of ``auto`` on ``ranks`` of
    ``topology`` (a count of its first GPUs, or their topology ranks)."""
    p = Placement(_loaded(topology), ranks if isinstance(ranks, int) else list(ranks))
    nranks = p.nranks
    plans = builders._candidates(p.topology, p.gpus, nranks, nbytes, None)
    plans.append(builders.build("auto", p, nbytes=nbytes))
    for plan in plans:
        for coll in COLLECTIVES:
            root = None if coll == "allreduce" else as_multi(plan).roots[0]
            for k in CHUNKS:
                yield (
                    f"{topology}/{nranks} {plan.name} {coll} x{k}",
                    plan,
                    coll,
                    root,
                    k,
                    compile_plan(plan, coll, k, root=root),
                )


@cache
def stalled_in_simulation(topology: str, ranks: int | tuple[int, ...], nbytes: int) -> tuple[tuple, ...]:
    """The candidate schedules the executor simulation cannot finish, and whether their pair orders agree."""
    p = Placement(_loaded(topology), ranks if isinstance(ranks, int) else list(ranks))
    o = executor_cost(p).step_s
    out = []
    for label, plan, coll, root, k, sched in candidate_schedules(topology, ranks, nbytes):
        try:
            simulate_executor_schedule(p, sched, nbytes, step_cost=o)
        except CollectiveError:
            out.append((label, plan, coll, root, k, sched.pair_order_conflict() is None))
    return tuple(out)


@pytest.mark.parametrize("topology, ranks", [("dgx-a100", 4), ("cpu-local", 4), ("dgx-h100-x2", (0, 1, 8, 9))])
def test_only_schedules_whose_pair_orders_differ_stall_in_the_simulation(topology, ranks):
    """On 4 ranks of small shipped machines (two hosts for dgx-h100-x2), 1 MiB: a schedule whose every
    pair sends in the order it receives completes in the simulation (a stall there would be a real
    deadlock); the ones that stall are multi-tree schedules whose pair orders differ (gloo runs them: the
    next test)."""
    stalled = stalled_in_simulation(topology, ranks, 1 << 20)
    assert [s[0] for s in stalled if s[5]] == []
    assert all(len(as_multi(s[1]).trees) > 1 for s in stalled)
    if topology == "dgx-a100":  # the multi-rail trees of one DGX A100 (eight NICs) share pairs both ways
        assert stalled, "expected the dgx-a100 rails trees to stall in the simulation"


def test_schedules_that_stall_in_the_simulation_complete_over_gloo(pool4):
    """The schedules of 4 dgx-a100 ranks that the simulation cannot finish (the rails multitrees' reduce
    and broadcast), run by the executor over 4 gloo processes: every result right, no wait reaching its
    20 s timeout."""
    from tests.collectives import _coll_tasks as tasks

    stalled = stalled_in_simulation("dgx-a100", 4, 1 << 20)
    cases = [
        (coll, plan, "sum", k, root, 7, i, "tree", None, None) for i, (_, plan, coll, root, k, _) in enumerate(stalled)
    ]
    assert cases
    results = pool4.run(tasks.run_cases, cases, timeout=180)
    for r, res in enumerate(results):
        assert all(res), f"rank {r}: failing cases {[stalled[i][0] for i, ok in enumerate(res) if not ok]}"


def _stalled_allreduce():
    """A dgx-a100 rails multitree whose allreduce schedule's pair orders differ, with its chunk count."""
    for _, plan, _, _, k, _ in stalled_in_simulation("dgx-a100", 4, 1 << 20):
        sched = compile_plan(plan, "allreduce", k)
        if sched.pair_order_conflict() is not None:
            return plan, k
    pytest.skip("no dgx-a100 candidate whose allreduce pair orders differ")


def test_single_tree_schedules_keep_every_pair_in_order():
    """A single tree's schedule never needs tags: each pair's sends and receives come in one order."""
    for topology, ranks in (("dgx-a100", 4), ("dgx-h100-x2", (0, 1, 8, 9))):
        for label, plan, _, _, _, sched in candidate_schedules(topology, ranks, 1 << 20):
            if len(as_multi(plan).trees) == 1:
                assert sched.pair_order_conflict() is None, label


def test_pair_order_conflict_is_refused_where_messages_match_in_posting_order():
    """On a transport that matches a pair's messages in posting order (NCCL; here the in-process fabric
    with ``by_tag=False``) an explicit multitree whose pair orders differ raises before any message,
    naming the pair; matched by tag (gloo) the same call gives the right sum."""
    import torch
    from treecoll.collectives.execute import CollectiveOptions, allreduce
    from treecoll.collectives.local import run_ranks

    plan, k = _stalled_allreduce()
    a, b, sent, got = compile_plan(plan, "allreduce", k).pair_order_conflict()
    opts = CollectiveOptions(nchunks=k, timeout=10.0)

    def call(r, t):
        return allreduce(torch.arange(64.0) * (r + 1), tree=plan, options=opts, _transport=t)

    with pytest.raises(CollectiveError, match=rf"rank {a} sends rank {b} chunk {sent} where rank {b} receives"):
        run_ranks(4, call, by_tag=False)
    for out in run_ranks(4, call):
        assert out.tolist() == (torch.arange(64.0) * 10).tolist()


def test_auto_runs_its_first_tree_alone_where_messages_match_in_posting_order(monkeypatch):
    """When ``auto`` chose a multitree whose pair orders differ and the transport matches in posting
    order, the call runs the multitree's first tree alone: the right sum, no error."""
    import torch
    from treecoll.collectives import execute
    from treecoll.collectives.local import run_ranks
    from treecoll.collectives.planner import Planner
    from treecoll.collectives.tree import MultiTree, Tree

    plan, k = _stalled_allreduce()
    planner = Planner()
    chosen = []
    real_plan_for = Planner.plan_for

    def plan_for(self, tree, **kw):
        chosen.append(tree)
        return plan if tree is None else real_plan_for(self, tree, **kw)

    monkeypatch.setattr(Planner, "plan_for", plan_for)
    monkeypatch.setattr(execute, "default_planner", lambda: planner)
    opts = execute.CollectiveOptions(nchunks=k, timeout=10.0, check=False)
    outs = run_ranks(
        4,
        lambda r, t: execute.allreduce(torch.arange(64.0) * (r + 1), options=opts, _transport=t),
        by_tag=False,
    )
    assert all(o.tolist() == (torch.arange(64.0) * 10).tolist() for o in outs)
    assert isinstance(plan, MultiTree) and any(isinstance(t, Tree) and t == plan.trees[0] for t in chosen)
