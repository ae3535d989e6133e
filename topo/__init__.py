"""treecoll.topo: the cluster graph (model, paths, YAML, discovery).

Importing ``topo`` never imports torch, triton or pynvml.

>>> from treecoll import topo
>>> t = topo.default()            # the embedded 2-host DGX H100 cluster
>>> t.path("h0/gpu0", "h0/gpu5").smi, t.path("h0/gpu0", "h1/gpu0").nccl
('NV18', 'NET')
"""

from .errors import (
    AttentionError,
    CollectiveError,
    DiscoveryError,
    MissingDependency,
    PlacementError,
    ScheduleError,
    TopologyError,
    TreecollError,
    TreeError,
)
from .model import LINK_KINDS, NODE_KINDS, Topology
from .paths import NCCL_CLASSES, SMI_CODES, Path
from .yaml_io import default, dumps, load, loads, resolve, save, shipped

__all__ = [
    "Topology",
    "Path",
    "NODE_KINDS",
    "LINK_KINDS",
    "NCCL_CLASSES",
    "SMI_CODES",
    "TreecollError",
    "TopologyError",
    "DiscoveryError",
    "TreeError",
    "ScheduleError",
    "PlacementError",
    "CollectiveError",
    "AttentionError",
    "MissingDependency",
    "load",
    "loads",
    "save",
    "dumps",
    "default",
    "shipped",
    "resolve",
]

# ---- discovery
from .cluster import discover_cluster  # noqa: E402
from .discover import discover  # noqa: E402
from .env import hints  # noqa: E402
from .importers import import_file  # noqa: E402

__all__ += ["discover", "discover_cluster", "import_file", "hints"]
# ---- end discovery
