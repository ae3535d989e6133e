"""``treecoll generate``: a Hugging Face model's ``generate()`` with the KV cache sharded over processes.

Every rank loads the whole model (``--model``: the built-in ``tiny-random-llama``,
a local checkpoint directory, or a hub id where the hub is reachable), builds a
:class:`treecoll.attention.hf.TreeCache` (this rank's shard of every layer's K/V,
``--layout`` round-robin blocks of ``--block-size`` tokens or contiguous ranges)
and calls ``model.generate(..., past_key_values=cache)`` with
``attn_implementation="tree_decode"``: prefill on every rank, then each decode
step's attention through :func:`treecoll.attention.tree_decode`.  Greedy by
default; ``--do-sample --seed S`` samples (every rank seeds alike, so every rank
draws the same tokens).

Processes: ``--nproc`` processes are spawned (:mod:`treecoll.collectives.launch`,
gloo on 127.0.0.1); under ``torchrun`` or any ``env://`` launcher the launched
job is joined instead, and rank 0 prints.

Measurements, per rank, from a streamer that notes the time and the bytes passed
to torch.distributed (:func:`treecoll.attention.dist.count_traffic`) each time a
token comes out: ``prefill_s`` (the prompt's forward and the first token),
``step_s`` (each later token: one decode forward; the first includes building
the tree and the ranks' agreement check), bytes sent per step.  ``--check`` runs
the same ``generate()`` in one process on rank 0 (the model's own attention and
cache) and compares the tokens (exit code 1 when they differ).

The built-in model (:data:`BUILTIN`) is a random Llama (GQA, RoPE) small enough
for tests: its weights come from ``torch.manual_seed(0)`` on every rank, its
vocabulary is the 256 byte values (``--prompt`` is UTF-8 encoded, the output
decoded the same way) and it has no EOS token.

>>> spec = resolve_model("tiny-random-llama")
>>> spec["kind"], spec["config"]["num_attention_heads"], spec["config"]["num_key_value_heads"]
('builtin', 4, 2)
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import statistics
from typing import Any

from treecoll.tools.units import UsageError

__all__ = ["add_parser", "run", "BUILTIN", "resolve_model", "render", "summarize", "worker", "selfcheck"]

#: built-in model configurations (transformers ``LlamaConfig`` arguments): name -> config
BUILTIN = {
    "tiny-random-llama": dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    ),
}
#: peak resident memory of one rank before the model's weights (bytes): torch, gloo and transformers
#: imported; :data:`treecoll.tools.resources.PROCESS_BASELINE_BYTES` plus transformers' modules
RANK_BASELINE_BYTES = 512 << 20


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    from treecoll.tools import units
    from treecoll.tools.cli import common_options
    from treecoll.tools.resources import OVERSUBSCRIBE_HELP

    p = subparsers.add_parser(
        "generate",
        help="model.generate() with the KV cache sharded, tree attention decoding",
        description="A Hugging Face model's generate() over gloo processes (or the torchrun "
        "group): every rank holds a shard of the KV cache (TreeCache) and each "
        "decode step combines the shards' attention through a tree.",
    )
    common_options(p)
    p.add_argument(
        "--model",
        default="tiny-random-llama",
        metavar="NAME_OR_PATH",
        help=f"built-in {', '.join(BUILTIN)}, a local checkpoint directory (config.json, weights) or a "
        f"hub id (default tiny-random-llama)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--prompt",
        metavar="TEXT",
        help="prompt text (needs the model's tokenizer; the built-in model reads UTF-8 bytes)",
    )
    src.add_argument(
        "--prompt-tokens",
        type=units.int_arg("--prompt-tokens"),
        metavar="N",
        help="a random prompt of N token ids from --seed (default 16)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=units.int_arg("--max-new-tokens"),
        default=16,
        metavar="K",
        help="tokens to generate (default 16; fewer if the model emits EOS)",
    )
    p.add_argument("--do-sample", action="store_true", help="sample (the model's generation config) instead of greedy")
    p.add_argument(
        "--seed",
        type=units.int_arg("--seed", minimum=0),
        default=0,
        help="seed of the sampling and of --prompt-tokens, the same on every rank (default 0)",
    )
    p.add_argument(
        "--nproc",
        type=units.int_arg("--nproc"),
        default=2,
        metavar="P",
        help="processes to spawn (ignored under torchrun; default 2)",
    )
    p.add_argument("--oversubscribe", action="store_true", help=OVERSUBSCRIBE_HELP)
    p.add_argument(
        "--layout",
        choices=("round_robin", "contiguous"),
        default="round_robin",
        help="how positions are spread over the ranks (default round_robin)",
    )
    p.add_argument(
        "--block-size",
        type=units.int_arg("--block-size"),
        default=8,
        help="tokens per round-robin block (default 8: a short prompt spans the ranks)",
    )
    p.add_argument(
        "--topology",
        metavar="F",
        help="topology YAML file or shipped name for the tree (default: discover the group's)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="compare with the same generate() in one process (exit code 1 if the tokens differ)",
    )
    p.add_argument(
        "--timeout",
        type=units.seconds_arg("--timeout"),
        default=600.0,
        help="seconds before the group gives up (default 600)",
    )
    return p


# ------------------------------------------------------------------ the model and the prompt


def resolve_model(name: str) -> dict[str, Any]:
    """Where ``--model`` comes from, checked before any process starts (plain data):
    ``{"kind": "builtin" | "path" | "hub", "name": ..., "config": {...}}`` with the
    model's config as a dict. Raises :class:`UsageError` (one line) for a name that
    is none of them."""
    if name in BUILTIN:
        return {"kind": "builtin", "name": name, "config": dict(BUILTIN[name])}
    import transformers

    builtin = ", ".join(repr(b) for b in BUILTIN)
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise UsageError(
                f"--model {name}: expected a checkpoint directory holding config.json "
                f"(save_pretrained writes one), got a directory without it"
            )
        kind = "path"
    elif name.startswith((".", "/", "~")) or os.path.exists(name):
        raise UsageError(
            f"--model {name}: expected a checkpoint directory, got no such directory; "
            f"give a directory, a hub id or the built-in {builtin}"
        )
    else:
        close = difflib.get_close_matches(name, list(BUILTIN), n=1, cutoff=0.8)
        if close:
            raise UsageError(f"--model {name}: unknown model; did you mean the built-in {close[0]!r}?")
        kind = "hub"
    try:
        with _hub_quiet():
            config = transformers.AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(
            f"--model {name}: expected a local checkpoint directory, a hub id reachable from here or "
            f"the built-in {builtin}, got a model that cannot be loaded ({first})"
        ) from None
    if getattr(config, "is_encoder_decoder", False):
        raise UsageError(
            f"--model {name}: expected a decoder-only causal LM, got an encoder-decoder ({type(config).__name__})"
        )
    return {"kind": kind, "name": name, "config": config.to_dict()}


@contextlib.contextmanager
def _hub_quiet():
    """Keep the hub client's retry warnings out of stderr (the failure is reported as one line)."""
    hub = logging.getLogger("huggingface_hub")
    level = hub.level
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub.setLevel(level)


