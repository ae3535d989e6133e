"""``treecoll simulate``: predict collectives and decode steps on a topology you may not have.

    treecoll simulate allreduce --topology F --algo ring,tree,two_level,auto,nccl --sizes 8B:1GiB
                                [--ranks N] [--profile P] [--mode executor|in-kernel] [--engine auto|flow|analytic]
                                [--json] [--plot out.png]
    treecoll simulate allgather|reduce_scatter|broadcast|reduce|alltoall|sendrecv --topology F [--algo A,...]
                                [--sizes ...] (the same options; sizes as nccl-tests prints them)
    treecoll simulate decode --topology F --seq-len 1M[,2M...] --heads 16 --head-dim 128 [--kv-heads 8]
                             [--batch B] [--ranks N] [--tree two_level] [--plot out.png]
    treecoll simulate links --topology F --algo two_level --size 1GiB [--top 10]
    treecoll simulate validate FILE... [machine flags] [--profile P] [--json]
    treecoll simulate calibrate FILE... [machine flags] -o profile.yaml [--force]

Every command takes the machine flags (:mod:`treecoll.tools.machine_flags`): ``--topology F``
(default ``default``), or ``--hosts N --gpu MODEL [--gpus-per-host G] [--nic COUNTxSPEEDG-FABRIC]
[--gpu-nic aligned|unaligned]``, the machine :func:`treecoll.topo.machines.machine_topology` builds
(the output names it).

``--algo``: ``ring`` (NCCL's ring, lockstep model), ``tree`` (NCCL's tree: a chain in each
host under a double binary tree over hosts, one per NIC rail for large messages;
:func:`treecoll.collectives.sim.simulator.simulate_nccl_algorithm`, what the decode model's
``allreduce3`` and validation against nccl-tests simulate), ``nvls`` (NCCL's
NVLink SHARP reduction in the NVSwitches, NVLSTree across hosts:
:mod:`treecoll.collectives.sim.nvls`; Hopper and later NVSwitch systems), any builder
name of :mod:`treecoll.collectives.builders` (``two_level``, ``auto``, ``binomial``,
``kary:4``, ...), and ``nccl``: NCCL's own analytical model
(:func:`treecoll.collectives.sim.nccl_model.nccl_predict`, the fastest of the algorithms NCCL
offers there: ring, tree and where it runs NVLS),
a separate line for comparison (for every collective: :func:`treecoll.collectives.sim.nccl_model.nccl_best`),
and ``p2p`` (alltoall and sendrecv: every transfer at once). Simulated algorithms use the fastest NCCL
protocol profile per size unless ``--profile`` names one (``ideal``,
``nccl-simple``, a calibrated YAML...). Sizes: ``A:B`` doubles from A to B,
or a comma list; units B, K/KiB, M/MiB, G/GiB (powers of 1024), KB, MB, GB
(powers of 1000), as :mod:`treecoll.tools.units` reads them. Token counts
(``--seq-len``) use k = 1e3, M = 1e6 like the paper (80k ... 5.12M).
Sweeps show a progress bar on stderr when it is a terminal. ``--engine``: the
flow simulation, or the analytic engine for clusters of identical hosts
(:mod:`treecoll.collectives.sim.analytic`; ``auto``, the default, takes it above
16,384 GPUs); the table's first line names the engine.
``validate`` and
``calibrate`` compare the simulator with nccl-tests tables and fit a profile
to them (:mod:`treecoll.tools.validation`, :mod:`treecoll.tools.calibration`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from treecoll.topo.errors import CollectiveError
from treecoll.topo.fmt import fmt_bytes
from treecoll.topo.gcpause import gc_paused

from . import units

if TYPE_CHECKING:
    from treecoll.attention.cost import DecodeShape
    from treecoll.topo import Topology
    from treecoll.topo.ranks import RanksArg


def parse_sizes(spec: str) -> list[int]:
    """``--sizes`` from Python: ``"8B:1GiB"`` (doubling) or ``"1K,1MiB"`` (:func:`treecoll.tools.units.parse_sizes`)."""
    return units.parse_sizes(spec, what="--sizes", error=CollectiveError)


def _progress(i: int, n: int, what: str) -> None:
    if n > 1 and sys.stderr.isatty():
        w = 30
        k = int(w * i / n)
        sys.stderr.write(f"\r[{'#' * k}{'.' * (w - k)}] {i}/{n} {what:<24}")
        if i == n:
            sys.stderr.write("\r" + " " * (w + 40) + "\r")
        sys.stderr.flush()


def _names(registry) -> str:
    return ", ".join(sorted(registry))


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from treecoll.collectives.builders import BUILDERS
    from treecoll.collectives.executor_cost import MODES
    from treecoll.collectives.sim.analytic import ANALYTIC_ABOVE_GPUS, ENGINES
    from treecoll.collectives.sim.profiles import PROFILES
    from treecoll.collectives.sim.simulator import DTYPE_SIZES
    from treecoll.tools.cli import REPLACES, common_options
    from treecoll.tools.cmd_tree import MODE_HELP
    from treecoll.tools.machine_flags import COUNTS_HELP, add_machine_flags

    p = subparsers.add_parser(
        "simulate",
        help="simulate collectives and decode steps on a topology",
        description="Predict collectives and decode steps on a topology you may not have "
        "(flow-level simulator, NCCL's model).",
    )
    common_options(p)
    sub = p.add_subparsers(dest="sim_command", metavar="WHAT")
    sub.required = True

    def base(name, help_, description):
        q = sub.add_parser(name, help=help_, description=description)
        common_options(q)
        add_machine_flags(
            q,
            topology_help="topology YAML file, shipped name or 'default' (default: default, unless the "
            "machine is given by --hosts/--gpu/--nic)",
            description=f"the machine to simulate: --topology, or {COUNTS_HELP}",
        )
        q.add_argument(
            "--ranks",
            type=units.int_arg("--ranks"),
            default=None,
            metavar="N",
            help="use the GPUs of the first N ranks (default: every GPU)",
        )
        q.add_argument(
            "--profile",
            default=None,
            metavar="P",
            help=f"simulator profile: auto (the fastest NCCL protocol per size, the default), "
            f"{_names(PROFILES)}, or a calibrated profile YAML file",
        )
        return q

    for coll, default in DEFAULT_ALGOS.items():
        a = base(
            coll,
            f"{coll}: time, algbw and busbw per size and algorithm (nccl-tests style)",
            f"Simulate a{'n' if coll[0] in 'a' else ''} {coll} of each size with each algorithm and print "
            f"time, algbw and busbw (nccl-tests' definitions; sizes as nccl-tests prints them).",
        )
        a.add_argument(
            "--algo",
            default=default,
            metavar="A[,A...]",
            help=f"comma list of algorithms: {algos_help(coll)} (default {default})",
        )
        a.add_argument(
            "--sizes",
            default="8B:1GiB",
            type=units.sizes_arg("--sizes"),
            metavar="A:B|S[,S...]",
            help="A:B (doubling from A to B) or a comma list of sizes; 64K = 64KiB, 64KB = 64000 (default 8B:1GiB)",
        )
        a.add_argument(
            "--plot", default=None, metavar="OUT.png", help=f"write a log-log busbw plot (needs matplotlib) {REPLACES}"
        )
        a.add_argument("--mode", choices=MODES, default="executor", help=MODE_HELP)
        a.add_argument(
            "--engine",
            default="auto",
            choices=ENGINES,
            help=f"flow: the flow-level simulation; analytic: closed forms from a few hosts' sample, "
            f"for 100k+ GPUs of identical hosts (allreduce: ring, tree, two_level, auto); auto: "
            f"analytic above {ANALYTIC_ABOVE_GPUS} GPUs (default auto)",
        )
    d = base(
        "decode",
        "tree attention vs three allreduces vs ring attention, one decode step",
        "Model one decode step's attention on the topology: local attention, then the partial states "
        "combined by treecoll's tree (one allreduce of the packed state), by one all-gather and a local "
        "merge, or by the paper's three allreduces; against ring attention (K/V passed around the ring). "
        "Says which combine tree_decode(combine='auto') runs. Where every GPU states its memory (mem_gb), "
        "a method whose peak memory per GPU exceeds it is named and left out, and a context no method "
        "fits is refused.",
    )
    d.add_argument(
        "--seq-len",
        default="1M",
        type=units.counts_arg("--seq-len"),
        metavar="N[,N...]",
        help="tokens of KV cache, comma list allowed; k = 1e3, M = 1e6 (default 1M)",
    )
    d.add_argument("--heads", type=units.int_arg("--heads"), default=16, help="query heads (default 16)")
    d.add_argument(
        "--head-dim", type=units.int_arg("--head-dim"), default=128, help="dimension of one head (default 128)"
    )
    d.add_argument(
        "--kv-heads",
        type=units.int_arg("--kv-heads"),
        default=None,
        help="K/V heads, dividing --heads (default: --heads, no grouped-query attention)",
    )
    d.add_argument("--batch", type=units.int_arg("--batch"), default=1, help="sequences (default 1)")
    d.add_argument(
        "--dtype",
        default="bfloat16",
        choices=sorted(DTYPE_SIZES),
        metavar="T",
        help=f"KV cache dtype: {_names(DTYPE_SIZES)} (default bfloat16)",
    )
    d.add_argument(
        "--tree",
        default="two_level",
        metavar="B",
        help=f"tree builder for tree attention: {_names(BUILDERS)} or kary:K (default two_level)",
    )
    d.add_argument(
        "--plot",
        default=None,
        metavar="OUT.png",
        help=f"write a log-log time vs sequence length plot (needs matplotlib) {REPLACES}",
    )
    d.add_argument(
        "--mode",
        choices=MODES,
        default="executor",
        help=MODE_HELP + "; applies to tree and ring (gather and allreduce3 are NCCL's own)",
    )
    lk = base(
        "links",
        "the busiest links of one run",
        "Simulate one allreduce and list the links that carry the most bytes, and the bytes per link kind.",
    )
    lk.add_argument(
        "--algo",
        default="two_level",
        metavar="A",
        help=f"the algorithm: {', '.join(x for x in SIM_ALGOS if x != 'nccl')}, or a tree builder "
        f"({_names(BUILDERS)}; kary:K) (default two_level)",
    )
    lk.add_argument(
        "--size", default="1GiB", type=units.size_arg("--size"), metavar="S", help="allreduce size (default 1GiB)"
    )
    lk.add_argument(
        "--top",
        type=units.int_arg("--top"),
        default=10,
        metavar="N",
        help="how many of the busiest links to list (default 10)",
    )
    from treecoll.tools import cmd_validate

    cmd_validate.add_parsers(sub, common_options)
    return p


def _resolve(args):
    """``(Topology, Machine or None)``: the machine flags' topology (``--topology``, the ``default``
    one when no machine flag is given, or the machine of ``--hosts``/``--gpus-per-host``/``--gpu``/
    ``--nic``/``--gpu-nic``), with ``--ranks`` checked against its GPUs."""
    from treecoll.tools.machine_flags import topology_from_args

    topology, machine = topology_from_args(args, default="default")
    total = len(topology.rank_gpus())
    if args.ranks is not None and args.ranks > total:
        raise CollectiveError(
            f"--ranks: expected at most {total} (the GPUs of topology {topology.name!r}), got {args.ranks}"
        )
    return topology, machine


def _named(data: dict, machine) -> dict:
    """``data`` with the machine the flags built (``"machine"``: its description), for the output."""
    if machine is not None:
        data["machine"] = machine.describe()
    return data


def _where(d: dict) -> str:
    """The topology a table ran on, as its header names it: the topology's name, and the machine
    the flags built."""
    return d["topology"] + (f" ({d['machine']})" if d.get("machine") else "")


def run(args: argparse.Namespace) -> int:
    from treecoll.tools.cli import IMAGE_SUFFIXES, emit, output_path

    if args.sim_command in ("validate", "calibrate"):
        from treecoll.tools import cmd_validate

        return cmd_validate.run(args)
    plot = getattr(args, "plot", None)
    _check_profile(args.profile)
    if plot:
        output_path(plot, "--plot", inputs=[args.topology, args.profile], suffixes=IMAGE_SUFFIXES)
    if args.sim_command in DEFAULT_ALGOS:
        algos = units.parse_list(args.algo, what="--algo", kind="algorithms", error=CollectiveError)
        check_algos(algos, collective=args.sim_command)
        topology, machine = _resolve(args)
        if (args.ranks or len(topology.rank_gpus())) < 2:
            raise CollectiveError(
                f"simulate {args.sim_command}: one rank moves no data (NCCL only copies the buffer); "
                f"expected at least 2 ranks (--ranks, or a topology with more GPUs than {topology.name!r})"
            )
        data = _named(
            allreduce_data(
                topology,
                algos,
                args.sizes,
                args.ranks,
                args.profile,
                args.sim_command,
                mode=args.mode,
                engine=args.engine,
            ),
            machine,
        )
        if plot:
            plot_allreduce(data, plot)
            data["plot"] = plot
        return emit(args, data, render_allreduce)
    if args.sim_command == "decode":
        from treecoll.attention.cost import DecodeShape

        check_algos([args.tree], option="--tree", builders_only=True)
        topology, machine = _resolve(args)
        shapes = [
            DecodeShape(
                seq_len=n,
                heads=args.heads,
                head_dim=args.head_dim,
                kv_heads=args.kv_heads,
                batch=args.batch,
                dtype=args.dtype,
            )
            for n in args.seq_len
        ]
        data = _named(decode_data(topology, shapes, args.ranks, args.tree, args.profile, args.mode), machine)
        if plot:
            plot_decode(data, plot)
            data["plot"] = plot
        return emit(args, data, render_decode)
    check_algos([args.algo])
    topology, machine = _resolve(args)
    data = _named(links_data(topology, args.algo, args.size, args.ranks, args.profile, args.top), machine)
    return emit(args, data, render_links)


def _check_profile(profile: str | None) -> None:
    """Refuse an unknown ``--profile`` (or an unreadable profile file) before any work."""
    import os

    from treecoll.collectives.sim.profiles import PROFILES, get_profile

    if profile in (None, "auto") or profile in PROFILES:
        return
    if not (profile.endswith((".yaml", ".yml")) or os.path.exists(profile)):
        raise CollectiveError(
            f"--profile {profile!r}: expected auto, {_names(PROFILES)} or a profile YAML file, got an unknown name"
        )
    get_profile(profile)  # a file: read now, so a bad one fails before any work


def _one(
    topology,
    algo: str,
    size: int,
    ranks,
    profile,
    collective: str = "allreduce",
    mode: str = "executor",
    engine: str = "flow",
):
    """(time s, busbw, algbw, label) of one algorithm at one size; treecoll's trees in ``mode``;
    ``engine`` ``analytic``: every algorithm in-kernel, from :mod:`treecoll.collectives.sim.analytic`."""
    from treecoll.collectives.placement import Placement
    from treecoll.collectives.sim.simulator import bandwidths, simulate_nccl_algorithm

    p = topology if isinstance(topology, Placement) else Placement(topology, ranks)
    topology = p.topology
    if algo == "nccl":
        from treecoll.collectives.sim.nccl_model import nccl_best

        best = nccl_best(p, None, size, collective)
        alg, bus = bandwidths(collective, size, p.nranks, best["time"])
        return best["time"], bus, alg, f"{best['algo']}/{best['proto']}"
    if engine == "analytic":
        from treecoll.collectives.sim.analytic import analytic_allreduce

        r = analytic_allreduce(p, algo, size, profile=profile or "auto")
        return r.time, r.busbw, r.algbw, f"{r.profile} ({r.stats['engine']})"
    if algo in SIM_ALGOS:  # NCCL's own algorithms: as NCCL runs them, what simulate_nccl chooses among
        r = simulate_nccl_algorithm(p, algo, size, collective=collective, profile=profile or "auto")
        return r.time, r.busbw, r.algbw, r.profile
    if mode == "executor" and algo == "auto" and collective == "allreduce":  # what collectives.allreduce(x) runs
        return _auto_executor(p, size)
    from treecoll.collectives.sim.executor import predict_tree

    in_kernel = {"profile": profile or "auto"} if mode == "in-kernel" else {}
    r = predict_tree(p, algo, size, collective=collective, mode=mode, **in_kernel)
    return r.time, r.busbw, r.algbw, r.profile


def _auto_executor(p, size: int):
    """(time s, busbw, algbw, label) of ``collectives.allreduce(x)`` with its defaults: the backend's
    own allreduce where the planner prefers it (:meth:`treecoll.collectives.planner.Planner.prefer_native`),
    else the planner's ``algo="auto"`` schedule as the executor runs it."""
    from treecoll.collectives.cost import CostModel
    from treecoll.collectives.executor_cost import backend_of
    from treecoll.collectives.planner import default_planner, native_allreduce_time
    from treecoll.collectives.sim.executor import predict_schedule
    from treecoll.collectives.sim.simulator import bandwidths

    backend = backend_of(p)
    if default_planner().prefer_native(nbytes=size, placement=p, backend=backend):
        t = native_allreduce_time(CostModel(p, backend=backend), size)
        alg, bus = bandwidths("allreduce", size, p.nranks, t)
        return t, bus, alg, f"{backend} all_reduce"
    r = predict_schedule(p, None, size, algo="auto")
    return r.time, r.busbw, r.algbw, r.profile


