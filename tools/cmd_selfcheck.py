"""``treecoll selfcheck``: run every path on this machine and say which work.

One table, one row per path: ``path``, ``backend``, ``device``, ``result``
(``passed``, ``failed`` or ``skipped``, with why), ``time`` (seconds of that
check), and what was compared. ``--json`` prints the same rows as plain data.
The exit code is 0 only when nothing failed (skipped paths do not fail: a CPU
machine skips the CUDA paths).

On every machine (CI runs it; about a minute on two cores):

* ``kernel``: :func:`treecoll.attention.decode_partial` with each CPU backend
  (``native``, the fused C kernel; ``torch``; ``triton`` under the Triton
  interpreter, ``TRITON_INTERPRET=1``) against the float64
  :func:`treecoll.attention.reference`, on cut-down copies of the GPU self-check
  shapes (:func:`treecoll.attention.decode_gpu.selfcheck_cases`: head_dim 64 / 128 /
  256, GQA groups 4 and 8, bf16 / fp16 / fp32, contiguous and paged): three
  sequences of lengths 0, about half and all of ``2 · BLOCK_N + 19`` tokens;
* ``executor``: :func:`treecoll.collectives.allreduce`, ``reduce`` and
  ``broadcast`` over gloo on 4 processes, every tree builder
  (:data:`treecoll.collectives.builders.BUILDERS`) with every built-in operator
  (``sum``, ``prod``, ``max``, ``min``) and the attention merge
  (:class:`treecoll.attention.MergeOp`), and every allreduce algorithm, against the
  float64 result computed from every rank's input;
* ``tree_decode``: :func:`treecoll.attention.tree_decode` with every combine
  (``tree``, ``gather``, ``allreduce3``, ``auto``) and
  :func:`treecoll.attention.ring_decode` over groups of 2, 3 and 4 processes against
  the float64 reference over the whole cache;
* ``simulator``: the simulator's C event loop
  (:mod:`treecoll.collectives.sim.engine_native`) against its Python loop, the
  reference, on an executor prediction and an NCCL-tree flow run on two DGX H100:
  the same times, per-rank finish times and bytes per link, to the last bit;
  skipped, with why, where the C library cannot be built;
* ``generate``: the hook :data:`GENERATE_HOOK` (a module's ``selfcheck(nproc)``
  returning rows; :func:`treecoll.tools.cmd_generate.selfcheck`): ``treecoll generate``
  over 2 processes against one process, greedy and sampled, where that command is
  installed; skipped otherwise.

On a machine with CUDA devices, besides:

* ``kernel`` ``triton`` on ``cuda``: every self-check case, checked on its
  cut-down copy against the float64 reference;
* ``kernel bandwidth``: each full-size case timed with CUDA events (a preallocated
  output, no host synchronisation inside the timed loop), K/V bytes read per
  second against the device's copy rate (a device-to-device copy of 1 GiB timed
  the same way, bytes read plus written per second);
* ``executor`` over NCCL on every GPU (up to ``--nproc``): each builder's
  allreduce against ``torch.distributed.all_reduce`` of the same tensor;
* ``tree_decode`` over NCCL against :func:`decode_partial` of the whole cache on
  one GPU;
* ``combine bandwidth``: each combine of a packed state (batch 1 and 64) timed
  with CUDA events against one NCCL ``all_reduce`` of the same bytes.

Processes start through :mod:`treecoll.collectives.launch` (a gloo pool of up to 4
processes, one process for the kernels so that the Triton interpreter can be
chosen before Triton is imported, an NCCL pool on CUDA machines).

>>> row("kernel", "torch", "cpu", "passed", 0.25, "max rel err 3e-07 <= 1e-05")["result"]
'passed'
>>> exit_code([row("a", "b", "cpu", "passed", 0.0), row("c", "d", "cuda", "skipped", 0.0, "no CUDA")])
0
>>> exit_code([row("a", "b", "cpu", "failed", 0.0, "max rel err 1 > 1e-05")])
1
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import time
from collections.abc import Callable
from typing import Any

from treecoll.tools import units
from treecoll.tools.cli import common_options, emit
from treecoll.tools.units import UsageError

__all__ = ["add_parser", "run", "selfcheck", "row", "exit_code", "CHECKS", "GENERATE_HOOK", "RESULTS"]

RESULTS = ("passed", "failed", "skipped")
#: ``module:function`` of the generate check: ``function(nproc) -> list of rows`` (see :func:`row`)
GENERATE_HOOK = "treecoll.tools.cmd_generate:selfcheck"
#: relative error of a decode kernel against the float64 reference: float32 inputs are rounded
#: only in float32 arithmetic (scores of <= 256 products, <= 3 blocks of softmax, a few merges);
#: fp16/bf16 K/V convert exactly, but the GPU kernels multiply on tensor cores with the query
#: rounded to 16 bits (2**-8 relative for bf16), as tests/attention/test_decode_triton.py states
KERNEL_TOL = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2}
#: the executor's float64 results against the float64 reference (a different summation order)
EXECUTOR_TOL = 1e-9
#: tree_decode against the float64 reference (float32 merges of float32 states)
DECODE_TOL = 1e-5
GLOO_PROCS = 4


def row(path: str, backend: str, device: str, result: str, seconds: float, detail: str = "") -> dict:
    """One line of the table (plain data): ``result`` one of :data:`RESULTS`."""
    if result not in RESULTS:
        raise ValueError(f"selfcheck row: result expected one of {RESULTS}, got {result!r}")
    return {
        "path": path,
        "backend": backend,
        "device": device,
        "result": result,
        "seconds": float(seconds),
        "detail": detail,
    }


def exit_code(rows: list[dict]) -> int:
    """0 when no row failed, else 1."""
    return 1 if any(r["result"] == "failed" for r in rows) else 0


def _rel_err(x, ref) -> float:
    """max |x - ref| / max |ref| (float64; NaN where either has NaN)."""
    x, ref = x.double().cpu(), ref.double().cpu()
    if x.shape != ref.shape:
        return math.inf
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    err = float((x - ref).abs().max()) if ref.numel() else 0.0
    return err / scale if scale > 0 else err


def _verdict(err: float, tol: float) -> tuple[str, str]:
    ok = err <= tol  # NaN fails
    return ("passed" if ok else "failed"), f"max rel err {err:.1e} {'<=' if ok else '>'} {tol:.0e}"


# ------------------------------------------------------------------ kernels


def kernel_case(case: dict, device: str = "cpu", seed: int = 0) -> dict:
    """Inputs of the cut-down copy of one :func:`selfcheck_cases` case (plain dict of tensors):
    three sequences of lengths 0, about half and all of ``2 * block_n(head_dim) + 19`` tokens,
    the case's heads, head_dim and dtype; with a page size, the cache paged through a shuffled
    block table. ``ref``: the float64 reference ``(out, lse)``."""
    import torch
    from treecoll.attention import reference
    from treecoll.attention.decode_gpu import block_n

    dtype = getattr(torch, case["dtype"])
    seq = 2 * block_n(case["head_dim"]) + 19
    lengths = [0, seq // 2 + 1, seq]
    g = torch.Generator().manual_seed(seed)
    hq, hkv, d = case["q_heads"], case["kv_heads"], case["head_dim"]
    q = torch.randn(3, hq, d, generator=g).to(dtype)
    k = torch.randn(3, seq, hkv, d, generator=g).to(dtype)
    v = torch.randn(3, seq, hkv, d, generator=g).to(dtype)
    ref = reference(q, k, v, kv_len=lengths)
    out = {"q": q, "k": k, "v": v, "kv_len": torch.tensor(lengths), "block_table": None, "ref": ref}
    page = case["page_size"]
    if page:
        per = -(-seq // page)
        table = torch.randperm(3 * per, generator=g).view(3, per)
        pad = per * page - seq
        kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(3 * per, page, hkv, d)
        vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(3 * per, page, hkv, d)
        order = table.reshape(-1)  # logical page i of the flat cache lives at slot order[i]
        k_pages, v_pages = torch.empty_like(kp), torch.empty_like(vp)
        k_pages[order], v_pages[order] = kp, vp
        out.update(k=k_pages, v=v_pages, block_table=table.to(torch.int32))
    if device != "cpu":
        for name in ("q", "k", "v", "kv_len", "block_table"):
            if out[name] is not None:
                out[name] = out[name].to(device, non_blocking=False)
    return out


def _check_kernel_cases(backend: str, device: str, cases: list[dict]) -> dict:
    """One row: every case through ``backend`` on ``device`` against the float64 reference."""
    from treecoll.attention import decode_partial

    t0 = time.perf_counter()
    worst, detail = ("passed", ""), []
    for i, case in enumerate(cases):
        x = kernel_case(case, device, seed=i)
        out, lse = decode_partial(
            x["q"], x["k"], x["v"], kv_len=x["kv_len"], block_table=x["block_table"], backend=backend
        )
        err = max(_rel_err(out, x["ref"][0]), _lse_err(lse, x["ref"][1]))
        result, text = _verdict(err, KERNEL_TOL[case["dtype"]])
        if result == "failed":
            worst = ("failed", "")
            detail.append(f"{case['name']}: {text}")
    if worst[0] == "passed":
        detail = [
            f"{len(cases)} cases (bf16/fp16/fp32, GQA, lengths 0 / half / all, paged) = float64 reference "
            f"within {', '.join(f'{k} {v:.0e}' for k, v in KERNEL_TOL.items())}"
        ]
    return row("kernel decode_partial", backend, device, worst[0], time.perf_counter() - t0, "; ".join(detail))


def _lse_err(lse, ref) -> float:
    """Largest |lse - ref| where ref is finite; inf where their -inf entries differ."""
    import torch

    lse, ref = lse.double().cpu(), ref.double().cpu()
    if not torch.equal(torch.isneginf(lse), torch.isneginf(ref)):
        return math.inf
    finite = torch.isfinite(ref)
    return float((lse[finite] - ref[finite]).abs().max()) if finite.any() else 0.0


def cpu_kernels(rank: int, world: int, backends: list[str]) -> list[dict]:
    """In its own process (:func:`treecoll.collectives.launch.spawn`): the CPU kernels, the Triton
    interpreter chosen before Triton is first imported."""
    os.environ["TRITON_INTERPRET"] = "1"
    from treecoll.attention.decode_gpu import selfcheck_cases

    cases = selfcheck_cases()
    rows = []
    for backend in backends:
        why = _backend_missing(backend)
        if why:
            rows.append(row("kernel decode_partial", backend, "cpu", "skipped", 0.0, why))
            continue
        try:
            rows.append(_check_kernel_cases(backend, "cpu", cases))
        except Exception as e:  # noqa: BLE001 - a broken path is a failed row, the others still run
            rows.append(row("kernel decode_partial", backend, "cpu", "failed", 0.0, _brief(e)))
    return rows


def _backend_missing(backend: str) -> str:
    """Why ``backend`` cannot run here ('' when it can)."""
    if backend == "native":
        from treecoll.attention.decode_native import native_status

        st = native_status()
        return "" if st["available"] else f"native kernel not available: {st['reason']}"
    if backend == "triton":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "triton is not installed (pip install 'treecoll[triton]')"
    return ""


def _brief(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


# ------------------------------------------------------------------ executor and tree_decode (gloo or NCCL)


def _inputs(op: str, rank: int, rows: int, device: str):
    """A rank's deterministic input for ``op`` (float64; a packed attention state for ``merge``)."""
    import torch

    g = torch.Generator().manual_seed(7919 * rank + 11)
    if op == "merge":
        from treecoll.attention.state import pack_state

        return pack_state(torch.randn(rows, 4, 8, generator=g), torch.randn(rows, 4, generator=g) * 3).to(device)
    if op == "prod":  # near 1: no overflow over the ranks
        return (1 + 0.1 * torch.randn(rows, 5, generator=g, dtype=torch.float64)).to(device)
    return torch.randn(rows, 5, generator=g, dtype=torch.float64).to(device)


