"""A KV cache sharded along the sequence over the ranks of a process group.

Placement: **round-robin blocks**.  Position ``p`` of a sequence lives on rank
``(p // block_size) % P``, at local slot ``(p // (block_size*P)) * block_size
+ p % block_size``.  Every rank stores its positions in increasing order in one
contiguous buffer per layer, ``k``/``v`` ``[batch, capacity, kv_heads, head_dim]``
(the layout of :func:`attention.decode_partial`), so the rank's valid keys of
sequence ``b`` are the first ``kv_len[b]`` slots.

Why round-robin blocks rather than contiguous blocks filled in order:

* the decode step waits for the slowest rank; with round-robin blocks every
  rank holds the same number of tokens of every sequence to within one block,
  at every length, during prefill and all through generation.  Contiguous
  blocks filled in order leave later ranks empty until earlier ones are full
  (or, with an even split of the prompt, pile every generated token on the
  last rank);
* placement is a pure function of the position: prefill and decode use the
  same rule, sequences of different lengths need no per-rank metadata, and any
  rank can compute any other rank's share (:meth:`local_count`);
* new tokens go to the rank that owns the tail position, which moves to the
  next rank every ``block_size`` tokens, spreading the appends.

Decode attention does not depend on the order of the keys (rotary embeddings
are applied to keys before they are cached), so the permutation is invisible
to the result.  A rank that holds no position of a sequence (short sequences,
small ``block_size * P`` multiples) reports ``kv_len = 0`` for it, and the
decoders turn that into the empty state ``(0, -inf)``.

Lengths are kept per layer and per sequence (a decode step appends to layer 0,
attends, appends to layer 1, ...); ``lengths(layer)`` are the global lengths,
``kv_len(layer)`` this rank's counts.

Rank 1 of 2 with blocks of 2 tokens holds positions 2, 3, 6, 7 of the first 10
(``(p // 2) % 2 == 1``), in that order:

>>> import torch
>>> cache = ShardedKVCache(layers=1, batch=1, kv_heads=1, head_dim=2, max_seq_len=10, rank=1, world=2,
...                        block_size=2, dtype=torch.float32)
>>> [cache.owner(p) for p in range(10)], cache.capacity, cache.owned_positions(10).tolist()
([0, 0, 1, 1, 0, 0, 1, 1, 0, 0], 4, [2, 3, 6, 7])
>>> prompt = torch.arange(10.0).reshape(1, 10, 1, 1).expand(1, 10, 1, 2)   # key p holds the value p
>>> cache.prefill(0, prompt, prompt, lengths=[7])                          # keeps positions 2, 3, 6
>>> cache.kv_len(0).tolist(), cache.k[0][0, :3, 0, 0].tolist()
([3], [2.0, 3.0, 6.0])
>>> cache.append(0, torch.full((1, 1, 2), 7.0), torch.full((1, 1, 2), 7.0))  # position 7 is rank 1's
>>> cache.lengths(0).tolist(), cache.kv_len(0).tolist(), cache.k[0][0, 3, 0, 0].item()
([8], [4], 7.0)
"""

from __future__ import annotations

import bisect
import mmap
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import torch
from treecoll.topo.errors import AttentionError

__all__ = [
    "ShardedKVCache",
    "DEFAULT_BLOCK_SIZE",
    "HUGE_PAGE",
    "Lengths",
    "PAGE_CHOICES",
    "alloc_kv",
    "huge_page_bytes",
    "in_huge_pages",
    "thp_mode",
]

#: a length per sequence ``[batch]``: ints or an integer tensor
Lengths = Sequence[int] | torch.Tensor

#: Tokens per round-robin block: a page-sized unit (vLLM's default page is 16,
#: its DCP interleave 1); 256 keeps the per-rank imbalance below 256 tokens
#: while keeping appends on one rank for 256 consecutive steps.
DEFAULT_BLOCK_SIZE = 256