#: --algo names besides the tree builders of collectives.builders
SIM_ALGOS = ("ring", "tree", "nvls", "p2p", "nccl")
#: the collectives ``simulate`` runs (nccl-tests' seven) and their default --algo
DEFAULT_ALGOS = {
    "allreduce": "ring,tree,two_level,auto,nccl",
    "allgather": "ring,nccl",
    "reduce_scatter": "ring,nccl",
    "broadcast": "ring,two_level,nccl",
    "reduce": "ring,two_level,nccl",
    "alltoall": "p2p,nccl",
    "sendrecv": "p2p,nccl",
}
#: per collective: the names of SIM_ALGOS it runs on, and whether treecoll's tree builders apply
#: (a tree reduces, broadcasts, or does both; gathers, scatters and exchanges are NCCL's ring or p2p)
COLLECTIVE_ALGOS = {
    "allreduce": (("ring", "tree", "nvls", "nccl"), True),
    "allgather": (("ring", "nccl"), False),
    "reduce_scatter": (("ring", "nccl"), False),
    "broadcast": (("ring", "tree", "nccl"), True),
    "reduce": (("ring", "tree", "nccl"), True),
    "alltoall": (("p2p", "nccl"), False),
    "sendrecv": (("p2p", "nccl"), False),
}


def _runs_on(algo: str, collective: str) -> bool:
    from treecoll.collectives.builders import BUILDERS

    names, trees = COLLECTIVE_ALGOS[collective]
    return algo in names or (trees and algo.partition(":")[0] in BUILDERS)


