"""treecoll.attention.dist: traffic counting, peak tensor bytes (the launcher: tests/collectives/test_launch.py)."""

import torch
from treecoll.attention.dist import count_traffic, peak_tensor_bytes


def test_peak_tensor_bytes_counts_live_allocations():
    def work():
        a = torch.empty(1000, 1000)  # 4 MB
        b = torch.empty(500, 1000)  # 2 MB, both alive
        del a
        c = torch.empty(250, 1000)  # 1 MB, after 4 MB were freed
        return b.numel() + c.numel()

    result, peak = peak_tensor_bytes(work)
    assert result == 750_000
    assert 6_000_000 <= peak < 6_100_000


def test_count_traffic_restores_torch_distributed():
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    before = (dist.isend, c10d.isend, dist.all_reduce)
    with count_traffic() as t:
        assert dist.isend is not before[0]
    assert (dist.isend, c10d.isend, dist.all_reduce) == before
    assert t.sent == 0 and t.wire_estimate(4) == 0
