"""YAML topologies: round trips, template reuse, network templates, and every validation error."""

from __future__ import annotations

import io
import textwrap

import pytest
from treecoll.topo import TopologyError

from tests.helpers import BOX4, SHIPPED, edit, shipped
from treecoll import topo


# ------------------------------------------------------------------------------ valid files
@pytest.mark.parametrize("name", SHIPPED)
def test_round_trip_every_shipped_file(name, tmp_path):
    t = shipped(name)
    assert topo.loads(topo.dumps(t)) == t
    if len(t.gpus()) > 1000:
        return  # the 8192-GPU file: the text round trip above is the one that matters (and takes ~3 s)
    p = tmp_path / "t.yaml"
    topo.save(t, p)
    back = topo.load(p)
    assert back == t and back.name == t.name
    assert topo.Topology.from_dict(t.to_dict()) == t


def test_round_trip_through_streams_and_the_yaml_parser():
    t = topo.loads(BOX4)
    buf = io.StringIO()
    topo.save(t, buf)
    text = buf.getvalue()
    assert topo.load(io.StringIO(text)) == t
    # an edited saved file (a YAML comment inside the node list) goes through full YAML parsing
    assert topo.loads(text.replace("links:\n", "links:\n# edited by hand\n  \n")) == t


def test_round_trip_keeps_odd_values():
    t = topo.loads(edit("mem_bw: 100.0", "mem_bw: 1.0e-05", BOX4))
    assert t.node("h0/gpu0")["mem_bw"] == 1e-05
    back = topo.loads(topo.dumps(t))
    assert back == t and back.node("h0/gpu0")["mem_bw"] == 1e-05


def test_mem_gb_round_trips_through_both_forms():
    """A GPU's memory capacity (GB) from a compact template reaches every GPU node and survives the
    explicit form (dumps/loads, save/load of a file, to_dict/from_dict)."""
    t = topo.loads(edit("mem_bw: 100.0", "mem_bw: 100.0, mem_gb: 80", BOX4))
    assert {t.node(g)["mem_gb"] for g in t.gpus()} == {80.0} and len(t.gpus()) == 8
    back = topo.loads(topo.dumps(t))
    assert back == t and back.node("h1/gpu3")["mem_gb"] == 80.0
    assert topo.Topology.from_dict(t.to_dict()).node("h0/gpu0")["mem_gb"] == 80.0
    explicit = topo.loads(edit("index: 1}", "index: 1, mem_gb: 24.5}", EXPLICIT))
    assert explicit.node("h0/gpu1")["mem_gb"] == 24.5 and "mem_gb" not in explicit.node("h0/gpu0")
    assert topo.loads(topo.dumps(explicit)).node("h0/gpu1")["mem_gb"] == 24.5


def test_compact_expansion_shape():
    t = topo.loads(BOX4)
    assert t.hosts() == ("h0", "h1")
    assert t.gpus("h1") == ("h1/gpu0", "h1/gpu1", "h1/gpu2", "h1/gpu3")
    assert t.link("h0/gpu0", "h0/nvswitch1") == {"kind": "nvlink", "bw": 30.0, "lat": 0.3, "count": 3}
    assert t.path("h0/gpu0", "h0/gpu3").smi == "NV6"
    assert t.path("h0/gpu0", "h0/nic1").smi == "SYS"
    assert t.node("h1/gpu2")["numa"] == 1
    assert t.nearest_nic("h1/gpu2") == "h1/nic1"


def test_default_is_the_shipped_two_host_cluster():
    d = topo.default()
    assert d == shipped("dgx-h100-x2") and d.name == "dgx-h100-x2"
    assert topo.resolve("default") == d
    assert topo.resolve("dgx-h100-x2") == d


def test_cluster_files_reuse_the_single_host_template():
    one = shipped("dgx-h100")
    two = shipped("dgx-h100-x2")
    host0 = {n: dict(d) for n, d in two.graph.nodes(data=True) if d.get("host") == "h0"}
    assert host0 == {n: dict(d) for n, d in one.graph.nodes(data=True)}


def test_template_from_a_relative_path(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "mybox.yaml").write_text(BOX4.split("hosts:")[0])
    (tmp_path / "c.yaml").write_text(
        "hosts: [{template: lib/mybox.yaml, count: 3, names: 'n{j}'}]\nnetwork: {type: single_switch}\n"
    )
    t = topo.load(tmp_path / "c.yaml")
    assert t.hosts() == ("n0", "n1", "n2") and len(t.gpus()) == 12


