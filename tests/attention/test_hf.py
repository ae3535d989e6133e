"""treecoll.attention.hf: tree decoding registered as a transformers attention implementation.

The reference is the Hugging Face model itself in one process (its own
``generate`` with its own KV cache and attention); the sharded runs load the
same ``save_pretrained`` directory in every rank (real gloo processes).
"""
import sys

import pytest
import torch
from treecoll.attention.kv_cache import ShardedKVCache
from treecoll.collectives.launch import spawn
from treecoll.topo.errors import AttentionError, MissingDependency

SKIP = "optional extra transformers not installed: pip install 'treecoll[hf]'"
VOCAB, PROMPT_LEN, NEW = 256, 9, 6
LENGTHS = [9, 5]  # right-padded batch: the second prompt is 5 tokens
PROMPTS = torch.randint(0, VOCAB, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("transformers", reason=SKIP)


def _config(tf, **kw):
    """A small Llama: 3 layers, GQA 8 query heads over 2 KV heads, head_dim 8."""
    args = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=8,
                num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0)
    args.update(kw)
    return tf.LlamaConfig(**args)


@pytest.fixture(scope="module")
def model_dir(tf, tmp_path_factory):
    """A random LlamaForCausalLM written with save_pretrained (config.json + model.safetensors)."""
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(_config(tf)).eval()
    path = tmp_path_factory.mktemp("hf") / "llama"
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reference(tf, model_dir):
    """The HF model's own greedy generation, one unpadded prompt at a time:
    per sequence (tokens [NEW], logits float32 [NEW, vocab])."""
    model = tf.LlamaForCausalLM.from_pretrained(model_dir).eval()
    out = []
    for b, n in enumerate(LENGTHS):
        prompt = PROMPTS[b:b + 1, :n]
        res = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW,
                             min_new_tokens=NEW, do_sample=False, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)
        out.append((res.sequences[0, n:], torch.stack(res.logits, 1)[0].float()))
    return out


def _check_against(reference, tokens, logits):
    tokens, logits = torch.as_tensor(tokens), torch.as_tensor(logits)
    for b, (ref_tokens, ref_logits) in enumerate(reference):
        assert tokens[b].tolist() == ref_tokens.tolist(), b
        assert (logits[b] - ref_logits).abs().max().item() <= 1e-4, b


def test_reference_is_not_degenerate(reference):
    """The comparison can fail: the random model emits varied tokens, different per prompt."""
    (a, _), (b, _) = reference
    assert len(set(a.tolist())) > 1 and a.tolist() != b.tolist()


def test_without_transformers_gives_install_hint(monkeypatch):
    from treecoll.attention import hf

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(MissingDependency, match=r"needs transformers: pip install 'treecoll\[hf\]'"):
        hf.register()


def test_register_name_and_attn_implementation(tf, model_dir):
    from treecoll.attention import hf

    assert hf.register() == hf.NAME == "tree_decode"
    assert tf.AttentionInterface._global_mapping["tree_decode"] is hf.tree_attention_forward
    model = tf.LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="tree_decode").eval()
    assert model.config._attn_implementation == "tree_decode"
    with pytest.raises(AttentionError, match=r"tree_decode attention: expected a call inside "
                                             r"treecoll.attention.hf.generate .*, got a model call outside it"):
        model(PROMPTS)
    assert hf.generate(model, PROMPTS, 2).shape == (2, 2)  # a model built for tree_decode generates
    assert model.config._attn_implementation == "tree_decode"


def test_single_process_equals_hf_generate(tf, model_dir, reference):
    from treecoll.attention import hf

    model = tf.LlamaForCausalLM.from_pretrained(model_dir).eval()
    impl = model.config._attn_implementation
    tokens, logits = hf.generate(model, PROMPTS, NEW, lengths=LENGTHS, block_size=2, return_logits=True)
    assert tokens.dtype == torch.int64 and tokens.shape == (2, NEW) and logits.shape == (2, NEW, VOCAB)
    _check_against(reference, tokens, logits)
    assert model.config._attn_implementation == impl  # restored
    same = hf.generate(model, PROMPTS[:, :5], NEW)  # equal lengths, no lengths argument
    assert same[1].tolist() == reference[1][0].tolist()


def _sharded_worker(rank, nproc, model_dir):
    import transformers
    from treecoll.attention import hf

    model = transformers.LlamaForCausalLM.from_pretrained(model_dir).eval()
    res = {}
    for name, kw in {"tree": dict(block_size=2), "tree_one_rank_holds_all": dict(block_size=256),
                     "ring": dict(block_size=3, method="ring"),
                     "allreduce3": dict(block_size=3, method="allreduce3")}.items():
        if nproc == 2 and name in ("ring", "allreduce3"):
            continue
        tokens, logits = hf.generate(model, PROMPTS, NEW, lengths=LENGTHS, return_logits=True, **kw)
        res[name] = (tokens.tolist(), logits.tolist())  # plain data: tensors would go through shared memory
    # a cache shard per rank: block_size 2 over 3 ranks, 14 positions -> 6/4/4
    from treecoll.attention.kv_cache import ShardedKVCache

    res["local_count"] = ShardedKVCache(layers=1, batch=1, kv_heads=1, head_dim=1, max_seq_len=14, rank=rank,
                                        world=nproc, block_size=2).local_count(14)
    return res


