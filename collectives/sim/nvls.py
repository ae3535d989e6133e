"""NVLS: allreduce reduced and multicast by the NVSwitches, as NCCL's NVLS and NVLSTree run it.

On Hopper and Blackwell NVSwitch systems NCCL's default large allreduce is
NVLS (NVLink SHARP): the switches add up what the GPUs send and multicast the
sum, so no GPU reduces and each NVLink carries less than a ring puts on it.
Where it runs is :func:`treecoll.collectives.nccl_model.nvls_domains` (GPUs on
multicast-capable NVSwitches, compute capability 9.0 or later); across
several NVLink domains (hosts) NCCL runs NVLSTree: NVLS inside each domain,
trees between domains.

Traffic, per GPU of a domain of ``n`` GPUs and a message of ``S`` bytes
(GPU ``i`` heads shard ``i`` of ``S / n`` bytes, NCCL's NVLS channels):

* reduce-scatter (``multimem.ld_reduce``): the switches read every shard
  from every GPU, ``S`` up each GPU's NVLinks, and return each reduced shard
  to its head, ``S / n`` down;
* across domains (NVLSTree): the heads of shard ``i`` exchange it over their
  nearest NICs along NCCL's double binary tree of domains (half the shard
  per tree, up to reduce and back down);
* all-gather (``multimem.st``): each head stores its shard once, ``S / n``
  up, and the switches deliver it to all GPUs, ``S`` down.

Each GPU's bytes to and from the switches are spread over its switches by
link bandwidth. NCCL pipelines all of this, so the time is one max-min
allocation of every flow at once (:func:`~collectives.sim_engine.drain_times`)
plus the latency: the NVLS step (the larger of the GPU-switch-GPU link
latency and the profile's ``nvlink`` floor) and, across domains, two tree
hops (up and down) per level of the tree, each the route's latency.

NCCL profiles (``auto``, ``nccl-simple``: NVLS runs Simple only) use NCCL
2.30's own NVLS constants (src/graph/tuning.cc): no base latency, 25 µs per
NVLS step, 20.9 µs per inter-node NVLSTree hop plus twice the NIC's
``lat``, the switches' reduction efficiency ``nvlsEfficiency`` (0.85
Hopper, 0.74 Blackwell) on NVLink, and NVLSTree's per-channel busbw cap
``perChMaxNVLSTreeBws`` (Hopper 57.7 GB/s on 2 nodes, 45.5 on more;
Blackwell 96 / 80) over ``min(n, 32)`` channels, and NCCL's pipeline: the
bytes move in loops of chunks (src/enqueue.cc ``calcCollChunking``, chunks of
16 KiB to 256 KiB by message size, src/transport/nvls.cc channel counts) through
two stages (NVLink up, NVLink down) or, NVLSTree, three (the network between),
which adds the fill of :func:`treecoll.collectives.sim.nccl_model.nvls_fill`
to the drain. A :class:`~treecoll.collectives.sim.profiles.Calibration`
corrects those constants with its link factors and its ``nvls`` factors (the
fill stays). Any other profile (``ideal``, a plain profile YAML) is used as it
is, without NCCL's constants: with ``ideal`` on one
domain the time is ``lat + S (n + 1) / n / B`` exactly, ``B`` a GPU's NVLink
bandwidth to its switches:

>>> from treecoll import topo
>>> t = topo.resolve("dgx-h100")          # 8 GPUs, 370.8 GB/s to the switches, 0.3 us per link
>>> r = simulate_nvls(t, 1 << 30, profile="ideal")
>>> abs(r.time - (0.6e-6 + (1 << 30) * 9 / 8 / 370.8e9)) < 1e-12
True

No GPU reduces and no scratch memory is counted (NCCL's NVLS buffers are
set up once, at communicator creation).
"""

from __future__ import annotations

import dataclasses
import time as _time

import numpy as np
from treecoll.topo import Topology
from treecoll.topo.errors import CollectiveError, TreeError
from treecoll.topo.ranks import RanksArg

from ..tree import as_multi
from . import nccl_model as nm
from .engine import Network, drain_times
from .profiles import Calibration, Profile, get_profile
from .result import SimResult, check_size, make_result, placed

__all__ = ["simulate_nvls", "NVLS_PROFILE"]

#: the NCCL constants of NVLS as a profile (efficiency and cap are applied per GPU generation on top)
NVLS_PROFILE = Profile(
    "nccl-nvls",
    0.0,
    {"nvlink": nm.NVLS_LAT, "net": nm.NVLS_TREE_NET_LAT},
    {},
    source="NCCL 2.30 src/graph/tuning.cc: NVLS/NVLSTree baseLatencies 0, hwLatencies "
    "NVLINK 25 us, NET 20.9 us (Simple), nvlsEfficiency, perChMaxNVLSTreeBws",
    nic_lat_mult=2.0,
)


