"""Reading the text of an input file with one-line errors that say what is wrong with the file.

Every reader in :mod:`topo` (YAML topologies and templates, NCCL topology XML,
``nvidia-smi topo -m`` text) reads through :func:`read_text`, so a path that
does not exist, a directory, a device or FIFO (``/dev/null``, ``/dev/zero``: not
read at all, so nothing hangs or fills memory), an empty file and bytes that are
not UTF-8 each get their own message naming the file. A UTF-8 byte order mark
is dropped. ``error`` lets other packages raise their own
:class:`~topo.errors.TreecollError` subclass with the same messages.

>>> read_text("/nonexistent/x.yaml", "topology file")
Traceback (most recent call last):
...
treecoll.topo.errors.TopologyError: /nonexistent/x.yaml: cannot read topology file: no such file
>>> read_text("/dev/null", "topology file")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
treecoll.topo.errors.TopologyError: /dev/null: cannot read topology file: not a regular file (a character device); ...
>>> decode_text(b"a: 1\\nb: \\xff\\n", "x.yaml", "topology file")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
treecoll.topo.errors.TopologyError: x.yaml:2: cannot read topology file: not UTF-8 text (byte 0xff at offset 8); ...
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import TopologyError, TreecollError

__all__ = ["check_file", "decode_text", "read_text"]

_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def _fail(error: type[TreecollError], where: str, message: str):
    if issubclass(error, TopologyError):
        raise error(message, where=where)
    raise error(f"{where}: {message}")


def check_file(
    path: str | os.PathLike, what: str, *, error: type[TreecollError] = TopologyError, hint: str = ""
) -> Path:
    """``path`` as a :class:`~pathlib.Path` if it names a regular file, else a one-line
    error saying what it names instead; ``hint`` is appended to the "no such file" message.

    >>> check_file("/dev/null", "nccl-tests output")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    treecoll.topo.errors.TopologyError: /dev/null: cannot read nccl-tests output: not a regular file ...
    """
    p = Path(path)
    where = str(p)
    try:
        st = p.stat()
    except FileNotFoundError:
        _fail(error, where, f"cannot read {what}: no such file{hint}")
    except NotADirectoryError:
        _fail(error, where, f"cannot read {what}: no such file ({p.parent} is not a directory){hint}")
    except PermissionError:
        _fail(error, where, f"cannot read {what}: permission denied")
    except (OSError, ValueError) as e:  # ValueError: a NUL character in the path
        _fail(error, where, f"cannot read {what}: {getattr(e, 'strerror', None) or e}")
    if stat.S_ISDIR(st.st_mode):
        _fail(error, where, f"cannot read {what}: it is a directory; expected a file")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
        _fail(error, where, f"cannot read {what}: not a regular file ({kind}); expected a file")
    return p


def read_text(path: str | os.PathLike, what: str, *, error: type[TreecollError] = TopologyError, hint: str = "") -> str:
    """The UTF-8 text of the regular file ``path``; ``what`` names the file in messages
    ("topology file"), ``hint`` is appended to the "no such file" message."""
    p = check_file(path, what, error=error, hint=hint)
    where = str(p)
    try:
        data = p.read_bytes()
    except PermissionError:
        _fail(error, where, f"cannot read {what}: permission denied")
    except OSError as e:
        _fail(error, where, f"cannot read {what}: {e.strerror or e}")
    if not data:
        _fail(error, where, f"cannot read {what}: the file is empty (0 bytes)")
    return decode_text(data, where, what, error=error)


def decode_text(data: bytes, where: str, what: str, *, error: type[TreecollError] = TopologyError) -> str:
    """``data`` decoded as UTF-8 (a byte order mark dropped), or a one-line error with line and offset."""
    data = bytes(data)
    skip = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = e.start + skip
        line = data.count(b"\n", 0, at) + 1
        _fail(
            error,
            f"{where}:{line}",
            f"cannot read {what}: not UTF-8 text (byte 0x{data[at]:02x} at offset {at}); save the file as UTF-8",
        )
