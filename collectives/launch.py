"""Starting the ranks of a job, or joining one already started: the one launcher.

Every way treecoll gets ranks follows one contract: ranks meet through the
``env://`` rendezvous (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
as torchrun sets them), results come back in rank order, the first failure is
re-raised as one :class:`LaunchError` naming the rank, every wait is bounded
(a timeout kills the ranks), and no rank outlives the process that started it.

* :func:`spawn`: single machine, in process. ``P`` processes (multiprocessing's
  ``spawn`` start method) join a gloo group on 127.0.0.1 at a free port and run
  ``fn(rank, P, *args)``; returns the ``P`` results.
* :class:`RankPool`: the same ranks kept alive for many calls (tests and
  benchmarks that run many cases pay the start-up once). :func:`spawn` is a
  pool used once.
* :func:`join`: under torchrun or any ``env://`` launcher (:func:`job_from_env`
  finds the job): join its process group instead of spawning, run ``fn`` on
  this rank and gather every rank's result. :func:`run` picks :func:`join` when
  launched and :func:`spawn` otherwise.
* :func:`run_commands`: ranks that are commands (another interpreter, a command
  inside a network namespace): one environment per rank (built with
  :func:`rendezvous_env`), the first rank that exits non-zero stops the others.

Not launched by anything, ``job_from_env`` finds no job:

>>> job_from_env({}) is None
True
>>> env = rendezvous_env(2, 4, "10.0.0.1", 29500, local_rank=0, local_world=2, group_rank=1)
>>> sorted(env.items())  # doctest: +NORMALIZE_WHITESPACE
[('GROUP_RANK', '1'), ('LOCAL_RANK', '0'), ('LOCAL_WORLD_SIZE', '2'), ('MASTER_ADDR', '10.0.0.1'),
 ('MASTER_PORT', '29500'), ('RANK', '2'), ('WORLD_SIZE', '4')]
>>> job_from_env(env)
Job(rank=2, world=4, master_addr='10.0.0.1', master_port=29500, local_rank=0, local_world=2)
>>> job_from_env({"RANK": "0", "WORLD_SIZE": "2"})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
treecoll.collectives.launch.LaunchError: environment: expected RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT ...
>>> exit_code(0), exit_code(3), exit_code(-9), exit_code(None)
(0, 3, 137, None)
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from treecoll.topo.env import int_var
from treecoll.topo.errors import CollectiveError, TopologyError

__all__ = [
    "LaunchError",
    "Job",
    "JOB_VARIABLES",
    "job_from_env",
    "rendezvous_env",
    "free_port",
    "die_with_parent",
    "RankPool",
    "spawn",
    "join",
    "run",
    "run_commands",
    "CommandsResult",
    "exit_code",
    "TIMEOUT_EXIT",
]

#: the variables of an ``env://`` rendezvous that must all be set to join a launched job
JOB_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: exit code of a group of commands stopped by its timeout (as timeout(1))
TIMEOUT_EXIT = 124
LOCALHOST = "127.0.0.1"


class LaunchError(CollectiveError):
    """A rank failed, timed out or could not start; raised in the process that launched it.

    ``rank``: the rank to blame (None when no single rank is, e.g. a timeout);
    ``remote_traceback``: that rank's traceback as text (the message keeps one line).
    """

    def __init__(self, message: str, *, rank: int | None = None, remote_traceback: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback


# --------------------------------------------------------------------------- env:// rendezvous


@dataclasses.dataclass(frozen=True)
class Job:
    """This process's place in a launched job (what torchrun's variables say)."""

    rank: int
    world: int
    master_addr: str
    master_port: int
    local_rank: int
    local_world: int


def rendezvous_env(
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    *,
    local_rank: int | None = None,
    local_world: int | None = None,
    group_rank: int = 0,
) -> dict[str, str]:
    """The ``env://`` variables of ``rank`` as torchrun sets them (``LOCAL_*`` default to one host)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "MASTER_ADDR": str(master_addr),
        "MASTER_PORT": str(master_port),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "LOCAL_WORLD_SIZE": str(world if local_world is None else local_world),
        "GROUP_RANK": str(group_rank),
    }


