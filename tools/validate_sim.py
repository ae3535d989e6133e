"""Validate the simulator against real nccl-tests tables.

    python -m treecoll.tools.validate_sim [FILES or DIRS ...] [--json] [--profile P] [--calibrate NAME --fit F1,F2]

Reads nccl-tests outputs (default: tests/fixtures/nccl-tests/ relative to
the repository root), builds the topology each file describes from its header
lines (GPU model and count per host from the ``Using devices`` block or the
``# machine:`` line, hosts, network) out of shipped YAML templates
(topologies/*.yaml) or, for machines no shipped file describes, the small
templates of :data:`MACHINES` (every figure cited there), simulates the same
sizes and prints measured versus predicted busbw per size with the error.

Prediction: what NCCL would run, as the simulator sees it
(:func:`treecoll.collectives.sim.simulate_nccl_allreduce`): the fastest of the ring (:func:`treecoll.collectives.sim.simulate_ring`) and an NCCL-like tree (a chain
inside each host under a binomial tree over hosts, one per NIC rail for large
messages: ``two_level`` with ``intra="chain"``, run as NCCL's split tree
kernels run it), each over NCCL's protocol profiles
(:mod:`treecoll.collectives.sim.profiles`; LL128 only where NCCL enables it), and on
NVSwitch systems of compute capability 9.0 and later NCCL's NVLS / NVLSTree
(:mod:`treecoll.collectives.sim.nvls`); ``NCCL_ALGO`` /
``NCCL_PROTO`` in a file's ``# env:`` line restrict the choice as they
restrict NCCL. Nothing is fitted to the tables unless ``--profile`` names a
calibrated profile.

Error per size: ``|pred − meas| / meas`` of busbw (measured busbw recomputed
from the time column, as nccl-tests does, since small sizes print 0.00).
Summary: geometric-mean error ``exp(mean |ln(pred/meas)|) − 1`` over large
(≥ 64 MiB) and small (≤ 64 KiB) sizes. A file that cannot be mapped is
reported as skipped with the reason.

``--calibrate NAME --fit FILES``: fits one bandwidth efficiency per link kind
class (``net``, ``nvlink``, ``pcie``) and the per-step latency floors on the
``--fit`` tables (coordinate search on the geometric-mean error), reports
the error on the other tables and saves the profile as ``NAME.yaml``
(``--out DIR``, default the current directory).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO / "tests" / "fixtures" / "nccl-tests"
LARGE, SMALL = 64 << 20, 64 << 10

# ---------------------------------------------------------------------------------------------- machines
# Host templates for machines no shipped YAML describes. Sources:
#  NCCL link constants (src/graph/topo.h): SM80 NVLink 20.0 GB/s, SM90 20.6 GB/s per link; PCIe x16 Gen3 12,
#  Gen4 24, Gen5 48 GB/s; NET bw = speed(Mb/s)/8000; unknown NIC speed -> NET_BW 12.0 ("100Gbit").
#  mem_bw from NVIDIA datasheets: A100 80GB SXM 2039 GB/s, GH200 (96 GB HBM3) 4000, H200 4800, L40S 864,
#  RTX 5090 1792, V100 PCIe 900.
# direct NVLinks between all GPUs stood in for by one switch: no NVSwitch, so no NVLS multicast
_NV_SWITCHED = "{count: 1, links: %d, link_bw: %s, multicast: false}"
MACHINES = {
    # AWS p4de.24xlarge: 8x A100 80GB on NVSwitch (as DGX A100: 12 links x 20 GB/s), 4x 100 Gb/s EFA (AWS spec);
    # NIC lat 75 us: what the aws-ofi-nccl plugin reports to NCCL as the net latency of p4d/p4de.24xlarge
    # (aws/aws-ofi-nccl src/platform-aws.cpp, platform table `.latency = 75.0`; NCCL adds it per inter-node step)
    "aws-p4de": """
    gpus: {count: 8, model: A100-SXM4-80GB, mem_bw: 2039.0, sm: 80}
    nvswitch: {count: 6, links: 2, link_bw: 20.0}
    cpus: [{numa: 0, socket: 0}, {numa: 1, socket: 1}]
    smp: {bw: 16.0}
    pcie: {bw: 24.0, switches: [{cpu: 0, gpus: [0, 1], nics: [0]}, {cpu: 0, gpus: [2, 3], nics: [1]},
                                {cpu: 1, gpus: [4, 5], nics: [2]}, {cpu: 1, gpus: [6, 7], nics: [3]}]}
    nics: {count: 4, bw: 12.5, lat: 75.0}
    """,
    # HGX A100 4-GPU: 12 NVLinks per GPU, 4 to each peer (fully connected); modelled as one switch with
    # 12 links per GPU (the aggregate NCCL's rings reach by using every link)
    "hgx-a100-4": """
    gpus: {count: 4, model: A100-SXM4-80GB, mem_bw: 2039.0, sm: 80}
    nvswitch: %s
    cpus: [{numa: 0}]
    pcie: {bw: 24.0, switches: [{cpu: 0, gpus: [0, 1, 2, 3]}]}
    """ % (_NV_SWITCHED % (12, 20.0)),
    # CSCS Alps node: 4 GH200 fully connected by NVLink (18 links per GPU, SM90 20.6 GB/s, modelled as one
    # switch), one Slingshot-11 NIC (200 Gb/s -> 25 GB/s) per GH200
    "alps-gh200": """
    gpus: {count: 4, model: GH200, mem_bw: 4000.0, sm: 90}
    nvswitch: %s
    cpus: [{numa: 0}, {numa: 1}, {numa: 2}, {numa: 3}]
    smp: {bw: 22.0}
    pcie: {bw: 48.0, switches: [{cpu: 0, gpus: [0], nics: [0]}, {cpu: 1, gpus: [1], nics: [1]},
                                {cpu: 2, gpus: [2], nics: [2]}, {cpu: 3, gpus: [3], nics: [3]}]}
    nics: {count: 4, bw: 25.0}
    """ % (_NV_SWITCHED % (18, 20.6)),
    # one H200 and one 400 Gb/s RDMA NIC per pod (GKE A3 Ultra: ConnectX-7 400 Gb/s per GPU)
    "h200-1gpu-pod": """
    gpus: {count: 1, model: H200, mem_bw: 4800.0, sm: 90}
    cpus: [{numa: 0}]
    pcie: {bw: 48.0, switches: [{cpu: 0, gpus: [0], nics: [0]}]}
    nics: {count: 1, bw: 50.0}
    """,
    # one L40S per pod, PCIe Gen4; the NIC's speed is not stated: NCCL's default NET_BW 12 GB/s
    "l40s-1gpu-pod": """
    gpus: {count: 1, model: L40S, mem_bw: 864.0, sm: 89}
    cpus: [{numa: 0}]
    pcie: {bw: 24.0, switches: [{cpu: 0, gpus: [0], nics: [0]}]}
    nics: {count: 1, bw: 12.0}
    """,
    # 4x RTX 5090 on PCIe Gen5 root ports of one socket (bus ids 01/21/41/61); GeForce: no P2P (not modelled)
    "rtx5090-4": """
    gpus: {count: 4, model: GeForce-RTX-5090, mem_bw: 1792.0, sm: 120}
    cpus: [{numa: 0}]
    pcie: {bw: 48.0, switches: [{cpu: 0, gpus: [0]}, {cpu: 0, gpus: [1]}, {cpu: 0, gpus: [2]}, {cpu: 0, gpus: [3]}]}
    """,
    # 4x V100 PCIe 32GB with consecutive bus ids 3d..40: one PCIe Gen3 switch (PIX)
    "v100pcie-4": """
    gpus: {count: 4, model: V100-PCIE-32GB, mem_bw: 900.0, sm: 70}
    cpus: [{numa: 0}]
    pcie: {bw: 12.0, switches: [{cpu: 0, gpus: [0, 1, 2, 3]}]}
    """,
}

#: (regex on the GPU name or machine line, GPUs per host or None, template, shipped?)
RULES = [
    (r"H100 80GB HBM3|H100-SXM", 8, "dgx-h100", True),
    (r"\bB200\b", 8, "hgx-b200", True),
    (r"p4de|p4d\.", 8, "aws-p4de", False),
    (r"A100-SXM4", 4, "hgx-a100-4", False),
    (r"GH200", 4, "alps-gh200", False),
    (r"\bH200\b", 1, "h200-1gpu-pod", False),
    (r"L40S", 1, "l40s-1gpu-pod", False),
    (r"RTX 5090", 4, "rtx5090-4", False),
    (r"V100-PCIE", 4, "v100pcie-4", False),
]


class Skip(Exception):
    """A file that cannot be mapped to a topology; the message is the reason."""


@dataclass
class Table:
    path: Path
    collective: str
    hosts: list
    gpu_name: str
    machine: str
    env: str
    rows: list = field(default_factory=list)   # (size B, time µs)

    @property
    def nranks(self) -> int:
        return sum(n for _, n in self.hosts)


_DEV = re.compile(r"#\s*Rank\s+(\d+).*?\bon\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s+(.+?)\s*$")


def parse(path: Path) -> Table:
    """Read one nccl-tests output (new or old format, indented or ``0: `` prefixed lines)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    meta = {k: "" for k in ("machine", "env")}
    devs, rows = [], []
    for raw in text.splitlines():
        line = re.sub(r"^\s*\d+:\s", "", raw).strip()
        m = re.match(r"#\s*(machine|env):\s*(.*)", line)
        if m:
            meta[m.group(1)] = m.group(2)
            continue
        m = _DEV.match(line)
        if m:
            devs.append((int(m.group(1)), m.group(2), m.group(4)))
            continue
        f = line.split()
        if len(f) >= 12 and not line.startswith("#") and f[0].isdigit() and f[1].isdigit():
            try:
                rows.append((int(f[0]), float(f[-8])))
            except ValueError:
                continue
    coll = "allgather" if "all_gather" in text else "reduce_scatter" if "reduce_scatter" in text else "allreduce"
    hosts: list = []
    for _, host, _ in sorted(devs):
        if hosts and hosts[-1][0] == host:
            hosts[-1][1] += 1
        else:
            hosts.append([host, 1])
    gpu = devs[0][2] if devs else ""
    if not devs:   # truncated header: "2x AWS p4de.24xlarge (8x NVIDIA A100 80GB per instance, 16 GPUs)"
        m = re.search(r"(\d+)x .*?\((\d+)x ([^,]*?) per", meta["machine"])
        if m:
            hosts = [[f"host{i}", int(m.group(2))] for i in range(int(m.group(1)))]
            gpu = m.group(3)
    return Table(path, coll, [tuple(h) for h in hosts], gpu, meta["machine"], meta["env"], rows)


