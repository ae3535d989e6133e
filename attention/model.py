"""A Llama-style decoder whose attention decodes over a sequence-sharded KV cache.

Architecture (Llama 2/3, Hugging Face weight names): token embedding; per layer
RMSNorm -> GQA attention with rotary embeddings (``rotate_half`` convention,
optional ``llama3`` frequency scaling) -> residual -> RMSNorm -> SwiGLU MLP
(``down(silu(gate(x)) * up(x))``) -> residual; final RMSNorm and ``lm_head``.

Distribution (context parallel for attention only):

* every rank holds all weights and computes every layer's projections and MLP
  for the current tokens (replicated; they are tiny next to the KV cache at
  long context);
* **prefill** runs the whole prompt on every rank with ordinary causal
  attention (``scaled_dot_product_attention``), then each rank keeps only its
  share of every layer's K/V in its :class:`~attention.kv_cache.ShardedKVCache`
  (round-robin blocks).  Simple and exactly equal on every rank;
* **decode**: the new token's K/V are appended on the rank that owns the tail
  position; attention runs through :func:`treecoll.attention.tree_decode` (its combine
  chosen by the cost model; or a method of :func:`treecoll.attention.baselines.method`:
  ``method="tree"``, ``"ring"``, ...) over the local
  shards, and every rank gets the same output, so the ranks stay in lock step.

In one process (no process group, or a group of one) the same code decodes
over the whole cache, which is what the multi-process result is checked
against: greedy tokens are identical.

Weights: :meth:`LlamaModel.random` (from a seed, no download) or
:meth:`LlamaModel.from_pretrained` (a local directory with ``config.json`` and
``*.safetensors`` -- needs the ``safetensors`` package -- or ``*.bin`` / ``*.pt``
state dicts, Hugging Face ``LlamaForCausalLM`` names).

A decode step through the KV cache gives the logits of running the whole
prompt again, and greedy generation starts with the prefill's argmax:

>>> import torch
>>> config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
...                      num_kv_heads=1)
>>> config.head_dim                                    # hidden_size // num_heads
8
>>> model = LlamaModel.random(config, seed=0)
>>> cache = model.new_cache(batch=1, max_seq_len=8)
>>> logits = model.prefill(torch.tensor([[1, 2, 3]]), cache)     # float32 [batch, vocab]
>>> logits.shape, cache.lengths(0).tolist()
(torch.Size([1, 32]), [3])
>>> token = logits.argmax(-1)
>>> step = model.decode_step(token, cache)                       # attends over the cached keys
>>> again = model.prefill(torch.tensor([[1, 2, 3, int(token)]]), model.new_cache(batch=1, max_seq_len=8))
>>> torch.allclose(step, again, atol=1e-5), cache.lengths(1).tolist()
(True, [4])
>>> int(model.generate(torch.tensor([[1, 2, 3]]), 2)[0, 0]) == int(token)
True
>>> LlamaConfig(num_heads=3, num_kv_heads=2)
Traceback (most recent call last):
...
treecoll.topo.errors.AttentionError: LlamaConfig.num_heads: expected a multiple of num_kv_heads=2, got 3
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from treecoll.attention.kv_cache import DEFAULT_BLOCK_SIZE, Lengths, ShardedKVCache
from treecoll.topo.errors import AttentionError, MissingDependency

if TYPE_CHECKING:
    from treecoll.topo import Topology

__all__ = ["LlamaConfig", "LlamaModel", "save_checkpoint"]


@dataclass(frozen=True)
class LlamaConfig:
    """Model sizes (Hugging Face ``config.json`` names in :meth:`from_hf`)."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 352
    num_layers: int = 2
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 0  # 0: hidden_size // num_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict = field(default=None, hash=False)  # type: ignore[assignment]
    tie_word_embeddings: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise AttentionError(f"LlamaConfig.{name}: expected a positive int, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise AttentionError(
                f"LlamaConfig.num_heads: expected a multiple of num_kv_heads={self.num_kv_heads}, got {self.num_heads}"
            )
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.head_dim % 2:
            raise AttentionError(f"LlamaConfig.head_dim: expected an even number (rotary pairs), got {self.head_dim}")
        if self.rope_scaling is not None and self.rope_scaling.get("rope_type", self.rope_scaling.get("type")) not in (
            "llama3",
        ):
            raise AttentionError(
                f"LlamaConfig.rope_scaling: expected None or rope_type 'llama3', got {self.rope_scaling!r}"
            )

    @classmethod
    def from_hf(cls, d: dict) -> LlamaConfig:
        """From a Hugging Face Llama ``config.json`` dict."""
        heads = int(d["num_attention_heads"])
        return cls(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads", heads)),
            head_dim=int(d.get("head_dim") or 0),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-5)),
            rope_theta=float(d.get("rope_theta", 10000.0)),
            rope_scaling=d.get("rope_scaling"),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        )

    def to_hf(self) -> dict:
        """The Hugging Face ``config.json`` dict of this config."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
        }


def _weight_shapes(c: LlamaConfig) -> dict:
    h, d = c.hidden_size, c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (c.num_heads * d, h),
                p + "self_attn.k_proj.weight": (c.num_kv_heads * d, h),
                p + "self_attn.v_proj.weight": (c.num_kv_heads * d, h),
                p + "self_attn.o_proj.weight": (h, c.num_heads * d),
                p + "mlp.gate_proj.weight": (c.intermediate_size, h),
                p + "mlp.up_proj.weight": (c.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, c.intermediate_size),
            }
        )
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    return shapes


def _inv_freq(c: LlamaConfig) -> torch.Tensor:
    """Rotary inverse frequencies float64 [head_dim/2], with Llama 3.1's
    ``llama3`` scaling when configured (as transformers' ``_compute_llama3_parameters``)."""
    d = c.head_dim
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = c.rope_scaling
    if s is None:
        return inv
    factor, low, high = float(s["factor"]), float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old = float(s.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / high) & (wavelen <= old / low)
    return torch.where(medium, mid, scaled)


def _rope(x: torch.Tensor, pos: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate_half convention). ``x`` [..., n, heads, head_dim],
    ``pos`` int [..., n] positions."""
    ang = pos.to(torch.float64).unsqueeze(-1) * inv_freq  # [..., n, d/2]
    emb = torch.cat([ang, ang], dim=-1).unsqueeze(-2)  # [..., n, 1, d]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def _rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


class LlamaModel:
    """Weights (a dict of Hugging Face names) and the forward passes.

    ``dtype``: compute and weight dtype (float32 default; bfloat16 works, with
    the attention merge still in float32).
    """

    def __init__(self, config: LlamaConfig, weights: dict[str, torch.Tensor], *, dtype: torch.dtype = torch.float32):
        self.config = config
        expected = _weight_shapes(config)
        missing = sorted(set(expected) - set(weights))
        if missing:
            raise AttentionError(
                f"LlamaModel: weights: expected {len(expected)} tensors, missing {missing[:4]}"
                f"{' ...' if len(missing) > 4 else ''}"
            )
        for name, shape in expected.items():
            if tuple(weights[name].shape) != shape:
                raise AttentionError(
                    f"LlamaModel: weights[{name!r}]: expected shape {shape}, got {tuple(weights[name].shape)}"
                )
        self.dtype = dtype
        self.w = {k: weights[k].to(dtype).contiguous() for k in expected}
        if config.tie_word_embeddings:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.inv_freq = _inv_freq(config)

    # ------------------------------------------------------------ construction

    @classmethod
    def random(
        cls, config: LlamaConfig | None = None, *, seed: int = 0, dtype: torch.dtype = torch.float32
    ) -> LlamaModel:
        """Random weights from ``seed`` (normal, std 1/sqrt(fan_in); norms 1):
        identical in every process that uses the same seed."""
        config = config or LlamaConfig()
        g = torch.Generator().manual_seed(seed)
        weights = {}
        for name, shape in _weight_shapes(config).items():
            if len(shape) == 1:
                weights[name] = torch.ones(shape)
            else:
                weights[name] = torch.randn(shape, generator=g) / math.sqrt(shape[1])
        return cls(config, weights, dtype=dtype)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: torch.dtype = torch.float32) -> LlamaModel:
        """Load a local Hugging Face Llama directory: ``config.json`` plus
        ``*.safetensors`` (needs ``safetensors``) or ``*.bin`` / ``*.pt`` state dicts."""
        path = Path(path)
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise AttentionError(f"{cfg_file}: expected a Hugging Face config.json in the model directory, found none")
        try:
            config = LlamaConfig.from_hf(json.loads(cfg_file.read_text()))
        except (KeyError, ValueError, TypeError) as e:
            raise AttentionError(
                f"{cfg_file}: expected a Llama config (num_attention_heads, hidden_size, ...), got an error: {e}"
            ) from None
        weights: dict = {}
        st = sorted(path.glob("*.safetensors"))
        if st:
            try:
                from safetensors.torch import load_file
            except ImportError:
                raise MissingDependency("safetensors", f"loading {st[0]}", extra="hf") from None
            for f in st:
                weights.update(load_file(str(f)))
        else:
            files = sorted(path.glob("*.bin")) + sorted(path.glob("*.pt"))
            if not files:
                raise AttentionError(f"{path}: expected *.safetensors, *.bin or *.pt weight files, found none")
            for f in files:
                weights.update(torch.load(f, map_location="cpu", weights_only=True))
        return cls(config, weights, dtype=dtype)

    def state_dict(self) -> dict:
        """Weights by Hugging Face name (``lm_head`` omitted when tied)."""
        return {k: v for k, v in self.w.items() if k in _weight_shapes(self.config)}

    def new_cache(
        self,
        batch: int,
        max_seq_len: int,
        *,
        rank: int = 0,
        world: int = 1,
        block_size: int = DEFAULT_BLOCK_SIZE,
        dtype: torch.dtype | None = None,
    ) -> ShardedKVCache:
        """An empty :class:`ShardedKVCache` for this model (``dtype`` default: the model's)."""
        c = self.config
        return ShardedKVCache(
            layers=c.num_layers,
            batch=batch,
            kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            max_seq_len=max_seq_len,
            rank=rank,
            world=world,
            block_size=block_size,
            dtype=dtype or self.dtype,
        )

    # ------------------------------------------------------------ forward

    def _qkv(self, i: int, x: torch.Tensor, pos: torch.Tensor):
        c, w, p = self.config, self.w, f"model.layers.{i}."
        lead = x.shape[:-1]
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(*lead, c.num_heads, c.head_dim)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(*lead, c.num_kv_heads, c.head_dim)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(*lead, c.num_kv_heads, c.head_dim)
        return _rope(q, pos, self.inv_freq), _rope(k, pos, self.inv_freq), v

    def _mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        w, p, c = self.w, f"model.layers.{i}.", self.config
        x = _rmsnorm(h, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        return (
            h
            + (F.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T))
            @ w[p + "mlp.down_proj.weight"].T
        )

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        x = _rmsnorm(h, self.w["model.norm.weight"], self.config.rms_norm_eps)
        return (x @ self.w["lm_head.weight"].T).float()

    def prefill(self, tokens: torch.Tensor, cache: ShardedKVCache, lengths: Lengths | None = None) -> torch.Tensor:
        """Run prompts and fill ``cache``; return float32 logits [batch, vocab] at each
        sequence's last prompt token.

        ``tokens`` int [batch, seq] (right-padded), ``lengths`` [batch] (default seq, each >= 1).
        """
        c, w = self.config, self.w
        batch, seq = tokens.shape
        lengths = torch.full((batch,), seq) if lengths is None else torch.as_tensor(lengths).reshape(-1)
        if lengths.numel() != batch or int(lengths.min()) < 1 or int(lengths.max()) > seq:
            raise AttentionError(f"prefill: lengths: expected {batch} values in [1, {seq}], got {lengths.tolist()}")
        pos = torch.arange(seq).expand(batch, seq)
        h = w["model.embed_tokens.weight"][tokens]
        group = c.num_heads // c.num_kv_heads
        for i in range(c.num_layers):
            x = _rmsnorm(h, w[f"model.layers.{i}.input_layernorm.weight"], c.rms_norm_eps)
            q, k, v = self._qkv(i, x, pos)  # [B, N, H, D]
            cache.prefill(i, k, v, lengths)
            att = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                k.repeat_interleave(group, 2).transpose(1, 2),
                v.repeat_interleave(group, 2).transpose(1, 2),
                is_causal=True,
            )  # [B, Hq, N, D]
            att = att.transpose(1, 2).reshape(batch, seq, c.num_heads * c.head_dim)
            h = h + att @ w[f"model.layers.{i}.self_attn.o_proj.weight"].T
            h = self._mlp(i, h)
        last = h[torch.arange(batch), lengths - 1]
        return self._logits(last)

    def decode_step(
        self,
        tokens: torch.Tensor,
        cache: ShardedKVCache,
        *,
        group: Any = None,
        tree: Any = "auto",
        topology: Topology | None = None,
        method: str = "auto",
        check: bool = False,
    ) -> torch.Tensor:
        """One token per sequence: ``tokens`` int [batch]; appends to ``cache`` and
        returns float32 logits [batch, vocab] (the same on every rank)."""
        from treecoll.attention.baselines import method as decode_method

        attend = decode_method(method)
        c, w = self.config, self.w
        h = w["model.embed_tokens.weight"][tokens]  # [B, hidden]
        for i in range(c.num_layers):
            pos = cache.lengths(i)  # [B] position of the new token
            x = _rmsnorm(h, w[f"model.layers.{i}.input_layernorm.weight"], c.rms_norm_eps)
            q, k, v = self._qkv(i, x.unsqueeze(1), pos.unsqueeze(1))  # [B, 1, H, D]
            cache.append(i, k[:, 0], v[:, 0])
            kk, vv, kv_len = cache.shard(i)
            att = attend(
                q[:, 0], kk, vv, kv_len=kv_len, group=group, tree=tree, topology=topology, check=check and i == 0
            )
            h = h + att.to(self.dtype).reshape(h.shape[0], -1) @ w[f"model.layers.{i}.self_attn.o_proj.weight"].T
            h = self._mlp(i, h)
        return self._logits(h)

    def generate(
        self,
        tokens: torch.Tensor,
        new_tokens: int,
        *,
        lengths: Lengths | None = None,
        group: Any = None,
        tree: Any = "auto",
        topology: Topology | None = None,
        method: str = "auto",
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> torch.Tensor:
        """Greedy generation: int64 [batch, new_tokens].

        Prompts ``tokens`` int [batch, seq] (right-padded; ``lengths`` [batch]) are
        prefilled, then ``new_tokens`` tokens are decoded, the KV cache sharded over
        ``group`` (every rank of the group calls this with the same arguments and
        gets the same tokens; without a group: one process, the whole cache).
        """
        from treecoll.collectives.group import group_info

        info = group_info(group, single_process=True)
        rank, world = info.rank, info.size
        batch, seq = tokens.shape
        cache = self.new_cache(batch, seq + new_tokens, rank=rank, world=world, block_size=block_size)
        logits = self.prefill(tokens, cache, lengths)
        out = []
        for step in range(new_tokens):
            nxt = logits.argmax(-1)
            out.append(nxt)
            if step + 1 < new_tokens:
                logits = self.decode_step(
                    nxt, cache, group=group, tree=tree, topology=topology, method=method, check=step == 0
                )
        return torch.stack(out, 1) if out else torch.zeros(batch, 0, dtype=torch.int64)


def save_checkpoint(model: LlamaModel, path: str | Path, *, format: str = "torch") -> Path:
    """Write ``model`` as a Hugging Face style directory (``config.json`` plus
    ``model.safetensors`` with ``format="safetensors"`` or ``pytorch_model.bin``)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.config.to_hf(), indent=1))
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if format == "safetensors":
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise MissingDependency("safetensors", "saving a .safetensors checkpoint", extra="hf") from None
        save_file(sd, str(path / "model.safetensors"))
    elif format == "torch":
        torch.save(sd, path / "pytorch_model.bin")
    else:
        raise AttentionError(f"save_checkpoint: format: expected 'torch' or 'safetensors', got {format!r}")
    return path


def config_dict(config: LlamaConfig) -> dict:
    """Plain-data view of a config (for JSON reports)."""
    return asdict(config)