def _env_int(env: Mapping[str, str], key: str, lo: int, hi: int | None) -> int:
    try:
        return int_var(env, key, minimum=lo, maximum=hi)
    except TopologyError as e:
        raise LaunchError(f"environment: {e}") from None


def job_from_env(environ: Mapping[str, str] | None = None) -> Job | None:
    """The launched job this process belongs to, or None when neither ``RANK`` nor
    ``WORLD_SIZE`` is set. Half a job (``RANK`` without ``MASTER_PORT``, a rank
    outside the world) raises :class:`LaunchError` naming the variable."""
    env = os.environ if environ is None else environ
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return None
    missing = [k for k in JOB_VARIABLES if not env.get(k)]
    if missing:
        given = [k for k in JOB_VARIABLES if env.get(k)]
        raise LaunchError(
            f"environment: expected {', '.join(JOB_VARIABLES[:-1])} and {JOB_VARIABLES[-1]} together "
            f"(torchrun or any env:// launcher sets them), got {', '.join(given)} without "
            f"{', '.join(missing)}; launch with torchrun, or unset {', '.join(given)}"
        )
    world = _env_int(env, "WORLD_SIZE", 1, None)
    rank = _env_int(env, "RANK", 0, world - 1)
    port = _env_int(env, "MASTER_PORT", 1, 65535)
    local_world = _env_int(env, "LOCAL_WORLD_SIZE", 1, world) if env.get("LOCAL_WORLD_SIZE") else world
    local_rank = _env_int(env, "LOCAL_RANK", 0, local_world - 1) if env.get("LOCAL_RANK") else rank % local_world
    return Job(rank, world, env["MASTER_ADDR"], port, local_rank, local_world)


def free_port(host: str = LOCALHOST) -> int:
    """A TCP port free on ``host`` (bind port 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- no orphans


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux), resolved in the calling process; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _death_signal(prctl: Callable[..., int] | None, parent: int) -> None:
    if prctl is None:
        return
    prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def die_with_parent(parent: int) -> None:
    """Linux: have the kernel kill this process when ``parent`` (the process that started
    it) dies, so that a launcher killed from outside (SIGKILL, a job timeout, Ctrl-C
    twice) leaves no ranks waiting for peers; elsewhere a no-op."""
    _death_signal(_prctl(), parent)


def exit_code(returncode: int | None) -> int | None:
    """A process's exit status as a shell reports it: killed by signal s -> 128 + s."""
    return None if returncode is None else (128 - returncode if returncode < 0 else returncode)


# --------------------------------------------------------------------------- Python ranks


