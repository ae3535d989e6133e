"""Property tests: schedules run in-process (threads, LocalFabric) equal the single-process reference.

Random trees (and order-preserving ones for the non-commutative 2x2 matrix
product), chunk counts, dtypes, operators (sum, max, matrix product, a
tuple-valued operator), collectives and roots.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from treecoll.collectives import MultiTree, Tree
from treecoll.collectives.execute import CollectiveOptions, allreduce, broadcast, reduce
from treecoll.collectives.layout import Layout
from treecoll.collectives.local import run_ranks
from treecoll.collectives.ops import resolve_op
from treecoll.topo.errors import CollectiveError, TreeError

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16]


@st.composite
def trees(draw, min_size=1, max_size=7):
    n = draw(st.integers(min_size, max_size))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    perm = draw(st.permutations(range(n)))
    return Tree.from_parents(parents).relabel(list(perm))


@st.composite
def ordered_trees(draw, min_size=1, max_size=7):
    """Order-preserving trees: each subtree a consecutive range, children ascending."""
    n = draw(st.integers(min_size, max_size))
    parents = [-1] * n

    def split(lo, hi):  # subtree of ranks lo..hi-1 rooted at lo
        start = lo + 1
        while start < hi:
            end = draw(st.integers(start + 1, hi))
            parents[start] = lo
            split(start, end)
            start = end

    split(0, n)
    return Tree.from_parents(parents)


def matmul2(a, b):
    return a @ b


def pair(a, b):
    return (a[0] + b[0], torch.maximum(a[1], b[1]))


def _values(kind: str, n: int, rows: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        if kind == "matmul":
            out.append(
                torch.randn(rows, 2, 2, generator=g, dtype=torch.float64) * 0.5 + torch.eye(2, dtype=torch.float64)
            )
        elif kind == "pair":
            out.append((torch.randn(rows, 3, generator=g), torch.randint(-50, 50, (rows,), generator=g)))
        elif dtype.is_floating_point:
            out.append(torch.randn(rows, 3, generator=g).to(dtype))
        else:
            out.append(torch.randint(-1000, 1000, (rows, 3), generator=g, dtype=dtype))
    return out


def _reference(kind: str, vals):
    acc = vals[0]
    for v in vals[1:]:
        if kind == "matmul":
            acc = acc @ v
        elif kind == "pair":
            acc = (acc[0] + v[0], torch.maximum(acc[1], v[1]))
        elif kind == "max":
            acc = torch.maximum(acc, v)
        else:
            acc = acc + v
    return acc


def _close(a, b, dtype=torch.float64):
    if isinstance(a, tuple):
        return all(_close(x, y) for x, y in zip(a, b))
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    tol = 1e-2 if a.dtype == torch.float16 else 1e-5
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)


def _op(kind):
    return {"sum": "sum", "max": "max", "matmul": matmul2, "pair": pair}[kind]


def _clone(v):
    return tuple(x.clone() for x in v) if isinstance(v, tuple) else v.clone()


def _identical(a, b) -> bool:
    """Same object, or tuples of the same tensor objects."""
    return a is b or (isinstance(a, tuple) and isinstance(b, tuple) and all(x is y for x, y in zip(a, b)))


@SETTINGS
@given(
    tree=trees(),
    k=st.integers(1, 5),
    rows=st.integers(1, 9),
    dtype=st.sampled_from(DTYPES),
    kind=st.sampled_from(["sum", "max", "pair"]),
    use_out=st.booleans(),
    data=st.data(),
)
def test_random_trees_commutative(tree, k, rows, dtype, kind, use_out, data):
    """In place by default (the result in x, x returned; reduce leaves non-roots' x as it was);
    with out= the result goes there and x is left unmodified."""
    n = tree.size
    vals = _values(kind, n, rows, dtype, seed=rows * 31 + k)
    if kind == "sum" and dtype == torch.float16:
        vals = [v / n for v in vals]
    ref = _reference(kind, vals)
    before = [_clone(v) for v in vals]
    outs = [_clone(v) for v in vals] if use_out else [None] * n
    if use_out:
        for o in outs:
            for part in o if isinstance(o, tuple) else (o,):
                part.fill_(7)
    comm = True if kind == "pair" else None
    coll = data.draw(st.sampled_from(["allreduce", "reduce", "broadcast"]))
    root = data.draw(st.integers(0, n - 1))
    if coll == "allreduce":
        res = run_ranks(
            n,
            lambda r, t: allreduce(
                vals[r],
                op=resolve_op(_op(kind), commutative=comm),
                tree=tree,
                out=outs[r],
                _transport=t,
                options=CollectiveOptions(nchunks=k, timeout=10),
            ),
        )
        expect = [ref] * n
    elif coll == "reduce":
        res = run_ranks(
            n,
            lambda r, t: reduce(
                vals[r],
                root=root,
                op=resolve_op(_op(kind), commutative=comm),
                tree=tree,
                out=outs[r],
                _transport=t,
                options=CollectiveOptions(nchunks=k, timeout=10),
            ),
        )
        assert all(v is None for r, v in enumerate(res) if r != root)
        expect = [ref if r == root else None for r in range(n)]
    else:
        res = run_ranks(
            n,
            lambda r, t: broadcast(
                vals[r],
                root=root,
                tree=tree,
                out=outs[r],
                _transport=t,
                options=CollectiveOptions(nchunks=k, timeout=10),
            ),
        )
        expect = [before[root]] * n
    for r in range(n):
        if expect[r] is None:  # a reduce's non-root: x (and out) as they were
            assert _close(vals[r], before[r])
            if use_out:
                assert all(bool((p == 7).all()) for p in (outs[r] if isinstance(outs[r], tuple) else (outs[r],)))
            continue
        dest = outs[r] if use_out else vals[r]
        assert _identical(res[r], dest), (r, use_out)
        assert _close(dest, expect[r])
        if use_out:
            assert _close(vals[r], before[r])  # x unmodified


@SETTINGS
@given(tree=ordered_trees(), k=st.integers(1, 4), rows=st.integers(1, 6), data=st.data())
def test_non_commutative_matrix_product_keeps_rank_order(tree, k, rows, data):
    n = tree.size
    vals = _values("matmul", n, rows, None, seed=n * 7 + rows)
    ref = _reference("matmul", vals)
    root = data.draw(st.integers(0, n - 1))
    res = run_ranks(
        n,
        lambda r, t: allreduce(
            vals[r].clone(), op=matmul2, tree=tree, _transport=t, options=CollectiveOptions(nchunks=k, timeout=10)
        ),
    )
    assert all(_close(v, ref) for v in res)
    res = run_ranks(
        n,
        lambda r, t: reduce(
            vals[r].clone(),
            root=root,
            op=matmul2,
            tree=tree,
            _transport=t,
            options=CollectiveOptions(nchunks=k, timeout=10),
        ),
    )
    assert _close(res[root], ref)


@SETTINGS
@given(
    n=st.integers(1, 6),
    k=st.integers(1, 3),
    rows=st.integers(1, 8),
    kind=st.sampled_from(["sum", "matmul", "pair"]),
    algo=st.sampled_from(["ring", "rsag", "auto", "tree"]),
)
def test_ring_rsag_and_auto(n, k, rows, kind, algo):
    if algo == "ring" and kind == "matmul":
        algo = "rsag"
    vals = _values(kind, n, rows, torch.float64, seed=n + 10 * rows)
    ref = _reference(kind, vals)
    res = run_ranks(
        n,
        lambda r, t: allreduce(
            vals[r],
            op=resolve_op(_op(kind), commutative=True if kind == "pair" else None),
            _transport=t,
            options=CollectiveOptions(algo=algo, nchunks=k * n, timeout=10),
        ),
    )
    assert all(_close(v, ref) and _identical(v, x) for v, x in zip(res, vals))  # in place: x returned


@SETTINGS
@given(a=trees(3, 6), b=st.data(), share=st.floats(0.1, 0.9), k=st.integers(1, 3), rows=st.integers(1, 12))
def test_multitrees(a, b, share, k, rows):
    n = a.size
    perm = b.draw(st.permutations(range(n)))
    m = MultiTree((a, a.relabel(list(perm))), (share, 1 - share))
    vals = _values("pair", n, rows, None, seed=rows)
    ref = _reference("pair", vals)
    res = run_ranks(
        n,
        lambda r, t: allreduce(
            vals[r],
            op=resolve_op(pair, commutative=True),
            tree=m,
            _transport=t,
            options=CollectiveOptions(nchunks=k, timeout=10),
        ),
    )
    assert all(_close(v, ref) for v in res)


def test_in_place_by_default_and_out():
    n = 4
    xs = [torch.full((5, 2), float(r)) for r in range(n)]
    res = run_ranks(
        n, lambda r, t: allreduce(xs[r], tree="binomial", _transport=t, options=CollectiveOptions(nchunks=2, timeout=5))
    )
    assert all(v is x for v, x in zip(res, xs)) and all(torch.equal(x, torch.full((5, 2), 6.0)) for x in xs)
    # out=x is the same as the default
    res = run_ranks(
        n, lambda r, t: allreduce(xs[r], out=xs[r], tree="chain", _transport=t, options=CollectiveOptions(timeout=5))
    )
    assert all(v is x for v, x in zip(res, xs)) and all(torch.equal(x, torch.full((5, 2), 24.0)) for x in xs)
    # a non-contiguous x: one copy in and out, the result still lands in x
    ts = [torch.arange(6.0).view(2, 3).t() * (r + 1) for r in range(n)]
    res = run_ranks(
        n, lambda r, t: allreduce(ts[r], tree="binomial", _transport=t, options=CollectiveOptions(timeout=5))
    )
    assert all(v is x and torch.equal(x, torch.arange(6.0).view(2, 3).t() * 10) for v, x in zip(res, ts))
    outs = [torch.empty(5, 2) for _ in range(n)]
    src = [torch.full((5, 2), float(r)) for r in range(n)]
    res = run_ranks(
        n, lambda r, t: broadcast(src[r], root=2, out=outs[r], _transport=t, options=CollectiveOptions(timeout=5))
    )
    assert all(torch.equal(o, torch.full((5, 2), 2.0)) and v is o for v, o in zip(res, outs))
    assert all(torch.equal(x, torch.full((5, 2), float(r))) for r, x in enumerate(src))  # x unmodified
    with pytest.raises(CollectiveError, match="out expected shape"):
        run_ranks(1, lambda r, t: allreduce(torch.ones(3), out=torch.ones(4), _transport=t))
    with pytest.raises(CollectiveError, match=r"x cannot take the result in place: elements share memory"):
        run_ranks(
            2, lambda r, t: allreduce(torch.ones(1).expand(4), _transport=t, options=CollectiveOptions(timeout=5))
        )
    # ... while out= takes it
    res = run_ranks(
        2,
        lambda r, t: allreduce(
            torch.ones(1).expand(4), out=torch.empty(4), _transport=t, options=CollectiveOptions(timeout=5)
        ),
    )
    assert all(torch.equal(v, torch.full((4,), 2.0)) for v in res)


def test_in_place_on_tensors_that_require_grad():
    """Collectives run under no_grad, as torch.distributed's do: a leaf parameter takes the result."""
    ps = [torch.full((3,), float(r + 1), requires_grad=True) for r in range(3)]
    res = run_ranks(3, lambda r, t: allreduce(ps[r], tree="chain", _transport=t, options=CollectiveOptions(timeout=5)))
    assert all(v is p and torch.equal(p.detach(), torch.full((3,), 6.0)) for v, p in zip(res, ps))


def test_unchunkable_op_sees_whole_values():
    seen = []

    def whole(a, b):
        seen.append(a.shape)
        return a + b

    n = 3
    xs = [torch.ones(6, 2) for _ in range(n)]
    res = run_ranks(
        n,
        lambda r, t: allreduce(
            xs[r],
            op=resolve_op(whole, commutative=True, chunkable=False),
            tree="chain",
            _transport=t,
            options=CollectiveOptions(nchunks=4, timeout=5),
        ),
    )
    assert all(torch.equal(v, torch.full((6, 2), 3.0)) for v in res)
    assert set(seen) == {torch.Size([6, 2])}


def test_non_commutative_errors():
    with pytest.raises(TreeError, match="is not commutative, so the tree must be order preserving"):
        run_ranks(
            3,
            lambda r, t: allreduce(
                torch.eye(2)[None],
                op=matmul2,
                tree=Tree.from_parents([-1, 2, 0]),
                _transport=t,
                options=CollectiveOptions(timeout=5),
            ),
        )
    with pytest.raises(CollectiveError, match="algo 'ring' needs a commutative op"):
        run_ranks(
            2,
            lambda r, t: allreduce(
                torch.eye(2)[None], op=matmul2, _transport=t, options=CollectiveOptions(algo="ring", timeout=5)
            ),
        )


def test_local_mismatch_and_timeout():
    with pytest.raises(CollectiveError, match="ranks disagree on the collective"):
        run_ranks(2, lambda r, t: allreduce(torch.ones(2 + r), _transport=t, options=CollectiveOptions(timeout=5)))

    def late(r, t):
        if r == 1:
            return None
        return allreduce(torch.ones(2), _transport=t, options=CollectiveOptions(check=False, timeout=0.5))

    with pytest.raises(CollectiveError, match="rank 0 failed receiving chunk 0 from rank 1 within 0.5 s"):
        run_ranks(2, late)


@pytest.mark.parametrize("pack_bytes", [0, 64 << 10], ids=["parts", "packed"])
def test_tuple_layouts_parts_and_packed(monkeypatch, pack_bytes):
    """Tuples move as one packed message per chunk (small) or one message per part (large)."""
    import treecoll.collectives.layout as layout

    monkeypatch.setattr(layout, "PACK_BYTES", pack_bytes)
    n = 4
    vals = _values("pair", n, 10, None, seed=3)
    ref = _reference("pair", vals)
    for tree, k in ((Tree.from_parents([-1, 0, 1, 0]), 3), (Tree.from_parents([2, 2, -1, 2]), 1)):
        res = run_ranks(
            n,
            lambda r, t, tree=tree, k=k: allreduce(
                _clone(vals[r]),
                op=resolve_op(pair, commutative=True),
                tree=tree,
                _transport=t,
                options=CollectiveOptions(nchunks=k, timeout=10),
            ),
        )
        assert all(_close(v, ref) for v in res)
    res = run_ranks(
        n,
        lambda r, t: allreduce(
            _clone(vals[r]),
            op=resolve_op(pair, commutative=True),
            _transport=t,
            options=CollectiveOptions(algo="rsag", timeout=10),
        ),
    )
    assert all(_close(v, ref) for v in res)
    ins = [tuple(x.clone() for x in v) for v in vals]
    res = run_ranks(
        n,
        lambda r, t: allreduce(
            ins[r],
            op=resolve_op(pair, commutative=True),
            out=ins[r],
            _transport=t,
            options=CollectiveOptions(timeout=10),
        ),
    )
    assert all(_close(v, ref) and _close(i, ref) for v, i in zip(res, ins))
    assert Layout.of(vals[0], resolve_op(pair), [1.0]).mode == ("packed" if pack_bytes else "rows")


# ---------------------------------------------------------------------- what a careful user tries
def test_bad_arguments_are_one_line_errors():
    def one(fn, n=2):
        return run_ranks(n, lambda r, t: fn(r, t))

    with pytest.raises(CollectiveError, match=r"^op 'avg': unknown; valid names are \['max', 'min', 'prod', 'sum'\]"):
        one(lambda r, t: allreduce(torch.ones(2), op="avg", _transport=t, options=CollectiveOptions(timeout=5)))
    for root, got in ((5, "got 5"), (-1, "got -1")):
        with pytest.raises(
            CollectiveError, match=rf"^reduce\(root={root}\): root expected a group rank in 0..1, {got}$"
        ):
            one(
                lambda r, t, root=root: reduce(
                    torch.ones(2), root=root, _transport=t, options=CollectiveOptions(timeout=5)
                )
            )
    with pytest.raises(CollectiveError, match=r"root expected an integer group rank, got bool True"):
        one(lambda r, t: reduce(torch.ones(2), root=True, _transport=t, options=CollectiveOptions(timeout=5)))
    with pytest.raises(CollectiveError, match=r"root expected an integer group rank, got float 1.0"):
        one(lambda r, t: broadcast(torch.ones(2), root=1.0, _transport=t, options=CollectiveOptions(timeout=5)))
    # the less common knobs are checked when the options are built, before any call
    for k in (0, -1, True):
        with pytest.raises(
            CollectiveError,
            match=rf"^options: nchunks expected a positive integer or None .*, "
            rf"got {k}$",
        ):
            CollectiveOptions(nchunks=k)
    for s in (0, -1, float("nan"), float("inf")):
        with pytest.raises(CollectiveError, match=r"^options: timeout expected a positive number of seconds"):
            CollectiveOptions(timeout=s)
    with pytest.raises(CollectiveError, match=r"^options: check expected True, False or 'always', got 'yes'$"):
        CollectiveOptions(check="yes")
    with pytest.raises(
        CollectiveError,
        match=r"^options: algo expected one of \['auto', 'tree', 'ring', 'rsag', "
        r"'direct'\], got 'fast'$",
    ):
        CollectiveOptions(algo="fast")
    with pytest.raises(CollectiveError, match=r"^allreduce: options expected a CollectiveOptions or None, got dict$"):
        one(lambda r, t: allreduce(torch.ones(4), _transport=t, options={"timeout": 5}))
    with pytest.raises(CollectiveError, match=r"^value: expected tensors holding data, got tensors on device 'meta'$"):
        one(lambda r, t: allreduce(torch.ones(2, device="meta"), _transport=t, options=CollectiveOptions(timeout=5)))
    with pytest.raises(CollectiveError, match=r"^value: expected a tensor or a non-empty tuple of tensors, got list$"):
        one(lambda r, t: allreduce([1.0, 2.0], _transport=t, options=CollectiveOptions(timeout=5)))


def test_empty_and_zero_dimensional_values():
    res = run_ranks(3, lambda r, t: allreduce(torch.ones(0, 4), _transport=t, options=CollectiveOptions(timeout=5)))
    assert all(v.shape == (0, 4) for v in res)
    res = run_ranks(
        3,
        lambda r, t: allreduce(
            (torch.ones(0, 3), torch.ones(0)),
            op=resolve_op(pair, commutative=True),
            _transport=t,
            options=CollectiveOptions(timeout=5),
        ),
    )
    assert all(v[0].shape == (0, 3) and v[1].shape == (0,) for v in res)
    xs = [torch.tensor(float(r)) for r in range(3)]
    res = run_ranks(3, lambda r, t: allreduce(xs[r], tree="chain", _transport=t, options=CollectiveOptions(timeout=5)))
    assert all(v is x and float(x) == 3.0 for v, x in zip(res, xs))


def test_non_associative_operators_are_refused():
    def avg(a, b):
        return (a + b) / 2

    with pytest.raises(
        CollectiveError,
        match=r"^allreduce: op '.*avg' is not associative: \(a op b\) op c and "
        r"a op \(b op c\) differ by .* so the result would depend on the tree",
    ):
        run_ranks(
            4,
            lambda r, t: allreduce(
                torch.ones(3), op=resolve_op(avg, commutative=True), _transport=t, options=CollectiveOptions(timeout=5)
            ),
        )
    with pytest.raises(CollectiveError, match="is not associative"):
        run_ranks(
            3,
            lambda r, t: reduce(
                torch.ones(2, 2), op=lambda a, b: a - b, _transport=t, options=CollectiveOptions(timeout=5)
            ),
        )
    # declared associative: not probed (the caller takes responsibility)
    avg.associative = True
    res = run_ranks(
        2,
        lambda r, t: allreduce(
            torch.full((3,), float(r)),
            op=resolve_op(avg, commutative=True),
            tree="chain",
            _transport=t,
            options=CollectiveOptions(timeout=5),
        ),
    )
    assert all(v.tolist() == [0.5] * 3 for v in res)
    # associative operators pass, up to their dtype's rounding (fp16 matrix products too)
    res = run_ranks(
        3,
        lambda r, t: allreduce(
            torch.eye(2, dtype=torch.float16)[None].repeat(4, 1, 1),
            op=matmul2,
            _transport=t,
            options=CollectiveOptions(timeout=5),
        ),
    )
    assert all(torch.equal(v, torch.eye(2, dtype=torch.float16)[None].repeat(4, 1, 1)) for v in res)
    # without check the probe is skipped, and the result depends on the tree: what the probe prevents
    for tree, want in (("chain", 0 - (1 - 2)), ("binomial", (0 - 1) - 2)):
        res = run_ranks(
            3,
            lambda r, t, tree=tree: allreduce(
                torch.tensor([float(r)]),
                op=lambda a, b: a - b,
                tree=tree,
                _transport=t,
                options=CollectiveOptions(check=False, timeout=5),
            ),
        )
        assert [float(v) for v in res] == [want] * 3


def test_operator_errors_name_the_op_and_leave_the_group_unusable():
    from treecoll.collectives.local import LocalFabric

    def boom(a, b):
        raise ZeroDivisionError("division by zero")

    fabric = LocalFabric(2)
    errors = [None, None]

    def body(r):
        try:
            allreduce(
                torch.ones(2),
                op=resolve_op(boom, commutative=True),
                _transport=fabric.transport(r),
                options=CollectiveOptions(check=False, timeout=1),
            )
        except CollectiveError as e:
            errors[r] = str(e)

    import threading

    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert any(
        e
        and re.match(
            r"allreduce: op '.*boom' raised ZeroDivisionError on rank \d \(chunk 0\): division by "
            r"zero$",
            e,
        )
        for e in errors
    ), errors
    with pytest.raises(
        CollectiveError,
        match=r"^broadcast\(root=0\): the process group is unusable: an earlier "
        r"collective on it failed \(allreduce: ",
    ):
        broadcast(torch.ones(2), _transport=fabric.transport(0), options=CollectiveOptions(timeout=1))


def test_call_shapes_that_differ_after_agreement():
    """Both ranks agreed on shapes [2] and [3] before; then they call with different ones. The
    messages carry a tag from the call's fingerprint, so they never match: a timeout naming the
    peer (never mixed data); check="always" compares every call and fails at once."""
    fabric_calls = [(2, 2), (3, 3)]

    def body(r, t):
        for a, b in fabric_calls:
            allreduce(torch.ones(a if r == 0 else b), tree="chain", _transport=t, options=CollectiveOptions(timeout=5))
        try:
            allreduce(
                torch.ones(2 if r == 0 else 3), tree="chain", _transport=t, options=CollectiveOptions(timeout=0.5)
            )
        except CollectiveError as e:
            return str(e)
        return "no error"

    res = run_ranks(2, body)
    assert all("within 0.5 s" in m and "elements" not in m for m in res), res

    def always(r, t):
        for a in (2, 3):
            allreduce(torch.ones(a), tree="chain", _transport=t, options=CollectiveOptions(timeout=5))
        try:
            allreduce(
                torch.ones(2 if r == 0 else 3),
                tree="chain",
                _transport=t,
                options=CollectiveOptions(check="always", timeout=5),
            )
        except CollectiveError as e:
            return str(e)
        return "no error"

    res = run_ranks(2, always)
    assert all("ranks disagree on the collective" in m and "float32[2]" in m and "float32[3]" in m for m in res), res