def algos_help(collective: str) -> str:
    """The ``--algo`` names ``collective`` accepts, for its help text and its errors."""
    from treecoll.collectives.builders import BUILDERS

    names, trees = COLLECTIVE_ALGOS[collective]
    return ", ".join(names) + (f", or a tree builder ({_names(BUILDERS)}; kary:K)" if trees else "")


def check_algos(
    algos: Sequence[str], *, collective: str = "allreduce", option: str = "--algo", builders_only: bool = False
) -> None:
    """Refuse an unknown algorithm name, or one ``collective`` does not run on, before any work,
    listing the valid ones.

    >>> check_algos(["ring", "two_level", "kary:4"])
    >>> check_algos(["two_level"], collective="allgather")
    Traceback (most recent call last):
    ...
    treecoll.topo.errors.CollectiveError: --algo 'two_level': allgather runs on ring, nccl; \
'two_level' applies to allreduce, broadcast, reduce
    """
    from treecoll.collectives.builders import BUILDERS

    for a in algos:
        if (builders_only or a not in SIM_ALGOS) and a.partition(":")[0] not in BUILDERS:
            known = "" if builders_only else f"one of {list(SIM_ALGOS)} or "
            raise CollectiveError(
                f"{option} {a!r}: unknown; expected {known}a tree builder {sorted(BUILDERS)} (e.g. kary:4)"
            )
        if not builders_only and not _runs_on(a, collective):
            where = ", ".join(c for c in COLLECTIVE_ALGOS if _runs_on(a, c))
            raise CollectiveError(
                f"{option} {a!r}: {collective} runs on {algos_help(collective)}; {a!r} applies to {where}"
            )


