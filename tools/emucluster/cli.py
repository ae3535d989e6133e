"""``treecoll emu up|down|run|status|measure``: an emulated multi-host cluster on one machine.

Mount under the main CLI with ``add_parser(subparsers)`` (the module
``treecoll.tools.emucluster.cli`` in ``treecoll.tools.cli.COMMANDS``; it also sets ``func=run``
as the parser default), or run standalone:
``python -m treecoll.tools.emucluster up --hosts 2``.

Every command builds a plain dict; ``--json`` prints it, otherwise a short
text view. User errors raise :class:`~tools.emucluster.netns.EmuClusterError`
(a TreecollError), which the ``treecoll`` dispatcher (or :func:`main`)
prints as one line on stderr with exit code 1 (``--debug``: traceback);
``run`` returns the job's exit code (124 on timeout).

>>> args = build_parser().parse_args(["run", "--hosts", "2", "--ranks-per-host", "3", "--", "python", "train.py"])
>>> args.hosts * args.ranks_per_host, args.command[-2:], args.placement
(6, ['python', 'train.py'], 'blocked')
>>> build_parser().parse_args(["up", "--hosts", "65"])
Traceback (most recent call last):
...
treecoll.tools.units.UsageError: --hosts: expected at most 64, got 65
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from treecoll.topo.errors import TreecollError

from .. import units
from ..cli import REPLACES, output_path
from ..resources import OVERSUBSCRIBE_HELP, check_processes
from . import netns, runner
from .netns import EmuClusterError
from .topology import PLACEMENTS, build_topology, save_topology

__all__ = ["add_parser", "run", "main", "build_parser"]


_DESCRIPTION = (
    "An emulated multi-host cluster on one Linux machine: hosts are network namespaces joined by "
    "rate-limited links (needs root)."
)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the result as JSON")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show the traceback of an error")


def _shape_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hosts",
        type=units.int_arg("--hosts", maximum=netns.MAX_HOSTS),
        required=True,
        metavar="N",
        help=f"number of hosts (network namespaces), 1..{netns.MAX_HOSTS}",
    )
    p.add_argument(
        "--rate", default="1gbit", help="uplink rate per host and direction (tc units: kbit, mbit, gbit; default 1gbit)"
    )
    p.add_argument(
        "--pair-rate",
        action="append",
        default=[],
        metavar="A-B=RATE",
        help="a direct link between hosts A and B at RATE (repeatable), e.g. 0-1=100mbit",
    )
    p.add_argument(
        "--host-rate",
        action="append",
        default=[],
        metavar="H=RATE",
        help="host H's uplink at RATE instead of --rate (repeatable), e.g. 2=100mbit: a slow NIC the "
        "topology YAML does not know (it keeps --rate and lists the host under meta.host_rates), "
        "as a NIC that trained at a lower speed; what `treecoll topo probe` finds",
    )
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="blocked",
        help="rank placement: blocked (0,1 | 2,3) or interleaved (0,2 | 1,3)",
    )
    p.add_argument("--topology-out", metavar="FILE.yaml", help=f"write the matching Topology YAML here {REPLACES}")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``emu`` command (with its sub-commands) to an argparse ``subparsers`` object."""
    p = subparsers.add_parser(
        "emu", help="emulated multi-host cluster (network namespaces, shaped links)", description=_DESCRIPTION
    )
    _fill(p)
    return p


