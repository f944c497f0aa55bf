"""Issue 5's regression list, on real traces: short history, an hour-long gap, an empty source
(hold, not min), a daylight-saving change in local-time input, all-zero windows, and a forecast
below the current need (reactive floor). The 409 one lives with the actuator's tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import redis
from prometheus_client import REGISTRY

from forecaster import (
    ForecasterSettings,
    PlannerState,
    RedisCounterSource,
    RedisStateStore,
    TraceSource,
    Traffic,
    run_once,
)
from forecaster.errors import SourceUnavailable
from forecaster.models.ets import HoltWinters
from forecaster.plan import Decision, Recommendation, advance, decide, plan_steps, replicas_for

TRACES = "traces"


class Fixed:
    """A source that answers with a given Traffic (or raises)."""

    name = "fixed"

    def __init__(self, traffic: Traffic | None = None, error: Exception | None = None) -> None:
        self._traffic, self._error = traffic, error

    def fetch(self, now: float | None = None) -> Traffic:
        if self._error is not None:
            raise self._error
        assert self._traffic is not None
        return self._traffic


def settings(**kw: object) -> ForecasterSettings:
    base = {"redis_url": "redis://127.0.0.1:1/0", "capacity_per_replica": 50.0, "step_s": 600.0, "headroom": 0.0}
    return ForecasterSettings(**{**base, **kw})


@pytest.fixture(scope="module")
def servegen(data_dir: Path) -> Traffic:
    return TraceSource(data_dir / TRACES / "servegen-m-large").fetch()


def test_less_than_two_seasons_of_history(servegen: Traffic) -> None:
    """A day and a half of 10-minute windows: no seasonal fit possible, no crash, a plan."""
    result = run_once(settings(), Fixed(servegen.window(0, 216)))
    assert len(result.steps) == 3 and result.decision.action == "set"
    assert result.model in {"last_value", "ets_level", "holt_winters", "seasonal_naive"}


def test_an_hour_gap_stays_missing_to_the_planner(servegen: Traffic) -> None:
    y = servegen.requests[:600].copy()
    y[400:406] = np.nan  # an hour of 10-minute windows lost
    traffic = Traffic(servegen.start, servegen.step, y, name="gappy")
    result = run_once(settings(), Fixed(traffic))
    assert result.series["missing_buckets"] == 6 and result.decision.action == "set"
    tail_gap = y.copy()
    tail_gap[-6:] = np.nan  # the last hour missing: hold, never act on a guess
    state = PlannerState(replicas=9, at=0.0)
    held = run_once(settings(), Fixed(Traffic(servegen.start, servegen.step, tail_gap)), store=_Memory(state))
    assert (held.decision.action, held.decision.replicas) == ("hold", 9)


class _Memory:
    """In-memory state store with RedisStateStore's interface (for pure run_once tests)."""

    def __init__(self, state: PlannerState | None) -> None:
        self.state = state

    def load(self) -> PlannerState | None:
        return self.state

    def save(self, state: PlannerState) -> None:
        self.state = state


def test_empty_source_holds_the_persisted_decision_not_min(redis_url: str) -> None:
    store = RedisStateStore(redis_url, "promptedge:forecaster:state:test")
    store.save(advance(None, Decision(7, "earlier run", "set", 1_700_000_000.0)))
    source = RedisCounterSource(redis_url, "no-such-model", history_s=3600)
    result = run_once(settings(step_s=60.0), source, now=1_700_003_600.0, store=store)
    assert (result.decision.action, result.decision.replicas) == ("hold", 7)
    assert "returned no data" in result.decision.reason
    assert store.load().replicas == 7  # a hold writes nothing


def test_unreachable_source_holds_and_counts_it() -> None:
    holds = ("promptedge_forecaster_holds_total", {"cause": "source"})
    before = REGISTRY.get_sample_value(*holds) or 0.0
    state = PlannerState(replicas=4, at=0.0)
    result = run_once(settings(), Fixed(error=SourceUnavailable("timeout")), now=1.0, store=_Memory(state))
    assert (result.decision.action, result.decision.replicas) == ("hold", 4)
    assert REGISTRY.get_sample_value(*holds) == before + 1


