"""Launch the ranks of a job inside the hosts (namespaces) of an emulated cluster.

Each rank is ``ip netns exec <host namespace> <command...>``, started by the
one launcher (:func:`treecoll.collectives.launch.run_commands`: own session,
dies with this process, the first failure or the timeout stops every rank)
with the ``env://`` variables of a multi-host launch
(:func:`treecoll.collectives.launch.rendezvous_env`) and the cluster's own:

====================  ==========================================================
RANK, WORLD_SIZE      global rank and number of ranks
LOCAL_RANK,           rank within its host, ranks on that host
LOCAL_WORLD_SIZE
GROUP_RANK            the host index (torchrun's name)
MASTER_ADDR/PORT      host 0's uplink address, a port free in host 0's namespace
GLOO_SOCKET_IFNAME    ``emu0``: gloo binds to the uplink address (also
TP_SOCKET_IFNAME      TensorPipe's). Peers on another host are reached over the
                      shaped link; peers on the same host through the host's
                      own address, which Linux delivers over loopback (fast).
OMP_NUM_THREADS       1 unless set: several ranks share few cores
TREECOLL_EMU_*        ID, HOST (index), TOPOLOGY (YAML path, when written)
====================  ==========================================================

:func:`launch` waits for all ranks, returns the first non-zero exit code (a
rank killed by signal s counts as 128 + s), and when one rank fails or the
timeout passes it terminates every other rank's process group (SIGTERM, then
SIGKILL after ``grace`` seconds). :func:`run` wraps it: it creates a cluster
when needed and removes what it created on any exit (exception, SIGINT,
SIGTERM, SIGHUP).
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

from treecoll.collectives import launch as _launch
from treecoll.collectives.launch import TIMEOUT_EXIT

from . import netns
from .netns import EmuClusterError
from .topology import placement

__all__ = ["RunResult", "rank_env", "launch", "run", "free_port", "TIMEOUT_EXIT"]


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Outcome of one job. ``returncodes[r]`` is rank r's exit code (128+s when killed by signal
    s, None if it never started); ``failed_rank`` the first rank that exited non-zero."""

    returncode: int
    returncodes: tuple[int | None, ...]
    failed_rank: int | None
    timed_out: bool
    seconds: float
    cluster_id: str


