"""treecoll.topo: the cluster graph (model, paths, YAML, discovery).

Importing ``topo`` never imports torch, triton or pynvml.
"""
from .errors import (TreecollError, TopologyError, DiscoveryError, TreeError, ScheduleError,
                     CollectiveError, AttentionError, MissingDependency)
from .model import Topology, NODE_KINDS, LINK_KINDS
from .paths import Path, NCCL_CLASSES, SMI_CODES

__all__ = ["Topology", "Path", "NODE_KINDS", "LINK_KINDS", "NCCL_CLASSES", "SMI_CODES",
           "TreecollError", "TopologyError", "DiscoveryError", "TreeError", "ScheduleError",
           "CollectiveError", "AttentionError", "MissingDependency"]
