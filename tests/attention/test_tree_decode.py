"""tree_decode, ring_decode and allreduce3_decode against the float64 reference.

All multi-process cases run in ONE spawned group of 4 gloo processes (module
fixture); each case returns numbers that the tests below assert on.
"""

from functools import partial

import pytest
import torch
from treecoll.collectives.launch import spawn

P = 4
#: tree_decode's combine= methods, each against the reference ("gather" is also a method of its own below)
COMBINE_ARGS = ("tree", "allreduce3", "auto")
#: Relative error against the float64 reference.  bf16 K/V convert exactly to float32 and the
#: reference reads the same rounded values, so every case (fp32 or bf16 cache, float32 query) has
#: only float32 rounding: scores of head_dim <= 32 terms of size ~1 (error ~ 32 * 2^-24 ~ 2e-6),
#: softmax and value sums of <= 64 tokens, and a few merges; 1e-5 covers that with margin and
#: fails on any rounding of K, V or q to 16 bits (~4e-3).
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-5}


def _rel_err(x, ref):
    err = (x.double() - ref.double()).abs().max().item()
    scale = ref.double().abs().max().item()
    return err / scale if scale > 0 else err


def _shard(k, v, lengths, bounds, rank):
    """Rank's slice [bounds[rank], bounds[rank+1]) of every sequence, and its local lengths."""
    s, e = bounds[rank], bounds[rank + 1]
    local = [max(0, min(L, e) - s) for L in lengths]
    return k[:, s:e].contiguous(), v[:, s:e].contiguous(), local


def _cases():
    """(name, batch, q_heads, kv_heads, head_dim, seq, lengths, bounds, kv dtype, tree)."""
    from treecoll.collectives import Tree

    return [
        ("uneven", 1, 4, 4, 16, 37, [37], [0, 3, 20, 21, 37], torch.float32, "auto"),
        ("empty_shards", 2, 8, 2, 16, 24, [24, 24], [0, 0, 24, 24, 24], torch.float32, "auto"),
        ("batch_lengths_gqa", 3, 8, 2, 32, 40, [40, 7, 0], [0, 10, 20, 30, 40], torch.float32, "auto"),
        ("mqa_bf16", 2, 8, 1, 16, 64, [64, 33], [0, 16, 32, 48, 64], torch.bfloat16, "auto"),
        ("chain_tree", 2, 4, 2, 8, 20, [20, 13], [0, 5, 10, 15, 20], torch.float32, Tree.from_parents([-1, 0, 1, 2])),
        ("root2_tree", 1, 4, 2, 8, 20, [20], [0, 8, 9, 9, 20], torch.float32, Tree.from_parents([2, 2, -1, 2])),
        ("binomial_name", 2, 4, 4, 8, 16, [16, 3], [0, 4, 8, 12, 16], torch.float32, "binomial"),
    ]


