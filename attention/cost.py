"""Cost model of one long-context decode step: Tree Attention versus its baselines.

One decode step of attention with the KV cache of ``N`` tokens sharded along
the sequence over ``P`` GPUs (``t = ceil(N / P)`` tokens each). Every method
first computes the local partial attention, bound by reading the shard's K and
V once: ``2 · b · t · n_kv · d_h · itemsize / mem_bw`` seconds (the query and
the output are negligible at long context). Then the partial results combine:

* ``tree`` (treecoll, Tree Attention): one reduction of the packed attention
  state (``out`` fp32 [B, H, D] + ``lse`` fp32 [B, H], merged in fp32) over the
  chosen tree, then a broadcast of the result: the tree's allreduce schedule
  (:func:`treecoll.collectives.compile.compile_allreduce`) simulated on the topology,
  merges costing ``3 × state bytes / mem_bw``.
* ``allreduce3`` (the paper's Algorithm 3, Zyphra's and lucidrains' code):
  three allreduces one after the other, max of lse [B, H], sum of the
  denominators [B, H], sum of the numerators [B, H, D], all fp32, each timed
  as NCCL would run it (the fastest of the ring, an NCCL-like tree, chain
  inside a host, and NVLS where NCCL offers it, over the fastest protocol:
  :func:`treecoll.collectives.sim.simulate_nccl_allreduce`).
* ``ring`` (Ring Attention as in the paper's baseline): ``P − 1`` steps, in
  each every GPU passes its current K/V block (``2 · b · t · n_kv · d_h``
  elements) to its ring successor while it computes on the block it has;
  compute and communication overlap, so a step costs the longer of the two:
  ``time = local + (P − 1) · max(local, step transfer)`` (plus the profile's
  per-call overhead per step).

Reported per method: time (s) split into local and combine, communication
volume (bytes sent per GPU, measured on the simulated schedule, and the
paper's formula in elements), peak memory per GPU (bytes; and the paper's
formula in elements). Paper formulas (arXiv 2408.04093 §6.2, eqs. 8-9, and §6.3,
eqs. 10-14), with ``d = n_h · d_h``:
``V_ring = 2btd · p``, ``V_tree = 2 (p − 1)/p · (bd + 2 b n_h)``,
``Mem_ring = 4btd + 2bd``, ``Mem_tree = 2btd + 2bd + 2 b n_h``. With GQA the
K/V width is ``n_kv · d_h``; the formulas then use it for the K/V terms.

>>> s = DecodeShape(seq_len=80_000, heads=16, head_dim=128)
>>> paper_volumes(s, 8)["tree"]      # 2·7/8·(2048 + 32)
3640.0
>>> paper_volumes(s, 8)["ring"] == 2 * 10_000 * 2048 * 8
True
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from treecoll.collectives.placement import Placement, as_placement
from treecoll.collectives.sim.engine import Network, concurrent_times
from treecoll.collectives.sim.simulator import (
    DTYPE_SIZES,
    NCCL_TREE_RUN,
    placed,
    simulate,
    simulate_nccl_allreduce,
)
from treecoll.topo import Topology
from treecoll.topo.errors import CollectiveError
from treecoll.topo.ranks import RanksArg

__all__ = ["DecodeShape", "decode_step", "paper_volumes", "paper_memory", "PAPER_SEQ_LENS", "PAPER_HOSTS",
           "LLAMA31_8B", "PAPER_SHAPE", "METHODS"]

METHODS = ("tree", "allreduce3", "ring")
#: sequence lengths of the paper's Fig. 3 (80k to 5.12M tokens, doubling)
PAPER_SEQ_LENS = tuple(80_000 * 2 ** i for i in range(7))
#: DGX H100 host counts of the paper's Fig. 3b (1 to 16 nodes of 8 GPUs)
PAPER_HOSTS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class DecodeShape:
    """One decode step: ``batch`` sequences of ``seq_len`` tokens, ``heads`` query heads of ``head_dim``.

    ``kv_heads`` defaults to ``heads`` (MHA); fewer is GQA/MQA. ``dtype`` of
    the KV cache (the paper: bf16).
    """

    seq_len: int
    heads: int
    head_dim: int
    kv_heads: int | None = None
    batch: int = 1
    dtype: str = "bfloat16"

    def __post_init__(self):
        kv = self.kv_heads if self.kv_heads is not None else self.heads
        object.__setattr__(self, "kv_heads", kv)
        for k in ("seq_len", "heads", "head_dim", "kv_heads", "batch"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise CollectiveError(f"decode shape: {k} expected a positive integer, got {v!r}")
        if self.heads % kv:
            raise CollectiveError(f"decode shape: heads ({self.heads}) expected a multiple of kv_heads ({kv})")
        if self.dtype not in DTYPE_SIZES:
            raise CollectiveError(f"decode shape: dtype expected one of {sorted(DTYPE_SIZES)}, got {self.dtype!r}")


#: the paper's attention block: 16 heads × 128, bf16 (§6)
PAPER_SHAPE = DecodeShape(seq_len=80_000, heads=16, head_dim=128)
#: Llama-3.1-8B attention: 32 query heads, 8 KV heads, head_dim 128, bf16
LLAMA31_8B = DecodeShape(seq_len=32_768, heads=32, head_dim=128, kv_heads=8)


def paper_volumes(shape: DecodeShape, p: int) -> dict[str, float]:
    """Communication volume in elements, the paper's eqs. 10-14 (t = N/p, K/V width n_kv·d_h)."""
    b, t = shape.batch, shape.seq_len / p
    d, dkv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    numel = b * d + 2 * b * shape.heads
    return {"ring": 2 * b * t * dkv * p, "tree": 2 * (p - 1) / p * numel, "allreduce3": 2 * (p - 1) / p * numel}