def topology_for(tab: Table):
    """The topology a table describes, from shipped templates or :data:`MACHINES`; raises :class:`Skip`."""
    from treecoll.topo import yaml_io
    if not tab.hosts:
        raise Skip("no 'Using devices' block and no '# machine:' line giving hosts and GPUs")
    counts = {n for _, n in tab.hosts}
    if len(counts) != 1:
        raise Skip(f"hosts with different GPU counts {sorted(counts)}")
    per_host = counts.pop()
    probe = f"{tab.gpu_name} {tab.machine}"
    for pat, n, name, shipped in RULES:
        if re.search(pat, probe) and (n is None or n == per_host):
            break
    else:
        raise Skip(f"no template for GPU {tab.gpu_name!r} with {per_host} per host")
    if shipped:
        head = ""
    else:
        body = "\n".join("    " + ln.strip() for ln in MACHINES[name].strip().splitlines())
        head = f"templates:\n  {name}:\n{body}\n"
    net = "network: {type: rail_optimized}\n" if len(tab.hosts) > 1 else ""
    text = f"name: {tab.path.stem}\n{head}hosts: [{{template: {name}, count: {len(tab.hosts)}}}]\n{net}"
    return yaml_io.loads(text, source=f"<{tab.path.name}>"), name + ("" if shipped else " (inline)")