def free_port(cid: str, host: int = 0) -> int:
    """A TCP port free on host ``host``'s uplink address, asked inside its namespace."""
    code = "import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 0)); print(s.getsockname()[1])"
    p = subprocess.run(
        ["ip", "netns", "exec", netns.ns_name(cid, host), sys.executable, "-c", code, netns.host_addr(host)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if p.returncode != 0 or not p.stdout.strip().isdigit():
        raise EmuClusterError(f"free port in {netns.ns_name(cid, host)}: failed: {p.stderr.strip()[-300:]}")
    return int(p.stdout.strip())


def rank_env(
    state: Mapping,
    rank: int,
    place: Sequence[tuple[int, int]],
    master_port: int,
    base: Mapping[str, str] | None = None,
    topology: str | None = None,
) -> dict[str, str]:
    """The environment of ``rank`` (see the module table) on top of ``base`` (default os.environ).

    >>> state = {"id": "a1", "addresses": ["10.0.0.1", "10.0.0.2"], "uplink": "emu0"}
    >>> env = rank_env(state, 3, [(0, 0), (1, 0), (0, 1), (1, 1)], 29500, base={})
    >>> [env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR")]
    ['3', '4', '1', '2', '1', '10.0.0.1']
    >>> env["GLOO_SOCKET_IFNAME"], env["OMP_NUM_THREADS"], "TREECOLL_EMU_TOPOLOGY" in env
    ('emu0', '1', False)
    """
    host, local = place[rank]
    env = dict(os.environ if base is None else base)
    env.update(
        _launch.rendezvous_env(
            rank,
            len(place),
            state["addresses"][0],
            master_port,
            local_rank=local,
            local_world=sum(1 for h, _ in place if h == host),
            group_rank=host,
        )
    )
    env.update(
        {
            "GLOO_SOCKET_IFNAME": state["uplink"],
            "TP_SOCKET_IFNAME": state["uplink"],
            "TREECOLL_EMU_ID": state["id"],
            "TREECOLL_EMU_HOST": str(host),
        }
    )
    env.setdefault("OMP_NUM_THREADS", "1")
    if topology:
        env["TREECOLL_EMU_TOPOLOGY"] = str(topology)
    return env


def launch(
    state: Mapping,
    command: Sequence[str],
    ranks_per_host: int,
    *,
    placement_mode: str = "blocked",
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    topology: str | None = None,
    tag_output: bool = False,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    grace: float = 3.0,
) -> RunResult:
    """Run ``command`` as ``hosts * ranks_per_host`` ranks on the cluster of ``state``.

    ``env`` (default os.environ) is the base environment. With ``tag_output``
    every output line of rank r is prefixed ``[r<r>] `` and written to
    ``stdout``/``stderr`` (default sys.stdout/sys.stderr); otherwise ranks
    inherit this process's stdout and stderr.
    """
    if not command:
        raise EmuClusterError("run: expected a command after `--`, got none")
    if timeout is not None and timeout <= 0:
        raise EmuClusterError(f"--timeout: expected a positive number of seconds, got {timeout!r}")
    place = placement(state["hosts"], ranks_per_host, placement_mode)
    port = free_port(state["id"], 0)
    argvs = [["ip", "netns", "exec", netns.ns_name(state["id"], h), *command] for h, _ in place]
    envs = [rank_env(state, r, place, port, env, topology) for r in range(len(place))]
    res = _launch.run_commands(
        argvs, envs, timeout=timeout, grace=grace, tag_output=tag_output, stdout=stdout, stderr=stderr
    )
    return RunResult(res.returncode, res.returncodes, res.failed_rank, res.timed_out, res.seconds, state["id"])


class _Terminated(BaseException):
    """Raised by the signal handler so that `finally` blocks tear down."""


def _raise_terminated(signum, _frame):
    raise _Terminated(signum)


def run(
    command: Sequence[str],
    *,
    hosts: int,
    ranks_per_host: int,
    placement_mode: str = "blocked",
    rate_bps: int = 10**9,
    pair_rates: Mapping[tuple[int, int], int] | None = None,
    host_rates: Mapping[int, int] | None = None,
    cid: str | None = None,
    timeout: float | None = None,
    topology_out: str | None = None,
    **launch_kw: Any,
) -> RunResult:
    """Bring a cluster up (or use cluster ``cid`` when it is up), run the job, tear down what was made.

    With an existing cluster, ``hosts`` must not exceed its hosts and its
    rate is kept (``rate_bps``/``pair_rates``/``host_rates`` are ignored). The Topology YAML
    is written to ``topology_out`` (default: a file in the state directory,
    removed afterwards) and exported to the ranks as TREECOLL_EMU_TOPOLOGY.
    """
    from .topology import build_topology, save_topology

    state = netns.load_state(cid) if cid else None
    created = state is None
    if state is not None and state["hosts"] < hosts:
        raise EmuClusterError(
            f"cluster {cid!r}: has {state['hosts']} hosts, expected at least {hosts}; bring it down or use another --id"
        )
    tmp_topology = None
    old = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGHUP):
            old[s] = signal.signal(s, _raise_terminated)
    try:
        if created:
            spec = netns.ClusterSpec(
                cid or secrets.token_hex(3), hosts, rate_bps, dict(pair_rates or {}), dict(host_rates or {})
            )
            state = netns.create(spec, owner_pid=os.getpid())
        state = dict(state, hosts=hosts, addresses=state["addresses"][:hosts])
        if not topology_out:
            netns.state_dir().mkdir(parents=True, exist_ok=True)
            topology_out = tmp_topology = str(netns.state_dir() / f"{state['id']}.run{os.getpid()}.yaml")
        pr = {tuple(int(x) for x in k.split("-")): v for k, v in state.get("pair_rates", {}).items()}
        topo = build_topology(
            hosts,
            ranks_per_host,
            state["rate_bps"],
            pair_rates={k: v for k, v in pr.items() if max(k) < hosts},
            host_rates={int(k): v for k, v in state.get("host_rates", {}).items() if int(k) < hosts},
            placement_mode=placement_mode,
            meta={"cluster_id": state["id"]},
        )
        save_topology(topo, topology_out)
        return launch(
            state,
            command,
            ranks_per_host,
            placement_mode=placement_mode,
            timeout=timeout,
            topology=topology_out,
            **launch_kw,
        )
    except _Terminated as e:
        raise EmuClusterError(f"run: interrupted by signal {e.args[0]}; ranks killed, cluster removed") from None
    finally:
        if created and state is not None:
            netns.destroy(state["id"])
        if tmp_topology:
            try:
                os.unlink(tmp_topology)
            except FileNotFoundError:
                pass
        for s, h in old.items():
            signal.signal(s, h)
