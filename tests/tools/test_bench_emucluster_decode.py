"""The emulated-cluster decode benchmark's bookkeeping: what each combine sends between hosts."""

import pytest
from treecoll.tools import bench_emucluster_decode as bench
from treecoll.tools.emucluster.topology import build_topology


@pytest.mark.parametrize(
    "hosts, per, tree, blind, gather",
    [
        # 2x2 interleaved: ranks 0, 2 on h0 and 1, 3 on h1. two_level: one edge between the hosts; binomial
        # (parents -1, 0, 0, 2): edges 1-0 and 3-2 cross; gloo's ring 0-1-2-3-0: all 4 hops cross, 3 steps
        (2, 2, 1, 2, 4 * 3),
        # 2x3: ranks 0, 2, 4 on h0; binomial (-1, 0, 0, 2, 0, 4): 1-0, 3-2, 5-4 cross; ring: all 6 hops, 5 steps
        (2, 3, 1, 3, 6 * 5),
    ],
)
def test_payload_between_hosts(hosts, per, tree, blind, gather):
    topo = build_topology(hosts, per, 10**9, placement_mode="interleaved")
    world, state = hosts * per, 4 * 64 * 32 * 129
    assert bench.payload_bytes("tree", topo, world, 64) == 2 * tree * state  # up and down
    assert bench.payload_bytes("tree_blind", topo, world, 64) == 2 * blind * state
    assert bench.payload_bytes("gather", topo, world, 64) == gather * state
    assert bench.payload_bytes("allreduce3", topo, world, 64) is None


def test_cases_and_state():
    class Args:
        batches, tokens, batch_tokens = [1, 64], [16384, 65536], 1024

    assert bench.cases_of(Args) == [(1, 16384), (1, 65536), (64, 1024)]
    assert bench.state_bytes(64) == 1_056_768 >= 1 << 20  # batch 64: at least 1 MiB
    assert bench.shard_tokens(10, 4) == [3, 3, 2, 2]


def test_skew_split_of_the_step():
    """Three ranks, two repetitions (start, attention done, combine done): the skew is the last
    attention done less the first (0.5 then 2.0 s: median 1.25), the combine after the last rank
    is in it the last combine done less the last attention done (1.0 then 0.5: median 0.75)."""
    marks = [
        [(0.0, 1.0, 2.5), (10.0, 11.0, 13.5)],
        [(0.0, 1.5, 2.4), (10.0, 13.0, 13.4)],
        [(0.2, 1.2, 2.3), (10.0, 12.0, 13.0)],
    ]
    assert bench.skew_split(marks) == {"skew": 1.25, "after_last": 0.75}


def test_marked_step_is_the_attention_then_the_combine():
    """The step the benchmark times: decode_partial's states handed to the combine, and the rank's
    three instants in order."""
    import torch

    from treecoll import attention

    q = torch.randn(1, 4, 8)
    k, v = torch.randn(1, 16, 2, 8), torch.randn(1, 16, 2, 8)
    got, marks = [], []
    bench._marked_step(q, k, v, lambda out, lse: got.append((out, lse)), marks)()
    want = attention.decode_partial(q, k, v)
    assert len(marks) == 1 and marks[0][0] <= marks[0][1] <= marks[0][2]
    assert torch.equal(got[0][0], want[0]) and torch.equal(got[0][1], want[1])
