"""C libraries compiled on first use and loaded through ``ctypes``: the decode kernel
(``attention/csrc/decode_cpu.c``) and the simulator's event loop (``collectives/sim/csrc/flow_engine.c``).

Build: the system C compiler (``$CC``, else ``cc``) with the library's flags, once per source /
flags / compiler / machine, into ``$TREECOLL_CACHE_DIR`` (default ``$XDG_CACHE_HOME/treecoll`` or
``~/.cache/treecoll``; a private temporary directory when that is not writable); the file is
written under a temporary name and renamed, so concurrent processes never load a half-written
library. Several flag sets may be given: the first the compiler accepts is used. Without a
compiler, or with ``TREECOLL_NATIVE=0``, :func:`load_library` raises :class:`NativeUnavailable`
saying why, and the callers take their Python (or torch) path.

A source that cannot be built leaves the reason in the caller's state (and the next call raises at once):

>>> state = {}
>>> try:
...     load_library(Path("missing.c"), [["-O2"]], state, lambda lib: None)
... except NativeUnavailable:
...     print("no library:", sorted(state))
no library: ['error']
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
from collections.abc import Callable, Sequence
from pathlib import Path

from treecoll.topo.errors import TreecollError

__all__ = ["NativeUnavailable", "load_library", "cache_dir"]

_LOCK = threading.Lock()


class NativeUnavailable(TreecollError):
    """A native library could not be built or loaded (the message says why)."""


def cache_dir() -> Path:
    """Where compiled libraries are kept (module docstring)."""
    env = os.environ.get("TREECOLL_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "treecoll"


def _compile(cc: str, source: Path, flag_sets: Sequence[Sequence[str]], out_dir: Path) -> Path:
    """The library of ``source`` built with the first of ``flag_sets`` the compiler accepts (cached)."""
    text = source.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    machine = [version.encode(), platform.machine().encode()]
    errors = []
    for flags in flag_sets:
        cmd = [cc, *flags, "-std=c11", "-shared", "-fPIC"]
        key = hashlib.sha256(b"\0".join([text, " ".join(cmd).encode(), *machine])).hexdigest()[:16]
        lib = out_dir / f"{source.stem}-{key}.so"
        if lib.exists():
            return lib
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=lib.name + ".", suffix=".tmp", dir=out_dir)
        os.close(fd)
        try:
            run = subprocess.run(
                [*cmd, str(source), "-o", tmp, "-lm"], capture_output=True, text=True, timeout=120, check=False
            )
            if run.returncode == 0:
                os.replace(tmp, lib)
                return lib
            errors.append(f"{' '.join(cmd)}: {(run.stderr.strip().splitlines() or [f'exit {run.returncode}'])[0]}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise OSError("; ".join(errors))


def _build(source: Path, flag_sets: Sequence[Sequence[str]], declare: Callable[[ctypes.CDLL], None]) -> dict:
    """``{'lib', 'path'}`` of the loaded library, or ``{'error': why}``."""
    if os.environ.get("TREECOLL_NATIVE", "1") == "0":
        return {"error": "disabled by TREECOLL_NATIVE=0"}
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        return {"error": f"no C compiler: {cc!r} is not on PATH (install gcc or set CC)"}
    try:
        try:
            path = _compile(cc, source, flag_sets, cache_dir())
        except (PermissionError, FileNotFoundError) as exc:  # unwritable cache: a private temp dir
            if exc.filename and str(exc.filename).endswith(".c"):
                raise
            path = _compile(cc, source, flag_sets, Path(tempfile.gettempdir()) / f"treecoll-{os.getuid()}")
        lib = ctypes.CDLL(str(path))
        declare(lib)
        return {"lib": lib, "path": path}
    except (OSError, subprocess.SubprocessError, AttributeError) as exc:
        return {"error": f"building {source.name} failed: {exc}"}


def load_library(
    source: Path, flag_sets: Sequence[Sequence[str]], state: dict, declare: Callable[[ctypes.CDLL], None]
) -> ctypes.CDLL:
    """The library built from ``source`` (module docstring), loaded once: ``state`` (the caller's dict)
    keeps ``lib`` and ``path``, or the ``error``; ``declare(lib)`` sets its functions' argument and
    result types. Raises :class:`NativeUnavailable` with the reason when there is no library."""
    with _LOCK:
        if "lib" not in state and "error" not in state:
            state.update(_build(source, flag_sets, declare))
        if "error" in state:
            raise NativeUnavailable(state["error"])
        return state["lib"]
