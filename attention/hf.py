"""Tree decoding for a user's own Hugging Face Llama model (optional; needs ``transformers``).

:func:`register` adds an attention implementation named ``"tree_decode"`` to
``transformers.AttentionInterface`` (transformers >= 4.48).  :func:`generate`
runs greedy decoding with it: the model's KV cache is replaced by a
:class:`~attention.kv_cache.ShardedKVCache` over the process group, so each
rank keeps only its share of the sequence:

* the model is called with ``use_cache=False`` and explicit ``position_ids``
  (the prompt once, then one token per step), so transformers keeps no cache
  of its own and hands the attention function the new tokens' (already
  rotated) keys and values;
* prompt (``q_len > 1``): causal attention over the prompt on every rank
  (``scaled_dot_product_attention``); each rank stores its share;
* decode (``q_len == 1``): the token's K/V are appended on the owning rank and
  attention runs through :func:`attention.tree_decode`.

Every rank of the group calls :func:`generate` with the same prompt and gets
the same tokens.  Prompts in a batch must have the same length (no padding).
Not exercised in this repository's CI when transformers is absent (its test
skips); ``pip install 'treecoll[hf]'`` to use it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from attention.kv_cache import DEFAULT_BLOCK_SIZE, ShardedKVCache
from topo.errors import AttentionError, MissingDependency

__all__ = ["register", "generate", "tree_attention_forward", "NAME"]

NAME = "tree_decode"
_SESSION: list = []


@dataclass
class _Session:
    cache: ShardedKVCache
    group: object
    tree: object
    topology: object
    first: bool = True


def _transformers():
    try:
        import transformers
    except ImportError:
        raise MissingDependency("transformers", "attention.hf (tree decoding for Hugging Face models)",
                                extra="hf") from None
    return transformers


def tree_attention_forward(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """The ``AttentionInterface`` function: ``query`` [B, Hq, q_len, D], ``key``/``value``
    [B, Hkv, q_len, D] (the new tokens only); returns ``([B, q_len, Hq, D], None)``."""
    from attention.tree_decode import tree_decode

    if not _SESSION:
        raise AttentionError("tree_decode attention: expected to run inside attention.hf.generate (it owns the "
                             "sharded KV cache), got a call outside it")
    s = _SESSION[-1]
    layer = int(module.layer_idx)
    batch, hq, q_len, _ = query.shape
    hkv = key.shape[1]
    k, v = key.transpose(1, 2), value.transpose(1, 2)  # [B, q_len, Hkv, D]
    if q_len > 1:
        s.cache.prefill(layer, k.to(s.cache.dtype), v.to(s.cache.dtype))
        rep = hq // hkv
        out = F.scaled_dot_product_attention(query, key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1),
                                             is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    s.cache.append(layer, k[:, 0].to(s.cache.dtype), v[:, 0].to(s.cache.dtype))
    kk, vv, kv_len = s.cache.shard(layer)
    out = tree_decode(query[:, :, 0], kk, vv, kv_len=kv_len, group=s.group, tree=s.tree, topology=s.topology,
                      scale=scaling, check=s.first and layer == 0)
    return out.to(query.dtype).unsqueeze(1), None


def register() -> str:
    """Register :func:`tree_attention_forward` as ``"tree_decode"``; returns the name."""
    tf = _transformers()
    iface = getattr(tf, "AttentionInterface", None)
    if iface is None:
        raise MissingDependency("transformers>=4.48", "attention.hf (AttentionInterface)", extra="hf")
    iface.register(NAME, tree_attention_forward)
    try:  # transformers >= 4.53 builds masks per implementation; ours needs none
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        pass
    else:
        AttentionMaskInterface.register(NAME, _no_mask)
    return NAME


def _no_mask(*args, **kwargs):
    """Mask function for ``"tree_decode"``: prefill is causal by construction and
    a decode query sees every cached key, so no mask tensor is built."""
    return None


@contextlib.contextmanager
def _session(s: _Session):
    _SESSION.append(s)
    try:
        yield s
    finally:
        _SESSION.pop()


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, new_tokens: int, *, group=None, tree="auto", topology=None,
             block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """Greedy decoding of a Hugging Face Llama-style ``model`` with a sharded KV cache.

    ``input_ids`` int [batch, seq] (same length prompts); returns int64 [batch, new_tokens].
    """
    from attention.dist import group_info

    register()
    cfg = model.config
    previous = getattr(cfg, "_attn_implementation", None)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(NAME)
    else:
        cfg._attn_implementation = NAME
    rank, world = group_info(group)
    batch, seq = input_ids.shape
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype = next(model.parameters()).dtype
    cache = ShardedKVCache(layers=cfg.num_hidden_layers, batch=batch,
                           kv_heads=getattr(cfg, "num_key_value_heads", cfg.num_attention_heads), head_dim=head_dim,
                           max_seq_len=seq + new_tokens, rank=rank, world=world, block_size=block_size,
                           dtype=dtype if dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float32)
    out = []
    try:
        with _session(_Session(cache, group, tree, topology)) as s:
            pos = torch.arange(seq).unsqueeze(0).expand(batch, seq)
            logits = model(input_ids=input_ids, position_ids=pos, use_cache=False).logits[:, -1]
            for step in range(new_tokens):
                nxt = logits.argmax(-1)
                out.append(nxt)
                if step + 1 == new_tokens:
                    break
                pos = torch.full((batch, 1), seq + step)
                logits = model(input_ids=nxt.unsqueeze(1), position_ids=pos, use_cache=False).logits[:, -1]
                s.first = False
    finally:
        if previous is not None:
            if hasattr(model, "set_attn_implementation"):
                model.set_attn_implementation(previous)
            else:
                cfg._attn_implementation = previous
    return torch.stack(out, 1)
