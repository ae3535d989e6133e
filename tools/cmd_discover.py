"""``treecoll topo discover | import | hints``: discovery on the command line.

* ``topo discover [-o FILE.yaml | --xml FILE.xml] [--json] [--sysfs-root DIR] [--host NAME]``:
  this host's topology (NVML + sysfs; a CPU-only host without a driver), a
  summary and what discovery could not see; ``-o`` writes the explicit YAML
  (every ``treecoll topo`` command then reads it), ``--xml`` an NCCL topology
  file (NCCL_TOPO_FILE format).
* ``topo import FILE [-o FILE.yaml] [--xml FILE.xml]``: an NCCL topology XML or
  ``nvidia-smi topo -m`` text (detected by content): summary and the host's
  nvidia-smi matrix.
* ``topo hints``: which topology-related environment variables are set, their
  parsed values and what each changes; an invalid value is a one-line error
  naming the variable.

Hooked into ``treecoll topo`` through ``treecoll.tools.cmd_topo.SUBMODULES``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .cli import common_options, emit, output_path, write_output
from .units import UsageError

if TYPE_CHECKING:
    from treecoll.topo import Topology

__all__ = ["add_parser", "run", "discover_data", "hints_data", "render_discover", "render_hints"]


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    me = sys.modules[__name__]
    p = sub.add_parser(
        "discover",
        help="discover this host (NVML, sysfs; CPU-only without a driver)",
        description="discover this host's topology (NVML + sysfs, NCCL_TOPO_FILE if set)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument("-o", "--output", metavar="FILE.yaml", help="write the explicit YAML form")
    out.add_argument("--xml", metavar="FILE.xml", help="write an NCCL topology XML (NCCL_TOPO_FILE format)")
    p.add_argument("--sysfs-root", default="/", help="directory holding sys/ (default /)")
    p.add_argument("--host", help="host name for node ids (default: this host's name)")
    common_options(p).set_defaults(_topo_module=me, _discover_cmd="discover")
    q = sub.add_parser(
        "import",
        help="import an NCCL topology XML or nvidia-smi topo -m text",
        description="import an NCCL topology XML or 'nvidia-smi topo -m' output (detected by content)",
    )
    q.add_argument("file", metavar="FILE", help="NCCL topology XML or saved 'nvidia-smi topo -m' output")
    out = q.add_mutually_exclusive_group()
    out.add_argument("-o", "--output", metavar="FILE.yaml", help="write the explicit YAML form")
    out.add_argument("--xml", metavar="FILE.xml", help="write an NCCL topology XML")
    q.add_argument("--host", default="host0", help="host name for node ids (default host0)")
    common_options(q).set_defaults(_topo_module=me, _discover_cmd="import")
    h = sub.add_parser(
        "hints",
        help="topology-related environment variables and their effect",
        description="which NCCL / CUDA / launcher variables are set and what each changes",
    )
    return common_options(h).set_defaults(_topo_module=me, _discover_cmd="hints") or h


def _outputs(args) -> None:
    """Check -o / --xml before discovery or import does any work."""
    inputs = [getattr(args, "file", None)]
    if getattr(args, "output", None) is not None:
        output_path(args.output, "-o", inputs=inputs)
    if getattr(args, "xml", None) is not None:
        output_path(args.xml, "--xml", inputs=inputs)


def _write(t, args) -> str | None:
    """Write the explicit YAML (-o) or NCCL XML (--xml), whole or not at all."""
    from treecoll.topo.nccl_xml import export_xml

    from treecoll import topo

    if getattr(args, "output", None):
        write_output(args.output, topo.dumps(t), "-o")
        return args.output
    if getattr(args, "xml", None):
        write_output(args.xml, export_xml(t), "--xml")
        return args.xml
    return None


def discover_data(t: Topology, source: str, written: str | None) -> dict[str, Any]:
    """Summary (``topo show``'s), the host matrix, discovery notes and the written file."""
    from .cmd_topo import matrix_data, show_data

    d = show_data(t, source)
    d["notes"] = list(t.meta.get("notes", []))
    if t.meta.get("smi_mismatches"):
        d["notes"].append(
            f"{len(t.meta['smi_mismatches'])} nvidia-smi codes not reproducible: "
            + "; ".join(t.meta["smi_mismatches"][:4])
        )
    d["matrix"] = matrix_data(t) if t.gpus() else None
    d["written"] = written
    return d


def render_discover(d: dict[str, Any]) -> str:
    from .cmd_topo import render_matrix, render_show

    out = render_show(d)
    if d.get("matrix") and len(d["matrix"]["devices"]) <= 40:
        out += "\n" + render_matrix(d["matrix"])
    for n in d["notes"]:
        out += f"note: {n}\n"
    if d["written"]:
        out += f"wrote {d['written']}\n"
    return out


def hints_data(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    from treecoll.topo.env import hints_report

    return hints_report(os.environ if env is None else env)


def render_hints(d: dict[str, Any]) -> str:
    if not d["set"]:
        return "no topology-related environment variable is set (NCCL_*, CUDA_VISIBLE_DEVICES, RANK, SLURM_*, ...)\n"
    w = max(len(r["variable"]) for r in d["set"])
    return "".join(f"{r['variable']:<{w}} = {r['value']!r}\n{'':<{w}}   {r['effect']}\n" for r in d["set"])


def _sysfs_root(root: str) -> None:
    """Refuse a ``--sysfs-root`` directory without ``sys/`` (``sys/`` itself, say): the discovery would
    read nothing of the host and answer a bare CPU-only host. A missing root is the discovery's error."""
    if os.path.isdir(root) and not os.path.isdir(os.path.join(root, "sys")):
        raise UsageError(
            f"--sysfs-root {root}: expected a directory holding sys/ (as / does), got a directory without it; "
            "pass the directory above sys/"
        )


def run(args: argparse.Namespace) -> int:
    c = args._discover_cmd
    if c == "hints":
        return emit(args, hints_data(), render_hints)
    from treecoll import topo

    _outputs(args)
    if c == "discover":
        _sysfs_root(args.sysfs_root)
        t = topo.discover(sysfs_root=args.sysfs_root, host=args.host)
        src = "discovered"
    else:
        t = topo.import_file(args.file, host=args.host)  # names the file in every error
        src = args.file
    return emit(args, discover_data(t, src, _write(t, args)), render_discover)
