"""Python's cyclic garbage collector paused while large plain structures are built.

Building a graph of 100,000 GPUs, or simulating one, makes millions of dicts,
lists and tuples and no reference cycles: reference counting frees whatever is
dropped, while the collector, run every few hundred allocations, walks the
growing heap again and again (a quarter of the time of loading 12,500 DGX
H100 hosts; a tenth of an 8192-GPU simulation). :func:`gc_paused` turns it off
inside a block (or a function, as a decorator) and restores its state after;
what the block leaves behind is examined once, by the next collection.

>>> import gc
>>> with gc_paused():
...     gc.isenabled()
False
>>> gc.isenabled()
True
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off inside the block, restored to its state after (a context
    manager, or a decorator: ``@gc_paused()``). For code that makes no reference cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