def algorithms(tab: Table, topology=None) -> tuple[list, str]:
    """(algorithm names, profile) NCCL would choose among, as allowed by the file's NCCL_ALGO / NCCL_PROTO:
    ring, tree, and for allreduce on NVLS-capable GPUs (:func:`treecoll.collectives.sim.nccl_model.nccl_algos`) nvls."""
    algo = re.search(r"NCCL_ALGO=(\w+)", tab.env)
    proto = re.search(r"NCCL_PROTO=(\w+)", tab.env)
    proto_name = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}.get(proto.group(1).lower()) if proto else None
    algos = ["ring"]
    if tab.collective == "allreduce":
        algos = ["ring", "tree"]
        if topology is not None and tab.nranks > 1:
            from treecoll.collectives.sim.nccl_model import nccl_algos
            algos = list(nccl_algos(topology, topology.rank_gpus(), proto_name))
    if algo:
        a = {"nvlstree": "nvls"}.get(algo.group(1).lower(), algo.group(1).lower())
        algos = [x for x in algos if x == a] or algos
    prof = {"LL": "nccl-ll", "LL128": "nccl-ll128", "Simple": "nccl-simple"}.get(proto_name, "auto")
    return algos, prof


def predict(topology, tab: Table, size: int, profile) -> tuple[float, str]:
    """Predicted time (s) and label for one size."""
    from treecoll.collectives.sim.simulator import simulate_algorithm, simulate_nccl_allreduce
    if tab.nranks == 1:
        return 0.0, "-"
    algos, prof = algorithms(tab, topology)
    if profile is not None:
        prof = profile
    if tab.collective == "allreduce":
        a, r = simulate_nccl_allreduce(topology, size, profile=prof, algos=algos)
    else:
        a, r = "ring", simulate_algorithm(topology, "ring", size, collective=tab.collective, profile=prof)
    return r.time, f"{r.algorithm if a == 'nvls' else a}/{r.profile}"


