"""The float64 reference itself, checked by hand-written softmax on tiny inputs."""

import math

import torch
from treecoll.attention import reference


def test_matches_hand_computed_softmax():
    q = torch.tensor([[[1.0, 0.0]]])  # [1, 1, 2]
    k = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]], [[2.0, 0.0]]]])  # [1, 3, 1, 2]
    v = torch.tensor([[[[1.0, 2.0]], [[3.0, 4.0]], [[5.0, 6.0]]]])
    out, lse = reference(q, k, v, kv_len=[2], scale=1.0)
    s = [1.0, 0.0]  # scores of the first two keys; the third is masked
    z = math.exp(s[0]) + math.exp(s[1])
    expected = [(math.exp(s[0]) * 1 + math.exp(s[1]) * 3) / z, (math.exp(s[0]) * 2 + math.exp(s[1]) * 4) / z]
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert torch.allclose(out[0, 0], torch.tensor(expected, dtype=torch.float64), rtol=1e-12)
    assert abs(lse.item() - math.log(z)) < 1e-12


def test_default_scale_and_empty_sequence():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 4, generator=g)
    k, v = torch.randn(2, 3, 1, 4, generator=g), torch.randn(2, 3, 1, 4, generator=g)
    out, lse = reference(q, k, v, kv_len=[3, 0])
    assert torch.isneginf(lse[1]).all() and (out[1] == 0).all()
    s = torch.einsum("hd,nd->hn", q[0].double(), k[0, :, 0].double()) / 2.0  # 1/sqrt(4)
    assert torch.allclose(lse[0], torch.logsumexp(s, -1), rtol=1e-12)


def test_gqa_mapping_equals_repeated_mha():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 6, 8, generator=g)
    k, v = torch.randn(1, 5, 2, 8, generator=g), torch.randn(1, 5, 2, 8, generator=g)
    out, lse = reference(q, k, v)
    out_mha, lse_mha = reference(q, k.repeat_interleave(3, 2), v.repeat_interleave(3, 2))
    assert torch.equal(out, out_mha) and torch.equal(lse, lse_mha)
    # query heads 0..2 read KV head 0: head 3 must differ from head 0's answer on KV head 0
    out_h0, _ = reference(q[:, 3:4], k[:, :, :1], v[:, :, :1])
    assert not torch.allclose(out[:, 3], out_h0[:, 0])