def _worker(rank, nproc):
    from treecoll.attention import reference
    from treecoll.attention.baselines import allreduce3_decode, ring_decode
    from treecoll.attention.dist import count_traffic
    from treecoll.attention.tree_decode import choose_combine, resolve_tree, tree_decode
    from treecoll.topo.errors import AttentionError

    methods = {
        "tree": partial(tree_decode, combine="tree"),
        "ring": ring_decode,
        "allreduce3": allreduce3_decode,
        "gather": partial(tree_decode, combine="gather"),
    }
    res = {"cases": {}}
    for i, (name, b, hq, hkv, d, n, lengths, bounds, dtype, tree) in enumerate(_cases()):
        g = torch.Generator().manual_seed(100 + i)
        q = torch.randn(b, hq, d, generator=g)
        k = torch.randn(b, n, hkv, d, generator=g).to(dtype)
        v = torch.randn(b, n, hkv, d, generator=g).to(dtype)
        ref_out, _ = reference(q, k, v, kv_len=lengths)
        ks, vs, local = _shard(k, v, lengths, bounds, rank)
        case = {}
        for mname, fn in dict(
            methods,
            tree_native=partial(tree_decode, bcast="native"),
            tree_separate=partial(tree_decode, bcast="separate"),
            **{f"combine_{c}": partial(tree_decode, combine=c) for c in COMBINE_ARGS},
        ).items():
            out = fn(q, ks, vs, kv_len=local, tree=tree)
            case[mname] = {
                "err": _rel_err(out, ref_out),
                "dtype": str(out.dtype),
                "nan": bool(out.isnan().any()),
                "tol": TOL[dtype],
            }
        t = resolve_tree(tree)
        out = tree_decode(q, ks, vs, kv_len=local, tree=tree, root_only=True)
        case["root_only"] = {"root": t.root, "err": _rel_err(out, ref_out), "tol": TOL[dtype]}
        res["cases"][name] = case
    # traffic of one step per method, without the shape check (exact message bytes)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, 8, 16, generator=g)
    k = torch.randn(2, 12, 2, 16, generator=g)
    t = resolve_tree("auto")
    traffic = {}
    for mname, fn in {**methods, "default": tree_decode}.items():
        with count_traffic() as tr:
            fn(q, k, k, check=False)
        traffic[mname] = tr.as_dict()
    res["traffic"] = traffic
    res["default_picks"] = choose_combine(2, 8, 16)
    res["tree"] = {"parents": list(t.parents), "children": [list(c) for c in t.children]}
    # ranks that disagree on shapes: every rank raises, nobody hangs
    errors = {}
    for mname, fn in methods.items():
        hq = 8 if rank != 3 else 4
        try:
            fn(torch.randn(1, hq, 16), torch.randn(1, 5, 2, 16), torch.randn(1, 5, 2, 16))
            errors[mname] = None
        except AttentionError as e:
            errors[mname] = str(e)
    # one rank with invalid inputs (kv_len beyond its shard): all ranks raise
    for mname, fn in methods.items():
        try:
            fn(torch.randn(1, 4, 8), torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8), kv_len=[9 if rank == 1 else 5])
            errors[mname + "_invalid"] = None
        except AttentionError as e:
            errors[mname + "_invalid"] = str(e)
    res["errors"] = errors
    res["policy"] = {"bad_shard": _bad_shard(rank, methods), "bad_state": _bad_state(rank)}
    return res


#: the global token of sequence 0 whose key holds NaN (rank 2's shard), KV head 0 = query heads 0, 1
BAD_TOKEN, BAD_ROWS = 12, [0, 1]


def _rows_report(out, lse, ref_out, ref_lse, good):
    """NaN rows of out and lse, and the relative error of the other rows against the reference."""
    return {
        "nan_out_rows": torch.isnan(out[0]).all(-1).nonzero().flatten().tolist(),
        "any_nan_in_good": bool(torch.isnan(out[0, good]).any() or torch.isnan(lse[0, good]).any()),
        "nan_lse_rows": torch.isnan(lse[0]).nonzero().flatten().tolist(),
        "err": _rel_err(out[0, good], ref_out[0, good]),
        "lse_err": (lse[0, good].double() - ref_lse[0, good]).abs().max().item(),
    }


def _bad_shard(rank, methods):
    """One rank's K shard holds NaN: the rows reading it are NaN on every rank (the NaN/inf
    policy), every other row equals the float64 reference over all shards."""
    from treecoll.attention import reference

    g = torch.Generator().manual_seed(77)
    q = torch.randn(1, 4, 8, generator=g)
    k, v = torch.randn(1, 20, 2, 8, generator=g), torch.randn(1, 20, 2, 8, generator=g)
    k[0, BAD_TOKEN, 0, 3] = float("nan")
    ref_out, ref_lse = reference(q, k, v)
    ks, vs, local = _shard(k, v, [20], [0, 5, 10, 15, 20], rank)
    good = [h for h in range(4) if h not in BAD_ROWS]
    report = {}
    for mname, fn in dict(
        methods,
        tree_native=partial(methods["tree"], bcast="native"),
        tree_separate=partial(methods["tree"], bcast="separate"),
    ).items():
        out, lse = fn(q, ks, vs, kv_len=local, return_lse=True)
        report[mname] = _rows_report(out, lse, ref_out, ref_lse, good)
    return report


#: rows of the bad-state case: rank 1's lse of row 1 is +inf, rank 3's of row 2 NaN, rank 0's
#: row 3 is empty (0, -inf), row 0 is valid everywhere
INF_ROW, NAN_ROW, EMPTY_ROW = 1, 2, 3


