"""Tasks run on every rank of a :class:`treecoll.collectives.launch.RankPool`: ``task(rank, world, *args)``."""

from __future__ import annotations

import os

import torch
from treecoll.collectives.execute import CollectiveOptions, allreduce, broadcast, reduce
from treecoll.collectives.ops import resolve_op
from treecoll.collectives.placement import Placement
from treecoll.topo.errors import CollectiveError

from tests.helpers import shipped
from treecoll import collectives


def matmul2(a, b):
    """Non-commutative, associative: batched 2x2 matrix product."""
    return a @ b


def pair_op(a, b):
    """A tuple-valued operator: (sum, max) over (float32 [n, 3], float64 [n])."""
    return (a[0] + b[0], torch.maximum(a[1], b[1]))


OPS = {"sum": "sum", "max": "max", "matmul": matmul2, "pair": pair_op}


def value(op: str, rank: int, seed: int, rows: int):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if op == "matmul":
        return torch.randn(rows, 2, 2, generator=g, dtype=torch.float64) * 0.5 + torch.eye(2, dtype=torch.float64)
    if op == "pair":
        return (torch.randn(rows, 3, generator=g), torch.randn(rows, generator=g, dtype=torch.float64))
    return torch.randn(rows, 5, generator=g, dtype=torch.float64)


def reference(op: str, values):
    if op == "matmul":
        out = values[0]
        for v in values[1:]:
            out = out @ v
        return out
    if op == "pair":
        return (sum(v[0] for v in values), torch.stack([v[1] for v in values]).max(0).values)
    if op == "max":
        return torch.stack(values).max(0).values
    return sum(values)


def _close(a, b) -> bool:
    if isinstance(a, tuple):
        return all(_close(x, y) for x, y in zip(a, b))
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)


def _clone(v):
    return tuple(t.clone() for t in v) if isinstance(v, tuple) else v.clone()


def _is(a, b) -> bool:
    return a is b or (isinstance(a, tuple) and all(x is y for x, y in zip(a, b)))


def run_cases(rank: int, world: int, cases: list) -> list:
    """Each case: (collective, tree, op, nchunks, root, rows, seed, algo, topology name or None, ranks).
    A case passes when the result is right and lands in x (in place, x returned; a reduce's
    non-roots return None and keep x as it was)."""
    out = []
    for collective, tree, op, nchunks, root, rows, seed, algo, tname, granks in cases:
        topology = shipped(tname) if tname else None
        values = [value(op, r, seed, rows) for r in range(world)]
        x = _clone(values[rank])
        placement = Placement(topology, granks) if topology is not None else None
        kw = dict(tree=tree, placement=placement, options=CollectiveOptions(algo=algo, nchunks=nchunks, timeout=20))
        opx = resolve_op(OPS[op], commutative=True) if op == "pair" else OPS[op]
        if collective == "allreduce":
            res = allreduce(x, op=opx, **kw)
            ok = _is(res, x) and _close(res, reference(op, values))
        elif collective == "reduce":
            res = reduce(x, op=opx, root=root, **kw)
            ok = (
                (_is(res, x) and _close(res, reference(op, values)))
                if rank == root
                else (res is None and _close(x, values[rank]))
            )
        else:
            res = broadcast(x, root=root, **kw)
            ok = _is(res, x) and _close(res, values[root])
        out.append(bool(ok))
    return out


def tree_mismatch(rank: int, world: int) -> str:
    try:
        allreduce(
            torch.ones(8), tree="chain" if rank == 0 else "binomial", options=CollectiveOptions(nchunks=1, timeout=10)
        )
    except CollectiveError as e:
        return str(e)
    return "no error"


def shape_mismatch(rank: int, world: int) -> str:
    try:
        allreduce(torch.ones(8 + (rank == world - 1), 2), tree="binomial", options=CollectiveOptions(timeout=10))
    except CollectiveError as e:
        return str(e)
    return "no error"


def die_early(rank: int, world: int) -> list:
    """Rank 1 leaves after one successful call; the others' next call must fail naming it, and
    every later call (another collective too) at once, saying the group is unusable.
    Returns [(seconds, message)] for the three calls after rank 1 left."""
    import time

    x = torch.ones(1000)
    allreduce(x, tree="chain", options=CollectiveOptions(nchunks=2, timeout=5))
    import torch.distributed as dist

    dist.barrier()  # everybody finished the first call before rank 1 leaves
    if rank == 1:
        os._exit(0)
    out = []
    for call in (
        lambda: allreduce(x, tree="chain", options=CollectiveOptions(nchunks=2, timeout=5)),
        lambda: allreduce(x, tree="chain", options=CollectiveOptions(nchunks=2, timeout=5)),
        lambda: broadcast(x, root=0, tree="binomial", options=CollectiveOptions(timeout=5)),
    ):
        t0 = time.monotonic()
        try:
            call()
            out.append((time.monotonic() - t0, "no error"))
        except CollectiveError as e:
            out.append((time.monotonic() - t0, str(e)))
    return out


