"""A forecaster daemon whose Redis dies keeps its last decision: the hold during the outage is
the count it last decided, not min replicas (the soak of issue 31 saw "hold: ...; no previous
decision, min replicas" while Redis was down, right after a decision of 8)."""

from __future__ import annotations

import shutil

import pytest

from forecaster.errors import SourceUnavailable
from forecaster.plan import PLANNER_DEFAULTS, PlannerState, hold
from forecaster.state import RedisStateStore
from sim.stack import RedisServer

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")


def test_a_store_whose_redis_died_still_knows_its_last_decision() -> None:
    with RedisServer() as server:
        store = RedisStateStore(server.url, "promptedge:forecaster:state:test", timeout_s=0.5)
        store.save(PlannerState(replicas=8, at=1_000.0, observed_since=0.0))
        assert store.load().replicas == 8
        server.kill()  # a real Redis process dies (SIGKILL)
        state = store.load()
    assert state is not None and state.replicas == 8
    decision = hold(state, 1_060.0, "source unreachable", PLANNER_DEFAULTS)
    assert decision.replicas == 8 and "keeping last decision 8" in decision.reason


def test_a_store_that_never_reached_redis_says_so() -> None:
    with RedisServer() as server:
        url = server.url
    store = RedisStateStore(url, "promptedge:forecaster:state:test", timeout_s=0.5)
    with pytest.raises(SourceUnavailable):
        store.load()