def _profile(profile: Profile | str | None, gen: int) -> tuple[Profile, bool]:
    """(profile to run, whether NCCL's NVLS efficiency and cap apply); a calibration corrects NCCL's
    NVLS constants with its ``nvls`` factors."""
    if profile in (None, "auto", "nccl-simple", "nccl-nvls"):
        eff = nm.NVLS_EFFICIENCY[gen]
        return dataclasses.replace(NVLS_PROFILE, bw_eff={"nvlink": eff}), True
    if profile in ("nccl-ll", "nccl-ll128"):
        raise CollectiveError(f"nvls: NCCL runs NVLS with the Simple protocol only, got profile {profile!r}")
    prof = get_profile(profile)
    if isinstance(prof, Calibration):
        return prof.apply(_profile(None, gen)[0], "nvls"), True
    return prof, False


def simulate_nvls(
    topology: Topology,
    nbytes: int,
    *,
    dtype: str = "float32",
    ranks: RanksArg = None,
    profile: Profile | str | None = "auto",
    top: int = 10,
) -> SimResult:
    """Simulate NCCL's NVLS allreduce (NVLSTree across NVLink domains) of ``nbytes`` per rank.

    Raises :class:`~topo.errors.CollectiveError` saying why when NVLS cannot
    run on these ranks (see :func:`treecoll.collectives.nccl_model.nvls_domains`).
    """
    check_size(nbytes, dtype)
    topology, gpus = placed(topology, ranks, what="simulate nvls")
    try:
        domains = nm.nvls_domains(topology, gpus)
    except TreeError as e:
        raise CollectiveError(str(e)) from None
    g = topology.graph
    gen = nm.generation(topology, gpus)
    prof, nccl = _profile(profile, gen)
    t0 = _time.perf_counter()
    net = Network(topology, prof)
    n, P = len(domains[0]), len(gpus)
    links, sizes = [], []
    per_gpu = nbytes * (n + 1) / n  # up: S read + S/n stored; down: S/n reduced + S delivered
    intra_lat = 0.0
    for x in gpus:
        sws = [
            (v, float(d["bw"]), float(d.get("lat", 0.0)))
            for v, d in g[x].items()
            if g.nodes[v].get("kind") == "nvswitch"
        ]
        total = sum(bw for _, bw, _ in sws)
        for v, bw, lat in sws:
            for a, b in ((x, v), (v, x)):
                links.append(np.array([net.link_id(a, b)], dtype=np.int64))
                sizes.append(per_gpu * bw / total)
            intra_lat = max(intra_lat, lat + float(g.edges[v, x].get("lat", 0.0)))
    intra_lat = max(intra_lat * 1e-6, prof.step_lat("nvlink"))
    hop_lat, height = 0.0, 0
    if len(domains) > 1:
        from ..builders import double_binary

        trees = as_multi(double_binary(None, None, len(domains)))
        height = trees.height
        for tree, w in zip(trees.trees, trees.shares):
            for child, parent in tree.edges():
                for i in range(n):
                    a, b = domains[child][i], domains[parent][i]
                    for src, dst in ((a, b), (b, a)):  # up to reduce, back down with the sum
                        r = net.route(src, dst)
                        hop_lat = max(hop_lat, r.lat)
                        for ids, share in r.subroutes:
                            links.append(ids)
                            sizes.append(w * nbytes / n * share)
    drain = float(drain_times(net, links, sizes).max()) if sizes else 0.0
    if nccl and len(domains) > 1:  # NCCL's per-channel NVLSTree cap, as algbw: nCh × cap × P / (2(P − 1))
        cap = nm.PER_CH_MAX_NVLS_TREE_BW[gen][1 if len(domains) == 2 else 2]
        cap *= profile.bw_scale.get("nvls", 1.0) if isinstance(profile, Calibration) else 1.0
        drain = max(drain, nbytes / (min(nm.MAX_NVLS_ARITY, n) * cap * 1e9 * P / (2 * (P - 1))))
    fill = drain * nm.nvls_fill(nbytes, nm.nvls_run(topology, gpus)) if nccl else 0.0
    makespan = intra_lat + 2 * height * hop_lat + drain + fill
    link_bytes = np.zeros(len(net.ends))
    np.add.at(link_bytes, np.concatenate(links), np.concatenate([np.full(len(ids), s) for ids, s in zip(links, sizes)]))
    stats = {
        "engine": "nvls",
        "domains": len(domains),
        "gpus_per_domain": n,
        "tree_height": height,
        "nvls_efficiency": prof.efficiency("nvlink") if nccl else None,
        "pipeline_fill_s": fill,
        "wall_s": _time.perf_counter() - t0,
    }
    algo = "nvls_tree" if len(domains) > 1 else "nvls"
    return make_result(
        net,
        "allreduce",
        algo,
        nbytes,
        nbytes,
        P,
        makespan,
        [makespan] * P,
        link_bytes,
        [0.0] * P,
        prof,
        dtype,
        stats,
        top,
    )
