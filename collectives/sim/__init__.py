"""The simulator: predicted time of a schedule on a topology, and NCCL's own tuning model beside it.

* :mod:`.simulator`: the entry points (:func:`simulate`, :func:`simulate_ring`,
  :func:`simulate_algorithm`, :func:`simulate_nccl` for every nccl-tests collective,
  :func:`simulate_nccl_allreduce`) and their :class:`SimResult`;
* :mod:`.result`: what they share: :class:`SimResult`, input checks, the rank -> GPU map;
* :mod:`.engine`: the flow-level engine (max-min fair sharing of every directed link);
* :mod:`.nvls`: NCCL's NVLS / NVLSTree (the NVSwitches reduce and multicast);
* :mod:`.profiles`: protocol and efficiency profiles (named, or loaded from YAML);
* :mod:`.nccl_model`: NCCL's analytical tuning model (ring, tree, NVLS), as NCCL computes it.

Nothing here does I/O but :func:`.profiles.load_profile`, and nothing imports torch.

>>> from treecoll import topo
>>> r = simulate_ring(topo.resolve("dgx-h100"), 1 << 30, profile="ideal")   # 8 GPUs, 1 GiB, no protocol overheads
>>> round(r.busbw), r.collective   # busbw as nccl-tests defines it: an H100's 18 x 20.6 GB/s NVLink, less latency
(370, 'allreduce')
"""

from .simulator import (
    SimResult,
    bandwidths,
    bus_factor,
    simulate,
    simulate_algorithm,
    simulate_nccl,
    simulate_nccl_allreduce,
    simulate_ring,
)

__all__ = [
    "SimResult",
    "bandwidths",
    "bus_factor",
    "simulate",
    "simulate_algorithm",
    "simulate_nccl",
    "simulate_nccl_allreduce",
    "simulate_ring",
]
