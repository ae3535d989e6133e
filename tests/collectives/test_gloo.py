"""Real multi-process runs over gloo: every builder, reduce/broadcast/allreduce, and failures.

The ranks are :class:`treecoll.collectives.launch.RankPool` pools (the ``pool4``
fixture of conftest.py is started once: spawning is slow on 2 cores) that run
many cases per task (_coll_tasks.py). Every wait is bounded: the pool's own
timeouts and the collectives' ``timeout=``.
"""

from __future__ import annotations

import re
import time

import pytest
from treecoll.collectives.launch import RankPool

from tests.collectives import _coll_tasks as tasks
from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(240)

BUILDERS = ["chain", "binomial", "kary:3", "star", "double_binary", "auto", "two_level"]


def _cases(world: int, builders, *, topology=None, ranks=None, rows=7):
    cases = []
    for b in builders:
        topo_builder = b in ("two_level", "auto")
        for coll in ("allreduce", "reduce", "broadcast"):
            ops = ["sum"] if coll == "broadcast" else ["sum", "pair", "matmul"]
            for op in ops:
                if op == "matmul" and b in ("double_binary", "two_level", "star"):
                    continue  # not order preserving: covered by the error test
                root = (len(cases) % world) if coll != "allreduce" else None
                if op == "matmul" and root not in (None, 0) and b != "auto":
                    root = 0
                cases.append(
                    (
                        coll,
                        b,
                        op,
                        1 + len(cases) % 3,
                        root,
                        rows,
                        len(cases),
                        "tree",
                        topology if topo_builder else None,
                        ranks if topo_builder else None,
                    )
                )
    for algo in ("ring", "rsag"):
        cases.append(("allreduce", None, "sum", world * 2, None, 33, 99, algo, None, None))
    cases.append(("allreduce", None, "matmul", world, None, 9, 98, "rsag", None, None))
    return cases


def _check(results):
    for r, res in enumerate(results):
        assert res is not None and all(res), f"rank {r}: failing cases {[i for i, ok in enumerate(res) if not ok]}"


def test_every_builder_four_processes(pool4):
    # two hosts of the 2-host DGX H100 topology for the topology-aware builders
    _check(pool4.run(tasks.run_cases, _cases(4, BUILDERS, topology="dgx-h100-x2", ranks=[0, 1, 8, 9]), timeout=180))


def test_process_subgroup_uses_group_local_ranks(pool4):
    res = pool4.run(tasks.subgroup, timeout=60)
    assert res == [["not a member"]] + [[True] * 4] * 3


def test_fingerprint_mismatch_is_an_error(pool4):
    t0 = time.time()
    res = pool4.run(tasks.tree_mismatch, timeout=60)
    assert all("ranks disagree on the collective" in r for r in res), res
    assert "chain/allreduce" in res[1] and "binomial/allreduce" in res[1]
    assert time.time() - t0 < 30


def test_shape_mismatch_is_an_error(pool4):
    res = pool4.run(tasks.shape_mismatch, timeout=60)
    assert all("float32[9, 2]" in r and "float32[8, 2]" in r for r in res), res


def test_shapes_that_differ_after_agreement_time_out_never_mix(pool4):
    """A rank that alone changes its shape after the ranks agreed on both shapes: its messages
    carry another tag, so the transfers never match (gloo would abort the process on a size
    mismatch); every rank fails within the timeout naming a peer, then at once."""
    res = pool4.run(tasks.shapes_differ_after_agreement, timeout=90)
    for r, got in enumerate(res):
        (t_first, first), (t_again, again) = got[0]
        assert 1.9 < t_first < 10 and re.match(
            rf"allreduce: rank {r} failed (receiving|sending) chunk 0 (from|to) "
            r"rank \d within 2 s: ",
            first,
        ), first
        assert t_again < 0.5 and "the process group is unusable" in again
        assert got[1] == 4.0  # the default group still works


def test_a_destroyed_group_is_not_kept_alive(pool4):
    """Collectives (group= and a Placement holding the group) and tree_decode on a new group leave
    state for it in the caches (agreements, the discovered topology, its group info); once the
    group is destroyed and dropped, gc frees it: every cache holds it weakly, none keeps it alive.
    Placements compare by the group object: a second group over the same ranks is not equal."""
    res = pool4.run(tasks.destroyed_group_is_freed, timeout=120)
    for r, got in enumerate(res):
        assert got["sum"] == [6.0] * 4 and got["two_level"] == [[4.0, 4.0]] * 3 and got["decoded"], got
        assert got["held"]["agreements"] >= 2 and got["held"]["topology"] and got["held"]["info"], got
        assert got["freed"], f"rank {r}: the destroyed group is still alive"
        assert got["placement"] == {"equal": True, "twin_differs": True, "default_differs": True}, got


