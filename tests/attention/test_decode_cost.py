"""treecoll.attention.cost, the decode-step model: the paper's volume and memory formulas, and the
simulated volumes behind them."""

from __future__ import annotations

from dataclasses import astuple

import pytest
from treecoll.attention.cost import (
    GLOO_LOCAL_BY_NRANKS,
    LLAMA31_8B,
    PAPER_HOSTS,
    PAPER_SEQ_LENS,
    DecodeShape,
    choose_combine,
    combine_times,
    decode_step,
    local_cost,
    paper_memory,
    paper_volumes,
)
from treecoll.collectives.executor_cost import EXECUTOR_COSTS, GLOO_BY_NRANKS, executor_cost
from treecoll.collectives.placement import Placement
from treecoll.topo.errors import CollectiveError

from tests.collectives.sim_helpers import star_topology

# Hand-worked values of the paper's formulas (arXiv 2408.04093 §6.2-6.3), in elements, with
# d = n_h d_h (queries, outputs) and, for GQA, the K/V width d_kv = n_kv d_h (the K/V terms):
#   V_tree = 2 (p-1)/p (b d + 2 b n_h)   (the state: numerator b d, denominator and max b n_h each)
#   V_ring = 2 b t d_kv p                (K and V of t = N/p tokens, passed p times)
#   Mem_ring = 4 b t d_kv + 2 b d        (own and neighbour's K/V, query and output)
#   Mem_tree = 2 b t d_kv + 2 b d + 2 b n_h
PAPER_CASES = [
    # (shape, p, V_tree, V_ring, Mem_ring, Mem_tree)
    # the paper's block, MHA: d = 2048, t = 10,000: 2*7/8*(2048+32); 2*10,000*2048*8; 4*10,000*2048 + 4096; ...
    ({"seq_len": 80_000, "heads": 16, "head_dim": 128}, 8, 3640, 327_680_000, 81_924_096, 40_964_128),
    # Llama-3.1-8B, GQA 32/8: d = 4096, d_kv = 1024, t = 4096: 2*7/8*(4096+64); 2*4096*1024*8;
    # 4*4096*1024 + 8192; 2*4096*1024 + 8192 + 64
    ({"seq_len": 32_768, "heads": 32, "head_dim": 128, "kv_heads": 8}, 8, 7280, 67_108_864, 16_785_408, 8_396_864),
    # MQA, batch 2: d = 512, d_kv = 64, t = 250: 2*3/4*(1024+32); 2*2*250*64*4; 4*2*250*64 + 2048;
    # 2*2*250*64 + 2048 + 32
    ({"seq_len": 1000, "heads": 8, "head_dim": 64, "kv_heads": 1, "batch": 2}, 4, 1584, 256_000, 130_048, 66_080),
]


@pytest.mark.parametrize("shape, p, v_tree, v_ring, mem_ring, mem_tree", PAPER_CASES)
def test_paper_volume_and_memory_formulas(shape, p, v_tree, v_ring, mem_ring, mem_tree):
    s = DecodeShape(**shape)
    v, m = paper_volumes(s, p), paper_memory(s, p)
    assert v["tree"] == pytest.approx(v_tree, rel=1e-12) and v["allreduce3"] == pytest.approx(v_tree, rel=1e-12)
    assert v["ring"] == pytest.approx(v_ring, rel=1e-12)
    assert m["ring"] == pytest.approx(mem_ring, rel=1e-12) and m["tree"] == pytest.approx(mem_tree, rel=1e-12)


@pytest.mark.parametrize("hosts", PAPER_HOSTS)
def test_tree_volume_does_not_grow_with_the_sequence(hosts):
    p = 8 * hosts
    for n_kv in (16, 4):
        v = [paper_volumes(DecodeShape(seq_len=n, heads=16, head_dim=128, kv_heads=n_kv), p) for n in PAPER_SEQ_LENS]
        assert len({x["tree"] for x in v}) == 1  # the state only
        assert [x["ring"] / v[0]["ring"] for x in v] == pytest.approx([2**i for i in range(len(v))])