@gc_paused()  # planning and simulating 100,000 GPUs: millions of objects, few reference cycles
def allreduce_data(
    topology: Topology,
    algos: Sequence[str],
    sizes: Sequence[int],
    ranks: RanksArg = None,
    profile: str | None = None,
    collective: str = "allreduce",
    *,
    mode: str = "executor",
    engine: str = "flow",
) -> dict[str, Any]:
    """The ``simulate <collective>`` table; treecoll's trees in ``mode``; ``engine``: ``flow``, ``analytic``
    or ``auto`` (:func:`treecoll.collectives.sim.analytic.choose_engine`; analytic for allreduce only),
    named in the output. The analytic engine predicts every algorithm in-kernel (the output says so)."""
    from treecoll.collectives.placement import Placement
    from treecoll.collectives.sim.analytic import ANALYTIC_ALGOS, choose_engine

    check_algos(algos, collective=collective)
    placement = Placement(topology, ranks)
    P = placement.nranks
    if collective != "allreduce" and engine == "analytic":
        raise CollectiveError(f"--engine analytic: models allreduce only, got {collective}; pass --engine flow")
    engine = choose_engine(engine, P) if collective == "allreduce" else "flow"
    if engine == "analytic":
        bad = [a for a in algos if a not in ANALYTIC_ALGOS and a != "nccl"]
        if bad:
            raise CollectiveError(
                f"--algo {','.join(bad)}: not modelled by the analytic engine (it models "
                f"{', '.join(ANALYTIC_ALGOS)} and nccl); drop them or pass --engine flow"
            )
    sizes, rounded = _as_nccl_tests_runs(collective, sizes, P)
    rows = []
    total = len(algos) * len(sizes)
    k = 0
    for size in sizes:
        row = {"size": size, "algos": {}}
        for a in algos:
            _progress(k, total, f"{a} {size} B")
            eng = "flow" if a == "nccl" else engine
            t, bus, alg, label = _one(placement, a, size, ranks, profile, collective, mode, eng)
            row["algos"][a] = {
                "time_us": t * 1e6,
                "algbw": alg,
                "busbw": bus,
                "how": label,
                "mode": "in-kernel" if a in SIM_ALGOS or eng == "analytic" else mode,
            }
            k += 1
        rows.append(row)
    _progress(total, total, "")
    from treecoll.collectives.cost import CostModel

    cm = CostModel(placement)
    return {
        "topology": topology.name,
        "nranks": P,
        "collective": collective,
        "algos": list(algos),
        "profile": profile or "auto (fastest NCCL protocol)",
        "engine": engine,
        "mode": mode if engine == "flow" else "in-kernel",
        "executor": {"backend": cm.backend, "step_cost_us": cm.executor.step_s * 1e6},
        "rows": rows,
        "rounded": rounded,
    }


