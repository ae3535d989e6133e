"""What a careful user tries with bad topology files and imports: each is one line naming file, line and key."""

from __future__ import annotations

import os
import re
import time

import pytest
from treecoll.topo import TopologyError
from treecoll.topo.nccl_xml import import_xml
from treecoll.topo.smi import import_smi

from tests.helpers import BOX
from treecoll import topo

EXPLICIT = """nodes:
- {id: h0/cpu0, kind: cpu, host: h0, numa: 0}
- {id: h0/gpu0, kind: gpu, host: h0, index: 0}
- {id: h0/gpu1, kind: gpu, host: h0, index: 1}
links:
- {a: h0/gpu0, b: h0/cpu0, kind: pcie, bw: 24.0, lat: 0.5}
- {a: h0/gpu1, b: h0/cpu0, kind: pcie, bw: 24.0, lat: 0.5}
"""
SMI = "\tGPU0\tGPU1\tNUMA Affinity\nGPU0\t X \tPIX\t0\nGPU1\tPIX\t X \t0\n"
XML = (
    '<system version="1">\n  <cpu numaid="0">\n    <pci busid="0000:01:00.0" class="0x030200"/>\n  </cpu>\n</system>\n'
)


def bomb(levels: int = 9) -> str:
    """A "billion laughs" YAML: each level lists the previous one nine times (9**levels values)."""
    out = "  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for i in range(1, levels):
        out += f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n"
    return "meta:\n" + out + BOX