# simulated decode step on a star of P GPUs (100 GB/s, 1 us per link, 2000 GB/s HBM), 64,000 tokens,
# 16 heads x 128, bf16 K/V: expected bytes and seconds worked out by hand
@pytest.mark.parametrize("P", [2, 4, 8])
@pytest.mark.parametrize("kv_heads", [16, 4, 1])
def test_simulated_volumes_and_times(P, kv_heads):
    topo = star_topology(P, bw=100.0, lat=1.0, mem_bw=2000.0)
    s = DecodeShape(seq_len=64_000, heads=16, head_dim=128, kv_heads=kv_heads)
    out = decode_step(topo, s, profile="ideal", tree="binomial", mode="in-kernel")
    m = out["methods"]
    t = 64_000 // P  # tokens per GPU
    block = 2 * t * kv_heads * 128 * 2  # K and V of the shard, bf16 bytes
    assert out["kv_bytes_per_rank"] == block
    # local attention reads the shard once at 2000 GB/s
    assert out["local_s"] == pytest.approx(block / 2000e9, rel=1e-12)
    # three fp32 allreduces (max, sum of denominators: 16 values; sum of numerators: 2048) of
    # 2 (P-1)/P of their bytes each: GQA does not change them
    assert m["allreduce3"]["sent_bytes_per_gpu"] == pytest.approx(2 * (P - 1) / P * (16 + 16 + 2048) * 4, rel=1e-12)
    # ring: P-1 passes of the K/V block to the successor
    assert m["ring"]["sent_bytes_per_gpu"] == pytest.approx((P - 1) * block, rel=1e-12)
    # each pass crosses two star links (1 us each) alone on them; compute and transfer overlap
    step = 2e-6 + block / 100e9
    assert m["ring"]["step_transfer_s"] == pytest.approx(step, rel=1e-9)
    assert m["ring"]["time_s"] == pytest.approx(out["local_s"] + (P - 1) * max(out["local_s"], step), rel=1e-9)
    # as treecoll runs it, every pass also costs an isend and an irecv from Python
    from treecoll.collectives.executor_cost import executor_cost
    from treecoll.collectives.placement import Placement

    ex = decode_step(topo, s, profile="ideal", tree="binomial", methods=("ring",))
    o = executor_cost(Placement(topo, P)).step_s
    assert ex["mode"] == "executor"
    assert ex["methods"]["ring"]["step_transfer_s"] == pytest.approx(step + 2 * o, rel=1e-9)
    # tree: the fp32 state (out 16 x 128 and lse 16) goes up each edge once and down once
    state = 4 * 16 * (128 + 1)
    assert m["tree"]["sent_bytes_total"] == pytest.approx(2 * (P - 1) * state, rel=1e-12)
    assert m["tree"]["time_s"] < m["ring"]["time_s"]


def test_gqa_shrinks_ring_traffic_not_the_state():
    topo = star_topology(8, mem_bw=3350.0)
    mha = decode_step(topo, DecodeShape(seq_len=32_768, heads=32, head_dim=128), profile="ideal")
    gqa = decode_step(topo, LLAMA31_8B, profile="ideal")
    assert gqa["methods"]["ring"]["sent_bytes_per_gpu"] * 4 == pytest.approx(
        mha["methods"]["ring"]["sent_bytes_per_gpu"]
    )
    assert gqa["methods"]["tree"]["sent_bytes_total"] == mha["methods"]["tree"]["sent_bytes_total"]
    assert gqa["kv_bytes_per_rank"] * 4 == mha["kv_bytes_per_rank"]