def _tokenizer(spec: dict):
    """The model's tokenizer, or None (the built-in model reads bytes; a checkpoint without one)."""
    if spec["kind"] == "builtin":
        return None
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(spec["name"])
    except (OSError, ValueError, TypeError):
        return None


def prompt_ids(args: argparse.Namespace, spec: dict, tokenizer: Any) -> list[int]:
    """The prompt's token ids (plain ints) from ``--prompt`` or ``--prompt-tokens``."""
    vocab = int(spec["config"]["vocab_size"])
    if args.prompt is not None:
        if spec["kind"] == "builtin":
            ids = list(args.prompt.encode("utf-8"))
        elif tokenizer is None:
            raise UsageError(
                f"--prompt: expected a tokenizer with --model {spec['name']}, got none; use --prompt-tokens N"
            )
        else:
            ids = list(tokenizer(args.prompt)["input_ids"])
        if not ids:
            raise UsageError("--prompt: expected at least one token, got an empty prompt")
        return [int(i) for i in ids]
    import torch

    n = args.prompt_tokens if args.prompt_tokens is not None else 16
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(args.seed)).tolist()


def _check_length(spec: dict, n_prompt: int, new: int) -> None:
    limit = spec["config"].get("max_position_embeddings")
    if limit is not None and n_prompt + new > int(limit):
        raise UsageError(
            f"prompt: expected prompt + --max-new-tokens <= {limit} (the model's "
            f"max_position_embeddings), got {n_prompt} + {new} = {n_prompt + new} tokens; "
            f"shorten the prompt or lower --max-new-tokens"
        )


