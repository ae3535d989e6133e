"""treecoll.collectives: cost model, trees and schedules, execution over torch.distributed.

Importing this package does not import torch; the executor loads it lazily.

A binomial tree over 4 ranks compiles to an allreduce schedule: rank 3, a leaf,
sends each of its 2 chunks up to rank 2 and receives each result back; rank 2
receives rank 3's chunk, reduces it into its own (a reduce has no peer: -1), sends
the sum to the root and forwards the root's result to rank 3:

>>> from treecoll import collectives
>>> tree = collectives.build("binomial", nranks=4)
>>> tree.children, tree.root
(((1, 2), (), (3,), ()), 0)
>>> schedule = collectives.compile_allreduce(tree, 2)
>>> [(s.kind, s.chunk, s.peer) for s in schedule.steps[3]]
[('send', 0, 2), ('send', 1, 2), ('recv', 0, 2), ('recv', 1, 2)]
>>> [(s.kind, s.chunk, s.peer) for s in schedule.steps[2] if s.chunk == 0]
[('recv', 0, 3), ('reduce', 0, -1), ('send', 0, 0), ('recv', 0, 0), ('send', 0, 3)]
"""

from .builders import BUILDERS, build
from .compile import (
    compile_allgather,
    compile_allreduce,
    compile_broadcast,
    compile_plan,
    compile_reduce,
    compile_reduce_scatter,
    compile_ring_allreduce,
    compile_rsag_allreduce,
)
from .cost import CostModel
from .execute import CollectiveOptions, allreduce, broadcast, reduce
from .ops import OPS, Op, register_op, resolve_op
from .placement import Placement
from .planner import Planner, default_planner
from .schedule import Schedule, Step
from .tree import MultiTree, Tree, as_multi
from .tree_io import dumps_tree, load_nccl_graph, load_tree, loads_tree, save_tree

__all__ = [
    "Tree",
    "MultiTree",
    "as_multi",
    "Schedule",
    "Step",
    "BUILDERS",
    "build",
    "compile_reduce",
    "compile_broadcast",
    "compile_allreduce",
    "compile_ring_allreduce",
    "compile_rsag_allreduce",
    "compile_reduce_scatter",
    "compile_allgather",
    "compile_plan",
    "CostModel",
    "Op",
    "OPS",
    "resolve_op",
    "register_op",
    "allreduce",
    "broadcast",
    "reduce",
    "CollectiveOptions",
    "Placement",
    "Planner",
    "default_planner",
    "load_tree",
    "save_tree",
    "loads_tree",
    "dumps_tree",
    "load_nccl_graph",
]