def _as_nccl_tests_runs(collective: str, sizes: Sequence[int], P: int) -> tuple[list[int], list[dict]]:
    """(the sizes run, ``{"requested", "size"}`` of each size changed): nccl-tests' size of allgather,
    reduce_scatter and alltoall is the whole buffer, rounded down to whole float32 elements per rank
    (src/common.cu ``setupArgs``; src/all_gather.cu: ``recvcount = (count / nranks) * nranks``). A size
    rounded to 0 is not run; none left is an error."""
    from treecoll.collectives.sim.result import DTYPE_SIZES, PER_RANK_COLLECTIVES

    if collective not in PER_RANK_COLLECTIVES:
        return list(sizes), []
    unit = P * DTYPE_SIZES["float32"]
    run, rounded = [], []
    for size in sizes:
        r = size - size % unit
        if r != size:
            rounded.append({"requested": size, "size": r})
        if r and r not in run:
            run.append(r)
    if not run:
        raise CollectiveError(
            f"--sizes: expected at least one size of {unit} B or more ({collective} on {P} ranks: whole float32 "
            f"elements per rank), got {', '.join(map(str, sizes))}"
        )
    return run, rounded


#: what the ``auto`` column of ``simulate allreduce`` is, by mode (the analytic engine has no executor mode)
_AUTO_COLUMN = {
    "executor": "what collectives.allreduce(x) runs, the backend's own allreduce where faster",
    "analytic": "the faster of two_level and tree",
    "in-kernel": "the tree builder auto's tree",
}


