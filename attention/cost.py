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
* ``gather`` (vLLM's decode context parallelism: ``cp_lse_ag_out_rs`` gathers the
  LSEs of every rank, https://github.com/vllm-project/vllm ``vllm/attention/ops/common.py``):
  one all-gather of the ``P`` packed states, as NCCL runs it (a ring of ``P − 1``
  steps, :func:`treecoll.collectives.sim.simulate_ring` with ``collective="allgather"``
  over the fastest protocol), then every rank merges the ``P`` states locally,
  reading them once: ``(P + 1) × state bytes / mem_bw``.

:func:`combine_times` models the combines on NCCL (above) or, with
``backend="gloo"``, as treecoll runs them over gloo: the tree as the executor runs
it (:func:`treecoll.collectives.sim.simulate_executor`: one chunk, in-order issue,
one connection per pair of ranks), the gather and the three all-reduces as gloo's
rings in rank order (``P − 1`` steps of one state to the next rank; ring
allreduces of ``2(P − 1)`` steps), on the topology's links as written (profile
``ideal``), each step with the software time of the collective that runs it, so the
three combines pay the backend's software costs alike: the executor's per message,
gloo's all-gather's and its allreduce's per step (two algorithms: the all-gather's
steps are not the allreduce's), all fitted at the group's process count
(:meth:`treecoll.collectives.executor_cost.ExecutorCost.for_nranks`; with fewer cores than
processes a step of gloo's ring waits for every rank to run, a tree message only
for its two ends, so one fit over several counts orders them wrongly), and once
per collective call the time the ranks take to come together, fitted on calls of
the same kind (:attr:`~treecoll.collectives.executor_cost.ExecutorCost.call_s` for the
tree's one call, ``gather_call_s`` for the gather's, ``native_call_s`` for each
of the three all-reduces). The
merges and the rest of a combine's own Python are torch ops and Python calls on
CPU tensors, whose dispatch outweighs the bytes at decode state sizes, and run
right after the rank waited for its peers (so slower than the same ops back to
back): :class:`LocalCost`, fitted at the group's process count
(:func:`local_cost`). The tree pays ``merge_pair_s`` for each merge in its
longest chain of merges in a row (a node merges its children one after the
other, then sends up: ``P − 1`` at the root of a star), the gather
``merge_states_s`` for its one merge of the ``P`` states, the three
all-reduces as much for their local ops (shift, exponentials, the division);
the tree and the gather ``dispatch_s`` once (the placement and tree looked up,
the state packed, the result unpacked).
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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from treecoll.collectives.executor_cost import executor_cost, row_for_nranks
from treecoll.collectives.placement import Placement, as_placement
from treecoll.collectives.sim.engine import Network, concurrent_times
from treecoll.collectives.sim.executor import predict_tree
from treecoll.collectives.sim.result import mem_bw_of
from treecoll.collectives.sim.simulator import (
    DTYPE_SIZES,
    placed,
    simulate,
    simulate_nccl_allreduce,
    simulate_ring,
)
from treecoll.topo import Topology
from treecoll.topo.errors import CollectiveError
from treecoll.topo.ranks import RanksArg

__all__ = [
    "DecodeShape",
    "decode_step",
    "combine_times",
    "choose_combine",
    "merges_in_a_row",
    "mem_capacity",
    "LocalCost",
    "local_cost",
    "GLOO_LOCAL_BY_NRANKS",
    "paper_volumes",
    "paper_memory",
    "PAPER_SEQ_LENS",
    "PAPER_HOSTS",
    "LLAMA31_8B",
    "PAPER_SHAPE",
    "METHODS",
    "DEFAULT_METHODS",
    "COMBINES",
    "BACKENDS",
]

