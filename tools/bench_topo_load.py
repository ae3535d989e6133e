"""Benchmark: loading shipped topologies (target: the 8192-GPU file in < 5 s).

    python -m treecoll.tools.bench_topo_load [--repeats 5] [--json out.json]

For each file: wall time of ``topo.load`` (compact YAML -> validated frozen
Topology), and for the largest the explicit-form round trip (``dumps`` and
``loads`` of the saved text), the first ``fingerprint()``, and ``path()``
between 1000 random GPU pairs with cold caches (time per query). The cases
run interleaved (one repetition of each, then the next round; the round trip
and path cases take every second round). Prints a table (median and min over
the repetitions, seconds) and writes JSON (default ``bench_topo_load.json`` in
the current directory).
"""

from __future__ import annotations

import random
import sys

from treecoll.tools.bench.harness import Benchmark, interleaved, summary
from treecoll.tools.cli import script_main
from treecoll.topo.fmt import table

from treecoll import topo

FILES = ["dgx-h100", "dgx-h100-x16", "gb200-nvl72", "dgx-h100-x1024"]
#: random GPU pairs of the path case
PAIRS = 1000


def main(argv: list[str] | None = None) -> int:
    bench = Benchmark(
        "bench_topo_load", __doc__, repeats=5, json="bench_topo_load.json", aliases={"--repeats": ["--repeat"]}
    )
    args = bench.parse(argv)
    loaded = {name: topo.load(topo.shipped(name)) for name in FILES}  # shapes for the table; warms the imports
    big = loaded[FILES[-1]]
    text = topo.dumps(big)
    rnd = random.Random(0)
    gpus = big.gpus()
    pairs = [(rnd.choice(gpus), rnd.choice(gpus)) for _ in range(PAIRS)]

    def paths(t: topo.Topology) -> None:
        for a, b in pairs:
            t.path(a, b)

    def fresh() -> topo.Topology:  # a copy of the graph: cold route caches
        return topo.Topology._adopt(big.graph.copy())

    def load(name: str):
        path = topo.shipped(name)
        return lambda: topo.load(path)

    cases = {f"load {name}": load(name) for name in FILES}
    cases |= {
        f"dumps (explicit form) {big.name}": lambda: topo.dumps(big),
        f"loads (explicit form) {big.name}": lambda: topo.loads(text),
        f"copy + fingerprint {big.name}": lambda: fresh().fingerprint(),
        f"path, random GPU pair, per query {big.name}": paths,
    }
    half = max(1, args.repeats // 2)
    repeats = {c: args.repeats if c.startswith("load ") else half for c in cases}
    times = interleaved(cases, repeats, warmup=0, setup={f"path, random GPU pair, per query {big.name}": fresh})
    times[f"path, random GPU pair, per query {big.name}"] = [
        t / PAIRS for t in times[f"path, random GPU pair, per query {big.name}"]
    ]
    rows = []
    for case, ts in times.items():
        t = loaded[case[len("load ") :]] if case.startswith("load ") else big
        rows.append(
            {
                "case": case,
                "gpus": len(t.gpus()),
                "nodes": t.graph.number_of_nodes(),
                "links": t.graph.number_of_edges(),
                "times_s": ts,
                "median_s": summary(ts)["median"],
                "min_s": summary(ts)["min"],
            }
        )
    print(
        table(
            [[r["case"], r["gpus"], r["nodes"], r["links"], r["median_s"], r["min_s"]] for r in rows],
            ["case", "GPUs", "nodes", "links", "median s", "min s"],
            formats=[None, None, None, None, ".5f", ".5f"],
        )
    )
    bench.write_json({"repeats": args.repeats, "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(script_main(main))
