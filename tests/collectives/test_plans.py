"""Trees, multitrees, schedules and the schedule compiler (no processes)."""

from __future__ import annotations

import pytest
from treecoll.collectives import (
    MultiTree,
    Schedule,
    Step,
    Tree,
    build,
    compile_allgather,
    compile_allreduce,
    compile_broadcast,
    compile_reduce,
    compile_reduce_scatter,
    compile_ring_allreduce,
    compile_rsag_allreduce,
)
from treecoll.collectives.compile import compile_plan, merge_schedules
from treecoll.topo.errors import ScheduleError, TreeError

MODULES = [
    "tree",
    "schedule",
    "builders",
    "compile",
    "cost",
    "ops",
    "layout",
    "local",
    "nccl_model",
    "tree_io",
    "bruteforce",
    "execute",
    "group",
    "sim_nvls",
]


# ---------------------------------------------------------------------- Tree and MultiTree
@pytest.mark.parametrize(
    "parents, match",
    [
        ([], "at least one rank"),
        ([-1, -1], "exactly one root"),
        ([-1, 5], "parent of rank 1 is 5"),
        ([-1, 1], "rank 1 is its own parent"),
        ([-1, 2, 1], r"ranks \[1, 2\] are not connected"),
        ([-1, "0"], "parent of rank 1 expected an integer"),
    ],
)
def test_tree_rejects_invalid_parents(parents, match):
    with pytest.raises(TreeError, match=match):
        Tree(tuple(parents))


def test_tree_children_must_agree_with_parents():
    with pytest.raises(TreeError, match="children of rank 0 are"):
        Tree((-1, 0, 0), ((1,), (2,), ()))
    with pytest.raises(TreeError, match="rank 1 has two parents"):
        Tree.from_children([[1], [], [1]])


def test_tree_queries_and_fingerprint():
    t = Tree.from_children([[2, 1], [3], [], []])
    assert t.root == 0 and t.height == 2 and t.depth(3) == 2
    assert t.postorder() == (2, 3, 1, 0)
    assert t.fingerprint() != Tree.from_parents(t.parents).fingerprint()  # child order counts
    assert not t.is_order_preserving()
    assert Tree.from_parents([-1, 0, 1, 0]).is_order_preserving()
    assert not Tree.from_parents([-1, 0, 0, 1]).is_order_preserving()  # subtree of 1 = {1, 3}
    r = t.relabel([3, 2, 1, 0])
    assert r.root == 3 and r.children[3] == (1, 2)


def test_multitree_validation():
    a, b = Tree.from_parents([-1, 0]), Tree.from_parents([-1, 0, 0])
    with pytest.raises(TreeError, match="same ranks"):
        MultiTree((a, b))
    with pytest.raises(TreeError, match="shares expected 2 positive fractions"):
        MultiTree((a, a), (0.5, 0.6))
    m = MultiTree((a, Tree.from_parents([1, -1])))
    assert m.shares == (0.5, 0.5) and m.roots == (0, 1)
    assert m.fingerprint() != MultiTree((a, Tree.from_parents([1, -1])), (0.25, 0.75)).fingerprint()


# ---------------------------------------------------------------------- Schedule validation
def test_schedule_detects_unmatched_and_deadlock():
    with pytest.raises(ScheduleError, match="rank 1 sends chunk 0 to rank 0 1 time"):
        Schedule("reduce", 2, 1, ((), (Step("send", 0, peer=0),)), root=0)

    # both ranks wait for the other's data before sending: a circular wait
    def lst(peer):
        return (
            Step("recv", 0, peer=peer, slot=1),
            Step("reduce", 0, slot=1, deps=(0,)),
            Step("send", 0, peer=peer, deps=(1,)),
        )

    with pytest.raises(ScheduleError, match="deadlock: rank 0 waits forever"):
        Schedule("allreduce", 2, 1, (lst(1), lst(0)))
    with pytest.raises(ScheduleError, match="dependency 3 must be an earlier step"):
        Schedule("allreduce", 1, 1, ((Step("reduce", 0, slot=1, deps=(3,)),),))
    with pytest.raises(ScheduleError, match="needs a root"):
        Schedule("reduce", 2, 1, ((), ()))