def nccl_model_time(topology, tab: Table, size: int) -> float | None:
    """NCCL's own analytical prediction (collectives.sim.nccl_model, allreduce only), seconds."""
    if tab.collective != "allreduce" or tab.nranks < 2:
        return None
    from treecoll.collectives.sim.nccl_model import nccl_predict
    algos, _ = algorithms(tab, topology)
    return min(nccl_predict(topology, None, size, algo=a)["time"] for a in algos)


def geo_error(pairs) -> float | None:
    """exp(mean |ln(pred/meas)|) − 1 over (pred, meas) pairs, or None."""
    logs = [abs(math.log(p / m)) for p, m in pairs if p > 0 and m > 0]
    return math.exp(sum(logs) / len(logs)) - 1 if logs else None


def validate(paths, profile=None) -> dict:
    """Run every table; plain dict (files, rows, summaries)."""
    from treecoll.collectives.sim.simulator import bus_factor
    out = {"files": [], "profile": getattr(profile, "name", profile) or "NCCL protocols (auto)"}
    for path in paths:
        tab = parse(path)
        entry = {"file": path.name, "collective": tab.collective, "gpu": tab.gpu_name, "nranks": tab.nranks,
                 "hosts": len(tab.hosts)}
        try:
            topo, tname = topology_for(tab)
        except Skip as e:
            entry["skipped"] = str(e)
            out["files"].append(entry)
            continue
        except Exception as e:  # a template the YAML loader rejects is a skip with its reason, not a crash
            entry["skipped"] = f"topology: {e}"
            out["files"].append(entry)
            continue
        entry["template"] = tname
        rows = []
        f = bus_factor(tab.collective, tab.nranks)
        for size, t_us in tab.rows:
            pred, label = predict(topo, tab, size, profile)
            meas_bus = size / (t_us * 1e-6) / 1e9 * f
            pred_bus = size / pred / 1e9 * f if pred > 0 else 0.0
            nm = nccl_model_time(topo, tab, size) if profile is None else None
            rows.append({"size": size, "meas_us": t_us, "meas_busbw": meas_bus, "pred_us": pred * 1e6,
                         "pred_busbw": pred_bus, "algo": label,
                         "nccl_model_busbw": size / nm / 1e9 * f if nm else None,
                         "err": (pred_bus - meas_bus) / meas_bus if meas_bus > 0 else None})
        entry["rows"] = rows
        entry["large_err"] = geo_error([(r["pred_busbw"], r["meas_busbw"]) for r in rows if r["size"] >= LARGE])
        entry["small_err"] = geo_error([(r["pred_busbw"], r["meas_busbw"]) for r in rows if r["size"] <= SMALL])
        entry["nccl_model_large_err"] = geo_error([(r["nccl_model_busbw"], r["meas_busbw"]) for r in rows
                                                   if r["size"] >= LARGE and r["nccl_model_busbw"]])
        entry["nccl_model_small_err"] = geo_error([(r["nccl_model_busbw"], r["meas_busbw"]) for r in rows
                                                   if r["size"] <= SMALL and r["nccl_model_busbw"]])
        out["files"].append(entry)
    done = [e for e in out["files"] if "rows" in e]
    out["large_err"] = geo_error([(r["pred_busbw"], r["meas_busbw"]) for e in done for r in e["rows"]
                                  if r["size"] >= LARGE])
    out["small_err"] = geo_error([(r["pred_busbw"], r["meas_busbw"]) for e in done for r in e["rows"]
                                  if r["size"] <= SMALL])
    out["nccl_model_large_err"] = geo_error([(r["nccl_model_busbw"], r["meas_busbw"]) for e in done
                                             for r in e["rows"] if r["size"] >= LARGE and r["nccl_model_busbw"]])
    out["nccl_model_small_err"] = geo_error([(r["nccl_model_busbw"], r["meas_busbw"]) for e in done
                                             for r in e["rows"] if r["size"] <= SMALL and r["nccl_model_busbw"]])
    return out