def _weight_bytes(spec: dict) -> int:
    """Bytes of the checkpoint's weight files (each rank loads all of them); 0 when unknown."""
    if spec["kind"] == "builtin":
        c = spec["config"]
        layer = 4 * c["hidden_size"] ** 2 + 3 * c["hidden_size"] * c["intermediate_size"]
        return 4 * (2 * c["vocab_size"] * c["hidden_size"] + c["num_hidden_layers"] * layer)
    if spec["kind"] != "path":
        return 0
    return sum(
        os.path.getsize(os.path.join(spec["name"], f))
        for f in os.listdir(spec["name"])
        if f.endswith((".safetensors", ".bin"))
    )


# ------------------------------------------------------------------ the per-rank work


def load_model(cfg: dict, attn: str, device: Any = None) -> Any:
    """The model of ``cfg`` in float32, eval mode, attention ``attn``, on ``device`` (default CPU)."""
    import torch
    import transformers

    if cfg["model"]["kind"] == "builtin":
        torch.manual_seed(0)  # the same random weights on every rank
        config = transformers.LlamaConfig(**cfg["model"]["config"])
        model = transformers.LlamaForCausalLM(config)
        model.set_attn_implementation(attn)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            cfg["model"]["name"], dtype=torch.float32, attn_implementation=attn
        )
    return model.to(device or "cpu").eval()


class _StepClock:
    """A streamer (``put``/``end``) noting the time and the bytes sent each time tokens come out."""

    def __init__(self, traffic):
        import time

        self._now, self.traffic = time.perf_counter, traffic
        self.marks: list[tuple[float, int]] = []

    def put(self, value) -> None:
        self.marks.append((self._now(), self.traffic.sent))

    def end(self) -> None:
        pass

    def intervals(self) -> tuple[list[float], list[int]]:
        """Seconds and bytes between consecutive marks (the first mark is the prompt)."""
        pairs = list(zip(self.marks, self.marks[1:]))
        return [b[0] - a[0] for a, b in pairs], [b[1] - a[1] for a, b in pairs]


def _generate(model, cfg: dict, **kw):
    import torch

    ids = torch.tensor([cfg["prompt"]], dtype=torch.int64, device=model.device)
    if cfg["do_sample"]:
        torch.manual_seed(cfg["seed"])
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None else 0
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=cfg["max_new_tokens"],
        do_sample=cfg["do_sample"],
        pad_token_id=pad,
        **kw,
    )
    return out[0, ids.shape[1] :].tolist()


