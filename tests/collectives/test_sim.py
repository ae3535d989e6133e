"""Closed forms and invariants of the flow-level simulator (collectives.sim)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from treecoll.collectives.schedule import Schedule, Step
from treecoll.collectives.sim import profiles as sim_profiles
from treecoll.collectives.sim import simulator as sim
from treecoll.collectives.sim.engine import maxmin_rates
from treecoll.collectives.sim.simulator import bandwidths, bus_factor, simulate, simulate_ring
from treecoll.topo.errors import CollectiveError, PlacementError

from tests.collectives.sim_helpers import (
    binomial_reduce_schedule,
    ring_allreduce_schedule,
    ring_topology,
    send_schedule,
    star_topology,
)
from tests.helpers import shipped


def test_one_transfer_over_one_link_is_alpha_plus_n_over_beta():
    topo = ring_topology(2, bw=50.0, lat=3.0)
    for n in (0, 4, 1 << 20, 3 * 10**9):
        r = simulate(topo, send_schedule(2, [(0, 1)]), n)
        assert r.time == pytest.approx(3e-6 + n / 50e9, rel=1e-12, abs=1e-15)
        assert r.finish[1] == pytest.approx(r.time) and r.finish[0] == pytest.approx(n / 50e9, abs=1e-15)


@pytest.mark.parametrize("P", [2, 3, 5, 8])
def test_ring_allreduce_closed_form_engine_and_lockstep(P):
    alpha, beta, n = 2.0e-6, 40e9, P * 10**7
    topo = ring_topology(P, bw=beta / 1e9, lat=alpha * 1e6)
    expect = 2 * (P - 1) * alpha + 2 * (P - 1) / P * n / beta
    ev = simulate(topo, ring_allreduce_schedule(P), n)
    lock = simulate_ring(topo, n)
    assert ev.time == pytest.approx(expect, rel=1e-9)
    assert lock.time == pytest.approx(expect, rel=1e-9)
    assert lock.busbw == pytest.approx(n / expect / 1e9 * 2 * (P - 1) / P, rel=1e-12)
    assert ev.kind_bytes == lock.kind_bytes


def test_ring_from_compiler_matches_lockstep_on_a_switch():
    compile_ = pytest.importorskip("treecoll.collectives.compile")
    P, n = 6, 6 * 2**22
    topo = star_topology(P, bw=100.0, lat=0.5)
    s = compile_.compile_ring_allreduce(P)
    ev = simulate(topo, s, n)
    lock = simulate_ring(topo, n)
    assert ev.time == pytest.approx(lock.time, rel=1e-6)
    assert ev.time == pytest.approx(2 * (P - 1) * 1e-6 + 2 * (P - 1) / P * n / 100e9, rel=1e-6)


def test_two_flows_on_one_link_take_twice_as_long():
    topo = star_topology(3, bw=10.0, lat=0.0)
    n = 10**8
    one = simulate(topo, send_schedule(3, [(1, 0)]), n)
    two = simulate(topo, send_schedule(3, [(1, 0), (2, 0)]), n)
    assert one.time == pytest.approx(n / 10e9)
    assert two.time == pytest.approx(2 * one.time, rel=1e-12)
    # disjoint links do not slow each other down
    apart = simulate(topo, send_schedule(3, [(1, 0), (0, 2)]), n)
    assert apart.time == pytest.approx(one.time, rel=1e-12)


def _chain_broadcast(K: int):
    """0 -> 1 -> 2, K chunks, rank 1 forwards each chunk as soon as it has it."""
    steps = [[Step("send", c, peer=1) for c in range(K)], [], [Step("recv", c, peer=1) for c in range(K)]]
    for c in range(K):
        steps[1] += [Step("recv", c, peer=0), Step("send", c, peer=2, deps=(2 * c,))]
    return Schedule("broadcast", 3, K, steps, root=0, name="chain")


@pytest.mark.parametrize("K", [1, 4, 16])
def test_ordered_pairs_pipeline_chunks_in_order(K):
    """One in-order connection per pair (gloo over TCP): chunk k of a chain arrives
    at rank 1 after (k+1)/K of the transfer, so forwarding overlaps receiving and
    the chain takes (K+1)/K * n/bw.  Without it the K messages share the link
    fairly, all arrive at n/bw, and the forwards share the next link: 2 n/bw."""
    topo = ring_topology(3, bw=10.0, lat=0.0)
    n = 4 * 10**8
    t = n / 10e9
    ordered = simulate(topo, _chain_broadcast(K), n, ordered_pairs=True)
    fair = simulate(topo, _chain_broadcast(K), n)
    assert ordered.time == pytest.approx((K + 1) / K * t, rel=1e-9)
    assert fair.time == pytest.approx(2 * t, rel=1e-9)
    assert ordered.link_bytes == fair.link_bytes  # the same bytes on the same links
    # a zero-byte message never holds the connection
    assert simulate(topo, _chain_broadcast(K), 0, ordered_pairs=True).time == pytest.approx(0.0, abs=1e-12)


def test_rendezvous_waits_for_the_posted_recv():
    """Rank 1 posts its recv from rank 0 only after its recv from rank 2 completed:
    without rendezvous rank 0's data moves at once (both halves arrive at t = n/2/bw);
    with it, rank 0's transfer starts when the recv is posted and ends at n/bw."""
    topo = ring_topology(3, bw=10.0, lat=0.0)
    steps = [
        [Step("send", 1, peer=1)],
        [Step("recv", 0, peer=2), Step("recv", 1, peer=0, deps=(0,))],
        [Step("send", 0, peer=1)],
    ]
    sched = Schedule("broadcast", 3, 2, steps, root=0, name="late-recv")
    n = 2 * 10**9
    half = n / 2 / 10e9
    assert simulate(topo, sched, n).time == pytest.approx(half, rel=1e-9)
    late = simulate(topo, sched, n, rendezvous=True)
    assert late.time == pytest.approx(2 * half, rel=1e-9)
    assert late.finish[0] == pytest.approx(2 * half, rel=1e-9)  # the send drained only then
    both = simulate(topo, sched, n, rendezvous=True, ordered_pairs=True)
    assert both.time == pytest.approx(2 * half, rel=1e-9)