def _rank_state(r):
    g = torch.Generator().manual_seed(500 + r)
    out, lse = torch.randn(1, 4, 6, generator=g), torch.randn(1, 4, generator=g) * 3
    if r == 1:
        lse[0, INF_ROW] = float("inf")
    if r == 3:
        lse[0, NAN_ROW] = float("nan")
    if r == 0:
        out[0, EMPTY_ROW], lse[0, EMPTY_ROW] = 0.0, float("-inf")
    return out, lse


def _bad_state(rank):
    """tree_combine (every bcast mode) and the three all-reduces with one rank's lse +inf and
    another's NaN: those rows NaN on every rank, the others the float64 merge of all ranks."""
    from treecoll.attention.baselines import allreduce3_combine
    from treecoll.attention.tree_decode import tree_combine, tree_root

    states = [_rank_state(r) for r in range(P)]
    lses = torch.stack([s[1] for s in states]).double()  # [P, 1, 4]
    good = [0, EMPTY_ROW]
    w = torch.softmax(lses[:, 0, good], 0)  # valid rows only (rank 0's empty row gets weight 0)
    ref_out = torch.zeros(1, 4, 6, dtype=torch.float64)
    ref_lse = torch.zeros(1, 4, dtype=torch.float64)
    ref_out[0, good] = (torch.stack([s[0][0, good].double() for s in states]) * w[..., None]).sum(0)
    ref_lse[0, good] = lses[:, 0, good].logsumexp(0)
    report = {}
    for name, fn in {
        "tree": partial(tree_combine, bcast="tree"),
        "separate": partial(tree_combine, bcast="separate"),
        "native": partial(tree_combine, bcast="native"),
        "allreduce3": allreduce3_combine,
        "gather": partial(tree_combine, combine="gather"),
        "combine_allreduce3": partial(tree_combine, combine="allreduce3"),
        "auto": partial(tree_combine, combine="auto"),
    }.items():
        out, lse = fn(*[t.clone() for t in states[rank]])
        report[name] = _rows_report(out, lse, ref_out, ref_lse, good)
    out, lse = tree_combine(*[t.clone() for t in states[rank]], root_only=True)
    if rank == tree_root():
        report["root_only"] = _rows_report(out, lse, ref_out, ref_lse, good)
    return report


@pytest.fixture(scope="module")
def group_results():
    return spawn(_worker, P, timeout=90)


ALL_METHODS = [
    "tree",
    "tree_native",
    "tree_separate",
    "ring",
    "allreduce3",
    "gather",
    *(f"combine_{c}" for c in COMBINE_ARGS),
]


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("case", [c[0] for c in _cases()])
def test_matches_reference(group_results, method, case):
    for rank, res in enumerate(group_results):
        r = res["cases"][case][method]
        assert r["dtype"] == "torch.float32" and not r["nan"]
        assert r["err"] <= r["tol"], (rank, r)


@pytest.mark.parametrize("case", [c[0] for c in _cases()])
def test_root_only_valid_on_root(group_results, case):
    root = group_results[0]["cases"][case]["root_only"]["root"]
    r = group_results[root]["cases"][case]["root_only"]
    assert r["err"] <= r["tol"], r


@pytest.mark.parametrize("method", ["tree", "tree_native", "tree_separate", "ring", "allreduce3", "gather"])
def test_nan_in_one_ranks_shard_reaches_every_rank(group_results, method):
    """The NaN/inf policy across processes: the rows that read rank 2's NaN key are NaN
    (out and lse) on every rank; the other rows keep every rank's keys."""
    for rank, res in enumerate(group_results):
        r = res["policy"]["bad_shard"][method]
        assert r["nan_out_rows"] == BAD_ROWS and r["nan_lse_rows"] == BAD_ROWS, (rank, r)
        assert not r["any_nan_in_good"] and r["err"] <= 1e-5 and r["lse_err"] <= 1e-5, (rank, r)