BAD_YAML = [  # (base, old, new, message regex after "<file>:")
    (BOX, "bw: 24.0", "bw: -24.0", r"5: templates\.box\.pcie\.bw: expected a positive number \(GB/s\), got -24\.0$"),
    (BOX, "bw: 24.0", "bw: .nan", r"5: templates\.box\.pcie\.bw: expected a positive number \(GB/s\), got nan$"),
    (BOX, "bw: 24.0", "bw: .inf", r"5: templates\.box\.pcie\.bw: expected a positive number \(GB/s\), got inf$"),
    (BOX, "bw: 24.0", "bw: 'nan'", r"5: templates\.box\.pcie\.bw: expected a positive number \(GB/s\), got 'nan'$"),
    (BOX, "bw: 24.0", "bw: 1.0e+400", r"5: templates\.box\.pcie\.bw: expected a positive number \(GB/s\), got inf$"),
    (BOX, "count: 2, numa", "count: two, numa", r"3: templates\.box\.gpus\.count: expected an integer, got 'two'$"),
    (BOX, "count: 2, numa", "count: 2.5, numa", r"3: templates\.box\.gpus\.count: expected an integer, got 2\.5$"),
    (BOX, "count: 2, numa", "count: true, numa", r"3: templates\.box\.gpus\.count: expected an integer, got True$"),
    (
        BOX,
        "count: 2}]",
        "count: " + "9" * 5000 + "}]",
        (
            r"7: invalid YAML: cannot read the integer '9{40}': Exceeds the limit \(4300 digits\) for integer string "
            r"conversion: value has 5000 digits$"
        ),
    ),
    (BOX, "model: G}", "model: G, model: H}", r"3: duplicate key 'model': each key may appear once in a mapping$"),
    (BOX, "model: G", "model: 'G\x00'", r"3: invalid YAML: control characters are not allowed: '\\x00'$"),
    (BOX, "  box:", "\tbox:", r"2: invalid YAML: found character that cannot start any token"),
    (
        BOX,
        "hosts:",
        "meta: {made: 2024-13-45}\nhosts:",
        r"7: invalid YAML: cannot read the date/time '2024-13-45': month must be in 1\.\.12$",
    ),
    (
        BOX,
        "hosts:",
        "meta: &m {a: *m}\nhosts:",
        (
            r"7: invalid YAML: recursive alias \(a node that contains itself\): "
            r"expected plain data$"
        ),
    ),
    (
        BOX,
        "hosts:",
        "meta: " + "[" * 100_000 + "]" * 100_000 + "\nhosts:",
        r"7: invalid YAML: nested deeper than 100 levels of mappings and lists: expected a topology document",
    ),
    (
        BOX,
        "hosts:",
        "meta:\n" + "".join(" " * i + "- \n" for i in range(1, 200)) + "hosts:",
        r"107: invalid YAML: nested deeper than 100 levels",
    ),  # meta (line 7) is level 2, line 107 level 101
    (
        BOX,
        "{type: single_switch}",
        "{type: fat_tree, leaf_size: 0}",
        r"8: network\.leaf_size: expected an integer >= 1, got 0$",
    ),
    (
        BOX,
        "{type: single_switch}",
        "{type: torus, dims: [1000000000, 1000000000]}",
        (
            r"8: network\.dims: expected dimensions whose product is the host count 2, got \[1000000000, 1000000000\] "
            r"\(product 1000000000000000000\)$"
        ),
    ),
    (
        BOX,
        "count: 2}]",
        "count: 2, names: 'x{i}" + "y" * 300 + "'}]",
        r"7: hosts\[0\]\.names: host name of 302 characters: expected at most 253$",
    ),
    (
        BOX,
        "    pcie:",
        "    nvswitch: {count: 1, links: 1000000, link_bw: 1.0e+308}\n    pcie:",
        r"5: templates\.box\.nvswitch\.link_bw: 1000000 links x 1e\+308 GB/s overflows: expected a bandwidth in GB/s$",
    ),
    (BOX, "template: box", "template: nope", r"7: hosts\[0\]\.template: unknown template 'nope'"),
    (
        BOX,
        "{numa: 0}]",
        "{numa: 0, affinity: '0-1000000000'}]",
        (
            r"4: templates\.box\.cpus\[0\]\.affinity: expected a CPU list like '0-55,112-167' \(ascending ranges, ids "
            r"below 65536\), got '0-1000000000'$"
        ),
    ),
    (BOX, "{numa: 0}]", "{numa: 0, affinity: all}]", r"4: templates\.box\.cpus\[0\]\.affinity: expected a CPU list"),
    (
        BOX,
        "network: {type: single_switch}\n",
        "",
        r"7: hosts: 2 hosts need a 'network' \(one of single_switch, fat_tree, rail_optimized, torus\)$",
    ),
    (BOX, "templates:", "nodez: []\ntemplates:", r"1: nodez: unknown key 'nodez': expected one of \['hosts', "),
    (EXPLICIT, "lat: 0.5}", "lat: .nan}", r"6: links\[0\]\.lat: expected a non-negative number \(µs\), got nan$"),
    (EXPLICIT, "lat: 0.5}", "lat: -1}", r"6: links\[0\]\.lat: expected a non-negative number \(µs\), got -1$"),
    (EXPLICIT, "h0/gpu1, kind", "h0/gpu0, kind", r"4: nodes\[2\]\.id: duplicate node id 'h0/gpu0'$"),
    (
        EXPLICIT,
        "b: h0/cpu0, kind: pcie, bw: 24.0, lat: 0.5}\n- {a: h0/gpu1",
        "b: h0/cpu9, kind: pcie, bw: 24.0, lat: 0.5}\n- {a: h0/gpu1",
        r"6: links\[0\]\.b: dangling link end 'h0/cpu9': expected the id of a node listed in nodes",
    ),
    (EXPLICIT, "kind: cpu", "kind: tpu", r"2: nodes\[0\]\.kind: expected one of \['gpu', 'nvswitch'"),
    (
        EXPLICIT,
        "index: 1}",
        "index: 1, rank: 0}\n- {id: h0/gpu2, kind: gpu, host: h0, index: 2, rank: 0}",
        r"5: nodes\[3\]\.rank: rank 0 is given to two GPUs, nodes\[2\] and nodes\[3\]$",
    ),
    (
        EXPLICIT,
        "index: 0}",
        "index: 0, rank: 2}",
        r"3: nodes\[1\]\.rank: ranks must be 0\.\.P-1, each on one GPU: rank 2 is given but ranks \[0, 1\] are not$",
    ),
    (EXPLICIT, "index: 0}", "index: 0, rank: -1}", r"3: nodes\[1\]\.rank: expected an integer >= 0, got -1$"),
    (EXPLICIT, "lat: 0.5}", "lat: 0.5, count: 0}", r"6: links\[0\]\.count: expected an integer >= 1, got 0$"),
    (EXPLICIT, "numa: 0}", "numa: 0, affinity: '7-3'}", r"2: nodes\[0\]\.affinity: expected a CPU list"),
]