#: every method the model knows
METHODS = ("tree", "gather", "allreduce3", "ring")
#: what :func:`decode_step` reports unless asked for others: every method, so that its ``auto`` is
#: chosen among every combine ``tree_decode(combine="auto")`` chooses among
DEFAULT_METHODS = METHODS
#: the methods that combine per-rank attention states (``ring`` moves the K/V shards instead)
COMBINES = ("tree", "gather", "allreduce3")
#: the process-group backends :func:`combine_times` models
BACKENDS = ("nccl", "gloo")
#: sequence lengths of the paper's Fig. 3 (80k to 5.12M tokens, doubling)
PAPER_SEQ_LENS = tuple(80_000 * 2**i for i in range(7))
#: DGX H100 host counts of the paper's Fig. 3b (1 to 16 nodes of 8 GPUs)
PAPER_HOSTS = (1, 2, 4, 8, 16)
#: ``(P, merge pair, merge states, dispatch)`` seconds (:class:`LocalCost`) on a gloo group of P CPU processes:
#: ``python -m treecoll.tools.fit_executor_cost --procs 2 4 6 --reps 30`` (its ``GLOO_LOCAL_BY_NRANKS``), each
#: op one call at a time after a barrier, interleaved with the fit's other single calls, the slowest rank's,
#: the median of three runs on the idle machine, 2026-11-26 (ranges, in us: 2 processes 276.0 .. 283.4,
#: 143.5 .. 161.9, 170.6 .. 174.8; 4 processes 289.7 .. 301.6, 181.6 .. 200.5, 195.7 .. 223.4; 6 processes
#: 336.4 .. 384.7, 259.3 .. 284.3, 281.0 .. 282.9). A few torch ops each: their dispatch, not the state's
#: bytes, sets the time, and an op right after its rank waited asleep takes 2-3x what the same op takes back
#: to back in a loop (side by side under load: a pair merge 125-148 us against 56-57 us).
GLOO_LOCAL_BY_NRANKS = (
    (2, 282.3e-6, 151.1e-6, 172.8e-6),
    (4, 301.4e-6, 193.3e-6, 220.1e-6),
    (6, 347.3e-6, 270.7e-6, 282.6e-6),
)


@dataclass(frozen=True)
class LocalCost:
    """Seconds of Python a decode combine runs on a gloo rank besides its communication, each as a combine
    runs it: one call right after the rank waited for its peers (timed after a barrier, the slowest rank's,
    the median; back to back in a loop the same ops take 2-3x less).

    ``merge_pair_s``: one :class:`~treecoll.attention.MergeOp` of two packed states (a tree node's merge of
    one child). ``merge_states_s``: one :func:`~treecoll.attention.merge_states` of the group's ``P`` states
    (the gather's merge; the three all-reduces' local ops, a shift, exponentials and a division, as much).
    ``dispatch_s``: the rest of one ``tree_combine`` call on a rank, once per call: the placement and tree
    looked up, the state packed into one buffer, the result unpacked (the gather: its buffer allocated and
    viewed instead).

    >>> (p2, *two), (p4, *four) = GLOO_LOCAL_BY_NRANKS[:2]
    >>> local_cost(3) == LocalCost(*((a + b) / 2 for a, b in zip(two, four))) and (p2, p4) == (2, 4)
    True
    """

    merge_pair_s: float
    merge_states_s: float
    dispatch_s: float


def local_cost(nranks: int) -> LocalCost:
    """The :class:`LocalCost` of a gloo group of ``nranks`` processes from :data:`GLOO_LOCAL_BY_NRANKS` (between
    fitted counts linear in the count, beyond them the nearest:
    :func:`treecoll.collectives.executor_cost.row_for_nranks`)."""
    return LocalCost(*row_for_nranks(list(GLOO_LOCAL_BY_NRANKS), nranks))


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


