"""A pool of real gloo processes reused across test cases (spawning is slow on 2 cores).

``GlooPool(P)`` starts P processes (torch.multiprocessing spawn) that join one
gloo process group on 127.0.0.1 with a free port, then run tasks: ``pool.run(
"name", *args)`` calls ``_coll_tasks.name(rank, world, *args)`` on every rank and
returns the results in rank order (an exception on a rank comes back as
``("error", type name, message)``). Every wait is bounded.
"""
from __future__ import annotations

import os
import queue
import sys
import time
from pathlib import Path

import torch.multiprocessing as mp
from treecoll.attention.dist import die_with_parent, free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _worker(rank: int, world: int, port: int, pg_timeout: float, inq, outq, parent: int) -> None:
    sys.path[:0] = [str(ROOT), str(HERE)]
    die_with_parent(parent)          # a killed test run leaves no ranks waiting on their queues
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import datetime

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=pg_timeout))
    import _coll_tasks as _tasks
    outq.put(("ready", rank, None))
    while True:
        task = inq.get()
        if task is None:
            break
        tid, name, args = task
        try:
            res = getattr(_tasks, name)(rank, world, *args)
            outq.put((tid, rank, ("ok", res)))
        except BaseException as e:  # noqa: BLE001 - reported to the test
            outq.put((tid, rank, ("error", type(e).__name__, str(e))))
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


class GlooPool:
    def __init__(self, world: int, *, pg_timeout: float = 20.0, start_timeout: float = 90.0):
        ctx = mp.get_context("spawn")
        self.world = world
        self.inqs = [ctx.Queue() for _ in range(world)]
        self.outq = ctx.Queue()
        port = free_port()
        self.procs = [ctx.Process(target=_worker, args=(r, world, port, pg_timeout, self.inqs[r], self.outq, os.getpid()),
                                  daemon=True) for r in range(world)]
        for p in self.procs:
            p.start()
        deadline = time.time() + start_timeout
        ready = 0
        while ready < world:
            try:
                self.outq.get(timeout=0.5)
                ready += 1
            except queue.Empty:
                dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
                if dead or time.time() > deadline:
                    self.close()
                    raise TimeoutError(f"gloo pool: only {ready}/{world} ranks started "
                                       f"(dead ranks {dead}, waited up to {start_timeout} s)") from None
        self._tid = 0

    def run(self, name: str, *args, timeout: float = 60.0, ranks=None, expect: int | None = None) -> list:
        """Run task ``name`` on every rank (or ``ranks``); results in rank order (None for a
        rank that never answered when ``expect`` answers are enough)."""
        self._tid += 1
        tid = self._tid
        ranks = list(range(self.world)) if ranks is None else list(ranks)
        for r in ranks:
            self.inqs[r].put((tid, name, args))
        out = [None] * self.world
        got = 0
        deadline = time.time() + timeout
        need = len(ranks) if expect is None else expect
        while got < need:
            try:
                t, r, res = self.outq.get(timeout=max(0.1, deadline - time.time()))
            except queue.Empty:
                raise TimeoutError(f"task {name}: {got}/{len(ranks)} ranks answered within {timeout} s") from None
            if t == tid:
                out[r] = res
                got += 1
        return out

    def close(self) -> None:
        for q in self.inqs:
            try:
                q.put(None)
            except Exception:  # noqa: BLE001
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(2)