def worker(rank: int, world: int, cfg: dict) -> dict:
    """One rank of ``treecoll generate``: generate with a :class:`TreeCache`; with ``check``,
    rank 0 then generates in one process with the model's own attention. Plain data out."""
    from treecoll.attention import hf
    from treecoll.attention.dist import count_traffic

    hf.register()
    topology = None
    if cfg["topology"] is not None:
        from treecoll.topo import Topology

        topology = Topology.from_dict(cfg["topology"])
    model = load_model(cfg, hf.NAME, _device())
    cache = hf.TreeCache(
        model.config,
        max_cache_len=len(cfg["prompt"]) + cfg["max_new_tokens"],
        layout=cfg["layout"],
        block_size=cfg["block_size"],
        topology=topology,
    )
    with count_traffic() as traffic:
        clock = _StepClock(traffic)
        tokens = _generate(model, cfg, past_key_values=cache, streamer=clock)
    times, sent = clock.intervals()
    res = {
        "rank": rank,
        "tokens": tokens,
        "times": times,
        "bytes": sent,
        "bytes_sent": traffic.sent,
        "cache_tokens": cache.shard_lengths(0).tolist(),
    }
    if cfg["check"] and rank == 0:
        res["reference"] = _generate(load_model(cfg, "sdpa", _device()), cfg)
    return res


