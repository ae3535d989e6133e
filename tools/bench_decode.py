"""Benchmark of the decode kernels: KV bytes read per second against the machine's memory rates.

Shapes are Llama-3.1-8B's (32 query heads, 8 KV heads, head_dim 128).  For every
(dtype, batch, tokens) it times ``attention.decode_partial`` on a KV cache of
capacity ``max tokens`` filled up to ``tokens`` per sequence, and divides the KV
bytes it must read (``2 * batch * tokens * kv_heads * head_dim * itemsize``) by
the time.  Decode attention reads each K/V byte once, so its limit is the rate at
which the machine *reads* memory; two rates are measured in the same run, with the
same thread count:

* the read rate: a vectorised sum of a 1 GiB float32 buffer, the faster of torch's
  ``sum`` and the native library's ``read_sum`` (AVX-512 loads, the kernel's own
  threads); the fraction of it is ``%read``;
* the copy rate: ``copy_`` of the same buffer, bytes copied per second (the
  memory traffic of a copy is at least twice that); the fraction is ``%copy``.

Each row is measured in ``--repeats`` rounds; one round times, back to back, the
copy, both sums and every backend, so all of them see the same machine load; each
number is the best of its rounds.  Every timed decode is preceded (untimed) by
writing a 1 GiB scratch buffer, so the KV cache is read from memory, not from a
cache.  The machine is shared, so each row records the 1-minute load average and
``busy``: the process CPU time of the best decode run divided by (wall time x
threads); below 1, other jobs held the cores.

On CPU the backends of ``--backends`` run side by side (default: ``native``, the
fused C kernel, and ``torch``, block-wise float32 matmuls; ``vs torch`` is the
speed-up over the latter), and as an anchor (unless ``--no-anchor``) torch's own
fused CPU flash-attention kernel (``aten._scaled_dot_product_flash_attention_for_cpu``,
query heads of a group as rows, full length) on the same cache.  On CUDA the
Triton kernels run and the rates are the device's.

    python -m treecoll.tools.bench_decode          # full sweep, writes out/bench_decode.json
    python -m treecoll.tools.bench_decode --tokens 131072 --batch 1,8 --dtypes bf16,fp32 --threads 2

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


def _timed(fn, device, flush=None) -> tuple[float, float]:
    """Wall and process CPU seconds of one ``fn()``; ``flush()`` runs untimed before."""
    if flush is not None:
        flush()
    _sync(device)
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0, time.process_time() - c0


def _rate_fns(device: torch.device, nbytes: int = GIB) -> dict:
    """The memory-rate measurements: name -> (function, bytes it moves per call)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)
    fns = {"copy": lambda: dst.copy_(src), "read_torch": lambda: src.sum()}
    if device.type == "cpu":
        from treecoll.attention.decode_native import native_status, read_sum

        if native_status()["available"]:
            fns["read_native"] = lambda: read_sum(src)
    return fns


def _sdpa_anchor(q, k, v, tokens: int):
    """torch's fused CPU flash attention on the same cache (full length, GQA group as rows)."""
    batch = q.shape[0]
    qg = q.view(batch, KV_HEADS, Q_HEADS // KV_HEADS, HEAD_DIM)
    kt, vt = k[:, :tokens].transpose(1, 2), v[:, :tokens].transpose(1, 2)  # views [B, Hkv, N, D]
    return lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qg, kt, vt, 0.0, False)


def _measure_row(q, k, v, n: int, backends: list, device, args, rates: dict, flush) -> dict:
    """Best wall time (and its CPU time) of every decode backend, the anchor and the rates,
    measured in ``args.repeats`` interleaved rounds."""
    kv_len = torch.full((q.shape[0],), n, dtype=torch.int32, device=device)
    fns = {b: (lambda b=b: attention.decode_partial(q, k, v, kv_len=kv_len, backend=b)) for b in backends}
    if device.type == "cpu" and not args.no_anchor:
        fns["sdpa"] = _sdpa_anchor(q, k, v, n)
    for fn in list(fns.values()) + list(rates.values()):
        fn()  # warm-up (library build, thread pools, first-touch of buffers)
    best: dict = {}
    for _ in range(args.repeats):
        for name, fn in rates.items():
            best[name] = min(best.get(name, (float("inf"), 0.0)), _timed(fn, device))
        for name, fn in fns.items():
            best[name] = min(best.get(name, (float("inf"), 0.0)), _timed(fn, device, flush))
    return best


