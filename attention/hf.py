"""Tree decoding inside Hugging Face ``model.generate()`` (optional extra: ``transformers``).

Every rank of a ``torch.distributed`` group runs the same lines::

    import treecoll.attention.hf as hf
    hf.register()                        # "tree_decode" in transformers.AttentionInterface
    model = LlamaForCausalLM.from_pretrained(path, attn_implementation="tree_decode").eval()
    cache = hf.TreeCache(model.config, max_cache_len=prompt_len + 32)   # this rank's shard of the KV cache
    out = model.generate(input_ids, attention_mask=mask, past_key_values=cache, max_new_tokens=32)

Greedy search and sampling (``do_sample=True``; seed every rank alike, e.g.
``torch.manual_seed(s)`` before the call, and every rank draws the same tokens),
EOS stops, ``max_new_tokens`` / ``max_length``, streamers and batches with left
padding and an ``attention_mask`` go through ``generate`` as usual: the tree is
only in the attention.  :func:`generate` is the greedy shortcut with right-padded
prompts and ``lengths`` (it builds the cache and calls ``model.generate``).

:class:`TreeCache` is a ``transformers`` :class:`~transformers.Cache`: one layer
object per model layer, each holding this rank's shard of that layer's keys and
values in an :class:`~treecoll.attention.kv_cache.ShardedKVCache`
(``[batch, capacity, kv_heads, head_dim]``, the model's dtype).  Which positions a
rank holds is an argument, ``layout``:

* ``"round_robin"`` (default): blocks of ``block_size`` tokens dealt to the ranks
  in turn (block ``j`` on rank ``j % P``: every rank holds the same share to within
  a block at every length);
* ``"contiguous"``: rank ``r`` holds the ``r``-th of ``P`` equal ranges of
  ``max_cache_len`` positions (round-robin blocks of ``ceil(max_cache_len / P)``
  tokens, one round): the first ranks fill first.

Only the tokens the attention mask keeps are stored: sequence ``b``'s ``j``-th
unmasked token is its position ``j`` in the layout, so left padding costs no
cache space and needs no mask at decode time (keys are cached after the rotary
embedding, so their order does not matter to attention).

What each rank computes:

* every rank holds all weights and runs the projections, rotary embedding and
  MLP of every layer on the same tokens (replicated);
* prefill (the first forward, the whole prompt): every rank computes the whole
  prompt's K/V, as its layers need the prompt's hidden states anyway, and causal
  attention over it with the padding mask, locally
  (``scaled_dot_product_attention``, no communication, the same on every rank);
  each rank then keeps only its layout's share of every layer's K/V.  Only the
  cache is sharded, so prefill costs every rank the full prompt's compute (no
  sequence-parallel prefill);
* decode (one token per sequence per forward): the token's K/V are stored on the
  rank that owns its position; attention runs through
  :func:`treecoll.attention.tree_decode` over the shards (the packed float32 state of each
  layer combined by the method the cost model picks: the tree reduction and broadcast, one
  all-gather, or three all-reduces), or a baseline with the same signature
  (``method="ring"`` / ``"allreduce3"``).  Every rank gets the same
  logits, so the same seed draws the same tokens on every rank.

Checks: the first forward all-gathers a small signature (batch, prompt length,
layers, fingerprints of the attention mask and the position ids) and the first
decode step the decode inputs' shapes, so ranks given different inputs raise
instead of hanging (:func:`generate` also compares the prompts' token ids).
These raise a clear :class:`~treecoll.topo.errors.AttentionError` instead of a
wrong answer: a sliding window shorter than the sequence, attention logit
soft-capping, attention sinks, attention dropout (a model in training mode with
``attention_dropout > 0``), non-causal attention, a prepared 4D mask, more than
one new token per forward after the prompt (assisted decoding), beam search
(``reorder_cache``), a cache longer than ``max_cache_len``, and a model whose
attention is not ``"tree_decode"`` (the cache notices that the attention never
took its keys).  The model must be a decoder whose attention layers call
``past_key_values.update`` and then ``AttentionInterface`` with a ``layer_idx``
(tested: Llama, Mistral with a window longer than the sequence).  Written for
the transformers 5 ``Cache`` API (``CacheLayerMixin``, ``AttentionMaskInterface``);
tested with 5.23.0.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from treecoll.attention.kv_cache import DEFAULT_BLOCK_SIZE, ShardedKVCache
from treecoll.topo.errors import AttentionError, MissingDependency

try:
    from transformers.cache_utils import Cache as _Cache
    from transformers.cache_utils import CacheLayerMixin as _LayerBase
except ImportError:  # the optional extra is missing: TreeCache() and register() say how to install it
    _Cache = _LayerBase = object

__all__ = [
    "register",
    "generate",
    "tree_attention_forward",
    "padding_mask",
    "attn_implementation",
    "TreeCache",
    "NAME",
    "LAYOUTS",
]

#: Name of the attention implementation (``attn_implementation=NAME``).
NAME = "tree_decode"
#: How a :class:`TreeCache` spreads positions over the ranks (module docstring).
LAYOUTS = ("round_robin", "contiguous")

#: (cache, layer, keys) of the last TreeCache.update, taken by the next attention call of that layer
_PENDING: contextvars.ContextVar = contextvars.ContextVar("treecoll_hf_pending", default=None)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise MissingDependency(
            "transformers", "treecoll.attention.hf (tree decoding for Hugging Face models)", extra="hf"
        ) from None
    return transformers


# ------------------------------------------------------------------ the cache


class _ShardLayer(_LayerBase):
    """One model layer's shard: this rank's keys and values of the unmasked tokens
    (a one-layer :class:`ShardedKVCache`, created at the first update), and the
    number of positions the model has run (``get_seq_length``, masked ones included)."""

    is_sliding = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, owner: TreeCache):
        super().__init__()
        self.owner = owner
        self.store: ShardedKVCache | None = None
        self.seen = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        o = self.owner
        batch, kv_heads, _, head_dim = key_states.shape
        dtype = (
            key_states.dtype if key_states.dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.float32
        )
        self.store = ShardedKVCache(
            layers=1,
            batch=batch,
            kv_heads=kv_heads,
            head_dim=head_dim,
            max_seq_len=o.max_cache_len,
            rank=o.rank,
            world=o.world,
            block_size=o.block_size,
            dtype=dtype,
            device=key_states.device,
        )
        self.dtype, self.device = dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.shape[0] != self.store.batch:
            raise AttentionError(
                f"TreeCache: batch: expected {self.store.batch} sequences (the first forward's), "
                f"got {key_states.shape[0]}; use a new cache (or cache.reset()) for a new batch"
            )
        if self.seen + key_states.shape[2] > self.owner.max_cache_len:
            raise AttentionError(
                f"TreeCache: expected at most max_cache_len={self.owner.max_cache_len} positions, "
                f"got {self.seen + key_states.shape[2]}; build the cache with a larger max_cache_len "
                f"(prompt length + max_new_tokens)"
            )
        self.seen += key_states.shape[2]
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return self.owner.max_cache_len

    def reset(self) -> None:
        if self.store is not None:
            self.store.reset()
        self.seen = 0

    def _unsupported(self, what: str):
        raise AttentionError(
            f"TreeCache: {what}: not supported by tree decoding (the cache is sharded over the "
            f"ranks); use greedy search or sampling with num_beams=1 and no assistant model"
        )

    def reorder_cache(self, beam_idx):
        self._unsupported("reorder_cache (beam search)")

    def crop(self, tokens_to_remove: int):
        self._unsupported("crop (assisted decoding)")

    def batch_repeat_interleave(self, repeats: int):
        self._unsupported("batch_repeat_interleave")

    def batch_select_indices(self, indices):
        self._unsupported("batch_select_indices")

    def offload(self):
        self._unsupported("offloading")


class TreeCache(_Cache):
    """This rank's shard of every layer's KV cache, for ``model.generate(..., past_key_values=cache)``
    with ``attn_implementation="tree_decode"`` (module docstring).

    Parameters
    ----------
    config : the model's config (``num_hidden_layers``; a sliding window shorter
        than ``max_cache_len`` is refused).
    max_cache_len : positions the cache must hold: prompt length (padding included)
        + new tokens.  Each rank allocates its share of it at the first forward.
    group : torch.distributed process group (default: the default group; a process
        without torch.distributed is a group of one).
    layout : ``"round_robin"`` (blocks of ``block_size`` tokens dealt in turn) or
        ``"contiguous"`` (one range of ``ceil(max_cache_len / P)`` positions per rank).
    block_size : tokens per round-robin block (``layout="round_robin"`` only).
    tree, topology : as :func:`treecoll.attention.tree_decode` (``"auto"``: the
        group's topology's two-level tree).
    method : ``"auto"`` (:func:`treecoll.attention.tree_decode` as it runs by default: the combine
        the cost model picks), ``"tree"``, ``"gather"``, ``"ring"`` or ``"allreduce3"``
        (:func:`treecoll.attention.baselines.method`).
    check : check that the ranks agree at the first forward and the first decode step.
    """

    def __init__(
        self,
        config: Any,
        *,
        max_cache_len: int,
        group: Any = None,
        layout: str = "round_robin",
        block_size: int = DEFAULT_BLOCK_SIZE,
        tree: Any = "auto",
        topology: Any = None,
        method: str = "auto",
        check: bool = True,
    ):
        from treecoll.attention.baselines import method as decode_method
        from treecoll.collectives.group import group_info

        register()
        if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 1:
            raise AttentionError(f"TreeCache: max_cache_len: expected a positive int, got {max_cache_len!r}")
        if layout not in LAYOUTS:
            raise AttentionError(f"TreeCache: layout: expected one of {list(LAYOUTS)}, got {layout!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise AttentionError(f"TreeCache: block_size: expected a positive int, got {block_size!r}")
        self.attend = decode_method(method)
        layers = getattr(config, "num_hidden_layers", None)
        if not isinstance(layers, int) or layers < 1:
            raise AttentionError(f"TreeCache: config.num_hidden_layers: expected a positive int, got {layers!r}")
        check_window(config, max_cache_len)
        info = group_info(group, single_process=True)
        self.rank, self.world = info.rank, info.size
        self.group, self.tree, self.topology, self.method, self.layout = group, tree, topology, method, layout
        self.max_cache_len = max_cache_len
        self.block_size = -(-max_cache_len // self.world) if layout == "contiguous" else block_size
        self.check = check
        self._decode_checked = not check
        self._prefill_checked = not check
        super().__init__(layers=[_ShardLayer(self) for _ in range(layers)])

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Count the new positions of ``layer_idx`` and hand the new keys/values to the
        ``tree_decode`` attention (which stores this rank's share: it knows the mask).
        ``key_states``/``value_states`` [batch, kv_heads, new, head_dim]; returns them."""
        pending = _PENDING.get()
        if pending is not None and pending[0] is self:
            _PENDING.set(None)
            raise AttentionError(
                f"TreeCache: layer {pending[1]}'s keys were never taken by the {NAME!r} attention: "
                f"expected a model with attn_implementation={NAME!r} (after "
                f"treecoll.attention.hf.register()), got another attention implementation"
            )
        if not isinstance(layer_idx, int) or not 0 <= layer_idx < len(self.layers):
            raise AttentionError(
                f"TreeCache: layer_idx: expected an int in [0, {len(self.layers) - 1}], got {layer_idx!r}"
            )
        keys, values = self.layers[layer_idx].update(key_states, value_states)
        _PENDING.set((self, layer_idx, keys))
        return keys, values

    def reset(self) -> None:
        """Forget every sequence (buffers kept); the cache can serve a new generate call."""
        super().reset()
        self._decode_checked = self._prefill_checked = not self.check

    def shard_lengths(self, layer_idx: int = 0) -> torch.Tensor:
        """This rank's stored tokens per sequence in ``layer_idx``: int64 [batch] (empty before the first forward)."""
        store = self.layers[layer_idx].store
        return torch.zeros(0, dtype=torch.int64) if store is None else store.kv_len(0)


