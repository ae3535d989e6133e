"""Tree decoding for a user's own Hugging Face Llama-style model (optional extra: ``transformers``).

Enabling it (every rank of a ``torch.distributed`` group runs the same lines)::

    import treecoll.attention.hf as hf
    hf.register()                        # adds "tree_decode" to transformers.AttentionInterface
    model = LlamaForCausalLM.from_pretrained(path).eval()     # the whole model on every rank
    tokens = hf.generate(model, input_ids, 32)                # int64 [batch, 32], the same on every rank

:func:`register` adds the attention implementation named :data:`NAME`
(``"tree_decode"``) to ``transformers.AttentionInterface`` (written for the
transformers >= 4.49 API: ``AttentionInterface``, ``logits_to_keep``; tested
with 5.23.0 only).  After it, ``from_pretrained(..., attn_implementation=
"tree_decode")`` and ``model.set_attn_implementation("tree_decode")`` accept the
name; the attention function only works inside :func:`generate`, which owns the
sharded KV cache (it switches the model to ``"tree_decode"`` itself and restores
the previous implementation afterwards, so a model built with ``"sdpa"`` or
``"eager"`` works too).

Cache layout: transformers keeps no cache (the model is called with
``use_cache=False`` and explicit ``position_ids``); each rank holds an
:class:`~attention.kv_cache.ShardedKVCache`: per layer ``k``/``v``
``[batch, capacity, kv_heads, head_dim]`` in the model's dtype, holding the
rank's round-robin blocks of ``block_size`` positions (position ``p`` lives on
rank ``(p // block_size) % P``; keys are cached after the rotary embedding, so
their order does not matter).  With ``block_size`` larger than the context,
everything sits on rank 0 and the other ranks contribute empty states.

What runs on each rank:

* every rank holds all weights and runs every layer's projections, rotary
  embedding and MLP on the same tokens (replicated; the KV cache is what grows
  with the context);
* prefill (the prompt, one forward): causal attention over the whole prompt,
  computed locally with ``scaled_dot_product_attention`` (no communication, the
  same on every rank, like :meth:`treecoll.attention.model.LlamaModel.prefill`); the rank
  then keeps only its share of every layer's K/V;
* decode (one token per step): the token's K/V are appended on the rank that
  owns the position; attention runs through :func:`treecoll.attention.tree_decode` over
  the local shards (one tree reduction of the packed fp32 state per layer per
  step, then a broadcast), or a baseline with the same signature
  (``method="ring"`` / ``"allreduce3"``).  Every rank gets the same logits and
  picks the same greedy token, so the ranks stay in lock step.

Limits.  Greedy decoding only (no sampling, no stop on EOS).  Prompts of
different lengths are right-padded ``input_ids`` with ``lengths=``; there is no
``attention_mask`` (one that reaches the attention function raises).  These
raise a clear :class:`~topo.errors.AttentionError` instead of giving a wrong
answer: a sliding window shorter than prompt + new tokens, attention logit
soft-capping, attention sinks, attention dropout (a model in training mode with
``attention_dropout > 0``), non-causal attention modules, a second token per
step.  The model must be a decoder whose attention layers go through
``AttentionInterface`` with a ``layer_idx`` (tested: Llama, and Mistral with a
window longer than the sequence).  Prefill materialises the whole prompt's K/V
and attention on every rank (as the replicated model does anyway); only the
cache that grows during decoding is sharded.  Every rank must load the same
weights (not checked); prompts, lengths and sizes are checked to agree across
ranks first (one small all-gather), so ranks that disagree raise instead of
hanging or diverging.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from treecoll.attention.kv_cache import DEFAULT_BLOCK_SIZE, ShardedKVCache
from treecoll.topo.errors import AttentionError, MissingDependency

__all__ = ["register", "generate", "tree_attention_forward", "NAME"]

#: Name of the attention implementation (``attn_implementation=NAME``).
NAME = "tree_decode"


@dataclass
class _Session:
    cache: ShardedKVCache
    group: object
    tree: object
    topology: object
    attend: object  # tree_decode or a baseline with its signature
    lengths: torch.Tensor  # int64 [batch], prompt lengths
    prefill: bool = True
    check: bool = True  # check rank agreement in the first decode call


_SESSION: contextvars.ContextVar = contextvars.ContextVar("attention_hf_session", default=None)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise MissingDependency("transformers", "treecoll.attention.hf (tree decoding for Hugging Face models)",
                                extra="hf") from None
    return transformers


def _unsupported(module, attention_mask, dropout, kwargs, kv_len: int):
    """The first unsupported option of an attention call, as a message (None if all fine)."""
    if attention_mask is not None:
        return ("attention_mask: expected None (prompts of different lengths are right-padded input_ids with "
                f"lengths=...), got a {type(attention_mask).__name__}")
    if dropout:
        return f"dropout: expected 0.0 (call model.eval()), got {dropout}"
    if not getattr(module, "is_causal", True):
        return f"{type(module).__name__}: expected a causal (decoder) attention module, got is_causal=False"
    window = kwargs.get("sliding_window")
    if window is not None and kv_len > int(window):
        return f"sliding_window: expected none or >= the sequence length {kv_len}, got {window}"
    for key in ("softcap", "s_aux", "sinks"):
        if kwargs.get(key) is not None:
            return f"{key}: expected None (not supported by tree decoding), got {kwargs[key]!r}"
    return None


def tree_attention_forward(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """The ``AttentionInterface`` function registered as ``"tree_decode"``.

    ``query`` [batch, q_heads, q_len, head_dim], ``key``/``value``
    [batch, kv_heads, q_len, head_dim]: the new tokens only, rotary embedding
    applied (transformers keeps no cache).  Returns ``(out, None)`` with ``out``
    [batch, q_len, q_heads, head_dim] in ``query``'s dtype.  Prefill: causal
    attention over the prompt, this rank stores its share; decode (``q_len`` 1):
    append on the owning rank, then the session's decode method over the shards.
    """
    s = _SESSION.get()
    if s is None:
        raise AttentionError(f"{NAME} attention: expected a call inside treecoll.attention.hf.generate (it owns "
                             f"the sharded KV cache), got a model call outside it; use "
                             f"treecoll.attention.hf.generate(model, input_ids, new_tokens)")
    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int):
        raise AttentionError(f"{NAME} attention: {type(module).__name__}: expected an int layer_idx, got {layer!r}")
    batch, hq, q_len, _ = query.shape
    hkv = key.shape[1]
    total = int(s.cache.lengths(layer).max()) + (0 if s.prefill else 1)
    problem = _unsupported(module, attention_mask, dropout, kwargs, max(total, q_len))
    if problem:
        raise AttentionError(f"{NAME} attention, layer {layer}: {problem}")
    k, v = key.transpose(1, 2), value.transpose(1, 2)  # [B, q_len, Hkv, D]
    if s.prefill:
        s.cache.prefill(layer, k.to(s.cache.dtype), v.to(s.cache.dtype), s.lengths)
        rep = hq // hkv
        out = F.scaled_dot_product_attention(query, key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1),
                                             is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    if q_len != 1:
        raise AttentionError(f"{NAME} attention, layer {layer}: expected one new token per sequence after the "
                             f"prompt, got {q_len}")
    s.cache.append(layer, k[:, 0].to(s.cache.dtype), v[:, 0].to(s.cache.dtype))
    kk, vv, kv_len = s.cache.shard(layer)
    out = s.attend(query[:, :, 0], kk, vv, kv_len=kv_len, group=s.group, tree=s.tree, topology=s.topology,
                   scale=scaling, check=s.check and layer == 0)
    return out.to(query.dtype).unsqueeze(1), None


def register() -> str:
    """Register :func:`tree_attention_forward` in ``transformers.AttentionInterface``
    as :data:`NAME`; returns the name.  Idempotent.  No mask function is registered:
    transformers then builds no mask for this implementation (prefill is causal by
    construction, a decode query sees every cached key)."""
    tf = _transformers()
    iface = getattr(tf, "AttentionInterface", None)
    if iface is None:
        raise MissingDependency("transformers>=4.49", "treecoll.attention.hf (transformers.AttentionInterface)",
                                extra="hf")
    iface.register(NAME, tree_attention_forward)
    return NAME


@contextlib.contextmanager
def _session(s: _Session):
    token = _SESSION.set(s)
    try:
        yield s
    finally:
        _SESSION.reset(token)


def _set_impl(model, name):
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # transformers < 4.54
        model.config._attn_implementation = name


def _check_config(cfg, total: int) -> None:
    """Reject sliding-window models whose window is shorter than ``total`` positions."""
    window = getattr(cfg, "sliding_window", None)
    if window is None or total <= int(window) or getattr(cfg, "use_sliding_window", True) is False:
        return
    types = getattr(cfg, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return
    raise AttentionError(f"{NAME}: config.sliding_window: expected none or >= prompt + new tokens = {total}, got "
                         f"{window}; tree decoding attends to every cached key (no sliding windows)")


def _digest(x: torch.Tensor) -> int:
    """62-bit fingerprint of an integer tensor's values (equal on ranks with equal tensors)."""
    data = x.detach().to(torch.int64).contiguous().numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 2