def test_peak_memory_per_method():
    """Ring holds its K/V shard and the one arriving; tree its shard, the query, the state and
    the received states it merges (a binomial root over 4 ranks: 2 children)."""
    topo = star_topology(4, mem_bw=1000.0)
    out = decode_step(
        topo, DecodeShape(seq_len=400_000, heads=8, head_dim=64, kv_heads=2), profile="ideal", tree="binomial"
    )
    kv = 2 * 100_000 * 2 * 64 * 2  # K and V of 100,000 tokens, 2 KV heads x 64, bf16
    q = 8 * 64 * 2  # the query, bf16
    state = 4 * 8 * (64 + 1)  # out + lse, fp32
    assert out["kv_bytes_per_rank"] == kv
    assert out["methods"]["ring"]["peak_mem_bytes"] == 2 * kv + q + state
    assert out["methods"]["tree"]["peak_mem_bytes"] == kv + q + state + 2 * state
    # one rank: no K/V arrives, nothing is sent, every method is the local attention alone
    one = decode_step(
        star_topology(1, mem_bw=1000.0), DecodeShape(seq_len=100_000, heads=8, head_dim=64, kv_heads=2), tree="binomial"
    )
    assert one["methods"]["ring"]["peak_mem_bytes"] == kv + q + state
    assert {m: (r["time_s"], r["sent_bytes_per_gpu"]) for m, r in one["methods"].items()} == {
        m: (one["local_s"], 0.0) for m in one["methods"]
    }


def test_methods_that_do_not_fit_the_gpu_memory():
    """With every GPU's capacity known, a method whose peak memory per GPU exceeds the least of them
    is marked ``fits: False`` and left out of ``auto`` and the speed-ups; the longest context that
    fits is the shard that leaves room for the rest of the least-memory method's peak."""
    shape = DecodeShape(seq_len=400_000, heads=8, head_dim=64, kv_heads=2)
    kv = 2 * 100_000 * 2 * 64 * 2  # 51.2 MB of K/V per rank (test_peak_memory_per_method)
    q, state = 8 * 64 * 2, 4 * 8 * (64 + 1)
    caps = [0.08, 0.06, 0.06, 0.09]  # GB: ring's 2 x 51.2 MB does not fit in the least, 60 MB; the tree's does
    out = decode_step(star_topology(4, mem_bw=1000.0, mem_gb=caps), shape, profile="ideal", tree="binomial")
    assert out["mem_capacity_bytes"] == 60e6 and out["mem_gpu_model"] is None
    assert out["methods"]["ring"]["peak_mem_bytes"] == 2 * kv + q + state > 60e6
    assert {m: r["fits"] for m, r in out["methods"].items()} == {
        "tree": True,
        "gather": True,
        "allreduce3": True,
        "ring": False,
    }
    assert out["auto"] in ("tree", "gather", "allreduce3")
    assert "speedup_auto_vs_ring" not in out and "speedup_tree_vs_ring" not in out
    # the tree alone: a binomial root holds its shard, the query, its state and 2 received states;
    # each token of a rank's shard is K and V of 2 heads x 64 in bf16, 512 bytes
    tree = decode_step(
        star_topology(4, mem_bw=1000.0, mem_gb=caps), shape, profile="ideal", tree="binomial", methods=("tree",)
    )
    assert tree["max_seq_len_fits"] == (60_000_000 - q - 3 * state) // 512 * 4
    longest = DecodeShape(seq_len=tree["max_seq_len_fits"], heads=8, head_dim=64, kv_heads=2)
    one_more = DecodeShape(seq_len=tree["max_seq_len_fits"] + 1, heads=8, head_dim=64, kv_heads=2)
    topo = star_topology(4, mem_bw=1000.0, mem_gb=caps)
    assert decode_step(topo, longest, profile="ideal", tree="binomial", methods=("tree",))["methods"]["tree"]["fits"]
    over = decode_step(topo, one_more, profile="ideal", tree="binomial", methods=("tree",))
    assert over["methods"]["tree"]["fits"] is False and "auto" not in over