def test_fat_tree_oversubscription_and_leaf_size():
    t = topo.loads(
        edit(
            "network: {type: single_switch}", "network: {type: fat_tree, leaf_size: 2, oversubscription: 2, spines: 1}"
        )
    )
    assert {n for n in t.nodes("net_switch")} == {"leaf0", "leaf1", "spine0"}
    # 2 ports of 25 GB/s per leaf, 2:1 -> one 25 GB/s port up
    assert t.link("leaf0", "spine0")["bw"] == 25.0
    assert t.path("h0/gpu0", "h1/gpu0").nodes[3:6] == ("leaf0", "spine0", "leaf1")
    assert t.leaf_groups() == (("h0",), ("h1",))


def test_rail_optimized_groups_scalable_units():
    t = topo.loads(
        edit("count: 2}", "count: 4}").replace("{type: single_switch}", "{type: rail_optimized, su_hosts: 2}")
    )
    assert t.leaf_groups() == (("h0", "h1"), ("h2", "h3"))
    p = t.path("h0/gpu0", "h1/gpu1")  # same rail (nic0), same unit: one leaf
    assert [n for n in p.nodes if "/" in n and n.startswith("rail")] == ["rail0/leaf0"]
    assert "spine0" in t.path("h0/gpu0", "h2/gpu0").nodes or "spine1" in t.path("h0/gpu0", "h2/gpu0").nodes


@pytest.mark.parametrize("dims,hops", [([2, 2], 2), ([2, 2, 2], 3)])
def test_torus(dims, hops):
    n = 1
    for x in dims:
        n *= x
    t = topo.loads(
        edit("count: 2}", f"count: {n}}}").replace("{type: single_switch}", f"{{type: torus, dims: {dims}}}")
    )
    assert len(t.nodes("net_switch")) == n
    p = t.path("h0/nic0", f"h{n - 1}/nic0")  # opposite corner
    routers = [x for x in p.nodes if x.startswith("torus")]
    assert len(routers) == hops + 1


def test_a_nics_transport_latency_is_kept_through_the_explicit_form():
    """``nics.lat`` (µs, what an NCCL net plugin reports as its latency): one value or one per NIC."""
    t = topo.loads(edit("nics: {count: 2, bw: 25.0}", "nics: {count: 2, bw: 25.0, lat: [75.0, 0]}"))
    assert t.node("h0/nic0")["lat"] == 75.0 and t.node("h1/nic1")["lat"] == 0.0
    assert topo.loads(topo.dumps(t)) == t and topo.loads(topo.dumps(t)).node("h1/nic0")["lat"] == 75.0
    assert "lat" not in topo.loads(BOX4).node("h0/nic0")
    with pytest.raises(TopologyError, match=r"nodes\[\d+\]\.lat: expected a non-negative number \(µs\), got -1"):
        topo.loads(topo.dumps(t).replace('"lat": 75.0', '"lat": -1', 1))


def test_explicit_and_compact_mixed():
    text = BOX4 + textwrap.dedent("""\
        nodes:
          - {id: storage, kind: net_switch, tier: 1}
        links:
          - {a: leaf0, b: storage, kind: net, bw: 100.0, lat: 1.0}
        """)
    t = topo.loads(text)
    assert t.link("storage", "leaf0")["bw"] == 100.0