def _failure(exc: BaseException) -> tuple[str, str]:
    """``("Type: first line of the message", traceback text)`` of an exception being handled."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return (f"{type(exc).__name__}: {first}" if first else type(exc).__name__), traceback.format_exc()


def _rank_main(
    rank: int, world: int, port: int, backend: str, timeout: float, threads: int, tasks, answers, parent: int
) -> None:
    """One rank of a :class:`RankPool`: join the group, then run the tasks read from ``tasks``
    (answering each on ``answers``) until the pool closes its end."""
    die_with_parent(parent)
    os.environ.update(rendezvous_env(rank, world, LOCALHOST, port))
    try:
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        if backend == "nccl":  # rank r drives GPU r (mod the count), chosen before NCCL's first call
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend, init_method="env://", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
        )
    except BaseException as e:  # reported to the parent, which raises
        answers.send((0, rank, False, _failure(e)))
        return
    answers.send((0, rank, True, None))
    try:
        while True:
            try:
                tid, blob = tasks.recv()
            except EOFError:  # the pool closed its end: stop
                break
            try:
                fn, args = pickle.loads(blob)
                answers.send((tid, rank, True, pickle.dumps(fn(rank, world, *args))))
            except BaseException as e:  # reported to the parent, which raises
                answers.send((tid, rank, False, _failure(e)))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


class RankPool:
    """``nproc`` ranks started once (gloo on 127.0.0.1 by default) that run many calls.

    ``pool.run(fn, *args)`` runs ``fn(rank, nproc, *args)`` on every rank and returns
    the results in rank order. ``fn`` must be a module-level function; ``args`` and
    the results must pickle. ``timeout`` (seconds) is the process group's timeout and
    the default bound of a call; ``start_timeout`` bounds the start (importing torch
    on a loaded machine); ``threads``: torch intra-op threads per rank. A rank that
    raises makes :meth:`run` raise :class:`LaunchError` naming it once the other
    ranks answered (at most ``grace`` seconds later: then the pool is killed); a
    call that exceeds its timeout, or a rank that dies, kills the pool. A pool is
    a context manager; :meth:`close` stops the ranks.
    """

    def __init__(
        self,
        nproc: int,
        *,
        backend: str = "gloo",
        threads: int = 1,
        timeout: float = 60.0,
        start_timeout: float = 120.0,
        grace: float = 5.0,
        where: str = "launch",
    ):
        if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
            raise LaunchError(f"{where}: expected a positive number of processes, got {nproc!r}")
        ctx = multiprocessing.get_context("spawn")
        self.nproc, self.timeout, self.grace, self.where = nproc, float(timeout), float(grace), where
        self._broken: str | None = None
        self._closed = False
        self._tid = 0
        self._gone: set[int] = set()  # ranks whose answer pipe reached its end (the process exited)
        self._sent = [0] * nproc  # per rank: the id of the last call written to it
        self._done = [0] * nproc  # per rank: the id of the last call it answered
        # Plain pipes, two per rank, rather than multiprocessing queues: a queue's locks are named
        # semaphores that its feeder thread may release while the interpreter exits, after the
        # resource tracker was told of them and before it is told they are gone.
        tasks = [ctx.Pipe(duplex=False) for _ in range(nproc)]  # (rank's end, pool's end)
        answers = [ctx.Pipe(duplex=False) for _ in range(nproc)]  # (pool's end, rank's end)
        self._tasks = [w for _, w in tasks]
        self._answers = [r for r, _ in answers]
        port = free_port()
        self._procs = [
            ctx.Process(
                target=_rank_main,
                name=f"treecoll-rank{r}",
                daemon=True,
                args=(r, nproc, port, backend, self.timeout, threads, tasks[r][0], answers[r][1], os.getpid()),
            )
            for r in range(nproc)
        ]
        try:
            for r, p in enumerate(self._procs):
                p.start()
                tasks[r][0].close()  # the rank holds its own copies: its exit closes the pipes
                answers[r][1].close()
            self._wait(0, list(range(nproc)), nproc, start_timeout, "start")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout: float | None = None,
        ranks: Sequence[int] | None = None,
        expect: int | None = None,
    ) -> list:
        """Run ``fn(rank, nproc, *args)`` on every rank (or on ``ranks``); results in rank
        order, None for a rank that did not run it. ``expect``: return once that many
        ranks answered (a rank may leave the group on purpose); default all. A rank still
        busy with an earlier call that returned without it (``expect``) is given the call
        once it has answered that one (its answer is dropped), within ``timeout``: a pipe
        holds only so much, and a rank writing a large answer while the pool writes it a
        large call would wait on each other."""
        if self._broken:
            raise LaunchError(
                f"{self.where}: expected a working pool, got one stopped earlier ({self._broken}); start a new one"
            )
        try:
            blob = pickle.dumps((fn, args))
        except Exception as e:  # noqa: BLE001 - any pickling failure is the caller's to fix
            raise LaunchError(
                f"{self.where}: expected a module-level function and picklable arguments, got "
                f"{getattr(fn, '__qualname__', fn)!r}: {type(e).__name__}: {e}"
            ) from None
        ranks = list(range(self.nproc)) if ranks is None else list(ranks)
        bad = [r for r in ranks if not isinstance(r, int) or not 0 <= r < self.nproc]
        if bad or not ranks:
            raise LaunchError(f"{self.where}: ranks: expected ranks in 0..{self.nproc - 1}, got {ranks}")
        timeout = self.timeout if timeout is None else timeout
        what = getattr(fn, "__name__", "call")
        self._settle(ranks, timeout, what)
        self._tid += 1
        for r in ranks:
            with contextlib.suppress(OSError):  # a rank that exited: the wait names it
                self._tasks[r].send((self._tid, blob))
            self._sent[r] = self._tid
        answers = self._wait(self._tid, ranks, len(ranks) if expect is None else expect, timeout, what)
        return [pickle.loads(answers[r][1]) if r in answers else None for r in range(self.nproc)]

    def _wait(self, tid: int, ranks: list[int], need: int, timeout: float, what: str) -> dict:
        """Collect ``need`` answers to task ``tid`` from ``ranks``: ``{rank: (True, result)}``;
        raise :class:`LaunchError` (and stop the pool when ranks may be stuck) otherwise."""
        answers: dict[int, tuple] = {}
        failed: list[int] = []
        deadline = time.monotonic() + timeout
        settle = None  # after a failure: when to stop waiting for the other ranks
        while len(answers) < need and not (settle and time.monotonic() > settle):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [r for r in ranks if r not in answers]
                self._stop(f"{what} timed out")
                raise LaunchError(
                    f"{self.where}: {what}: expected {need} ranks to answer within {timeout:g} s, "
                    f"got no answer from ranks {missing}; every rank was killed"
                )
            received = self._receive(min(left, 0.25))
            if not received:
                dead = self._dead(ranks, answers)
                gone = {r for r, _ in dead}
                if dead and len(answers) + len([r for r in ranks if r not in answers and r not in gone]) < need:
                    rank, code = dead[0]
                    self._stop(f"rank {rank} exited")
                    raise LaunchError(
                        f"{self.where}: {what}: rank {rank} exited with code {code} without an answer; "
                        f"the other ranks were stopped",
                        rank=rank,
                    ) from None
                continue
            for t, r, ok, payload in received:
                if t != tid:
                    continue
                answers[r] = (ok, payload)
                if not ok:
                    failed.append(r)
                    settle = settle or time.monotonic() + self.grace
        if failed:
            rank = failed[0]
            message, remote = answers[rank][1]
            stuck = [r for r in ranks if r not in answers]
            if stuck:
                self._stop(f"rank {rank} failed while ranks {stuck} were busy")
            also = f" (ranks {failed[1:]} failed too)" if len(failed) > 1 else ""
            raise LaunchError(f"{self.where}: rank {rank} failed: {message}{also}", rank=rank, remote_traceback=remote)
        return answers

    def _settle(self, ranks: list[int], timeout: float, what: str) -> None:
        """Wait until every live rank of ``ranks`` has answered every call written to it,
        dropping those answers (their calls returned); stop the pool after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while busy := [
            r for r in ranks if self._done[r] < self._sent[r] and r not in self._gone and self._procs[r].is_alive()
        ]:
            left = deadline - time.monotonic()
            if left <= 0:
                self._stop(f"{what}: ranks {busy} still busy")
                raise LaunchError(
                    f"{self.where}: {what}: expected ranks {busy} to finish the earlier call they were left "
                    f"running (expect=) within {timeout:g} s, got no answer; every rank was killed"
                )
            self._receive(min(left, 0.25))

    def _receive(self, timeout: float) -> list[tuple]:
        """The next message of every rank that sent one within ``timeout`` seconds:
        ``(task id, rank, ok, payload)``; a rank whose pipe ended joins ``_gone``."""
        live = {self._answers[r]: r for r in range(self.nproc) if r not in self._gone}
        received = []
        for conn in multiprocessing.connection.wait(list(live), timeout):
            try:
                message = conn.recv()
            except (EOFError, OSError):
                self._gone.add(live[conn])
                continue
            received.append(message)
            self._done[message[1]] = max(self._done[message[1]], message[0])
        return received

    def _dead(self, ranks: list[int], answers: dict) -> list[tuple[int, int]]:
        """(rank, exit code) of ranks that exited without answering, once every message
        they sent on the way out was read."""
        dead = []
        for r in ranks:
            if r in answers:
                continue
            if r in self._gone:
                self._procs[r].join(timeout=1.0)  # the pipe ends as the process exits: reap it
                dead.append(r)
            elif self._procs[r].exitcode is not None and not self._answers[r].poll():
                dead.append(r)
        return [(r, exit_code(self._procs[r].exitcode)) for r in dead]

    def _stop(self, why: str) -> None:
        self._broken = why
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=2.0)

    def close(self) -> None:
        """Stop the ranks (they leave their group), killing any that does not stop within 5 s,
        and release the pipes and process handles. Closing a closed pool does nothing."""
        if self._closed:
            return
        self._broken = self._broken or "closed"
        for conn in self._tasks:
            conn.close()  # the rank reads the end of its tasks and stops
        deadline = time.monotonic() + 5.0
        for p in self._procs:
            if p.pid is not None:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        for conn in self._answers:
            conn.close()
        self._closed = True
        for p in self._procs:
            with contextlib.suppress(ValueError):  # a process that outlived its kill keeps its handles
                p.close()


