"""``treecoll decode``: spawns a gloo group, checks every method against one process."""

import json

import pytest
from treecoll.tools import cmd_decode
from treecoll.tools.cli import main

SMALL = [
    "decode",
    "--nproc",
    "3",
    "--layers",
    "1",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--head-dim",
    "16",
    "--new-tokens",
    "3",
    "--block-size",
    "8",
    "--batch",
    "2",
    "--json",
]


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_decode_json_every_method_matches_reference(capsys):
    code, out, err = _run(capsys, SMALL + ["--seq-len", "40"])
    assert code == 0, err
    d = json.loads(out)
    assert set(d["methods"]) == {"tree", "ring", "allreduce3"}
    assert d["nproc"] == 3 and len(d["cache_bytes_per_rank"]) == 3
    for name, m in d["methods"].items():
        assert m["max_abs_err"] is not None and m["max_abs_err"] < 1e-4, (name, m["max_abs_err"])
        assert len(m["step_s"]) == 3 and m["median_step_s"] > 0
        assert len(m["bytes_sent_per_rank"]) == 3 and len(m["peak_bytes_per_rank"]) == 3
    # the byte counts step 4 measures: 40 context tokens + 3 decode steps + the measured token = 44,
    # round-robin blocks of 8 over 3 ranks: rank 0 holds 0-7 and 24-31, rank 1 8-15 and 32-39,
    # rank 2 16-23 and 40-43 -> 16, 16, 12 tokens; a token of K or V is 2 x 2 kv heads x 16 x 2 B
    held = [16, 16, 12]
    kv_token = 2 * (2 * 2 * 16 * 2)
    state = 2 * 4 * (16 + 1) * 4  # packed (out, lse): batch x heads x (head_dim + 1) float32
    tree = d["tree"]["parents"]
    children = [sum(1 for p in tree if p == r) for r in range(3)]
    # tree: the state once up to the parent and once down to each child
    assert d["methods"]["tree"]["bytes_sent_per_rank"] == [state * (children[r] + (tree[r] != -1)) for r in range(3)]
    # ring: a rank sends the shard in hand to the next rank P - 1 = 2 times (its own, then its
    # predecessor's), with the lengths (int32 [batch]) each time, after one all-gather of the
    # 8-entry int64 agreement row (decode_signature's 6 fields, the shipped prefix, the flag)
    assert d["methods"]["ring"]["bytes_sent_per_rank"] == [
        (held[r] + held[r - 1]) * kv_token + 2 * 2 * 4 + 8 * 8 for r in range(3)
    ]
    # allreduce3: max(lse) [B, H], sum(den) [B, H], sum(num) [B, H, D] in float32
    assert d["methods"]["allreduce3"]["bytes_sent_per_rank"] == [4 * 2 * 4 * (16 + 2)] * 3
    _memory_estimate_bounds_the_run(d)
    _columns_line_up(d)


def _columns_line_up(d: dict) -> None:
    """The text table of the same run, with the ring's byte counts made 100 MB-sized as at long
    contexts: every row's per-rank lists start under their headers, however long the lists before them."""
    ring = d["methods"]["ring"]
    d = {**d, "methods": {**d["methods"], "ring": {**ring, "bytes_sent_per_rank": [100_700_000] * 3}}}
    lines = cmd_decode.render(d).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("method"))
    sent, peak = lines[head].index("bytes sent/rank"), lines[head].index("peak mem/rank")
    rows = lines[head + 2 : head + 2 + len(d["methods"])]
    assert [r.split()[0] for r in rows] == list(d["methods"])
    for row in rows:
        assert row[sent - 2 : sent] == "  " and row[sent].isdigit(), row
        assert row[peak - 2 : peak] == "  " and row[peak].isdigit(), row


