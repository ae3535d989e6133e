"""Fixtures of the collectives tests."""

from __future__ import annotations

import pytest
from treecoll.collectives.launch import RankPool


@pytest.fixture(scope="session")
def pool4():
    """Four gloo ranks (:class:`treecoll.collectives.launch.RankPool`) shared by the tests that run
    real collectives: started once, as spawning is slow on 2 cores."""
    with RankPool(4) as pool:
        yield pool


@pytest.fixture(params=["python", "native"])
def loop(request, monkeypatch):
    """The flow engine's event loop a test runs: ``python`` (the reference) or ``native``
    (:mod:`treecoll.collectives.sim.engine_native`; skipped where it cannot be built)."""
    from treecoll.collectives.sim import engine_native

    if request.param == "python":
        monkeypatch.setattr(engine_native, "_STATE", {"error": "the Python loop, for this test"})
    elif not engine_native.native_status()["available"]:
        pytest.skip(f"the native loop is unavailable: {engine_native.native_status()['reason']}")
    return request.param