@pytest.mark.parametrize("ranks", [1, 2, 4])
@pytest.mark.parametrize("method", ["ring", "tree"])
def test_the_longest_context_that_fits_is_exact_for_each_method(method, ranks):
    """``max_seq_len_fits`` of one method alone: that context fits, one more token per rank does not
    (ring holds its block and the arriving one, on one rank only its own)."""
    topo = star_topology(ranks, mem_bw=1000.0, mem_gb=[0.05] * ranks)

    def run(seq_len):
        shape = DecodeShape(seq_len=seq_len, heads=8, head_dim=64, kv_heads=2)
        return decode_step(topo, shape, profile="ideal", tree="binomial", methods=(method,))

    longest = run(1000 * ranks)["max_seq_len_fits"]
    assert longest > 1000 * ranks and longest % ranks == 0
    assert run(longest)["methods"][method]["fits"] is True
    assert run(longest + ranks)["methods"][method]["fits"] is False


def test_no_capacity_changes_nothing():
    """One GPU without ``mem_gb``: no capacity, ``fits`` None everywhere, auto and the speed-ups as before."""
    shape = DecodeShape(seq_len=400_000, heads=8, head_dim=64, kv_heads=2)
    plain = decode_step(star_topology(4, mem_bw=1000.0), shape, profile="ideal")
    partial = decode_step(star_topology(4, mem_bw=1000.0, mem_gb=[0.001, None, 0.001, 0.001]), shape, profile="ideal")
    assert partial["mem_capacity_bytes"] is None and "max_seq_len_fits" not in partial
    assert {r["fits"] for r in partial["methods"].values()} == {None}
    assert partial == plain


def test_shape_and_method_errors():
    with pytest.raises(CollectiveError, match=r"heads \(32\) expected a multiple of kv_heads \(5\)"):
        DecodeShape(seq_len=10, heads=32, head_dim=128, kv_heads=5)
    with pytest.raises(CollectiveError, match="seq_len expected a positive integer, got 0"):
        DecodeShape(seq_len=0, heads=1, head_dim=1)
    with pytest.raises(CollectiveError, match=r"decode methods \['flash'\]"):
        decode_step(star_topology(2, mem_bw=1.0), DecodeShape(seq_len=8, heads=1, head_dim=1), methods=("flash",))
    with pytest.raises(CollectiveError, match="carry no mem_bw"):
        decode_step(star_topology(2), DecodeShape(seq_len=8, heads=1, head_dim=1))


@pytest.mark.parametrize("P", [2, 4, 8])
def test_gather_combine_time_and_bytes(P):
    """gather: a ring all-gather of the P packed states (P - 1 steps, each GPU sending one state to its
    successor through the star's switch: two 1 us links at 100 GB/s), then a local merge reading the P
    states and writing one at 2000 GB/s."""
    topo = star_topology(P, bw=100.0, lat=1.0, mem_bw=2000.0)
    state = 4 * 2 * 16 * (128 + 1)  # batch 2, 16 heads x 128, fp32 out + lse
    got = combine_times(topo, 2, 16, 128, profile="ideal")
    g = got["gather"]
    assert g["sent_bytes_per_gpu"] == (P - 1) * state and g["sent_bytes_total"] == P * (P - 1) * state
    assert g["time_s"] == pytest.approx((P - 1) * (2e-6 + state / 100e9) + (P + 1) * state / 2000e9, rel=1e-9)
    # the tree sends every state up and down each of its P - 1 edges: the same total as the gather at P = 2
    assert got["tree"]["sent_bytes_total"] == 2 * (P - 1) * state
    step = decode_step(
        topo, DecodeShape(seq_len=64_000, heads=16, head_dim=128, batch=2), profile="ideal", methods=("tree", "gather")
    )
    assert step["methods"]["gather"]["combine_s"] == pytest.approx(g["time_s"], rel=1e-12)


