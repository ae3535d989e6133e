"""The flow engine's max-min filling: the Python filling of small components, and that of flows
sharing no link, give the numpy filling's rates to the last bit, so the engine's numbers do not
depend on which one ran."""

from __future__ import annotations

import random

import numpy as np
import pytest
from treecoll.collectives.sim.engine import _fill, _fill_disjoint, _fill_small, maxmin_rates


def _random_component(rng: random.Random, nflows: int, nlinks: int):
    links = [tuple(rng.sample(range(nlinks), rng.randint(1, min(4, nlinks)))) for _ in range(nflows)]
    caps = [rng.choice([25e9, 50e9, 46.4e9, 370.8e9 / 18, 1e9 / 3]) * rng.choice([1, 1, 2]) for _ in range(nlinks)]
    return links, caps


@pytest.mark.parametrize("seed", range(40))
def test_python_filling_equals_the_numpy_filling_bit_for_bit(seed):
    rng = random.Random(seed)
    links, caps = _random_component(rng, rng.randint(1, 30), rng.randint(1, 12))
    fi = np.repeat(np.arange(len(links)), [len(ls) for ls in links])
    li = np.concatenate([np.array(ls) for ls in links])
    want = _fill(fi, li, np.array(caps, dtype=np.float64), len(links)).tolist()
    got = _fill_small(links, dict(enumerate(caps)))
    assert got == want


def test_python_filling_on_a_closed_form_case():
    # link 0 (12 B/s) shared by flows 0, 1, 2; flow 2 also on link 1 (2 B/s): flow 2 gets 2, the others 5 each
    assert _fill_small([(0,), (0,), (0, 1)], {0: 12.0, 1: 2.0}) == [5.0, 5.0, 2.0]
    assert maxmin_rates(np.array([0, 1, 2, 2]), np.array([0, 0, 0, 1]), np.array([12.0, 2.0]))[1].tolist() == [
        5.0,
        5.0,
        2.0,
    ]


@pytest.mark.parametrize("seed", range(40))
def test_filling_of_flows_sharing_no_link_equals_the_full_filling_bit_for_bit(seed):
    rng = random.Random(seed)
    nflows = rng.randint(1, 12)
    ids = rng.sample(range(100), 4 * nflows)  # each link in one flow only
    links = [tuple(ids[4 * f : 4 * f + rng.randint(1, 4)]) for f in range(nflows)]
    # capacities close to each other too, where the filling's tolerance freezes two levels together
    caps = {lk: rng.choice([25e9, 50e9, 46.4e9, 370.8e9 / 18, 1e9 / 3, 25e9 * (1 + 1e-10), 0.0]) for lk in ids}
    want = _fill_small(links, dict(caps))
    assert _fill_disjoint([min(caps[lk] for lk in ls) for ls in links]) == want


def test_filling_of_flows_sharing_no_link_on_a_closed_form_case():
    # each flow alone on its links: its slowest link
    assert _fill_disjoint([8.0, 2.0, 5.0]) == [8.0, 2.0, 5.0]


@pytest.mark.parametrize("seed", range(40))
def test_native_filling_equals_the_python_filling_bit_for_bit(seed):
    from treecoll.collectives.sim import engine_native

    if not engine_native.native_status()["available"]:
        pytest.skip(f"the native loop is unavailable: {engine_native.native_status()['reason']}")
    rng = random.Random(1000 + seed)
    links, caps = _random_component(rng, rng.randint(1, 30), rng.randint(1, 12))
    if seed % 4 == 0:  # a link repeated within a subflow counts twice, as in the Python filling
        links[0] = links[0] + links[0][:1]
    assert engine_native.maxmin_fill(links, caps) == _fill_small(links, dict(enumerate(caps)))


def test_native_filling_on_a_closed_form_case():
    from treecoll.collectives.sim import engine_native

    if not engine_native.native_status()["available"]:
        pytest.skip(f"the native loop is unavailable: {engine_native.native_status()['reason']}")
    # link 0 (12 B/s) shared by flows 0, 1, 2; flow 2 also on link 1 (2 B/s): flow 2 gets 2, the others 5 each
    assert engine_native.maxmin_fill([(0,), (0,), (0, 1)], [12.0, 2.0]) == [5.0, 5.0, 2.0]