@pytest.mark.timeout(150)
@pytest.mark.parametrize("nproc", [2, 3])
def test_sharded_greedy_equals_hf_generate(tf, model_dir, reference, nproc):
    """P gloo processes, KV cache sharded (uneven shards with 3 ranks, empty
    shards with block_size 256) give the HF model's tokens and logits."""
    results = spawn(_sharded_worker, nproc, str(model_dir), timeout=90)
    if nproc == 3:
        assert [r["local_count"] for r in results] == [6, 4, 4]
    for rank, res in enumerate(results):
        runs = {k: v for k, v in res.items() if k != "local_count"}
        assert len(runs) == (2 if nproc == 2 else 4)
        for name, (tokens, logits) in runs.items():
            try:
                _check_against(reference, tokens, logits)
            except AssertionError as e:
                raise AssertionError(f"rank {rank}, {name}: {e}") from None


def _disagree_worker(rank, nproc):
    import transformers
    from treecoll.attention import hf

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1)).eval()
    prompt = torch.full((1, 4), rank)  # the ranks were given different prompts
    hf.generate(model, prompt, 2)


@pytest.mark.timeout(120)
def test_ranks_with_different_prompts_raise(tf):
    from treecoll.topo.errors import CollectiveError

    with pytest.raises(CollectiveError, match=r"tree_decode generate: ranks disagree on input_ids fingerprint"):
        spawn(_disagree_worker, 2, timeout=60)


def test_unsupported_options_raise(tf, model_dir):
    from treecoll.attention import hf

    model = tf.LlamaForCausalLM.from_pretrained(model_dir).eval()
    with pytest.raises(AttentionError, match=r"lengths: expected 2 values in \[1, 9\], got \[9, 10\]"):
        hf.generate(model, PROMPTS, 2, lengths=[9, 10])
    with pytest.raises(AttentionError, match=r"input_ids: expected an int tensor \[batch, seq\]"):
        hf.generate(model, PROMPTS.float(), 2)
    with pytest.raises(AttentionError, match=r"decode method: unknown name 'flash'"):
        hf.generate(model, PROMPTS, 2, method="flash")
    # attention dropout in training mode
    drop = tf.LlamaForCausalLM(_config(tf, attention_dropout=0.1))
    drop.train()
    with pytest.raises(AttentionError, match=r"layer 0: dropout: expected 0.0 \(call model.eval\(\)\), got 0.1"):
        hf.generate(drop, PROMPTS, 2)
    # a sliding window shorter than prompt + new tokens
    mistral = tf.MistralForCausalLM(tf.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=8,
        num_key_value_heads=2, sliding_window=8)).eval()
    with pytest.raises(AttentionError, match=r"config.sliding_window: expected none or >= prompt \+ new tokens "
                                             r"= 11, got 8"):
        hf.generate(mistral, PROMPTS, 2)
    assert hf.generate(mistral, PROMPTS[:, :4], 2).shape == (2, 2)  # a window longer than the sequence is exact
    # a padding mask reaching the attention function (e.g. a prepared 4D mask)
    attn = model.model.layers[0].self_attn
    q, kv = torch.zeros(2, 8, 3, 8), torch.zeros(2, 2, 3, 8)
    cache = ShardedKVCache(layers=3, batch=2, kv_heads=2, head_dim=8, max_seq_len=4)
    with hf._session(hf._Session(cache, None, "auto", None, None, torch.tensor([3, 3]))):
        with pytest.raises(AttentionError, match=r"tree_decode attention, layer 0: attention_mask: expected None"):
            hf.tree_attention_forward(attn, q, kv, kv, torch.ones(2, 1, 3, 3, dtype=torch.bool))
        with pytest.raises(AttentionError, match=r"softcap: expected None"):
            hf.tree_attention_forward(attn, q, kv, kv, softcap=30.0)


def test_treecoll_model_loads_hf_save_pretrained(tf, model_dir, reference):
    """treecoll.attention.model.LlamaModel reads the directory transformers wrote and decodes
    (cache sharded or not) to the HF model's tokens."""
    from treecoll.attention.model import LlamaModel

    model = LlamaModel.from_pretrained(model_dir)
    assert (model.config.num_layers, model.config.num_heads, model.config.num_kv_heads) == (3, 8, 2)
    tokens = model.generate(PROMPTS, NEW, lengths=LENGTHS, block_size=2)
    for b, (ref_tokens, _) in enumerate(reference):
        assert tokens[b].tolist() == ref_tokens.tolist(), b
    hf_model = tf.LlamaForCausalLM.from_pretrained(model_dir).eval()
    ref_logits = hf_model(PROMPTS).logits[:, -1].float()
    ours = model.prefill(PROMPTS, model.new_cache(2, PROMPT_LEN))
    assert (ours - ref_logits).abs().max().item() <= 1e-4
