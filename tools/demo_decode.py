"""Demo steps of tree-attention decoding (appended to :data:`treecoll.tools.demo.STEPS`).

1. the two-level tree on the embedded default topology (two DGX H100), as
   ``treecoll tree build`` prints it (times as treecoll's executor runs the tree:
   :func:`treecoll.collectives.sim.executor.predict_tree`);
2. one decode step there as ``treecoll simulate decode`` models it: local
   attention, then the partial states combined by the tree, by one
   all-gather, or by the paper's three all-reduces, versus Ring Attention
   (K/V shards passed around the ring), and the combine ``auto`` picks;
3. a real decode on this machine: 4 gloo processes, a small random context,
   the tree, ``auto`` (the combine ``tree_decode`` runs by default), ring and the
   paper's three all-reduces, checked against one process.

Steps 1 and 2 call the functions the commands call, with the same arguments
(:data:`TREE_ARGV`, :data:`SIMULATE_ARGV`), and print the command line: every
number they show is the number the command prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from treecoll.topo import Topology

__all__ = [
    "STEPS",
    "DEMO_DECODE",
    "TREE_ARGV",
    "SIMULATE_ARGV",
    "SIMULATED_METHODS",
    "tree_case",
    "simulate_case",
    "simulated_rows",
]

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3.1-8B attention
#: bytes of the packed attention state one decode step reduces (batch 1, fp32 out and lse)
STATE_BYTES = HEADS * (HEAD_DIM + 1) * 4
#: context lengths of the simulated comparison
CONTEXTS = (32768, 131072, 1048576)
#: the decode the demo runs (small enough for about half a minute on 2 busy cores)
DEMO_DECODE = {
    "seq_len": 8192,
    "batch": 1,
    "layers": 1,
    "heads": HEADS,
    "kv_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "new_tokens": 8,
    "dtype": "bfloat16",
    "block_size": 256,
    "methods": ["tree", "auto", "ring", "allreduce3"],
    "seed": 0,
    "topology": None,
    "check": True,
}

#: the ``treecoll`` command each step's numbers equal (tests/tools/test_demo.py runs both and compares)
TREE_ARGV = [
    "tree",
    "build",
    "--topology",
    "default",
    "--builder",
    "two_level",
    "--rails",
    "no",
    "--bytes",
    str(STATE_BYTES),
]
SIMULATE_ARGV = [
    "simulate",
    "decode",
    "--topology",
    "default",
    "--seq-len",
    ",".join(map(str, CONTEXTS)),
    "--heads",
    str(HEADS),
    "--kv-heads",
    str(KV_HEADS),
    "--head-dim",
    str(HEAD_DIM),
]


def tree_case(topology: Topology) -> dict[str, Any]:
    """What ``treecoll`` :data:`TREE_ARGV` prints (``--json``): the tree tree attention reduces over."""
    from treecoll.tools.cmd_tree import build_data

    return build_data(topology, "two_level", nbytes=STATE_BYTES, rails="no")[1]


def simulate_case(topology: Topology) -> dict[str, Any]:
    """What ``treecoll`` :data:`SIMULATE_ARGV` prints (``--json``): one decode step, modelled."""
    from treecoll.attention.cost import DecodeShape
    from treecoll.tools.cmd_simulate import decode_data

    shapes = [DecodeShape(seq_len=n, heads=HEADS, head_dim=HEAD_DIM, kv_heads=KV_HEADS) for n in CONTEXTS]
    return decode_data(topology, shapes, None, "two_level", None)


def step_tree(state: dict) -> None:
    from treecoll.tools.cmd_tree import render_tree

    from treecoll import topo

    t = state.get("topology") or topo.default()
    state["topology"] = t
    print("$ treecoll " + " ".join(TREE_ARGV))
    print(render_tree(tree_case(t)))


#: the columns of the simulated comparison: the decode step of every method, then auto's pick
SIMULATED_METHODS = ("tree", "gather", "allreduce3", "ring")


def simulated_rows(d: dict) -> list[list[Any]]:
    """The demo's rows of :func:`simulate_case`'s data: context, each method's step (us), auto's pick and
    ring's step over auto's."""
    return [
        [r["shape"]["seq_len"]]
        + [r["methods"][m]["time_s"] * 1e6 for m in SIMULATED_METHODS]
        + [r["auto"], r["speedup_auto_vs_ring"]]
        for r in d["runs"]
    ]


def step_simulate(state: dict) -> None:
    from treecoll.topo.fmt import table

    t = state["topology"]
    d = simulate_case(t)
    print("$ treecoll " + " ".join(SIMULATE_ARGV))
    print(
        "(the decode model, attention.cost: each GPU reads its K/V shard at HBM bandwidth, and the flow "
        "simulator times the communication; decode step in us)"
    )
    header = ["context", *SIMULATED_METHODS, "auto", "ring/auto"]
    print(table(simulated_rows(d), header, formats=[None] + [".1f"] * len(SIMULATED_METHODS) + [None, ".1f"]))
    tree = d["runs"][0]["methods"]["tree"]
    print(
        f"tree: the two_level allreduce of the {STATE_BYTES} B packed state as treecoll's executor runs it "
        f"({d['mode']} mode, {tree['combine_s'] * 1e6:.1f} us whatever the context: the allreduce the tree above "
        f"prints); gather, allreduce3: NCCL's own collectives; ring: every K/V shard visits every rank; auto: "
        f'the combine tree_decode(combine="auto") runs, the fastest of tree, gather and allreduce3'
    )


def step_decode(state: dict) -> None:
    from treecoll.tools.cmd_decode import check_start, decode_data, render

    check_start(DEMO_DECODE, 4)
    d = decode_data(dict(DEMO_DECODE), 4, timeout=300)
    state["decode"] = d
    print(render(d))


STEPS: list[tuple[str, Callable[[dict], None]]] = [
    ("Tree attention: the two-level tree on the default topology", step_tree),
    ("Tree attention vs Ring Attention, simulated on the default topology", step_simulate),
    ("Tree attention decoding on this machine (4 gloo processes), checked against one process", step_decode),
]
