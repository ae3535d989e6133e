"""treecoll.attention.dist: the spawn runner's error path, traffic counting, peak tensor bytes."""
import os

import pytest
import torch
from treecoll.attention.dist import count_traffic, peak_tensor_bytes, run_group
from treecoll.topo.errors import CollectiveError


def _fails_on_rank_one(rank, nproc):
    if rank == 1:
        raise ValueError("boom on rank one")
    return rank


def test_a_failing_rank_raises_with_its_message():
    with pytest.raises(CollectiveError, match=r"run_group: rank 1 failed: ValueError: boom on rank one$") as info:
        run_group(_fails_on_rank_one, 2, timeout=30)
    assert "Traceback" in info.value.remote_traceback


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


_ORPHAN_SCRIPT = '''
import os, sys, time
sys.path.insert(0, {repo!r})
from treecoll.attention.dist import run_group

def wait_forever(rank, world, out):
    with open(os.path.join(out, f"rank{{rank}}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)

if __name__ == "__main__":
    run_group(wait_forever, 2, sys.argv[1], timeout=120)
'''


def test_ranks_die_with_a_killed_parent(tmp_path):
    """SIGKILL the process that called run_group: its ranks must not live on as orphans."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    repo = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_SCRIPT.format(repo=repo))
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)])
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
        assert len(pids) == 2, "the ranks did not start"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)

    def alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split()[2] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [p for p in pids if alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, f"ranks {survivors} outlived their parent"