#: Bytes of a transparent huge page (x86-64 and arm64 with 4 KiB base pages: a PMD maps 2 MiB).
HUGE_PAGE = 2 << 20
#: ``pages=`` of :func:`alloc_kv`: ``"2m"`` asks for 2 MiB pages, ``"4k"`` takes torch's ordinary
#: allocation, ``"auto"`` asks for 2 MiB pages from :data:`AUTO_HUGE_MIN` bytes on.
PAGE_CHOICES = ("auto", "4k", "2m")
#: Smallest buffer ``pages="auto"`` puts in huge pages: the last huge page of a buffer is faulted in
#: whole, so a buffer of at least 8 of them wastes under 1/8 of its size.
AUTO_HUGE_MIN = 8 * HUGE_PAGE
_THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
#: [start, end) of every live mapping of alloc_kv marked MADV_HUGEPAGE, sorted (in_huge_pages)
_HUGE_SPANS: list[tuple[int, int]] = []
_HUGE_LOCK = threading.Lock()


def thp_mode() -> str | None:
    """The kernel's transparent huge page mode, the bracketed word of
    ``/sys/kernel/mm/transparent_hugepage/enabled`` (``"always"``, ``"madvise"`` or ``"never"``),
    or None where there is no such file (not Linux, or a kernel without THP)."""
    try:
        text = _THP_ENABLED.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else None


def alloc_kv(
    shape: Sequence[int],
    dtype: torch.dtype,
    *,
    device: torch.device | str | None = None,
    pages: str = "auto",
) -> torch.Tensor:
    """A zero-filled contiguous tensor of ``shape`` and ``dtype`` for a KV cache, on CPU in 2 MiB
    pages where the kernel gives them: the one allocation of every KV cache buffer.

    A decode kernel reads the rows of a cache gigabytes long, a 4 KiB page every 2-4 KiB of rows
    at Llama shapes, so with 4 KiB pages nearly every row costs a TLB miss and a page walk; one
    2 MiB page covers 512 of them.  With ``pages="2m"`` (or ``"auto"`` and at least
    :data:`AUTO_HUGE_MIN` bytes) on a CPU device where :func:`thp_mode` is ``"always"`` or
    ``"madvise"``, the buffer is a private anonymous ``mmap`` whose start is aligned to
    :data:`HUGE_PAGE`, marked ``MADV_HUGEPAGE`` (the pages are zero and faulted in on first
    write, as huge pages where the kernel has them free); the tensor holds the mapping, which is
    unmapped when the last tensor viewing it is freed.  Elsewhere (``"4k"``, another device, THP
    ``never`` or absent, a failed ``mmap``) it is ``torch.zeros``: no error.  Whether huge pages
    were obtained: :func:`huge_page_bytes`.  (torch's ``THP_MEM_ALLOC_ENABLE=1`` does the same
    for every CPU allocation of the process, read once at start: not a per-buffer choice.)

    >>> t = alloc_kv((2, 3), torch.bfloat16, pages="2m")
    >>> t.shape, t.dtype, t.is_contiguous(), bool((t == 0).all())
    (torch.Size([2, 3]), torch.bfloat16, True, True)
    """
    if pages not in PAGE_CHOICES:
        raise AttentionError(f"alloc_kv: pages: expected one of {list(PAGE_CHOICES)}, got {pages!r}")
    shape = tuple(int(n) for n in shape)
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    huge = pages == "2m" or (pages == "auto" and nbytes >= AUTO_HUGE_MIN)
    cpu = device is None or torch.device(device).type == "cpu"
    if not (huge and cpu and nbytes and thp_mode() in ("always", "madvise")):
        return torch.zeros(shape, dtype=dtype, device=device)
    span = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    try:
        mapping = mmap.mmap(-1, span + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return torch.zeros(shape, dtype=dtype, device=device)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # holds a reference to the mapping
    start = -whole.data_ptr() % HUGE_PAGE
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE, start, span)
    except OSError:  # the kernel refuses the hint: ordinary pages of the same zeroed mapping
        pass
    else:
        lo = whole.data_ptr() + start
        with _HUGE_LOCK:
            bisect.insort(_HUGE_SPANS, (lo, lo + span))
        weakref.finalize(mapping, _forget_span, (lo, lo + span))
    return whole[start : start + nbytes].view(dtype).view(shape)


