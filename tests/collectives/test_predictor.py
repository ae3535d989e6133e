"""One predictor: the planner's cost model against the executor simulation, the executor's
per-message cost in closed form, the commands printing the same number for the same case, and
``auto`` running the backend's own allreduce where the model says it is faster (real gloo ranks)."""

from __future__ import annotations

import functools
import json

import pytest
from treecoll.collectives.builders import build
from treecoll.collectives.compile import compile_allreduce
from treecoll.collectives.cost import MSG_OVERHEAD, CostModel, uniform_topology
from treecoll.collectives.executor_cost import EXECUTOR_COSTS, GLOO_BY_NRANKS
from treecoll.collectives.placement import Placement
from treecoll.collectives.planner import default_planner
from treecoll.collectives.sim.executor import predict_schedule, predict_tree, simulate_executor_schedule
from treecoll.collectives.tree import as_multi
from treecoll.tools.cli import main
from treecoll.topo.errors import CollectiveError

from tests.collectives import _coll_tasks as tasks
from tests.helpers import SHIPPED, shipped

#: builders compared (auto is whichever tree the cost model itself ranks first: not a fixed shape)
BUILDERS = ("chain", "binomial", "kary:4", "star", "double_binary", "two_level")
#: latency-bound, mid, pipelined, bandwidth-bound
SIZES = (8, 64 << 10, 4 << 20, 64 << 20)
#: every case within this of the simulation
MAX_ERROR = 0.10


@functools.cache
def _placement(name: str) -> Placement:
    t = shipped(name)
    return Placement(t, min(len(t.rank_gpus()), 16))  # two hosts of the multi-host machines


def _links_seen(p: Placement) -> tuple:
    """What a simulation of ``p`` sees: every pair's latency and routes (links numbered in order of
    first use, with their bandwidth and latency) and every GPU's memory bandwidth. Two placements
    that see the same get the same prediction from the model and from the simulation."""
    g, ids, pairs = p.topology.graph, {}, []
    for a in p.gpus:
        for b in p.gpus:
            if a != b:
                path = p.topology.path(a, b)
                routes = tuple(
                    (tuple((ids.setdefault(e, len(ids)), g.edges[e]["bw"]) for e in zip(ns, ns[1:])), share)
                    for ns, share in path.routes
                )
                pairs.append((path.lat, tuple(g.nodes[x].get("lat") for x in path.nodes), routes))
    return tuple(pairs), tuple(g.nodes[x].get("mem_bw") for x in p.gpus)


def test_cost_model_tracks_the_executor_simulation():
    """The planner's model (collectives.cost: the schedule stepped through with simpler link
    sharing) and the flow simulation of the same schedule as the executor runs it
    (collectives.sim.executor), for every builder on every shipped topology (its first 16 GPUs)
    at four sizes, at the chunk count the planner picks: every case within MAX_ERROR."""
    errors, seen, same = {}, {}, {}
    for name in SHIPPED:
        p = _placement(name)
        view = seen.setdefault(_links_seen(p), name)  # the 16 GPUs of dgx-h100-x2, -x16, -x1024 look alike
        for b in BUILDERS:
            for n in SIZES:
                plan, sched = default_planner().schedule_for(
                    b, collective="allreduce", nbytes=n, placement=p, algo="tree"
                )
                k = sched.nchunks // len(as_multi(plan))
                case = (view, plan.fingerprint(), n)
                if case not in same:  # star and two_level on one host are one tree: simulated once
                    model = CostModel(p, step_through=True).tree_time(plan, n, "allreduce", k)
                    same[case] = model / predict_schedule(p, plan, n).time - 1
                errors[(name, b, n, k)] = same[case]
    assert len(errors) == len(SHIPPED) * len(BUILDERS) * len(SIZES) and len(same) < len(errors)
    outside = {c: round(e, 3) for c, e in errors.items() if abs(e) > MAX_ERROR}
    assert not outside, outside


def test_executor_messages_in_closed_form():
    """On free links a one-chunk allreduce costs its messages in a row: a chain of P ranks
    2 (P - 1) (a receive is posted while the child's send is issued, the result comes back the
    same way), a star 2 (P - 1) (the root posts P - 1 receives, then sends P - 1 results)."""
    o = 1e-3
    for P in (2, 3, 5):
        free = Placement(uniform_topology(P, bw=1e3, lat=0.0), P)
        for shape in ("chain", "star"):
            tree = build(shape, nranks=P)
            r = simulate_executor_schedule(free, compile_allreduce(tree, 1), 8, step_cost=o)
            assert r.time == pytest.approx(2 * (P - 1) * o, rel=1e-6), (shape, P)
            # the planner's model steps through the same schedule
            model = CostModel(free, msg_overhead=o, step_through=True)
            assert model.tree_time(tree, 8) == pytest.approx(2 * (P - 1) * o, rel=1e-6)
    # with a link latency L per hop (uniform: two links of L), each message adds its path
    lat = 0.5
    one = Placement(uniform_topology(2, bw=1e3, lat=lat), 2)
    r = simulate_executor_schedule(one, compile_allreduce(build("chain", nranks=2), 1), 8, step_cost=o)
    assert r.time == pytest.approx(2 * o + 2 * 2 * lat * 1e-6, rel=1e-6)


