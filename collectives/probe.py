"""The measuring half of ``treecoll topo probe``: a :class:`treecoll.topo.probe.Plan` run over torch.distributed.

Every rank calls :func:`measure` (``fn(rank, world, plan, ...)``, the shape
:mod:`treecoll.collectives.launch` runs) with the same plan. First the ranks
exchange where they run (:func:`identity`: the machine's name and the launcher's
node, ``TREECOLL_EMU_HOST`` or ``GROUP_RANK``) and check that the topology puts
ranks on hosts the same way (:func:`treecoll.topo.probe.check_job`); then every
step of the plan runs after a barrier:

* a ``lat`` step: the first rank of each pair sends one byte and waits for the
  answer, ``lat_iters`` times after one untimed exchange; half of each round trip
  is recorded;
* a ``bw`` step: every transfer's receiver posts its receive, its sender sends
  (``isend`` / ``irecv``, so a rank that sends and receives in the step does both
  at once), and the receiver records the time from the barrier to the last byte;
  ``reps`` times.

The records (plain dicts, :func:`treecoll.topo.probe.assess` reads them) come back
from every rank. A peer that dies or stops answering raises
:class:`ProbeError` naming the step and the peer within the process group's
timeout; nothing waits forever.

>>> identity({"TREECOLL_EMU_HOST": "2"}, hostname="node7")
'node7#2'
>>> identity({"GROUP_RANK": "1"}, hostname="node7"), identity({}, hostname="node7")
('node7#1', 'node7#')
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from treecoll.topo.errors import CollectiveError
from treecoll.topo.probe import Plan, check_job

__all__ = ["ProbeError", "identity", "measure", "last_failure"]


class ProbeError(CollectiveError):
    """A probe could not finish: a peer died or timed out, or the job does not match the topology."""


#: this process's last measuring failure (the launcher's gather can fail after it, with less to say)
_LAST_FAILURE: list[str] = []


def last_failure() -> str | None:
    """The message of this process's last :class:`ProbeError` from a lost peer, or None."""
    return _LAST_FAILURE[0] if _LAST_FAILURE else None


def identity(environ: Mapping[str, str] | None = None, *, hostname: str | None = None) -> str:
    """Where this rank runs: ``"<machine name>#<node>"`` (the node: ``TREECOLL_EMU_HOST`` on an
    emulated cluster, else the launcher's ``GROUP_RANK``, else empty)."""
    env = os.environ if environ is None else environ
    node = env.get("TREECOLL_EMU_HOST") or env.get("GROUP_RANK") or ""
    return f"{hostname if hostname is not None else socket.gethostname()}#{node}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().split(" This is typically caused")[0]  # gloo's advice on its own failures
    return text.splitlines()[0][:300] if text else type(e).__name__


def measure(rank: int, world: int, plan: Plan, hosts: Mapping[int, str], name: str = "") -> dict[str, Any]:
    """Run ``plan`` on this rank; returns ``{"records": [...], "seconds": wall time}``.

    ``hosts``: the topology's host of every rank (for the job check); ``name``: the
    topology's name, for messages. Raises :class:`ProbeError` (one line) when the
    job does not match or a peer is lost.
    """
    import torch
    import torch.distributed as dist

    if world != plan.ranks:
        raise ProbeError(
            f"topo probe: topology {name!r} has {plan.ranks} ranks, the job {world}; "
            f"give the topology of this job (--topology)"
        )
    where: list = [None] * world
    dist.all_gather_object(where, identity())
    check_job(hosts, where, name)
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":  # pragma: no cover - needs GPUs
        device = torch.device("cuda", torch.cuda.current_device())
    most = max((n for s in plan.steps if s.kind == "bw" for n in s.nbytes), default=1)
    send = torch.ones(most, dtype=torch.uint8, device=device)
    recv = torch.empty(most, dtype=torch.uint8, device=device)
    one = torch.zeros(1, dtype=torch.uint8, device=device)
    records: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for i, step in enumerate(plan.steps):
        try:
            dist.barrier()
            if step.kind == "lat":
                records += _latency(rank, i, step, plan.lat_iters, one, dist)
            else:
                records += _bandwidth(rank, i, step, plan.reps, send, recv, dist)
        except RuntimeError as e:
            peers = sorted({p for f in step.flows if rank in f for p in f if p != rank})
            who = f"with rank(s) {peers}" if peers else "at the barrier"
            _LAST_FAILURE[:] = [
                f"topo probe: rank {rank}: step {i} ({step.phase} {step.kind}) {who} failed: "
                f"{_first_line(e)}; a peer died or stopped answering"
            ]
            raise ProbeError(_LAST_FAILURE[0]) from None
    return {"records": records, "seconds": time.perf_counter() - t_start}


def _latency(rank: int, i: int, step, iters: int, one, dist) -> list[dict[str, Any]]:
    out = []
    for a, b in step.flows:
        if rank == a:
            times = []
            for k in range(iters + 1):
                t0 = time.perf_counter()
                dist.send(one, b)
                dist.recv(one, b)
                if k:
                    times.append((time.perf_counter() - t0) / 2)
            out.append({"step": i, "src": a, "dst": b, "seconds": times})
        elif rank == b:
            for _ in range(iters + 1):
                dist.recv(one, a)
                dist.send(one, a)
    return out


def _bandwidth(rank: int, i: int, step, reps: int, send, recv, dist) -> list[dict[str, Any]]:
    mine_in = [(k, f) for k, f in enumerate(step.flows) if f[1] == rank]
    mine_out = [(k, f) for k, f in enumerate(step.flows) if f[0] == rank]
    times: list[float] = []
    for rep in range(reps):
        if rep:
            dist.barrier()
        t0 = time.perf_counter()
        r = dist.irecv(recv[: step.nbytes[mine_in[0][0]]], mine_in[0][1][0]) if mine_in else None
        s = dist.isend(send[: step.nbytes[mine_out[0][0]]], mine_out[0][1][1]) if mine_out else None
        if r is not None:
            r.wait()
            times.append(time.perf_counter() - t0)
        if s is not None:
            s.wait()
    if not mine_in:
        return []
    src, dst = mine_in[0][1]
    return [{"step": i, "src": src, "dst": dst, "seconds": times}]
