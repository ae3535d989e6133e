"""bench_validate's leave-one-out totals: before and after per set, degraded tables left out."""

from __future__ import annotations

import pytest
from treecoll.tools.bench_validate import loo_totals, machine_key


def _entry(name: str, set_: str, ratio: float, degraded: bool = False) -> dict:
    """A validated table of one large row whose prediction is ``ratio`` times the measured busbw."""
    row = {"size": 1 << 30, "meas_busbw": 100.0, "pred_busbw": 100.0 * ratio, "nccl_model_busbw": None}
    return {"file": name, "set": set_, "status": "ok", "degraded": degraded, "rows": [row]}


def test_loo_totals_split_by_set_and_leave_degraded_out():
    after = [_entry("a", "fit", 1.1), _entry("b", "heldout", 1.2), _entry("c", "heldout", 9.0, degraded=True)]
    before = [_entry("a", "fit", 1.5), _entry("b", "heldout", 2.0), _entry("c", "heldout", 20.0, degraded=True)]
    t = loo_totals([{"tests": after, "defaults": before}])
    assert t["fit"]["after"]["large"] == pytest.approx(0.1) and t["fit"]["before"]["large"] == pytest.approx(0.5)
    assert t["heldout"]["after"]["large"] == pytest.approx(0.2) and t["heldout"]["before"]["large"] == pytest.approx(1)
    # all: the geometric mean of 1.1 and 1.2, the degraded table's 9x left out but counted as degraded
    assert t["all"]["after"]["large"] == pytest.approx((1.1 * 1.2) ** 0.5 - 1)
    assert (t["all"]["tests"], t["all"]["degraded"], t["all"]["after"]["tables"]) == (3, 1, 2)
    assert t["all"]["after"]["small"] is None


def test_machine_key_drops_the_host_count():
    assert machine_key("16 x hgx-b200 (8 GPUs each), NICs 8x400G-roce") == "hgx-b200, NICs 8x400G-roce"
    assert machine_key("1 x gh200 (1 GPU each), NICs 1x200G-slingshot") == "gh200, NICs 1x200G-slingshot"


def test_machine_files_keeps_the_tables_of_the_machines_named():
    """``--machine TEXT``: the fixture tables whose machine (template and NICs) contains TEXT, any case; the
    two TCPXO tables of the fixtures (an all_gather and an allreduce on two A3 Mega hosts), none of another
    machine (any of several texts: those of either), and none at all on more GPUs than allowed."""
    from treecoll.tools.bench_validate import machine_files
    from treecoll.tools.validate_sim import DEFAULT_DIR

    files = sorted(DEFAULT_DIR.rglob("*.txt"))
    tcpxo = machine_files(files, ["TCPXO"], 16)
    assert [f.name for f in tcpxo] == [
        "h100-16gpu-2node-allgather-gcp-a3mega-tcpxo-nohash.txt",
        "h100-16gpu-2node-allreduce-gcp-a3mega-tcpxo.txt",
    ]
    both = machine_files(files, ["8x200G-tcpxo", "h200-sxm, NICs 1x400G-roce"], 16)
    assert {f.name for f in set(both) - set(tcpxo)} == {
        "h200-2gpu-2node-allreduce-gke-mpioperator.txt",
        "h200-2gpu-2node-allgather-gcp-a3ultra-gib.txt",
    }
    assert machine_files(files, ["tcpxo"], 8) == []