def _memory_estimate_bounds_the_run(d: dict) -> None:
    """The estimate the --nproc check uses, against the same run measured: the cache exactly,
    every method's transient tensors, and each process's peak RSS (Linux)."""
    est = cmd_decode.memory_estimate(d["config"], 3)
    # the cache of rank 0: capacity for 40 + 3 + 1 tokens -> 16 slots, K and V, 2 x 2 x 16 x bf16 each
    assert est["cache_per_rank"] == d["cache_bytes_per_rank"][0] == 2 * 16 * 2 * 2 * 16 * 2
    for name, m in d["methods"].items():
        assert max(m["peak_transient_bytes_per_rank"]) <= est["transient_per_rank"], name
    rss = d["max_rss_bytes_per_rank"]
    if rss[0] is None:
        return  # no /proc/self/status (VmHWM) on this platform
    per_rank = cmd_decode.RANK_BASELINE_BYTES + est["cache_per_rank"] + est["transient_per_rank"]
    assert all(r <= per_rank for r in rss[1:]), (rss, per_rank)
    assert rss[0] <= per_rank + est["reference"], (rss, per_rank)
    # and the baseline is not padded: a rank with a tiny cache uses most of it
    assert min(rss) >= 0.8 * cmd_decode.RANK_BASELINE_BYTES, rss


def test_decode_text_one_process_with_topology(capsys):
    code, out, err = _run(
        capsys,
        [a for a in SMALL if a not in ("--json",)] + ["--seq-len", "24", "--nproc", "1", "--topology", "default"],
    )
    assert code == 0, err
    table = out.split("-----\n")[1].split("\n\n")[0]
    assert [line.split()[0] for line in table.splitlines()] == ["tree", "ring", "allreduce3"]
    assert "max |err|" in out
    # which GPUs of the 16-GPU default topology the one rank stands for
    assert "topology: dgx-h100-x2, rank 0 on h0/gpu0 (1 of its 16 GPUs)" in out


def test_decode_json_names_the_gpus_of_a_larger_topology(capsys):
    code, out, err = _run(
        capsys, SMALL + ["--seq-len", "24", "--nproc", "1", "--topology", "dgx-h100-x2", "--compare", "none"]
    )
    assert code == 0, err
    d = json.loads(out)
    assert (d["topology"], d["gpus"], d["topology_gpus"]) == ("dgx-h100-x2", ["h0/gpu0"], 16)


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--heads", "6", "--kv-heads", "4"], "--heads: expected a multiple of --kv-heads=4, got 6"),
        (
            ["--compare", "ring,bogus"],
            "--compare: expected a comma list of auto, gather, ring, allreduce3 or 'none', got 'bogus'",
        ),
        (["--compare", ""], "--compare: expected a value, got an empty string"),
        (["--compare", "ring,"], "--compare: expected a comma list of methods, got an empty item in 'ring,'"),
        (["--topology", ""], "--topology: expected a value, got an empty string"),
        (["--new-tokens", "1"], "--new-tokens: expected an integer >= 2, got 1"),
        (["--topology", "nope.yaml"], "nope.yaml"),
        (["--seq-len", "0"], "--seq-len: expected a count of at least 1, got '0'"),
        (["--seq-len", "1MiB"], "--seq-len: expected a count like 32768, 128k or 5.12M, got '1MiB'"),
        (["--nproc", "-1"], "--nproc: expected a positive integer, got -1"),
        (["--nproc", "4.5"], "--nproc: expected an integer, got '4.5'"),
        (["--seed", "-1"], "--seed: expected a non-negative integer, got -1"),
        (["--timeout", "0"], "--timeout: expected a positive number of seconds, got '0'"),
        (["--timeout", "nan"], "--timeout: expected a positive number of seconds, got 'nan'"),
        (
            ["--topology", "dgx-h100", "--nproc", "9"],
            "--nproc 9: expected at most 8 (the GPUs of topology 'dgx-h100'), got 9; give a larger topology",
        ),
        (["--topology", "default", "--discover"], "argument --discover: not allowed with argument --topology"),
    ],
)
def test_user_errors(capsys, argv, msg):
    code, out, err = _run(capsys, ["decode"] + argv)
    assert code == 1 and msg in err and len(err.strip().splitlines()) == 1 and out == ""


def test_seq_len_reads_like_simulate():
    """The README: token counts are decimal, for every command."""
    from treecoll.tools.cli import build_parser

    p = build_parser()
    assert p.parse_args(["decode", "--seq-len", "1M"]).seq_len == 10**6
    assert p.parse_args(["simulate", "decode", "--seq-len", "1M"]).seq_len == [10**6]
    assert p.parse_args(["decode", "--seq-len", "5.12M"]).seq_len == 5_120_000