# ---------------------------------------------------------------------- compiler
TREES = [build(n, nranks=p) for n in ("chain", "binomial", "kary:3", "star") for p in (1, 2, 5, 8)]


@pytest.mark.parametrize("tree", TREES, ids=lambda t: f"{t.name}-{t.size}")
@pytest.mark.parametrize("k", [1, 3])
def test_tree_schedules_move_the_expected_bytes(tree, k):
    n, nbytes = tree.size, 3000
    red = compile_reduce(tree, k)
    for r in range(n):
        assert red.bytes_sent(r, nbytes) == (0 if r == tree.root else nbytes)
        assert red.bytes_received(r, nbytes) == len(tree.children[r]) * nbytes
    bc = compile_broadcast(tree, k)
    for r in range(n):
        assert bc.bytes_received(r, nbytes) == (0 if r == tree.root else nbytes)
    ar = compile_allreduce(tree, k)
    assert sum(ar.bytes_sent(r, nbytes) for r in range(n)) == 2 * (n - 1) * nbytes
    assert ar.nchunks == k and red.root == tree.root


@pytest.mark.parametrize("n", [2, 3, 5])
def test_ring_and_rsag_send_two_p_minus_one_over_p(n):
    nbytes = 60 * n
    for s in (
        compile_ring_allreduce(n),
        compile_ring_allreduce(n, 2 * n, order=list(reversed(range(n)))),
        compile_rsag_allreduce(n),
        compile_rsag_allreduce(n, 3 * n),
    ):
        for r in range(n):
            assert s.bytes_sent(r, nbytes) == 2 * (n - 1) * nbytes // n
    rs, ag = compile_reduce_scatter(n), compile_allgather(n)
    assert rs.owners == tuple(range(n)) and ag.collective == "allgather"
    with pytest.raises(ScheduleError, match="multiple of nranks"):
        compile_ring_allreduce(n, n + 1)


def test_reduce_and_broadcast_to_another_root_add_one_hop():
    t = build("binomial", nranks=4)
    s = compile_reduce(t, 2, root=3)
    assert s.root == 3
    assert s.bytes_sent(0, 100) == 100 and s.bytes_received(3, 100) == 100  # tree root -> 3
    b = compile_broadcast(t, 1, root=3)
    assert b.bytes_sent(3, 100) == 100 and b.bytes_received(3, 100) == 0  # 3 -> tree root only
    assert sum(b.bytes_received(r, 100) for r in range(4)) == 300


def test_multitree_splits_chunks_between_trees():
    m = build("double_binary", nranks=6)
    s = compile_allreduce(m, 2)
    assert s.nchunks == 4 and s.shares == pytest.approx((0.25,) * 4)
    with pytest.raises(ScheduleError, match="different roots"):
        compile_reduce(m)
    assert compile_reduce(m, root=2).root == 2


def test_compile_plan_dispatch_and_merge():
    t = build("chain", nranks=3)
    assert compile_plan(t, "broadcast").collective == "broadcast"
    assert compile_plan(None, "allreduce", 4, algo="ring", nranks=3).nchunks == 6
    with pytest.raises(ScheduleError, match="algo expected one of"):
        compile_plan(t, "allreduce", algo="bogus")
    with pytest.raises(ScheduleError, match="allreduce only"):
        compile_plan(t, "reduce", algo="ring")
    m = merge_schedules([compile_ring_allreduce(3), compile_ring_allreduce(3, order=[0, 2, 1])], [0.25, 0.75])
    assert m.nchunks == 6 and sum(m.shares[:3]) == pytest.approx(0.25)
    assert m.bytes_sent(0, 600) == 2 * 2 * 600 // 3