def decode_step(
    placement: Placement | Topology,
    shape: DecodeShape,
    *,
    ranks: RanksArg = None,
    tree: str = "two_level",
    nchunks: int | None = None,
    profile: Any = "auto",
    methods: tuple[str, ...] = DEFAULT_METHODS,
    mode: str = "executor",
) -> dict:
    """Time, volume and memory of one decode step for each method in ``methods`` (plain dict).

    ``placement``: a :class:`~treecoll.collectives.placement.Placement`, or a Topology with
    ``ranks`` (a count of the first ranks, or GPUs; default all), under the one rank rule.
    ``tree``: the builder used by ``tree``. ``profile``: a simulator profile
    or ``"auto"`` (fastest NCCL protocol per collective). ``mode``: ``executor`` (the
    default) times ``tree`` and ``ring`` as treecoll runs them, from Python, each message
    costing the backend's :class:`~treecoll.collectives.executor_cost.ExecutorCost` (the tree: the
    planner's schedule, :func:`treecoll.collectives.sim.executor.predict_schedule`, the number
    ``treecoll tree build`` prints); ``in-kernel`` as if they ran inside NCCL (NCCL's protocols;
    ``nchunks`` pipeline chunks, default NCCL's pipeline steps:
    :func:`treecoll.collectives.sim.executor.predict_tree`, the number ``treecoll tree build --mode in-kernel``
    prints). ``allreduce3`` is NCCL's own allreduce either way.

    Besides ``methods`` (each ``time_s``, ``local_s``, ``combine_s``, bytes and memory), the result
    holds ``auto``: the fastest combine of ``tree``, ``gather``, ``allreduce3`` among ``methods``
    (:func:`choose_combine`'s rule; in ``executor`` mode the one ``tree_decode(combine="auto")`` runs),
    and with ``ring``
    among the methods ``speedup_auto_vs_ring`` and ``speedup_tree_vs_ring`` (ring's time over auto's,
    over the tree's).
    """
    from treecoll.collectives.executor_cost import MODES

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
    mem_bw = min(mem_bw_of(topology, gpus))
    if mem_bw <= 0:
        raise CollectiveError(
            f"decode model: GPUs of topology {topology.name!r} carry no mem_bw (GB/s); "
            f"add it to the host template's gpus"
        )
    kv_bytes = 2 * b * t * Hkv * D * item
    local = kv_bytes / mem_bw
    state_bytes = 4 * b * H * (D + 1)
    q_bytes = b * H * D * item
    vol, mem = paper_volumes(shape, P), paper_memory(shape, P)
    out = {
        "shape": asdict(shape),
        "nranks": P,
        "hosts": len({topology.host_of(g) for g in gpus}),
        "mode": mode,
        "tokens_per_rank": t,
        "kv_bytes_per_rank": kv_bytes,
        "local_s": local,
        "methods": {},
    }
    # gather and the three all-reduces are the backend's own collectives (NCCL's) in either mode
    combines = combine_times(
        p,
        b,
        H,
        D,
        tree=tree,
        nchunks=nchunks,
        profile=profile,
        methods=tuple(m for m in ("gather", "allreduce3") if m in methods),
    )
    if "tree" in methods:
        c = combine_times(p, b, H, D, tree=tree, nchunks=nchunks, profile=profile, methods=("tree",), mode=mode)["tree"]
        comm, sent, scratch, total_sent = (
            c["time_s"],
            c["sent_bytes_per_gpu"],
            c["scratch_bytes"],
            c["sent_bytes_total"],
        )
        out["methods"]["tree"] = _method(
            local,
            comm,
            sent,
            total_sent,
            kv_bytes + q_bytes + state_bytes + scratch,
            vol["tree"],
            mem["tree"],
            f"{tree} allreduce of {state_bytes} B state",
        )
    if "gather" in methods:
        c = combines["gather"]
        out["methods"]["gather"] = _method(
            local,
            c["time_s"],
            c["sent_bytes_per_gpu"],
            c["sent_bytes_total"],
            kv_bytes + q_bytes + state_bytes + c["scratch_bytes"],
            vol["tree"],
            mem["tree"],
            f"all-gather of {P} x {state_bytes} B states, local merge",
        )
    if "allreduce3" in methods:
        c = combines["allreduce3"]
        bufs = 4 * b * H * (D + 2)  # numerator, denominator, max in fp32
        out["methods"]["allreduce3"] = _method(
            local,
            c["time_s"],
            c["sent_bytes_per_gpu"],
            c["sent_bytes_total"],
            kv_bytes + q_bytes + bufs + c["scratch_bytes"],
            vol["allreduce3"],
            mem["allreduce3"],
            "max(lse), sum(den), sum(num): NCCL's ring, tree or NVLS each",
        )
    if "ring" in methods:
        step = 0.0
        if P > 1:
            prof = _profiles(profile, kv_bytes)[-1]  # bulk K/V blocks: the Simple protocol
            net = Network(topology, prof)
            lat, drain = concurrent_times(net, [(gpus[i], gpus[(i + 1) % P], kv_bytes) for i in range(P)])
            step = float((lat + drain).max()) + prof.base_lat
            if mode == "executor":  # every pass is an isend and an irecv from Python
                step += 2 * executor_cost(p).step_s
        time_ring = local + (P - 1) * max(local, step)
        out["methods"]["ring"] = _method(
            local,
            time_ring - local,
            (P - 1) * kv_bytes,
            (P - 1) * kv_bytes * P,
            (2 if P > 1 else 1) * kv_bytes + q_bytes + state_bytes,  # its own block and the one arriving
            vol["ring"],
            mem["ring"],
            f"{P - 1} K/V passes of {kv_bytes} B, overlapped with compute",
        )
        out["methods"]["ring"]["step_transfer_s"] = step
    _check_fit(out, topology, gpus, per_token=2 * b * Hkv * D * item)
    runs = {m for m, r in out["methods"].items() if r["fits"] is not False}  # fits, or no capacity to say
    if "tree" in runs and "ring" in runs:
        out["speedup_tree_vs_ring"] = out["methods"]["ring"]["time_s"] / out["methods"]["tree"]["time_s"]
    combined = {m: out["methods"][m]["time_s"] for m in COMBINES if m in runs}
    if combined:
        out["auto"] = _fastest(combined)
        if "ring" in runs:
            out["speedup_auto_vs_ring"] = out["methods"]["ring"]["time_s"] / out["methods"][out["auto"]]["time_s"]
    return out