def test_daylight_saving_change_in_local_time_input(data_dir: Path) -> None:
    """NYC taxi in New York time, cut just after the 2014-11-02 fall-back: the repeated hour is
    missing in UTC, the run still plans on the grid."""
    source = TraceSource(data_dir / TRACES / "nab/nyc_taxi.csv", tz="America/New_York")
    result = run_once(settings(capacity_per_replica=2000.0, step_s=1800.0), source, now=1414918800.0)
    assert result.series["missing_buckets"] == 2 and result.decision.action == "set"
    assert result.steps[0].start == 1414918800.0  # buckets stay on the half-hour in UTC


def test_all_zero_windows_inside_real_data(data_dir: Path) -> None:
    """The Azure code trace has real silent minutes: they are zeros (not gaps), the plan is
    finite and the quiet minute is a decision, not a hold."""
    source = TraceSource(data_dir / TRACES / "azure-llm-2023/AzureLLMInferenceTrace_code.csv")
    traffic = source.fetch()
    zero = int(np.flatnonzero(traffic.requests == 0)[-1])
    result = run_once(settings(capacity_per_replica=1.0, step_s=60.0), source, now=traffic.start + (zero + 1) * 60)
    assert result.series["missing_buckets"] == 0
    assert all(np.isfinite(s.upper) for s in result.steps)
    assert result.decision.action != "hold"


def test_forecast_below_current_need_keeps_the_reactive_floor(servegen: Traffic) -> None:
    """Real history, then a window far above it: the smoothing model forecasts well below the
    current demand, and the decision still covers the current demand."""
    y = servegen.requests[:400].copy()
    y[-1] = 10 * np.nanmax(y[:-1])
    fc = HoltWinters(144, trend=False).fit(y).predict(3, 0.9)
    config = settings(max_replicas=1000).planner()
    steps = plan_steps(fc.mean, fc.upper, servegen.start + 400 * 600, 600.0, config)
    need = replicas_for(float(y[-1]), config)
    assert max(s.replicas for s in steps) < need  # the precondition: the forecast is lower
    decision = decide(steps, float(y[-1]), steps[0].start, 600.0, config, PlannerState(3, 0.0))
    assert decision.replicas == min(need, 3 + config.max_step) and decision.action == "up"


def test_the_scale_down_window_survives_a_restart(redis_url: str) -> None:
    # The stabilisation keeps the recommendations of the last window in the persisted state: a
    # daemon restarted right after a busy minute must not scale down on the next quiet one.
    store = RedisStateStore(redis_url, "promptedge:forecaster:state:test")
    busy = Recommendation(1_700_000_000.0, 3, 2, 1_700_000_360.0)  # the band asked for the third
    quiet = Recommendation(1_700_000_060.0, 1, 1)
    state = advance(None, Decision(3, "busy", "set", busy.at, None, busy), window_s=300.0)
    state = advance(state, Decision(3, "quiet", "keep", quiet.at, 3, quiet), window_s=300.0)
    store.save(state)
    loaded = RedisStateStore(redis_url, "promptedge:forecaster:state:test").load()
    assert loaded is not None and loaded.recent == (busy, quiet)


def test_a_state_saved_before_the_band_was_told_apart_still_loads(redis_url: str) -> None:
    # Saved by the previous release: recommendations as [at, replicas]; each stands whole.
    redis.Redis.from_url(redis_url).set(
        "promptedge:forecaster:state:old",
        json.dumps(
            {
                "replicas": 3,
                "at": 1_700_000_060.0,
                "last_up_at": None,
                "last_down_at": None,
                "recent": [[1_700_000_000.0, 3], [1_700_000_060.0, 1]],
            }
        ),
    )
    loaded = RedisStateStore(redis_url, "promptedge:forecaster:state:old").load()
    assert loaded is not None
    assert loaded.recent == (Recommendation(1_700_000_000.0, 3, 3), Recommendation(1_700_000_060.0, 1, 1))


def test_a_redis_url_with_a_bad_option_is_a_settings_error_not_a_traceback() -> None:
    # Regression: ``?socket_timeout=abc`` passed the settings check; redis-py refused it when the
    # state store built its client, and `forecaster run --once` printed a traceback.
    import os
    import subprocess
    import sys

    env = {**os.environ, "PROMPTEDGE_REDIS_URL": "redis://:hunter2@127.0.0.1:6379/15?socket_timeout=abc"}
    for command in (["run", "--once"], ["daemon"]):
        done = subprocess.run(
            [sys.executable, "-m", "forecaster", *command], env=env, capture_output=True, text=True, timeout=120
        )
        output = done.stdout + done.stderr
        assert done.returncode == 2, output
        assert "socket_timeout" in output and "Traceback" not in output and "hunter2" not in output
