"""The 'native' CPU decode backend: a fused C kernel, compiled on first use.

``attention/csrc/decode_cpu.c`` computes the state of one sequence over a range of
its tokens with the bf16/fp16 -> float32 conversion done in registers inside the
dot products (AVX-512 when the compiler targets it, portable C otherwise): each
K/V element is read from memory once and nothing is materialised, which the torch
path cannot do for half types (it converts each block into a float32 buffer, then
runs float32 matmuls, so bf16 runs at about the float32 *element* rate).  The
splitting over worker threads and the merge are shared with the torch path
(:func:`treecoll.attention.decode_cpu.run_splits`); ``ctypes`` releases the GIL during the
kernel, so the worker threads run it in parallel.

Build: the system C compiler (``$CC``, else ``cc``) with ``-O3 -march=native``,
once per source / compiler / CPU, into ``$TREECOLL_CACHE_DIR`` (default
``$XDG_CACHE_HOME/treecoll`` or ``~/.cache/treecoll``); the file is written under a
temporary name and renamed, so concurrent processes never load a half-written
library.  Without a compiler, or with ``TREECOLL_NATIVE=0``, :func:`native_status`
says why and ``backend='auto'`` uses the torch path.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch
from treecoll.topo.errors import AttentionError

__all__ = ["decode_native", "native_status", "NATIVE_DTYPES"]

SOURCE = Path(__file__).with_name("csrc") / "decode_cpu.c"
#: KV dtypes the kernel reads, with the code the C source expects.
NATIVE_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_FLAG_SETS = (["-O3", "-march=native"], ["-O3"])  # the second when the compiler rejects -march=native

_LOCK = threading.Lock()
_STATE: dict = {}


def _cache_dir() -> Path:
    env = os.environ.get("TREECOLL_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "treecoll"


def _cpu_flags() -> str:
    """The CPU's feature flags (a library built with -march=native must not be
    reused on another CPU sharing the same home directory)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _compile(cc: str, out_dir: Path) -> Path:
    source = SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    machine = [version.encode(), _cpu_flags().encode(), platform.machine().encode()]
    errors = []
    for flags in _FLAG_SETS:
        cmd = [cc, *flags, "-std=c11", "-shared", "-fPIC"]
        key = hashlib.sha256(b"\0".join([source, " ".join(cmd).encode(), *machine])).hexdigest()[:16]
        lib = out_dir / f"decode_cpu-{key}.so"
        if lib.exists():
            return lib
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=lib.name + ".", suffix=".tmp", dir=out_dir)
        os.close(fd)
        try:
            run = subprocess.run([*cmd, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=120)
            if run.returncode == 0:
                os.replace(tmp, lib)
                return lib
            errors.append(f"{' '.join(cmd)}: {(run.stderr.strip().splitlines() or ['exit %d' % run.returncode])[0]}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise OSError("; ".join(errors))


def _load():
    """The loaded library, or raise AttentionError saying why there is none (cached)."""
    with _LOCK:
        if "lib" in _STATE or "error" in _STATE:
            pass
        elif os.environ.get("TREECOLL_NATIVE", "1") == "0":
            _STATE["error"] = "disabled by TREECOLL_NATIVE=0"
        else:
            cc = os.environ.get("CC") or "cc"
            if shutil.which(cc) is None:
                _STATE["error"] = f"no C compiler: {cc!r} is not on PATH (install gcc or set CC)"
            else:
                try:
                    try:
                        path = _compile(cc, _cache_dir())
                    except (PermissionError, FileNotFoundError) as exc:  # unwritable cache: a private temp dir
                        if exc.filename and str(exc.filename).endswith(".c"):
                            raise
                        path = _compile(cc, Path(tempfile.gettempdir()) / f"treecoll-{os.getuid()}")
                    lib = ctypes.CDLL(str(path))
                    i64, ptr = ctypes.c_int64, ctypes.c_void_p
                    lib.treecoll_decode_range.argtypes = [ptr, ptr, ptr, ctypes.c_int] + [i64] * 7 + [ptr] + \
                        [i64] * 5 + [ptr, ptr, ptr, ctypes.c_int]
                    lib.treecoll_decode_range.restype = ctypes.c_int
                    lib.treecoll_decode_isa.restype = ctypes.c_char_p
                    _STATE["lib"], _STATE["path"] = lib, path
                except (OSError, subprocess.SubprocessError) as exc:
                    _STATE["error"] = f"building {SOURCE.name} failed: {exc}"
        if "error" in _STATE:
            raise AttentionError(f"decode backend 'native': unavailable: {_STATE['error']}; use backend='torch'")
        return _STATE["lib"]


def native_status() -> dict:
    """``{'available': bool, 'isa': 'avx512' | 'portable' | None, 'library': path, 'reason': str}``
    (builds the kernel on first call)."""
    try:
        lib = _load()
    except AttentionError as exc:
        return {"available": False, "isa": None, "library": None, "reason": str(exc)}
    return {"available": True, "isa": lib.treecoll_decode_isa().decode(), "library": str(_STATE["path"]),
            "reason": ""}


def supports(q, k, v) -> bool:
    """Whether the kernel can read these inputs in place (CPU, a known dtype,
    ``head_dim`` of stride 1); otherwise the caller uses the torch path."""
    return (
        q.device.type == "cpu" and k.device.type == "cpu" and k.dtype in NATIVE_DTYPES and v.dtype == k.dtype
        and k.stride(-1) == 1 and v.stride(-1) == 1
    )


def decode_native(q, k, v, lengths, scale: float, *, num_splits: int = 1, out=None, block_table=None,
                  portable: bool = False):
    """Partial decode attention with the fused C kernel (validated CPU inputs; see
    :func:`attention.decode_partial` for shapes and the contract).

    ``q`` [batch, q_heads, head_dim]; ``k``/``v`` [batch, seq, kv_heads, head_dim] with
    any strides but ``head_dim``'s = 1, or paged [num_pages, page_size, kv_heads,
    head_dim] with ``block_table`` int [batch, max_pages]; float32, bfloat16 or
    float16.  ``portable=True`` runs the portable C loops even where AVX-512 was
    compiled in (for tests).  Returns ``(out, lse)``: float32 [batch, q_heads,
    head_dim] and float32 [batch, q_heads], natural log; ``(0, -inf)`` for no keys.
    """
    from treecoll.attention.decode_cpu import run_splits

    lib = _load()
    if not supports(q, k, v):
        raise AttentionError(
            f"decode backend 'native': expected CPU float32/bfloat16/float16 K and V with head_dim stride 1, "
            f"got {k.device} {k.dtype}/{v.dtype} with strides {tuple(k.stride())}/{tuple(v.stride())}; "
            f"use backend='torch'"
        )
    kv_heads, head_dim = k.shape[2], k.shape[3]
    itemsize = k.element_size()
    dt = NATIVE_DTYPES[k.dtype]
    kst, vst = [s * itemsize for s in k.stride()], [s * itemsize for s in v.stride()]
    if block_table is not None:
        tables = block_table.to(torch.int64).contiguous()
        page_size = k.shape[1]

    def attend(qg, b, s0, s1, work):
        group = qg.shape[1]
        acc = torch.empty(kv_heads, group, head_dim, dtype=torch.float32)
        m = torch.empty(kv_heads, group, 1, dtype=torch.float32)
        l = torch.empty(kv_heads, group, 1, dtype=torch.float32)
        qc = qg.contiguous()
        if block_table is None:
            kb, vb, pages, psize, kpage, vpage = k.data_ptr() + b * kst[0], v.data_ptr() + b * vst[0], None, 0, 0, 0
        else:
            kb, vb = k.data_ptr(), v.data_ptr()
            pages, psize, kpage, vpage = tables[b].data_ptr(), page_size, kst[0], vst[0]
        rc = lib.treecoll_decode_range(
            qc.data_ptr(), kb, vb, dt, kv_heads, group, head_dim, kst[1], kst[2], vst[1], vst[2],
            pages, psize, kpage, vpage, s0, s1, acc.data_ptr(), m.data_ptr(), l.data_ptr(), int(portable),
        )
        if rc != 0:
            raise AttentionError(f"decode backend 'native': kernel failed with code {rc} (sequence {b})")
        return acc, m, l

    # Ranges of the same size as the torch path's blocks are worth a thread each.
    return run_splits(q, kv_heads, lengths, scale, attend, num_splits=num_splits, out=out, min_split_tokens=2048)