@pytest.mark.parametrize("name", ["dgx-h100-x2", "gb200-nvl72"])
@pytest.mark.parametrize("mode", ["executor", "in-kernel"])
def test_tree_combine_is_the_one_prediction_of_its_tree(name, mode):
    """The decode model's tree combine is the allreduce of the packed state that
    ``predict_tree`` (what ``treecoll tree build`` and ``simulate`` print) gives for the same
    tree, to the last bit, in either mode."""
    from treecoll.collectives.builders import build
    from treecoll.collectives.sim.executor import predict_tree

    from tests.helpers import shipped

    t = shipped(name)
    state = 4 * 1 * 32 * (128 + 1)
    plan = build("two_level", t, nbytes=state, rails=False)
    want = predict_tree(Placement(t), plan, state, mode=mode).time
    assert combine_times(t, 1, 32, 128, mode=mode, methods=("tree",))["tree"]["time_s"] == want


def test_choose_combine_follows_the_model():
    """auto, with NCCL's protocols. In-kernel (the tree inside NCCL's kernels): one step of the gather
    beats the tree's up-and-down at P = 2; at P = 8 and batch 1 the tree's three levels beat the
    gather's seven ring steps, and both beat three collective calls (each pays NCCL's per-call
    latency). In executor mode (what tree_decode runs) every message of the tree also costs its
    rank the executor's per-message time, at least two in a row (up, then down): the gather wins."""
    two, eight = star_topology(2, mem_bw=2000.0), star_topology(8, mem_bw=2000.0)
    assert choose_combine(two, 1, 32, 128, mode="in-kernel") == "gather"
    assert choose_combine(eight, 1, 32, 128, mode="in-kernel") == "tree"
    for topo in (two, eight):
        for mode in ("in-kernel", "executor"):
            t = combine_times(topo, 1, 32, 128, mode=mode)
            assert choose_combine(topo, 1, 32, 128, mode=mode) == min(t, key=lambda m: t[m]["time_s"])
        t = combine_times(topo, 1, 32, 128, mode="in-kernel")
        assert t["allreduce3"]["time_s"] > max(t["tree"]["time_s"], t["gather"]["time_s"])
        step = executor_cost(Placement(topo, None), "nccl").step_s
        assert combine_times(topo, 1, 32, 128)["tree"]["time_s"] >= 2 * step
    assert choose_combine(eight, 1, 32, 128) == "gather"
    with pytest.raises(CollectiveError, match=r"combine methods \['ring'\]"):
        combine_times(two, 1, 1, 1, methods=("ring",))


@pytest.mark.parametrize("mode", ["executor", "in-kernel"])
def test_decode_step_names_the_combine_auto_runs(mode):
    """decode_step's ``auto`` is choose_combine's pick for the same placement and shape (what
    tree_decode(combine="auto") runs), and its ratio to ring is ring's step over that method's."""
    shape = DecodeShape(seq_len=65_536, heads=32, head_dim=128, kv_heads=8)
    for topo in (star_topology(2, mem_bw=2000.0), star_topology(8, mem_bw=2000.0)):
        r = decode_step(topo, shape, mode=mode)
        assert set(r["methods"]) == {"tree", "gather", "allreduce3", "ring"}
        assert r["auto"] == choose_combine(topo, 1, 32, 128, mode=mode)
        ring = r["methods"]["ring"]["time_s"]
        assert r["speedup_auto_vs_ring"] == pytest.approx(ring / r["methods"][r["auto"]]["time_s"], rel=1e-12)
        assert r["speedup_tree_vs_ring"] == pytest.approx(ring / r["methods"]["tree"]["time_s"], rel=1e-12)
    only = decode_step(star_topology(2, mem_bw=2000.0), shape, methods=("allreduce3",))
    assert only["auto"] == "allreduce3" and "speedup_auto_vs_ring" not in only