def mem_capacity(topology: Topology, gpus: Sequence[str]) -> tuple[float | None, str | None]:
    """The least memory capacity of ``gpus`` in bytes (their ``mem_gb`` x 1e9) and that GPU's model;
    ``(None, None)`` when one of them carries no ``mem_gb``.

    >>> from treecoll import topo
    >>> t = topo.resolve("dgx-h100-x2")
    >>> mem_capacity(t, t.rank_gpus()[:2])
    (80000000000.0, 'H100-SXM5-80GB')
    """
    nodes = [topology.node(g) for g in gpus]
    if not nodes or any(not n.get("mem_gb") for n in nodes):
        return None, None
    least = min(nodes, key=lambda n: n["mem_gb"])
    return float(least["mem_gb"]) * 1e9, least.get("model")


def _check_fit(out: dict, topology: Topology, gpus: Sequence[str], per_token: int) -> None:
    """Mark each method's ``fits`` (its ``peak_mem_bytes`` within the GPUs' capacity; None: no capacity
    known) and put the capacity (``mem_capacity_bytes``, ``mem_gpu_model``) and ``max_seq_len_fits``
    (the longest context one of the methods fits: its K/V shard grows ``per_token`` bytes a token, twice
    for ring's two blocks on more than one rank, the rest of its peak stays) in ``out``."""
    cap, model = mem_capacity(topology, gpus)
    out["mem_capacity_bytes"], out["mem_gpu_model"] = cap, model
    longest = 0
    for name, m in out["methods"].items():
        m["fits"] = None if cap is None else m["peak_mem_bytes"] <= cap
        if cap is not None:
            blocks = 2 if name == "ring" and out["nranks"] > 1 else 1  # on one rank no block arrives
            rest = m["peak_mem_bytes"] - blocks * out["kv_bytes_per_rank"]
            longest = max(longest, max(0, int((cap - rest) // (blocks * per_token))) * out["nranks"])
    if cap is not None:
        out["max_seq_len_fits"] = longest


def combine_times(
    placement: Placement | Topology,
    batch: int,
    heads: int,
    head_dim: int,
    *,
    ranks: RanksArg = None,
    tree: str = "two_level",
    nchunks: int | None = None,
    profile: Any = "auto",
    methods: tuple[str, ...] = COMBINES,
    backend: str = "nccl",
    mode: str = "executor",
) -> dict[str, dict]:
    """The combine part of a decode step, per method of ``methods`` (some of :data:`COMBINES`), for
    states of ``batch × heads`` rows of ``head_dim`` (packed: ``state_bytes = 4 · batch · heads ·
    (head_dim + 1)``) on ``placement`` (a Placement, or a Topology with ``ranks``).

    Returns ``{method: {"time_s", "sent_bytes_per_gpu", "sent_bytes_total", "scratch_bytes"}}`` (seconds,
    bytes); the terms are the module docstring's, for ``backend`` ``"nccl"`` or ``"gloo"`` (where
    ``profile="auto"`` means ``ideal``). GPUs without ``mem_bw`` merge for free. ``tree`` in
    ``mode`` ``executor`` (the default: what ``tree_decode`` runs, the state's allreduce issued by
    treecoll's executor, :func:`treecoll.collectives.sim.executor.predict_schedule` with the
    backend's per-message cost) or ``in-kernel`` (the same tree inside NCCL's kernels,
    :func:`treecoll.collectives.sim.executor.predict_tree` with ``profile`` and ``nchunks``); ``gather``
    and ``allreduce3`` are the backend's own collectives in either mode.

    >>> from treecoll.topo.discover import cpu_only_host
    >>> topo = Topology(cpu_only_host("h", {0: ""}, 4))
    >>> t = combine_times(topo, 1, 32, 128, profile="ideal")
    >>> sorted(t), t["gather"]["sent_bytes_per_gpu"] == 3 * 4 * 32 * 129
    (['allreduce3', 'gather', 'tree'], True)
    """
    bad = [m for m in methods if m not in COMBINES]
    if bad:
        raise CollectiveError(f"combine methods {bad}: expected some of {list(COMBINES)}")
    if backend not in BACKENDS:
        raise CollectiveError(f"combine model: backend expected one of {list(BACKENDS)}, got {backend!r}")
    rows = batch * heads
    state_bytes = 4 * rows * (head_dim + 1)
    p = as_placement(placement, ranks, what="combine model")
    topology, gpus = placed(p, what="combine model")
    P = len(gpus)
    mem_bw = min(mem_bw_of(topology, gpus))
    zero = {"time_s": 0.0, "sent_bytes_per_gpu": 0.0, "sent_bytes_total": 0.0, "scratch_bytes": 0.0}
    if P == 1:
        return {m: dict(zero) for m in methods}
    if backend == "gloo":
        return _gloo_combine_times(
            p,
            rows,
            head_dim,
            tree=tree,
            profile="ideal" if profile == "auto" else profile,
            methods=methods,
            mem_bw=mem_bw,
            mode=mode,
        )
    out = {}
    if "tree" in methods:
        from treecoll.collectives import builders
        from treecoll.collectives import compile as compile_

        # the packed state is merged whole (attention.tree_decode): one tree, never split over rails
        opts = (
            {"nbytes": state_bytes, "rails": False}
            if tree == "two_level"
            else ({"nbytes": state_bytes} if tree == "auto" else {})
        )
        plan = builders.build(tree, p, **opts)
        if mode == "executor":
            out["tree"] = _executor_tree(p, plan, state_bytes, backend)
        else:  # the one in-kernel prediction of a tree, what `treecoll simulate` and `tree build` print
            best = predict_tree(p, plan, state_bytes, mode="in-kernel", profile=profile, nchunks=nchunks)
            sched = compile_.compile_allreduce(plan, 1)  # the bytes each rank sends: any chunk count
            out["tree"] = {
                "time_s": best.time,
                "sent_bytes_per_gpu": float(max(sched.bytes_sent(r, state_bytes) for r in range(P))),
                "sent_bytes_total": float(sum(sched.bytes_sent(r, state_bytes) for r in range(P))),
                "scratch_bytes": float(max(best.peak_scratch)),
            }
    if "gather" in methods:
        total = P * state_bytes
        best = min(
            (
                simulate_ring(p, total, collective="allgather", profile=pr)
                for pr in _profiles(profile, total, topology, gpus)
            ),
            key=lambda r: r.time,
        )
        merge = (P + 1) * state_bytes / mem_bw if mem_bw > 0 else 0.0
        out["gather"] = {
            "time_s": best.time + merge,
            "sent_bytes_per_gpu": float((P - 1) * state_bytes),
            "sent_bytes_total": float(P * (P - 1) * state_bytes),
            "scratch_bytes": float(total),
        }
    if "allreduce3" in methods:
        comm, sent, peak = 0.0, 0.0, 0.0
        for nbytes in (4 * rows, 4 * rows, 4 * rows * head_dim):  # max, denominators, numerators (fp32)
            r = simulate_nccl_allreduce(p, nbytes, profile=profile)[1]
            comm += r.time
            sent += 2 * (P - 1) / P * nbytes
            peak = max(peak, max(r.peak_scratch))
        out["allreduce3"] = {
            "time_s": comm,
            "sent_bytes_per_gpu": sent,
            "sent_bytes_total": sent * P,
            "scratch_bytes": peak,
        }
    return {m: out[m] for m in methods}


def _executor_tree(p: Placement, plan: Any, state_bytes: int, backend: str) -> dict:
    """The tree combine as ``tree_decode`` runs it: ``collectives.allreduce`` of the packed state by
    treecoll's executor (the planner's schedule, the backend's per-message cost)."""
    from treecoll.collectives.planner import default_planner
    from treecoll.collectives.sim.executor import predict_schedule

    P = p.nranks
    best = predict_schedule(p, plan, state_bytes, backend=backend)
    _, sched = default_planner().schedule_for(
        plan, collective="allreduce", nbytes=state_bytes, placement=p, algo="tree"
    )
    return {
        "time_s": best.time,
        "sent_bytes_per_gpu": float(max(sched.bytes_sent(r, state_bytes) for r in range(P))),
        "sent_bytes_total": float(sum(sched.bytes_sent(r, state_bytes) for r in range(P))),
        "scratch_bytes": float(max(best.peak_scratch)),
    }


def _gloo_combine_times(
    p: Placement,
    rows: int,
    head_dim: int,
    *,
    tree: str,
    profile: Any,
    methods: tuple[str, ...],
    mem_bw: float,
    mode: str = "executor",
) -> dict[str, dict]:
    """:func:`combine_times` on gloo (the module docstring)."""
    from treecoll.collectives import builders
    from treecoll.collectives.compile import compile_ring_allreduce
    from treecoll.collectives.sim.executor import predict_schedule
    from treecoll.collectives.sim.profiles import get_profile
    from treecoll.collectives.sim.simulator import simulate_executor

    topology, gpus = placed(p, what="combine model")
    P, state_bytes = len(gpus), 4 * rows * (head_dim + 1)
    cost = executor_cost(p, "gloo")  # fitted at the group's process count
    local = local_cost(P)
    out = {}
    if "tree" in methods:
        opts = {"rails": False} if tree == "two_level" else {}
        plan = builders.build(tree, p, **opts)
        if mode == "executor":  # the backend's per-message cost on top of the links, the merges in Python
            r = predict_schedule(p, plan, state_bytes, nchunks=1, backend="gloo", step_cost=cost.step_s)
            merges = merges_in_a_row(plan.children, plan.root) * local.merge_pair_s + local.dispatch_s
        else:
            r = simulate_executor(p, plan, state_bytes, algo="tree", nchunks=1, profile=profile)
            merges = 0.0
        sent = [plan.parents[i] >= 0 for i in range(P)]
        up_down = sum(sent) + sum(len(c) for c in plan.children)  # one state per edge each way
        out["tree"] = {
            "time_s": r.time + merges + cost.call_s,
            "sent_bytes_per_gpu": float(max((sent[i] + len(plan.children[i])) * state_bytes for i in range(P))),
            "sent_bytes_total": float(up_down * state_bytes),
            "scratch_bytes": float(max(r.peak_scratch)),
        }
    native_step = cost.native_step_s  # per step of gloo's own allreduce ring
    if "gather" in methods:
        net = Network(topology, get_profile(profile))
        lat, drain = concurrent_times(net, [(gpus[i], gpus[(i + 1) % P], state_bytes) for i in range(P)])
        merge = local.merge_states_s + local.dispatch_s + ((P + 1) * state_bytes / mem_bw if mem_bw > 0 else 0.0)
        out["gather"] = {
            "time_s": (P - 1) * (float((lat + drain).max()) + cost.gather_step_s) + merge + cost.gather_call_s,
            "sent_bytes_per_gpu": float((P - 1) * state_bytes),
            "sent_bytes_total": float(P * (P - 1) * state_bytes),
            "scratch_bytes": float(P * state_bytes),
        }
    if "allreduce3" in methods:
        ring = compile_ring_allreduce(P)
        parts = (4 * rows, 4 * rows, 4 * rows * head_dim)
        runs = [simulate(p, ring, max(nbytes, 4 * P), profile=profile) for nbytes in parts]
        sent = sum(2 * (P - 1) / P * nbytes for nbytes in parts)
        out["allreduce3"] = {
            # each a ring of 2 (P - 1) steps, each step with gloo's own per-step time, and a call; the local ops
            "time_s": sum(r.time + 2 * (P - 1) * native_step + cost.native_call_s for r in runs) + local.merge_states_s,
            "sent_bytes_per_gpu": sent,
            "sent_bytes_total": sent * P,
            "scratch_bytes": max(max(r.peak_scratch) for r in runs),
        }
    return {m: out[m] for m in methods}


def merges_in_a_row(children: tuple[tuple[int, ...], ...], root: int) -> int:
    """The longest chain of merges one after another in a reduction up a tree (``children[v]``: the
    ranks below ``v``): a node merges its children's states one by one, then sends up, so a node's
    chain is its own merges plus its longest child's.

    >>> merges_in_a_row(((1, 2, 3), (), (), ()), 0)       # a star of 4: the root merges 3 in a row
    3
    >>> merges_in_a_row(((1,), (2,), (3,), ()), 0)        # a chain of 4: one merge per level
    3
    >>> merges_in_a_row(((1, 2), (3, 4), (), (), ()), 0)  # root 2 + its child 1's 2
    4
    """
    depth, stack = {}, [(root, False)]
    while stack:  # post-order without recursion (deep chains)
        v, done = stack.pop()
        if done:
            depth[v] = len(children[v]) + max((depth[c] for c in children[v]), default=0)
        else:
            stack.append((v, True))
            stack.extend((c, False) for c in children[v])
    return depth[root]


def choose_combine(
    placement: Placement | Topology,
    batch: int,
    heads: int,
    head_dim: int,
    *,
    tree: str = "two_level",
    profile: Any = "auto",
    methods: tuple[str, ...] = COMBINES,
    backend: str = "nccl",
    mode: str = "executor",
) -> str:
    """The fastest of ``methods`` by :func:`combine_times` (the first of equals, in :data:`COMBINES`
    order); deterministic, so every rank of a group picks the same.

    >>> from treecoll.topo.discover import cpu_only_host
    >>> choose_combine(Topology(cpu_only_host("h", {0: ""}, 4)), 1, 32, 128, profile="ideal") in COMBINES
    True
    """
    times = combine_times(
        placement, batch, heads, head_dim, tree=tree, profile=profile, methods=methods, backend=backend, mode=mode
    )
    return _fastest({m: t["time_s"] for m, t in times.items()})


def _fastest(seconds: dict[str, float]) -> str:
    """The combine of least time, the first of equals in :data:`COMBINES` order (deterministic: every rank
    picks the same)."""
    return min(seconds, key=lambda m: (seconds[m], COMBINES.index(m)))


def _profiles(profile, nbytes: int, topology=None, gpus=()):
    from treecoll.collectives.sim.simulator import _profiles as sp

    return sp(profile, nbytes, topology, gpus)


def _method(local, comm, sent, total, peak, vol_elems, mem_elems, how) -> dict:
    return {
        "time_s": local + comm,
        "local_s": local,
        "combine_s": comm,
        "sent_bytes_per_gpu": float(sent),
        "sent_bytes_total": float(total),
        "peak_mem_bytes": float(peak),
        "paper_volume_elements": float(vol_elems),
        "paper_mem_elements": float(mem_elems),
        "how": how,
    }
