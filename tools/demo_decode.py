"""Demo steps of tree-attention decoding (appended to :data:`tools.demo.STEPS`).

1. the two-level tree on the embedded default topology (two DGX H100);
2. the simulator's prediction there for one decode step's communication:
   tree attention's combine (reduce + broadcast of the packed state) versus
   Ring Attention's K/V circulation (a ring all-gather of the whole KV cache);
3. a real decode on this machine: 4 gloo processes, a small random context,
   tree vs ring vs the paper's three all-reduces, checked against one process.
"""
from __future__ import annotations

from typing import Callable

__all__ = ["STEPS", "DEMO_DECODE"]

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B attention
#: the decode the demo runs (small enough for about half a minute on 2 busy cores)
DEMO_DECODE = {"seq_len": 8192, "batch": 1, "layers": 1, "heads": HEADS, "kv_heads": KV_HEADS,
               "head_dim": HEAD_DIM, "new_tokens": 4, "dtype": "bfloat16", "block_size": 256,
               "methods": ["tree", "ring", "allreduce3"], "seed": 0, "topology": None, "check": True}


def _state_bytes(batch: int = 1) -> int:
    return batch * HEADS * (HEAD_DIM + 1) * 4


def step_tree(state: dict) -> None:
    import topo
    from collectives import builders

    t = state.get("topology") or topo.default()
    state["topology"] = t
    tree = builders.build("two_level", t, None, rails=False)
    state["attention_tree"] = tree
    try:
        from tools.cmd_tree import render_tree, tree_data
    except ImportError:
        print(f"two_level tree over {tree.size} ranks of {t.name}: parents {list(tree.parents)}")
        return
    print(render_tree(tree_data(tree, t, _state_bytes())))


def step_simulate(state: dict) -> None:
    try:
        from collectives.sim import simulate_algorithm
    except ImportError:
        print("collectives.sim is not available: skipped")
        return
    t = state["topology"]
    nb = _state_bytes()
    tree = simulate_algorithm(t, "two_level", nb, collective="allreduce", rails=False)
    print(f"{t.name}, {len(t.gpus())} GPUs, Llama-3.1-8B attention (32 q / 8 kv heads x 128), batch 1, bf16 KV")
    print(f"{'context':>9} {'tree combine (us)':>18} {'ring K/V pass (us)':>19} {'ring/tree':>10}")
    for n in (32768, 131072, 1048576):
        kv = n * KV_HEADS * HEAD_DIM * 2 * 2  # K and V, bf16, whole cache
        kv -= kv % len(t.gpus())
        ring = simulate_algorithm(t, "ring", kv, collective="allgather", dtype="bfloat16")
        print(f"{n:>9} {tree.time * 1e6:>18.1f} {ring.time * 1e6:>19.1f} {ring.time / tree.time:>9.0f}x")
    print(f"tree: {nb} B packed state up and down the tree, whatever the context; ring: every K/V shard "
          f"visits every rank (P-1 hops)")


def step_decode(state: dict) -> None:
    from tools.cmd_decode import decode_data, render

    d = decode_data(dict(DEMO_DECODE), 4, timeout=300)
    state["decode"] = d
    print(render(d))


STEPS: list[tuple[str, Callable[[dict], None]]] = [
    ("Tree attention: the two-level tree on the default topology", step_tree),
    ("Tree attention vs Ring Attention, simulated on the default topology", step_simulate),
    ("Tree attention decoding on this machine (4 gloo processes), checked against one process", step_decode),
]