def _fill(p: argparse.ArgumentParser) -> None:
    _common(p)
    sub = p.add_subparsers(dest="emu_cmd", metavar="{up,down,run,status,measure}")
    sub.required = True
    up = sub.add_parser(
        "up",
        help="create the hosts, links and rate limits",
        description="Create an emulated cluster: one network namespace per host, a shaped uplink "
        "per host to a bridge, optional direct links between host pairs.",
    )
    _shape_args(up)
    up.add_argument("--id", default="0", help="cluster id, 1-8 of [a-z0-9] (default 0)")
    up.add_argument(
        "--ranks-per-host",
        type=units.int_arg("--ranks-per-host"),
        default=1,
        metavar="R",
        help="ranks per host in the YAML (default 1)",
    )
    up.add_argument(
        "--measure",
        action="store_true",
        help="measure loopback and inter-host throughput and latency; use them in the YAML",
    )
    _common(up)
    down = sub.add_parser(
        "down",
        help="remove a cluster (default: every cluster of this tool)",
        description="Remove an emulated cluster's namespaces, links and state (default: every "
        "cluster this tool created).",
    )
    down.add_argument("--id", help="only this cluster")
    _common(down)
    rn = sub.add_parser(
        "run",
        help="run a command as ranks on the cluster: run [opts] -- cmd ...",
        description="Run a command as hosts x ranks-per-host ranks on an emulated cluster (torchrun's "
        "environment variables set; gloo over the shaped links); a failing rank stops "
        "the others.",
    )
    _shape_args(rn)
    rn.add_argument(
        "--ranks-per-host",
        type=units.int_arg("--ranks-per-host"),
        required=True,
        metavar="R",
        help="ranks (processes) per host",
    )
    rn.add_argument("--oversubscribe", action="store_true", help=OVERSUBSCRIBE_HELP)
    rn.add_argument(
        "--id",
        help="use this cluster if it is up (kept afterwards); else create it "
        "(removed afterwards). Default: a fresh cluster",
    )
    rn.add_argument(
        "--timeout",
        type=units.seconds_arg("--timeout"),
        metavar="S",
        help="kill every rank after this many seconds (exit 124)",
    )
    rn.add_argument("--tag-output", action="store_true", help="prefix each output line with [r<rank>]")
    rn.add_argument("command", nargs=argparse.REMAINDER, help="-- command and arguments")
    _common(rn)
    st = sub.add_parser(
        "status",
        help="list the namespaces, links and qdiscs of this tool",
        description="List the emulated clusters, their namespaces, addresses and qdiscs.",
    )
    _common(st)
    me = sub.add_parser(
        "measure",
        help="measure loopback and host 0 -> 1 throughput of a cluster",
        description="Measure a running cluster: TCP throughput and round trip inside host 0 "
        "(loopback) and from host 0 to host 1.",
    )
    me.add_argument("--id", default="0", help="the cluster (default 0)")
    me.add_argument(
        "--bytes",
        type=units.size_arg("--bytes"),
        default=64 << 20,
        metavar="S",
        help="bytes streamed host 0 -> 1 (loopback: 4 times as many; default 64MiB)",
    )
    _common(me)
    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    from ..cli import refuse_empty_values

    p = argparse.ArgumentParser(prog="python -m treecoll.tools.emucluster", description=_DESCRIPTION)
    _fill(p)
    refuse_empty_values(p)
    return p


# ----------------------------------------------------------------------------- commands
def _pair_rates(args) -> dict[tuple[int, int], int]:
    out = {}
    for text in args.pair_rate:
        k, v = netns.parse_pair_rate(text, args.hosts)
        out[k] = v
    return out


def _host_rates(args) -> dict[int, int]:
    return dict(netns.parse_host_rate(text, args.hosts) for text in args.host_rate)


def _check_topology_out(args) -> None:
    if args.topology_out:
        output_path(args.topology_out, "--topology-out", suffixes=(".yaml", ".yml"))


def _cmd_up(args) -> tuple[dict, int]:
    _check_topology_out(args)
    spec = netns.ClusterSpec(
        args.id, args.hosts, netns.parse_rate(args.rate, "--rate"), _pair_rates(args), _host_rates(args)
    )
    state = netns.create(spec, extra={"ranks_per_host": args.ranks_per_host})
    try:
        out: dict[str, Any] = {"cluster": state}
        kw = {}
        if args.measure:
            from .measure import measure_link

            m = measure_link(spec.cid, spec.hosts)
            out["measured"] = m
            lo = m["loopback"]
            kw = {"loopback_gbs": round(lo["gb_s"], 3), "loopback_lat_us": round(lo["rtt_us"] / 4, 1)}
            if "inter_host" in m:
                kw["net_lat_us"] = round(max(0.0, (m["inter_host"]["rtt_us"] - lo["rtt_us"]) / 4), 1)
        if args.topology_out:
            topo = build_topology(
                spec.hosts,
                args.ranks_per_host,
                spec.rate_bps,
                pair_rates=spec.pair_rates,
                placement_mode=args.placement,
                name=f"emu-{spec.hosts}x{args.ranks_per_host}",
                meta={"cluster_id": spec.cid},
                host_rates=spec.host_rates,
                **kw,
            )
            out["topology"] = str(save_topology(topo, args.topology_out))
    except BaseException:
        netns.destroy(spec.cid)
        raise
    return out, 0


def _cmd_down(args) -> tuple[dict, int]:
    removed = netns.destroy(args.id) if args.id else netns.destroy_all()
    return {"removed": removed}, 0


def _cmd_status(args) -> tuple[dict, int]:
    return netns.status(), 0


def _cmd_measure(args) -> tuple[dict, int]:
    from .measure import measure_link

    state = netns.load_state(args.id)
    if state is None:
        raise EmuClusterError(f"cluster {args.id!r}: not up; start it with `treecoll emu up --id {args.id} --hosts 2`")
    return {"id": args.id, **measure_link(args.id, state["hosts"], args.bytes)}, 0


