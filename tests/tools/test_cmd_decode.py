"""``treecoll decode``: spawns a gloo group, checks every method against one process."""
import json

import pytest

from tools.cli import main

SMALL = ["decode", "--nproc", "3", "--layers", "1", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
         "--new-tokens", "3", "--block-size", "8", "--batch", "2", "--json"]


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
        assert all(p >= c for p, c in zip(m["peak_bytes_per_rank"], d["cache_bytes_per_rank"]))
    # tree: the packed state (2 x 4 heads x 17 floats) once up and once down per tree edge
    assert sum(d["methods"]["tree"]["bytes_sent_per_rank"]) == 2 * (3 - 1) * (2 * 4 * 17 * 4)
    # ring: each rank ships its K/V shard (2 x 2 kv heads x 16 x bf16 per token, 40 + 1 tokens over
    # 3 ranks) to the next rank twice (P-1 hops), plus the lengths
    ring = d["methods"]["ring"]["bytes_sent_per_rank"]
    assert sum(ring) >= 2 * 41 * 2 * (2 * 2 * 16 * 2)


def test_decode_text_one_process_with_topology(capsys):
    code, out, err = _run(capsys, [a for a in SMALL if a not in ("--json",)] + [
        "--seq-len", "24", "--nproc", "1", "--topology", "default"])
    assert code == 0, err
    table = out.split("-----\n")[1].split("\n\n")[0]
    assert [line.split()[0] for line in table.splitlines()] == ["tree", "ring", "allreduce3"]
    assert "max |err|" in out and "topology: " in out


@pytest.mark.parametrize("argv,msg", [
    (["--heads", "6", "--kv-heads", "4"], "--heads: expected a multiple of --kv-heads=4, got 6"),
    (["--compare", "ring,bogus"], "--compare: expected a comma list of ring, allreduce3 or 'none', got 'bogus'"),
    (["--new-tokens", "1"], "--new-tokens: expected at least 2"),
    (["--topology", "nope.yaml"], "nope.yaml"),
])
def test_user_errors(capsys, argv, msg):
    code, out, err = _run(capsys, ["decode"] + argv)
    assert code == 1 and msg in err and len(err.strip().splitlines()) == 1