def _forget_span(span: tuple[int, int]) -> None:
    with _HUGE_LOCK:
        _HUGE_SPANS.remove(span)


def in_huge_pages(t: torch.Tensor) -> bool:
    """Whether ``t``'s data starts inside a buffer of :func:`alloc_kv` marked for 2 MiB pages (the
    native decode kernel then walks its pages at that step; whether the kernel gave huge pages:
    :func:`huge_page_bytes`)."""
    p = t.data_ptr()
    with _HUGE_LOCK:
        i = bisect.bisect_right(_HUGE_SPANS, (p, float("inf"))) - 1
        return i >= 0 and _HUGE_SPANS[i][0] <= p < _HUGE_SPANS[i][1]


def huge_page_bytes(*tensors: torch.Tensor) -> int | None:
    """Bytes of transparent huge pages backing the mappings that hold the tensors' storage (the
    ``AnonHugePages`` of every ``/proc/self/smaps`` entry overlapping one of them, each entry
    once; only pages touched so far count), or None where that file cannot be read.  A mapping
    of :func:`alloc_kv` in 2 MiB pages is an entry of its own; torch's ordinary buffers may share
    an entry with their neighbours."""
    spans = [(s.data_ptr(), s.data_ptr() + s.nbytes()) for s in (t.untyped_storage() for t in tensors)]
    total, inside = 0, False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 1)[0]
                if "-" in head and ":" not in head:
                    a, b = (int(x, 16) for x in head.split("-"))
                    inside = any(a < hi and lo < b for lo, hi in spans)
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1]) * 1024
    except OSError:
        return None
    return total


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AttentionError(f"ShardedKVCache: {name}: expected a positive int, got {value!r}")
    return value


