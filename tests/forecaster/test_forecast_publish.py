"""The forecast each live cycle publishes for the router's cache warming (forecaster side of the
contract; the router side reads the same document in tests/router/test_warming.py)."""

from __future__ import annotations

import json

import pytest
import redis

from forecaster import live
from forecaster.actuate import ActuatorSettings
from forecaster.actuate.actuators import DryRunActuator
from forecaster.settings import ForecasterSettings
from forecaster.sources import RedisCounterSource
from forecaster.state import FORECAST_KEY
from tests.forecaster.test_run_once import write_counters

BASE = 28_000_000  # a Unix minute


@pytest.fixture(autouse=True)
def test_redis(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # ForecasterSettings reads its Redis URL from the environment only (validation alias)
    monkeypatch.setenv("PROMPTEDGE_REDIS_URL", redis_url)


def run_cycle(redis_url: str, **kw: object) -> live.Cycle:
    settings = ForecasterSettings(capacity_per_replica=1.0, headroom=0.0, rate_window_s=60.0, model_name="m", **kw)  # type: ignore[arg-type]
    source = RedisCounterSource(redis_url, "m", history_s=3600)
    actuator_settings = ActuatorSettings()
    return live.cycle(settings, actuator_settings, source, DryRunActuator(actuator_settings), now=(BASE + 30) * 60)


def test_a_cycle_publishes_its_forecast_with_a_ttl_of_a_few_cycles(redis_url: str) -> None:
    write_counters(redis_url, "m", {BASE + i: 120 for i in range(30)})
    outcome = run_cycle(redis_url)
    assert outcome.result.steps
    client = redis.Redis.from_url(redis_url)
    key = FORECAST_KEY.format(pool="m")
    document = json.loads(client.get(key))
    assert document["v"] == 1 and document["pool"] == "m" and document["unit"] == "requests"
    assert document["at"] == (BASE + 30) * 60
    assert document["capacity_rps"] == 1.0 * outcome.result.decision.replicas
    starts = [t for t, _ in document["points"]]
    assert starts == [s.start for s in outcome.result.steps] and starts == sorted(starts)
    assert all(rps == 2.0 for _, rps in document["points"])  # 120 requests a minute
    assert len(document["upper"]) == len(document["points"])
    assert 0 < client.ttl(key) <= 3 * 60  # three daemon intervals (60 s, real time)
    client.close()


def test_a_held_cycle_without_a_plan_publishes_nothing(redis_url: str) -> None:
    run_cycle(redis_url)  # no counters at all: the source returns nothing, the decision holds
    client = redis.Redis.from_url(redis_url)
    assert client.get(FORECAST_KEY.format(pool="m")) is None
    client.close()