# ------------------------------------------------------------------------------ errors
ERRORS = [
    # (old, new, regex): each edit of BOX4 must raise TopologyError matching regex (file:line: key path: ...)
    ("hosts:\n", "hostz: 1\nhosts:\n", r"^<string>:16: hostz: unknown key 'hostz': expected one of"),
    ("    gpus: {count: 4, model: X, mem_bw: 100.0}\n", "", r"^<string>:3: templates\.box: missing key 'gpus'"),
    ("count: 4,", "count: four,", r"^<string>:4: templates\.box\.gpus\.count: expected an integer, got 'four'"),
    (
        "mem_bw: 100.0}",
        "mem_bw: 100.0, mem_gb: 0}",
        r"^<string>:4: templates\.box\.gpus\.mem_gb: expected a positive number \(GB of 1e9 bytes\), got 0$",
    ),
    (
        "mem_bw: 100.0}",
        "mem_bw: 100.0, mem_gb: 80GB}",
        r"^<string>:4: templates\.box\.gpus\.mem_gb: expected a positive number \(GB of 1e9 bytes\), got '80GB'$",
    ),
    (
        "nics: {count: 2, bw: 25.0}",
        "nics: {count: 2, bw: 0}",
        r"^<string>:15: templates\.box\.nics\.bw: expected a positive number \(GB/s\), got 0",
    ),
    ("smp: {bw: 8.0}", "smp: {bw: -1}", r"^<string>:9: templates\.box\.smp\.bw: expected a positive number"),
    (
        "nics: {count: 2, bw: 25.0}",
        "nics: {count: 2, bw: 25.0, lat: [1.0, -2]}",
        r"^<string>:15: templates\.box\.nics\.lat\[1\]: expected a non-negative number \(µs\), got -2",
    ),
    (
        "links: [3, 3]",
        "links: [3, 3, 3]",
        r"^<string>:5: templates\.box\.nvswitch\.links: expected 2 integers \(NVLinks from each GPU",
    ),
    (
        "gpus: {count: 4, model: X,",
        "gpus: {count: 4, pci: [a, b], model: X,",
        r"^<string>:4: templates\.box\.gpus\.pci: expected 4 PCI bus ids \(one per GPU\), got 2",
    ),
    (
        "gpus: [2, 3], nics: [1]",
        "gpus: [2], nics: [1]",
        r"^<string>:4: templates\.box\.gpus: GPU 3: expected it under a PCIe switch",
    ),
    (
        "gpus: [2, 3], nics: [1]",
        "gpus: [2, 3, 1], nics: [1]",
        r"^<string>:14: templates\.box\.pcie\.switches\[1\]\.gpus\[2\]: GPU 1 is already under PCIe switch 0",
    ),
    (
        "gpus: [2, 3], nics: [1]",
        "gpus: [2, 7], nics: [1]",
        r"^<string>:14: templates\.box\.pcie\.switches\[1\]\.gpus\[1\]: expected a GPU index in 0\.\.3, got 7",
    ),
    (
        "- {cpu: 1, gpus",
        "- {parent: 1, gpus",
        r"^<string>:14: templates\.box\.pcie\.switches\[1\]\.parent: expected the index of an earlier switch",
    ),
    (
        "- {cpu: 1, gpus",
        "- {cpu: 5, gpus",
        r"^<string>:14: templates\.box\.pcie\.switches\[1\]\.cpu: expected a NUMA domain listed in cpus \(\[0, 1\]\)",
    ),
    (
        "- {numa: 1, socket: 1}",
        "- {numa: 0, socket: 1}",
        r"^<string>:8: templates\.box\.cpus\[1\]\.numa: NUMA domain 0 defined twice",
    ),
    (
        "{template: box, count: 2}",
        "{template: boxx, count: 2}",
        r"^<string>:17: hosts\[0\]\.template: unknown template 'boxx': expected one of this file's templates \['box'\]",
    ),
    (
        "{template: box, count: 2}",
        "{template: box, count: 0}",
        r"^<string>:17: hosts\[0\]\.count: expected an integer >= 1, got 0",
    ),
    (
        "{template: box, count: 2}",
        "{template: box, count: 2, names: node}",
        r"^<string>:17: hosts\[0\]\.names: expected a pattern with \{i\}",
    ),
    ("network: {type: single_switch}\n", "", r"^<string>:16: hosts: 2 hosts need a 'network'"),
    (
        "{type: single_switch}",
        "{type: dragonfly}",
        r"^<string>:18: network\.type: expected one of \['single_switch', 'fat_tree', 'rail_optimized', 'torus'\], "
        r"got 'dragonfly'",
    ),
    (
        "{type: single_switch}",
        "{type: torus, dims: [3, 3]}",
        r"^<string>:18: network\.dims: expected dimensions whose product is the host count 2",
    ),
    ("{type: single_switch}", "{type: fat_tree}", r"^<string>:18: network: missing key 'leaf_size'"),
    (
        "{type: single_switch}",
        "{type: single_switch, leaf_size: 4}",
        r"^<string>:18: network\.leaf_size: unknown key 'leaf_size'",
    ),
    ("    smp: {bw: 8.0}\n", "", r"^<string>:3: templates\.box: missing key 'smp': 2 NUMA domains"),
    (
        "nvswitch: {count: 2,",
        "nvswitch: {scope: global, count: 2,",
        r"^<string>:5: templates\.box\.nvswitch\.scope: expected 'host' or 'rack', got 'global'",
    ),
    # YAML-level problems
    ("count: 4, model: X,", "count: 4, count: 5, model: X,", r"^<string>:4: duplicate key 'count'"),
    ("    smp: {bw: 8.0}\n", "    smp: {bw: 8.0\n", r"^<string>:1\d: invalid YAML: .*"),
    ("name: t\n", "- a\n", r"^<string>:2: invalid YAML"),
]


