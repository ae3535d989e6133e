"""treecoll.collectives.launch, the one launcher: spawned ranks, the rank pool, joining a job started
with torchrun's variables, and ranks that are commands. Real processes throughout."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from treecoll.collectives import launch
from treecoll.collectives.launch import CommandsResult, LaunchError
from treecoll.topo.errors import CollectiveError

from tests.collectives import _coll_tasks as tasks

JOB = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500"}
PY = sys.executable


# --------------------------------------------------------------------------- the env:// variables


@pytest.mark.parametrize(
    "env, msg",
    [
        (
            {"RANK": "0"},
            "environment: expected RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT together (torchrun or "
            "any env:// launcher sets them), got RANK without WORLD_SIZE, MASTER_ADDR, MASTER_PORT; launch "
            "with torchrun, or unset RANK",
        ),
        ({**JOB, "RANK": "2"}, "environment: RANK='2': expected an integer 0..1"),
        ({**JOB, "WORLD_SIZE": "0"}, "environment: WORLD_SIZE='0': expected an integer >= 1"),
        ({**JOB, "MASTER_PORT": "http"}, "environment: MASTER_PORT='http': expected an integer 1..65535"),
        ({**JOB, "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "environment: LOCAL_RANK='2': expected an integer 0..1"),
    ],
)
def test_half_a_job_is_refused_naming_the_variable(env, msg):
    with pytest.raises(LaunchError) as info:
        launch.job_from_env(env)
    assert str(info.value) == msg


def test_a_job_from_torchrun_variables():
    assert launch.job_from_env({"MASTER_ADDR": "x"}) is None
    assert launch.job_from_env(JOB) == launch.Job(1, 2, "10.1.2.3", 29500, 1, 2)
    # 8 ranks, 4 per host: rank 5 is the second of host 1 (torchrun's LOCAL_RANK when it is not given)
    env = {**JOB, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    assert launch.job_from_env(env) == launch.Job(5, 8, "10.1.2.3", 29500, 1, 4)
    assert launch.job_from_env(launch.rendezvous_env(3, 4, "h", 7)) == launch.Job(3, 4, "h", 7, 3, 4)


def test_run_spawns_without_a_job_and_joins_one_of_the_same_size(monkeypatch):
    for key in (*launch.JOB_VARIABLES, "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(LaunchError, match=r"^launch: expected a number of processes to start \(no launched job"):
        launch.run(tasks.whoami, None)
    for key, value in JOB.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(
        LaunchError,
        match=r"^launch: expected 2 processes \(the WORLD_SIZE of the launched job\) "
        r"or none, got 3$",
    ):
        launch.run(tasks.whoami, 3)
    with pytest.raises(LaunchError, match=r"^launch: expected a positive number of processes, got 0$"):
        launch.RankPool(0)


# --------------------------------------------------------------------------- the pool (4 ranks, shared)


def test_results_in_rank_order_with_the_rendezvous_variables(pool4):
    assert pool4.run(tasks.whoami) == [(r, 4, (str(r), "4", str(r), "127.0.0.1"), 6.0) for r in range(4)]
    assert pool4.run(tasks.rank_only, ranks=[3, 1]) == [None, 10, None, 30]


def test_a_failing_rank_is_named_and_the_pool_goes_on(pool4):
    with pytest.raises(LaunchError, match=r"^launch: rank 2 failed: ValueError: rank 2 refuses$") as info:
        pool4.run(tasks.refuse_on, 2)
    assert isinstance(info.value, CollectiveError) and info.value.rank == 2
    assert 'raise ValueError(f"rank {bad} refuses")' in info.value.remote_traceback
    with pytest.raises(
        LaunchError,
        match=r"^launch: rank 0 failed: AttributeError: Can't pickle local object "
        r"'unpicklable_on.<locals>.<lambda>'$",
    ):
        pool4.run(tasks.unpicklable_on, 0)
    assert pool4.run(tasks.rank_only) == [0, 10, 20, 30]


def test_a_rank_left_writing_a_large_answer_then_given_a_large_call(pool4):
    """expect=1 returns while ranks 1-3 still run; they then write answers larger than a pipe
    holds while the pool writes them the next call, larger than a pipe holds too: the pool reads
    (and drops) the earlier answers first, so neither side waits for the other forever."""
    import threading

    big = 4 << 20
    assert pool4.run(tasks.late_large_answer, 0.5, big, expect=1) == [None, None, None, None]
    got = []
    t = threading.Thread(target=lambda: got.append(pool4.run(tasks.length_of, bytes(big), timeout=30)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the pool and its ranks wait on each other"
    assert got == [[big] * 4]


def test_what_cannot_reach_the_ranks_is_refused_before_sending(pool4):
    with pytest.raises(
        LaunchError,
        match=r"^launch: expected a module-level function and picklable arguments, "
        r"got 'test_what_cannot_reach_the_ranks_is_refused_before_sending.<locals>",
    ):
        pool4.run(lambda rank, world: rank)
    with pytest.raises(LaunchError, match=r"^launch: ranks: expected ranks in 0\.\.3, got \[4\]$"):
        pool4.run(tasks.rank_only, ranks=[4])
    assert pool4.run(tasks.rank_only, ranks=[0]) == [0, None, None, None]


# --------------------------------------------------------------------------- spawn (its own ranks)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _pids(directory) -> list[int]:
    return [int(p.read_text()) for p in sorted(directory.glob("rank*.pid"))]


def test_spawn_reraises_the_first_failing_rank():
    with pytest.raises(LaunchError, match=r"^decode: rank 1 failed: ValueError: rank 1 refuses$") as info:
        launch.spawn(tasks.refuse_on, 2, 1, timeout=30, where="decode")
    assert info.value.rank == 1 and "Traceback" in info.value.remote_traceback


_CYCLES = """
import json, os, signal
from multiprocessing import resource_tracker
from treecoll.collectives import launch

