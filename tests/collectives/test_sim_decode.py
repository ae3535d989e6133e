"""The decode-step model: the paper's volume and memory formulas, and the simulated volumes behind them."""
from __future__ import annotations

import doctest
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_helpers import star_topology  # noqa: E402

from collectives import sim_decode  # noqa: E402
from collectives.sim_decode import (LLAMA31_8B, PAPER_HOSTS, PAPER_SEQ_LENS, DecodeShape, decode_step,  # noqa: E402
                                    paper_memory, paper_volumes)
from topo.errors import CollectiveError  # noqa: E402


@pytest.mark.parametrize("hosts", PAPER_HOSTS)
@pytest.mark.parametrize("N", PAPER_SEQ_LENS)
def test_paper_volume_formulas_for_its_setups(hosts, N):
    p, b, n_h, d_h = 8 * hosts, 1, 16, 128
    s = DecodeShape(seq_len=N, heads=n_h, head_dim=d_h)
    d = n_h * d_h
    t = N / p
    v = paper_volumes(s, p)
    assert v["ring"] == pytest.approx(2 * b * t * d * p)
    assert v["tree"] == pytest.approx(2 * (p - 1) / p * (b * d + 2 * b * n_h))
    m = paper_memory(s, p)
    assert m["ring"] == pytest.approx(4 * b * t * d + 2 * b * d)
    assert m["tree"] == pytest.approx(2 * b * t * d + 2 * b * d + 2 * b * n_h)
    # tree volume does not depend on the sequence length; ring grows with it
    assert paper_volumes(DecodeShape(seq_len=2 * N, heads=n_h, head_dim=d_h), p)["tree"] == v["tree"]


@pytest.mark.parametrize("P", [2, 4, 8])
def test_simulated_volumes_match_the_formulas(P):
    topo = star_topology(P, bw=100.0, lat=1.0, mem_bw=2000.0)
    s = DecodeShape(seq_len=64_000, heads=16, head_dim=128)
    out = decode_step(topo, s, profile="ideal", tree="binomial")
    m = out["methods"]
    t = 64_000 // P
    elems = paper_volumes(s, P)
    # three allreduces, fp32: 2(p-1)/p (bd + 2 b n_h) elements per GPU, 4 bytes each
    assert m["allreduce3"]["sent_bytes_per_gpu"] == pytest.approx(elems["allreduce3"] * 4)
    # ring: P-1 passes of the K/V block (bf16); the paper counts p passes (its JAX ring sends a last, unused one)
    assert m["ring"]["sent_bytes_per_gpu"] == pytest.approx(2 * t * 2048 * 2 * (P - 1))
    assert m["ring"]["sent_bytes_per_gpu"] * P / (P - 1) == pytest.approx(elems["ring"] * 2)
    # tree: every non-root sends the state up once and the root side sends it down: 2(P-1) states in total
    state = 4 * 16 * 129
    assert m["tree"]["sent_bytes_total"] == pytest.approx(2 * (P - 1) * state)
    assert m["tree"]["sent_bytes_total"] / P == pytest.approx(2 * (P - 1) / P * state)
    # local time is the K/V shard read once at mem_bw
    assert out["local_s"] == pytest.approx(2 * t * 2048 * 2 / 2000e9)
    assert m["ring"]["time_s"] >= (P - 1) * out["local_s"]
    assert m["tree"]["time_s"] < m["ring"]["time_s"]


def test_gqa_shrinks_ring_traffic_not_the_state():
    topo = star_topology(8, mem_bw=3350.0)
    mha = decode_step(topo, DecodeShape(seq_len=32_768, heads=32, head_dim=128), profile="ideal")
    gqa = decode_step(topo, LLAMA31_8B, profile="ideal")
    assert gqa["methods"]["ring"]["sent_bytes_per_gpu"] * 4 == pytest.approx(mha["methods"]["ring"]["sent_bytes_per_gpu"])
    assert gqa["methods"]["tree"]["sent_bytes_total"] == mha["methods"]["tree"]["sent_bytes_total"]
    assert gqa["kv_bytes_per_rank"] * 4 == mha["kv_bytes_per_rank"]


def test_peak_memory_ring_holds_two_kv_blocks():
    topo = star_topology(4, mem_bw=1000.0)
    out = decode_step(topo, DecodeShape(seq_len=400_000, heads=8, head_dim=64), profile="ideal")
    kv = out["kv_bytes_per_rank"]
    assert out["methods"]["ring"]["peak_mem_bytes"] > 2 * kv
    assert out["methods"]["tree"]["peak_mem_bytes"] < 1.01 * kv + 1e6
    assert out["methods"]["ring"]["peak_mem_bytes"] / out["methods"]["tree"]["peak_mem_bytes"] == pytest.approx(2, rel=0.01)


def test_shape_and_method_errors():
    with pytest.raises(CollectiveError, match=r"heads \(32\) expected a multiple of kv_heads \(5\)"):
        DecodeShape(seq_len=10, heads=32, head_dim=128, kv_heads=5)
    with pytest.raises(CollectiveError, match="seq_len expected a positive integer, got 0"):
        DecodeShape(seq_len=0, heads=1, head_dim=1)
    with pytest.raises(CollectiveError, match=r"decode methods \['flash'\]"):
        decode_step(star_topology(2, mem_bw=1.0), DecodeShape(seq_len=8, heads=1, head_dim=1), methods=("flash",))
    with pytest.raises(CollectiveError, match="carry no mem_bw"):
        decode_step(star_topology(2), DecodeShape(seq_len=8, heads=1, head_dim=1))


def test_doctests():
    res = doctest.testmod(sim_decode)
    assert res.attempted > 0 and res.failed == 0
