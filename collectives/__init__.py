"""treecoll.collectives: cost model, trees and schedules, execution over torch.distributed.

Importing this package does not import torch; the executor loads it lazily.
"""
from .tree import Tree, MultiTree, as_multi
from .schedule import Schedule, Step
from .builders import BUILDERS, build
from .compile import (compile_reduce, compile_broadcast, compile_allreduce, compile_ring_allreduce,
                      compile_rsag_allreduce, compile_reduce_scatter, compile_allgather, compile_plan)
from .cost import CostModel
from .ops import Op, OPS, resolve_op, register_op
from .execute import allreduce, broadcast, reduce
from .tree_io import load_tree, save_tree, loads_tree, dumps_tree, load_nccl_graph

__all__ = ["Tree", "MultiTree", "as_multi", "Schedule", "Step", "BUILDERS", "build",
           "compile_reduce", "compile_broadcast", "compile_allreduce", "compile_ring_allreduce",
           "compile_rsag_allreduce", "compile_reduce_scatter", "compile_allgather", "compile_plan",
           "CostModel", "Op", "OPS", "resolve_op", "register_op", "allreduce", "broadcast", "reduce",
           "load_tree", "save_tree", "loads_tree", "dumps_tree", "load_nccl_graph"]