registered = []
_register = resource_tracker.register


def register(name, rtype):
    registered.append(rtype)
    _register(name, rtype)


resource_tracker.register = register


def work(rank, world, how):
    if how == "raise" and rank == world - 1:
        raise ValueError("refused")
    if how == "kill" and rank == world - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return rank


def fds():
    return len(os.listdir("/proc/self/fd"))


if __name__ == "__main__":
    resource_tracker.ensure_running()  # started by the first pool otherwise; its pipe stays open
    fds_before = fds()
    out = {}
    with launch.RankPool(2, where="cycle") as pool:
        out["ok"] = pool.run(work, "ok")
        for how in ("raise", "kill"):
            try:
                pool.run(work, how)
            except launch.LaunchError as e:
                out[how] = str(e)
    out["last"] = launch.spawn(work, 1, "ok", where="cycle")
    out["fds"] = fds() - fds_before
    out["registered"] = registered
    print(json.dumps(out))
    # the process exits at once, as `make demo` does after its last pool
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_pools_started_and_closed_leave_nothing_for_the_resource_tracker(tmp_path):
    """A process that starts and closes pools (a rank raising, a rank killed, the last pool closed
    just before the process exits) prints nothing on stderr, leaves no file descriptor open and
    registers nothing (named semaphores, shared memory) with multiprocessing's resource tracker.
    A pool built on spawn-context queues registers three semaphores per queue; their finalizer can
    run in a queue's feeder thread while the process exits, and then the tracker warns at shutdown
    of a "leaked semaphore" that was unlinked already."""
    script = tmp_path / "cycles.py"
    script.write_text(_CYCLES)
    proc = subprocess.run([PY, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] == [0, 1] and out["last"] == [0]
    assert out["raise"] == "cycle: rank 1 failed: ValueError: refused"
    assert out["kill"] == "cycle: work: rank 1 exited with code 137 without an answer; the other ranks were stopped"
    assert out["fds"] == 0
    assert out["registered"] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_rank_past_the_timeout_is_killed_with_its_group(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(
        LaunchError,
        match=r"^launch: sleep_on: expected 2 ranks to answer within 2 s, got no "
        r"answer from ranks \[0\]; every rank was killed$",
    ):
        launch.spawn(tasks.sleep_on, 2, 0, 120, str(tmp_path), timeout=2)
    assert time.monotonic() - t0 < 60
    pids = _pids(tmp_path)
    assert len(pids) == 2 and not any(_alive(p) for p in pids)


def _kill_parent_then_check_ranks(script: str, tmp_path) -> None:
    """Run ``script`` (which starts 2 ranks that write their pids to argv[1]), SIGKILL it
    once both ranks run, and check that the ranks die with it."""
    path = tmp_path / "parent.py"
    path.write_text(script)
    parent = subprocess.Popen([PY, str(path), str(tmp_path)])
    try:
        deadline = time.monotonic() + 90
        while len(_pids(tmp_path)) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.1)
        pids = _pids(tmp_path)
        assert len(pids) == 2, "the ranks did not start"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
    deadline = time.monotonic() + 20
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [p for p in pids if _alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, f"ranks {survivors} outlived their parent"


_SPAWN_PARENT = """
import os, sys, time
from treecoll.collectives import launch

def wait_forever(rank, world, out):
    with open(os.path.join(out, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)

if __name__ == "__main__":
    launch.spawn(wait_forever, 2, sys.argv[1], timeout=120)
"""

_COMMANDS_PARENT = """
import os, sys
from treecoll.collectives import launch

rank = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"
argvs = [[sys.executable, "-c", rank, os.path.join(sys.argv[1], f"rank{r}.pid")] for r in range(2)]
launch.run_commands(argvs, [dict(os.environ)] * 2, timeout=120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
@pytest.mark.parametrize("script", [_SPAWN_PARENT, _COMMANDS_PARENT], ids=["spawn", "commands"])
def test_ranks_die_with_a_killed_parent(script, tmp_path):
    _kill_parent_then_check_ranks(script, tmp_path)


# --------------------------------------------------------------------------- joining a launched job


_JOINED = """
import json
import torch.distributed as dist
from treecoll.collectives import launch

def whoami(rank, world, tag):
    return [rank, world, tag, dist.get_backend()]

def refuse(rank, world):
    if rank == 1:
        raise ValueError("rank 1 refuses")
    return rank

if __name__ == "__main__":
    out = {"created": launch.run(whoami, None, "x"), "after": dist.is_initialized()}
    dist.init_process_group("gloo", init_method="env://")   # a group that exists is used as it is
    out["existing"] = launch.join(whoami, "y")
    try:
        launch.join(refuse)
    except launch.LaunchError as e:
        out["error"] = [str(e), e.rank]
    out["still"] = dist.is_initialized()
    print(json.dumps(out))
    dist.barrier()   # leave together: a group alive at exit aborts the process
    dist.destroy_process_group()
"""


def test_join_a_job_started_with_torchrun_variables(tmp_path):
    script = tmp_path / "joined.py"
    script.write_text(_JOINED)
    port = launch.free_port()
    envs = [{**os.environ, **launch.rendezvous_env(r, 2, "127.0.0.1", port)} for r in range(2)]
    log = io.StringIO()
    res = launch.run_commands([[PY, str(script)]] * 2, envs, timeout=120, tag_output=True, stdout=log, stderr=log)
    assert res == CommandsResult(0, (0, 0), None, False, res.seconds), log.getvalue()[-2000:]
    printed = sorted(line for line in log.getvalue().splitlines() if line[5:6] == "{")
    expected = {
        "created": [[0, 2, "x", "gloo"], [1, 2, "x", "gloo"]],
        "after": False,
        "existing": [[0, 2, "y", "gloo"], [1, 2, "y", "gloo"]],
        "error": ["launch: rank 1 failed: ValueError: rank 1 refuses", 1],
        "still": True,
    }
    assert [(line[:5], json.loads(line[5:])) for line in printed] == [("[r0] ", expected), ("[r1] ", expected)]


# --------------------------------------------------------------------------- command ranks


def test_the_first_failing_command_stops_the_others():
    argvs = [[PY, "-c", "import time; time.sleep(60)"], [PY, "-c", "import sys; sys.exit(3)"]]
    res = launch.run_commands(argvs, [dict(os.environ)] * 2, grace=2.0)
    assert (res.returncode, res.returncodes, res.failed_rank, res.timed_out) == (3, (128 + signal.SIGTERM, 3), 1, False)
    assert res.seconds < 20


def test_commands_past_the_timeout_are_killed_and_output_is_tagged():
    log = io.StringIO()
    argvs = [
        [PY, "-c", "import sys, time; print('a'); print('b', file=sys.stderr, flush=True); time.sleep(60)"],
        [PY, "-c", "import time; print('c', flush=True); time.sleep(60)"],
    ]
    res = launch.run_commands(
        argvs, [dict(os.environ)] * 2, timeout=2.0, grace=1.0, tag_output=True, stdout=log, stderr=log
    )
    assert (res.returncode, res.returncodes, res.failed_rank, res.timed_out) == (
        launch.TIMEOUT_EXIT,
        (128 + signal.SIGTERM,) * 2,
        None,
        True,
    )
    assert sorted(log.getvalue().splitlines()) == ["[r0] a", "[r0] b", "[r1] c"]


def test_commands_that_cannot_start_are_refused():
    with pytest.raises(
        LaunchError,
        match=r"^run_commands: expected one non-empty command and one environment per "
        r"rank, got 1 commands and 0 environments$",
    ):
        launch.run_commands([[PY]], [])
    with pytest.raises(LaunchError, match=r"^rank 1: cannot start '/nonexistent/rank': \[Errno 2\] No such file"):
        launch.run_commands([[PY, "-c", "import time; time.sleep(60)"], ["/nonexistent/rank"]], [{}, {}], grace=1.0)
