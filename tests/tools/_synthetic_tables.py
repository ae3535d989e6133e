"""nccl-tests tables written from the simulator's own times with known parameters, for the tests of
``treecoll simulate validate`` and ``treecoll simulate calibrate``.

The tables are written as nccl-tests prints them (src/util.cu: size, count, type, redop, root, time, algbw,
busbw, #wrong for the out-of-place and the in-place run; algbw = size / time, busbw = algbw x (n-1)/n for
all_gather) from times the simulator gives with known parameters, so the parameters a fit must find are
known exactly.
"""

from __future__ import annotations

from pathlib import Path

from treecoll.collectives.sim.profiles import get_profile
from treecoll.tools import calibration, validation
from treecoll.topo.machines import MachineFacts, MachineFlags, machine_topology

GPU = "NVIDIA H100 80GB HBM3"
#: the factors the synthetic tables are made with: lat_scale.tree is one no allgather or sendrecv table sees
TRUTH = {
    "link_scale.nvlink": 0.8,
    "link_scale.net": 0.6,
    "hop_scale.nvlink": 1.5,
    "hop_scale.net": 2.5,
    "lat_scale.p2p": 2.0,
    "lat_scale.tree": 3.0,
}
#: nccl-tests binary, busbw / algbw, redop column of the collectives the synthetic tables use
KIND = {
    "allgather": ("all_gather_perf", lambda n: (n - 1) / n, "none"),
    "sendrecv": ("sendrecv_perf", lambda n: 1.0, "sum"),
    "allreduce": ("all_reduce_perf", lambda n: 2 * (n - 1) / n, "sum"),
}


def table(
    hosts: int,
    per: int,
    times_us: dict[int, float],
    head: str = "#",
    collective: str = "allgather",
    in_place: dict[int, float] | None = None,
) -> str:
    """A nccl-tests output of ``collective`` on ``hosts`` x ``per`` GPUs with the given out-of-place times (the
    in-place times the same, or those of ``in_place``)."""
    n = hosts * per
    binary, bus, redop = KIND[collective]
    lines = [
        f"# Collective test starting: {binary}",
        "# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 64(factor) warmup iters: 5 iters: 20",
        "# Using devices",
    ]
    lines += [
        f"#  Rank {r:2d} Group  0 Pid {100 + r:5d} on  node{r // per} device {r % per:2d} [0000:{r:02x}:00] {GPU}"
        for r in range(n)
    ]
    lines.append(
        f"{head}       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong"
    )

    def run(size: int, t: float) -> str:
        alg = size / t / 1e3
        return f"{t:8.2f} {alg:7.2f} {alg * bus(n):7.2f}"

    for size, t in times_us.items():
        count = size // (4 * n) if collective == "allgather" else size // 4
        wrong = "N/A" if collective == "sendrecv" else "0"  # sendrecv does not check in-place results
        inp = run(size, (in_place or {}).get(size, t))
        lines.append(f"{size:12d} {count:12d}     float {redop:>7}      -1 {run(size, t)}      0 {inp}    {wrong}")
    lines.append("# Avg bus bandwidth    : 1.0")
    return "\n".join(lines) + "\n"


def synthetic(
    tmp_path: Path,
    hosts: int,
    per: int,
    values: dict,
    sizes=(1024, 65536, 64 << 20, 1 << 30),
    scale: float = 1.0,
    collective: str = "allgather",
    flags: MachineFlags | None = None,
    algos: tuple[str, ...] = ("ring",),
    glitch: dict[int, float] | None = None,
) -> Path:
    """A table whose times are the simulator's with calibration factors ``values`` (times ``scale``; the sizes
    of ``glitch`` times their factor too)."""
    facts = MachineFacts(hosts=tuple((f"node{h}", per) for h in range(hosts)), gpu_names=(GPU,), nranks=hosts * per)
    topo, _ = machine_topology(flags or MachineFlags(), facts)
    prof = calibration.calibration_from(values)
    times = {
        s: validation.predict(topo, collective, s, algos, prof)[0] * 1e6 * scale * (glitch or {}).get(s, 1.0)
        for s in sizes
    }
    p = tmp_path / f"{collective}-{hosts}x{per}-{scale}.txt"
    p.write_text(table(hosts, per, times, collective=collective))
    return p


def tree_ll():
    """NCCL's LL protocol with the tree's own latencies."""
    from treecoll.collectives.sim.simulator import nccl_hop_profile

    return nccl_hop_profile(get_profile("nccl-ll"), "tree")