def test_rates_are_max_min_fair():
    # classic example: flow 0 on links a,b; flow 1 on a; flow 2 on b; cap a = 1, b = 2
    uf, rate = maxmin_rates(np.array([0, 0, 1, 2]), np.array([0, 1, 0, 1]), np.array([1.0, 2.0]))
    assert uf.tolist() == [0, 1, 2] and rate.tolist() == pytest.approx([0.5, 0.5, 1.5])
    # an unshared flow takes a whole link even when its partner is limited elsewhere
    uf, rate = maxmin_rates(np.array([0, 0, 1]), np.array([5, 7, 7]), np.array([0, 0, 0, 0, 0, 1.0, 0, 10.0]))
    assert rate.tolist() == pytest.approx([1.0, 9.0])


@pytest.mark.parametrize("P", [2, 3, 4, 7, 8, 9, 16, 17, 32])
def test_binomial_reduce_takes_ceil_log2_rounds(P):
    """Latency-bound binomial reduce: one alpha per tree level; ceil(log2 P) levels when P is a power of 2.

    Receives at one rank overlap in this model, so for other P the time is
    the tree height (floor(log2 P) levels), never more than ceil(log2 P).
    """
    alpha = 5e-6
    topo = star_topology(P, bw=1e6, lat=alpha / 2 * 1e6)  # 2 links per transfer: alpha per round
    height = max(bin(r).count("1") for r in range(P))
    builders = pytest.importorskip("treecoll.collectives.builders")
    compile_ = pytest.importorskip("treecoll.collectives.compile")
    for sched in (binomial_reduce_schedule(P), compile_.compile_reduce(builders.build("binomial", nranks=P))):
        r = simulate(topo, sched, 8)
        assert r.time == pytest.approx(height * alpha, rel=1e-6)
        assert r.time <= math.ceil(math.log2(P)) * alpha * (1 + 1e-6)
        if P & (P - 1) == 0:
            assert r.time == pytest.approx(math.ceil(math.log2(P)) * alpha, rel=1e-6)


