"""attention.hf: tree decoding registered as a transformers attention implementation."""
import pytest
import torch

from topo.errors import MissingDependency


def test_without_transformers_gives_install_hint():
    try:
        import transformers  # noqa: F401
        pytest.skip("transformers is installed")
    except ImportError:
        pass
    from attention import hf

    with pytest.raises(MissingDependency, match=r"needs transformers: pip install 'treecoll\[hf\]'"):
        hf.register()


def test_greedy_tokens_equal_transformers_generate():
    transformers = pytest.importorskip("transformers", reason="optional extra: pip install 'treecoll[hf]'")
    from attention import hf

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = "eager"
    prompt = torch.randint(0, 256, (2, 9))
    ref = model.generate(prompt, max_new_tokens=5, do_sample=False, min_new_tokens=5)[:, 9:]
    out = hf.generate(model, prompt, 5, block_size=2)
    assert out.tolist() == ref.tolist()