@pytest.mark.parametrize("old,new,pattern", ERRORS, ids=[e[2][10:50] for e in ERRORS])
def test_validation_errors_name_line_and_key(old, new, pattern):
    with pytest.raises(TopologyError, match=pattern):
        topo.loads(edit(old, new))


EXPLICIT = textwrap.dedent("""\
    name: e
    nodes:
      - {id: h0/gpu0, kind: gpu, host: h0, index: 0}
      - {id: h0/gpu1, kind: gpu, host: h0, index: 1}
    links:
      - {a: h0/gpu0, b: h0/gpu1, kind: nvlink, bw: 40.0, lat: 0.6, count: 2}
    """)

EXPLICIT_ERRORS = [
    ("b: h0/gpu1,", "b: h0/gpu9,", r"^<string>:6: links\[0\]\.b: dangling link end 'h0/gpu9'"),
    ("id: h0/gpu1,", "id: h0/gpu0,", r"^<string>:4: nodes\[1\]\.id: duplicate node id 'h0/gpu0'"),
    (
        "kind: gpu, host: h0, index: 1",
        "kind: tpu, host: h0, index: 1",
        r"^<string>:4: nodes\[1\]\.kind: expected one of \['gpu'",
    ),
    ("index: 1}", "index: 1, colour: red}", r"^<string>:4: nodes\[1\]\.colour: unknown key 'colour' for a gpu"),
    ("index: 1}", "index: -1}", r"^<string>:4: nodes\[1\]\.index: expected an integer >= 0, got -1"),
    (
        "index: 1}",
        "index: 1, mem_gb: -80}",
        r"^<string>:4: nodes\[1\]\.mem_gb: expected a positive number \(GB of 1e9 bytes\), got -80$",
    ),
    (
        "index: 1}",
        "index: 1, mem_gb: .inf}",
        r"^<string>:4: nodes\[1\]\.mem_gb: expected a positive number \(GB of 1e9 bytes\)",
    ),
    ("kind: gpu, host: h0, index: 1", "kind: gpu, index: 1", r"^<string>:4: nodes\[1\]: missing key 'host'"),
    ("bw: 40.0", "bw: -40.0", r"^<string>:6: links\[0\]\.bw: expected a positive number \(GB/s\), got -40\.0"),
    ("kind: nvlink,", "kind: infiniband,", r"^<string>:6: links\[0\]\.kind: expected one of \['nvlink'"),
    (
        "count: 2}",
        "count: 2}\n  - {a: h0/gpu1, b: h0/gpu0, kind: nvlink, bw: 40.0}",
        r"^<string>:7: links\[1\]: duplicate link 'h0/gpu1' -> 'h0/gpu0'",
    ),
    (
        "count: 2}",
        "count: 2, directed: true}",
        r"^<string>: link 'h0/gpu0' -> 'h0/gpu1': the reverse direction is missing",
    ),
    ("count: 2}", "count: 0}", r"^<string>:6: links\[0\]\.count: expected an integer >= 1, got 0"),
]


@pytest.mark.parametrize("old,new,pattern", EXPLICIT_ERRORS, ids=[e[2][10:50] for e in EXPLICIT_ERRORS])
def test_explicit_form_errors(old, new, pattern):
    assert topo.loads(EXPLICIT).path("h0/gpu0", "h0/gpu1").smi == "NV2"
    with pytest.raises(TopologyError, match=pattern):
        topo.loads(edit(old, new, EXPLICIT))