def spawn(
    fn: Callable[..., Any],
    nproc: int,
    *args: Any,
    timeout: float = 60.0,
    threads: int = 1,
    backend: str = "gloo",
    where: str = "launch",
) -> list:
    """Run ``fn(rank, nproc, *args)`` in ``nproc`` new processes joined in one group
    (gloo, 127.0.0.1, a free port); return the results in rank order.

    ``timeout`` (seconds) bounds the call and is the group's own timeout (the
    start is bounded apart). The first rank that raises makes this raise
    :class:`LaunchError` ``"<where>: rank r failed: Type: message"`` (its traceback
    in ``remote_traceback``); a timeout kills every rank and raises.
    """
    with RankPool(nproc, backend=backend, threads=threads, timeout=timeout, grace=2.0, where=where) as pool:
        return pool.run(fn, *args)


def join(
    fn: Callable[..., Any], *args: Any, backend: str | None = None, timeout: float = 600.0, where: str = "launch"
) -> list:
    """Under torchrun (or any ``env://`` launcher): run ``fn(rank, world, *args)`` on this
    rank of the launched job and return every rank's result, in rank order, on every rank.

    The default process group is created when it does not exist yet (``backend``:
    NCCL with this rank's ``cuda:LOCAL_RANK`` when CUDA is available, else gloo)
    and destroyed afterwards; an existing one is used as it is. Every rank raises
    :class:`LaunchError` naming the lowest rank that failed, so no rank is left
    waiting for the others.
    """
    job = job_from_env()
    if job is None:
        raise LaunchError(
            f"{where}: expected a launched job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by "
            f"torchrun or another env:// launcher), got none; use spawn() to start processes"
        )
    import datetime

    import torch
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "nccl":
            torch.cuda.set_device(job.local_rank)
        dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        try:
            outcome = (True, fn(rank, world, *args))
        except Exception as e:  # noqa: BLE001 - gathered, then raised on every rank
            outcome = (False, _failure(e))
        gathered: list = [None] * world
        dist.all_gather_object(gathered, outcome)
    finally:
        if created:
            dist.barrier()  # every rank is done with the group before any tears it down (gloo aborts otherwise)
            dist.destroy_process_group()
    failed = [r for r, (ok, _) in enumerate(gathered) if not ok]
    if failed:
        message, remote = gathered[failed[0]][1]
        also = f" (ranks {failed[1:]} failed too)" if len(failed) > 1 else ""
        raise LaunchError(f"{where}: rank {failed[0]} failed: {message}{also}", rank=failed[0], remote_traceback=remote)
    return [value for _, value in gathered]