def _pct(x) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def render(d: dict) -> str:
    lines = [f"profile: {d['profile']}"]
    for e in d["files"]:
        lines.append("")
        head = f"== {e['file']}: {e['collective']}, {e['nranks']} GPUs on {e['hosts']} host(s), {e['gpu']}"
        if "skipped" in e:
            lines.append(head + f"\n   SKIPPED: {e['skipped']}")
            continue
        lines.append(head + f", template {e['template']}")
        lines.append(f"{'size':>12} {'meas us':>10} {'meas busbw':>10} {'pred us':>10} {'pred busbw':>10} "
                     f"{'error':>7}  {'algo':<18} {'nccl model':>10}")
        for r in e["rows"]:
            nm = "-" if r.get("nccl_model_busbw") is None else f"{r['nccl_model_busbw']:.2f}"
            lines.append(f"{r['size']:>12} {r['meas_us']:>10.1f} {r['meas_busbw']:>10.2f} {r['pred_us']:>10.1f} "
                         f"{r['pred_busbw']:>10.2f} {_pct(r['err']):>7}  {r['algo']:<18} {nm:>10}")
        lines.append(f"   geomean error: large (>= 64 MiB) {_pct(e['large_err'])}, small (<= 64 KiB) "
                     f"{_pct(e['small_err'])}; NCCL's model: large {_pct(e.get('nccl_model_large_err'))}, "
                     f"small {_pct(e.get('nccl_model_small_err'))}")
    lines.append("")
    lines.append(f"ALL FILES geomean error: large {_pct(d['large_err'])} (target 15%), small "
                 f"{_pct(d['small_err'])} (target 30%); NCCL's own model (allreduce files): large "
                 f"{_pct(d.get('nccl_model_large_err'))}, small {_pct(d.get('nccl_model_small_err'))}")
    return "\n".join(lines)


