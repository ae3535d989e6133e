"""An emulated multi-host cluster on one Linux machine (``treecoll emu``).

Hosts are network namespaces joined through a bridge (in its own namespace)
by veth pairs shaped with ``tc tbf``; ranks run inside them with the
torch.distributed environment of a real multi-host launch. Requires root
(CAP_NET_ADMIN) and iproute2. See :mod:`.netns` for the layout, :mod:`.runner`
for the rank environment, :mod:`.topology` for the matching Topology.
"""

from .netns import (
    ClusterSpec,
    EmuClusterError,
    create,
    destroy,
    destroy_all,
    host_addr,
    namespaces_available,
    ns_name,
    parse_rate,
    status,
)
from .runner import RunResult, launch, run
from .topology import build_topology, placement, save_topology

__all__ = [
    "EmuClusterError",
    "ClusterSpec",
    "create",
    "destroy",
    "destroy_all",
    "status",
    "namespaces_available",
    "parse_rate",
    "ns_name",
    "host_addr",
    "RunResult",
    "launch",
    "run",
    "placement",
    "build_topology",
    "save_topology",
]
