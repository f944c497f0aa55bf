"""The forecaster's state and published decision on a real Redis Cluster and a real Sentinel
group (tests/conftest.py), reached by their URLs, and held across a Sentinel failover."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from forecaster.actuate.publish import DesiredStore
from forecaster.actuate.settings import ActuatorSettings
from forecaster.plan import PlannerState, Recommendation
from forecaster.state import RedisStateStore
from sim.stack.redis_topology import LocalSentinel

pytestmark = pytest.mark.redis_ha

STATE = PlannerState(
    replicas=4,
    at=1000.0,
    last_up_at=900.0,
    last_down_at=None,
    recent=(Recommendation(900.0, 3, 3), Recommendation(1000.0, 4, 3, 1300.0)),
)


def roundtrip(url: str) -> None:
    store = RedisStateStore(url, "promptedge:forecaster:state:llm/vllm", timeout_s=2)
    store.save(STATE)
    assert RedisStateStore(url, store.key, timeout_s=2).load() == STATE
    desired = DesiredStore.from_settings(ActuatorSettings(redis_url=url, namespace="llm", deployment="vllm"))
    desired.publish(4, "forecast", datetime.fromtimestamp(1000.0, UTC))
    published = desired.read()
    assert published is not None and (published.replicas, published.reason) == (4, "forecast")


def test_state_and_decision_on_a_cluster(cluster_url: str) -> None:
    roundtrip(cluster_url)


def test_state_survives_a_sentinel_failover(redis_sentinel: LocalSentinel) -> None:
    roundtrip(redis_sentinel.url)
    redis_sentinel.wait_replica_synced()
    old = redis_sentinel.kill_master()
    redis_sentinel.wait_failover(old)
    # a new process (the next cron run) finds the held decision on the promoted replica
    assert RedisStateStore(redis_sentinel.url, "promptedge:forecaster:state:llm/vllm", timeout_s=2).load() == STATE
