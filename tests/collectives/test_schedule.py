"""Schedule validation: the linear-time deadlock check against a plain round-robin reference,
and compiled schedules against a step-by-step reference of the event order."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
from treecoll.collectives import compile as compile_
from treecoll.collectives.builders import build
from treecoll.collectives.schedule import Schedule, Step
from treecoll.collectives.tree import Tree
from treecoll.topo.errors import ScheduleError


def _reference_deadlock(steps, what: str):
    """The round-robin fixpoint (rescan every rank until nothing starts): the error message or None."""
    n = len(steps)
    ordinal, count = [], defaultdict(int)
    for r, lst in enumerate(steps):
        o = []
        for s in lst:
            if s.kind == "reduce":
                o.append(-1)
                continue
            key = (s.kind, r, s.peer, s.chunk) if s.kind == "send" else (s.kind, s.peer, r, s.chunk)
            o.append(count[key])
            count[key] += 1
        ordinal.append(o)
    started, issued = [0] * n, defaultdict(int)

    def complete(r, i):
        s = steps[r][i]
        return s.kind != "recv" or issued[(s.peer, r, s.chunk)] > ordinal[r][i]

    progress = True
    while progress:
        progress = False
        for r in range(n):
            while started[r] < len(steps[r]) and all(complete(r, d) for d in steps[r][started[r]].deps):
                s = steps[r][started[r]]
                if s.kind == "send":
                    issued[(r, s.peer, s.chunk)] += 1
                started[r] += 1
                progress = True
    for r in range(n):
        for i in range(len(steps[r])):
            if i >= started[r] or not complete(r, i):
                s = steps[r][i]
                i2 = i if i < started[r] else next(d for d in s.deps if not complete(r, d))
                s2 = steps[r][i2]
                return (
                    f"{what}: deadlock: rank {r} waits forever at step {i2} "
                    f"({s2.kind} chunk {s2.chunk} from rank {s2.peer})"
                )
    return None


def _random_steps(rng: random.Random, n: int, msgs: int):
    """Matched sends/recvs in random per-rank order; a send may wait for the sender's last reduce."""
    steps = [[] for _ in range(n)]
    last_reduce = [None] * n
    for _ in range(msgs):
        src, dst = rng.sample(range(n), 2)
        chunk = rng.randrange(2)
        deps = (last_reduce[src],) if last_reduce[src] is not None and rng.random() < 0.7 else ()
        steps[src].append(Step("send", chunk, peer=dst, deps=deps))
        steps[dst].append(Step("recv", chunk, peer=src, slot=1))
        steps[dst].append(Step("reduce", chunk, slot=1, deps=(len(steps[dst]) - 1,)))
        last_reduce[dst] = len(steps[dst]) - 1
    return tuple(tuple(lst) for lst in steps)


def _reorder(rng: random.Random, steps):
    """Move one rank's send earlier or later (deps remapped), which may create a circular wait."""
    r = rng.randrange(len(steps))
    lst = list(steps[r])
    sends = [i for i, s in enumerate(lst) if s.kind == "send" and not s.deps]
    if not sends:
        return steps
    i = rng.choice(sends)
    j = rng.randrange(len(lst))
    order = list(range(len(lst)))
    order.insert(j, order.pop(i))
    pos = {old: new for new, old in enumerate(order)}
    new = []
    for old in order:
        s = lst[old]
        deps = tuple(pos[d] for d in s.deps)
        if any(d >= len(new) for d in deps):
            return steps
        new.append(Step(s.kind, s.chunk, peer=s.peer, slot=s.slot, deps=deps, right=s.right))
    return tuple(tuple(new) if k == r else steps[k] for k in range(len(steps)))


@pytest.mark.parametrize("seed", range(40))
def test_deadlock_check_matches_round_robin_reference(seed):
    rng = random.Random(seed)
    steps = _random_steps(rng, rng.randrange(2, 5), rng.randrange(1, 9))
    for _ in range(rng.randrange(0, 3)):
        steps = _reorder(rng, steps)
    expected = _reference_deadlock(steps, "schedule 'allreduce'")
    if expected is None:
        assert Schedule("allreduce", len(steps), 2, steps).nranks == len(steps)
    else:
        with pytest.raises(ScheduleError, match="deadlock") as e:
            Schedule("allreduce", len(steps), 2, steps)
        assert str(e.value) == expected


def test_random_cases_include_deadlocks_and_valid_schedules():
    outcomes = set()
    for seed in range(40):
        rng = random.Random(seed)
        steps = _random_steps(rng, rng.randrange(2, 5), rng.randrange(1, 9))
        for _ in range(rng.randrange(0, 3)):
            steps = _reorder(rng, steps)
        outcomes.add(_reference_deadlock(steps, "s") is None)
    assert outcomes == {True, False}


