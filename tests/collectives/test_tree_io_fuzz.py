"""Fuzzing the tree-file reader: any bytes end in a TreecollError or a valid TreeFile, quickly."""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from treecoll.collectives import MultiTree, Tree, build
from treecoll.collectives.tree_io import TreeFile, dumps_tree, load_tree
from treecoll.topo.errors import TreecollError

#: real tree files to mutate: every form the reader knows
SEEDS = [
    dumps_tree(build("binomial", nranks=6), hosts=[f"h{r // 2}" for r in range(6)]).encode(),
    dumps_tree(build("double_binary", nranks=5)).encode(),
    dumps_tree(Tree.from_children([[2, 1], [], [3], []]), fmt="json").encode(),
    b"nested:\n  rank: 0\n  children:\n    - rank: 1\n    - rank: 2\n      children: [{rank: 3}]\n",
    b"name: two\ntrees:\n  - {parents: [-1, 0, 0], share: 0.25}\n  - {children: [[], [0, 2], []], share: 0.75}\n",
    json.dumps({"ranks": 3, "hosts": ["a", "a", "b"], "parents": [-1, 0, 1]}).encode(),
]
#: seconds one file may take to read (the files here are at most a few kB)
PER_FILE_S = 1.0


def _read(data: bytes):
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        t0 = time.perf_counter()
        try:
            res = load_tree(path)
        except TreecollError as e:
            res = e
        assert time.perf_counter() - t0 < PER_FILE_S
    finally:
        os.unlink(path)
    if isinstance(res, TreeFile):
        plan = res.plan
        assert isinstance(plan, (Tree, MultiTree)) and plan.size >= 1
        assert res.hosts is None or len(res.hosts) == plan.size
        plan.fingerprint()
    else:
        msg = str(res)
        assert msg and "\n" not in msg.strip() and msg.startswith(path), msg  # one line naming the file
    return res


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=512))
def test_any_bytes(data):
    _read(data)


@st.composite
def mutated(draw):
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "token"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[i : i + draw(st.integers(1, 8))]
        else:
            data[i:i] = draw(
                st.sampled_from(
                    [
                        b"-1",
                        b"99999999999",
                        b"1e308",
                        b"[",
                        b"]",
                        b"{",
                        b"}",
                        b"&a ",
                        b"*a",
                        b"!!python/object ",
                        b"\t",
                        b"\x00",
                        b"null",
                        b"true",
                        b" - ",
                        b"nested:",
                        b"children: [[0]]",
                        b"share: -1",
                        b"\xff\xfe",
                    ]
                )
            )
    return bytes(data)


@FUZZ
@given(mutated())
def test_mutated_real_files(data):
    _read(data)


@pytest.mark.parametrize(
    "text, match",
    [
        ("parents: " + "[" * 5000 + "]" * 5000 + "\n", r"t.yaml"),
        ("nested: " + "{rank: 0, children: [" * 600 + "]}" * 600 + "\n", r"t.yaml"),
        (
            (
                "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                "e: [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nparents: [-1]\n"
            ),
            r"t.yaml",
        ),
    ],
)
def test_deep_and_aliased_files_end_in_one_error(text, match, tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text(text)
    t0 = time.perf_counter()
    with pytest.raises(TreecollError, match=match):
        load_tree(p)
    assert time.perf_counter() - t0 < PER_FILE_S