def render_allreduce(d: dict) -> str:
    ours = [a for a in d["algos"] if a not in SIM_ALGOS]
    nccl = [a for a in d["algos"] if a in SIM_ALGOS]
    engine = {"flow": "flow simulation", "analytic": "analytic engine"}.get(d.get("engine", "flow"))
    head = f"# {d.get('collective', 'allreduce')} on {_where(d)} ({d['nranks']} ranks), {engine}\n"
    if ours:
        kind = "analytic" if d.get("engine") == "analytic" else d.get("mode", "executor")
        # the column 'auto' is a different quantity in each case
        auto = "; auto: " + _AUTO_COLUMN[kind] if "auto" in ours else ""
        how = {
            "executor": f"executor mode (treecoll's executor on {d['executor']['backend']}: "
            f"{d['executor']['step_cost_us']:.1f} us per message{auto})",
            "analytic": "in-kernel mode (the analytic engine models NCCL's kernels only, "
            f"profile {d['profile']}{auto})",
            "in-kernel": f"in-kernel mode (inside NCCL, profile {d['profile']}{auto})",
        }[kind]
        head += f"# {', '.join(ours)}: {how}\n"
    if nccl:
        sims = [a for a in nccl if a != "nccl"]
        if sims:
            how = "analytic engine" if d.get("engine") == "analytic" else "flow simulation"
            head += f"# {', '.join(sims)}: NCCL's algorithms, in-kernel, {how}; profile {d['profile']}\n"
        if "nccl" in nccl:
            head += "# nccl: what NCCL's tuner picks, by its tuning model (not simulated)\n"
    if d.get("rounded"):
        head += (
            f"# sizes as nccl-tests runs them (whole float32 elements on each of {d['nranks']} ranks, rounded "
            "down): "
            + ", ".join(
                f"{r['requested']} -> {r['size']}" + (" (not run)" if not r["size"] else "") for r in d["rounded"]
            )
            + "\n"
        )
    cols = "".join(f" | {a:^30}" for a in d["algos"])
    sub = "".join(f" | {'time(us)':>10} {'algbw':>9} {'busbw':>9}" for _ in d["algos"])
    lines = [head + f"{'':>12}{cols}", f"{'size (B)':>12}{sub}"]
    for r in d["rows"]:
        cells = "".join(
            f" | {v['time_us']:>10.1f} {v['algbw']:>9.2f} {v['busbw']:>9.2f}"
            for v in (r["algos"][a] for a in d["algos"])
        )
        lines.append(f"{r['size']:>12}{cells}")
    return "\n".join(lines) + "\n(algbw, busbw in GB/s as nccl-tests defines them)"


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from treecoll.topo.errors import MissingDependency

        raise MissingDependency("--plot needs matplotlib: pip install 'treecoll[plot]'") from None
    return plt