def _reference_event_order(t: Tree, k: int, lag: int):
    """Per rank, (time, phase, chunk) of a single-tree allreduce using Tree.depth/height directly;
    an inner rank fetches chunk j at its broadcast time and forwards it ``lag`` steps later."""
    sub = {}
    for r in t.postorder():
        sub[r] = max((sub[c] + 1 for c in t.children[r]), default=0)
    ev = [[] for _ in range(t.size)]
    for j in range(k):
        for r in range(t.size):
            ev[r].append((j + sub[r], 0, j, "up"))
            at = j + t.height + t.depth(r)
            inner = t.parents[r] != -1 and t.children[r]
            if inner:
                ev[r].append((at, 1, j, "fetch"))
            ev[r].append((at + (lag if inner else 0), 1, j, "down"))
    return [[(e[3], e[2]) for e in sorted(lst, key=lambda e: (e[0], e[1], e[2]))] for lst in ev]


@pytest.mark.parametrize("lag", [0, compile_.FORWARD_LAG])
@pytest.mark.parametrize("name,n,k", [("chain", 6, 3), ("binomial", 13, 4), ("kary:3", 10, 2), ("star", 5, 5)])
def test_events_follow_tree_depth_and_height(name, n, k, lag):
    t = build(name, nranks=n)
    ev = compile_._events(compile_.as_multi(t), k, ("up", "down"), lag)
    assert [[(e[4], e[3]) for e in lst] for lst in ev] == _reference_event_order(t, k, lag)


def test_forward_lag_moves_only_an_inner_ranks_forwarding():
    t = build("chain", nranks=3)  # 0 <- 1 <- 2: rank 1 is the only inner rank
    now, late = (compile_.compile_allreduce(t, 6, forward_lag=g) for g in (0, 3))
    assert now.steps[0] == late.steps[0] and now.steps[2] == late.steps[2]

    def ups_before_first_forward(sched):
        steps = sched.steps[1]
        first = next(i for i, s in enumerate(steps) if s.kind == "send" and s.peer == 2)
        return sum(1 for s in steps[:first] if s.kind == "send" and s.peer == 0)

    assert ups_before_first_forward(late) == ups_before_first_forward(now) + 3
    fwd = [i for i, s in enumerate(late.steps[1]) if s.kind == "send" and s.peer == 2]
    got = [i for i, s in enumerate(late.steps[1]) if s.kind == "recv" and s.peer == 0]
    assert all(f > g for f, g in zip(fwd, got))  # each chunk received before it is forwarded
    with pytest.raises(ScheduleError, match="forward_lag expected an integer >= 0, got -1"):
        compile_.compile_allreduce(t, 2, forward_lag=-1)


def test_lanes_are_one_stream_per_tree_and_phase():
    """Lane of every step: tree ti's reduce-up in lane 2 ti and its broadcast-down in 2 ti + 1 (a
    single-phase collective: lane ti), as NCCL runs each tree on its own channels, up and down in
    separate thread groups; the executor ignores lanes (list order stays valid)."""
    from treecoll.collectives import MultiTree

    a = build("chain", nranks=4)
    multi = MultiTree((a, a.relabel([3, 2, 1, 0])))
    k = 3
    s = compile_.compile_allreduce(multi, k, forward_lag=0)
    for r, lst in enumerate(s.steps):
        for st in lst:
            ti = st.chunk // k
            t = multi.trees[ti]
            down = (st.kind == "recv" and st.slot == 0) or (st.kind == "send" and st.peer in t.children[r])
            assert st.lane == 2 * ti + down, (r, st)
    b = compile_.compile_broadcast(multi, k, root=0)
    assert {(st.chunk // k, st.lane) for lst in b.steps for st in lst} <= {(0, 0), (1, 1)}
    assert {st.lane for lst in compile_.compile_ring_allreduce(4).steps for st in lst} == {0}
    assert s.as_dict()["steps"][0][0]["lane"] == s.steps[0][0].lane
    with pytest.raises(ScheduleError, match="step lane: expected an integer >= 0, got -1"):
        Step("send", 0, peer=1, lane=-1)


def test_rank_programs_check_every_tree_edge(monkeypatch):
    """A tree schedule is made from the distinct rank programs (ranks whose trees look alike share
    one); their check finds a program whose messages its peers do not expect."""
    t = build("kary:3", nranks=13)
    assert compile_._emit(compile_.as_multi(t), 2, ("up", "down"), None, "t", "allreduce").steps == (
        compile_.compile_allreduce(t, 2).steps
    )
    real = compile_._rank_steps

    def one_send_short(multi, r, peers, *args):
        steps = real(multi, r, peers, *args)
        return steps[:-1] if r == 1 else steps  # rank 1's last step is a send to a child

    monkeypatch.setattr(compile_, "_rank_steps", one_send_short)
    with pytest.raises(ScheduleError, match=r"compile kary:3/allreduce: the messages of rank \d+ and rank 1 in tree 0"):
        compile_.compile_allreduce(t, 2)