def _cmd_run(args) -> tuple[dict, int]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise EmuClusterError(
            "emu run: expected a command after `--`, got none; "
            "e.g. treecoll emu run --hosts 2 --ranks-per-host 2 -- python train.py"
        )
    _check_topology_out(args)
    n = args.hosts * args.ranks_per_host
    check_processes(
        n,
        option=f"--hosts {args.hosts} x --ranks-per-host {args.ranks_per_host} = {n} processes",
        oversubscribe=args.oversubscribe,
    )
    res = runner.run(
        command,
        hosts=args.hosts,
        ranks_per_host=args.ranks_per_host,
        placement_mode=args.placement,
        rate_bps=netns.parse_rate(args.rate, "--rate"),
        pair_rates=_pair_rates(args),
        host_rates=_host_rates(args),
        cid=args.id,
        timeout=args.timeout,
        topology_out=args.topology_out,
        tag_output=args.tag_output,
    )
    out = {
        "returncode": res.returncode,
        "returncodes": list(res.returncodes),
        "failed_rank": res.failed_rank,
        "timed_out": res.timed_out,
        "seconds": round(res.seconds, 3),
        "cluster_id": res.cluster_id,
    }
    return out, res.returncode


_COMMANDS = {"up": _cmd_up, "down": _cmd_down, "run": _cmd_run, "status": _cmd_status, "measure": _cmd_measure}


def _text(cmd: str, out: dict) -> str:
    if cmd == "up":
        c = out["cluster"]
        lines = [
            f"cluster {c['id']}: {c['hosts']} hosts at {c['rate']} per uplink"
            + (f", pairs {c['pair_rates']}" if c["pair_rates"] else "")
            + (f", hosts {c['host_rates']}" if c.get("host_rates") else "")
        ]
        lines += [
            f"  h{i}: namespace {netns.ns_name(c['id'], i)}, {c['uplink']} {a}" for i, a in enumerate(c["addresses"])
        ]
        if "measured" in out:
            for k, m in out["measured"].items():
                lines.append(f"  measured {k}: {m['gbit_s']:.3f} Gbit/s, rtt {m['rtt_us']:.0f} us")
        if "topology" in out:
            lines.append(f"  topology: {out['topology']}")
        lines.append(f"  run ranks: treecoll emu run --id {c['id']} --hosts {c['hosts']} --ranks-per-host R -- CMD")
        return "\n".join(lines)
    if cmd == "down":
        return "removed: " + (", ".join(out["removed"]) or "nothing")
    if cmd == "status":
        lines = [
            f"cluster {c['id']}: {c['hosts']} hosts, {c.get('rate')}, {c.get('status')}"
            + (f", owner pid {c['owner_pid']}" if c.get("owner_pid") else "")
            for c in out["clusters"]
        ]
        for ns, d in out["namespaces"].items():
            lines.append(f"{ns}: " + "; ".join(d["addresses"] or ["no addresses"]))
            lines += [f"  {q}" for q in d["qdiscs"]]
        lines += [f"root namespace link {x}" for x in out["root_links"]]
        return "\n".join(lines) or "no emulated cluster"
    if cmd == "measure":
        return "\n".join(
            f"{k}: {m['gbit_s']:.3f} Gbit/s ({m['gb_s']:.4f} GB/s), rtt {m['rtt_us']:.0f} us"
            for k, m in out.items()
            if isinstance(m, dict)
        )
    if cmd == "run":
        if out["timed_out"]:
            return f"emu run: timed out after {out['seconds']}s; all ranks killed"
        if out["failed_rank"] is not None:
            return (
                f"emu run: rank {out['failed_rank']} exited with {out['returncode']}; "
                f"other ranks killed (exit codes {out['returncodes']})"
            )
        return ""
    return json.dumps(out)  # pragma: no cover


def run(args: argparse.Namespace) -> int:
    """Execute a parsed ``emu`` command; return the exit code (``run``: the job's).

    User errors raise :class:`EmuClusterError` (a TreecollError): the main
    ``treecoll`` dispatcher, or :func:`main` standalone, prints them on one line.
    """
    cmd = args.emu_cmd
    out, rc = _COMMANDS[cmd](args)
    if getattr(args, "json", False):
        print(json.dumps(out, indent=2, sort_keys=True, default=str))
    else:
        text = _text(cmd, out)
        if text:
            print(text, file=sys.stderr if cmd == "run" else sys.stdout)
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (``python -m treecoll.tools.emucluster``): errors as one line on stderr, exit 1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        return run(args)
    except TreecollError as e:
        if "--debug" in argv:
            raise
        print(f"error: {' '.join(str(e).splitlines())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("emu: interrupted; cleaned up", file=sys.stderr)
        return 130