def run(
    fn: Callable[..., Any],
    nproc: int | None,
    *args: Any,
    timeout: float = 60.0,
    threads: int = 1,
    backend: str | None = None,
    where: str = "launch",
) -> list:
    """:func:`join` the launched job when there is one (``nproc``, if given, must be its
    WORLD_SIZE), else :func:`spawn` ``nproc`` processes. Results in rank order."""
    job = job_from_env()
    if job is not None:
        if nproc is not None and nproc != job.world:
            raise LaunchError(
                f"{where}: expected {job.world} processes (the WORLD_SIZE of the launched job) or none, got {nproc}"
            )
        return join(fn, *args, backend=backend, timeout=timeout, where=where)
    if nproc is None:
        raise LaunchError(
            f"{where}: expected a number of processes to start (no launched job: RANK and "
            f"WORLD_SIZE are unset), got none"
        )
    return spawn(fn, nproc, *args, timeout=timeout, threads=threads, backend=backend or "gloo", where=where)


# --------------------------------------------------------------------------- command ranks


@dataclasses.dataclass(frozen=True)
class CommandsResult:
    """Outcome of :func:`run_commands`. ``returncodes[r]``: rank r's exit code (128 + s when
    killed by signal s, None if it never started); ``failed_rank``: the first rank seen
    exiting non-zero; ``returncode``: that rank's code, :data:`TIMEOUT_EXIT` after a
    timeout, else 0."""

    returncode: int
    returncodes: tuple[int | None, ...]
    failed_rank: int | None
    timed_out: bool
    seconds: float


