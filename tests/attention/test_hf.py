"""treecoll.attention.hf: tree decoding registered as a transformers attention implementation.

The reference is the Hugging Face model itself in one process (its own
``generate`` with its own KV cache and attention); the sharded runs load the
same ``save_pretrained`` directory in every rank (real gloo processes).
"""

import sys

import pytest
import torch
from treecoll.attention.kv_cache import ShardedKVCache
from treecoll.collectives.launch import RankPool
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
    args = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=10000.0,
    )
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
        prompt = PROMPTS[b : b + 1, :n]
        res = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
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
    assert tf.masking_utils.AttentionMaskInterface._global_mapping["tree_decode"] is hf.padding_mask
    model = tf.LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="tree_decode").eval()
    assert model.config._attn_implementation == "tree_decode"
    with pytest.raises(
        AttentionError,
        match=r"tree_decode attention, layer 0: expected the keys of a TreeCache "
        r"update \(pass past_key_values=treecoll.attention.hf.TreeCache",
    ):
        model(PROMPTS)  # a plain forward: transformers' own DynamicCache
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


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def pool(request, tf):
    """P gloo ranks (the one launcher's RankPool) shared by this module's multi-process tests."""
    with RankPool(request.param, timeout=120) as p:
        yield p


def _sharded_worker(rank, nproc, model_dir):
    import transformers
    from treecoll.attention import hf

    model = transformers.LlamaForCausalLM.from_pretrained(model_dir).eval()
    res = {}
    for name, kw in {
        "tree": dict(block_size=2),
        "tree_one_rank_holds_all": dict(block_size=256),
        "contiguous": dict(layout="contiguous"),
        "ring": dict(block_size=3, method="ring"),
        "allreduce3": dict(block_size=3, method="allreduce3"),
    }.items():
        if nproc > 2 and name in ("tree_one_rank_holds_all", "ring", "allreduce3"):
            continue  # run on 2 ranks: 4 ranks on a small CI machine make every step slow
        tokens, logits = hf.generate(model, PROMPTS, NEW, lengths=LENGTHS, return_logits=True, **kw)
        res[name] = (tokens.tolist(), logits.tolist())  # plain data: tensors would go through shared memory
    # a cache shard per rank: block_size 2, 14 positions -> 8/6 over 2 ranks, 4/4/4/2 over 4
    res["local_count"] = ShardedKVCache(
        layers=1, batch=1, kv_heads=1, head_dim=1, max_seq_len=14, rank=rank, world=nproc, block_size=2
    ).local_count(14)
    return res


@pytest.mark.timeout(240)
def test_sharded_greedy_equals_hf_generate(tf, model_dir, reference, pool):
    """P gloo processes, KV cache sharded (uneven shards, empty shards with
    block_size 256, contiguous ranges) give the HF model's tokens and logits."""
    results = pool.run(_sharded_worker, str(model_dir))
    assert [r["local_count"] for r in results] == ([8, 6] if pool.nproc == 2 else [4, 4, 4, 2])
    for rank, res in enumerate(results):
        runs = {k: v for k, v in res.items() if k != "local_count"}
        assert len(runs) == (5 if pool.nproc == 2 else 2)
        for name, (tokens, logits) in runs.items():
            try:
                _check_against(reference, tokens, logits)
            except AssertionError as e:
                raise AssertionError(f"rank {rank}, {name}: {e}") from None


# ----------------------------------------------------------------------- model.generate with a TreeCache

#: the batch left-padded as a tokenizer pads for generation: row 1 is 4 pad tokens (id 0), then its 5 tokens
LEFT = torch.cat([PROMPTS[:1], torch.cat([torch.zeros(1, 4, dtype=PROMPTS.dtype), PROMPTS[1:, :5]], 1)])
MASK = (torch.arange(PROMPT_LEN)[None, :] >= torch.tensor([[0], [4]])).to(torch.int64)


class _Recorder:
    """A streamer (transformers.generation.streamers.BaseStreamer's two methods) keeping what it was given."""

    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended = True


def _generate_cases(eos):
    """name -> (generate kwargs, seed or None); ``eos``: the EOS ids of the EOS case."""
    return {
        "greedy": (dict(max_new_tokens=NEW), None),
        "sample": (dict(max_new_tokens=NEW, do_sample=True, top_k=0), 11),
        "sample_contiguous": (dict(max_new_tokens=NEW, do_sample=True, temperature=0.7), 12),
        "eos": (dict(max_new_tokens=NEW, eos_token_id=eos), None),
        "max_length": (dict(max_length=PROMPT_LEN + 3), None),
    }