class ShardedKVCache:
    """Per layer, this rank's share of every sequence's keys and values.

    Parameters
    ----------
    layers, batch, kv_heads, head_dim : sizes.
    max_seq_len : longest sequence (global positions) the cache must hold.
    rank, world : this rank and the number of ranks sharing the sequences.
    block_size : tokens per round-robin block (see the module docstring).
    dtype, device : storage of k and v (float16 / bfloat16 / float32).
    pages : page size of the buffers on CPU, one of :data:`PAGE_CHOICES` (see :func:`alloc_kv`;
        default ``"auto"``: 2 MiB pages for buffers of 16 MiB or more where the kernel allows them).
    """

    def __init__(
        self,
        *,
        layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        max_seq_len: int,
        rank: int = 0,
        world: int = 1,
        block_size: int = DEFAULT_BLOCK_SIZE,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        pages: str = "auto",
    ):
        self.layers = _positive("layers", layers)
        self.batch = _positive("batch", batch)
        self.kv_heads = _positive("kv_heads", kv_heads)
        self.head_dim = _positive("head_dim", head_dim)
        self.max_seq_len = _positive("max_seq_len", max_seq_len)
        self.world = _positive("world", world)
        self.block_size = _positive("block_size", block_size)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
            raise AttentionError(f"ShardedKVCache: rank: expected an int in [0, {world - 1}], got {rank!r}")
        self.rank = rank
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise AttentionError(f"ShardedKVCache: dtype: expected float16, bfloat16 or float32, got {dtype}")
        self.dtype = dtype
        self.capacity = self.local_count(max_seq_len)
        shape = (batch, self.capacity, kv_heads, head_dim)
        self.k = [alloc_kv(shape, dtype, device=device, pages=pages) for _ in range(layers)]
        self.v = [alloc_kv(shape, dtype, device=device, pages=pages) for _ in range(layers)]
        self._lengths = torch.zeros(layers, batch, dtype=torch.int64)

    # ------------------------------------------------------------ placement (pure)

    def owner(self, pos: int) -> int:
        """Rank that stores global position ``pos``."""
        return (pos // self.block_size) % self.world

    def local_count(self, length: int, rank: int | None = None) -> int:
        """How many of positions ``0..length-1`` rank ``rank`` (default this one) stores."""
        r = self.rank if rank is None else rank
        cycle = self.block_size * self.world
        full, rest = divmod(int(length), cycle)
        return full * self.block_size + min(max(rest - r * self.block_size, 0), self.block_size)

    def owned_positions(self, length: int, rank: int | None = None) -> torch.Tensor:
        """Global positions ``< length`` stored by ``rank`` (default this one), in
        local-slot order: int64 ``[local_count(length, rank)]``."""
        r = self.rank if rank is None else rank
        pos = torch.arange(int(length), dtype=torch.int64)
        return pos[(pos // self.block_size) % self.world == r]

    # ------------------------------------------------------------ state

    def lengths(self, layer: int) -> torch.Tensor:
        """Global length of every sequence in ``layer``: int64 ``[batch]`` (a copy)."""
        self._check_layer(layer)
        return self._lengths[layer].clone()

    def kv_len(self, layer: int) -> torch.Tensor:
        """This rank's valid slots per sequence in ``layer``: int64 ``[batch]``."""
        self._check_layer(layer)
        return torch.tensor([self.local_count(int(n)) for n in self._lengths[layer]], dtype=torch.int64)

    def shard(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(k, v, kv_len)`` of ``layer`` for :func:`treecoll.attention.tree_decode`:
        k/v ``[batch, capacity, kv_heads, head_dim]``, kv_len int64 ``[batch]``."""
        return self.k[layer], self.v[layer], self.kv_len(layer)

    def nbytes(self) -> int:
        """Bytes of this rank's buffers (all layers, k and v)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def reset(self) -> None:
        """Forget every sequence (lengths back to 0; buffers kept)."""
        self._lengths.zero_()

    def set_lengths(self, layer: int, lengths: Lengths) -> None:
        """Declare ``layer``'s global lengths [batch] after writing this rank's slots
        directly (``cache.k[layer][:, :local_count(n)]``, positions in
        :meth:`owned_positions` order) -- how a caller fills a huge context
        without materialising the whole prompt on every rank."""
        self._check_layer(layer)
        self._lengths[layer] = self._check_lengths("set_lengths", lengths)

    def truncate(self, layer: int, lengths: Lengths) -> None:
        """Shorten ``layer``'s sequences to ``lengths`` [batch] (each at most its
        current length): later appends overwrite the dropped positions."""
        self._check_layer(layer)
        lengths = self._check_lengths("truncate", lengths)
        if bool((lengths > self._lengths[layer]).any()):
            raise AttentionError(
                f"ShardedKVCache.truncate: lengths: expected at most the current lengths "
                f"{self._lengths[layer].tolist()}, got {lengths.tolist()}"
            )
        self._lengths[layer] = lengths

    def _check_layer(self, layer: int) -> None:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.layers:
            raise AttentionError(f"ShardedKVCache: layer: expected an int in [0, {self.layers - 1}], got {layer!r}")

    def _check_kv(self, where: str, x, shape: tuple) -> None:
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise AttentionError(f"ShardedKVCache.{where}: expected a tensor of shape {shape}, got {got}")

    def _check_lengths(self, where: str, lengths) -> torch.Tensor:
        lengths = torch.as_tensor(lengths, dtype=torch.int64).reshape(-1)
        if lengths.numel() != self.batch:
            raise AttentionError(
                f"ShardedKVCache.{where}: lengths: expected {self.batch} values, got {lengths.numel()}"
            )
        if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > self.max_seq_len):
            raise AttentionError(
                f"ShardedKVCache.{where}: lengths: expected values in [0, max_seq_len={self.max_seq_len}], "
                f"got {lengths.tolist()}; build the cache with a larger max_seq_len"
            )
        return lengths

    # ------------------------------------------------------------ writing

    def prefill(self, layer: int, k: torch.Tensor, v: torch.Tensor, lengths: Lengths | None = None) -> None:
        """Store this rank's share of full prompts (replaces what ``layer`` held).

        ``k``, ``v``: ``[batch, seq, kv_heads, head_dim]``, the whole prompts (the
        same on every rank); ``lengths``: valid positions per sequence (default
        ``seq``; positions at or after a sequence's length are ignored).
        """
        self._check_layer(layer)
        if not isinstance(k, torch.Tensor) or k.dim() != 4:
            raise AttentionError(
                "ShardedKVCache.prefill: k: expected [batch, seq, kv_heads, head_dim], got "
                f"{tuple(k.shape) if isinstance(k, torch.Tensor) else type(k).__name__}"
            )
        seq = k.shape[1]
        shape = (self.batch, seq, self.kv_heads, self.head_dim)
        self._check_kv("prefill", k, shape)
        self._check_kv("prefill", v, shape)
        lengths = self._check_lengths("prefill", [seq] * self.batch if lengths is None else lengths)
        if int(lengths.max()) > seq:
            raise AttentionError(
                f"ShardedKVCache.prefill: lengths: expected values <= seq={seq}, got {lengths.tolist()}"
            )
        idx = self.owned_positions(int(lengths.max()))
        self.prefill_local(layer, k[:, idx], v[:, idx], lengths)

    def prefill_local(self, layer: int, k_local: torch.Tensor, v_local: torch.Tensor, lengths: Lengths) -> None:
        """Store an already selected local share: ``k_local``/``v_local``
        ``[batch, n, kv_heads, head_dim]`` holding this rank's positions of the
        prompts in order (:meth:`owned_positions`), ``n >= local_count(max(lengths))``;
        ``lengths``: global prompt lengths ``[batch]``."""
        self._check_layer(layer)
        lengths = self._check_lengths("prefill_local", lengths)
        n = self.local_count(int(lengths.max()))
        shape = (
            self.batch,
            k_local.shape[1] if isinstance(k_local, torch.Tensor) and k_local.dim() == 4 else -1,
            self.kv_heads,
            self.head_dim,
        )
        self._check_kv("prefill_local", k_local, shape)
        self._check_kv("prefill_local", v_local, shape)
        if shape[1] < n:
            raise AttentionError(
                f"ShardedKVCache.prefill_local: expected at least {n} local positions for "
                f"lengths {lengths.tolist()} on rank {self.rank}, got {shape[1]}"
            )
        self.k[layer][:, :n].copy_(k_local[:, :n])
        self.v[layer][:, :n].copy_(v_local[:, :n])
        self._lengths[layer] = lengths

    def append(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor, active: Sequence[bool] | torch.Tensor | None = None
    ) -> None:
        """Append one token per sequence to ``layer``, stored on the rank that owns
        each sequence's tail position.

        ``k_new``/``v_new``: ``[batch, kv_heads, head_dim]`` (the same on every rank;
        every rank calls this and only the owners write); ``active``: optional bool
        ``[batch]``, sequences that take no token this step.
        """
        self._check_layer(layer)
        shape = (self.batch, self.kv_heads, self.head_dim)
        self._check_kv("append", k_new, shape)
        self._check_kv("append", v_new, shape)
        lengths = self._lengths[layer]
        for b in range(self.batch):
            if active is not None and not bool(active[b]):
                continue
            pos = int(lengths[b])
            if pos >= self.max_seq_len:
                raise AttentionError(
                    f"ShardedKVCache.append: sequence {b} of layer {layer}: expected a length below "
                    f"max_seq_len={self.max_seq_len}, got {pos}; build the cache with a larger max_seq_len"
                )
            if self.owner(pos) == self.rank:
                slot = self.local_count(pos)
                self.k[layer][b, slot].copy_(k_new[b])
                self.v[layer][b, slot].copy_(v_new[b])
            lengths[b] = pos + 1
