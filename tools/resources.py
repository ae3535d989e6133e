"""How many processes this machine can take: checked before a command or benchmark starts any.

Every option that starts processes (``treecoll decode --nproc``, ``treecoll emu
run --hosts x --ranks-per-host``, the benchmarks' process counts) calls
:func:`check_processes` first. Two limits, both overridable with the command's
``--oversubscribe`` flag:

* cores: at most :data:`RANKS_PER_CORE` processes per core this process may run
  on (``os.sched_getaffinity``). gloo ranks on CPU each compute and poll; the
  shipped demo and benchmarks run up to 4 ranks per core on a 2-core machine,
  beyond that every collective waits for time slices of every rank and the
  machine's interactive response goes with it;
* memory: the estimated peak of all processes together must fit in the memory
  the kernel reports available (``MemAvailable`` of ``/proc/meminfo``).
  Each process counts a baseline (:data:`PROCESS_BASELINE_BYTES`, a Python
  process with torch imported and a gloo group joined, unless the command
  measured its own) plus what the command says it allocates (the KV cache
  shard of ``decode``, ...).

The baseline was measured on Linux x86-64, torch 2.13 CPU build: a spawned
process that imports torch, joins a 2- or 4-rank gloo group on 127.0.0.1 and
runs one all_reduce has a resident set of 224 MiB (145 MiB of it private,
79 MiB shared library pages; ``/proc/self/smaps_rollup``). Counting the
shared pages in every process overestimates a large group by that much per
process: the check errs on the side of refusing.

>>> check_processes(8, option="--nproc 8", cores=2, memory=8 << 30)["max_processes"]
8
>>> check_processes(9, option="--nproc 9", cores=2, memory=8 << 30)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
treecoll.tools.units.UsageError: --nproc 9: expected at most 8 processes on this machine (2 cores x 4 per core); ...
>>> check_processes(4, option="--nproc 4", per_process_bytes=1 << 30, cores=2, memory=2 << 30)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
treecoll.tools.units.UsageError: --nproc 4: ... got an estimated 5 GiB (4 x (256 MiB per process + 1 GiB data)); ...
"""

from __future__ import annotations

import os
from typing import Any

from treecoll.topo.fmt import fmt_bytes

from .units import UsageError

__all__ = [
    "check_processes",
    "check_topology_ranks",
    "usable_cores",
    "available_memory",
    "proc_bytes",
    "PROCESS_BASELINE_BYTES",
    "RANKS_PER_CORE",
    "OVERSUBSCRIBE_HELP",
]

#: processes per usable core before a command refuses without --oversubscribe
RANKS_PER_CORE = 4
#: peak memory of one process with torch imported and a gloo group joined (see the module docstring)
PROCESS_BASELINE_BYTES = 256 << 20
#: the help text of every --oversubscribe flag
OVERSUBSCRIBE_HELP = (
    f"start the processes even when they exceed {RANKS_PER_CORE} per core or the memory available (default: refuse)"
)


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def proc_bytes(path: str, key: str) -> int | None:
    """The ``key:  N kB`` line of a Linux /proc file in bytes (``proc_bytes("/proc/meminfo",
    "MemAvailable")``); None where the file or the line does not exist."""
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory() -> int | None:
    """Bytes of memory available to new processes without swapping (Linux ``MemAvailable``;
    free physical pages elsewhere); ``None`` when the system does not say."""
    avail = proc_bytes("/proc/meminfo", "MemAvailable")
    if avail is not None:
        return avail
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def check_processes(
    nproc: int,
    *,
    option: str,
    per_process_bytes: int = 0,
    extra_bytes: int = 0,
    baseline_bytes: int = PROCESS_BASELINE_BYTES,
    oversubscribe: bool = False,
    cores: int | None = None,
    memory: int | None = None,
) -> dict[str, Any]:
    """Refuse (:class:`~tools.units.UsageError`, one line starting with ``option``, e.g.
    ``"--nproc 9"``) to start ``nproc``
    processes that exceed :data:`RANKS_PER_CORE` per core or the memory available, unless
    ``oversubscribe``. Returns the numbers checked (plain data, for ``--json``).

    ``per_process_bytes``: what each process allocates beyond ``baseline_bytes``;
    ``extra_bytes``: what one of them allocates on top (e.g. rank 0's reference).
    ``cores`` / ``memory`` default to this machine's (:func:`usable_cores`, :func:`available_memory`).
    """
    cores = usable_cores() if cores is None else cores
    memory = available_memory() if memory is None else memory
    need = nproc * (baseline_bytes + per_process_bytes) + extra_bytes
    plan = {
        "processes": nproc,
        "cores": cores,
        "max_processes": cores * RANKS_PER_CORE,
        "memory_needed_bytes": need,
        "memory_available_bytes": memory,
        "oversubscribe": oversubscribe,
    }
    if oversubscribe:
        return plan
    hint = "; pass --oversubscribe to start them anyway"
    if nproc > cores * RANKS_PER_CORE:
        raise UsageError(
            f"{option}: expected at most {cores * RANKS_PER_CORE} processes on this machine "
            f"({cores} cores x {RANKS_PER_CORE} per core){hint}"
        )
    if memory is not None and need > memory:
        data = f" + {fmt_bytes(per_process_bytes)} data" if per_process_bytes else ""
        more = f" + {fmt_bytes(extra_bytes)} in one of them" if extra_bytes else ""
        raise UsageError(
            f"{option}: expected processes that fit in the {fmt_bytes(memory)} of memory available, "
            f"got an estimated {fmt_bytes(need)} ({nproc} x ({fmt_bytes(baseline_bytes)} per process"
            f"{data}){more}){hint}"
        )
    return plan


def check_topology_ranks(topology: dict | None, nproc: int, *, option: str = "--nproc") -> None:
    """Refuse (:class:`~tools.units.UsageError`) more ranks than the GPUs of ``topology``
    (a topology's plain dict; None: nothing to check), each rank running on its own GPU.

    >>> check_topology_ranks({"name": "t", "nodes": [{"kind": "gpu"}, {"kind": "cpu"}]}, 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    treecoll.tools.units.UsageError: --nproc 2: expected at most 1 (the GPUs of topology 't'), got 2; ...
    """
    if topology is None:
        return
    gpus = sum(1 for n in topology["nodes"] if n.get("kind") == "gpu")
    if nproc > gpus:
        raise UsageError(
            f"{option} {nproc}: expected at most {gpus} (the GPUs of topology "
            f"{topology.get('name')!r}), got {nproc}; give a larger topology"
        )