def plot_allreduce(d: dict, path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["size"] for r in d["rows"]]
    for a in d["algos"]:
        ax.plot(xs, [max(r["algos"][a]["busbw"], 1e-6) for r in d["rows"]], marker="o", ms=3, label=a)
    ax.set_xscale("log", base=2)
    _finish_plot(
        plt,
        fig,
        ax,
        "message size (bytes)",
        "busbw (GB/s)",
        f"{d['collective']} on {_where(d)} ({d['nranks']} ranks)",
        path,
    )


def _finish_plot(plt, fig, ax, xlabel: str, ylabel: str, title: str, path: str) -> None:
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def decode_data(
    topology: Topology,
    shapes: Sequence[DecodeShape],
    ranks: RanksArg = None,
    tree: str = "two_level",
    profile: str | None = None,
    mode: str = "executor",
) -> dict[str, Any]:
    from treecoll.attention.cost import decode_step
    from treecoll.collectives.cost import CostModel
    from treecoll.collectives.placement import Placement

    runs = []
    for i, s in enumerate(shapes):
        _progress(i, len(shapes), f"{s.seq_len} tokens")
        run = decode_step(topology, s, ranks=ranks, tree=tree, profile=profile or "auto", mode=mode)
        if run["methods"] and all(m["fits"] is False for m in run["methods"].values()):
            raise CollectiveError(f"--seq-len {s.seq_len}: {_not_fitting(run)}; {_longest_fitting(run)}")
        runs.append(run)
    _progress(len(shapes), len(shapes), "")
    cm = CostModel(Placement(topology, ranks))
    return {
        "topology": topology.name,
        "tree": tree,
        "mode": mode,
        "executor": {"backend": cm.backend, "step_cost_us": cm.executor.step_s * 1e6},
        "runs": runs,
    }


def render_decode(d: dict) -> str:
    # NCCL's collectives as simulate's ring/tree/nvls columns simulate them, not its tuning model (the nccl column)
    nccl = "gather and allreduce3: NCCL's own collectives, its fastest algorithm in the flow simulation"
    if d.get("mode", "executor") == "executor":
        lines = [
            f"# tree and ring: executor mode (treecoll's executor on {d['executor']['backend']}: "
            f"{d['executor']['step_cost_us']:.1f} us per message); {nccl}"
        ]
    else:
        lines = [f"# tree and ring: in-kernel mode (inside NCCL); {nccl}"]
    for r in d["runs"]:
        s = r["shape"]
        gpus, hosts = r["nranks"], r["hosts"]
        lines.append(
            f"# decode step on {_where(d)}: {gpus} GPU{'s' * (gpus != 1)} ({hosts} host{'s' * (hosts != 1)}), "
            f"{s['seq_len']} tokens ({r['tokens_per_rank']}/GPU), b={s['batch']}, heads={s['heads']} "
            f"(kv {s['kv_heads']}) x {s['head_dim']}, {s['dtype']}"
        )
        lines.append(
            f"{'method':<12} {'time(us)':>11} {'local(us)':>10} {'combine(us)':>12} {'sent/GPU':>12} "
            f"{'peak mem/GPU':>13} {'paper vol(el)':>14}"
        )
        for name, m in r["methods"].items():
            lines.append(
                f"{name:<12} {m['time_s'] * 1e6:>11.1f} {m['local_s'] * 1e6:>10.1f} "
                f"{m['combine_s'] * 1e6:>12.1f} {fmt_bytes(m['sent_bytes_per_gpu'], si=True):>12} "
                f"{fmt_bytes(m['peak_mem_bytes'], si=True):>13} {m['paper_volume_elements']:>14.4g}"
            )
        if any(m["fits"] is False for m in r["methods"].values()):
            lines.append(f"does not fit, left out of the comparison: {_not_fitting(r)}")
        lines.extend(decode_verdict(r))
        lines.append("")
    return "\n".join(lines)