def _expected(op: str, values: list):
    """The float64 result of ``op`` over every rank's input."""
    import torch

    if op == "merge":
        from treecoll.attention.state import unpack_state

        states = [unpack_state(v.cpu(), v.numel() // 36, 4, 8) for v in values]
        lse = torch.stack([s[1].double() for s in states])
        w = torch.softmax(lse, 0)
        out = (torch.stack([s[0].double() for s in states]) * w[..., None]).sum(0)
        return torch.cat([out.reshape(-1), torch.logsumexp(lse, 0).reshape(-1)])
    stacked = torch.stack([v.cpu() for v in values])
    return {"sum": stacked.sum(0), "prod": stacked.prod(0), "max": stacked.max(0).values, "min": stacked.min(0).values}[
        op
    ]


def _op_arg(op: str, rows: int):
    if op == "merge":  # as tree_decode passes it: commutative, never split (a chunk is not a state)
        from treecoll.attention.state import MergeOp
        from treecoll.collectives.ops import resolve_op

        return resolve_op(MergeOp(batch=rows, heads=4, head_dim=8), commutative=True, chunkable=False)
    return op


EXECUTOR_OPS = ("sum", "prod", "max", "min", "merge")


def executor_checks(rank: int, world: int, device_kind: str) -> list[dict]:
    """On every rank of a pool: every builder x operator x collective, and every allreduce algorithm.
    Returns this rank's rows (the caller merges the ranks')."""
    import torch
    from treecoll.attention.tree_decode import group_placement
    from treecoll.collectives.builders import BUILDERS
    from treecoll.collectives.execute import CollectiveOptions
    from treecoll.collectives.planner import ALGOS

    from treecoll import collectives

    device = _rank_device(rank, device_kind)
    placement = group_placement()
    backend = "nccl" if device_kind == "cuda" else "gloo"
    rows = []
    plans = [(b, "tree", ("allreduce", "reduce", "broadcast")) for b in BUILDERS] + [
        ("auto", a, ("allreduce",)) for a in ALGOS if a not in ("auto", "tree")
    ]
    for builder, algo, kinds in plans:
        t0 = time.perf_counter()
        bad = []
        for op in EXECUTOR_OPS:
            if op == "merge" and algo != "tree":
                continue  # the packed state is not split: the merge runs over trees only
            values = [_inputs(op, r, 3, device) for r in range(world)]
            want = _expected(op, values)
            for kind in kinds:
                x = values[rank].clone()
                opts = CollectiveOptions(algo=algo if kind == "allreduce" else "tree", timeout=60)
                root = world - 1
                try:
                    if kind == "allreduce":
                        got = collectives.allreduce(
                            x, op=_op_arg(op, 3), tree=builder, placement=placement, options=opts
                        )
                    elif kind == "reduce":
                        got = collectives.reduce(
                            x, op=_op_arg(op, 3), root=root, tree=builder, placement=placement, options=opts
                        )
                    else:
                        got = collectives.broadcast(x, root=root, tree=builder, placement=placement, options=opts)
                except Exception as e:  # noqa: BLE001 - reported as a failed row
                    bad.append(f"{kind} {op}: {_brief(e)}")
                    continue
                if kind == "broadcast":
                    err = _rel_err(got, values[root])
                elif kind == "reduce" and rank != root:
                    err = 0.0 if got is None and torch.equal(x, values[rank]) else math.inf
                else:
                    err = _rel_err(got, want)
                tol = DECODE_TOL if op == "merge" else EXECUTOR_TOL
                if not err <= tol:
                    bad.append(f"{kind} {op}: max rel err {err:.1e} > {tol:.0e}")
        name = builder if algo == "tree" else f"algo={algo}"
        ops = ", ".join(o for o in EXECUTOR_OPS if algo == "tree" or o != "merge")
        detail = "; ".join(bad) or f"{'/'.join(kinds)} x {ops} on {world} ranks = float64 result"
        rows.append(
            row(
                f"executor {name}",
                backend,
                device_kind,
                "failed" if bad else "passed",
                time.perf_counter() - t0,
                detail,
            )
        )
    return rows


def _rank_device(rank: int, device_kind: str) -> str:
    if device_kind != "cuda":
        return "cpu"
    import torch

    index = rank % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return f"cuda:{index}"


DECODE_METHODS = ("tree", "gather", "allreduce3", "auto", "ring")


def tree_decode_checks(rank: int, world: int, device_kind: str, sizes: list[int]) -> list[dict]:
    """On every rank of a pool: tree_decode (every combine) and ring_decode over subgroups of each size
    in ``sizes`` against the float64 reference over the whole cache (on CUDA: also against
    decode_partial of the whole cache on one GPU). Returns this rank's rows."""
    import torch
    import torch.distributed as dist
    from treecoll.attention import reference, ring_decode, tree_decode
    from treecoll.attention.decode import decode_partial

    device = _rank_device(rank, device_kind)
    backend = "nccl" if device_kind == "cuda" else "gloo"
    rows = []
    for size in sizes:
        group = dist.new_group(list(range(size))) if size < world else None  # every rank calls new_group
        if rank >= size:
            continue
        t0 = time.perf_counter()
        bad = []
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(size)
            lengths = [57, 13, 0]
            q = torch.randn(3, 8, 32, generator=g)
            k = torch.randn(3, 57, 2, 32, generator=g).to(dtype)
            v = torch.randn(3, 57, 2, 32, generator=g).to(dtype)
            ref_out, ref_lse = reference(q, k, v, kv_len=lengths)
            one_gpu = (
                decode_partial(q.to(device), k.to(device), v.to(device), kv_len=lengths)
                if device_kind == "cuda"
                else None
            )
            bounds = [57 * r // size for r in range(size + 1)]
            s, e = bounds[rank], bounds[rank + 1]
            local = [max(0, min(n, e) - s) for n in lengths]
            ks, vs = k[:, s:e].contiguous().to(device), v[:, s:e].contiguous().to(device)
            for method in DECODE_METHODS:
                try:
                    if method == "ring":
                        out, lse = ring_decode(q.to(device), ks, vs, kv_len=local, group=group, return_lse=True)
                    else:
                        out, lse = tree_decode(
                            q.to(device), ks, vs, kv_len=local, group=group, combine=method, return_lse=True
                        )
                except Exception as ex:  # noqa: BLE001 - reported as a failed row
                    bad.append(f"{method} {str(dtype)[6:]}: {_brief(ex)}")
                    continue
                tol = DECODE_TOL if device_kind == "cpu" or dtype == torch.float32 else KERNEL_TOL["bfloat16"]
                err = max(_rel_err(out, ref_out), _lse_err(lse, ref_lse))
                if one_gpu is not None:
                    err = max(err, _rel_err(out, one_gpu[0]))
                if not err <= tol:
                    bad.append(f"{method} {str(dtype)[6:]}: max rel err {err:.1e} > {tol:.0e}")
        against = "the float64 reference" + (" and one GPU" if device_kind == "cuda" else "")
        detail = "; ".join(bad) if bad else f"{', '.join(DECODE_METHODS)} (fp32, bf16 K/V) = {against}"
        rows.append(
            row(
                f"tree_decode P={size}",
                backend,
                device_kind,
                "failed" if bad else "passed",
                time.perf_counter() - t0,
                detail,
            )
        )
    return rows


def merge_ranks(per_rank: list[list[dict]]) -> list[dict]:
    """One row per path from every rank's rows: failed if any rank failed (its detail, naming the
    rank), else the slowest rank's time."""
    out: dict[tuple, dict] = {}
    for rank, rows in enumerate(per_rank):
        for r in rows or []:
            key = (r["path"], r["backend"], r["device"])
            have = out.get(key)
            if have is None:
                out[key] = dict(r)
                if r["result"] == "failed":
                    out[key]["detail"] = f"rank {rank}: {r['detail']}"
                continue
            have["seconds"] = max(have["seconds"], r["seconds"])
            if r["result"] == "failed" and have["result"] != "failed":
                have.update(result="failed", detail=f"rank {rank}: {r['detail']}")
    return list(out.values())


def gloo_checks(rank: int, world: int) -> list[dict]:
    """Everything the gloo pool runs, in one call."""
    return executor_checks(rank, world, "cpu") + tree_decode_checks(rank, world, "cpu", list(range(2, world + 1)))


# ------------------------------------------------------------------ CUDA


def cuda_kernels(rank: int, world: int, repeats: int) -> list[dict]:
    """In its own process: every self-check case with the compiled Triton kernels on GPU 0, checked on
    its cut-down copy, then timed at full size with CUDA events against the device's copy rate."""
    os.environ.pop("TRITON_INTERPRET", None)
    import torch
    from treecoll.attention.decode_gpu import selfcheck_cases

    why = _backend_missing("triton")
    if why:
        return [row("kernel decode_partial", "triton", "cuda", "skipped", 0.0, why)]
    torch.cuda.set_device(0)
    props = torch.cuda.get_device_properties(0)
    cases = selfcheck_cases(sms=props.multi_processor_count)
    rows = []
    try:
        rows.append(_check_kernel_cases("triton", "cuda:0", cases))
    except Exception as e:  # noqa: BLE001 - a broken path is a failed row
        rows.append(row("kernel decode_partial", "triton", "cuda", "failed", 0.0, _brief(e)))
    copy = copy_rate(repeats)
    rows.append(
        row(
            "device copy bandwidth",
            "torch",
            "cuda",
            "passed",
            copy["seconds"],
            f"{copy['gbps']:.0f} GB/s (read + write of {copy['bytes'] >> 20} MiB, CUDA events)",
        )
    )
    for case in cases:
        rows.append(_time_kernel(case, repeats, copy["gbps"]))
    return rows


def copy_rate(repeats: int, nbytes: int = 1 << 30) -> dict:
    """Device-to-device copy rate (GB/s of bytes read plus written) of GPU 0's current device,
    timed with CUDA events over ``repeats`` copies with no host synchronisation between them."""
    import torch

    t0 = time.perf_counter()
    free, _ = torch.cuda.mem_get_info()
    nbytes = min(nbytes, free // 4)
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = _event_time(lambda: dst.copy_(src), repeats)
    return {"bytes": nbytes, "gbps": 2 * nbytes / seconds / 1e9, "seconds": time.perf_counter() - t0}


def _event_time(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    """Seconds per call of ``fn`` on the current stream: CUDA events around ``repeats`` calls, one
    synchronisation at the end (none inside the loop)."""
    import torch

    stream = torch.cuda.current_stream()
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(repeats):
        fn()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def _time_kernel(case: dict, repeats: int, copy_gbps: float) -> dict:
    """One full-size case: K/V read rate against the copy rate (skipped when it does not fit)."""
    import torch
    from treecoll.attention.decode_triton import decode_triton
    from treecoll.attention.validate import KV_DTYPES, check_decode_inputs

    name = f"kernel bandwidth {case['name']}"
    dtype = getattr(torch, case["dtype"])
    b, hq, hkv, d, n, page = (case[k] for k in ("batch", "q_heads", "kv_heads", "head_dim", "tokens", "page_size"))
    need = case["bytes"] + b * hq * d * 8
    free, _ = torch.cuda.mem_get_info()
    if need * 1.25 > free:
        return row(name, "triton", "cuda", "skipped", 0.0, f"needs {need >> 20} MiB, {free >> 20} MiB free")
    t0 = time.perf_counter()
    dev = torch.device("cuda", torch.cuda.current_device())
    q = torch.randn(b, hq, d, device=dev, dtype=dtype)
    if page:
        pages = b * n // page
        k = torch.randn(pages, page, hkv, d, device=dev, dtype=dtype)
        table = torch.randperm(pages, device=dev).view(b, n // page).to(torch.int32)
    else:
        k = torch.randn(b, n, hkv, d, device=dev, dtype=dtype)
        table = None
    v = torch.randn_like(k)
    out = (torch.empty(b, hq, d, device=dev), torch.empty(b, hq, device=dev))
    # validated once here: decode_partial's checks read the lengths and the block table on the host, and the
    # timed loop must not wait for the device; decode_triton itself never synchronises
    lengths, scale = check_decode_inputs(
        q,
        k,
        v,
        torch.full((b,), n, dtype=torch.int32, device=dev),
        None,
        "selfcheck",
        dtypes=KV_DTYPES,
        block_table=table,
    )
    seconds = _event_time(lambda: decode_triton(q, k, v, lengths, scale, out=out, block_table=table), repeats)
    gbps = case["bytes"] / seconds / 1e9
    return row(
        name,
        "triton",
        "cuda",
        "passed",
        time.perf_counter() - t0,
        f"{seconds * 1e6:.0f} us, {gbps:.0f} GB/s K/V read = {gbps / copy_gbps:.0%} of the copy rate "
        f"({case['splits']} splits estimated for an H100: {case['estimate_s'] * 1e6:.0f} us)",
    )


def nccl_checks(rank: int, world: int, repeats: int) -> list[dict]:
    """Everything the NCCL pool runs: executor and tree_decode against NCCL / one GPU, and the
    combine timing."""
    return (
        _nccl_executor(rank, world)
        + tree_decode_checks(rank, world, "cuda", [world])
        + combine_times_cuda(rank, world, repeats)
    )


def _nccl_executor(rank: int, world: int) -> list[dict]:
    """Each builder's allreduce (float32 sum, max, min) against torch.distributed.all_reduce, and the
    float64 checks of :func:`executor_checks`."""
    import torch
    import torch.distributed as dist
    from treecoll.attention.tree_decode import group_placement
    from treecoll.collectives.builders import BUILDERS
    from treecoll.collectives.execute import CollectiveOptions

    from treecoll import collectives

    device = _rank_device(rank, "cuda")
    placement = group_placement()
    rows = []
    reduce_ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    for builder in BUILDERS:
        t0 = time.perf_counter()
        bad = []
        for op, native in reduce_ops.items():
            g = torch.Generator().manual_seed(rank + 17)
            x = torch.randn(1 << 16, generator=g).to(device)  # 256 KiB of float32
            want = x.clone()
            dist.all_reduce(want, op=native)
            try:
                got = collectives.allreduce(
                    x.clone(), op=op, tree=builder, placement=placement, options=CollectiveOptions(timeout=60)
                )
            except Exception as e:  # noqa: BLE001 - reported as a failed row
                bad.append(f"{op}: {_brief(e)}")
                continue
            err = _rel_err(got, want)
            if not err <= 1e-5 or got.device != x.device:
                bad.append(f"{op}: max rel err {err:.1e} > 1e-05 against all_reduce (on {got.device})")
        rows.append(
            row(
                f"executor {builder} vs all_reduce",
                "nccl",
                "cuda",
                "failed" if bad else "passed",
                time.perf_counter() - t0,
                "; ".join(bad) or "sum/max/min of 256 KiB = NCCL all_reduce",
            )
        )
    return rows + executor_checks(rank, world, "cuda")


def combine_times_cuda(rank: int, world: int, repeats: int) -> list[dict]:
    """Each combine of a packed state (32 heads x 128; batch 1 and 64) timed with CUDA events, against
    one NCCL all_reduce of the same bytes; the slowest rank's time."""
    import torch
    import torch.distributed as dist
    from treecoll.attention.state import pack_state
    from treecoll.attention.tree_decode import group_placement, tree_combine

    device = _rank_device(rank, "cuda")
    placement = group_placement()
    rows = []
    for batch in (1, 64):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(rank)
        out = torch.randn(batch, 32, 128, generator=g).to(device)
        lse = (torch.randn(batch, 32, generator=g) * 3).to(device)
        packed = pack_state(out, lse)  # all-reduced in place: the sums grow, the timing does not care
        times = {"all_reduce": _event_time(lambda buf=packed: dist.all_reduce(buf), repeats)}
        for method in ("tree", "gather", "allreduce3"):
            times[method] = _event_time(
                lambda m=method, o=out, s=lse: tree_combine(o, s, placement=placement, combine=m), repeats
            )
        slowest = torch.tensor(list(times.values()), dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times = dict(zip(times, slowest.tolist()))
        detail = ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in times.items())
        rows.append(
            row(
                f"combine time B={batch} ({packed.numel() * 4} B)",
                "nccl",
                "cuda",
                "passed",
                time.perf_counter() - t0,
                f"{detail}; tree / all_reduce {times['tree'] / times['all_reduce']:.2f}",
            )
        )
    return rows


# ------------------------------------------------------------------ the command


def _generate_rows(nproc: int) -> list[dict]:
    """The generate check through :data:`GENERATE_HOOK`, or one skipped row."""
    module, _, fn = GENERATE_HOOK.partition(":")
    try:
        hook = getattr(importlib.import_module(module), fn)
    except (ImportError, AttributeError):
        return [row("generate", "gloo", "cpu", "skipped", 0.0, f"{GENERATE_HOOK} is not installed")]
    return list(hook(nproc))


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _loop_result(run) -> tuple:
    """What the two event loops must agree on to the last bit: time, finish times, bytes per link in order."""
    return run.time, run.finish, list(run.link_bytes.items())


def simulator_loops() -> list[dict]:
    """The simulator's C event loop against its Python loop (the reference): one row."""
    from treecoll.collectives import builders
    from treecoll.collectives.compile import compile_plan
    from treecoll.collectives.placement import Placement
    from treecoll.collectives.sim import engine_native
    from treecoll.collectives.sim.executor import predict_schedule
    from treecoll.collectives.sim.simulator import NCCL_TREE_RUN, simulate

    from treecoll import topo

    path = ("simulator event loop", "native", "cpu")
    status = engine_native.native_status()
    if not status["available"]:
        return [row(*path, "skipped", 0.0, f"the Python loop runs instead: {status['reason']}")]
    t = topo.resolve("dgx-h100-x2")
    tree = compile_plan(builders.build("double_binary", t), "allreduce", 3)
    cases = {
        "executor two_level 4 MiB": lambda: predict_schedule(Placement(t, None), "two_level", 4 << 20),
        "NCCL tree 5 MiB": lambda: simulate(t, tree, 5 << 20, profile="nccl-simple", **NCCL_TREE_RUN),
    }
    t0, seconds, differ = time.perf_counter(), {"native": 0.0, "python": 0.0}, []
    for name, case in cases.items():
        with engine_native.python_loop():
            w = time.perf_counter()
            ref = case()
            seconds["python"] += time.perf_counter() - w
        w = time.perf_counter()
        got = case()
        seconds["native"] += time.perf_counter() - w
        if (ref.stats["loop"], got.stats["loop"]) != ("python", "native") or _loop_result(ref) != _loop_result(got):
            differ.append(name)
    took = time.perf_counter() - t0
    if differ:
        return [row(*path, "failed", took, "the C loop differs from the Python loop on " + ", ".join(differ))]
    return [
        row(
            *path,
            "passed",
            took,
            f"{len(cases)} runs ({', '.join(cases)}) = the Python loop to the last bit "
            f"(times, finish times, bytes per link); {seconds['native'] * 1e3:.1f} ms against "
            f"{seconds['python'] * 1e3:.1f} ms",
        )
    ]


def _kernel_rows(timeout: float) -> list[dict]:
    from treecoll.collectives.launch import spawn

    return spawn(cpu_kernels, 1, ["native", "torch", "triton"], timeout=timeout, where="selfcheck kernels")[0]


def _gloo_rows(nproc: int, timeout: float) -> list[dict]:
    from treecoll.collectives.launch import spawn

    return merge_ranks(spawn(gloo_checks, nproc, timeout=timeout, where="selfcheck gloo"))


def _cuda_rows(nproc: int, timeout: float, repeats: int) -> list[dict]:
    from treecoll.collectives.launch import spawn

    gpus = _cuda_devices()
    if gpus == 0:
        why = "no CUDA device"
        return [
            row(path, backend, "cuda", "skipped", 0.0, why)
            for path, backend in (
                ("kernel decode_partial", "triton"),
                ("kernel bandwidth", "triton"),
                ("executor vs all_reduce", "nccl"),
                ("tree_decode", "nccl"),
                ("combine time", "nccl"),
            )
        ]
    rows = spawn(cuda_kernels, 1, repeats, timeout=timeout, where="selfcheck cuda kernels")[0]
    world = min(gpus, nproc)
    if world < 2:
        return rows + [
            row(path, "nccl", "cuda", "skipped", 0.0, f"needs 2 CUDA devices, found {gpus}")
            for path in ("executor vs all_reduce", "tree_decode", "combine time")
        ]
    return rows + merge_ranks(
        spawn(nccl_checks, world, repeats, timeout=timeout, backend="nccl", where="selfcheck nccl")
    )


def _guard(path: str, backend: str, device: str, fn: Callable[[], list[dict]]) -> list[dict]:
    """``fn()``'s rows; a group of checks that cannot run at all is one failed row."""
    t0 = time.perf_counter()
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported as a failed row, the other groups still run
        return [row(path, backend, device, "failed", time.perf_counter() - t0, _brief(e))]


#: the groups of checks, in order: name -> (path, backend, device) of its failure row, and the call
CHECKS: dict[str, tuple[tuple[str, str, str], Callable[[argparse.Namespace], list[dict]]]] = {
    "kernels": (("kernel decode_partial", "cpu backends", "cpu"), lambda a: _kernel_rows(a.timeout)),
    "simulator": (("simulator event loop", "native", "cpu"), lambda a: simulator_loops()),
    "gloo": (("executor and tree_decode", "gloo", "cpu"), lambda a: _gloo_rows(min(a.nproc, GLOO_PROCS), a.timeout)),
    "generate": (("generate", "gloo", "cpu"), lambda a: _generate_rows(2)),
    "cuda": (("cuda paths", "triton/nccl", "cuda"), lambda a: _cuda_rows(a.nproc, a.timeout, a.repeats)),
}


def selfcheck(args: argparse.Namespace) -> dict:
    """Run the groups of :data:`CHECKS` named in ``args.only`` (a list of names); plain data."""
    import platform

    t0 = time.perf_counter()
    rows = []
    for name in args.only:
        (path, backend, device), fn = CHECKS[name]
        rows += _guard(path, backend, device, lambda fn=fn: fn(args))
    counts = {k: sum(r["result"] == k for r in rows) for k in RESULTS}
    return {
        "rows": rows,
        "counts": counts,
        "ok": exit_code(rows) == 0,
        "seconds": time.perf_counter() - t0,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": _version("torch"),
            "triton": _version("triton"),
            "cuda_devices": _cuda_devices(),
        },
    }


def _version(name: str) -> str | None:
    try:
        return importlib.import_module(name).__version__
    except ImportError:
        return None


def render(data: dict) -> str:
    from treecoll.topo.fmt import table

    lines = [
        table(
            [[r["path"], r["backend"], r["device"], r["result"], r["seconds"], r["detail"]] for r in data["rows"]],
            ["path", "backend", "device", "result", "time s", "detail"],
            formats=[None, None, None, None, ".1f", None],
        )
    ]
    c = data["counts"]
    lines.append(
        f"\n{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped in {data['seconds']:.0f} s: "
        + ("every available path works" if data["ok"] else "SOME PATHS FAILED")
    )
    return "\n".join(lines)


def _only(text: str) -> list[str]:
    names = units.parse_list(text, what="--only", kind="groups", error=UsageError)
    bad = [s for s in names if s not in CHECKS]
    if bad:
        raise UsageError(f"--only: expected a comma list of {', '.join(CHECKS)}, got {text!r}")
    return names


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "selfcheck",
        help="run every path on this machine (kernels, simulator loop, executor, tree_decode; "
        "CUDA ones where there is a GPU) and report which work",
        description=__doc__.split("\n\n")[0],
    )
    common_options(p)
    p.add_argument(
        "--nproc",
        type=units.int_arg("--nproc", minimum=2),
        default=4,
        help="most processes of the distributed checks (default 4)",
    )
    p.add_argument(
        "--only",
        default=",".join(CHECKS),
        metavar="GROUPS",
        help=f"comma list of the groups to run: {', '.join(CHECKS)} (default all)",
    )
    p.add_argument(
        "--repeats",
        type=units.int_arg("--repeats"),
        default=20,
        help="timed repetitions of the CUDA benchmarks (default 20)",
    )
    p.add_argument(
        "--timeout",
        type=units.seconds_arg("--timeout"),
        default=300.0,
        help="seconds per group of processes (default 300)",
    )
    return p


def run(args: argparse.Namespace) -> int:
    args.only = _only(args.only)
    data = selfcheck(args)
    emit(args, data, render)
    return exit_code(data["rows"])
