"""ShardedKVCache: placement, prefill, append, per-sequence lengths, empty shards.

P caches (one per simulated rank) live in one process here; the multi-process
use of the cache is tested through the model (test_model.py).
"""

import gc
import mmap

import pytest
import torch
from treecoll.attention import decode_partial, kv_cache, merge_states, reference
from treecoll.attention.kv_cache import HUGE_PAGE, ShardedKVCache, alloc_kv, huge_page_bytes, thp_mode
from treecoll.topo.errors import AttentionError

THP = thp_mode() in ("always", "madvise")


def _caches(world, **kw):
    return [ShardedKVCache(rank=r, world=world, **kw) for r in range(world)]


@pytest.mark.parametrize("world,block,length", [(3, 4, 29), (4, 1, 7), (2, 5, 10), (1, 3, 8)])
def test_placement_partitions_positions(world, block, length):
    caches = _caches(world, layers=1, batch=1, kv_heads=1, head_dim=2, max_seq_len=64, block_size=block)
    owned = [c.owned_positions(length) for c in caches]
    assert sorted(torch.cat(owned).tolist()) == list(range(length))
    for c, pos in zip(caches, owned):
        assert c.local_count(length) == len(pos)
        assert all(c.owner(int(p)) == c.rank for p in pos)
        assert pos.tolist() == sorted(pos.tolist())
    # balanced to within one block
    counts = [len(p) for p in owned]
    assert max(counts) - min(counts) <= block


@pytest.mark.parametrize("pages", ["4k", "2m"])
def test_prefill_append_and_decode_equal_reference(pages):
    world, block, batch, hq, hkv, d = 3, 4, 3, 6, 2, 8
    g = torch.Generator().manual_seed(0)
    prompt = [29, 5, 0]
    new = 7
    total = max(prompt) + new
    k = torch.randn(batch, total, hkv, d, generator=g)
    v = torch.randn(batch, total, hkv, d, generator=g)
    caches = _caches(
        world,
        layers=2,
        batch=batch,
        kv_heads=hkv,
        head_dim=d,
        max_seq_len=40,
        block_size=block,
        dtype=torch.float32,
        pages=pages,
    )
    for c in caches:
        c.prefill(1, k[:, : max(prompt)], v[:, : max(prompt)], prompt)
    lengths = torch.tensor(prompt)
    full_k = torch.zeros(batch, total, hkv, d)
    full_v = torch.zeros(batch, total, hkv, d)
    for b in range(batch):  # sequence b's tokens: its prompt, then the new tokens
        full_k[b, : prompt[b]] = k[b, : prompt[b]]
        full_v[b, : prompt[b]] = v[b, : prompt[b]]
    for _ in range(new):
        kn = torch.randn(batch, hkv, d, generator=g)
        vn = torch.randn(batch, hkv, d, generator=g)
        for b in range(batch):
            full_k[b, lengths[b]] = kn[b]
            full_v[b, lengths[b]] = vn[b]
        lengths += 1
        for c in caches:
            c.append(1, kn, vn)
    q = torch.randn(batch, hq, d, generator=g)
    ref_out, ref_lse = reference(q, full_k, full_v, kv_len=lengths)
    outs, lses = [], []
    for c in caches:
        assert c.lengths(1).tolist() == lengths.tolist()
        assert c.lengths(0).tolist() == [0, 0, 0]
        kk, vv, kv_len = c.shard(1)
        for b in range(batch):
            pos = c.owned_positions(int(lengths[b]))
            assert int(kv_len[b]) == len(pos)
            assert torch.equal(kk[b, : len(pos)], full_k[b, pos])
        o, s = decode_partial(q, kk, vv, kv_len=kv_len)
        outs.append(o)
        lses.append(s)
    out, lse = merge_states(outs, lses)
    assert (out.double() - ref_out).abs().max() <= 1e-5
    assert (lse.double() - ref_lse).abs().max() <= 1e-5


def test_rank_without_tokens_gives_empty_state():
    caches = _caches(4, layers=1, batch=2, kv_heads=1, head_dim=4, max_seq_len=32, block_size=8, dtype=torch.float32)
    k = torch.randn(2, 10, 1, 4)
    for c in caches:
        c.prefill(0, k, k, [10, 3])
    kv = [c.kv_len(0).tolist() for c in caches]
    assert kv == [[8, 3], [2, 0], [0, 0], [0, 0]]
    kk, vv, kv_len = caches[3].shard(0)
    out, lse = decode_partial(torch.randn(2, 2, 4), kk, vv, kv_len=kv_len)
    assert torch.isinf(lse).all() and (lse < 0).all() and (out == 0).all()


def test_errors():
    c = ShardedKVCache(layers=1, batch=1, kv_heads=1, head_dim=2, max_seq_len=3, rank=0, world=1, block_size=2)
    with pytest.raises(AttentionError, match=r"rank: expected an int in \[0, 1\], got 2"):
        ShardedKVCache(layers=1, batch=1, kv_heads=1, head_dim=2, max_seq_len=3, rank=2, world=2)
    with pytest.raises(AttentionError, match=r"prefill: lengths: expected values in \[0, max_seq_len=3\]"):
        c.prefill(0, torch.zeros(1, 4, 1, 2), torch.zeros(1, 4, 1, 2))
    with pytest.raises(AttentionError, match=r"append: expected a tensor of shape \(1, 1, 2\), got \(1, 2\)"):
        c.append(0, torch.zeros(1, 2), torch.zeros(1, 2))
    for _ in range(3):
        c.append(0, torch.zeros(1, 1, 2), torch.zeros(1, 1, 2))
    with pytest.raises(AttentionError, match=r"sequence 0 of layer 0: expected a length below max_seq_len=3, got 3"):
        c.append(0, torch.zeros(1, 1, 2), torch.zeros(1, 1, 2))
    with pytest.raises(AttentionError, match=r"layer: expected an int in \[0, 0\], got 1"):
        c.kv_len(1)
    c.truncate(0, [1])
    with pytest.raises(
        AttentionError, match=r"truncate: lengths: expected at most the current lengths \[1\], got \[2\]"
    ):
        c.truncate(0, [2])