def _not_fitting(r: dict) -> str:
    """The methods of one decode step whose peak memory per GPU exceeds the GPUs' capacity, in one phrase:
    ``"ring: 2.05 TB per GPU, the H100-SXM5-80GB has 80 GB"``."""
    over = ", ".join(
        f"{name}: {fmt_bytes(m['peak_mem_bytes'], si=True)}" for name, m in r["methods"].items() if m["fits"] is False
    )
    return f"{over} per GPU, the {r['mem_gpu_model'] or 'GPU'} has {fmt_bytes(r['mem_capacity_bytes'], si=True)}"


def _longest_fitting(r: dict) -> str:
    n, gpus = r["max_seq_len_fits"], r["nranks"]
    these = "this GPU" if gpus == 1 else f"these {gpus} GPUs"
    if not n:
        return f"no context fits on {these}; expected a topology with more GPU memory"
    return f"expected at most {n} tokens on {these} (--seq-len), or more GPUs (--ranks, --topology)"


def decode_verdict(r: dict) -> list[str]:
    """The lines under one decode step's table: what ``combine="auto"`` runs and how it, and treecoll's
    own tree, compare with ring attention."""
    if "auto" not in r:
        return []
    auto = (
        f'auto (tree_decode\'s combine="auto"): {r["auto"]}'
        if r.get("mode", "executor") == "executor"
        else f"fastest combine with the tree inside NCCL (tree_decode runs it from Python): {r['auto']}"
    )
    if "speedup_auto_vs_ring" not in r:
        return [auto]
    lines = [f"{auto}, {r['speedup_auto_vs_ring']:.1f}x faster than ring attention"]
    if r["auto"] != "tree" and "speedup_tree_vs_ring" in r:
        lines.append(f"treecoll's tree combine: {r['speedup_tree_vs_ring']:.1f}x faster than ring attention")
    return lines


def plot_decode(d: dict, path: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [r["shape"]["seq_len"] for r in d["runs"]]
    for m in d["runs"][0]["methods"]:
        ax.plot(xs, [r["methods"][m]["time_s"] * 1e6 for r in d["runs"]], marker="o", label=m)
    ax.set_xscale("log")
    _finish_plot(
        plt,
        fig,
        ax,
        "sequence length (tokens)",
        "decode step attention time (µs)",
        f"decode on {_where(d)} ({d['runs'][0]['nranks']} GPUs)",
        path,
    )


def links_data(
    topology: Topology, algo: str, size: int, ranks: RanksArg = None, profile: str | None = None, top: int = 10
) -> dict[str, Any]:
    from treecoll.collectives.sim.simulator import simulate_nccl_algorithm

    check_algos([algo])
    if algo == "nccl":
        raise CollectiveError(
            "simulate links: 'nccl' is an analytical model without links; pick ring, tree, nvls or a builder name"
        )
    r = simulate_nccl_algorithm(topology, algo, size, ranks=ranks, profile=profile or "auto", top=top)
    return {
        "topology": topology.name,
        "algo": algo,
        "nranks": r.nranks,
        "size": size,
        "time_us": r.time * 1e6,
        "busbw": r.busbw,
        "profile": r.profile,
        "mode": "in-kernel",
        "kind_bytes": r.kind_bytes,
        "busiest": list(r.busiest),
        "peak_scratch_max_bytes": max(r.peak_scratch, default=0.0),
    }


def render_links(d: dict) -> str:
    lines = [
        f"# {d['algo']} allreduce of {d['size']} B on {_where(d)} ({d['nranks']} ranks): "
        f"{d['time_us']:.1f} us, busbw {d['busbw']:.2f} GB/s ({d['profile']}, in-kernel mode: as NCCL's "
        f"kernels would run it)",
        "bytes per link kind: " + ", ".join(f"{k} {fmt_bytes(v, si=True)}" for k, v in d["kind_bytes"].items()),
        f"{'link':<44} {'kind':<7} {'bytes':>10} {'busy':>6}",
    ]
    for b in d["busiest"]:
        lines.append(f"{b['link']:<44} {b['kind']:<7} {fmt_bytes(b['bytes'], si=True):>10} {100 * b['busy']:>5.1f}%")
    lines.append(f"peak scratch per GPU: {fmt_bytes(d['peak_scratch_max_bytes'], si=True)}")
    return "\n".join(lines)