def _generate_all(model, eos, cache_for=None):
    """Every case of :func:`_generate_cases` through ``model.generate`` (``cache_for(name)``: the
    past_key_values of a case, None for the model's own cache); name -> (sequences, streamed)."""
    out = {}
    for name, (kw, seed) in _generate_cases(eos).items():
        if seed is not None:
            torch.manual_seed(seed)
        streamer = _Recorder()
        cache = cache_for(name) if cache_for else None
        seq = model.generate(
            LEFT,
            attention_mask=MASK,
            pad_token_id=0,
            streamer=streamer,
            past_key_values=cache,
            do_sample=kw.pop("do_sample", False),
            **kw,
        )
        assert streamer.ended
        out[name] = (seq.tolist(), streamer.puts)
    return out


@pytest.fixture(scope="module")
def generate_reference(tf, model_dir):
    """The HF model's own generate (sdpa, its DynamicCache) on the left-padded batch, in one process;
    and the EOS ids: row 0's third and row 1's second greedy token (so both rows stop early)."""
    model = tf.LlamaForCausalLM.from_pretrained(model_dir).eval()
    greedy = model.generate(LEFT, attention_mask=MASK, pad_token_id=0, max_new_tokens=NEW, do_sample=False)
    new = greedy[:, PROMPT_LEN:].tolist()
    eos = [new[0][2], new[1][1]]
    return _generate_all(model, eos), eos


def _cache_worker(rank, nproc, model_dir, eos):
    import transformers
    from treecoll.attention import hf

    hf.register()
    model = transformers.LlamaForCausalLM.from_pretrained(model_dir, attn_implementation="tree_decode").eval()

    def cache_for(name):
        layout = "contiguous" if name.endswith("contiguous") else "round_robin"
        return hf.TreeCache(model.config, max_cache_len=PROMPT_LEN + NEW, layout=layout, block_size=2)

    res = _generate_all(model, eos, cache_for)
    for name in ("greedy", "contiguous"):
        cache = cache_for(name)
        model.generate(LEFT, attention_mask=MASK, pad_token_id=0, max_new_tokens=NEW, past_key_values=cache)
        res[f"shard_lengths_{name}"] = cache.shard_lengths(0).tolist()
    return res