def test_bytes_sent_equal_bytes_received_and_link_accounting():
    P, n = 8, 1 << 20
    topo = star_topology(P)
    for sched in (ring_allreduce_schedule(P), binomial_reduce_schedule(P)):
        r = simulate(topo, sched, n)
        sent = sum(sched.bytes_sent(q, n) for q in range(P))
        recv = sum(sched.bytes_received(q, n) for q in range(P))
        assert sent == recv
        out_of_gpus = sum(b for k, b in r.link_bytes.items() if k.endswith("->h/sw"))
        into_gpus = sum(b for k, b in r.link_bytes.items() if k.startswith("h/sw->"))
        assert out_of_gpus == into_gpus == sent
        assert r.kind_bytes == {"nvlink": 2 * sent}


def test_simulation_pauses_the_garbage_collector_and_restores_it(monkeypatch):
    """The simulations pause Python's cyclic collector while they run (topo.gcpause.gc_paused)."""
    import gc

    topo, P = ring_topology(4, 10.0, 1.0), 4
    seen, engine, lockstep = [], sim.FlowEngine.run, sim.hop_times

    def record(real):
        def wrapper(*a, **k):
            seen.append(gc.isenabled())
            return real(*a, **k)

        return wrapper

    monkeypatch.setattr(sim.FlowEngine, "run", record(engine))
    monkeypatch.setattr(sim, "hop_times", record(lockstep))

    def both():
        simulate(topo, ring_allreduce_schedule(P), 1 << 20)
        simulate_ring(topo, 1 << 20)

    assert gc.isenabled()
    both()
    assert gc.isenabled() and seen == [False, False]  # paused inside both engines, back on after
    gc.disable()
    try:
        both()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_same_input_same_output():
    topo = star_topology(5, bw=20.0, lat=1.0, mem_bw=100.0)
    s = ring_allreduce_schedule(5)
    a = simulate(topo, s, 5 * 4096, profile="nccl-simple").as_dict(links=True)
    b = simulate(topo, s, 5 * 4096, profile="nccl-simple").as_dict(links=True)
    a["stats"].pop("wall_s"), b["stats"].pop("wall_s")
    assert a == b


def test_reduce_compute_and_scratch_memory():
    # binomial reduce of 2 ranks: transfer, then a reduce of 3n/mem_bw; one scratch slot of n bytes at the root
    topo = star_topology(2, bw=100.0, lat=0.0, mem_bw=300.0)
    n = 3 * 10**8
    r = simulate(topo, binomial_reduce_schedule(2), n)
    assert r.time == pytest.approx(n / 100e9 + 3 * n / 300e9)
    assert r.peak_scratch == (n, 0.0)


def test_profiles_floor_latency_and_scale_bandwidth():
    topo = star_topology(2, bw=10.0, lat=0.1)
    s = send_schedule(2, [(0, 1)])
    ll = sim_profiles.get_profile("nccl-ll")
    r = simulate(topo, s, 10**6, profile=ll)
    # latency floor 0.6 µs for an NVLink route, half the bandwidth, plus the 6.6 µs base latency
    assert r.time == pytest.approx(6.6e-6 + 0.6e-6 + 10**6 / 5e9)
    assert simulate(topo, s, 10**6, profile="ideal").time == pytest.approx(0.2e-6 + 10**6 / 10e9)


def test_busbw_definitions_follow_nccl_tests():
    assert bus_factor("allreduce", 8) == pytest.approx(1.75)
    assert bus_factor("allgather", 16) == pytest.approx(15 / 16)
    assert bus_factor("broadcast", 4) == 1.0
    assert bandwidths("allreduce", 10**9, 8, 0.5) == pytest.approx((2.0, 3.5))
    assert bus_factor("alltoall", 4) == bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bus_factor("sendrecv", 4) == bus_factor("reduce", 4) == 1.0
    with pytest.raises(CollectiveError, match="collective 'gather'"):
        bus_factor("gather", 4)


def test_ring_allgather_and_reduce_scatter_steps():
    P, n = 4, 4 * 10**8
    topo = ring_topology(P, bw=100.0, lat=1.0)
    ag = simulate_ring(topo, n, collective="allgather")
    rs = simulate_ring(topo, n, collective="reduce_scatter")
    expect = (P - 1) * 1e-6 + (P - 1) / P * n / 100e9
    assert ag.time == pytest.approx(expect) and rs.time == pytest.approx(expect)
    assert ag.busbw == pytest.approx(n / expect / 1e9 * (P - 1) / P)