@torch.no_grad()
def generate(model, input_ids: torch.Tensor, new_tokens: int, *, lengths=None, group=None, tree="auto",
             topology=None, method: str = "tree", block_size: int = DEFAULT_BLOCK_SIZE,
             return_logits: bool = False):
    """Greedy decoding of a Hugging Face decoder ``model`` with the KV cache sharded over ``group``.

    Parameters
    ----------
    model : a transformers causal LM (``LlamaForCausalLM`` and the like), the same
        weights on every rank.
    input_ids : int [batch, seq], right-padded prompts (the same on every rank).
    new_tokens : tokens to generate per sequence (>= 0; no stop on EOS).
    lengths : valid prompt tokens per sequence, [batch] ints in [1, seq] (default seq).
    group, tree, topology : as :func:`treecoll.attention.tree_decode` (no group: one process).
    method : ``"tree"`` (:func:`treecoll.attention.tree_decode`), ``"ring"`` or ``"allreduce3"``.
    block_size : positions per round-robin block of the cache.
    return_logits : also return the float32 logits [batch, new_tokens, vocab] that
        picked each token.

    Returns
    -------
    int64 [batch, new_tokens] (and the logits with ``return_logits``), equal on every rank.
    """
    from treecoll.attention.baselines import METHODS
    from treecoll.attention.baselines import method as decode_method
    from treecoll.attention.dist import check_same_signature
    from treecoll.collectives.group import group_info

    register()
    attend = decode_method(method)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point() \
            or input_ids.shape[1] == 0:
        got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise AttentionError(f"{NAME} generate: input_ids: expected an int tensor [batch, seq] with seq >= 1, "
                             f"got {got}")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 0:
        raise AttentionError(f"{NAME} generate: new_tokens: expected an int >= 0, got {new_tokens!r}")
    batch, seq = input_ids.shape
    lengths = torch.full((batch,), seq, dtype=torch.int64) if lengths is None \
        else torch.as_tensor(lengths, dtype=torch.int64).reshape(-1)
    if lengths.numel() != batch or int(lengths.min()) < 1 or int(lengths.max()) > seq:
        raise AttentionError(f"{NAME} generate: lengths: expected {batch} values in [1, {seq}], got {lengths.tolist()}")
    cfg = model.config
    _check_config(cfg, int(lengths.max()) + new_tokens)
    info = group_info(group, single_process=True)
    rank, world = info.rank, info.size
    check_same_signature(
        [batch, seq, new_tokens, _digest(input_ids), _digest(lengths), cfg.num_hidden_layers, block_size,
         list(METHODS).index(method)],
        ["batch", "prompt length", "new_tokens", "input_ids fingerprint", "lengths fingerprint", "num_hidden_layers",
         "block_size", "method"], f"{NAME} generate", group)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype = next(model.parameters()).dtype
    cache = ShardedKVCache(layers=cfg.num_hidden_layers, batch=batch,
                           kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
                           head_dim=head_dim, max_seq_len=int(lengths.max()) + new_tokens, rank=rank, world=world,
                           block_size=block_size,
                           dtype=dtype if dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float32)
    previous = getattr(cfg, "_attn_implementation", None)
    rows = torch.arange(batch)
    tokens, logits_out = [], []
    _set_impl(model, NAME)
    try:
        with _session(_Session(cache, group, tree, topology, attend, lengths)) as s:
            keep, where = torch.unique(lengths - 1, return_inverse=True)  # logits at each last prompt token only
            pos = torch.arange(seq).unsqueeze(0).expand(batch, seq)
            logits = model(input_ids=input_ids, position_ids=pos, use_cache=False, logits_to_keep=keep).logits
            # a model that ignores logits_to_keep returns every position
            logits = logits[rows, where if logits.shape[1] == keep.numel() else lengths - 1].float()
            s.prefill = False
            for step in range(new_tokens):
                nxt = logits.argmax(-1)
                tokens.append(nxt)
                logits_out.append(logits)
                if step + 1 == new_tokens:
                    break
                pos = (lengths + step).unsqueeze(1)
                logits = model(input_ids=nxt.unsqueeze(1), position_ids=pos, use_cache=False).logits[:, -1].float()
                s.check = False
    finally:
        if previous is not None:
            _set_impl(model, previous)
    out = torch.stack(tokens, 1) if tokens else torch.zeros(batch, 0, dtype=torch.int64)
    if not return_logits:
        return out
    vocab = logits.shape[-1]
    return out, torch.stack(logits_out, 1) if logits_out else torch.zeros(batch, 0, vocab)