def test_modes_and_backends():
    p = _placement("dgx-h100-x2")
    assert CostModel(p).backend == "nccl" and CostModel(Placement(ranks=4)).backend == "gloo"
    assert CostModel(p).msg_overhead == EXECUTOR_COSTS["nccl"].step_s
    assert CostModel(p, msg_overhead=MSG_OVERHEAD).msg_overhead == MSG_OVERHEAD
    with pytest.raises(CollectiveError, match="mode: expected one of"):
        predict_tree(p, "binomial", 8, mode="fast")


def _json(capsys, *argv) -> dict:
    assert main([*map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_commands_print_one_number_per_case(capsys):
    """tree build, simulate allreduce and simulate decode print the same prediction of the same
    tree (two_level on the default topology, the 16512 B packed state of Llama-3.1-8B attention),
    say which mode it is, and the lower bound tree build prints is below every number beside it."""
    n = 16512
    for mode in ("executor", "in-kernel"):
        built = _json(
            capsys, "tree", "build", "--topology", "default", "--builder", "two_level", "--bytes", n, "--mode", mode
        )
        sim = _json(
            capsys,
            "simulate",
            "allreduce",
            "--topology",
            "default",
            "--algo",
            "two_level,nccl",
            "--sizes",
            n,
            "--mode",
            mode,
        )
        pred = built["predicted"]
        assert pred["mode"] == mode and sim["mode"] == mode
        cell = sim["rows"][0]["algos"]
        assert cell["two_level"]["mode"] == mode and cell["nccl"]["mode"] == "in-kernel"
        assert pred["allreduce"]["time_us"] == pytest.approx(cell["two_level"]["time_us"], rel=1e-9)
        assert min(v["time_us"] for v in pred["nccl"].values()) == pytest.approx(cell["nccl"]["time_us"], rel=1e-9)
        shown = [pred[c]["time_us"] for c in ("reduce", "broadcast", "allreduce")]
        shown += [v["time_us"] for v in pred["nccl"].values()]
        assert all(pred["lower_bound_allreduce_us"] <= s for s in shown)
    # the decode model's tree combine is tree build's allreduce of the same tree (no rails: one tree)
    built = _json(
        capsys, "tree", "build", "--topology", "default", "--builder", "two_level", "--rails", "no", "--bytes", n
    )
    dec = _json(
        capsys,
        "simulate",
        "decode",
        "--topology",
        "default",
        "--seq-len",
        "32k",
        "--heads",
        32,
        "--kv-heads",
        8,
        "--head-dim",
        128,
    )
    assert dec["mode"] == "executor"
    assert dec["runs"][0]["methods"]["tree"]["combine_s"] * 1e6 == pytest.approx(
        built["predicted"]["allreduce"]["time_us"], rel=1e-9
    )


def test_auto_runs_the_backends_allreduce_where_the_model_says_it_is_faster(pool4):
    """Four gloo ranks: allreduce(x) with its defaults runs torch.distributed.all_reduce exactly
    where the planner predicts it no slower, the result is right either way, and an explicit tree
    or a user operator never does. With the fitted costs the model keeps treecoll's trees at these
    sizes (gloo's own allreduce pays more per ring step here than the executor per message); with
    the executor's per-message cost made 100 times larger it hands every size to gloo."""
    sizes = [8, 4 << 10, 1 << 20, 4 << 20]
    prefers = set()
    for step_s in (None, 100 * EXECUTOR_COSTS["gloo"].step_s):
        res = pool4.run(tasks.native_choice, sizes, step_s, timeout=240)
        for per_rank in res:
            *by_size, (_, other_native, _, _) = per_rank
            for n, native, prefer, correct in by_size:
                assert correct and native == prefer, (n, step_s)
                prefers.add(prefer)
            assert not other_native
    assert prefers == {True, False}


@pytest.mark.parametrize("row", range(len(GLOO_BY_NRANKS)))
def test_gloo_plans_cost_the_fit_of_their_process_count(row):
    """A gloo plan at P processes is costed with the executor and native times fitted at P
    (GLOO_BY_NRANKS), by the planner's model and by the executor simulation alike: on free links a
    one-chunk chain allreduce is 2 (P - 1) executor messages in a row (test above) and gloo's own ring
    allreduce 2 (P - 1) of its steps, each at P's fit, not at the fit pooled over every count."""
    from treecoll.collectives.planner import native_allreduce_time

    P, step, native = GLOO_BY_NRANKS[row][:3]
    free = Placement(uniform_topology(P, bw=1e3, lat=0.0), P)
    chain = build("chain", nranks=P)
    model = CostModel(free, backend="gloo", step_through=True)
    assert model.msg_overhead == step != EXECUTOR_COSTS["gloo"].step_s
    assert model.tree_time(chain, 8, "allreduce", 1) == pytest.approx(2 * (P - 1) * step, rel=1e-6)
    assert predict_schedule(free, chain, 8, nchunks=1, backend="gloo").time == pytest.approx(
        2 * (P - 1) * step, rel=1e-6
    )
    assert native_allreduce_time(model, 8) == pytest.approx(2 * (P - 1) * native, rel=1e-6)
    # without a topology (what allreduce(x) plans on a CPU group): the same fit
    assert CostModel(Placement(ranks=P)).executor.native_step_s == native


def test_fit_times_single_calls_on_real_ranks(pool4):
    """fit_executor_cost on four gloo ranks: every case timed back to back (one value per rank and
    round) and one call at a time after a barrier, the latter already the slowest rank's (the same on
    every rank)."""
    from treecoll.tools import fit_executor_cost as fit

    res = pool4.run(fit._time_rank, 2, timeout=240)
    cases = {f"{c}/{n}" for c in (*fit.TREES, *fit.NATIVE_CASES) for n in fit.SIZES}
    local = {f"local/{c}" for c in fit.LOCAL_CASES}
    assert all(set(r) == cases | {f"single/{k}" for k in cases} | local for r in res)
    for k in cases:
        assert all(len(r[k]) == 2 and min(r[k]) > 0 for r in res)
        assert len({tuple(r[f"single/{k}"]) for r in res}) == 1 and len(res[0][f"single/{k}"]) == 2
    for k in local:  # each rank's own times of the combine's local ops
        assert all(len(r[k]) == 2 and min(r[k]) > 0 for r in res)
    got = fit.fit_local(res, 4)
    assert got[0] == 4 and min(got[1:]) > 0


def test_fit_local_recovers_known_costs_from_synthetic_ranks():
    """fit_local on per-rank times made from known costs (s): in every repetition one rank takes the known
    time and the others less (they wait for it), but in one repetition a rank was disturbed (10x): the
    slowest rank's median gives back the known costs, in LocalCost's order."""
    from treecoll.tools import fit_executor_cost as fit

    known = {"merge_pair": 150e-6, "merge_states": 120e-6, "dispatch": 90e-6}
    ranks = []
    for r in range(3):
        times = {}
        for c, v in known.items():
            reps = [v if k % 3 == r else v * (0.5 + 0.1 * r) for k in range(9)]
            if r == 1:
                reps[4] = 10 * v
            times[f"local/{c}"] = reps
        ranks.append(times)
    got = fit.fit_local(ranks, 3)
    assert got[0] == 3 and got[1:] == pytest.approx(tuple(known[c] for c in fit.LOCAL_CASES), rel=1e-9)


def test_fit_recovers_each_kinds_costs_from_synthetic_calls():
    """fit_executor_cost's per-count fit on measurements made from known costs: back to back a case takes
    its steps times its kind's cost per step (the executor's messages in a row, gloo's allreduce 2 (P - 1)
    steps, its all-gather P - 1), one call after a barrier that plus its kind's call cost; the fit gives
    back each kind's costs, the all-gather's apart from the allreduce's, and leaves out allreduces of
    fewer elements than ranks (gloo skips the ring's steps on them)."""
    from treecoll.tools import fit_executor_cost as fit

    # (per message, allreduce step, call, allreduce call, all-gather step, all-gather call): GLOO_BY_NRANKS's order
    known = {2: (100e-6, 130e-6, 200e-6, 180e-6, 400e-6, 250e-6), 4: (130e-6, 450e-6, 800e-6, 3000e-6, 900e-6, 1500e-6)}
    rows = []
    for P, (o, native, call, native_call, gather, gather_call) in known.items():
        for case, per, extra in (("chain", o, call), ("star", o, call), ("native", native, native_call)):
            for nbytes in (8, 1024):
                s = fit.messages_of(case, P, nbytes)
                t = per * s * (0.1 if case == "native" and nbytes // 4 < P else 1.0)  # a skipped ring
                rows.append(
                    {
                        "procs": P,
                        "case": case,
                        "bytes": nbytes,
                        "messages": s,
                        "time_us": t * 1e6,
                        "single_us": (t + extra) * 1e6,
                    }
                )
        rows.append(
            {
                "procs": P,
                "case": "gather",
                "bytes": 8,
                "messages": float(P - 1),
                "time_us": gather * (P - 1) * 1e6,
                "single_us": (gather * (P - 1) + gather_call) * 1e6,
            }
        )
    got = {r[0]: r[1:] for r in fit.fit_by_nranks(rows)}
    for P, costs in known.items():
        assert got[P] == pytest.approx(costs, rel=1e-6)
    assert fit.messages_of("chain", 4, 8) == 6.0 and fit.messages_of("gather", 6, 8) == 5.0