@pytest.mark.parametrize(
    "mode", ["tree", "separate", "native", "allreduce3", "root_only", "gather", "combine_allreduce3", "auto"]
)
def test_bad_state_of_one_rank_reaches_every_rank(group_results, mode):
    """A rank's +inf or NaN lse makes that row NaN everywhere (not the empty state, and
    not dropped); the valid rows are the float64 merge of every rank's state."""
    reports = [res["policy"]["bad_state"].get(mode) for res in group_results]
    assert sum(r is not None for r in reports) == (1 if mode == "root_only" else P)
    for rank, r in enumerate(reports):
        if r is None:
            continue
        assert r["nan_out_rows"] == [INF_ROW, NAN_ROW] and r["nan_lse_rows"] == [INF_ROW, NAN_ROW], (rank, r)
        assert not r["any_nan_in_good"] and r["err"] <= 1e-5 and r["lse_err"] <= 1e-5, (rank, r)


def test_tree_sends_one_state_per_edge(group_results):
    """Tree: a rank sends the packed state (2*8*17 floats) to its parent in the
    reduce and to each child in the broadcast; nothing depends on the context."""
    state = 2 * 8 * (16 + 1) * 4
    children = group_results[0]["tree"]["children"]
    parents = group_results[0]["tree"]["parents"]
    for rank, res in enumerate(group_results):
        expected = state * ((parents[rank] != -1) + len(children[rank]))
        assert res["traffic"]["tree"]["sent"] == expected


def test_the_default_combine_is_autos_pick(group_results):
    """tree_decode without combine= runs what combine="auto" picks (the cost model's fastest): the
    same bytes in the same calls as that method forced."""
    import inspect

    from treecoll.attention.tree_decode import tree_combine, tree_decode

    for fn in (tree_decode, tree_combine):
        assert inspect.signature(fn).parameters["combine"].default == "auto", fn.__name__
    picks = {res["default_picks"] for res in group_results}
    assert len(picks) == 1 and picks <= {"tree", "gather", "allreduce3"}, picks
    for res in group_results:
        assert res["traffic"]["default"] == res["traffic"][next(iter(picks))]


def test_gather_traffic(group_results):
    """gather: one all-gather of this rank's packed state (2*8*17 floats), nothing else."""
    for res in group_results:
        t = res["traffic"]["gather"]
        assert t["collective"] == 2 * 8 * 17 * 4 and sum(t["calls"].values()) == 1, t


def test_baseline_traffic(group_results):
    """3 all-reduces pass max (B*H), numerator (B*H*D) and denominator (B*H) in
    float32; ring ships the whole shard (K and V, fp32) P-1 times plus lengths."""
    ar = (2 * 8 + 2 * 8 * 16 + 2 * 8) * 4
    ring = (P - 1) * (2 * 12 * 2 * 16 * 4 * 2 + 2 * 4)
    for res in group_results:
        assert res["traffic"]["allreduce3"]["collective"] == ar
        assert res["traffic"]["allreduce3"]["calls"]["all_reduce"] == 3
        assert res["traffic"]["ring"]["p2p_sent"] == ring


@pytest.mark.parametrize("method", ["tree", "ring", "allreduce3", "gather"])
def test_shape_disagreement_raises_everywhere(group_results, method):
    for res in group_results:
        msg = res["errors"][method]
        assert msg is not None and "ranks disagree on q_heads" in msg and "rank 3: 4" in msg, msg
        msg = res["errors"][method + "_invalid"]
        assert msg is not None and ("kv_len" in msg or "rank(s) [1]" in msg), msg


def test_single_process_is_local_decode():
    from treecoll.attention import reference
    from treecoll.attention.baselines import allreduce3_decode, ring_decode
    from treecoll.attention.tree_decode import tree_decode

    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 8, generator=g)
    k, v = torch.randn(2, 9, 2, 8, generator=g), torch.randn(2, 9, 2, 8, generator=g)
    ref_out, ref_lse = reference(q, k, v, kv_len=[9, 4])
    for fn in (tree_decode, ring_decode, allreduce3_decode):
        out, lse = fn(q, k, v, kv_len=[9, 4], return_lse=True)
        assert out.dtype == torch.float32 and lse.dtype == torch.float32
        assert _rel_err(out, ref_out) <= TOL[torch.float32], fn.__name__
        assert (lse.double() - ref_lse).abs().max().item() <= 1e-5, fn.__name__