def same_tree_everywhere(rank: int, world: int, builder: str) -> str:
    return collectives.build(builder, nranks=world).fingerprint()


def never_arrives(rank: int, world: int) -> str:
    """Rank 1 does not call; rank 0's reduce must time out naming it."""
    import time

    if rank == 1:
        time.sleep(2.5)
        return "skipped"
    try:
        reduce(torch.ones(4), root=0, tree="chain", options=CollectiveOptions(check=False, timeout=1.5))
    except CollectiveError as e:
        return str(e)
    return "no error"


def subgroup(rank: int, world: int) -> list:
    """Ranks 1..world-1 form a group; group-local ranks and roots are translated to global ones."""
    import torch.distributed as dist

    members = list(range(1, world))
    g = dist.new_group(members)  # every rank must call new_group
    if rank == 0:
        return ["not a member"]
    me = members.index(rank)  # group-local rank
    out = []
    out.append(
        float(allreduce(torch.tensor([float(rank)]), group=g, tree="chain", options=CollectiveOptions(timeout=10))[0])
        == sum(members)
    )
    res = reduce(
        torch.tensor([float(rank)]), root=1, group=g, tree="binomial", options=CollectiveOptions(timeout=10)
    )  # group rank 1 = global 2
    out.append((float(res[0]) == sum(members)) if me == 1 else res is None)
    b = broadcast(torch.tensor([float(rank)]), root=len(members) - 1, group=g, options=CollectiveOptions(timeout=10))
    out.append(float(b[0]) == members[-1])
    m = allreduce(torch.eye(2)[None] * (me + 1), op=matmul2, group=g, options=CollectiveOptions(timeout=10))
    ref = torch.eye(2)[None]
    for i in range(len(members)):
        ref = ref @ (torch.eye(2)[None] * (i + 1))
    out.append(bool(torch.equal(m, ref)))
    return out


def shapes_differ_after_agreement(rank: int, world: int) -> tuple:
    """On a fresh group of every rank: all agree on shapes [8] and [9]; then rank 1 calls [9]
    while the others call [8] (each skips the exchange it already made). Returns the
    (seconds, message) of that call and of the next one, and the sum of an allreduce on the
    default group afterwards (other groups stay usable)."""
    import time

    import torch.distributed as dist

    g = dist.new_group(list(range(world)))
    for n in (8, 9):
        allreduce(torch.ones(n), tree="chain", group=g, options=CollectiveOptions(timeout=10))
    out = []
    for _ in range(2):
        t0 = time.monotonic()
        try:
            allreduce(torch.ones(9 if rank == 1 else 8), tree="chain", group=g, options=CollectiveOptions(timeout=2))
            out.append((time.monotonic() - t0, "no error"))
        except CollectiveError as e:
            out.append((time.monotonic() - t0, str(e)))
    dist.barrier()
    return out, float(allreduce(torch.ones(1), tree="binomial", options=CollectiveOptions(timeout=10))[0])


def destroyed_group_is_freed(rank: int, world: int) -> dict:
    """Collectives and tree_decode on a new group (plans, schedules, agreements, scratch buffers and a
    discovered topology are kept for it), then the group is destroyed: no cache may keep it alive.
    Returns what the caches held for the group before, and whether the group object was freed."""
    import gc
    import weakref

    import torch.distributed as dist
    from treecoll.attention.tree_decode import tree_decode
    from treecoll.collectives import group as group_mod
    from treecoll.collectives.planner import default_planner

    g = dist.new_group(list(range(world)))
    twin = dist.new_group(list(range(world)))  # the same ranks: another communicator
    same = {
        "equal": Placement(group=g) == Placement(group=g) and hash(Placement(group=g)) == hash(Placement(group=g)),
        "twin_differs": Placement(group=g) != Placement(group=twin),
        "default_differs": Placement(group=g) != Placement(ranks=world),
    }
    dist.destroy_process_group(twin)
    opts = CollectiveOptions(timeout=10)
    a = allreduce(torch.full((4,), float(rank)), tree="chain", group=g, options=opts)
    p = Placement(shipped("cpu-local"), world, group=g)
    b = allreduce(torch.ones(3, 2), tree="two_level", placement=p, options=opts)
    gen = torch.Generator().manual_seed(5)  # the same query and keys on every rank
    q, k = torch.randn(1, 2, 8, generator=gen), torch.randn(1, 3, 2, 8, generator=gen)
    out = tree_decode(q, k, k, group=g)
    planner = default_planner()
    held = {
        "agreements": len(planner.comm_cache(g).agreed),
        "topology": g in planner._topologies,
        "info": g in group_mod._INFO,
    }
    ref = weakref.ref(g)
    dist.destroy_process_group(g)
    del g, p
    gc.collect()
    return {
        "sum": a.tolist(),
        "two_level": b.tolist(),
        "decoded": bool(torch.isfinite(out).all()),
        "held": held,
        "freed": ref() is None,
        "placement": same,
    }


