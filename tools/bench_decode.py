"""Benchmark of the decode kernels: KV bytes read per second against memory bandwidth.

Shapes are Llama-3.1-8B's (32 query heads, 8 KV heads, head_dim 128).  For every
(dtype, batch, tokens) it times ``attention.decode_partial`` on a KV cache of
capacity ``max tokens`` filled up to ``tokens`` per sequence, and divides the KV
bytes it must read (``2 * batch * tokens * kv_heads * head_dim * itemsize``) by
the time.  Memory bandwidth is measured in the same run, right before each row,
with the same thread count: a copy of a 1 GiB float32 tensor (the *copy rate*
is bytes copied per second, the quantity the target refers to; the memory
traffic of that copy is at least twice as much) and a read-only ``sum``.

Each timed run is preceded (untimed) by writing a 1 GiB scratch buffer, so the
KV cache is read from memory, not from a cache.  Times are the best of
``--repeats`` runs.  The machine is shared, so each row records the 1-minute
load average.

On CPU the backends of ``--backends`` run side by side (default: ``native``, the
fused C kernel, and ``torch``, block-wise float32 matmuls), and as an anchor
torch's own fused CPU flash-attention kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, query heads of a group as
rows, full length) on the same cache.  On CUDA the
Triton kernels run and the fraction is of the device copy rate (HBM).

    python -m treecoll.tools.bench_decode                       # full sweep, writes out/bench_decode.json
    python -m treecoll.tools.bench_decode --tokens 4096 --batch 1 --dtypes fp32 --repeats 2

Not a test: it prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
from treecoll.tools import units
from treecoll.tools.cli import script_main

from treecoll import attention

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B (its config.json on the Hugging Face hub)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GIB = 1 << 30


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_time(fn, device, repeats: int, flush=None) -> float:
    """Best wall time of ``repeats`` runs after one warm-up (seconds); ``flush()``
    runs untimed before each run (evicts the caches)."""
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        if flush is not None:
            flush()
            _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def measure_bandwidth(device: torch.device, nbytes: int = GIB, repeats: int = 3) -> dict:
    """Copy rate (bytes copied per second) and read rate of an ``nbytes`` float32 tensor."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)
    t_copy = _best_time(lambda: dst.copy_(src), device, repeats)
    t_read = _best_time(lambda: src.sum(), device, repeats)
    src = dst = None  # free both before the result is built
    return {"copy_gbps": nbytes / t_copy / 1e9, "copy_traffic_gbps": 2 * nbytes / t_copy / 1e9,
            "read_gbps": nbytes / t_read / 1e9}


def _sdpa_anchor(q, k, v, tokens: int):
    """torch's fused CPU flash attention on the same cache (full length, GQA group as rows)."""
    batch = q.shape[0]
    qg = q.view(batch, KV_HEADS, Q_HEADS // KV_HEADS, HEAD_DIM)
    kt, vt = k[:, :tokens].transpose(1, 2), v[:, :tokens].transpose(1, 2)  # views [B, Hkv, N, D]
    return lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qg, kt, vt, 0.0, False)


def run(args) -> dict:
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    backends = ["triton"] if device.type == "cuda" else args.backends
    # Written before every timed run so that no KV bytes are served from a cache
    # (this VM reports a 480 MiB L3); larger than any last-level cache we know of.
    scratch = torch.empty(args.flush_mib << 20, dtype=torch.uint8, device=device)
    flush = scratch.zero_
    rows = []
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        itemsize = torch.tensor([], dtype=dtype).element_size()
        for batch in args.batch:
            per_token = 2 * batch * KV_HEADS * HEAD_DIM * itemsize  # K and V bytes per token
            fits = [n for n in args.tokens if n * per_token <= args.max_gib * GIB]
            for n in sorted(set(args.tokens) - set(fits)):
                rows.append({"dtype": dname, "batch": batch, "tokens": n, "skipped":
                             f"KV {n * per_token / GIB:.2f} GiB > --max-gib {args.max_gib}"})
                print(_format_row(rows[-1]), flush=True)
            if not fits:
                continue
            capacity = max(fits)
            k = torch.empty(batch, capacity, KV_HEADS, HEAD_DIM, dtype=dtype, device=device).normal_()
            v = torch.empty_like(k).normal_()
            q = torch.randn(batch, Q_HEADS, HEAD_DIM, device=device).to(dtype)
            for n in fits:
                _wait_for_quiet(args.wait_load, args.wait_max)
                bw = measure_bandwidth(device, repeats=args.repeats)
                kv_len = torch.full((batch,), n, dtype=torch.int32, device=device)
                kv_bytes = n * per_token
                anchor = {}
                if device.type == "cpu" and not args.no_anchor:
                    t_a = _best_time(_sdpa_anchor(q, k, v, n), device, args.repeats, flush)
                    anchor = {"sdpa_cpu_time_s": t_a, "sdpa_cpu_gbps": kv_bytes / t_a / 1e9}
                for backend in backends:
                    t = _best_time(lambda: attention.decode_partial(q, k, v, kv_len=kv_len, backend=backend),
                                   device, args.repeats, flush)
                    row = {"dtype": dname, "batch": batch, "tokens": n, "kv_bytes": kv_bytes, "backend": backend,
                           "time_s": t, "kv_gbps": kv_bytes / t / 1e9, **bw, **anchor}
                    row["loadavg_1min"] = os.getloadavg()[0]  # the machine is shared: note how busy it was
                    row["frac_copy"] = row["kv_gbps"] / bw["copy_gbps"]
                    row["frac_read"] = row["kv_gbps"] / bw["read_gbps"]
                    rows.append(row)
                    print(_format_row(row), flush=True)
            k = v = q = None  # free this size's cache before the next one
    return {
        "benchmark": "decode_partial, Llama-3.1-8B shapes (q_heads 32, kv_heads 8, head_dim 128)",
        "command": "python -m treecoll.tools.bench_decode " + " ".join(sys.argv[1:]),
        "device": str(device),
        "machine": {"cpu": _cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version()},
        "units": "bytes, seconds; GB/s = 1e9 B/s; copy_gbps = bytes copied per second",
        "rows": rows,
    }


