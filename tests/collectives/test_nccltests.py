"""The nccl-tests reader on every real table of tests/fixtures/nccl-tests and on the formats people post.

Expected values come from reading the files (row counts and first/last sizes counted with awk over the
lines whose first two fields are integers; device lines counted with grep; the collective and GPU count
from the source's own description in tests/fixtures/README.md), not from the reader's output. Where the
table contradicts its description (busbw/algbw printed for another GPU count), the expected GPU count was
worked out by hand from the printed columns: busbw/algbw = 2(n-1)/n for allreduce.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from treecoll.collectives.sim import nccltests
from treecoll.collectives.sim.nccltests import NcclTestsError, parse, read, recognise
from treecoll.topo.errors import TreecollError

FIX = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "nccl-tests"

# file: (rows, first size, last size, collective, GPUs, hosts from the device lines (None: list incomplete),
#        GPU name printed (None: none), machine template the index flags resolve to)
EXPECTED = {
    "a100-16gpu-2node-allreduce-aws-p4de-efa.txt": (29, 8, 2147483648, "allreduce", 16, None, None, "a100-sxm"),
    "a100-4gpu-1node-allreduce.txt": (25, 8, 134217728, "allreduce", 4, 1, "NVIDIA A100-SXM4-80GB", "a100-sxm-4"),
    "b200-16gpu-2node-allgather.txt": (24, 1024, 8589934592, "allgather", 16, 2, "NVIDIA B200", "hgx-b200"),
    "gh200-8gpu-2node-allreduce-slingshot.txt": (25, 8, 134217728, "allreduce", 8, 2, "NVIDIA GH200 120GB", "gh200-x4"),
    "h100-16gpu-2node-allreduce-ring.txt": (
        14,
        1048576,
        8589934592,
        "allreduce",
        16,
        2,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    "h100-16gpu-2node-allreduce.txt": (32, 8, 17179869184, "allreduce", 16, 2, "NVIDIA H100 80GB HBM3", "h100-sxm"),
    "h200-2gpu-2node-allreduce-gke-mpioperator.txt": (
        24,
        1024,
        8589934592,
        "allreduce",
        2,
        2,
        "NVIDIA H200",
        "h200-sxm",
    ),
    "l40s-2gpu-2node-allreduce-pcie.txt": (31, 8, 8589934592, "allreduce", 2, 2, "NVIDIA L40S", "l40s"),
    "rtx5090-4gpu-1node-allreduce-pcie.txt": (
        25,
        8,
        134217728,
        "allreduce",
        4,
        1,
        "NVIDIA GeForce RTX 5090",
        "rtx5090",
    ),
    "v100pcie-4gpu-1node-allreduce-oldformat.txt": (
        25,
        8,
        134217728,
        "allreduce",
        4,
        1,
        "Tesla V100-PCIE-32GB",
        "v100-pcie",
    ),
    # 5 device lines then "...": the list is incomplete; busbw/algbw 115.64/59.68 = 1.9377 -> n = 32
    "heldout/a100-128gpu-16node-allreduce-ib-oldformat.txt": (
        31,
        8,
        8589934592,
        "allreduce",
        32,
        None,
        "NVIDIA A100-SXM4-80GB",
        "a100-sxm",
    ),
    # sendrecv's bus factor is 1 whatever the GPU count, and no device lines: unknown
    "heldout/a100-8gpu-1node-sendrecv-noheader.txt": (
        4,
        134217728,
        1073741824,
        "sendrecv",
        None,
        None,
        None,
        "a100-sxm",
    ),
    "heldout/b200-16gpu-2node-allreduce-gcp-a4-nohash.txt": (
        11,
        8388608,
        8589934592,
        "allreduce",
        16,
        None,
        None,
        "hgx-b200",
    ),
    "heldout/b200-16gpu-2node-allreduce-lambda-ib-nohash.txt": (
        29,
        8,
        2147483648,
        "allreduce",
        16,
        None,
        None,
        "hgx-b200",
    ),
    "heldout/b200-2gpu-1node-allgather-nvlink-ellipsis.txt": (
        8,
        67108864,
        8589934592,
        "allgather",
        2,
        1,
        "NVIDIA B200",
        "hgx-b200",
    ),
    "heldout/b200-2gpu-2node-allgather-gke-dranet-1nic.txt": (
        28,
        0,
        1073741824,
        "allgather",
        2,
        2,
        "NVIDIA B200",
        "hgx-b200",
    ),
    # (n-1)/n between 89.695/90.405 and 89.705/90.395 fits 128 and 129: unknown
    "heldout/gb200-128gpu-32node-alltoall-2rack-oci-truncated.txt": (
        2,
        4294967296,
        8589934592,
        "alltoall",
        None,
        None,
        None,
        "gb200-nvl72",
    ),
    # one device line (rank 1439); 2(n-1)/n = 405.74/203.01 fits 1376..1538: unknown
    "heldout/gb200-1440gpu-360node-allreduce-20rack.txt": (
        6,
        536870912,
        17179869184,
        "allreduce",
        None,
        None,
        "NVIDIA GB200",
        "gb200-nvl72",
    ),
    # busbw/algbw 810.41/408.40 = 1.98435 = 2 x 127/128 although the device line shows rank 143
    "heldout/gb200-144gpu-36node-allreduce-2rack.txt": (
        6,
        536870912,
        17179869184,
        "allreduce",
        128,
        None,
        "NVIDIA Graphics Device",
        "gb200-nvl72",
    ),
    "heldout/gb200-64gpu-16node-alltoall-nvl72-oci-truncated.txt": (
        2,
        4294967296,
        8589934592,
        "alltoall",
        64,
        None,
        None,
        "gb200-nvl72",
    ),
    "heldout/gb200-72gpu-18node-allreduce-nvl72-mnnvl.txt": (
        5,
        536870912,
        8589934592,
        "allreduce",
        72,
        None,
        "NVIDIA Graphics Device",
        "gb200-nvl72",
    ),
    "heldout/gh200-2gpu-2node-allreduce-slingshot-sarus.txt": (
        8,
        1048576,
        134217728,
        "allreduce",
        2,
        2,
        "NVIDIA GH200 120GB",
        "gh200",
    ),
    "heldout/gh200-8gpu-2node-allreduce-slingshot-nocxi-degraded.txt": (
        25,
        8,
        134217728,
        "allreduce",
        8,
        2,
        "NVIDIA GH200 120GB",
        "gh200-x4",
    ),
    "heldout/h100-16gpu-2node-allgather-gcp-a3high-tcpx-nohash.txt": (
        11,
        8388608,
        8589934592,
        "allgather",
        16,
        None,
        None,
        "h100-sxm",
    ),
    "heldout/h100-16gpu-2node-allgather-gcp-a3mega-tcpxo-nohash.txt": (
        11,
        8388608,
        8589934592,
        "allgather",
        16,
        None,
        None,
        "h100-sxm",
    ),
    "heldout/h100-16gpu-2node-allreduce-gcp-a3mega-tcpxo.txt": (
        31,
        8,
        8589934592,
        "allreduce",
        16,
        2,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    # busbw/algbw 386.56/195.31 = 1.97921 = 2 x 95/96, not the 64 GPUs the manifest names
    "heldout/h100-64gpu-8node-allreduce-ib-sharp-ellipsis.txt": (
        5,
        536870912,
        8589934592,
        "allreduce",
        96,
        None,
        None,
        "h100-sxm",
    ),
    "heldout/h100-80gpu-10node-allgather.txt": (
        10,
        33553920,
        17179868160,
        "allgather",
        80,
        10,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    "heldout/h100-80gpu-10node-allreduce.txt": (
        10,
        33554432,
        17179869184,
        "allreduce",
        80,
        10,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    "heldout/h100-80gpu-10node-alltoall.txt": (
        10,
        33553920,
        17179868160,
        "alltoall",
        80,
        10,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    "heldout/h100-80gpu-10node-reducescatter.txt": (
        10,
        33553920,
        17179868160,
        "reduce_scatter",
        80,
        10,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    "heldout/h100-80gpu-10node-sendrecv.txt": (
        10,
        33554432,
        17179869184,
        "sendrecv",
        80,
        10,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    "heldout/h100-8gpu-1node-allgather.txt": (
        10,
        33554432,
        17179869184,
        "allgather",
        8,
        1,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    "heldout/h100-8gpu-1node-allreduce-aws-p5-batch-tagoutput.txt": (
        32,
        8,
        17179869184,
        "allreduce",
        8,
        None,
        None,
        "h100-sxm",
    ),
    "heldout/h100-8gpu-1node-alltoall.txt": (
        10,
        33554432,
        17179869184,
        "alltoall",
        8,
        1,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    "heldout/h100-8gpu-1node-reducescatter.txt": (
        10,
        33554432,
        17179869184,
        "reduce_scatter",
        8,
        1,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    "heldout/h100-8gpu-1node-sendrecv.txt": (
        10,
        33554432,
        17179869184,
        "sendrecv",
        8,
        1,
        "NVIDIA H100 80GB HBM3",
        "h100-sxm",
    ),
    "heldout/h200-16gpu-2node-allreduce-nebius-ib.txt": (
        5,
        1073741824,
        17179869184,
        "allreduce",
        16,
        2,
        "NVIDIA H200",
        "h200-sxm",
    ),
    "heldout/h200-16gpu-2node-allreduce-ring-socket-singlenic.txt": (
        32,
        8,
        17179869184,
        "allreduce",
        16,
        2,
        "NVIDIA H200",
        "h200-sxm",
    ),
    "heldout/h200-2gpu-2node-allgather-gcp-a3ultra-gib.txt": (
        24,
        1024,
        8589934592,
        "allgather",
        2,
        2,
        "NVIDIA H200",
        "h200-sxm",
    ),
    # the node count is not stated; busbw/algbw 369.86/186.39 = 1.98433 -> 128
    "heldout/h200-NAgpu-NAnode-allreduce-aws-p5en-efa-ellipsis.txt": (
        3,
        8,
        17179869184,
        "allreduce",
        128,
        None,
        None,
        "h200-sxm",
    ),
    "heldout/rtx4090-2gpu-1node-allreduce-pcie-k8s.txt": (
        29,
        8,
        2147483648,
        "allreduce",
        2,
        1,
        "NVIDIA GeForce RTX 4090",
        "rtx4090",
    ),
    "heldout/rtx4090-4gpu-1node-allreduce-pcie-docker.txt": (
        29,
        8,
        2147483648,
        "allreduce",
        4,
        1,
        "NVIDIA GeForce RTX 4090",
        "rtx4090",
    ),
}


def test_every_fixture_is_expected_and_indexed():
    files = sorted(p.relative_to(FIX).as_posix() for p in FIX.rglob("*.txt"))
    assert files == sorted(EXPECTED)
    index = yaml.safe_load((FIX / "tables.yaml").read_text())
    assert sorted(index) == files
    assert {e["set"] for e in index.values()} == {"fit", "heldout"}
    assert all((e["set"] == "heldout") == f.startswith("heldout/") for f, e in index.items())
    assert {e["health"] for e in index.values()} <= {"healthy", "degraded", "unstated"}
    assert all(e.get("why") for e in index.values() if e["health"] == "degraded")
    assert all(e["gpu_nic"].startswith(("aligned: ", "not aligned ")) for e in index.values() if "gpu_nic" in e)
    # the flags say what gpu_nic says: --gpu-nic unaligned exactly where the GPUs are not beside their NICs
    for f, e in index.items():
        unaligned = "--gpu-nic unaligned" in (e.get("flags") or "")
        assert unaligned == e.get("gpu_nic", "").startswith("not aligned "), f
        assert "--gpu-nic aligned" not in (e.get("flags") or "") or e["gpu_nic"].startswith("aligned: "), f
    readme = (FIX.parent / "README.md").read_text()
    assert all(Path(f).name in readme for f in files if f.startswith("heldout/"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reader_on_every_fixture(name):
    rows, first, last, coll, nranks, hosts, gpu, _ = EXPECTED[name]
    out = read(FIX / name)
    assert len(out.tables) == 1
    t = out.tables[0]
    assert len(t.rows) == rows and t.rows[0].size == first and t.rows[-1].size == last
    assert t.collective == coll and t.candidates == (coll,)
    assert t.nranks == nranks
    assert (len(t.hosts()) if t.devices_complete else None) == hosts
    assert t.gpu_names() == ((gpu,) if gpu else ())
    assert out.header.source.startswith("https://github.com/")
    assert not t.dropped
    for r in t.rows:  # algbw as nccl-tests computes it: size / time (total bytes for AG/RS/A2A)
        m = r.out_of_place
        if m.algbw >= 1:
            assert m.algbw == pytest.approx(r.size / m.time_us / 1e3, rel=0.01, abs=0.006)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_fixture_machine_resolves(name):
    """The file's machine facts and the index's flags build the template the source names."""
    from treecoll.tools.machine_flags import parse_machine_flags
    from treecoll.topo.machines import resolve_machine

    template = EXPECTED[name][-1]
    entry = yaml.safe_load((FIX / "tables.yaml").read_text())[name]
    m = resolve_machine(parse_machine_flags(entry["flags"]), read(FIX / name).tables[0].machine_facts())
    assert m.template == template
    hosts, gpus = name.split("gpu-")[1].split("node")[0], name.split("/")[-1].split("gpu")[0].split("-")[1]
    if hosts != "NA":
        assert (m.hosts, m.hosts * m.gpus_per_host) == (int(hosts), int(gpus))


def test_special_cases_in_the_fixtures():
    """What each parser edge case of the collection keeps: elisions, N/A, old columns, headers, warnings."""
    t = read(FIX / "heldout/b200-2gpu-1node-allgather-nvlink-ellipsis.txt").tables[0]
    assert t.elided == (22,) and t.nccl_version == "2.26.6+cuda12.8" and t.run.min_bytes == 1024
    t = read(FIX / "heldout/h200-NAgpu-NAnode-allreduce-aws-p5en-efa-ellipsis.txt").tables[0]
    assert t.elided == (10,) and [r.size for r in t.rows] == [8, 16, 17179869184]
    t = read(FIX / "v100pcie-4gpu-1node-allreduce-oldformat.txt").tables[0]
    assert t.columns[:5] == ("size", "count", "type", "redop", "time") and t.rows[0].root is None
    assert t.rows[0].out_of_place.wrong == 1e-07 and t.devices[0].group is None
    t = read(FIX / "heldout/h100-8gpu-1node-sendrecv.txt").tables[0]
    assert t.rows[0].in_place.wrong is None and t.rows[0].out_of_place.wrong == 0
    assert t.binary == "sendrecv_perf" and t.tests_version == "2.17.8" and t.nccl_version == "2.29.2"
    t = read(FIX / "heldout/h100-8gpu-1node-allreduce-aws-p5-batch-tagoutput.txt").tables[0]
    assert t.avg_busbw == 156.742 and t.complete and t.nranks_from == "busbw/algbw"
    t = read(FIX / "heldout/b200-2gpu-2node-allgather-gke-dranet-1nic.txt").tables[0]
    assert [(r.size, r.count) for r in t.rows[:3]] == [(0, 0), (0, 0), (32, 4)]
    t = read(FIX / "heldout/gb200-144gpu-36node-allreduce-2rack.txt").tables[0]
    assert t.warnings == ("the busbw/algbw imply 128 ranks, but the device lines show rank 143",)
    t = read(FIX / "heldout/gb200-64gpu-16node-alltoall-nvl72-oci-truncated.txt").tables[0]
    assert t.elided == (9,) and "count column disagrees" in t.warnings[0]
    t = read(FIX / "heldout/h100-16gpu-2node-allgather-gcp-a3mega-tcpxo-nohash.txt").tables[0]
    assert t.run.setting("validation") == 0 and t.rows[0].out_of_place.wrong is None
    assert t.nranks_from == "count column"  # 8388608 B / (131072 x 4 B) = 16 ranks
    assert read(FIX / "a100-4gpu-1node-allreduce.txt").header.nccl.startswith("not stated")


# ---------------------------------------------------------------------------------------------- formats
HEAD = (
    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
    "     time   algbw   busbw #wrong"
)


def _row(size, count, typ="float", op="sum", root=-1, t=100.0, alg=1.0, bus=1.0, w="0", w2="0"):
    run = f"{t:>8} {alg:>6} {bus:>6}"
    return f"{size:>12} {count:>12} {typ:>8} {op:>6} {root:>6} {run} {w:>6} {run} {w2:>6}"


def test_several_tables_in_one_file_with_their_own_blocks():
    text = "\n".join(
        [
            "# Collective test starting: all_reduce_perf",
            "# nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor)",
            "#  Rank  0 Group  0 Pid 1 on a device  0 [0000:01:00] NVIDIA B200",
            "#  Rank  1 Group  0 Pid 2 on a device  1 [0000:02:00] NVIDIA B200",
            HEAD,
            _row(1048576, 262144, alg="10.00", bus="10.00"),
            "# Avg bus bandwidth    : 10",
            "# Collective test concluded: all_reduce_perf",
            "# Collective test starting: all_gather_perf",
            "# nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor)",
            "#  Rank  0 Group  0 Pid 1 on a device  0 [0000:01:00] NVIDIA B200",
            "#  Rank  1 Group  0 Pid 2 on a device  1 [0000:02:00] NVIDIA B200",
            HEAD,
            _row(1048576, 131072, op="none", alg="10.00", bus="5.00"),
            "# Avg bus bandwidth    : 5",
        ]
    )
    out = parse(text, "log")
    assert [(t.collective, t.binary, t.nranks, t.line) for t in out.tables] == [
        ("allreduce", "all_reduce_perf", 2, 5),
        ("allgather", "all_gather_perf", 2, 13),
    ]
    assert all(t.complete and len(t.devices) == 2 for t in out.tables)


def test_one_binary_sweeping_two_types_gives_two_tables():
    text = "\n".join(
        [
            HEAD,
            _row(1024, 256, alg="0.10", bus="0.18"),
            _row(2048, 512, alg="0.20", bus="0.35"),
            _row(1024, 128, typ="double", alg="0.10", bus="0.18"),
            _row(2048, 256, typ="double", alg="0.20", bus="0.35"),
        ]
    )
    out = parse(text, "sweep")
    assert [(t.rows[0].type, len(t.rows), t.line, t.complete) for t in out.tables] == [
        ("float", 2, 1, True),
        ("double", 2, 4, False),
    ]


def test_a_row_cut_mid_line_is_dropped_and_reported():
    text = "\n".join(
        [
            "# nThread 1 nGpus 8 minBytes 8 maxBytes 64 step: 2(factor)",
            HEAD,
            _row(1048576, 262144, alg="10.00", bus="17.50"),
            "     2097152        524288     float     sum      -1    131.9   15.90",
        ]
    )
    t = parse(text, "cut.log").tables[0]
    assert len(t.rows) == 1 and not t.complete
    assert t.dropped == ((4, "row ends after 7 of 13 columns (cut mid-line?)"),)
    with pytest.raises(NcclTestsError, match=r"^cut\.log:2: no nccl-tests table \(row ends after 6 of 13 columns"):
        parse("\n".join([HEAD, "     2097152        524288     float     sum      -1    131.9"]), "cut.log")


@pytest.mark.parametrize("prefix", ["0: ", "[1,0]<stdout>:", "[3] ", "2025-06-18T10:00:00.123456789Z ", "    "])
def test_launcher_prefixes_and_indentation(prefix):
    text = "\n".join(prefix + ln for ln in [HEAD, _row(8388608, 2097152, alg="82.65", bus="144.64")])
    t = parse(text).tables[0]
    assert t.collective == "allreduce" and t.nranks == 8 and t.rows[0].size == 8388608


def test_comment_lines_without_hash_and_chatter():
    text = "\n".join(
        [
            "$ dstack apply -f nccl.yml",
            "Provisioning...",
            "---> 100%",
            "nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20",
            HEAD.lstrip("#").replace("#wrong", "wrong"),
            "     (B)    (elements)",
            _row(8388608, 2097152, alg="53.47", bus="100.25"),
            "Out of bounds values : 0 OK",
            "Avg bus bandwidth    : 100.25",
            "Warning: Permanently added 'x' to the list of known hosts.",
        ]
    )
    t = parse(text).tables[0]
    assert t.collective == "allreduce" and t.nranks == 16 and t.complete and t.avg_busbw == 100.25
    assert t.run.ngpus == 1 and t.run.setting("iters") == 20


def test_old_formats_without_root_or_redop_columns():
    gather = "\n".join(
        [
            "#  size   count  type  time  algbw  busbw  error  time  algbw  busbw  error",
            "  1048576  65536  float  80.00  13.11   9.83  0e+00  80.00  13.11   9.83  0e+00",
        ]
    )
    t = parse(gather).tables[0]  # count per rank: 1048576 / (65536 x 4) = 4 ranks; bus 3/4
    assert t.columns[3] == "time" and t.rows[0].redop is None and t.collective == "allgather" and t.nranks == 4
    bcast = "\n".join(
        [
            "#  size   count  type  root  time  algbw  busbw  error  time  algbw  busbw  error",
            "  1048576  262144  float  0  80.00  13.11  13.11  0e+00  80.00  13.11  13.11  0e+00",
        ]
    )
    t = parse(bcast).tables[0]
    assert t.rows[0].root == 0 and t.collective == "broadcast"


def test_reduce_broadcast_and_ambiguity_are_said():
    assert parse(_row(1048576, 262144, op="sum", root=0, alg="13.11", bus="13.11")).tables[0].collective == "reduce"
    assert parse(_row(1048576, 262144, op="none", root=2, alg="13.11", bus="13.11")).tables[0].collective == "broadcast"
    # validation off (N/A everywhere): all_gather and alltoall print the same columns
    t = parse(_row(4194304, 131072, op="none", alg="41.31", bus="36.15", w="N/A", w2="N/A")).tables[0]
    assert t.collective is None and t.candidates == ("allgather", "alltoall") and t.nranks == 8
    # 2 ranks: allreduce's factor is 1 like sendrecv's; sendrecv does not check in-place results
    assert parse(_row(1048576, 262144, alg="3.09", bus="3.09", w2="N/A")).tables[0].collective == "sendrecv"
    assert parse(_row(1048576, 262144, alg="3.09", bus="3.09")).tables[0].collective == "allreduce"


def test_a_binary_that_contradicts_the_columns_is_not_trusted_silently():
    text = "\n".join(
        [
            "# Collective test starting: all_reduce_perf",
            HEAD,
            _row(4194304, 131072, op="none", alg="41.31", bus="36.15"),
        ]
    )
    t = parse(text).tables[0]
    assert t.collective is None and t.candidates == ("allreduce", "allgather")
    assert "disagree" in t.warnings[-1]
    other = parse(
        "# Collective test starting: gather_perf\n" + _row(4194304, 131072, op="none", alg="41.31", bus="36.15")
    ).tables[0]
    assert other.collective is None and other.candidates == () and "gather_perf" in other.warnings[-1]
    # a command line naming another binary than the table is ignored, and said so
    hint = parse("$ srun all_reduce_perf -b 8\n" + _row(4194304, 131072, op="none", alg="41.31", bus="36.15")).tables[0]
    assert hint.collective == "allgather" and "ignored the binary all_reduce_perf" in hint.warnings[-1]


def test_per_iteration_columns_cputime_and_exponents():
    head = (
        "#       size  count  type  redop  root  cputime  algbw  busbw  #wrong  i_min  i_max  i_p99  i_cv%  "
        "cputime  algbw  busbw  #wrong  i_min  i_max  i_p99  i_cv%"
    )
    row = (
        "  1073741824  268435456  float  sum  -1  1.2e+05  8.95  15.66  0  1.1e+05  1.3e+05  1.3e+05  1.5  "
        "1.2e+05  8.95  15.66  0  1.1e+05  1.3e+05  1.3e+05  1.5"
    )
    t = parse(head + "\n" + row).tables[0]
    m = t.rows[0].in_place
    assert (m.time_us, m.algbw, m.busbw) == (1.2e5, 8.95, 15.66) and t.collective == "allreduce" and t.nranks == 8


def test_recognise_uses_the_gpu_count_when_the_devices_give_it():
    row = nccltests.Row(
        1,
        1048576,
        262144,
        "float",
        "sum",
        -1,
        nccltests.Measurement(63.16, 16.60, 24.90, 0),
        nccltests.Measurement(63.08, 16.62, 24.94, 0),
    )
    assert recognise((row,), (), None, nranks=4)[0] == "allreduce"
    coll, cand, ev, warn = recognise((row,), (), None, nranks=8)  # 2 x 7/8 = 1.75 is not 1.5
    assert coll is None and cand == () and "contradict" in warn[0]


def test_file_errors_are_one_line(tmp_path):
    for data, want in (
        (b"", "the file is empty"),
        (b"\xff\xfe\x00x", "not UTF-8"),
        (b"just chatter\n", "no nccl-tests table"),
    ):
        p = tmp_path / "x.txt"
        p.write_bytes(data)
        with pytest.raises(NcclTestsError) as e:
            read(p)
        assert str(e.value).startswith(str(p)) and want in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(NcclTestsError, match="no such file"):
        read(tmp_path / "missing.txt")


# ---------------------------------------------------------------------------------------------- fuzz
SEED = (FIX / "heldout" / "h100-8gpu-1node-alltoall.txt").read_bytes()[-2500:]
PIECES = [
    HEAD,
    _row(1048576, 262144, alg="10.00", bus="17.50"),
    "...",
    "# Using devices",
    "#  Rank  0 Group  0 Pid 1 on a device  0 [0000:01:00] NVIDIA H100 80GB HBM3",
    "0: ",
    "[1,0]<stdout>:",
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 16 step: 2(factor)",
    "N/A",
    "nan",
    "inf",
    "-1",
    "1e999",
    "# Avg bus bandwidth    : 1",
    "size count type",
    "(B)",
    "\t",
    "#",
    " 99999999999999999999999 ",
]
PER_FILE_S = 1.0


def _check(res_or_err, where: str):
    if isinstance(res_or_err, nccltests.NcclTestsOutput):
        for t in res_or_err.tables:
            assert t.rows and all(r.size >= 0 and r.out_of_place.time_us >= 0 for r in t.rows)
            assert t.collective is None or t.collective in nccltests.COLLECTIVES
    else:
        msg = str(res_or_err)
        assert msg.startswith(where) and "\n" not in msg


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=30)), max_size=40))
def test_fuzz_text_gives_a_result_or_a_treecoll_error(parts):
    text = "\n".join(parts)
    t0 = time.perf_counter()
    try:
        res = parse(text, "fuzz")
    except TreecollError as e:
        res = e
    assert time.perf_counter() - t0 < PER_FILE_S
    _check(res, "fuzz")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.integers(0, len(SEED)), st.integers(0, 60))
def test_fuzz_bytes_of_a_real_table_give_a_result_or_a_treecoll_error(noise, at, cut):
    t0 = time.perf_counter()
    try:
        res = parse(SEED[:at] + noise + SEED[at + cut :], "fuzz.txt")
    except TreecollError as e:
        res = e
    assert time.perf_counter() - t0 < PER_FILE_S
    _check(res, "fuzz.txt")


def test_out_of_place_and_in_place_runs_are_kept_apart():
    """The left run is out-of-place, the right in-place (util.cu writeResultHeader); a table printing one
    run per row keeps it as out-of-place and has no in-place measurement."""
    both = parse(HEAD + "\n    8388608   2097152  float  sum  -1  101.5  82.65  144.64  0  99.0  84.73  148.28  0")
    r = both.tables[0].rows[0]
    assert (r.out_of_place.time_us, r.out_of_place.busbw, r.in_place.time_us, r.in_place.busbw) == (
        101.5,
        144.64,
        99.0,
        148.28,
    )
    one = parse(
        "#  size  count  type  redop  root  time  algbw  busbw  #wrong\n"
        "   1048576  262144  float  sum  -1  63.16  16.60  24.90  0\n"
        "   2097152  524288  float  sum  -1  120.00  17.48  26.21  0\n"
    ).tables[0]
    assert [r.in_place for r in one.rows] == [None, None] and one.rows[1].out_of_place.time_us == 120.0
    assert one.collective == "allreduce" and one.nranks == 4 and not one.dropped
