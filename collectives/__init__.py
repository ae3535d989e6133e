"""treecoll.collectives: cost model, trees and schedules, execution over torch.distributed.

Importing this package does not import torch; the executor loads it lazily.
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

__all__ = ["Tree", "MultiTree", "as_multi", "Schedule", "Step", "BUILDERS", "build",
           "compile_reduce", "compile_broadcast", "compile_allreduce", "compile_ring_allreduce",
           "compile_rsag_allreduce", "compile_reduce_scatter", "compile_allgather", "compile_plan",
           "CostModel", "Op", "OPS", "resolve_op", "register_op", "allreduce", "broadcast", "reduce",
           "CollectiveOptions", "Placement", "Planner", "default_planner",
           "load_tree", "save_tree", "loads_tree", "dumps_tree", "load_nccl_graph"]
