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

Each row is measured in ``--repeats`` rounds (:func:`treecoll.tools.bench.harness.interleaved`);
one round times, back to back, the copy, both sums and every backend, so all of them
see the same machine load; each number is the best of its rounds.  Every timed decode is preceded (untimed) by
reading (summing) a 1 GiB scratch buffer, so the KV cache is read from memory, not from a
cache, and the caches hold only clean lines, as in a model's decode step, whose work before the
attention of a layer is mostly reading (the previous layer's KV cache and weights).  A flush
that *writes* its buffer would leave the last-level cache full of dirty lines that the timed call
pays to write back while it reads (measured side by side on a shared 2-thread Zen 4 VM, native bf16
at 128k tokens: 1.11-1.25x the time of the same call after a read flush, best of 9-11 rounds).
The machine is shared, so each row records the 1-minute load average and ``busy``: the process
CPU time of the best decode run divided by (wall time x threads); below 1, other jobs held the cores.

The work per token and KV head (the unit of the kernel's inner loop: one K and one V
row, ``2 * head_dim * itemsize`` bytes, for the group's 4 query heads): ``thr ns`` is
the time one thread spends on it (time x threads / (batch x tokens x kv_heads)), and
``70% ns`` the time a thread may spend on it for the row to reach 70% of the read
rate (threads x its bytes / (0.7 x read rate)).  A ``thr ns`` above ``70% ns`` misses
the target; a cache-resident run (``--flush-mib 0`` and a few hundred tokens) gives
``thr ns`` for the arithmetic alone.

On CPU the backends of ``--backends`` run side by side (default: ``native``, the
fused C kernel; for bf16 rows on CPUs with AVX512_BF16 also ``native_fast_bf16``,
the same kernel with ``fast_bf16=True``: ``vdpbf16ps`` products, the query and the
softmax weights rounded to bf16; and ``torch``, block-wise float32 matmuls;
``vs torch`` is the speed-up over the latter), and as an anchor (unless ``--no-anchor``) torch's own
fused CPU flash-attention kernel (``aten._scaled_dot_product_flash_attention_for_cpu``,
query heads of a group as rows, full length) on the same cache.  On CUDA the
Triton kernels run and the rates are the device's.

``--backends native,native_stream`` adds a probe beside the kernel: ``native_stream`` reads
the same K/V rows in the kernel's task and tile order, with its software prefetches and
threads, but without the arithmetic (:func:`treecoll.attention.decode_native.read_in_kernel_order`).
Its rate against the read rate says what the access stream allows; the kernel's against
it, whether the arithmetic is what the kernel waits for.

Pages: the KV cache and the two rate buffers are allocated by the product's allocator,
:func:`treecoll.attention.kv_cache.alloc_kv`, with ``--pages`` (default ``auto``: 2 MiB transparent
huge pages where the kernel allows them), so ``%read`` compares reads of the same kind of pages.
``--pages 4k,2m`` measures every row with each in turn (a fresh cache per page size, the same
query; the flush buffer is shared) and prints the time and read-rate ratios of each page size
against the first; the ``huge %`` column is the share of the KV cache / of the rate buffer that
``/proc/self/smaps`` shows in huge pages (``AnonHugePages``), what the kernel actually gave.

    python -m treecoll.tools.bench_decode          # full sweep, writes out/bench_decode.json
    python -m treecoll.tools.bench_decode --tokens 131072 --batch 1,8 --dtypes bf16,fp32 --threads 2
    python -m treecoll.tools.bench_decode --quick  # one small row: checks that the script runs

Not a test: it prints a table and writes JSON (with the run's command, date, commit and machine).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from treecoll.attention.kv_cache import PAGE_CHOICES, alloc_kv, huge_page_bytes
from treecoll.tools import units
from treecoll.tools.bench.harness import Benchmark, interleaved
from treecoll.tools.cli import script_main
from treecoll.topo.fmt import fmt_bytes, table

from treecoll import attention

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B (its config.json on the Hugging Face hub)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GIB = 1 << 30
#: the buffer the memory rates are measured on (bytes)
RATE_BYTES = GIB
#: what ``--quick`` sets, where the command line leaves an option at its default: one small row
QUICK = {
    "tokens": [4096],
    "batch": [1],
    "dtypes": ["fp32"],
    "repeats": 1,
    "flush_mib": 16,
    "max_gib": 0.25,
    "rate_mib": 64,
}
TIMED = tuple[float, float]
#: the native kernel with ``fast_bf16=True`` (a bench-only name: bf16 rows only)
FAST = "native_fast_bf16"
#: the native kernel's reads and prefetches in its order without its arithmetic (a bench-only name, a probe)
STREAM = "native_stream"
#: The fraction of the read rate the CPU kernel is held to (``70% ns``).
READ_TARGET = 0.7


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate_fns(device: torch.device, nbytes: int, pages: str) -> tuple[dict[str, Callable[[], Any]], float | None]:
    """The memory-rate measurements on an ``nbytes`` float32 buffer allocated as the KV cache is
    (:func:`treecoll.attention.kv_cache.alloc_kv` with ``pages``): name -> function, and the fraction
    of the source buffer's bytes in huge pages (None where it cannot be read)."""
    src = alloc_kv((nbytes // 4,), torch.float32, device=device, pages=pages).fill_(1.0)
    dst = alloc_kv((nbytes // 4,), torch.float32, device=device, pages=pages).fill_(0.0)
    fns = {"copy": lambda: dst.copy_(src), "read_torch": lambda: src.sum()}
    if device.type == "cpu":
        from treecoll.attention.decode_native import native_status, read_sum

        if native_status()["available"]:
            fns["read_native"] = lambda: read_sum(src)
    return fns, _huge_frac(device, src)


def _huge_frac(device: torch.device, *tensors: torch.Tensor) -> float | None:
    """The fraction of the tensors' bytes that /proc/self/smaps shows in transparent huge pages."""
    if device.type != "cpu":
        return None
    huge = huge_page_bytes(*tensors)
    return None if huge is None else huge / sum(t.numel() * t.element_size() for t in tensors)


def _flush_fn(device: torch.device, nbytes: int) -> Callable[[], Any]:
    """A cache flush that leaves clean lines: a sum of an ``nbytes`` float32 buffer (written once, now, so
    that its pages exist), run untimed before every timed decode.  ``nbytes`` larger than any last-level
    cache (the default 1 GiB) evicts the KV cache; reading rather than writing leaves no dirty lines for
    the timed call to write back."""
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    if device.type == "cpu":
        from treecoll.attention.decode_native import native_status, read_sum

        if native_status()["available"] and buf.data_ptr() % 64 == 0:
            return lambda: read_sum(buf)
    return buf.sum


def _sdpa_anchor(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tokens: int) -> Callable[[], Any]:
    """torch's fused CPU flash attention on the same cache (full length, GQA group as rows)."""
    batch = q.shape[0]
    qg = q.view(batch, KV_HEADS, Q_HEADS // KV_HEADS, HEAD_DIM)
    kt, vt = k[:, :tokens].transpose(1, 2), v[:, :tokens].transpose(1, 2)  # views [B, Hkv, N, D]
    return lambda: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qg, kt, vt, 0.0, False)


def _decode_cases(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tokens: int, backends: Sequence[str], *, anchor: bool
) -> dict[str, Callable[[], Any]]:
    """One decode call per backend on the first ``tokens`` of every sequence, and the SDPA anchor."""
    kv_len = torch.full((q.shape[0],), tokens, dtype=torch.int32, device=q.device)
    cases = {}
    for b in backends:
        if b == STREAM:
            from treecoll.attention.decode_native import read_in_kernel_order

            cases[b] = lambda: read_in_kernel_order(q, k, v, kv_len)
            continue
        fast = b == FAST
        backend = "native" if fast else b
        cases[b] = lambda backend=backend, fast=fast: attention.decode_partial(
            q, k, v, kv_len=kv_len, backend=backend, fast_bf16=fast
        )
    if anchor:
        cases["sdpa"] = _sdpa_anchor(q, k, v, tokens)
    return cases


def _measure_row(
    cases: dict[str, Callable[[], Any]],
    rates: dict[str, Callable[[], Any]],
    device: torch.device,
    repeats: int,
    flush: Callable[[], Any] | None,
) -> dict[str, TIMED]:
    """Best wall time and the process CPU time of that run, of every rate and decode case, measured in
    ``repeats`` interleaved rounds after one untimed warm-up (library build, thread pools, first touch).
    ``flush()`` runs, untimed, before every decode call; without one (a cache-resident run) the call
    itself runs once untimed before it, so that the rates measured in between do not leave it a
    cold cache."""
    cpu: dict[str, list[float]] = {name: [] for name in (*rates, *cases)}
    started = [0.0]

    def before(name: str) -> None:
        if name in cases:
            (flush or cases[name])()
        _sync(device)
        started[0] = time.process_time()

    def after(name: str) -> None:
        cpu[name].append(time.process_time() - started[0])

    def synced(fn: Callable[[], Any]) -> Callable[[], None]:
        return lambda: (fn(), _sync(device))

    timed = {name: synced(fn) for name, fn in (*rates.items(), *cases.items())}
    wall = interleaved(timed, repeats, warmup=1, before=before, after=after)
    best = {}
    for name, times in wall.items():
        k = min(range(len(times)), key=times.__getitem__)
        best[name] = (times[k], cpu[name][1:][k])  # cpu[name][0] is the warm-up call
    return best


def _row_values(
    best: dict[str, TIMED],
    backends: Sequence[str],
    common: dict[str, Any],
    kv_bytes: int,
    threads: int,
    device: torch.device,
    rate_bytes: int,
) -> list[dict[str, Any]]:
    copy_gbps = rate_bytes / best["copy"][0] / 1e9
    read_gbps = max(rate_bytes / best[r][0] / 1e9 for r in ("read_torch", "read_native") if r in best)
    common = {
        **common,
        "copy_gbps": copy_gbps,
        "read_gbps": read_gbps,
        "read_torch_gbps": rate_bytes / best["read_torch"][0] / 1e9,
        "loadavg_1min": os.getloadavg()[0],
    }
    if "read_native" in best:
        common["read_native_gbps"] = rate_bytes / best["read_native"][0] / 1e9
    if "sdpa" in best:
        common["sdpa_cpu_gbps"] = kv_bytes / best["sdpa"][0] / 1e9
    token_heads = common["batch"] * common["tokens"] * KV_HEADS  # (token, KV head) pairs read
    if device.type == "cpu":
        common["target_thread_ns"] = threads * kv_bytes / token_heads / (READ_TARGET * read_gbps)
    rows = []
    for backend in backends:
        t, cpu = best[backend]
        row = {
            **common,
            "backend": backend,
            "time_s": t,
            "kv_gbps": kv_bytes / t / 1e9,
            "busy": cpu / (t * threads) if device.type == "cpu" else None,
            "thread_ns": t * threads / token_heads * 1e9 if device.type == "cpu" else None,
        }
        row["frac_copy"] = row["kv_gbps"] / copy_gbps
        row["frac_read"] = row["kv_gbps"] / read_gbps
        if "torch" in best and backend != "torch":
            row["vs_torch"] = best["torch"][0] / t
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every (dtype, batch, tokens) row of ``args`` measured; the JSON data (without the harness's ``meta``)."""
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    backends = ["triton"] if device.type == "cuda" else args.backends
    flush = _flush_fn(device, args.flush_mib << 20) if args.flush_mib else None
    rate_bytes = args.rate_mib << 20
    rates = {pages: _rate_fns(device, rate_bytes, pages) for pages in args.pages}
    rows = []
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        itemsize = torch.tensor([], dtype=dtype).element_size()
        for batch in args.batch:
            per_token = 2 * batch * KV_HEADS * HEAD_DIM * itemsize  # K and V bytes per token
            fits = [n for n in args.tokens if n * per_token <= args.max_gib * GIB]
            for n in sorted(set(args.tokens) - set(fits)):
                rows.append(
                    {
                        "dtype": dname,
                        "batch": batch,
                        "tokens": n,
                        "skipped": f"KV {fmt_bytes(n * per_token)} > --max-gib {args.max_gib}",
                    }
                )
                print(f"{dname} B={batch} tokens={n}: skipped, {rows[-1]['skipped']}", file=sys.stderr)
            if not fits:
                continue
            q = torch.randn(batch, Q_HEADS, HEAD_DIM, device=device).to(dtype)
            row_backends = [b for b in backends if b != FAST or dtype == torch.bfloat16]  # the same code otherwise
            for pages in args.pages:  # one page size's cache at a time, its rows right after the other's
                shape = (batch, max(fits), KV_HEADS, HEAD_DIM)
                k = alloc_kv(shape, dtype, device=device, pages=pages).normal_()
                v = alloc_kv(shape, dtype, device=device, pages=pages).normal_()
                rate_fns, rate_huge = rates[pages]
                for n in fits:
                    _wait_for_quiet(args.wait_load, args.wait_max)
                    anchor = device.type == "cpu" and not args.no_anchor
                    cases = _decode_cases(q, k, v, n, row_backends, anchor=anchor)
                    best = _measure_row(cases, rate_fns, device, args.repeats, flush)
                    common = {
                        "dtype": dname,
                        "batch": batch,
                        "tokens": n,
                        "kv_bytes": n * per_token,
                        "threads": threads,
                        "pages": pages,
                        "kv_huge_frac": _huge_frac(device, k, v),
                        "rate_huge_frac": rate_huge,
                    }
                    rows += _row_values(best, row_backends, common, n * per_token, threads, device, rate_bytes)
                    print(f"{dname} B={batch} tokens={n} pages={pages}: done", file=sys.stderr, flush=True)
                k = v = cases = None  # free this cache (the cases hold it too) before the next one
    return {
        "workload": "decode_partial, Llama-3.1-8B shapes (q_heads 32, kv_heads 8, head_dim 128)",
        "device": str(device),
        "threads": threads,
        "native": _native_isa(device),
        "rate_bytes": rate_bytes,
        "flush_bytes": args.flush_mib << 20,  # read (summed) before every timed decode; 0: cache-resident run
        "units": "bytes, seconds; GB/s = 1e9 B/s; copy_gbps = bytes copied per second; read_gbps = bytes "
        "summed per second; thread_ns = thread nanoseconds per (token, KV head), target_thread_ns = the same "
        f"at {READ_TARGET:.0%} of the read rate",
        "rows": rows,
        "page_ratios": page_ratios(rows),
    }


def page_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (dtype, batch, tokens, backend) measured with more than one ``pages``: each page size's
    decode time and read rate over those of the first page size measured (``time_ratio`` < 1 and
    ``read_ratio`` > 1: faster than with the first)."""
    first: dict[tuple, dict[str, Any]] = {}
    out = []
    for r in rows:
        if "skipped" in r:
            continue
        key = (r["dtype"], r["batch"], r["tokens"], r["backend"])
        base = first.setdefault(key, r)
        if base is not r:
            out.append(
                {
                    "dtype": r["dtype"],
                    "batch": r["batch"],
                    "tokens": r["tokens"],
                    "backend": r["backend"],
                    "pages": f"{r['pages']} / {base['pages']}",
                    "time_ratio": r["time_s"] / base["time_s"],
                    "read_ratio": r["read_gbps"] / base["read_gbps"],
                    "frac_read": (r["frac_read"], base["frac_read"]),
                }
            )
    return out


def _native_isa(device: torch.device) -> str | None:
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


HEADER = [
    "backend",
    "dtype",
    "B",
    "tokens",
    "pages",
    "huge %",
    "KV",
    "time ms",
    "KV GB/s",
    "read GB/s",
    "%read",
    "copy GB/s",
    "%copy",
    "vs torch",
    "sdpa GB/s",
    "thr ns",
    "70% ns",
    "busy",
    "load",
]
FORMATS = [
    None,
    None,
    None,
    None,
    None,
    None,
    None,
    ".2f",
    ".2f",
    ".2f",
    ".0f",
    ".2f",
    ".0f",
    ".2f",
    ".2f",
    ".1f",
    ".1f",
    ".2f",
    ".1f",
]


def table_row(r: dict[str, Any]) -> list[Any]:
    """One JSON row as the cells of :data:`HEADER` (a skipped row: its reason in the ``KV`` column)."""
    if "skipped" in r:
        return ["-", r["dtype"], r["batch"], r["tokens"], None, None, f"skipped: {r['skipped']}"] + [None] * (
            len(HEADER) - 7
        )
    return [
        r["backend"],
        r["dtype"],
        r["batch"],
        r["tokens"],
        r["pages"],
        "/".join("-" if f is None else f"{100 * f:.0f}" for f in (r["kv_huge_frac"], r["rate_huge_frac"])),
        fmt_bytes(r["kv_bytes"]),
        r["time_s"] * 1e3,
        r["kv_gbps"],
        r["read_gbps"],
        100 * r["frac_read"],
        r["copy_gbps"],
        100 * r["frac_copy"],
        r.get("vs_torch"),
        r.get("sdpa_cpu_gbps"),
        r.get("thread_ns"),
        r.get("target_thread_ns"),
        r.get("busy"),
        r["loadavg_1min"],
    ]


RATIO_HEADER = ["backend", "dtype", "B", "tokens", "pages", "time ratio", "read ratio", "%read"]
RATIO_FORMATS = [None, None, None, None, None, ".3f", ".3f", None]


def ratio_row(r: dict[str, Any]) -> list[Any]:
    """One entry of :func:`page_ratios` as the cells of :data:`RATIO_HEADER`."""
    new, base = r["frac_read"]
    key = [r[name] for name in ("backend", "dtype", "batch", "tokens", "pages")]
    return [*key, r["time_ratio"], r["read_ratio"], f"{100 * new:.0f} / {100 * base:.0f}"]


def _names(option: str, known: Sequence[str]) -> Callable[[str], list[str]]:
    """argparse ``type=``: a comma list of names from ``known``."""

    def parse(text: str) -> list[str]:
        names = units.parse_list(text, what=option, error=units.UsageError)
        bad = [n for n in names if n not in known]
        if bad:
            raise units.UsageError(f"{option}: expected names in {sorted(known)}, got {bad}")
        return names

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    bench = Benchmark(
        "bench_decode",
        __doc__,
        repeats=3,
        json="out/bench_decode.json",
        quick="one small row (4096 tokens, B = 1, fp32, one round, 64 MiB rate buffer): "
        "checks that the script runs; not numbers to record",
        helps={"--repeats": "interleaved rounds per row, the best of them"},
    )
    p = bench.parser
    p.add_argument(
        "--tokens",
        type=units.counts_arg("--tokens"),
        default=[4096, 8192, 16384, 32768, 65536, 131072, 262144],
        help="context lengths, comma-separated; k = 1e3 (default 4096 .. 262144, doubling)",
    )
    p.add_argument("--batch", type=units.ints_arg("--batch"), default=[1, 8], help="batch sizes (default 1,8)")
    p.add_argument(
        "--dtypes",
        type=_names("--dtypes", list(DTYPES)),
        default=["bf16", "fp32"],
        help=f"comma list of {', '.join(sorted(DTYPES))} (default bf16,fp32)",
    )
    p.add_argument(
        "--backends",
        type=_names("--backends", [*attention.DECODE_BACKENDS, FAST, STREAM]),
        default=None,
        help=f"CPU decode backends, side by side: {', '.join(sorted([*attention.DECODE_BACKENDS, FAST, STREAM]))} "
        f"({FAST}: the native kernel with fast_bf16=True, bf16 rows only; {STREAM}: a probe, the native "
        "kernel's reads and prefetches in its order without the arithmetic (AVX-512 CPUs); default "
        f"native,{FAST},torch, without {FAST} where the CPU has no AVX512_BF16)",
    )
    p.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="torch device (default cuda when available, else cpu)",
    )
    p.add_argument(
        "--threads",
        type=units.int_arg("--threads", minimum=0),
        default=0,
        help="torch threads, also the native kernel's (default: torch's choice)",
    )
    p.add_argument("--max-gib", type=float, default=4.0, help="largest KV cache (K+V) to allocate, GiB")
    p.add_argument(
        "--flush-mib",
        type=units.int_arg("--flush-mib", minimum=0),
        default=1024,
        help="cache-flush buffer, MiB, read (summed) untimed before each decode run: it evicts the KV cache "
        "and leaves clean lines (0: none, each decode call runs once untimed before it instead: a "
        "cache-resident run)",
    )
    p.add_argument(
        "--rate-mib",
        type=units.int_arg("--rate-mib"),
        default=RATE_BYTES >> 20,
        help=f"buffer the copy and read rates are measured on (default {RATE_BYTES >> 20})",
    )
    p.add_argument(
        "--wait-load",
        type=float,
        default=0.0,
        help="before each row, wait until the 1-min load average is below this (0: don't wait)",
    )
    p.add_argument(
        "--wait-max", type=units.seconds_arg("--wait-max"), default=300.0, help="longest wait per row, seconds"
    )
    p.add_argument("--no-anchor", action="store_true", help="skip torch's fused CPU SDPA anchor")
    p.add_argument(
        "--pages",
        type=_names("--pages", list(PAGE_CHOICES)),
        default=["auto"],
        help="page sizes of the KV cache and of the rate buffers (attention.kv_cache.alloc_kv), comma list of "
        f"{', '.join(PAGE_CHOICES)}; each row is measured with each in turn (default auto)",
    )
    args = bench.parse(argv)
    if args.quick:  # the quick values replace the defaults, not what the command line gave
        for dest, value in QUICK.items():
            if getattr(args, dest) == p.get_default(dest):
                setattr(args, dest, value)
    given = args.backends is not None
    if not given:
        args.backends = ["native", FAST, "torch"]
    if {"native", FAST, STREAM} & set(args.backends) and args.device == "cpu":
        from treecoll.attention.decode_native import native_status

        status = native_status()
        if not status["available"]:
            raise units.UsageError(f"--backends native: {status['reason']}")
        if FAST in args.backends and not status["fast_bf16"]:
            if given:
                raise units.UsageError(f"--backends {FAST}: the CPU has no AVX512_BF16 (native tier {status['isa']})")
            args.backends.remove(FAST)
        if STREAM in args.backends and not status["isa"].startswith("avx512"):
            raise units.UsageError(f"--backends {STREAM}: the probe needs AVX-512 (native tier {status['isa']})")
        print(f"native kernel: {status['isa']} ({status['library']})")
    print(f"device {args.device}, torch threads {args.threads or torch.get_num_threads()}")
    result = run(args)
    print(table([table_row(r) for r in result["rows"]], HEADER, formats=FORMATS))
    if result["page_ratios"]:
        print()
        print(table([ratio_row(r) for r in result["page_ratios"]], RATIO_HEADER, formats=RATIO_FORMATS))
    bench.write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