def test_gloo_combine_times_by_hand():
    """backend="gloo" on a star of 4 ranks (100 GB/s, 1 us per link, 2000 GB/s merges), batch 2 x 16 heads x
    128: the gather is gloo's all-gather in rank order, 3 steps of one state (2 links each, and the
    all-gather's own per-step time g at 4 processes) plus the merge (its bytes and one merge_states call m),
    the combine call's own Python d once and one all-gather call's cost cg; the three all-reduces are
    rank-order ring allreduces of 128, 128 and 16384 bytes: 6 steps of a quarter of each over 2 links (each
    with the allreduce's per-step time o), 3 reduces of that quarter (3 x bytes / mem_bw) and an allreduce
    call's cost c each, and one merge's worth of local ops m. Each kind's costs are its own columns of the
    fit at 4 processes, the local ops those of GLOO_LOCAL_BY_NRANKS's row of 4."""
    P, state = 4, 4 * 2 * 16 * 129
    k = EXECUTOR_COSTS["gloo"].for_nranks(P)
    row = GLOO_BY_NRANKS[1] + (None,) * (7 - len(GLOO_BY_NRANKS[1]))
    assert row[0] == P and k.native_step_s == row[2] and k.native_call_s == (row[4] if row[4] is not None else row[3])
    o, c, g, cg = k.native_step_s, k.native_call_s, k.gather_step_s, k.gather_call_s
    assert GLOO_LOCAL_BY_NRANKS[1][0] == P
    m, d = GLOO_LOCAL_BY_NRANKS[1][2], GLOO_LOCAL_BY_NRANKS[1][3]
    assert min(o, c, g, cg, m, d) > 0
    t = combine_times(star_topology(P, bw=100.0, lat=1.0, mem_bw=2000.0), 2, 16, 128, backend="gloo")
    assert t["gather"]["time_s"] == pytest.approx(
        (P - 1) * (2e-6 + state / 100e9 + g) + (P + 1) * state / 2000e9 + m + d + cg, rel=1e-9
    )

    def ring(n):
        return 2 * (P - 1) * (2e-6 + n / P / 100e9 + o) + (P - 1) * 3 * (n / P) / 2000e9 + c

    assert t["allreduce3"]["time_s"] == pytest.approx(2 * ring(128) + ring(16384) + m, rel=1e-9)
    assert t["tree"]["sent_bytes_total"] == 2 * (P - 1) * state


def test_gloo_combines_each_pay_their_own_kind_of_call(monkeypatch):
    """With a fit whose seven columns all differ, each combine pays its own kind's costs: adding d to the
    all-gather's step makes the gather (P - 1) d slower and nothing else; adding d to the all-gather's call
    makes it d slower; adding d to the allreduce's call makes the three all-reduces 3 d slower; adding d to
    the executor's call makes the tree d slower."""
    import dataclasses

    P, d = 4, 1e-3
    row = (P, 100e-6, 200e-6, 300e-6, 400e-6, 500e-6, 600e-6)
    topo = star_topology(P, bw=100.0, lat=1.0, mem_bw=2000.0)

    def times(r):
        monkeypatch.setitem(EXECUTOR_COSTS, "gloo", dataclasses.replace(EXECUTOR_COSTS["gloo"], by_nranks=(tuple(r),)))
        return {m: v["time_s"] for m, v in combine_times(topo, 1, 32, 128, backend="gloo").items()}

    _assert_each_column_adds(
        times, row, d, {5: {"gather": (P - 1) * d}, 6: {"gather": d}, 4: {"allreduce3": 3 * d}, 3: {"tree": d}}
    )


def _assert_each_column_adds(times, row: tuple, d: float, expect: dict) -> None:
    """``times(row)`` after adding ``d`` to column ``col`` of ``row`` is ``times(row)`` plus ``expect[col]``
    (method -> seconds; 0 for a method not named), for every column of ``expect``."""
    base = times(row)
    for col, what in expect.items():
        bumped = list(row)
        bumped[col] += d
        got = times(bumped)
        for m in base:
            assert got[m] == pytest.approx(base[m] + what.get(m, 0.0), rel=1e-9), (col, m)


