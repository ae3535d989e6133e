"""Property-based fuzzing of the three topology readers (hypothesis): YAML, NCCL XML, nvidia-smi text.

Any byte string, and any mutation of a real file (bytes flipped, cut short, lines duplicated, dropped or
swapped), ends in a valid Topology or a one-line TreecollError, within a per-example deadline. Examples are
derandomized (the same inputs every run) and few enough that the whole file runs in seconds.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from treecoll.topo.nccl_xml import export_xml, import_xml
from treecoll.topo.smi import import_smi, render_smi

from treecoll import topo

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FUZZ = settings(
    max_examples=400,
    deadline=timedelta(seconds=2),
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
BOX = b"""templates:
  box:
    gpus: {count: 2, model: G}
    cpus: [{numa: 0}, {numa: 1}]
    smp: {bw: 10.0}
    pcie: {bw: 24.0, switches: [{cpu: 0, host_bridge: 0, quadrant: 0, gpus: [0], nics: [0]}, {cpu: 1, gpus: [1]}]}
    nvswitch: {count: 2, links: [2, 1], link_bw: 20.0}
    nics: {count: 1, bw: 25.0}
hosts: [{template: box, count: 3, names: "n{i}"}]
network: {type: fat_tree, leaf_size: 2, oversubscription: 2}
"""


def _seeds() -> dict[str, list[bytes]]:
    h100 = topo.load(ROOT / "topologies" / "dgx-h100.yaml")
    return {
        "yaml": [
            BOX,
            (ROOT / "topologies" / "dgx-h100.yaml").read_bytes(),
            (ROOT / "topologies" / "dgx-h100-x16.yaml").read_bytes(),
            topo.dumps(topo.loads(BOX)).encode(),
        ],
        "xml": [export_xml(h100).encode(), export_xml(topo.loads(BOX)).encode()],
        "smi": [p.read_bytes() for p in sorted((HERE / "smi").glob("*.txt"))] + [render_smi(h100).encode()],
    }


SEEDS = _seeds()
READERS = {"yaml": topo.loads, "xml": import_xml, "smi": import_smi}


_VALUE = re.compile(rb'(?:: |=")([^,"{}\[\]\n\t]+)|\t([^\t\n]+)')
ODD_VALUES = [
    b"0",
    b"-1",
    b"1.5",
    b"x",
    b"[]",
    b"{}",
    b"null",
    b"true",
    b".nan",
    b".inf",
    b"-.inf",
    b"1e999",
    b"99999999999999999999",
    b"9" * 5000,
    b"0x",
    b"",
    b" ",
    b"NV0",
    b"NV99999999",
    b"GPU0",
    b"SYS",
    b"h0/gpu0",
    b"&a",
    b"*a",
    b"!!binary x",
    b"\xc3\xa9",
    b"\xff",
    b"N/A",
    b"-",
    b"0-99999999999",
]


@st.composite
def mutated(draw, kind: str) -> bytes:
    data = draw(st.sampled_from(SEEDS[kind]))
    for _ in range(draw(st.integers(1, 4))):
        lines = data.split(b"\n")
        op = draw(st.sampled_from(["flip", "cut", "dup", "drop", "swap", "insert", "value", "value"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        j = draw(st.integers(0, len(lines) - 1))
        k = draw(st.integers(0, len(lines) - 1))
        if op == "flip" and data:
            data = data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1 :]
        elif op == "cut":
            data = data[:i]
        elif op == "dup":
            data = b"\n".join(lines[:j] + [lines[j]] * draw(st.integers(2, 50)) + lines[j + 1 :])
        elif op == "drop":
            data = b"\n".join(lines[:j] + lines[j + 1 :])
        elif op == "swap":
            lines[j], lines[k] = lines[k], lines[j]
            data = b"\n".join(lines)
        elif op == "value":  # a YAML value, an XML attribute or an nvidia-smi cell replaced by an odd one
            values = list(_VALUE.finditer(data))
            if values:
                m = draw(st.sampled_from(values))
                g = m.lastindex
                data = data[: m.start(g)] + draw(st.sampled_from(ODD_VALUES)) + data[m.end(g) :]
        else:
            data = data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:]
    return data


def _check(kind: str, data: bytes) -> None:
    try:
        t = READERS[kind](data)
    except topo.TreecollError as e:
        msg = str(e)
        assert msg and "\n" not in msg, msg
        assert "please report" not in msg, msg  # the loader's last-resort guard: a bug that slipped through
        return
    assert isinstance(t, topo.Topology) and t.gpus()


@pytest.mark.parametrize("kind", sorted(READERS))
def test_any_bytes_end_in_a_topology_or_a_one_line_error(kind):
    @FUZZ
    @given(st.binary(max_size=3000))
    def check(data):
        _check(kind, data)

    check()


@pytest.mark.parametrize("kind", sorted(READERS))
def test_mutated_real_files_end_in_a_topology_or_a_one_line_error(kind):
    @FUZZ
    @given(mutated(kind))
    def check(data):
        _check(kind, data)

    check()