def test_errors_in_saved_files_name_the_line(tmp_path):
    p = tmp_path / "saved.yaml"
    topo.save(topo.loads(EXPLICIT), p)
    text = p.read_text()
    p.write_text(text.replace('"bw": 40.0', '"bw": 0.0'))
    line = next(i for i, ln in enumerate(text.split("\n"), 1) if '"bw": 40.0' in ln)
    with pytest.raises(TopologyError, match=rf"^{p}:{line}: links\[0\]\.bw: expected a positive number"):
        topo.load(p)


@pytest.mark.parametrize(
    "text,pattern",
    [
        ("", r"^<string>:.*expected a mapping, got nothing"),
        ("[1, 2]", r"^<string>:1: \(top level\): expected a mapping, got a list"),
        ("name: x\n", r"^<string>:1: \(top level\): expected 'hosts' \(compact form\) or 'nodes'"),
        ("name: x\nhosts: 3\n", r"^<string>:2: hosts: expected a list of host groups, got 3"),
        ("a: [unclosed\n", r"^<string>:2: invalid YAML"),
        ("a: !!python/object:os.system x\n", r"^<string>:1: invalid YAML"),
        ("name: x\nhosts: [\x00]\n", r"^<string>:2: invalid YAML: control characters are not allowed: '\\x00'$"),
        (
            b"name: \xff\n",
            r"^<string>:1: cannot read topology: not UTF-8 text \(byte 0xff at offset 6\); save the "
            r"file as UTF-8$",
        ),
        (b"hosts: [{template: dgx-h100}]\n", None),
    ],
)
def test_malformed_documents(text, pattern):
    if pattern is None:  # bytes are read as UTF-8
        assert len(topo.loads(text).gpus()) == 8
        return
    with pytest.raises(TopologyError, match=pattern):
        topo.loads(text)


def test_missing_file_and_missing_shipped_template(tmp_path):
    with pytest.raises(TopologyError, match=r"nope\.yaml: cannot read topology file: no such file"):
        topo.load(tmp_path / "nope.yaml")
    (tmp_path / "c.yaml").write_text("hosts: [{template: no-such-box}]\n")
    with pytest.raises(TopologyError, match=r"c\.yaml:1: hosts\[0\]\.template: unknown template 'no-such-box'"):
        topo.load(tmp_path / "c.yaml")
    with pytest.raises(TopologyError, match=r"shipped topology 'x': not found; expected one of \[.*'dgx-h100'"):
        topo.shipped("x")


def test_errors_inside_a_referenced_template_name_that_file(tmp_path):
    (tmp_path / "bad.yaml").write_text(edit("bw: 25.0}", "bw: fast}", BOX4.split("hosts:")[0]))
    (tmp_path / "c.yaml").write_text("hosts: [{template: bad}]\n")
    with pytest.raises(TopologyError, match=r"bad\.yaml:15: templates\.box\.nics\.bw: expected a positive number"):
        topo.load(tmp_path / "c.yaml")