def test_gloo_combines_pay_their_own_local_ops(monkeypatch):
    """With local costs that all differ (merge pair, merge states, dispatch at 4 processes), on a star of 4
    (two_level's tree there: the root merges 3 children in a row): adding d to the pair merge makes the tree
    3 d slower and nothing else; adding d to merge_states makes the gather and the three all-reduces d slower
    (their one merge, their local ops), the tree not; adding d to the dispatch makes the tree and the gather
    d slower (each packs and unpacks once), the three all-reduces not (they pack nothing)."""
    from treecoll.attention import cost as acost

    P, d = 4, 1e-3
    row = (P, 100e-6, 200e-6, 300e-6)
    topo = star_topology(P, bw=100.0, lat=1.0, mem_bw=2000.0)

    def times(r):
        monkeypatch.setattr(acost, "GLOO_LOCAL_BY_NRANKS", (tuple(r),))
        return {m: v["time_s"] for m, v in combine_times(topo, 1, 32, 128, backend="gloo").items()}

    _assert_each_column_adds(
        times, row, d, {1: {"tree": 3 * d}, 2: {"gather": d, "allreduce3": d}, 3: {"tree": d, "gather": d}}
    )


def test_local_cost_between_and_beyond_the_fitted_counts(monkeypatch):
    """local_cost at a count between two fitted ones is linear in the count; beyond them the nearest's."""
    from treecoll.attention import cost as acost

    monkeypatch.setattr(acost, "GLOO_LOCAL_BY_NRANKS", ((2, 1e-4, 2e-4, 3e-4), (6, 5e-4, 6e-4, 7e-4)))
    assert astuple(local_cost(3)) == pytest.approx((2e-4, 3e-4, 4e-4), rel=1e-12)
    assert local_cost(1) == acost.LocalCost(1e-4, 2e-4, 3e-4) and local_cost(64) == acost.LocalCost(5e-4, 6e-4, 7e-4)


def test_gloo_tree_pays_the_executor_at_the_group_size_and_its_merges_in_a_row():
    """Two ranks joined by one link (1 us, 100 GB/s, no mem_bw: merges free in bytes), one 2 x 16 x 129
    float32 state: rank 1 posts its send (o) while rank 0 posts its receive (o); the state crosses
    (1 us + bytes / bw); rank 0 merges in Python (one pair merge at 2 processes), posts its send (o) as
    rank 1 has posted its receive; the state crosses back; the one call costs c and its own Python d once.
    o and c are fitted at 2 processes, o not the one fitted over 2 and 4."""
    P, state = 2, 4 * 2 * 16 * 129
    o, c = EXECUTOR_COSTS["gloo"].for_nranks(P).step_s, EXECUTOR_COSTS["gloo"].for_nranks(P).call_s
    assert o == GLOO_BY_NRANKS[0][1] != EXECUTOR_COSTS["gloo"].step_s and c == GLOO_BY_NRANKS[0][3] > 0
    t = combine_times(star_topology(P, bw=100.0, lat=1.0), 2, 16, 128, backend="gloo", methods=("tree",))
    hop = 2e-6 + state / 100e9  # rank -> switch -> rank
    merge, d = GLOO_LOCAL_BY_NRANKS[0][1], GLOO_LOCAL_BY_NRANKS[0][3]
    assert GLOO_LOCAL_BY_NRANKS[0][0] == P and local_cost(P).merge_pair_s == merge
    assert t["tree"]["time_s"] == pytest.approx(2 * (o + hop) + merge + d + c, rel=1e-6)


