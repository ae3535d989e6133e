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