def test_truncate_then_append_overwrites():
    c = ShardedKVCache(layers=1, batch=1, kv_heads=1, head_dim=1, max_seq_len=8, block_size=2, dtype=torch.float32)
    for x in range(5):
        c.append(0, torch.full((1, 1, 1), float(x)), torch.full((1, 1, 1), float(x)))
    c.truncate(0, [3])
    c.append(0, torch.full((1, 1, 1), 9.0), torch.full((1, 1, 1), 9.0))
    k, _, kv_len = c.shard(0)
    assert kv_len.tolist() == [4] and k[0, :4, 0, 0].tolist() == [0.0, 1.0, 2.0, 9.0]


def test_prefill_without_lengths_takes_the_whole_prompt_of_every_sequence():
    """A batch of equal-length prompts needs no ``lengths`` (used to fail for batch > 1)."""
    world, batch, seq = 2, 3, 10
    g = torch.Generator().manual_seed(1)
    k = torch.randn(batch, seq, 2, 4, generator=g)
    v = torch.randn(batch, seq, 2, 4, generator=g)
    for c in _caches(
        world, layers=1, batch=batch, kv_heads=2, head_dim=4, max_seq_len=16, block_size=3, dtype=torch.float32
    ):
        c.prefill(0, k, v)
        assert c.lengths(0).tolist() == [seq] * batch
        n = c.local_count(seq)
        assert torch.equal(c.k[0][:, :n], k[:, c.owned_positions(seq)])


def _smaps_entry(addr: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping holding ``addr`` ({} if none does)."""
    entry, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and ":" not in head:
                if inside:
                    return entry
                a, b = (int(x, 16) for x in head.split("-"))
                inside = a <= addr < b
            elif inside:
                entry[head.rstrip(":")] = line.split(None, 1)[1].strip() if " " in line.strip() else ""
    return entry if inside else {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pages", ["auto", "4k", "2m"])
def test_alloc_kv_is_a_zeroed_writable_tensor(pages, dtype):
    shape = (2, 3000, 4, 64)  # 1.5-3 MiB: below auto's threshold, above one huge page
    t = alloc_kv(shape, dtype, pages=pages)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous() and t.device.type == "cpu"
    assert bool((t == 0).all())
    src = torch.randn(shape).to(dtype)
    t.copy_(src)
    assert torch.equal(t, src)
    if pages == "2m" and THP:
        assert t.data_ptr() % HUGE_PAGE == 0
        assert "hg" in _smaps_entry(t.data_ptr()).get("VmFlags", "").split()  # MADV_HUGEPAGE applied
    elif pages != "2m":
        assert "hg" not in _smaps_entry(t.data_ptr()).get("VmFlags", "").split()


@pytest.mark.skipif(not THP, reason="the kernel gives no transparent huge pages here")
def test_alloc_kv_in_huge_pages_keeps_and_frees_its_mapping():
    base = alloc_kv((4 * HUGE_PAGE // 4,), torch.float32, pages="2m")
    addr = base.data_ptr()
    view = base[HUGE_PAGE // 4 :]
    view.copy_(torch.arange(view.numel(), dtype=torch.float32))
    del base
    gc.collect()
    others = [alloc_kv((HUGE_PAGE,), torch.float32, pages="2m").fill_(-1.0) for _ in range(4)]
    assert torch.equal(view, torch.arange(view.numel(), dtype=torch.float32))  # the view keeps the mapping
    assert huge_page_bytes(view) is not None and huge_page_bytes(view) <= 4 * HUGE_PAGE
    del view, others
    gc.collect()
    assert _smaps_entry(addr) == {}  # the last view gone, the mapping is unmapped


@pytest.mark.parametrize("mode", [None, "always madvise [never]"])
def test_alloc_kv_falls_back_without_transparent_huge_pages(tmp_path, monkeypatch, mode):
    path = tmp_path / "enabled"
    if mode is not None:
        path.write_text(mode + "\n")
    monkeypatch.setattr(kv_cache, "_THP_ENABLED", path)
    assert thp_mode() == (None if mode is None else "never")
    t = alloc_kv((3, 2 * HUGE_PAGE // 4), torch.float32, pages="2m")
    assert t.shape == (3, 2 * HUGE_PAGE // 4) and bool((t == 0).all())
    assert "hg" not in _smaps_entry(t.data_ptr()).get("VmFlags", "").split()


def test_alloc_kv_falls_back_when_mmap_fails(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("no memory")

    monkeypatch.setattr(kv_cache, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(mmap, "mmap", refuse)
    t = alloc_kv((5, 7), torch.bfloat16, pages="2m")
    assert t.shape == (5, 7) and t.dtype == torch.bfloat16 and bool((t == 0).all())


def test_alloc_kv_other_devices_and_bad_pages():
    t = alloc_kv((4, 1 << 20), torch.float32, device="meta", pages="2m")
    assert t.device.type == "meta" and t.shape == (4, 1 << 20)
    with pytest.raises(AttentionError, match="pages"):
        alloc_kv((4,), torch.float32, pages="1g")
    with pytest.raises(AttentionError, match="pages"):
        ShardedKVCache(layers=1, batch=1, kv_heads=1, head_dim=2, max_seq_len=4, pages="huge")