def paper_memory(shape: DecodeShape, p: int) -> dict[str, float]:
    """Peak memory in elements, the paper's eqs. 8-9."""
    b, t = shape.batch, shape.seq_len / p
    d, dkv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    tree = 2 * b * t * dkv + 2 * b * d + 2 * b * shape.heads
    return {"ring": 4 * b * t * dkv + 2 * b * d, "tree": tree, "allreduce3": tree}


def decode_step(placement: Placement | Topology, shape: DecodeShape, *, ranks: RanksArg = None,
                tree: str = "two_level", nchunks: int = 1, profile: Any = "auto",
                methods: tuple[str, ...] = METHODS, mode: str = "executor") -> dict:
    """Time, volume and memory of one decode step for each method in ``methods`` (plain dict).

    ``placement``: a :class:`~treecoll.collectives.placement.Placement`, or a Topology with
    ``ranks`` (a count of the first ranks, or GPUs; default all), under the one rank rule.
    ``tree``: the builder used by ``tree``. ``profile``: a simulator profile
    or ``"auto"`` (fastest NCCL protocol per collective). ``mode``: ``executor`` (the
    default) times ``tree`` and ``ring`` as treecoll runs them, from Python, each message
    costing the backend's :class:`~treecoll.collectives.cost.ExecutorCost` (the tree: the
    planner's schedule, :func:`treecoll.collectives.sim.executor.predict_schedule`, the number
    ``treecoll tree build`` prints); ``in-kernel`` as if they ran inside NCCL (``nchunks``
    chunks, NCCL's protocols). ``allreduce3`` is NCCL's own allreduce either way.
    """
    from treecoll.collectives.cost import MODES, executor_cost
    from treecoll.collectives.planner import default_planner
    if mode not in MODES:
        raise CollectiveError(f"decode model: mode expected one of {list(MODES)}, got {mode!r}")
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise CollectiveError(f"decode methods {bad}: expected some of {list(METHODS)}")
    p = as_placement(placement, ranks, what="decode model")
    topology, gpus = placed(p, what="decode model")
    P = len(gpus)
    item = DTYPE_SIZES[shape.dtype]
    b, H, D, Hkv = shape.batch, shape.heads, shape.head_dim, shape.kv_heads
    t = math.ceil(shape.seq_len / P)
    mem_bw = min(float(topology.node(g).get("mem_bw", 0.0) or 0.0) for g in gpus) * 1e9
    if mem_bw <= 0:
        raise CollectiveError(f"decode model: GPUs of topology {topology.name!r} carry no mem_bw (GB/s); "
                              f"add it to the host template's gpus")
    kv_bytes = 2 * b * t * Hkv * D * item
    local = kv_bytes / mem_bw
    state_bytes = 4 * b * H * (D + 1)
    q_bytes = b * H * D * item
    vol, mem = paper_volumes(shape, P), paper_memory(shape, P)
    out = {"shape": asdict(shape), "nranks": P, "hosts": len({topology.host_of(g) for g in gpus}), "mode": mode,
           "tokens_per_rank": t, "kv_bytes_per_rank": kv_bytes, "local_s": local, "methods": {}}
    if "tree" in methods:
        if P > 1:
            from treecoll.collectives import builders
            from treecoll.collectives import compile as compile_
            # the packed state is merged whole (attention.tree_decode): one tree, never split over rails
            opts = {"nbytes": state_bytes, "rails": False} if tree == "two_level" else (
                {"nbytes": state_bytes} if tree == "auto" else {})
            plan = builders.build(tree, p, **opts)
            if mode == "executor":      # what tree_decode runs: collectives.allreduce of the state
                from treecoll.collectives.sim.executor import predict_schedule
                best = predict_schedule(p, plan, state_bytes)
                sched = default_planner().schedule_for(plan, collective="allreduce", nbytes=state_bytes,
                                                       placement=p, algo="tree")[1]
            else:
                sched = compile_.compile_allreduce(plan, nchunks, forward_lag=0)   # GPU kernels forward at once
                best = min((simulate(p, sched, state_bytes, profile=pr.for_tree_allreduce(), **NCCL_TREE_RUN)
                            for pr in _profiles(profile, state_bytes, topology, gpus)), key=lambda r: r.time)
            comm, sent, scratch = best.time, max(sched.bytes_sent(r, state_bytes) for r in range(P)), \
                max(best.peak_scratch)
            total_sent = sum(sched.bytes_sent(r, state_bytes) for r in range(P))
        else:
            comm = sent = scratch = total_sent = 0
        out["methods"]["tree"] = _method(local, comm, sent, total_sent, kv_bytes + q_bytes + state_bytes + scratch,
                                         vol["tree"], mem["tree"], f"{tree} allreduce of {state_bytes} B state")
    if "allreduce3" in methods:
        comm, sent, peak = 0.0, 0.0, 0.0
        for nbytes in (4 * b * H, 4 * b * H, 4 * b * H * D):
            if P > 1:
                r = simulate_nccl_allreduce(p, nbytes, profile=profile)[1]
                comm += r.time
                sent += 2 * (P - 1) / P * nbytes
                peak = max(peak, max(r.peak_scratch))
        bufs = 4 * b * H * (D + 2)   # numerator, denominator, max in fp32
        out["methods"]["allreduce3"] = _method(local, comm, sent, sent * P, kv_bytes + q_bytes + bufs + peak,
                                               vol["allreduce3"], mem["allreduce3"],
                                               "max(lse), sum(den), sum(num): NCCL's ring, tree or NVLS each")
    if "ring" in methods:
        step = 0.0
        if P > 1:
            prof = _profiles(profile, kv_bytes)[-1]  # bulk K/V blocks: the Simple protocol
            net = Network(topology, prof)
            lat, drain = concurrent_times(net, [(gpus[i], gpus[(i + 1) % P], kv_bytes) for i in range(P)])
            step = float((lat + drain).max()) + prof.base_lat
            if mode == "executor":      # every pass is an isend and an irecv from Python
                step += 2 * executor_cost(p).step_s
        time_ring = local + (P - 1) * max(local, step)
        out["methods"]["ring"] = _method(local, time_ring - local, (P - 1) * kv_bytes, (P - 1) * kv_bytes * P,
                                         2 * kv_bytes + q_bytes + state_bytes, vol["ring"], mem["ring"],
                                         f"{P - 1} K/V passes of {kv_bytes} B, overlapped with compute")
        out["methods"]["ring"]["step_transfer_s"] = step
    if "tree" in out["methods"] and "ring" in out["methods"]:
        out["speedup_tree_vs_ring"] = out["methods"]["ring"]["time_s"] / out["methods"]["tree"]["time_s"]
    return out


def _profiles(profile, nbytes: int, topology=None, gpus=()):
    from treecoll.collectives.sim.simulator import _profiles as sp
    return sp(profile, nbytes, topology, gpus)


def _method(local, comm, sent, total, peak, vol_elems, mem_elems, how) -> dict:
    return {"time_s": local + comm, "local_s": local, "combine_s": comm, "sent_bytes_per_gpu": float(sent),
            "sent_bytes_total": float(total), "peak_mem_bytes": float(peak),
            "paper_volume_elements": float(vol_elems), "paper_mem_elements": float(mem_elems), "how": how}