def test_user_errors_are_collective_errors():
    topo = star_topology(2)
    s = send_schedule(2, [(0, 1)])
    with pytest.raises(CollectiveError, match="multiple of the float32 element size 4 B"):
        simulate(topo, s, 6)
    with pytest.raises(CollectiveError, match="dtype 'float7'"):
        simulate(topo, s, 8, dtype="float7")
    with pytest.raises(
        PlacementError,
        match=r"ranks: expected a count in 1\.\.2 \(the GPUs of topology 'star2'\), "
        r"got 3",
    ):
        simulate(topo, send_schedule(3, [(0, 2)]), 8)
    with pytest.raises(CollectiveError, match="profile 'fast'"):
        simulate(topo, s, 8, profile="fast")
    with pytest.raises(CollectiveError, match="ring collective 'alltoall'"):
        simulate_ring(topo, 8, collective="alltoall")
    with pytest.raises(CollectiveError, match=r"broadcast root: expected a rank in 0\.\.1, got 2"):
        simulate_ring(topo, 8, collective="broadcast", root=2)


TWO_BOXES = """
templates:
  box:
    gpus: {count: 1, mem_bw: 1000.0}
    cpus: [{numa: 0}]
    pcie: {bw: 24.0, switches: [{cpu: 0, gpus: [0], nics: [0]}]}
    nics: {count: 1, bw: 10.0, lat: 75.0}
hosts: [{template: box, count: 2}]
network: {type: single_switch, link: {bw: 10.0, lat: 1.0}}
"""


def test_a_nics_lat_adds_to_every_message_it_sends():
    """A NIC's ``lat`` (the transport's own latency, e.g. 75 µs that aws-ofi-nccl reports for EFA)
    adds once per route leaving through it: time = route lat + NIC lat + n / bw; NCCL's Simple
    protocol adds it twice (the flush)."""
    from treecoll import topo

    t = topo.loads(TWO_BOXES)
    a, b = t.rank_gpus()
    route = t.path(a, b).lat * 1e-6
    n = 10**8
    send = send_schedule(2, [(0, 1)])
    assert simulate(t, send, n).time == pytest.approx(route + 75e-6 + n / 10e9, rel=1e-12)
    simple = sim_profiles.get_profile("nccl-simple")
    assert simulate(t, send, n, profile=simple).time == pytest.approx(
        max(route, 14e-6) + 2 * 75e-6 + n / 10e9 + simple.base_lat, rel=1e-12
    )
    plain = topo.loads(TWO_BOXES.replace(", lat: 75.0}", "}"))
    assert simulate(plain, send, n).time == pytest.approx(route + n / 10e9, rel=1e-12)


@pytest.mark.parametrize("K", [1, 4, 16])
def test_lanes_let_a_tree_broadcast_overlap_its_reduce(K):
    """Chain 0 <- 1 <- 2, tree allreduce, K chunks, L per hop: with the broadcast in its own lane
    (NCCL's split tree kernels) the pipeline costs 4 L + (K + 3) / K * n / bw; issuing every step of
    a rank in one order makes the inner rank wait for each chunk's round trip before sending the
    next one up, so its time grows with K."""
    compile_ = pytest.importorskip("treecoll.collectives.compile")
    from treecoll.collectives.tree import Tree

    L, bw, n = 50e-6, 100e9, 3 * 2**20
    topo_ = ring_topology(3, bw=bw / 1e9, lat=L * 1e6)
    s = compile_.compile_allreduce(Tree((-1, 0, 1)), K, forward_lag=0)
    assert {st.lane for st in s.steps[1] if st.kind == "send" and st.peer == 0} == {0}
    down = [st for st in s.steps[1] if (st.kind, st.peer) == ("send", 2) or (st.kind, st.slot) == ("recv", 0)]
    assert len(down) == 2 * K and {st.lane for st in down} == {1}
    split = simulate(topo_, s, n, ordered_pairs=True, lanes=True)
    assert split.time == pytest.approx(4 * L + (K + 3) / K * n / bw, rel=1e-9)
    one = simulate(topo_, s, n, ordered_pairs=True)
    assert one.time >= split.time * (1 - 1e-12)
    if K == 16:
        assert one.time > 2.5 * split.time
    assert one.link_bytes == split.link_bytes


