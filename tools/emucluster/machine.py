"""The emulating machine's cores as a resource: a roofline next to the link-only simulator.

On an emulated cluster every byte a rank sends is copied by the machine's few
cores (gloo's buffers, TCP over loopback and veth, the reduction) and every
message costs them a fixed amount of work (the executor's Python, system
calls, waking oversubscribed processes). When the shaped links are fast
(10 Gbit/s on a 2-core machine) those cores, not the links, bound a
collective. The machine's time for a schedule is

    t_machine = (B - L) / C + L / C_loop + M * o

with ``B`` the bytes sent by all ranks, ``L`` the part of them sent between
ranks of one host and ``M`` the messages (all from the schedule the executor
runs), ``C`` the machine's aggregate copy rate between hosts (bytes/s:
TCP through veth, bridge and tbf), ``C_loop`` its rate inside a host (TCP
over loopback, measured by the link check, not fitted; default ``C``) and
``o`` its cost per message (seconds). ``C`` and ``o`` are properties of the
machine, not of an algorithm: :func:`fit` finds them by least squares on the
relative error of calibration measurements (the benchmark uses gloo's
built-in all_reduce at the fastest rate, whose ring crosses hosts at every
hop under interleaved placement), and every other measurement is a held-out
check. The prediction is the roofline ``max(simulator time, t_machine)``:
whichever resource binds.

>>> m = fit([(8e6, 24, 0.0064), (32e6, 24, 0.0184), (96e6, 96, 0.0576)], "example")  # C = 2 GB/s, o = 100 us
>>> round(m.copy_rate / 1e9, 3), round(m.msg_cost * 1e6, 1)
(2.0, 100.0)
>>> round(m.predict(0.003, 8e6, 24), 6)        # the cores bind, not the link
0.0064
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from treecoll.topo.errors import TreecollError

if TYPE_CHECKING:
    from treecoll.collectives.schedule import Schedule

__all__ = ["MachineModel", "fit", "relative_lstsq", "schedule_work", "local_bytes"]


@dataclass(frozen=True)
class MachineModel:
    """``copy_rate``: bytes/s of the whole machine between hosts; ``msg_cost``: seconds per
    message; ``fitted_on``: what the calibration measured (free text); ``local_rate``:
    bytes/s between ranks of one host (None: ``copy_rate``)."""

    copy_rate: float
    msg_cost: float
    fitted_on: str = ""
    local_rate: float | None = None

    def __post_init__(self):
        if not self.copy_rate > 0 or not self.msg_cost >= 0:
            raise TreecollError(
                f"machine model: expected copy_rate > 0 and msg_cost >= 0, got "
                f"{self.copy_rate!r} B/s and {self.msg_cost!r} s; the calibration "
                f"({self.fitted_on or 'no label'}) is not bound by the machine"
            )
        if self.local_rate is not None and not self.local_rate > 0:
            raise TreecollError(f"machine model: expected local_rate > 0 B/s or None, got {self.local_rate!r}")

    def time(self, total_bytes: float, messages: int, local_bytes: float = 0.0) -> float:
        """Seconds the machine's cores need for ``total_bytes`` (``local_bytes`` of them
        between ranks of one host) in ``messages`` messages."""
        local = local_bytes / (self.local_rate or self.copy_rate)
        return (total_bytes - local_bytes) / self.copy_rate + local + messages * self.msg_cost

    def predict(self, sim_time: float, total_bytes: float, messages: int, local_bytes: float = 0.0) -> float:
        """The roofline: the link-only simulator's time or the machine's, whichever is longer."""
        return max(sim_time, self.time(total_bytes, messages, local_bytes))

    def as_dict(self) -> dict:
        return {
            "copy_rate_GBps": self.copy_rate / 1e9,
            "msg_cost_us": self.msg_cost * 1e6,
            "local_rate_GBps": None if self.local_rate is None else self.local_rate / 1e9,
            "fitted_on": self.fitted_on,
        }


def relative_lstsq(x: Sequence[Sequence[float]], t: Sequence[float]) -> list[float]:
    """Coefficients ``k`` minimising the squared relative error of ``x @ k`` against ``t``
    (rows of ``x``: the work terms of one measurement; ``t``: its seconds)."""
    import numpy as np

    a = np.asarray(x, dtype=float) / np.asarray(t, dtype=float)[:, None]
    return [float(v) for v in np.linalg.lstsq(a, np.ones(len(a)), rcond=None)[0]]


def fit(samples: Sequence[tuple], fitted_on: str = "", local_rate: float | None = None) -> MachineModel:
    """Least squares on relative error: ``samples`` are (total bytes, messages, measured
    seconds) or (total bytes, messages, measured seconds, local bytes); with ``local_rate``
    (bytes/s, known) the local bytes' time is taken off before fitting ``C`` and ``o``.

    Needs two samples or more whose bytes-per-message differ (else ``C`` and ``o``
    cannot be told apart)."""
    rows = []
    for b, m, t, *rest in samples:
        local = rest[0] if rest else 0.0
        if local and local_rate is None:
            raise TreecollError("machine model: samples with local bytes need local_rate (bytes/s)")
        rows.append((b - local, m, t - local / local_rate if local else t))
    if len(rows) < 2 or len({round(b / max(m, 1)) for b, m, _ in rows}) < 2:
        raise TreecollError(
            f"machine model: expected >= 2 calibration samples with different bytes per "
            f"message, got {len(rows)}; measure more sizes"
        )
    inv_rate, cost = relative_lstsq([(b, m) for b, m, _ in rows], [t for _, _, t in rows])
    if not inv_rate > 0:
        raise TreecollError(
            f"machine model: calibration gives a non-positive cost per byte ({inv_rate:.3g} s/B) "
            f"on {fitted_on or 'the samples'}: the machine does not bind there"
        )
    return MachineModel(1.0 / float(inv_rate), max(float(cost), 0.0), fitted_on, local_rate)


def schedule_work(schedule: Schedule, nbytes: int) -> tuple[int, int]:
    """(bytes sent by all ranks, messages sent by all ranks) of ``schedule`` on ``nbytes``."""
    total = sum(schedule.bytes_sent(r, nbytes) for r in range(schedule.nranks))
    messages = sum(1 for steps in schedule.steps for s in steps if s.kind == "send")
    return total, messages


def local_bytes(schedule: Schedule, nbytes: int, host_of: Sequence) -> int:
    """Bytes of ``schedule`` on ``nbytes`` sent between ranks with the same ``host_of[rank]``."""
    cb = schedule.chunk_bytes(nbytes)
    return sum(
        cb[s.chunk]
        for r, steps in enumerate(schedule.steps)
        for s in steps
        if s.kind == "send" and host_of[s.peer] == host_of[r]
    )