@pytest.mark.parametrize(
    "base, old, new, pattern", BAD_YAML, ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None
)
def test_bad_files_are_one_line_errors_naming_file_line_and_key(base, old, new, pattern, tmp_path):
    assert old in base
    f = tmp_path / "t.yaml"
    f.write_text(base.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(TopologyError, match=rf"^{f}:{pattern}") as e:
        topo.load(f)
    assert "\n" not in str(e.value)


def test_an_alias_bomb_is_refused_at_once(tmp_path):
    f = tmp_path / "bomb.yaml"
    f.write_text(bomb())
    t0 = time.perf_counter()
    # l5 (line 7) is the first level above 100,000 values (9**6 'lol' in it)
    with pytest.raises(
        TopologyError,
        match=rf"^{f}:7: invalid YAML: aliases expand the document to ([\d,]+) values "
        rf"from \d+ written: expected at most 100,000 .*an alias bomb\?",
    ) as e:
        topo.load(f)
    assert int(re.search(r"to ([\d,]+) values", str(e.value)).group(1).replace(",", "")) > 9**9
    assert time.perf_counter() - t0 < 5  # a hang would take minutes: bounded, not a benchmark
    assert len(topo.loads(bomb(4)).gpus()) == 4  # 9**4 values: a few aliases are fine


def test_valid_variants_load_the_same_topology(tmp_path):
    want = topo.loads(BOX)
    f = tmp_path / "crlf.yaml"
    f.write_bytes(BOX.replace("\n", "\r\n").encode())
    assert topo.load(f) == want
    f.write_bytes(b"\xef\xbb\xbf" + BOX.encode())  # a UTF-8 byte order mark
    assert topo.load(f) == want
    f.write_text("name: 'тест ✓'\n" + BOX.replace("model: G", "model: 'Grafikkarte ü'"), encoding="utf-8")
    t = topo.load(f)
    assert t.name == "тест ✓" and t.node("h1/gpu0")["model"] == "Grafikkarte ü"
    crlf_bad = BOX.replace("bw: 24.0", "bw: -1").replace("\n", "\r\n")
    with pytest.raises(TopologyError, match=r"^<string>:5: templates\.box\.pcie\.bw: expected a positive number"):
        topo.loads(crlf_bad)  # CRLF keeps line numbers


def test_documents_that_are_not_a_mapping(tmp_path):
    for text, what in (
        ("- 1\n- 2\n", ":1: \\(top level\\): expected a mapping, got a list"),
        ("42\n", ":1: \\(top level\\): expected a mapping, got an integer"),
        ("# only a comment\n", ": \\(top level\\): expected a mapping, got nothing \\(null\\)"),
    ):
        f = tmp_path / "t.yaml"
        f.write_text(text)
        with pytest.raises(TopologyError, match=rf"^{f}{what}$"):
            topo.load(f)


READERS = {
    "topo.load": lambda p: topo.load(p),
    "topo.resolve": lambda p: topo.resolve(str(p)),
    "topo.import_file": lambda p: topo.import_file(p),
    "import_xml": lambda p: import_xml(p),
    "import_smi": lambda p: import_smi(p),
}
WHAT = {
    "topo.load": "topology file",
    "topo.resolve": "topology file",
    "topo.import_file": "topology file",
    "import_xml": "the NCCL topology file",
    "import_smi": "the nvidia-smi output",
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_names_the_file_and_what_is_wrong_with_it(reader, tmp_path):
    read, what = READERS[reader], WHAT[reader]
    cases = [
        (tmp_path / "missing.yaml", "no such file"),
        (tmp_path, "it is a directory; expected a file"),
        ("/dev/null", r"not a regular file \(a character device\); expected a file"),
    ]
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    cases.append((empty, r"the file is empty \(0 bytes\)"))
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # opening it would block until a writer comes: it must not be opened
    cases.append((fifo, r"not a regular file \(a FIFO\); expected a file"))
    for path, msg in cases:
        with pytest.raises(TopologyError, match=rf"^{path}: cannot read {what}: {msg}"):
            read(path)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(b"name: x\n# caf\xe9\n")
    with pytest.raises(
        TopologyError,
        match=rf"^{latin}:2: cannot read {what}: not UTF-8 text \(byte 0xe9 at offset "
        rf"13\); save the file as UTF-8$",
    ):
        read(latin)


def test_importers_name_the_file_not_a_placeholder(tmp_path):
    x = tmp_path / "bad.xml"
    x.write_text(XML.replace('class="0x030200"', 'class="0x030200" link_width="x"'))
    for read in (import_xml, topo.import_file, lambda p: topo.resolve(str(p))):
        with pytest.raises(
            TopologyError,
            match=rf"^{x}:3: <pci busid='0000:01:00\.0'> link_width expected an "
            rf"integer, got 'x'$",
        ):
            read(x)
    s = tmp_path / "bad.txt"
    s.write_text(SMI.replace("\tPIX\t0", "\tFOO\t0"))
    for read in (import_smi, topo.import_file):
        with pytest.raises(TopologyError, match=rf"^{s}:2: row 'GPU0', column 'GPU1': expected one of X, SYS"):
            read(s)
    assert (
        topo.import_file(s.with_name("ok.txt").write_text(SMI) and s.with_name("ok.txt")).meta["source"]
        == f"nvidia-smi:{s.with_name('ok.txt')}"
    )


@pytest.mark.parametrize(
    "text, pattern",
    [
        (
            '<system version="1"/>',
            (
                r"expected at least one GPU \(a <gpu> element, or a <pci> of class 0x03\.\.\.\.\), got "
                r"none: a topology without GPUs has no ranks"
            ),
        ),
        (
            XML.replace("</cpu>", '<pci busid="0000:01:00.0" class="0x030200"/>\n  </cpu>'),
            r":4: <pci busid='0000:01:00\.0'>: bus id appears twice in host 'host0': expected each PCI device once$",
        ),
        (
            XML.replace("</system>", '<cpu numaid="0"/>\n</system>'),
            r":5: <cpu> #1: numaid 0 appears twice in host 'host0': expected one <cpu> per NUMA node$",
        ),
        (
            XML.replace(
                'class="0x030200"/>',
                'class="0x030200"><gpu dev="0"/></pci>\n<pci busid="0000:02:00.0" '
                'class="0x030200"><gpu dev="0"/></pci>',
            ),
            r":4: <gpu dev=0> of '0000:02:00\.0': expected each GPU dev once in host 'host0'",
        ),
        (
            XML.replace(
                'class="0x030200"/>',
                'class="0x030200"><gpu dev="0"><nvlink target="0000:02:00.0" '
                'count="99999999" tclass="0x068000"/></gpu></pci>',
            ),
            r":3: <nvlink target='0000:02:00\.0'> count: expected 1\.\.1024 links, got 99999999$",
        ),
        (
            XML.replace('class="0x030200"/>', 'class="0x030200"><gpu dev="0"><c2c bw="fast" count="2"/></gpu></pci>'),
            r":3: <c2c> of '0000:01:00\.0' bw \(MB/s per link\): expected a number >= 0, got 'fast'$",
        ),
        (
            XML.replace('class="0x030200"', 'class="0x030200" link_width="-16"'),
            r":3: <pci busid='0000:01:00\.0'> link_width: expected 1\.\.64 lanes \(0: unknown\), got -16$",
        ),
        (
            XML.replace(
                '<cpu numaid="0">',
                '<cpu numaid="0">'
                + "".join(f'<pci busid="0000:{b:02x}:00.0" class="0x060400">' for b in range(100, 170)),
            ).replace("</cpu>", "</pci>" * 70 + "</cpu>"),
            r":2: <pci busid='0000:a4:00\.0'>: nested deeper than 64 levels",
        ),
        (
            '<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
            + "".join(f'<!ENTITY {c} "{("&" + p + ";") * 10}">' for p, c in zip("abcdefgh", "bcdefghi"))
            + ']><system version="1"><cpu numaid="0" affinity="&i;"/></system>',
            r":1: expected well-formed XML, got limit on input amplification factor",
        ),
        ("<system", r":1: expected well-formed XML, got unclosed token"),
    ],
)
def test_nccl_xml_errors_name_file_and_line(text, pattern, tmp_path):
    f = tmp_path / "t.xml"
    f.write_text(text)
    with pytest.raises(TopologyError, match=rf"^{f}{pattern if pattern.startswith(':') else ': ' + pattern}"):
        topo.import_file(f)


@pytest.mark.parametrize(
    "text, pattern",
    [
        (SMI.replace("GPU1\tPIX", "GPU0\tPIX"), r":3: row 'GPU0' appears twice: expected one row per device$"),
        (SMI.replace("\tGPU1\tNUMA", "\tGPU0\tNUMA"), r":1: header column 'GPU0' appears twice"),
        (SMI.replace("PIX\t0\nGPU1", "NV0\t0\nGPU1"), r":2: row 'GPU0', column 'GPU1': expected one of X, SYS"),
        (
            "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tPIX\tPIX\nGPU1\tPIX\t X \tPIX\n",
            r": expected one row per header device, rows missing for \['GPU2'\]$",
        ),
    ],
)
def test_smi_errors_name_file_and_line(text, pattern, tmp_path):
    f = tmp_path / "m.txt"
    f.write_text(text)
    with pytest.raises(TopologyError, match=rf"^{f}{pattern}"):
        topo.import_file(f)


def test_resolve_reads_yaml_under_any_name_and_imports_by_content(tmp_path):
    f = tmp_path / "cluster.topo"
    f.write_text(BOX)
    assert topo.resolve(str(f)) == topo.loads(BOX)
    f.write_text(SMI)
    assert topo.resolve(str(f)).meta["source"] == f"nvidia-smi:{f}"
    f.write_text(XML)
    assert len(topo.resolve(str(f)).gpus()) == 1


def test_a_graph_with_infinite_or_nan_numbers_is_not_a_topology():
    d = topo.loads(BOX).to_dict()
    for key, value, what in (
        ("bw", float("inf"), "bw: expected a positive number"),
        ("lat", float("nan"), "lat expected a non-negative number"),
        ("lat", float("inf"), "lat expected a non-negative number"),
    ):
        bad = {**d, "links": [{**d["links"][0], key: value}] + d["links"][1:]}
        with pytest.raises(TopologyError, match=rf"^link 'h0/gpu0' -> 'h0/cpu0': {what}"):
            topo.Topology.from_dict(bad)


def test_cpu_masks_convert_in_linear_time():
    from treecoll.topo.nccl_xml import cpulist_to_mask, mask_to_cpulist

    t0 = time.perf_counter()
    assert mask_to_cpulist("f" * 200_000) == "0-799999"  # was quadratic in the mask's bits
    assert mask_to_cpulist(cpulist_to_mask("0-65535")) == "0-65535"
    assert time.perf_counter() - t0 < 5  # minutes before: bounded, not a benchmark
    assert cpulist_to_mask("0-1000000000") == "00000000"  # not a CPU list (ids below 65536): no CPU