def _wait_for_quiet(max_load: float, max_wait: float) -> None:
    """Sleep until the 1-minute load average is below ``max_load`` (at most
    ``max_wait`` seconds): the machine is shared, and a busy neighbour halves
    both the copy rate and the decode rate, but not in the same proportion."""
    if max_load <= 0:
        return
    deadline = time.monotonic() + max_wait
    while os.getloadavg()[0] >= max_load and time.monotonic() < deadline:
        time.sleep(5)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


HEADER = (f"{'backend':7} {'dtype':5} {'B':>2} {'tokens':>7} {'KV MiB':>7} {'time ms':>8} {'KV GB/s':>8} "
          f"{'copy GB/s':>9} {'%copy':>6} {'read GB/s':>9} {'%read':>6} {'sdpa GB/s':>9} {'load':>5}")


def _format_row(r: dict) -> str:
    if "skipped" in r:
        return f"{'':7} {r['dtype']:5} {r['batch']:>2} {r['tokens']:>7} skipped: {r['skipped']}"
    anchor = f"{r['sdpa_cpu_gbps']:9.2f}" if "sdpa_cpu_gbps" in r else f"{'-':>9}"
    return (f"{r['backend']:7} {r['dtype']:5} {r['batch']:>2} {r['tokens']:>7} {r['kv_bytes'] / 2**20:7.0f} "
            f"{r['time_s'] * 1e3:8.2f} "
            f"{r['kv_gbps']:8.2f} {r['copy_gbps']:9.2f} {100 * r['frac_copy']:5.0f}% {r['read_gbps']:9.2f} "
            f"{100 * r['frac_read']:5.0f}% {anchor} {r['loadavg_1min']:5.1f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=units.counts_arg("--tokens"),
                   default=[4096, 8192, 16384, 32768, 65536, 131072, 262144],
                   help="context lengths, comma-separated; k = 1e3 (default 4096 .. 262144, doubling)")
    p.add_argument("--batch", type=units.ints_arg("--batch"), default=[1, 8], help="batch sizes (default 1,8)")
    p.add_argument("--dtypes", type=lambda s: units.parse_list(s, what="--dtypes", error=units.UsageError),
                   default=["bf16", "fp32"], help=f"comma list of {', '.join(sorted(DTYPES))} (default bf16,fp32)")
    p.add_argument("--backends", type=lambda s: units.parse_list(s, what="--backends", error=units.UsageError),
                   default=["native", "torch"],
                   help=f"CPU decode backends, side by side: {', '.join(sorted(attention.DECODE_BACKENDS))} "
                        f"(default native,torch)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="torch device (default cuda when available, else cpu)")
    p.add_argument("--threads", type=units.int_arg("--threads", minimum=0), default=0,
                   help="torch threads (default: torch's choice)")
    p.add_argument("--repeats", type=units.int_arg("--repeats"), default=3, help="timed runs per row (default 3)")
    p.add_argument("--max-gib", type=float, default=4.0, help="largest KV cache (K+V) to allocate, GiB")
    p.add_argument("--flush-mib", type=units.int_arg("--flush-mib", minimum=0), default=1024,
                   help="cache-flush buffer written before each run")
    p.add_argument("--wait-load", type=float, default=0.0,
                   help="before each row, wait until the 1-min load average is below this (0: don't wait)")
    p.add_argument("--wait-max", type=units.seconds_arg("--wait-max"), default=300.0,
                   help="longest wait per row, seconds")
    p.add_argument("--no-anchor", action="store_true", help="skip torch's fused CPU SDPA anchor")
    p.add_argument("--json", default="out/bench_decode.json", help="where to write the JSON results")
    args = p.parse_args(argv)
    bad = [d for d in args.dtypes if d not in DTYPES]
    if bad:
        print(f"ERROR: --dtypes: expected names in {sorted(DTYPES)}, got {bad}", file=sys.stderr)
        return 1
    bad = [b for b in args.backends if b not in attention.DECODE_BACKENDS]
    if bad:
        print(f"ERROR: --backends: expected names in {sorted(attention.DECODE_BACKENDS)}, got {bad}", file=sys.stderr)
        return 1
    if "native" in args.backends and args.device == "cpu":
        from treecoll.attention.decode_native import native_status

        status = native_status()
        if not status["available"]:
            print(f"ERROR: --backends native: {status['reason']}", file=sys.stderr)
            return 1
        print(f"native kernel: {status['isa']} ({status['library']})")
    print(f"device {args.device}, torch threads {args.threads or torch.get_num_threads()}")
    print(HEADER, flush=True)
    result = run(args)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
