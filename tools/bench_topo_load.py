"""Benchmark: loading shipped topologies (target: the 8192-GPU file in < 5 s).

    .venv/bin/python -m treecoll.tools.bench_topo_load [--repeat 5] [--json out.json]

For each file: wall time of ``topo.load`` (compact YAML -> validated frozen
Topology), and for the largest the explicit-form round trip (``dumps`` and
``loads`` of the saved text), the first ``fingerprint()``, and ``path()``
between 1000 random GPU pairs with cold caches (time per query). Prints a table
(median and min over the repeats, seconds) and writes JSON
(default ``bench_topo_load.json`` in the current directory).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

from treecoll import topo

FILES = ["dgx-h100", "dgx-h100-x16", "gb200-nvl72", "dgx-h100-x1024"]


def _time(fn, repeat: int) -> tuple[list[float], object]:
    out, res = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = fn()
        out.append(time.perf_counter() - t0)
    return out, res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default="bench_topo_load.json", help="where to write the results")
    args = ap.parse_args(argv)
    rows = []
    big = None
    for name in FILES:
        path = topo.shipped(name)
        times, t = _time(lambda: topo.load(path), args.repeat)
        rows.append({"case": f"load {name}", "gpus": len(t.gpus()), "nodes": t.graph.number_of_nodes(),
                     "links": t.graph.number_of_edges(), "times_s": times})
        big = t
    text = topo.dumps(big)
    for case, fn in [("dumps (explicit form)", lambda: topo.dumps(big)),
                     ("loads (explicit form)", lambda: topo.loads(text)),
                     ("copy + fingerprint", lambda: topo.Topology._adopt(big.graph.copy()).fingerprint())]:
        times, _ = _time(fn, max(1, args.repeat // 2))
        rows.append({"case": f"{case} {big.name}", "gpus": len(big.gpus()), "nodes": big.graph.number_of_nodes(),
                     "links": big.graph.number_of_edges(), "times_s": times})
    import random
    gpus = big.gpus()
    rnd = random.Random(0)
    pairs = [(rnd.choice(gpus), rnd.choice(gpus)) for _ in range(1000)]

    def paths():  # a fresh Topology each time: cold route caches
        t = topo.Topology._adopt(big.graph.copy())
        t0 = time.perf_counter()
        for a, b in pairs:
            t.path(a, b)
        return time.perf_counter() - t0

    per = [paths() / len(pairs) for _ in range(max(1, args.repeat // 2))]
    rows.append({"case": f"path, random GPU pair, per query {big.name}", "gpus": len(gpus),
                 "nodes": big.graph.number_of_nodes(), "links": big.graph.number_of_edges(), "times_s": per})
    print(f"{'case':<48}{'GPUs':>6}{'nodes':>8}{'links':>9}{'median s':>10}{'min s':>10}")
    for r in rows:
        r["median_s"], r["min_s"] = statistics.median(r["times_s"]), min(r["times_s"])
        print(f"{r['case']:<48}{r['gpus']:>6}{r['nodes']:>8}{r['links']:>9}{r['median_s']:>10.5f}{r['min_s']:>10.5f}")
    meta = {"python": sys.version.split()[0], "machine": platform.machine(), "repeat": args.repeat,
            "command": "python -m treecoll.tools.bench_topo_load " + " ".join(argv or sys.argv[1:])}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