def readme_snippet(rank: int, world: int, source: str, cwd: str, func: str = "work"):
    """Run ``func(rank, world)`` of a README Python snippet (its ``__main__`` block is not run) in ``cwd``."""
    old = os.getcwd()
    os.chdir(cwd)
    try:
        namespace = {"__name__": "readme_snippet"}
        exec(compile(source, "README.md", "exec"), namespace)  # noqa: S102 - the README's own example
        return namespace[func](rank, world)
    finally:
        os.chdir(old)


# --------------------------------------------------------------------------- the launcher's own tests


def whoami(rank: int, world: int) -> tuple:
    """This rank's arguments, its env:// variables and the sum of the ranks over the group."""
    import torch.distributed as dist

    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    env = tuple(os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"))
    return rank, world, env, float(total)


def rank_only(rank: int, world: int) -> int:
    """No collective: runs on any subset of the ranks."""
    return rank * 10


def refuse_on(rank: int, world: int, bad: int) -> int:
    if rank == bad:
        raise ValueError(f"rank {bad} refuses")
    return rank


def unpicklable_on(rank: int, world: int, bad: int):
    return (lambda: None) if rank == bad else rank


def sleep_on(rank: int, world: int, who: int, seconds: float, pid_dir: str) -> int:
    """Write this rank's pid to ``pid_dir``; rank ``who`` then sleeps ``seconds``."""
    import time

    with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if rank == who:
        time.sleep(seconds)
    return rank


def native_choice(rank: int, world: int, sizes: list[int], step_s: float | None = None) -> list[tuple]:
    """Per size: (whether allreduce(x) with its defaults ran gloo's own all_reduce, whether the
    planner prefers it, the result == the sum); then the same with an explicit tree and with a
    user operator (never native). ``step_s``: the executor's per-message cost on gloo in this rank
    (default: the fitted one), so that a test can make the model prefer either side."""
    import dataclasses

    from treecoll.collectives import group
    from treecoll.collectives.executor_cost import EXECUTOR_COSTS
    from treecoll.collectives.planner import default_planner

    calls = []
    original = group.TorchTransport.native_allreduce
    fitted = EXECUTOR_COSTS["gloo"]

    def counting(self, tensor, op, timeout):
        calls.append(op.name)
        return original(self, tensor, op, timeout)

    group.TorchTransport.native_allreduce = counting
    if step_s is not None:
        EXECUTOR_COSTS["gloo"] = dataclasses.replace(fitted, step_s=step_s, by_nranks=())
    default_planner().clear()
    try:
        out = []
        for n in sizes:
            x = torch.full((n // 4,), float(rank + 1))
            before = len(calls)
            y = allreduce(x)
            want = float(world * (world + 1) // 2)
            prefer = default_planner().prefer_native(nbytes=n, placement=Placement(ranks=world), backend="gloo")
            out.append((n, len(calls) > before, prefer, bool((y == want).all())))
        before = len(calls)
        allreduce(torch.ones(1 << 18), tree="binomial")
        allreduce(torch.ones(1 << 18), op=lambda a, b: a + b)
        out.append(("explicit tree, user op", len(calls) > before, False, True))
        return out
    finally:
        group.TorchTransport.native_allreduce = original
        EXECUTOR_COSTS["gloo"] = fitted
        default_planner().clear()


def late_large_answer(rank: int, world: int, delay: float, nbytes: int) -> bytes | None:
    """Rank 0 answers at once; the other ranks after ``delay`` s with ``nbytes`` bytes (more than a
    pipe holds), so that a call returning after rank 0 (``expect=1``) leaves them writing."""
    import time

    if rank == 0:
        return None
    time.sleep(delay)
    return bytes(nbytes)


def length_of(rank: int, world: int, blob: bytes) -> int:
    return len(blob)