@pytest.mark.timeout(240)
def test_model_generate_with_tree_cache_equals_hf_generate(tf, model_dir, generate_reference, pool):
    """model.generate(past_key_values=TreeCache(...)) over P gloo processes, left-padded batch with an
    attention mask: greedy, sampling (same seed), EOS, max_length and the streamer give exactly what
    the same model's own generate gives in one process, on every rank."""
    reference, eos = generate_reference
    (ref_greedy, _), (ref_eos, _) = reference["greedy"], reference["eos"]
    # the comparisons can fail: EOS stops both rows early, sampling differs from greedy, rows differ
    assert len(ref_eos[0]) < len(ref_greedy[0]) == PROMPT_LEN + NEW
    assert reference["sample"][0] != ref_greedy and ref_greedy[0][PROMPT_LEN:] != ref_greedy[1][PROMPT_LEN:]
    assert len(reference["max_length"][0][0]) == PROMPT_LEN + 3
    results = pool.run(_cache_worker, str(model_dir), eos)
    for rank, res in enumerate(results):
        for name, (seq, streamed) in reference.items():
            assert res[name][0] == seq, (rank, name)
            assert res[name][1] == streamed, (rank, name)  # the prompt, then each step's tokens
    # 9 + 5 real tokens of row 0 and 5 + 5 of row 1 (the pads are not stored) in blocks of 2 tokens
    # (the last generated token is never fed back: NEW - 1 decoded), dealt round-robin over the ranks
    p = pool.nproc
    held = [
        [sum(1 for j in range(n) if (j // 2) % p == r) for n in (PROMPT_LEN + NEW - 1, 5 + NEW - 1)] for r in range(p)
    ]
    assert [res["shard_lengths_greedy"] for res in results] == held
    # contiguous: rank r holds positions [r * c, (r + 1) * c) of the 15-position cache, c = ceil(15 / P)
    c = -(-(PROMPT_LEN + NEW) // p)
    held = [[max(0, min(n, (r + 1) * c) - r * c) for n in (PROMPT_LEN + NEW - 1, 5 + NEW - 1)] for r in range(p)]
    assert [res["shard_lengths_contiguous"] for res in results] == held


def _disagree_worker(rank, nproc, mask):
    import transformers
    from treecoll.attention import hf

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    ).eval()
    if mask:  # model.generate with a TreeCache, the ranks given different attention masks
        hf.register()
        model.set_attn_implementation(hf.NAME)
        m = torch.ones(1, 4, dtype=torch.int64)
        m[0, 0] = rank % 2
        model.generate(
            torch.ones(1, 4, dtype=torch.int64),
            attention_mask=m,
            max_new_tokens=2,
            pad_token_id=0,
            past_key_values=hf.TreeCache(model.config, max_cache_len=6),
        )
    prompt = torch.full((1, 4), rank)  # the ranks were given different prompts
    hf.generate(model, prompt, 2)


@pytest.mark.timeout(120)
def test_ranks_with_different_prompts_raise(tf, pool):
    from treecoll.topo.errors import CollectiveError

    with pytest.raises(CollectiveError, match=r"tree_decode generate: ranks disagree on input_ids fingerprint"):
        pool.run(_disagree_worker, False)
    with pytest.raises(CollectiveError, match=r"tree_decode prefill: ranks disagree on attention_mask fingerprint"):
        pool.run(_disagree_worker, True)


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
    mistral = tf.MistralForCausalLM(
        tf.MistralConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=8,
            num_key_value_heads=2,
            sliding_window=8,
        )
    ).eval()
    with pytest.raises(
        AttentionError,
        match=r"config.sliding_window: expected none or >= prompt \+ new tokens "
        r"= 11, got 8",
    ):
        hf.generate(mistral, PROMPTS, 2)
    assert hf.generate(mistral, PROMPTS[:, :4], 2).shape == (2, 2)  # a window longer than the sequence is exact
    # options the attention function refuses, on a cache update of layer 0 (prompt of 3 tokens)
    attn = model.model.layers[0].self_attn
    q, kv = torch.zeros(2, 8, 3, 8), torch.zeros(2, 2, 3, 8)
    cache = hf.TreeCache(model.config, max_cache_len=4)
    k, v = cache.update(kv, kv, 0)
    with pytest.raises(
        AttentionError,
        match=r"tree_decode attention, layer 0: attention_mask: expected the padding "
        r"mask \[2, 3\] .*, got \(2, 1, 3, 3\)",
    ):
        hf.tree_attention_forward(attn, q, k, v, torch.ones(2, 1, 3, 3, dtype=torch.bool))
    cache.reset()
    k, v = cache.update(kv, kv, 0)
    with pytest.raises(AttentionError, match=r"softcap: expected None"):
        hf.tree_attention_forward(attn, q, k, v, softcap=30.0)
    with pytest.raises(
        AttentionError,
        match=r"TreeCache: layout: expected one of \['round_robin', 'contiguous'\], "
        r"got 'striped'",
    ):
        hf.TreeCache(model.config, max_cache_len=4, layout="striped")
    with pytest.raises(AttentionError, match=r"TreeCache: max_cache_len: expected a positive int, got 0"):
        hf.TreeCache(model.config, max_cache_len=0)


def test_cache_misuse_raises(tf, model_dir):
    """A cache too short, beam search, and a model whose attention is not tree_decode: one clear error each."""
    from treecoll.attention import hf

    model = tf.LlamaForCausalLM.from_pretrained(model_dir).eval()
    kw = dict(pad_token_id=0, do_sample=False)
    with hf.attn_implementation(model):
        with pytest.raises(AttentionError, match=r"TreeCache: expected at most max_cache_len=12 positions, got 13"):
            model.generate(
                PROMPTS, max_new_tokens=5, past_key_values=hf.TreeCache(model.config, max_cache_len=12), **kw
            )
        with pytest.raises(AttentionError, match=r"TreeCache: reorder_cache \(beam search\): not supported"):
            model.generate(
                PROMPTS,
                max_new_tokens=3,
                num_beams=2,
                past_key_values=hf.TreeCache(model.config, max_cache_len=12),
                **kw,
            )
    assert model.config._attn_implementation == "sdpa"  # restored
    with pytest.raises(
        AttentionError,
        match=r"TreeCache: layer 0's keys were never taken by the 'tree_decode' "
        r"attention: expected a model with attn_implementation='tree_decode'",
    ):
        model.generate(PROMPTS, max_new_tokens=3, past_key_values=hf.TreeCache(model.config, max_cache_len=12), **kw)


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
