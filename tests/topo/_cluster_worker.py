"""One rank of the multi-process discover_cluster test.

test_cluster.py starts it with :func:`treecoll.collectives.launch.run_commands` and the
``env://`` variables of its rank, as torchrun would; it joins the job
(:func:`treecoll.collectives.launch.join`), probes this "host", and rank 0 writes every
rank's result (fingerprint and topology, or the error) to the file named by argv[1].
"""

import json
import os
import sys

from treecoll.collectives import launch
from treecoll.topo.cluster import discover_cluster

from treecoll import topo


class BrokenNvml:
    """A pynvml whose nvmlInit fails, as on a machine without the driver (discovery warns)."""

    @staticmethod
    def nvmlInit():
        raise RuntimeError("no driver here")


def probe(rank: int, world: int, network: dict | None) -> dict:
    nvml = BrokenNvml() if os.environ.get("BROKEN_NVML") else False
    try:
        t = discover_cluster(network=network, discover_kwargs={"nvml": nvml})
        return {"fingerprint": t.fingerprint(), "topology": t.to_dict()}
    except topo.TreecollError as e:
        return {"error": f"{type(e).__name__}: {e}"}


if __name__ == "__main__":
    net = json.loads(os.environ["NETWORK"]) if os.environ.get("NETWORK") else None
    results = launch.join(probe, net, backend="gloo", timeout=60)
    if launch.job_from_env().rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(results, f, default=str)