def _device():
    """This rank's CUDA device when its group runs NCCL (:func:`treecoll.collectives.launch.join`
    set it from LOCAL_RANK), else None (CPU, gloo)."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return None


# ------------------------------------------------------------------ assembling


def summarize(cfg: dict, ranks: list[dict]) -> dict:
    """The plain dict ``treecoll generate`` prints."""
    tokens = ranks[0]["tokens"]
    agree = all(r["tokens"] == tokens for r in ranks)
    reference = ranks[0].get("reference")
    steps = [max(ts) for ts in zip(*(r["times"] for r in ranks))]
    decode = steps[1:]
    return {
        "model": cfg["model"]["name"],
        "nproc": len(ranks),
        "layout": cfg["layout"],
        "block_size": cfg["block_size"] if cfg["layout"] == "round_robin" else None,
        "do_sample": cfg["do_sample"],
        "seed": cfg["seed"],
        "prompt_tokens": cfg["prompt"],
        "tokens": tokens,
        "text": cfg.get("text"),
        "ranks_agree": agree,
        "reference_tokens": reference,
        "match": None if reference is None else (agree and reference == tokens),
        "prefill_s": steps[0] if steps else None,
        "step_s": decode,
        "median_step_s": statistics.median(decode[1:] or decode) if decode else None,
        "bytes_sent_per_rank": [r["bytes_sent"] for r in ranks],
        "bytes_per_step_per_rank": [r["bytes"] for r in ranks],
        "cache_tokens_per_rank": [r["cache_tokens"][0] if r["cache_tokens"] else 0 for r in ranks],
    }


def _config(args) -> tuple[dict, Any]:
    spec = resolve_model(args.model)
    tokenizer = _tokenizer(spec)
    prompt = prompt_ids(args, spec, tokenizer)
    _check_length(spec, len(prompt), args.max_new_tokens)
    vocab = int(spec["config"]["vocab_size"])
    bad = [i for i in prompt if not 0 <= i < vocab]
    if bad:
        raise UsageError(f"prompt: expected token ids in [0, {vocab}), got {bad[0]}")
    topology = None
    if args.topology:
        from treecoll import topo

        topology = topo.resolve(args.topology).to_dict()  # plain data crosses the process boundary
    return (
        {
            "model": spec,
            "prompt": prompt,
            "max_new_tokens": args.max_new_tokens,
            "do_sample": args.do_sample,
            "seed": args.seed,
            "layout": args.layout,
            "block_size": args.block_size,
            "topology": topology,
            "check": args.check,
        },
        tokenizer,
    )


def _text(cfg: dict, tokenizer, tokens: list[int]) -> str | None:
    if cfg["model"]["kind"] == "builtin":
        return bytes(tokens).decode("utf-8", errors="replace")
    return None if tokenizer is None else tokenizer.decode(tokens)


def run(args: argparse.Namespace) -> int:
    from treecoll.collectives import launch
    from treecoll.tools.cli import emit

    job = launch.job_from_env()
    cfg, tokenizer = _config(args)
    if job is not None:
        ranks = launch.join(worker, cfg, timeout=args.timeout, where="generate")
        if job.rank != 0:
            return 0
    else:
        _check_start(cfg, args)
        ranks = (
            [worker(0, 1, cfg)]
            if args.nproc == 1
            else launch.spawn(worker, args.nproc, cfg, timeout=args.timeout, where="generate")
        )
    cfg["text"] = _text(cfg, tokenizer, ranks[0]["tokens"])
    data = summarize(cfg, ranks)
    code = emit(args, data, render)
    return 1 if data["match"] is False else code


def _check_start(cfg: dict, args) -> None:
    """Refuse, before any process starts, more ranks than the machine or the topology takes."""
    from treecoll.tools.resources import check_processes, check_topology_ranks

    check_topology_ranks(cfg["topology"], args.nproc)
    weights = _weight_bytes(cfg["model"])
    check_processes(
        args.nproc,
        option=f"--nproc {args.nproc}",
        per_process_bytes=weights,
        extra_bytes=weights if cfg["check"] else 0,
        baseline_bytes=RANK_BASELINE_BYTES,
        oversubscribe=args.oversubscribe,
    )


def render(d: dict) -> str:
    layout = d["layout"] + (f" blocks of {d['block_size']}" if d["block_size"] else "")
    mode = f"sampling, seed {d['seed']}" if d["do_sample"] else "greedy"
    lines = [
        f"generate: {d['model']}, {d['nproc']} ranks, KV cache {layout}, {mode}",
        f"prompt: {len(d['prompt_tokens'])} tokens; generated {len(d['tokens'])}: {d['tokens']}",
    ]
    if d["text"] is not None:
        lines.append(f"text: {d['text']!r}")
    lines.append(f"cache tokens per rank: {d['cache_tokens_per_rank']}; ranks agree: {d['ranks_agree']}")
    if d["prefill_s"] is not None:
        med = "-" if d["median_step_s"] is None else f"{d['median_step_s'] * 1e3:.2f} ms"
        lines.append(
            f"prefill + first token: {d['prefill_s'] * 1e3:.2f} ms; decode step: {med} median "
            f"(max over ranks, steps 2..n)"
        )
    per_step = [b[-1] if b else 0 for b in d["bytes_per_step_per_rank"]]
    lines.append(f"bytes sent per rank: {d['bytes_sent_per_rank']} in all, {per_step} in the last step")
    if d["match"] is not None:
        lines.append(
            "check: "
            + (
                "tokens equal one-process generate()"
                if d["match"]
                else f"MISMATCH, one-process generate() gave {d['reference_tokens']}"
            )
        )
    return "\n".join(lines)


def selfcheck(nproc: int) -> list[dict]:
    """``treecoll selfcheck``'s generate rows: the built-in ``tiny-random-llama``, greedy and
    sampled (seed 1), over ``nproc`` spawned processes against one-process ``generate()``
    (``--check``); one row each, as :func:`treecoll.tools.cmd_selfcheck.row` makes them."""
    import time

    from treecoll.collectives import launch
    from treecoll.topo.errors import TreecollError

    rows = []
    for sampled in (False, True):
        argv = ["--model", "tiny-random-llama", "--prompt-tokens", "6", "--max-new-tokens", "4", "--check"]
        parser = argparse.ArgumentParser()
        add_parser(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["generate", *argv, *(["--do-sample", "--seed", "1"] if sampled else [])])
        t0 = time.perf_counter()
        try:
            cfg, _ = _config(args)
            data = summarize(cfg, launch.spawn(worker, nproc, cfg, timeout=args.timeout, where="selfcheck generate"))
            result = "passed" if data["match"] else "failed"
            detail = f"{nproc} ranks, {len(data['tokens'])} tokens " + (
                "equal one-process generate()" if data["match"] else "differ from one-process generate()"
            )
        except TreecollError as e:
            result, detail = "failed", str(e)
        rows.append(
            {
                "path": f"generate ({'sampled' if sampled else 'greedy'})",
                "backend": "gloo",
                "device": "cpu",
                "result": result,
                "seconds": time.perf_counter() - t0,
                "detail": detail,
            }
        )
    return rows
