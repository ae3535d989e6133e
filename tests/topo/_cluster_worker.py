"""One rank of the multi-process discover_cluster test (run by test_cluster.py)."""
import json
import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.environ["TREECOLL_REPO"])
from treecoll.topo.cluster import discover_cluster  # noqa: E402

from treecoll import topo  # noqa: E402

rank, world, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['PORT']}", rank=rank, world_size=world,
                        timeout=__import__("datetime").timedelta(seconds=60))
net = json.loads(os.environ["NETWORK"]) if os.environ.get("NETWORK") else None
try:
    t = discover_cluster(network=net, discover_kwargs={"nvml": False})
    res = {"fingerprint": t.fingerprint(), "topology": t.to_dict()}
except topo.TreecollError as e:
    res = {"error": f"{type(e).__name__}: {e}"}
with open(out, "w") as f:
    json.dump(res, f, default=str)
dist.destroy_process_group()
