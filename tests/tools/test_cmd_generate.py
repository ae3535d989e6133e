"""``treecoll generate``: model.generate() with a TreeCache over spawned ranks and under torchrun.

The reference is the same model's own ``generate()`` in one process (``--check``, on rank 0);
the byte counts are derived from the built-in model's sizes.
"""

import json
import os
import subprocess
import sys

import pytest
from treecoll.tools import cmd_generate
from treecoll.tools.cli import main

pytest.importorskip("transformers", reason="optional extra transformers not installed: pip install 'treecoll[hf]'")

TINY = cmd_generate.BUILTIN["tiny-random-llama"]
#: the packed attention state of one layer: batch 1 x query heads x (head_dim + 1) float32
STATE = 1 * TINY["num_attention_heads"] * (TINY["hidden_size"] // TINY["num_attention_heads"] + 1) * 4


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.timeout(240)
def test_generate_two_ranks_json_matches_one_process(capsys):
    code, out, err = _run(
        capsys,
        [
            "generate",
            "--prompt-tokens",
            "12",
            "--max-new-tokens",
            "5",
            "--nproc",
            "2",
            "--block-size",
            "4",
            "--check",
            "--json",
        ],
    )
    assert code == 0, err
    d = json.loads(out)
    assert d["match"] is True and d["ranks_agree"] is True and d["tokens"] == d["reference_tokens"]
    assert len(d["tokens"]) == 5 and len(d["prompt_tokens"]) == 12 and d["nproc"] == 2
    # 12 prompt tokens + 4 fed back (the fifth is never fed) = 16 positions in blocks of 4 dealt over 2 ranks
    assert d["cache_tokens_per_rank"] == [8, 8]
    # one prefill interval and 4 decode steps; from the second decode step on (the first also checks that
    # the ranks agree), each rank sends the packed state once per layer: to its parent in the reduction
    # or to its child in the broadcast (2 ranks: one edge)
    assert len(d["step_s"]) == 4 and all(t > 0 for t in d["step_s"]) and d["prefill_s"] > 0
    for per_step in d["bytes_per_step_per_rank"]:
        assert per_step[2:] == [TINY["num_hidden_layers"] * STATE] * 3
    assert d["bytes_sent_per_rank"][0] == sum(d["bytes_per_step_per_rank"][0])


def test_generate_one_process_text_prompt(capsys):
    """--nproc 1: the built-in model reads UTF-8 bytes; sampling with a seed equals one-process generate()."""
    argv = [
        "generate",
        "--prompt",
        "héllo",
        "--max-new-tokens",
        "3",
        "--nproc",
        "1",
        "--do-sample",
        "--seed",
        "4",
        "--check",
        "--json",
    ]
    code, out, err = _run(capsys, argv)
    assert code == 0, err
    d = json.loads(out)
    assert d["prompt_tokens"] == list("héllo".encode()) and len(d["tokens"]) == 3 and d["match"] is True
    assert d["text"] == bytes(d["tokens"]).decode("utf-8", errors="replace")
    text = cmd_generate.render(d)
    assert "generate: tiny-random-llama, 1 ranks" in text and "check: tokens equal one-process generate()" in text


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--model", "./no-such-dir"], "--model ./no-such-dir: expected a checkpoint directory, got no such directory"),
        (
            ["--model", "tiny-random-lama"],
            "--model tiny-random-lama: unknown model; did you mean the built-in 'tiny-random-llama'?",
        ),
        (
            ["--prompt-tokens", "500", "--max-new-tokens", "13"],
            "prompt: expected prompt + --max-new-tokens <= 512 (the model's max_position_embeddings), "
            "got 500 + 13 = 513",
        ),
        (["--nproc", "100000"], "--nproc 100000: expected at most"),
        (["--prompt", ""], "--prompt: expected a value, got an empty string"),
        (["--prompt", "a", "--prompt-tokens", "3"], "argument --prompt-tokens: not allowed with argument --prompt"),
        (["--max-new-tokens", "0"], "--max-new-tokens: expected a positive integer, got 0"),
        (["--layout", "striped"], "argument --layout: invalid choice: 'striped'"),
        (
            ["--topology", "dgx-h100", "--nproc", "9"],
            "--nproc 9: expected at most 8 (the GPUs of topology 'dgx-h100'), got 9; give a larger topology",
        ),
    ],
)
def test_user_errors(capsys, argv, msg):
    code, out, err = _run(capsys, ["generate"] + argv)
    assert code == 1 and msg in err and len(err.strip().splitlines()) == 1 and out == "", err


def test_checkpoint_without_tokenizer(capsys, tmp_path):
    """A local checkpoint directory loads; --prompt needs its tokenizer, a directory without config.json is refused."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**dict(TINY, num_hidden_layers=1))
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "ckpt")
    code, out, err = _run(capsys, ["generate", "--model", str(tmp_path / "ckpt"), "--prompt", "hi"])
    assert code == 1 and "--prompt: expected a tokenizer with --model" in err and "--prompt-tokens N" in err
    code, out, err = _run(capsys, ["generate", "--model", str(tmp_path), "--nproc", "1"])
    assert code == 1 and "expected a checkpoint directory holding config.json" in err
    code, out, err = _run(
        capsys,
        [
            "generate",
            "--model",
            str(tmp_path / "ckpt"),
            "--nproc",
            "1",
            "--prompt-tokens",
            "4",
            "--max-new-tokens",
            "2",
            "--check",
            "--json",
        ],
    )
    assert code == 0, err
    assert json.loads(out)["match"] is True


@pytest.mark.timeout(300)
def test_torchrun_two_ranks_sampling():
    """A real torchrun job (torch.distributed.run --standalone, 2 ranks): rank 0 prints the JSON, the
    sampled tokens equal one process's, and discovery's notice is logged once, not once per rank."""
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "treecoll",
        "generate",
        "--prompt-tokens",
        "10",
        "--max-new-tokens",
        "4",
        "--do-sample",
        "--seed",
        "7",
        "--check",
        "--json",
        "--timeout",
        "120",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(var, None)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert d["nproc"] == 2 and d["do_sample"] is True and d["match"] is True and len(d["tokens"]) == 4
    notices = [line for line in proc.stderr.splitlines() if line.startswith("treecoll: no NVML")]
    assert len(notices) <= 1, proc.stderr