def run(args) -> dict:
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    backends = ["triton"] if device.type == "cuda" else args.backends
    # Written before every timed decode so that no KV bytes are served from a cache
    # (larger than any last-level cache we know of).
    scratch = torch.empty(args.flush_mib << 20, dtype=torch.uint8, device=device)
    flush = scratch.zero_
    rates = _rate_fns(device)
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
                best = _measure_row(q, k, v, n, backends, device, args, rates, flush)
                kv_bytes = n * per_token
                copy_gbps = GIB / best["copy"][0] / 1e9
                read_gbps = max(GIB / best[r][0] / 1e9 for r in ("read_torch", "read_native") if r in best)
                common = {"dtype": dname, "batch": batch, "tokens": n, "kv_bytes": kv_bytes, "threads": threads,
                          "copy_gbps": copy_gbps, "read_gbps": read_gbps,
                          "read_torch_gbps": GIB / best["read_torch"][0] / 1e9,
                          "loadavg_1min": os.getloadavg()[0]}
                if "read_native" in best:
                    common["read_native_gbps"] = GIB / best["read_native"][0] / 1e9
                if "sdpa" in best:
                    common["sdpa_cpu_gbps"] = kv_bytes / best["sdpa"][0] / 1e9
                for backend in backends:
                    t, cpu = best[backend]
                    row = {**common, "backend": backend, "time_s": t, "kv_gbps": kv_bytes / t / 1e9,
                           "busy": cpu / (t * threads) if device.type == "cpu" else None}
                    row["frac_copy"] = row["kv_gbps"] / copy_gbps
                    row["frac_read"] = row["kv_gbps"] / read_gbps
                    if "torch" in best and backend != "torch":
                        row["vs_torch"] = best["torch"][0] / t
                    rows.append(row)
                    print(_format_row(row), flush=True)
            k = v = q = None  # free this size's cache before the next one
    return {
        "benchmark": "decode_partial, Llama-3.1-8B shapes (q_heads 32, kv_heads 8, head_dim 128)",
        "command": "python -m treecoll.tools.bench_decode " + " ".join(sys.argv[1:]),
        "device": str(device),
        "machine": {"cpu": _cpu_model(), "threads": threads, "torch": torch.__version__,
                    "python": platform.python_version(), "native": _native_isa(device)},
        "units": "bytes, seconds; GB/s = 1e9 B/s; copy_gbps = bytes copied per second; read_gbps = bytes summed "
                 "per second",
        "rows": rows,
    }


def _native_isa(device) -> str | None:
    if device.type != "cpu":
        return None
    from treecoll.attention.decode_native import native_status

    return native_status()["isa"]


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
          f"{'read GB/s':>9} {'%read':>6} {'copy GB/s':>9} {'%copy':>6} {'vs torch':>8} {'sdpa GB/s':>9} "
          f"{'busy':>5} {'load':>5}")


def _format_row(r: dict) -> str:
    if "skipped" in r:
        return f"{'':7} {r['dtype']:5} {r['batch']:>2} {r['tokens']:>7} skipped: {r['skipped']}"
    anchor = f"{r['sdpa_cpu_gbps']:9.2f}" if "sdpa_cpu_gbps" in r else f"{'-':>9}"
    vs = f"{r['vs_torch']:7.2f}x" if "vs_torch" in r else f"{'-':>8}"
    busy = f"{r['busy']:5.2f}" if r.get("busy") is not None else f"{'-':>5}"
    return (f"{r['backend']:7} {r['dtype']:5} {r['batch']:>2} {r['tokens']:>7} {r['kv_bytes'] / 2**20:7.0f} "
            f"{r['time_s'] * 1e3:8.2f} {r['kv_gbps']:8.2f} {r['read_gbps']:9.2f} {100 * r['frac_read']:5.0f}% "
            f"{r['copy_gbps']:9.2f} {100 * r['frac_copy']:5.0f}% {vs} {anchor} {busy} {r['loadavg_1min']:5.1f}")


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
                   help="torch threads, also the native kernel's (default: torch's choice)")
    p.add_argument("--repeats", type=units.int_arg("--repeats"), default=3,
                   help="interleaved rounds per row, the best of them (default 3)")
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
