"""In-process transport: run a schedule on P simulated ranks in threads (tests, examples).

:class:`LocalFabric` holds FIFO mailboxes per (source, destination, tag), or
with ``by_tag=False`` matches a pair's messages in the order they are posted, as NCCL does;
``fabric.transport(r)`` is rank r's endpoint with the interface of
:class:`treecoll.collectives.group.TorchTransport`. Sends copy eagerly (like a
buffered send), receives block until the matching message arrives or the
timeout passes (then ``TimeoutError`` naming the peer). :func:`run_ranks`
calls ``fn(rank, transport)`` on every rank in its own thread and returns
the results (re-raising the first error); the collectives take the transport
as their private ``_transport=`` argument.

>>> import torch
>>> from treecoll.collectives.execute import allreduce
>>> res = run_ranks(3, lambda r, t: allreduce(torch.tensor([float(r + 1)]), tree="chain", _transport=t))
>>> [float(v) for v in res]
[6.0, 6.0, 6.0]
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["LocalFabric", "LocalTransport", "run_ranks"]


class _Done:
    def __init__(self, fn=None):
        self._fn = fn
        self._done = fn is None

    def wait(self, timeout: float) -> None:
        if not self._done:
            self._fn(timeout)
            self._done = True

    def is_completed(self) -> bool:
        return self._done


class LocalFabric:
    """Mailboxes shared by the P in-process ranks."""

    def __init__(self, size: int, *, by_tag: bool = True):
        self.size = size
        self.by_tag = by_tag
        self._posted: dict[tuple[int, int, str], int] = {}
        self._lock = threading.Lock()
        self._boxes: dict[tuple, queue.Queue] = {}
        self._gather: dict[int, list] = {}
        self._gather_cv = threading.Condition()
        self._gather_round = [0] * size

    def box(self, src: int, dst: int, tag: int, side: str) -> queue.Queue:
        """The mailbox of a message from ``src`` to ``dst`` posted by ``side`` ("send" or "recv"):
        one per tag, or (``by_tag=False``, as NCCL matches) the n-th posted send meets the n-th
        posted receive of the pair, whatever their tags."""
        with self._lock:
            if not self.by_tag:
                n = self._posted.get((src, dst, side), 0)
                self._posted[(src, dst, side)] = n + 1
                tag = -1 - n
            return self._boxes.setdefault((src, dst, tag), queue.Queue())

    def transport(self, rank: int) -> LocalTransport:
        return LocalTransport(self, rank)


class LocalTransport:
    """Rank ``rank``'s endpoint on a :class:`LocalFabric`."""

    def __init__(self, fabric: LocalFabric, rank: int):
        self.fabric, self.rank, self.size = fabric, rank, fabric.size
        self.comm = fabric  # per-group state (failures, agreements, scratch) is keyed on the fabric
        self.matches_tags = fabric.by_tag

    def isend(self, tensor: Any, peer: int, tag: int) -> _Done:
        self.fabric.box(self.rank, peer, tag, "send").put(tensor.detach().clone())
        return _Done()

    def irecv(self, tensor: Any, peer: int, tag: int) -> _Done:
        box = self.fabric.box(peer, self.rank, tag, "recv")

        def finish(timeout: float) -> None:
            try:
                data = box.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"no message from rank {peer} (tag {tag}) within {timeout:g} s") from None
            if data.shape != tensor.shape:
                raise RuntimeError(f"message from rank {peer} has {data.numel()} elements, expected {tensor.numel()}")
            tensor.copy_(data)

        return _Done(finish)

    @staticmethod
    def wait(work: Any, timeout: float) -> None:
        work.wait(timeout)

    def all_gather_bytes(self, payload: bytes, length: int, timeout: float) -> list[bytes]:
        f = self.fabric
        with f._gather_cv:
            rnd = f._gather_round[self.rank]
            f._gather_round[self.rank] += 1
            f._gather.setdefault(rnd, [None] * f.size)[self.rank] = payload[:length]
            f._gather_cv.notify_all()
            ok = f._gather_cv.wait_for(lambda: all(v is not None for v in f._gather[rnd]), timeout=timeout)
            if not ok:
                missing = [r for r, v in enumerate(f._gather[rnd]) if v is None]
                raise TimeoutError(f"ranks {missing} did not join the fingerprint exchange within {timeout:g} s")
            return list(f._gather[rnd])


def run_ranks(
    size: int, fn: Callable[[int, LocalTransport], Any], *, timeout: float = 60.0, by_tag: bool = True
) -> list:
    """Run ``fn(rank, transport)`` for every rank in threads; results in rank order. ``by_tag``:
    messages matched by tag (as gloo), else in the order each pair posts them (as NCCL)."""
    fabric = LocalFabric(size, by_tag=by_tag)
    results: list = [None] * size
    errors: list = [None] * size

    def body(r: int) -> None:
        try:
            results[r] = fn(r, fabric.transport(r))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors[r] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    for e in errors:
        if e is not None:
            raise e
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"run_ranks: ranks still running after {timeout:g} s")
    return results
