"""The torch (CPU) decode path against the float64 reference, at larger shapes."""

import pytest
import torch
from treecoll.attention import decode_partial, reference
from treecoll.attention.decode_cpu import DEFAULT_BLOCK_SIZE, decode_torch
from treecoll.attention.validate import check_decode_inputs

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
SEQ = 2 * DEFAULT_BLOCK_SIZE + 77  # several blocks and a ragged last block


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_matches_reference(dtype, group, make_inputs, poisoned, check_state):
    batch, kv_heads, head_dim = 4, 2, 64
    q, k, v = make_inputs(batch, kv_heads * group, kv_heads, head_dim, SEQ, dtype, seed=group)
    lengths = [0, 1, DEFAULT_BLOCK_SIZE, SEQ]
    out = poisoned(batch, kv_heads * group, head_dim)
    res = decode_partial(q, k, v, kv_len=lengths, backend="torch", out=out)
    assert res[0] is out[0] and res[1] is out[1]
    check_state(*out, *reference(q, k, v, kv_len=lengths), TOL[dtype])


def test_sharp_softmax_and_mqa(make_inputs, check_state):
    # scale 1 with head_dim 128: scores with std ~11, a nearly one-hot softmax
    q, k, v = make_inputs(2, 8, 1, 128, 700, torch.float32, seed=3)
    out, lse = decode_partial(q, k, v, kv_len=[700, 333], scale=1.0)
    check_state(out, lse, *reference(q, k, v, kv_len=[700, 333], scale=1.0), 1e-5)


@pytest.mark.parametrize("block", [1, 7, 64])
@pytest.mark.parametrize("splits", [1, 3, 9])
def test_block_size_and_splits_do_not_change_the_result(block, splits, make_inputs, check_state):
    q, k, v = make_inputs(2, 4, 2, 16, 40, torch.float32, seed=block)
    lengths, scale = check_decode_inputs(q, k, v, [40, 5], None, "test")
    out, lse = decode_torch(q, k, v, lengths, scale, num_splits=splits, block_size=block)
    check_state(out, lse, *reference(q, k, v, kv_len=[40, 5]), 1e-5)


def test_strided_cache_views_without_copy(make_inputs, check_state):
    # a cache with room for 300 tokens, used up to 200; k and v interleaved in one tensor
    q, _, _ = make_inputs(2, 8, 2, 32, 1, torch.bfloat16, seed=5)
    kv = torch.randn(2, 300, 2, 2, 32).bfloat16()  # [batch, capacity, k/v, kv_heads, head_dim]
    k, v = kv[:, :200, 0], kv[:, :200, 1]
    assert not k.is_contiguous()
    out, lse = decode_partial(q, k, v, kv_len=torch.tensor([200, 150]))
    check_state(out, lse, *reference(q, k, v, kv_len=[200, 150]), 1e-2)


def test_worker_threads_do_not_change_the_callers_thread_count(make_inputs, check_state):
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = make_inputs(2, 8, 2, 32, 3 * DEFAULT_BLOCK_SIZE, torch.float32, seed=9)
        lengths = [3 * DEFAULT_BLOCK_SIZE, 2 * DEFAULT_BLOCK_SIZE + 5]  # long enough for the worker threads
        out, lse = decode_partial(q, k, v, kv_len=lengths)
        check_state(out, lse, *reference(q, k, v, kv_len=lengths), 1e-5)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