def test_loading_never_writes_the_file(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text(BOX4)
    before = p.stat().st_mtime_ns
    topo.load(p)
    assert p.read_text() == BOX4 and p.stat().st_mtime_ns == before


def test_mutated_files_never_escape_as_other_exceptions():
    """Random edits of valid files (values swapped, characters or lines deleted): each either loads or
    raises one TopologyError of one line that is not the loader's last-resort guard."""
    import random
    import re

    rnd = random.Random(2)
    values = ["0", "-1", "1.5", "x", "[]", "{}", "null", "true", "[1, 2]", "{a: 1}", "99", "h0/gpu0", "[0, 0]", ".nan"]
    bases = [BOX4, EXPLICIT, topo.dumps(topo.loads(BOX4))]
    outcomes = {"ok": 0, "error": 0}
    for i in range(300):
        s = bases[i % 3]
        for _ in range(rnd.randint(1, 3)):
            op = rnd.random()
            scalars = list(re.finditer(r"(?<=: )[^,{}\[\]\n]+|(?<=\[)[^,\]\n]+", s))
            if op < 0.5 and scalars:
                m = rnd.choice(scalars)
                s = s[: m.start()] + rnd.choice(values) + s[m.end() :]
            elif op < 0.8:
                j = rnd.randrange(len(s))
                s = s[:j] + s[j + rnd.randint(1, 5) :]
            else:
                lines = s.split("\n")
                del lines[rnd.randrange(len(lines))]
                s = "\n".join(lines)
        try:
            topo.loads(s)
            outcomes["ok"] += 1
        except TopologyError as e:
            assert "\n" not in str(e) and "please report" not in str(e), (s, str(e))
            assert str(e).startswith("<string>"), str(e)
            outcomes["error"] += 1
    assert outcomes["ok"] > 10 and outcomes["error"] > 100, outcomes


def _random_cluster(draw):
    from hypothesis import strategies as st

    ngpu = draw(st.integers(1, 6))
    ncpu = draw(st.integers(1, 3))
    nnic = draw(st.integers(1, 3))
    hosts = draw(st.integers(1, 5))
    nsw = draw(st.integers(0, 3))
    lines = [
        "templates:",
        "  t:",
        f"    gpus: {{count: {ngpu}, model: G, mem_bw: 100.0}}",
        "    cpus: [" + ", ".join(f"{{numa: {c}}}" for c in range(ncpu)) + "]",
        "    smp: {bw: 10.0}",
        f"    nics: {{count: {nnic}, bw: 25.0}}",
    ]
    if nsw:
        links = [draw(st.integers(1, 5)) for _ in range(nsw)]
        lines.append(f"    nvswitch: {{count: {nsw}, links: {links}, link_bw: 20.0}}")
    # devices: each under a random switch (or directly on a CPU)
    switches: list[dict] = []
    direct_gpu, direct_nic = {}, {}
    for kind, n, direct in (("gpus", ngpu, direct_gpu), ("nics", nnic, direct_nic)):
        for i in range(n):
            where = draw(st.integers(-1, len(switches)))
            if where == -1:
                direct[i] = draw(st.integers(0, ncpu - 1))
            elif where == len(switches):
                sw = {"gpus": [], "nics": []}
                if switches and draw(st.booleans()):
                    sw["parent"] = draw(st.integers(0, len(switches) - 1))
                else:
                    sw["cpu"] = draw(st.integers(0, ncpu - 1))
                    sw["host_bridge"] = draw(st.integers(0, 1))
                sw[kind].append(i)
                switches.append(sw)
            else:
                switches[where][kind].append(i)
    lines += ["    pcie:", "      bw: 24.0", "      switches:"]
    lines += ["        - {" + ", ".join(f"{k}: {v}" for k, v in sw.items()) + "}" for sw in switches]
    if not switches:
        lines[-1] = "      switches: []"
    root = []  # NUMA domain each switch hangs under
    for sw in switches:
        root.append(sw["cpu"] if "cpu" in sw else root[sw["parent"]])
    under = {(k, i): root[s] for s, sw in enumerate(switches) for k in ("gpus", "nics") for i in sw[k]}
    if direct_gpu:  # a numa list must agree with the switches' domains for the GPUs under them
        numas = [direct_gpu[i] if i in direct_gpu else under["gpus", i] for i in range(ngpu)]
        lines[2] = lines[2][:-1] + f", numa: {numas}}}"
    if direct_nic:
        numas = [direct_nic[i] if i in direct_nic else under["nics", i] for i in range(nnic)]
        lines[5] = lines[5][:-1] + f", numa: {numas}}}"
    lines.append(f"hosts: [{{template: t, count: {hosts}}}]")
    net = draw(
        st.sampled_from(
            [
                "{type: single_switch}",
                "{type: rail_optimized, su_hosts: 2}",
                "{type: fat_tree, leaf_size: 2, oversubscription: 2}",
            ]
        )
    )
    lines.append(f"network: {net}")
    return "\n".join(lines) + "\n", ngpu, hosts


def test_random_compact_clusters_expand_and_round_trip():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        text, ngpu, hosts = _random_cluster(data.draw)
        t = topo.loads(text)
        assert len(t.gpus()) == ngpu * hosts and t.hosts() == tuple(f"h{i}" for i in range(hosts))
        assert topo.loads(topo.dumps(t)) == t
        gpus = t.gpus("h0")
        for a in gpus:
            assert t.nearest_nic(a) is not None
            for b in gpus:
                p, q = t.path(a, b), t.path(b, a)
                assert (p.nccl, p.smi, p.hops) == (q.nccl, q.smi, q.hops)
        if hosts > 1:
            assert t.path("h0/gpu0", f"h{hosts - 1}/gpu{ngpu - 1}").nccl == "NET"

    check()
