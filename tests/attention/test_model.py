"""The Llama-style model: decode path vs prefill, sharded greedy generation vs one
process (real gloo processes, one group for every method), weight loading."""

import pytest
import torch
from treecoll.attention.model import LlamaConfig, LlamaModel, save_checkpoint
from treecoll.collectives.launch import spawn
from treecoll.topo.errors import AttentionError, MissingDependency

CFG = LlamaConfig(vocab_size=384, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=8, num_kv_heads=2)
PROMPTS = torch.randint(0, 384, (2, 11), generator=torch.Generator().manual_seed(3))
LENGTHS = [11, 6]
NEW = 6
BLOCK = 2  # tiny blocks: every rank holds a few positions, some none early on


def _generate(rank, nproc, method):
    model = LlamaModel.random(CFG, seed=1)
    return model.generate(PROMPTS, NEW, lengths=LENGTHS, method=method, block_size=BLOCK).tolist()


def _worker(rank, nproc):
    out = {m: _generate(rank, nproc, m) for m in ("tree", "ring", "allreduce3")}
    # a tree other than auto: a chain
    from treecoll.collectives import Tree

    model = LlamaModel.random(CFG, seed=1)
    out["chain"] = model.generate(
        PROMPTS, NEW, lengths=LENGTHS, tree=Tree.from_parents([-1, 0, 1]), block_size=BLOCK
    ).tolist()
    return out


@pytest.fixture(scope="module")
def single_tokens():
    return _generate(0, 1, "tree")


def test_sharded_greedy_equals_single_process(single_tokens):
    results = spawn(_worker, 3, timeout=90)
    assert len(single_tokens) == 2 and len(single_tokens[0]) == NEW
    for rank, res in enumerate(results):
        for method, tokens in res.items():
            assert tokens == single_tokens, (rank, method)


def test_decode_matches_prefill_of_the_longer_prompt():
    """Logits of decode step n equal those of a fresh prefill over prompt + generated tokens."""
    model = LlamaModel.random(CFG, seed=1)
    cache = model.new_cache(2, 32, block_size=3)
    logits = model.prefill(PROMPTS, cache, LENGTHS)
    seqs = [PROMPTS[b, : LENGTHS[b]].tolist() for b in range(2)]
    for _ in range(3):
        nxt = logits.argmax(-1)
        for b in range(2):
            seqs[b].append(int(nxt[b]))
        logits = model.decode_step(nxt, cache)
    for b in range(2):
        ref = model.prefill(torch.tensor([seqs[b]]), model.new_cache(1, 32))
        assert (logits[b] - ref[0]).abs().max() <= 1e-4


def test_checkpoint_round_trip(tmp_path):
    model = LlamaModel.random(CFG, seed=5)
    save_checkpoint(model, tmp_path / "m")
    loaded = LlamaModel.from_pretrained(tmp_path / "m")
    assert loaded.config == model.config
    cache_a, cache_b = model.new_cache(2, 16), loaded.new_cache(2, 16)
    assert torch.equal(model.prefill(PROMPTS, cache_a, LENGTHS), loaded.prefill(PROMPTS, cache_b, LENGTHS))


def test_safetensors_checkpoint(tmp_path):
    model = LlamaModel.random(CFG, seed=5)
    try:
        import safetensors  # noqa: F401
    except ImportError:
        (tmp_path / "config.json").write_text(
            '{"num_attention_heads": 8, "hidden_size": 64, "vocab_size": 384, '
            '"intermediate_size": 160, "num_hidden_layers": 2}'
        )
        (tmp_path / "model.safetensors").write_bytes(b"")
        with pytest.raises(MissingDependency, match=r"needs safetensors: pip install 'treecoll\[hf\]'"):
            LlamaModel.from_pretrained(tmp_path)
        return
    save_checkpoint(model, tmp_path / "s", format="safetensors")
    loaded = LlamaModel.from_pretrained(tmp_path / "s")
    assert all(torch.equal(loaded.w[k], v) for k, v in model.state_dict().items())


def test_bad_weights_and_config(tmp_path):
    with pytest.raises(AttentionError, match=r"num_heads: expected a multiple of num_kv_heads=3, got 8"):
        LlamaConfig(num_heads=8, num_kv_heads=3)
    w = LlamaModel.random(CFG).state_dict()
    w["model.norm.weight"] = torch.ones(3)
    with pytest.raises(AttentionError, match=r"weights\['model.norm.weight'\]: expected shape \(64,\), got \(3,\)"):
        LlamaModel(CFG, w)
    with pytest.raises(AttentionError, match=r"config.json: expected a Hugging Face config.json"):
        LlamaModel.from_pretrained(tmp_path)


def test_llama3_rope_scaling_keeps_high_frequencies():
    from treecoll.attention.model import _inv_freq

    base = LlamaConfig(hidden_size=128, num_heads=1, num_kv_heads=1, rope_theta=500000.0)
    scaled = LlamaConfig(
        hidden_size=128,
        num_heads=1,
        num_kv_heads=1,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    a, b = _inv_freq(base), _inv_freq(scaled)
    assert torch.equal(a[:8], b[:8])  # short wavelengths untouched
    assert torch.allclose(a[-1] / 8, b[-1])  # longest wavelengths divided by the factor