def _readme_tree_files():
    """The README's "Tree files" section: its fenced blocks as (language, text)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("### Tree files\n")
    section = text[start : text.index("\n## ", start)]
    return re.findall(r"```(\w*)\n(.*?)```", section, re.DOTALL)


def _transcript(block: str) -> list[tuple[str, list[str]]]:
    """``$ command`` lines and the output lines shown after each."""
    out = []
    for line in block.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        else:
            out[-1][1].append(line)
    return out


def _shown_in(shown: list[str], got: str) -> None:
    """Every line the README shows appears in the output, in order ("..." stands for lines left out)."""
    rest = got.splitlines()
    for line in shown:
        if line.strip() == "...":
            continue
        assert line in rest, f"README line not in the output (or out of order): {line!r}\n{got}"
        rest = rest[rest.index(line) + 1 :]


def test_readme_tree_file_flow_four_processes(pool4, tmp_path, monkeypatch, capsys):
    """The README's tree-file section as a user runs it: every YAML example is a valid tree file;
    build and save, the file shown, the hand edit, check, and the allreduce script over 4 gloo
    processes print what the README shows."""
    import ast
    import shlex

    from treecoll.collectives.tree_io import loads_tree
    from treecoll.tools.cli import main

    blocks = _readme_tree_files()
    yamls = [b for lang, b in blocks if lang == "yaml"]
    assert len(yamls) == 5
    for y in yamls:
        loads_tree(y, "README.md")
    sessions = [_transcript(b) for lang, b in blocks if lang == "" and b.startswith("$ ")]
    (build_cmd, build_out), (cat_cmd, cat_out) = sessions[0]
    [(check_cmd, check_out)] = sessions[1]
    [(run_cmd, run_out)] = sessions[2]
    [script] = [b for lang, b in blocks if lang == "python"]
    monkeypatch.chdir(tmp_path)
    assert build_cmd.startswith("treecoll tree build") and main(shlex.split(build_cmd)[1:]) == 0
    _shown_in(build_out, capsys.readouterr().out)
    assert cat_cmd == "cat tree.yaml" and (tmp_path / "tree.yaml").read_text() == "\n".join(cat_out) + "\n"
    edited = yamls[-1]
    (tmp_path / "tree.yaml").write_text(edited)
    assert check_cmd.startswith("treecoll tree check tree.yaml") and main(shlex.split(check_cmd)[1:]) == 0
    _shown_in(check_out, capsys.readouterr().out)
    assert run_cmd == "python allreduce_tree.py"
    res = pool4.run(tasks.readme_snippet, script, str(tmp_path), timeout=60)
    assert res == ast.literal_eval(run_out[0])


def test_two_and_eight_processes():
    for world, builders in ((2, ["chain", "double_binary", "auto"]), (8, ["binomial", "kary:3", "double_binary"])):
        with RankPool(world) as p:
            cases = [c for c in _cases(world, builders, rows=5) if world == 2 or c[2] != "pair"]
            _check(p.run(tasks.run_cases, cases, timeout=180))


def test_rank_exiting_early_is_an_error_naming_the_peer_then_the_group_is_unusable():
    with RankPool(3) as p:
        t0 = time.time()
        res = p.run(tasks.die_early, timeout=60, expect=2)
        assert res[1] is None
        for r in (0, 2):
            (_, first), (t_again, again), (t_other, other) = res[r]
            assert "allreduce: rank" in first and "rank 1" in first, first
            # later calls fail at once, say why (the first failure) and what to do
            for t, msg, what in ((t_again, again, "allreduce"), (t_other, other, "broadcast(root=0)")):
                assert t < 0.5, (t, msg)
                assert msg.startswith(
                    f"{what}: the process group is unusable: an earlier collective on it failed ("
                    + first.splitlines()[0][:60]
                ), msg
                assert "destroy it (torch.distributed.destroy_process_group(group)) and create a new one" in msg
        assert time.time() - t0 < 30


def test_rank_that_never_arrives_times_out():
    with RankPool(2) as p:
        t0 = time.time()
        res = p.run(tasks.never_arrives, timeout=60)
        assert "rank 0 failed receiving chunk 0 from rank 1 within 1.5 s" in res[0] and res[1] == "skipped", res
        assert time.time() - t0 < 30
