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