def check_window(config: Any, total: int) -> None:
    """Reject sliding-window models whose window is shorter than ``total`` positions."""
    window = getattr(config, "sliding_window", None)
    if window is None or total <= int(window) or getattr(config, "use_sliding_window", True) is False:
        return
    types = getattr(config, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return
    raise AttentionError(
        f"{NAME}: config.sliding_window: expected none or >= prompt + new tokens = {total}, got "
        f"{window}; tree decoding attends to every cached key (no sliding windows)"
    )


# ------------------------------------------------------------------ the attention


def padding_mask(
    batch_size: int, kv_length: int, kv_offset: int = 0, attention_mask: torch.Tensor | None = None, **kwargs: Any
) -> torch.Tensor | None:
    """The ``AttentionMaskInterface`` function registered as ``"tree_decode"``: the 2D
    padding mask, bool [batch, kv_length] (True = a real token), or None when there is
    none.  The attention function applies causality itself.

    >>> padding_mask(2, 3, attention_mask=torch.tensor([[0, 1], [1, 1]])).tolist()
    [[False, True, False], [True, True, False]]
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise AttentionError(
            f"{NAME} attention: attention_mask: expected a 2D padding mask [batch, length], got "
            f"{attention_mask.dim()}D; pass the tokenizer's attention_mask"
        )
    mask = attention_mask.to(torch.bool)[:, kv_offset : kv_offset + kv_length]
    if mask.shape[1] < kv_length:
        mask = F.pad(mask, (0, kv_length - mask.shape[1]))
    return mask


def _unsupported(module, dropout, kwargs, kv_len: int):
    """The first unsupported option of an attention call, as a message (None if all fine)."""
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


def _taken(layer: int):
    """The cache whose update handed over ``layer``'s keys (and forget the hand-over)."""
    pending = _PENDING.get()
    _PENDING.set(None)
    if pending is None or pending[1] != layer:
        raise AttentionError(
            f"{NAME} attention, layer {layer}: expected the keys of a TreeCache update (pass "
            f"past_key_values=treecoll.attention.hf.TreeCache(model.config, max_cache_len=...) to "
            f"model.generate or the model), got a call without one"
        )
    return pending


def tree_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` function registered as ``"tree_decode"``.

    ``query`` [batch, q_heads, new, head_dim], ``key``/``value`` [batch, kv_heads,
    new, head_dim]: the new tokens (rotary embedding applied), as
    :meth:`TreeCache.update` returned them; ``attention_mask``: :func:`padding_mask`'s
    bool [batch, seen + new] or None.  Returns ``(out, None)`` with ``out`` [batch,
    new, q_heads, head_dim] in ``query``'s dtype.  First forward: causal attention
    over the new tokens, locally, then this rank stores its share; later forwards
    (one new token): store it on the rank that owns it, then the cache's decode
    method over the shards.
    """
    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int):
        raise AttentionError(f"{NAME} attention: {type(module).__name__}: expected an int layer_idx, got {layer!r}")
    cache, _, keys = _taken(layer)
    if keys is not key:
        raise AttentionError(
            f"{NAME} attention, layer {layer}: expected the keys TreeCache.update returned, got "
            f"other tensors (a model that changes the keys after caching them is not supported)"
        )
    shard = cache.layers[layer]
    batch, _, new, _ = query.shape
    problem = _unsupported(module, dropout, kwargs, shard.seen)
    if problem:
        raise AttentionError(f"{NAME} attention, layer {layer}: {problem}")
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.shape != (batch, shard.seen)):
        raise AttentionError(
            f"{NAME} attention, layer {layer}: attention_mask: expected the padding mask "
            f"[{batch}, {shard.seen}] (a 2D attention_mask given to generate), got "
            f"{tuple(attention_mask.shape)}"
        )
    valid = (
        torch.ones(batch, shard.seen, dtype=torch.bool, device=query.device)
        if attention_mask is None
        else attention_mask.to(torch.bool)
    )
    if shard.seen == new:
        _check_prefill(cache, layer, valid, kwargs.get("position_ids"))
        return _prefill(shard, query, key, value, valid, scaling), None
    if new != 1:
        raise AttentionError(
            f"{NAME} attention, layer {layer}: expected one new token per sequence after the "
            f"first forward, got {new} (assisted or chunked decoding is not supported)"
        )
    return _decode(cache, layer, query, key, value, valid, scaling), None


def _digest(x) -> int:
    """62-bit fingerprint of an integer tensor's values (equal on ranks with equal tensors; -1 for None)."""
    if x is None:
        return -1
    data = x.detach().to(torch.int64).cpu().contiguous().numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 2


def _check_prefill(cache: TreeCache, layer: int, valid: torch.Tensor, position_ids) -> None:
    if cache._prefill_checked or layer != 0:
        return
    from treecoll.attention.dist import check_same_signature

    cache._prefill_checked = True
    check_same_signature(
        [
            valid.shape[0],
            valid.shape[1],
            len(cache.layers),
            cache.max_cache_len,
            cache.block_size,
            _digest(valid),
            _digest(position_ids),
        ],
        [
            "batch",
            "prompt length",
            "layers",
            "max_cache_len",
            "block size",
            "attention_mask fingerprint",
            "position_ids fingerprint",
        ],
        f"{NAME} prefill",
        cache.group,
    )


def _prefill(shard: _ShardLayer, query, key, value, valid, scaling):
    """Causal attention over the prompt (bool ``valid`` [batch, n]: the padding mask),
    computed locally; stores this rank's share of the unmasked tokens."""
    batch, hq, n, _ = query.shape
    hkv = key.shape[1]
    counts = valid.sum(1).cpu()  # the cache keeps its lengths on the host
    # unmasked tokens first, in order (a stable sort of "masked" flags): the j-th real token at slot j
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    gather = order[:, None, :, None].expand(batch, hkv, n, key.shape[-1])
    packed_k = key.gather(2, gather).transpose(1, 2).to(shard.store.dtype)
    packed_v = value.gather(2, gather).transpose(1, 2).to(shard.store.dtype)
    shard.store.prefill(0, packed_k, packed_v, counts)
    causal = torch.ones(n, n, dtype=torch.bool, device=query.device).tril()
    # a masked query row sees itself only (finite, and never seen by a real token)
    mask = (causal & valid[:, None, :]) | torch.eye(n, dtype=torch.bool, device=query.device)
    rep = hq // hkv
    out = F.scaled_dot_product_attention(
        query, key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1), attn_mask=mask[:, None], scale=scaling
    )
    return out.transpose(1, 2).contiguous()


def _decode(cache: TreeCache, layer: int, query, key, value, valid, scaling):
    """Store the new token on its owner, then attend over every rank's shard."""
    store = cache.layers[layer].store
    held, valid = store.lengths(0), valid.cpu()  # one small copy per layer and step on a GPU
    if not torch.equal(valid[:, :-1].sum(1), held):
        raise AttentionError(
            f"{NAME} attention, layer {layer}: attention_mask: expected the earlier positions' "
            f"mask unchanged ({held.tolist()} real tokens per sequence), got "
            f"{valid[:, :-1].sum(1).tolist()}"
        )
    store.append(0, key[:, :, 0].to(store.dtype), value[:, :, 0].to(store.dtype), active=valid[:, -1])
    k, v, kv_len = store.shard(0)
    check = not cache._decode_checked and layer == 0
    cache._decode_checked = cache._decode_checked or check
    out = cache.attend(
        query[:, :, 0],
        k,
        v,
        kv_len=kv_len,
        group=cache.group,
        tree=cache.tree,
        topology=cache.topology,
        scale=scaling,
        check=check,
    )
    return out.to(query.dtype).unsqueeze(1)


def register() -> str:
    """Register :func:`tree_attention_forward` in ``transformers.AttentionInterface``
    and :func:`padding_mask` in ``transformers.masking_utils.AttentionMaskInterface``
    as :data:`NAME`; returns the name.  Idempotent."""
    tf = _transformers()
    iface = getattr(tf, "AttentionInterface", None)
    masks = getattr(tf, "masking_utils", None)
    if iface is None or _Cache is object or not hasattr(masks, "AttentionMaskInterface"):
        raise MissingDependency("transformers>=5", "treecoll.attention.hf (AttentionInterface, Cache)", extra="hf")
    iface.register(NAME, tree_attention_forward)
    masks.AttentionMaskInterface.register(NAME, padding_mask)
    return NAME


@contextlib.contextmanager
def attn_implementation(model: torch.nn.Module, name: str = NAME) -> Iterator[torch.nn.Module]:
    """Run the block with ``model``'s attention switched to ``name`` (restored afterwards)."""
    previous = getattr(model.config, "_attn_implementation", None)
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        if previous is not None and previous != name:
            model.set_attn_implementation(previous)


# ------------------------------------------------------------------ greedy shortcut


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    new_tokens: int,
    *,
    lengths: Any = None,
    group: Any = None,
    tree: Any = "auto",
    topology: Any = None,
    method: str = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
    layout: str = "round_robin",
    return_logits: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding of ``new_tokens`` tokens (no stop on EOS) with a :class:`TreeCache`
    through ``model.generate``.

    Parameters
    ----------
    model : a transformers causal LM (``LlamaForCausalLM`` and the like), the same
        weights on every rank; its attention is switched to ``"tree_decode"`` for
        the call and restored afterwards.
    input_ids : int [batch, seq], right-padded prompts (the same on every rank).
    new_tokens : tokens to generate per sequence (>= 0).
    lengths : valid prompt tokens per sequence, [batch] ints in [1, seq] (default seq).
    group, tree, topology, method, block_size, layout : as :class:`TreeCache`.
    return_logits : also return the float32 logits [batch, new_tokens, vocab] that
        picked each token.

    Returns
    -------
    int64 [batch, new_tokens] (and the logits with ``return_logits``), equal on every rank.
    """
    from treecoll.attention.baselines import METHODS
    from treecoll.attention.dist import check_same_signature

    tf = _transformers()
    if (
        not isinstance(input_ids, torch.Tensor)
        or input_ids.dim() != 2
        or input_ids.is_floating_point()
        or input_ids.shape[1] == 0
    ):
        got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise AttentionError(
            f"{NAME} generate: input_ids: expected an int tensor [batch, seq] with seq >= 1, got {got}"
        )
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 0:
        raise AttentionError(f"{NAME} generate: new_tokens: expected an int >= 0, got {new_tokens!r}")
    batch, seq = input_ids.shape
    lengths = (
        torch.full((batch,), seq, dtype=torch.int64)
        if lengths is None
        else torch.as_tensor(lengths, dtype=torch.int64).reshape(-1)
    )
    if lengths.numel() != batch or int(lengths.min()) < 1 or int(lengths.max()) > seq:
        raise AttentionError(f"{NAME} generate: lengths: expected {batch} values in [1, {seq}], got {lengths.tolist()}")
    if method not in METHODS:
        from treecoll.attention.baselines import method as decode_method

        decode_method(method)  # raises naming the valid methods
    check_same_signature(
        [
            batch,
            seq,
            new_tokens,
            _digest(input_ids),
            _digest(lengths),
            model.config.num_hidden_layers,
            block_size,
            list(METHODS).index(method),
        ],
        [
            "batch",
            "prompt length",
            "new_tokens",
            "input_ids fingerprint",
            "lengths fingerprint",
            "num_hidden_layers",
            "block_size",
            "method",
        ],
        f"{NAME} generate",
        group,
    )
    cache = TreeCache(
        model.config,
        max_cache_len=seq + max(new_tokens, 1),
        group=group,
        layout=layout,
        block_size=block_size,
        tree=tree,
        topology=topology,
        method=method,
    )
    vocab = model.config.vocab_size
    if new_tokens == 0:
        empty = torch.zeros(batch, 0, dtype=torch.int64)
        return (empty, torch.zeros(batch, 0, vocab)) if return_logits else empty
    # right padding -> left padding: generate appends after the last column
    shift = (seq - lengths).tolist()
    left = torch.stack([torch.roll(input_ids[b], shift[b]) for b in range(batch)])
    mask = (torch.arange(seq)[None, :] >= (seq - lengths)[:, None]).to(torch.int64)
    config = tf.GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with attn_implementation(model):
        res = model.generate(left, attention_mask=mask, past_key_values=cache, generation_config=config)
    tokens = res.sequences[:, seq:]
    if not return_logits:
        return tokens
    return tokens, torch.stack(res.logits, 1).float()