def test_tree_of_wrong_size_is_rejected(monkeypatch):
    from treecoll.attention.tree_decode import resolve_tree
    from treecoll.collectives import Tree
    from treecoll.topo.errors import TreeError

    with pytest.raises(TreeError, match=r"^tree 'given': spans 3 ranks, the group has 1; build it for 1 ranks$"):
        resolve_tree(Tree.from_parents([-1, 0, 0]))  # no process group: a group of one


def test_resolve_tree_takes_what_the_executor_takes(tmp_path):
    """Tree, multitree of one tree, tree file, path and builder name, through the planner, on a placement."""
    from treecoll.attention.tree_decode import resolve_tree, tree_root
    from treecoll.collectives import MultiTree, Placement, Tree, build, load_tree, save_tree
    from treecoll.topo import resolve
    from treecoll.topo.errors import AttentionError

    p = Placement(resolve("cpu-local"), 4)
    chain = Tree.from_parents([-1, 0, 1, 2], name="mine")
    save_tree(chain, tmp_path / "chain.yaml")
    for tree in (
        chain,
        MultiTree((chain,), (1.0,)),
        load_tree(tmp_path / "chain.yaml"),
        tmp_path / "chain.yaml",
        str(tmp_path / "chain.yaml"),
    ):
        assert resolve_tree(tree, placement=p).parents == (-1, 0, 1, 2), tree
    assert resolve_tree("auto", placement=p) == build("two_level", p, rails=False)
    assert tree_root(Tree.from_parents([2, 2, -1, 2]), placement=p) == 2
    with pytest.raises(AttentionError, match=r"^tree: 'double_binary' is a MultiTree of 2 trees"):
        resolve_tree("double_binary", placement=p)
    with pytest.raises(AttentionError, match=r"^placement: got a placement and a topology"):
        resolve_tree("auto", placement=p, topology=resolve("cpu-local"))


def test_unknown_combine_is_rejected():
    from treecoll.attention.tree_decode import tree_combine, tree_decode
    from treecoll.topo.errors import AttentionError

    q, k = torch.randn(1, 2, 4), torch.randn(1, 3, 1, 4)
    with pytest.raises(
        AttentionError,
        match=r"^combine: expected one of \['tree', 'gather', 'allreduce3', 'auto'\], "
        r"got 'flash'$",
    ):
        tree_decode(q, k, k, combine="flash")
    with pytest.raises(
        AttentionError,
        match=r"got 'ring'; ring moves the K/V shards, not states: call "
        r"treecoll.attention.ring_decode$",
    ):
        tree_combine(torch.zeros(1, 2, 4), torch.zeros(1, 2), combine="ring")


def test_the_combine_choice_cache_keeps_no_process_group_alive():
    """auto's choice is cached by what it depends on (topology, GPUs, shape, backend), never by the
    placement that names a process group, so a destroyed group is not kept alive by the cache."""
    import importlib

    from treecoll.collectives import Placement
    from treecoll.collectives.placement import Placement as PlacementType

    from treecoll import topo

    td = importlib.import_module("treecoll.attention.tree_decode")
    td._CHOSEN.clear()
    p = Placement(topo.resolve("dgx-h100-x2"), 4)
    assert td.choose_combine(1, 32, 128, placement=p) in ("tree", "gather", "allreduce3")
    (key,) = td._CHOSEN.keys()
    assert p.plan_key in key and not any(isinstance(x, PlacementType) for x in key)


def test_auto_takes_the_tree_when_asked_for_a_tree_option():
    """A given tree, root_only and a bcast other than "tree" are options of the tree alone: with
    combine="auto" they select it, whatever the cost model would pick."""
    from treecoll.attention.tree_decode import _auto
    from treecoll.collectives import Tree
    from treecoll.collectives.placement import Placement

    p = Placement(ranks=4)
    assert _auto(1, 8, 16, p, "auto", True, "tree") == "tree"
    assert _auto(1, 8, 16, p, "auto", False, "native") == "tree"
    assert _auto(1, 8, 16, p, "auto", False, "separate") == "tree"
    assert _auto(1, 8, 16, p, "binomial", False, "tree") == "tree"
    assert _auto(1, 8, 16, p, Tree.from_parents([-1, 0, 0, 0]), False, "tree") == "tree"