def test_gloo_model_keeps_the_tree_on_an_interleaved_cluster():
    """Two hosts at 1 Gbit/s, ranks alternating between them (the emulated cluster's interleaved
    placement): every hop of gloo's rank-order rings crosses the network, the two-level tree crosses it
    once each way. With NCCL's host-ordered rings the three all-reduces win the 1 MiB state against the
    tree inside NCCL's kernels (in-kernel)."""
    from treecoll.tools.emucluster.topology import build_topology

    for hosts, per in ((2, 2), (2, 3)):
        topo = build_topology(hosts, per, 10**9, placement_mode="interleaved")
        for batch in (1, 64):
            t = combine_times(topo, batch, 32, 128, backend="gloo")
            assert (
                min(t, key=lambda m: t[m]["time_s"]) == "tree" == choose_combine(topo, batch, 32, 128, backend="gloo")
            )
        assert choose_combine(topo, 64, 32, 128, mode="in-kernel") == "allreduce3"
        t = combine_times(topo, 64, 32, 128)  # NCCL, the tree by treecoll's executor: the model decides
        assert choose_combine(topo, 64, 32, 128) == min(t, key=lambda m: t[m]["time_s"])
    with pytest.raises(CollectiveError, match=r"backend expected one of \['nccl', 'gloo'\], got 'mpi'"):
        combine_times(topo, 1, 1, 1, backend="mpi")


def test_gloo_gather_pays_gloos_steps_like_the_tree():
    """On one host of 4 CPU ranks over gloo the tree's combine is faster than the all-gather
    (bench_tree_attention measures 3.3 ms against 5.4 ms): the gather is a ring of P - 1 steps of
    gloo's own collective, each paying gloo's per-step time, as the tree pays the executor's per
    message; without that cost the model took the gather for ten times faster than the tree."""
    from treecoll.topo import Topology
    from treecoll.topo.discover import cpu_only_host

    P = 4
    topo = Topology(cpu_only_host("h", {0: ""}, P))
    t = combine_times(topo, 1, 32, 128, backend="gloo")
    assert t["gather"]["time_s"] >= (P - 1) * EXECUTOR_COSTS["gloo"].for_nranks(P).gather_step_s
    assert choose_combine(topo, 1, 32, 128, backend="gloo") == "tree"


# Combine medians (us) that `python -m treecoll.tools.bench_tree_attention --steps 10` printed on the idle
# 2-core machine (docs/benchmarks.md, "Tree attention over processes", table (b)): (P, batch) -> method.
MEASURED_COMBINE_US = {
    (2, 1): {"tree": 1013, "gather": 886, "allreduce3": 2371},
    (2, 4): {"tree": 994, "gather": 916, "allreduce3": 1959},
    (4, 1): {"tree": 2597, "gather": 4680, "allreduce3": 17205},
    (4, 4): {"tree": 3021, "gather": 5077, "allreduce3": 17785},
}


@pytest.mark.parametrize("nranks, batch", sorted(MEASURED_COMBINE_US))
def test_gloo_auto_picks_what_measured_fastest(nranks, batch):
    """combine="auto" on a gloo group of CPU processes without a topology (tree_decode's CPU-local
    one) takes the method the benchmark measured fastest, and the model orders all three as measured:
    at 2 processes (a core each) the all-gather, one step of gloo's own ring, beats the tree's two
    executor messages; at 4 (two per core) gloo's ring waits for every rank at each of its 3 steps and
    the tree's 6 messages win."""
    from treecoll.attention.tree_decode import _cpu_local
    from treecoll.attention.tree_decode import choose_combine as runtime_choice

    measured = MEASURED_COMBINE_US[(nranks, batch)]
    place = Placement(_cpu_local(nranks), nranks)
    model = combine_times(place, batch, 32, 128, backend="gloo")
    assert runtime_choice(batch, 32, 128, placement=place) == min(measured, key=measured.get)
    assert sorted(model, key=lambda m: model[m]["time_s"]) == sorted(measured, key=measured.get)
