"""tools/bench_sim_scale: its in-process timing runs the command's own work and gets its numbers."""

from __future__ import annotations

import json

from treecoll.tools import bench_sim_scale
from treecoll.tools.cli import main


def test_in_process_case_prints_what_the_command_prints(capsys):
    args = ["--sizes", "64K,1M", "--algo", "ring,two_level"]
    load_s, sim_s, data, load_cpu, sim_cpu = bench_sim_scale._in_process("default", args)
    assert load_s >= 0 and sim_s > 0 and load_cpu >= 0 and sim_cpu > 0
    assert main(["simulate", "allreduce", "--topology", "default", *args, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["size"] for r in data["rows"]] == [65536, 1 << 20]
    assert data["rows"] == printed["rows"] and data["engine"] == printed["engine"] == "flow"
    from treecoll.collectives.sim.engine_native import native_status

    assert data["event_loop"] == ("native" if native_status()["available"] else "python")