def _pump(src: IO[bytes], dst: IO[str], tag: str) -> None:
    for line in iter(src.readline, b""):
        dst.write(tag + line.decode(errors="replace"))
        dst.flush()
    src.close()


def _terminate(procs: Sequence[subprocess.Popen | None], grace: float) -> None:
    """SIGTERM every live rank's process group, SIGKILL after ``grace`` seconds."""
    live = [p for p in procs if p is not None and p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
        deadline = time.monotonic() + grace
        while live and time.monotonic() < deadline:
            live = [p for p in live if p.poll() is None]
            time.sleep(0.02)
        if not live:
            return
    for p in live:
        p.wait()


def run_commands(
    argvs: Sequence[Sequence[str]],
    envs: Sequence[Mapping[str, str]],
    *,
    timeout: float | None = None,
    grace: float = 3.0,
    tag_output: bool = False,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> CommandsResult:
    """Run rank r as ``argvs[r]`` with environment ``envs[r]`` (complete: nothing is inherited)
    and wait for all of them.

    Each rank runs in its own session and dies with this process (Linux). When a rank
    exits non-zero or ``timeout`` seconds pass, every other rank's process group gets
    SIGTERM, then SIGKILL after ``grace`` seconds. With ``tag_output`` each output line
    of rank r is written to ``stdout``/``stderr`` (default sys.stdout/sys.stderr)
    prefixed ``[r<r>] ``; otherwise the ranks inherit this process's outputs.
    """
    if len(argvs) != len(envs) or not argvs or not all(argvs):
        raise LaunchError(
            f"run_commands: expected one non-empty command and one environment per rank, got "
            f"{len(argvs)} commands and {len(envs)} environments"
        )
    if timeout is not None and timeout <= 0:
        raise LaunchError(f"run_commands: timeout: expected a positive number of seconds, got {timeout!r}")
    prctl, parent = _prctl(), os.getpid()
    procs: list[subprocess.Popen | None] = [None] * len(argvs)
    pumps: list[threading.Thread] = []
    t0 = time.monotonic()
    first_fail: int | None = None
    timed_out = False
    try:
        for r, argv in enumerate(argvs):
            pipe = subprocess.PIPE if tag_output else None
            try:
                procs[r] = subprocess.Popen(
                    list(argv),
                    env=dict(envs[r]),
                    stdout=pipe,
                    stderr=pipe,
                    start_new_session=True,
                    preexec_fn=lambda: _death_signal(prctl, parent),
                )
            except OSError as e:
                raise LaunchError(f"rank {r}: cannot start {argv[0]!r}: {e}", rank=r) from None
            if tag_output:
                for src, dst in ((procs[r].stdout, stdout or sys.stdout), (procs[r].stderr, stderr or sys.stderr)):
                    t = threading.Thread(target=_pump, args=(src, dst, f"[r{r}] "), daemon=True)
                    t.start()
                    pumps.append(t)
        while True:
            running = False
            for r, p in enumerate(procs):
                rc = p.poll()
                if rc is None:
                    running = True
                elif rc != 0 and first_fail is None:
                    first_fail = r
            if first_fail is not None or not running:
                break
            if timeout is not None and time.monotonic() - t0 > timeout:
                timed_out = True
                break
            time.sleep(0.02)
    finally:
        _terminate(procs, grace)
        for t in pumps:
            t.join(timeout=2)
    codes = tuple(exit_code(p.returncode) if p is not None else None for p in procs)
    rc = TIMEOUT_EXIT if timed_out else codes[first_fail] if first_fail is not None else 0
    return CommandsResult(rc, codes, first_fail, timed_out, time.monotonic() - t0)