def collect(args_paths) -> list[Path]:
    paths = []
    for p in (args_paths or [DEFAULT_DIR]):
        p = Path(p)
        if p.is_dir():
            paths.extend(sorted(q for q in p.iterdir() if q.suffix == ".txt"))
        elif p.exists():
            paths.append(p)
        else:
            raise SystemExit(f"validate_sim: {p}: no such file or directory")
    return paths


def calibrate(fit_paths, test_paths, name: str):
    """Fit bw_eff (net, nvlink, pcie) and latency floors of one profile on ``fit_paths``; returns (profile, fit, test)."""
    from treecoll.collectives.sim.profiles import PROFILES, Profile
    base = PROFILES["nccl-simple"]
    params = {"eff_net": 1.0, "eff_nvlink": 1.0, "eff_pcie": 1.0, "base": base.base_lat_us,
              "lat_nvlink": base.lat_floor_us["nvlink"], "lat_pci": base.lat_floor_us["pci"],
              "lat_net": base.lat_floor_us["net"]}

    def make(pr):
        eff = {"net": pr["eff_net"], "nvlink": pr["eff_nvlink"], "c2c": pr["eff_nvlink"], "pcie": pr["eff_pcie"],
               "smp": pr["eff_pcie"]}
        return Profile(name, pr["base"], {"nvlink": pr["lat_nvlink"], "pci": pr["lat_pci"], "net": pr["lat_net"]},
                       eff, source="tools/validate_sim.py --calibrate on " + ", ".join(p.name for p in fit_paths),
                       nic_lat_mult=base.nic_lat_mult, tree_eff=base.tree_eff)

    def score(pr):
        d = validate(fit_paths, make(pr))
        return (d["large_err"] or 0) + (d["small_err"] or 0)

    best = score(params)
    for _ in range(2):
        for k in params:
            for mult in (0.5, 0.7, 0.85, 1.15, 1.4, 2.0):
                trial = dict(params)
                trial[k] = min(trial[k] * mult, 1.0) if k.startswith("eff") else trial[k] * mult
                s = score(trial)
                if s < best - 1e-9:
                    best, params = s, trial
    prof = make(params)
    return prof, validate(fit_paths, prof), validate(test_paths, prof)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="validate_sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="nccl-tests output files or directories")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--profile", default=None, help="a profile name or YAML file (default: NCCL protocols, auto)")
    ap.add_argument("--calibrate", metavar="NAME", help="fit a profile NAME on --fit tables, test on the rest")
    ap.add_argument("--fit", default="", help="comma-separated file names used for fitting")
    ap.add_argument("--out", default=".", help="directory for the calibrated NAME.yaml")
    args = ap.parse_args(argv)
    paths = collect(args.paths)
    if args.calibrate:
        from treecoll.collectives.sim.profiles import save_profile
        fit_names = {s.strip() for s in args.fit.split(",") if s.strip()}
        fit = [p for p in paths if p.name in fit_names]
        test = [p for p in paths if p.name not in fit_names]
        if not fit:
            raise SystemExit("validate_sim: --calibrate needs --fit with at least one of the given files")
        prof, dfit, dtest = calibrate(fit, test, args.calibrate)
        dest = Path(args.out) / f"{args.calibrate}.yaml"
        save_profile(prof, dest, fit={"fit_files": sorted(fit_names), "fit_large_err": dfit["large_err"],
                                      "fit_small_err": dfit["small_err"], "test_large_err": dtest["large_err"],
                                      "test_small_err": dtest["small_err"]})
        res = {"profile": prof.as_dict(), "saved": str(dest), "fit": dfit, "test": dtest}
        if args.json:
            print(json.dumps(res, indent=1, default=float))
        else:
            print(f"saved {dest}: {prof.as_dict()}\n\n--- fit tables ---\n{render(dfit)}\n\n"
                  f"--- held-out tables ---\n{render(dtest)}")
        return 0
    prof = None
    if args.profile:
        from treecoll.collectives.sim.profiles import get_profile
        prof = get_profile(args.profile)
    d = validate(paths, prof)
    print(json.dumps(d, indent=1, default=float) if args.json else render(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