def test_tree_allreduce_profile_scales_bandwidth_by_tree_eff():
    p = sim_profiles.get_profile("nccl-simple")
    assert p.tree_eff == pytest.approx(0.92)
    t = p.for_tree_allreduce()
    assert t.efficiency("net") == pytest.approx(0.92) and t.tree_eff == 1.0 and t.for_tree_allreduce() is t
    assert sim_profiles.get_profile("ideal").for_tree_allreduce() is sim_profiles.get_profile("ideal")
    with pytest.raises(CollectiveError, match=r"tree_eff expected a value in \(0, 1\], got 0"):
        sim_profiles.Profile("x", tree_eff=0)
    with pytest.raises(CollectiveError, match=r"nic_lat_mult expected a non-negative number, got -1"):
        sim_profiles.Profile("x", nic_lat_mult=-1)


def test_profile_yaml_round_trip(tmp_path):
    p = sim_profiles.Profile("mine", 3.0, {"net": 5.0}, {"net": 0.8}, source="fit", nic_lat_mult=2.0, tree_eff=0.9)
    sim_profiles.save_profile(p, tmp_path / "mine.yaml", fit={"tables": 2})
    assert sim_profiles.get_profile(str(tmp_path / "mine.yaml")) == p
    (tmp_path / "bad.yaml").write_text("name: x\nbw_eff: {net: 2.5}\n")
    with pytest.raises(CollectiveError, match=r"bad.yaml'.*bw_eff.net expected .* \(0, 2\], got 2.5"):
        sim_profiles.load_profile(tmp_path / "bad.yaml")


@pytest.mark.parametrize("algo", ["two_level", "double_binary"])
def test_too_many_chunks_are_extrapolated_from_one_and_two(algo, monkeypatch):
    """Where the engine may simulate only 2 of the chunks a tree pipelines (from 4096 ranks on), the
    run is extrapolated from 1 and 2 chunks: far nearer the full pipeline than one chunk alone."""
    t = shipped("dgx-h100-x2")
    size = 64 << 20
    full = sim.simulate_algorithm(t, algo, size, profile="nccl-simple")
    one = sim.simulate_algorithm(t, algo, size, profile="nccl-simple", nchunks=1)
    monkeypatch.setattr(sim, "MAX_SIM_CHUNKS", 2)
    ex = sim.simulate_algorithm(t, algo, size, profile="nccl-simple")
    assert ex.stats["extrapolated_from_chunks"] == [1, 2] and ex.stats["chunks"] > 2
    assert one.time > 1.5 * full.time  # one chunk: the unpipelined tree
    assert abs(ex.time / full.time - 1) < 0.25


@pytest.mark.parametrize("pair", [("h1/gpu0", "h1/gpu3"), ("h1/gpu5", "h1/gpu2"), ("h0/gpu1", "h1/gpu1")])
def test_routes_inside_a_host_like_another_are_the_topologys_paths(pair):
    # h1 is built like h0: the engine renames h0's route of the same GPUs; it must be Topology.path's,
    # with its latency and every link of every subroute, whichever host was asked first
    from treecoll.collectives.sim.engine import Network
    from treecoll.topo import resolve

    t = resolve("dgx-h100-x2")
    net = Network(t, sim_profiles.get_profile("ideal"))
    net.route("h0/gpu0", "h0/gpu3")
    net.route("h0/gpu5", "h0/gpu2")
    r = net.route(*pair)
    p = t.path(*pair)
    got = [([net.ends[i] for i in ids.tolist()], share) for ids, share in r.subroutes]
    assert got == [(list(zip(nodes, nodes[1:])), share) for nodes, share in p.routes]
    fresh = Network(t, sim_profiles.get_profile("ideal"))._new_route(*pair)
    assert (r.lat, r.cls, r.share_list) == (fresh.lat, fresh.cls, fresh.share_list)
    assert r.min_caps == tuple(min(net.cap_list[i] for i in ids) for ids in r.link_lists)
