"""``treecoll decode``: sharded decoding of a random context, checked against one process.

What it runs: ``--layers`` attention layers with a KV cache of ``--seq-len``
tokens per sequence (random K/V from ``--seed``, cache dtype ``--dtype``),
sharded over the group with :class:`attention.ShardedKVCache` (round-robin
blocks of ``--block-size`` tokens; each rank generates only its own blocks).
Each decode step appends one random token's K/V to every layer and decodes a
random query per layer with each method: ``tree`` (:func:`treecoll.attention.tree_decode` with the
tree combine) and the other methods of ``--compare`` (``auto``: ``tree_decode`` as it runs by
default, the combine the cost model picks; ``gather``, ``ring``, ``allreduce3``).  The same steps
are replayed in one process (rank 0, the whole cache, ``decode_partial``) and
every method's outputs are compared with that reference.

Processes: ``--nproc`` processes are spawned (:mod:`treecoll.collectives.launch`,
gloo on 127.0.0.1); under ``torchrun`` or any ``env://`` launcher (``RANK`` and
``WORLD_SIZE`` in the environment) the launched job is joined instead (NCCL and
``cuda:LOCAL_RANK`` when CUDA is available, else gloo) and rank 0 prints.

Measurements, per method and rank:

* step latency: wall time of one decode step's attention calls (all layers;
  the K/V append, the same for every method, is not timed); the methods are
  interleaved on one cache (each step appends the token once, then every method
  attends, in rotating order, after a barrier), so they see the same machine
  load; the step's latency is the maximum over ranks, and the median over
  steps 2..n is reported (the first step checks shapes and builds the tree);
* bytes sent: bytes this rank's code passes to torch.distributed during one
  step (point-to-point sends plus the buffers given to all_reduce /
  all_gather; :func:`treecoll.attention.dist.count_traffic`), measured in one extra
  untimed step; the JSON also has ``wire_bytes_estimate_per_rank``: the same
  with each collective counted as its bandwidth-optimal ring algorithm sends
  (all_reduce 2(P-1)/P of the buffer: :meth:`treecoll.attention.dist.Traffic.wire_estimate`);
* peak memory: the rank's KV cache bytes (allocated, all layers) plus the peak
  of tensor bytes allocated and alive at once during one step (torch profiler
  memory events: :func:`treecoll.attention.dist.peak_tensor_bytes`), in one extra untimed step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from treecoll.topo.errors import AttentionError
from treecoll.topo.fmt import fmt_bytes, table

__all__ = ["add_parser", "run", "decode_data", "render"]

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
METHOD_ORDER = ("tree", "auto", "gather", "ring", "allreduce3")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from treecoll.tools import units
    from treecoll.tools.cli import common_options
    from treecoll.tools.resources import OVERSUBSCRIBE_HELP

    p = subparsers.add_parser(
        "decode",
        help="sharded tree-attention decoding vs ring and three all-reduces",
        description="Sharded decoding of a random context over gloo processes (or the "
        "torchrun group): tree attention beside ring attention and the paper's "
        "three all-reduces, every method checked against one process.",
    )
    common_options(p)
    p.add_argument(
        "--nproc",
        type=units.int_arg("--nproc"),
        default=4,
        metavar="P",
        help="processes to spawn (ignored under torchrun; default 4)",
    )
    p.add_argument("--oversubscribe", action="store_true", help=OVERSUBSCRIBE_HELP)
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--topology",
        metavar="F",
        help="topology YAML file, shipped name or 'default' for the tree; rank r runs on its r-th GPU",
    )
    src.add_argument(
        "--discover", action="store_true", help="discover the group's topology (topo.discover_cluster; the default)"
    )
    p.add_argument(
        "--seq-len",
        type=units.count_arg("--seq-len"),
        default=32768,
        metavar="N",
        help="context tokens per sequence; k = 1e3, M = 1e6 (default 32768)",
    )
    p.add_argument("--batch", type=units.int_arg("--batch"), default=1, help="sequences (default 1)")
    p.add_argument("--layers", type=units.int_arg("--layers"), default=2, help="attention layers (default 2)")
    p.add_argument("--heads", type=units.int_arg("--heads"), default=32, help="query heads (default 32)")
    p.add_argument(
        "--kv-heads", type=units.int_arg("--kv-heads"), default=8, help="K/V heads, dividing --heads (default 8)"
    )
    p.add_argument("--head-dim", type=units.int_arg("--head-dim"), default=128, help="head dimension (default 128)")
    p.add_argument(
        "--new-tokens",
        type=units.int_arg("--new-tokens", minimum=2),
        default=16,
        help="decode steps, at least 2: the first is a warm-up (default 16)",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(_DTYPES),
        default="bf16",
        help=f"KV cache dtype: {', '.join(sorted(_DTYPES))} (default bf16)",
    )
    p.add_argument(
        "--block-size",
        type=units.int_arg("--block-size"),
        default=256,
        help="tokens per round-robin block of the cache (default 256)",
    )
    p.add_argument(
        "--compare",
        default="ring,allreduce3",
        metavar="M[,M...]",
        help="methods to run beside tree: comma list of auto (the combine tree_decode picks by default), gather, "
        "ring, allreduce3, or 'none' (default ring,allreduce3)",
    )
    p.add_argument("--seed", type=units.int_arg("--seed", minimum=0), default=0, help="random seed (default 0)")
    p.add_argument(
        "--timeout",
        type=units.seconds_arg("--timeout"),
        default=600.0,
        help="seconds before the group gives up (default 600)",
    )
    p.add_argument("--no-check", action="store_true", help="skip the one-process reference check")
    return p


def _methods(compare: str) -> list[str]:
    from treecoll.tools import units

    names = (
        []
        if compare.strip() == "none"
        else units.parse_list(compare, what="--compare", kind="methods", error=AttentionError)
    )
    for m in names:
        if m not in METHOD_ORDER[1:]:
            raise AttentionError(
                f"--compare: expected a comma list of {', '.join(METHOD_ORDER[1:])} or 'none', got {m!r}"
            )
    return ["tree"] + [m for m in METHOD_ORDER if m in names]


def _config(args) -> dict:
    if args.heads % args.kv_heads:
        raise AttentionError(f"--heads: expected a multiple of --kv-heads={args.kv_heads}, got {args.heads}")
    topology = None
    if args.topology:
        from treecoll import topo

        topology = topo.resolve(args.topology).to_dict()  # plain data crosses the process boundary
    return {
        "seq_len": args.seq_len,
        "batch": args.batch,
        "layers": args.layers,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "new_tokens": args.new_tokens,
        "dtype": _DTYPES[args.dtype],
        "block_size": args.block_size,
        "methods": _methods(args.compare),
        "seed": args.seed,
        "topology": topology,
        "check": not args.no_check,
    }


_ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}
#: peak RSS of one rank of this command before its cache (bytes): 394-396 MiB measured (VmHWM; 237 MiB
#: private, 156 MiB shared library pages) on Linux x86-64, torch 2.13 CPU, a 40-token cache, 2 to 4 ranks,
#: rounded up by about a tenth for other machines' libraries and thread counts. More than torch + gloo
#: alone (:data:`treecoll.tools.resources.PROCESS_BASELINE_BYTES`): a rank also loads attention, its native kernel
#: and torch's profiler. tests/tools/test_cmd_decode.py checks every run's measured peaks against
#: :func:`memory_estimate` with this baseline.
RANK_BASELINE_BYTES = 448 << 20


def memory_estimate(cfg: dict, world: int) -> dict[str, int]:
    """Bytes one decode run allocates beyond each process's baseline (plain data).

    ``cache_per_rank``: rank 0's :class:`ShardedKVCache` (it holds the most blocks),
    K and V of every layer; ``transient_per_rank``: a step's temporaries: eight float32
    buffers of a state's size (query, output, partial and merged states, the packed
    buffer and its receive buffer), and with ``ring`` among the methods
    two of one layer's K/V shards (ring attention holds the shard it receives beside
    the one it sends on); ``reference``: rank 0's one-process check, the whole cache
    and a step's float32 temporaries (0 with ``check`` off). Each process adds
    :data:`RANK_BASELINE_BYTES`.
    """
    b, hkv, d, layers = cfg["batch"], cfg["kv_heads"], cfg["head_dim"], cfg["layers"]
    item = _ITEMSIZE[cfg["dtype"]]
    tokens = cfg["seq_len"] + cfg["new_tokens"] + 1
    full, rest = divmod(tokens, cfg["block_size"] * world)
    local = full * cfg["block_size"] + min(rest, cfg["block_size"])  # rank 0's slots
    states = 8 * 4 * b * cfg["heads"] * (d + 2)  # eight float32 [B, H, D + 2] buffers

    def cache(n: int) -> int:
        return 2 * layers * b * n * hkv * d * item

    ring = 2 * cache(local) // layers if "ring" in cfg["methods"] else 0
    reference = cache(tokens) + states if cfg["check"] else 0
    return {"cache_per_rank": cache(local), "transient_per_rank": ring + states, "reference": reference}


# ------------------------------------------------------------------ the per-rank work


def _gen(seed: int, *ids: int):
    import torch

    s = seed
    for i in ids:
        s = (s * 1000003 + i + 1) % (2**62)
    return torch.Generator().manual_seed(s)


def _block(cfg, layer: int, j: int, n: int):
    """K and V of block j (n tokens) of ``layer``: [batch, n, kv_heads, head_dim], cache dtype."""
    import torch

    g = _gen(cfg["seed"], 1, layer, j)
    shape = (cfg["batch"], n, cfg["kv_heads"], cfg["head_dim"])
    dtype = getattr(torch, cfg["dtype"])
    return torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)


def _step_inputs(cfg, step: int, layer: int):
    import torch

    g = _gen(cfg["seed"], 2, step, layer)
    b, hq, hkv, d = cfg["batch"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    dtype = getattr(torch, cfg["dtype"])
    q = torch.randn(b, hq, d, generator=g)
    return q, torch.randn(b, hkv, d, generator=g).to(dtype), torch.randn(b, hkv, d, generator=g).to(dtype)


def build_cache(cfg, rank: int, world: int, device=None):
    """This rank's :class:`ShardedKVCache` with the random context (only its own blocks generated)."""
    import torch
    from treecoll.attention.kv_cache import ShardedKVCache

    n, bs = cfg["seq_len"], cfg["block_size"]
    cache = ShardedKVCache(
        layers=cfg["layers"],
        batch=cfg["batch"],
        kv_heads=cfg["kv_heads"],
        head_dim=cfg["head_dim"],
        max_seq_len=n + cfg["new_tokens"] + 1,
        rank=rank,
        world=world,
        block_size=bs,
        dtype=getattr(torch, cfg["dtype"]),
        device=device,
    )
    lengths = [n] * cfg["batch"]
    for layer in range(cfg["layers"]):
        slot = 0
        for j in range(rank, -(-n // bs), world):
            cnt = min(bs, n - j * bs)
            k, v = _block(cfg, layer, j, cnt)
            cache.k[layer][:, slot : slot + cnt].copy_(k)
            cache.v[layer][:, slot : slot + cnt].copy_(v)
            slot += cnt
        cache.set_lengths(layer, lengths)
    return cache


def _decode_step(fn, cache, cfg, step: int, device, topology, check: bool, outputs=None):
    for layer in range(cfg["layers"]):
        q, kn, vn = _step_inputs(cfg, step, layer)
        cache.append(layer, kn.to(device), vn.to(device))
        k, v, kv_len = cache.shard(layer)
        out = fn(q.to(device), k, v, kv_len=kv_len, topology=topology, check=check)
        if outputs is not None:
            outputs.append(out.float().cpu())


def _attend_all_layers(fn, cache, cfg, step: int, device, topology):
    """``fn`` on every layer's shard for decode step ``step`` (K/V already appended)."""
    for layer in range(cfg["layers"]):
        q, _, _ = _step_inputs(cfg, step, layer)
        k, v, kv_len = cache.shard(layer)
        fn(q.to(device), k, v, kv_len=kv_len, topology=topology, check=False)


def worker(rank: int, world: int, cfg: dict, device=None) -> dict:
    """One rank of ``treecoll decode``: decode with every method, measure, and on
    rank 0 compare with the one-process reference.  Returns plain data.

    The methods are interleaved on the same cache: each step appends the token's
    K/V to every layer once, then every method attends (methods in a rotating
    order, a barrier before each call), so all methods see the same machine load.
    A method's step time on a rank is the sum of its calls over the layers.
    """
    import torch
    import torch.distributed as dist
    from treecoll.attention.baselines import method
    from treecoll.attention.dist import count_traffic, peak_tensor_bytes
    from treecoll.attention.tree_decode import resolve_tree
    from treecoll.topo.ranks import resolve_gpus

    topology = None
    if cfg["topology"] is not None:
        from treecoll.topo import Topology

        topology = Topology.from_dict(cfg["topology"])
    cache = build_cache(cfg, rank, world, device)
    tree = resolve_tree("auto", topology=topology) if world > 1 else None
    names = list(cfg["methods"])
    fns = {name: method(name) for name in names}
    times = {name: [] for name in names}
    outputs = {name: [] for name in names}
    sync = device is not None and torch.cuda.is_available()
    for step in range(cfg["new_tokens"]):
        spent = dict.fromkeys(names, 0.0)
        order = names[step % len(names) :] + names[: step % len(names)]
        for layer in range(cfg["layers"]):
            q, kn, vn = _step_inputs(cfg, step, layer)
            cache.append(layer, kn.to(device), vn.to(device))
            k, v, kv_len = cache.shard(layer)
            q = q.to(device)
            for name in order:
                if world > 1:
                    dist.barrier()
                t0 = time.perf_counter()
                out = fns[name](q, k, v, kv_len=kv_len, topology=topology, check=step == 0)
                if sync:
                    torch.cuda.synchronize()
                spent[name] += time.perf_counter() - t0
                if rank == 0:
                    outputs[name].append(out.float().cpu())
        for name in names:
            times[name].append(spent[name])
    # one extra token, untimed: bytes and peak memory of one step per method
    for layer in range(cfg["layers"]):
        _, kn, vn = _step_inputs(cfg, cfg["new_tokens"], layer)
        cache.append(layer, kn.to(device), vn.to(device))
    res: dict[str, Any] = {
        "rank": rank,
        "cache_bytes": cache.nbytes(),
        "methods": {},
        "tree": None if tree is None else {"parents": list(tree.parents), "name": tree.name},
        "gpus": None if topology is None else list(resolve_gpus(topology, world)),
        "topology_gpus": None if topology is None else len(topology.gpus()),
        "auto_picks": _auto_picks(cfg, topology) if "auto" in names and world > 1 else None,
    }
    for name in names:
        if world > 1:
            dist.barrier()
        with count_traffic() as traffic:
            _attend_all_layers(fns[name], cache, cfg, cfg["new_tokens"], device, topology)
        if world > 1:
            dist.barrier()
        _, peak = peak_tensor_bytes(_attend_all_layers, fns[name], cache, cfg, cfg["new_tokens"], device, topology)
        res["methods"][name] = {
            "times": times[name],
            "bytes_sent": traffic.sent,
            "traffic": traffic.as_dict(world),
            "peak_transient": peak,
        }
    if world > 1:
        dist.barrier()
    if rank == 0 and cfg["check"]:
        reference = _reference(cfg)
        for name, m in res["methods"].items():
            m["max_abs_err"] = max(float((a - b).abs().max()) for a, b in zip(outputs[name], reference))
    res["max_rss_bytes"] = _max_rss()
    return res


def _auto_picks(cfg: dict, topology: Any) -> str:
    """The combine the ``auto`` method runs on this group (every rank picks the same)."""
    from treecoll.attention.tree_decode import choose_combine

    return choose_combine(cfg["batch"], cfg["heads"], cfg["head_dim"], topology=topology)


def _max_rss() -> int | None:
    """This process's peak resident memory in bytes (Linux ``VmHWM``: the peak of this program's
    own address space; ``ru_maxrss`` would carry over the parent's peak through fork and exec);
    None where /proc does not say."""
    from treecoll.tools.resources import proc_bytes

    return proc_bytes("/proc/self/status", "VmHWM")


def _reference(cfg) -> list:
    """The same steps in one process over the whole cache (world of one)."""
    from treecoll.attention import decode_partial

    def local(q, k, v, *, kv_len, topology, check):
        return decode_partial(q, k, v, kv_len=kv_len)[0]

    cache = build_cache(cfg, 0, 1)
    outputs: list = []
    for step in range(cfg["new_tokens"]):
        _decode_step(local, cache, cfg, step, None, None, False, outputs)
    return outputs


# ------------------------------------------------------------------ assembling


def summarize(cfg: dict, ranks: list[dict], world: int) -> dict:
    """The plain dict ``treecoll decode`` prints."""
    methods = {}
    for name in cfg["methods"]:
        per_rank = [r["methods"][name] for r in ranks]
        steps = [max(ts) for ts in zip(*(m["times"] for m in per_rank))]
        timed = steps[1:] if len(steps) > 1 else steps
        methods[name] = {
            "median_step_s": statistics.median(timed),
            "step_s": steps,
            "bytes_sent_per_rank": [m["bytes_sent"] for m in per_rank],
            "wire_bytes_estimate_per_rank": [m["traffic"]["wire_estimate"] for m in per_rank],
            "peak_bytes_per_rank": [r["cache_bytes"] + r["methods"][name]["peak_transient"] for r in ranks],
            "peak_transient_bytes_per_rank": [m["peak_transient"] for m in per_rank],
            "max_abs_err": ranks[0]["methods"][name].get("max_abs_err"),
        }
        if name == "auto":
            methods[name]["picks"] = ranks[0].get("auto_picks") or "tree"  # one process: no combine
    out = {
        "nproc": world,
        "config": {k: v for k, v in cfg.items() if k != "topology"},
        "topology": None if cfg["topology"] is None else cfg["topology"].get("name"),
        "gpus": ranks[0].get("gpus"),
        "topology_gpus": ranks[0].get("topology_gpus"),
        "tree": ranks[0]["tree"],
        "cache_bytes_per_rank": [r["cache_bytes"] for r in ranks],
        "max_rss_bytes_per_rank": [r.get("max_rss_bytes") for r in ranks],
        "methods": methods,
    }
    if "tree" in methods:
        for m in methods.values():
            m["speedup_of_tree"] = m["median_step_s"] / methods["tree"]["median_step_s"]
    return out


def decode_data(cfg: dict, nproc: int, timeout: float = 600.0) -> dict:
    """Spawn ``nproc`` gloo processes (:func:`treecoll.collectives.launch.spawn`), run
    :func:`worker`, return :func:`summarize`'s dict (``nproc == 1``: in this process, no group)."""
    from treecoll.collectives import launch

    if nproc == 1:
        return summarize(cfg, [worker(0, 1, cfg)], 1)
    ranks = launch.spawn(worker, nproc, cfg, timeout=timeout, where="decode")
    return summarize(cfg, ranks, nproc)


def _launched_worker(rank: int, world: int, cfg: dict) -> dict:
    """:func:`worker` on a rank of a job launched by torchrun: on its CUDA device
    (``cuda:LOCAL_RANK``, set by :func:`treecoll.collectives.launch.join`) when the group runs NCCL."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    return worker(rank, world, cfg, device)


def run(args: argparse.Namespace) -> int:
    from treecoll.collectives import launch
    from treecoll.tools.cli import emit

    cfg = _config(args)
    job = launch.job_from_env()
    if job is not None:
        ranks = launch.join(_launched_worker, cfg, timeout=args.timeout, where="decode")
        if job.rank != 0:
            return 0
        data = summarize(cfg, ranks, len(ranks))
    else:
        check_start(cfg, args.nproc, oversubscribe=args.oversubscribe)
        data = decode_data(cfg, args.nproc, args.timeout)
    return emit(args, data, render)


def check_start(cfg: dict, nproc: int, *, oversubscribe: bool = False, option: str = "--nproc") -> dict:
    """Refuse, before any process starts, ``nproc`` ranks that a ``--topology`` has no GPUs
    for, or that exceed this machine's cores or memory (:func:`treecoll.tools.resources.check_processes`,
    with :func:`memory_estimate`); returns the numbers checked."""
    from treecoll.tools.resources import check_processes, check_topology_ranks

    check_topology_ranks(cfg["topology"], nproc, option=option)
    mem = memory_estimate(cfg, nproc)
    return check_processes(
        nproc,
        option=f"{option} {nproc}",
        per_process_bytes=mem["cache_per_rank"] + mem["transient_per_rank"],
        extra_bytes=mem["reference"],
        baseline_bytes=RANK_BASELINE_BYTES,
        oversubscribe=oversubscribe,
    )


def _where(d: dict) -> str:
    """``dgx-h100-x2, ranks 0..3 on h0/gpu0, h0/gpu1, h0/gpu2, h0/gpu3 (4 of its 16 GPUs)``."""
    if not d["topology"]:
        return "discovered (topo.discover_cluster)"
    gpus = d.get("gpus")
    if not gpus:
        return d["topology"]
    listed = ", ".join(gpus) if len(gpus) <= 8 else f"{gpus[0]}, {gpus[1]}, ..., {gpus[-1]}"
    span = f"rank 0 on {listed}" if len(gpus) == 1 else f"ranks 0..{len(gpus) - 1} on {listed}"
    share = "all its GPUs" if len(gpus) == d["topology_gpus"] else f"{len(gpus)} of its {d['topology_gpus']} GPUs"
    return f"{d['topology']}, {span} ({share})"


def render(d: dict) -> str:
    c = d["config"]
    lines = [
        f"decode: {d['nproc']} ranks, batch {c['batch']}, {c['seq_len']} context tokens, {c['layers']} layers, "
        f"{c['heads']}/{c['kv_heads']} heads x {c['head_dim']}, KV {c['dtype']}, {c['new_tokens']} steps",
        f"topology: {_where(d)}; tree parents: {d['tree']['parents'] if d['tree'] else '-'}",
        f"KV cache per rank: {', '.join(fmt_bytes(b, si=True) for b in d['cache_bytes_per_rank'])}",
    ]
    if all(d.get("max_rss_bytes_per_rank") or [None]):
        rss = ", ".join(fmt_bytes(b, si=True) for b in d["max_rss_bytes_per_rank"])
        lines.append(f"process peak RSS per rank: {rss}")
    lines.append("")
    rows = [
        [
            f"auto ({m['picks']})" if name == "auto" else name,
            m["median_step_s"] * 1e6,
            m.get("speedup_of_tree", 1.0),
            None if m["max_abs_err"] is None else f"{m['max_abs_err']:.1e}",
            ", ".join(fmt_bytes(b, si=True) for b in m["bytes_sent_per_rank"]),
            ", ".join(fmt_bytes(b, si=True) for b in m["peak_bytes_per_rank"]),
        ]
        for name, m in d["methods"].items()
    ]
    header = ["method", "step (us)", "vs tree", "max |err|", "bytes sent/rank", "peak mem/rank"]
    lines.append(table(rows, header, formats=[None, ".0f", ".2f", None, None, None]))
    lines.append("")
    lines.append(
        "step = the attention calls of all layers for one token (methods interleaved), max over ranks, "
        "median over steps 2..n; "
        "error vs the same steps in one process"
    )
    lines.append(
        "bytes sent = bytes passed to torch.distributed; on the wire with ring collectives: "
        + "; ".join(
            f"{name} {fmt_bytes(max(m['wire_bytes_estimate_per_rank']), si=True)}" for name, m in d["methods"].items()
        )
        + " (max over ranks)"
    )
    for name, m in d["methods"].items():
        lines.append(f"  {name} per-step (us): " + " ".join(f"{t * 1e6:.0f}" for t in m["step_s"]))
    return "\n".join(lines)
