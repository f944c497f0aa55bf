"""RATE_WINDOW_S: demand as the mean rate over a trailing window, without hiding a missing bucket."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from forecaster.run import run_once
from forecaster.series import Traffic, trailing_mean
from forecaster.settings import ForecasterSettings


def test_trailing_mean_skips_missing_buckets_and_keeps_all_missing_as_missing() -> None:
    y = np.array([1.0, 2.0, 3.0, np.nan, 5.0, np.nan, np.nan, np.nan])
    out = trailing_mean(y, 3)
    assert out[:7].tolist() == [1.0, 1.5, 2.0, 2.5, 4.0, 5.0, 5.0] and np.isnan(out[7])
    assert trailing_mean(y, 1) is y


class _Source:
    name = "fixed"

    def __init__(self, y: np.ndarray) -> None:
        self.y = y

    def fetch(self, now: float | None = None) -> Traffic:
        return Traffic(0.0, 60.0, self.y)


def _settings(window_s: float) -> ForecasterSettings:
    return ForecasterSettings(
        capacity_per_replica=1.0,
        headroom=0.0,
        rate_window_s=window_s,
        warmup_s=0.0,
        actuation_delay_s=0.0,
        models=["last_value"],
        metrics_port=0,
        max_replicas=20,
    )


def test_one_busy_minute_moves_the_reactive_floor_only_by_its_share_of_the_window() -> None:
    y = np.r_[np.full(600, 2.0), [10.0]]  # ten quiet hours at 2 req/s, then one minute at 10
    counted = run_once(_settings(60.0), _Source(y), now=601 * 60.0)
    windowed = run_once(_settings(300.0), _Source(y), now=601 * 60.0)
    assert "current demand 10 needs 10" in counted.decision.reason
    assert "current demand 3.6 needs 4" in windowed.decision.reason  # (4 x 2 + 10) / 5


def test_a_missing_last_bucket_still_holds_with_a_window() -> None:
    y = np.r_[np.full(600, 2.0), [np.nan]]
    result = run_once(_settings(300.0), _Source(y), now=601 * 60.0)
    assert result.decision.action == "hold"


def test_by_default_demand_is_a_five_minute_rate_so_one_busy_minute_is_not_a_scale_up() -> None:
    # The router's counters are per-minute counts: at 40 requests a minute a renewal process's
    # minute swings by a third, and the daemon followed single-minute bursts in the closed loop
    # (3 December: 4.73 GPU-hours against 3.37 with a 5-minute rate, same segment).
    defaults = ForecasterSettings(
        capacity_per_replica=1.0,
        headroom=0.0,
        warmup_s=0.0,
        actuation_delay_s=0.0,
        models=["last_value"],
        metrics_port=0,
        max_replicas=20,
    )
    y = np.r_[np.full(600, 2.0), [10.0]]
    assert "current demand 3.6 needs 4" in run_once(defaults, _Source(y), now=601 * 60.0).decision.reason


def test_a_windowed_rate_is_forecast_at_its_centre_so_a_daily_step_is_not_forecast_late() -> None:
    # A trailing mean of five minutes is the rate of two minutes ago: forecast as it stands, a
    # seasonal model placed yesterday's step two minutes late, and the closed loop's step test
    # had its replicas Ready a minute after the step (3 December).
    day = np.r_[np.full(600, 1.0), np.full(840, 4.0)]  # every day: 1 req/s, then 4 from minute 600
    y = np.tile(day, 3)[: 2 * 1440 + 590]  # now: day 3, ten minutes before the step
    settings = ForecasterSettings(
        capacity_per_replica=1.0,
        headroom=0.0,
        rate_window_s=300.0,
        warmup_s=0.0,
        actuation_delay_s=0.0,
        models=["seasonal_naive"],
        metrics_port=0,
        max_replicas=20,
        band_window_s=0.0,
    )
    result = run_once(settings, _Source(y), now=y.size * 60.0)
    at = {round((s.start - y.size * 60.0) / 60): s.forecast for s in result.steps}
    assert at[0] == 1.0 and at[7] == 1.0  # minutes 590 and 597: still before the step
    assert at[10] > 2.5  # the step's minute: smoothed around it (old: 1.6, the trailing mean)
    assert at[12] == 4.0  # two minutes in: all of the window after the step (old: 2.8)


def test_replicas_for_a_daily_step_are_ordered_a_lead_time_before_it_despite_the_smoothing() -> None:
    # Stop 23's CI failure: even centred, a 5-minute mean turns yesterday's step into a ramp that
    # reaches the step's level two minutes in, so the decision covering the step's first minutes
    # read 3/5 of it; the full count came one decision later, Ready after the step. A smoothed
    # bucket carries demand up to ``lag`` buckets after it: the plan now reads that far.
    day = np.r_[np.full(600, 1.0), np.full(840, 4.0)]  # every day: 1 req/s, then 4 from minute 600
    y = np.tile(day, 3)
    settings = ForecasterSettings(
        capacity_per_replica=1.0,
        headroom=0.0,
        upper_headroom=0.0,
        rate_window_s=300.0,
        warmup_s=120.0,
        actuation_delay_s=0.0,
        models=["seasonal_naive"],
        metrics_port=0,
        max_replicas=20,
        band_window_s=0.0,
    )
    step = 2 * 1440 + 600
    first = None
    for minute in range(step - 10, step + 1):  # one decision a minute, 30 s into it
        now = minute * 60.0 + 30.0
        result = run_once(settings, _Source(y[:minute]), now=now, current=1)
        if result.decision.replicas >= 4:
            first = now
            break
    assert first is not None
    assert first + 120.0 <= step * 60.0, first / 60 - step  # Ready (decision + warm-up) by the step


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), "1e400", "3601", -1.0])
def test_a_rate_window_that_is_not_finite_or_past_an_hour_is_a_settings_error(
    bad: float | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: inf raised OverflowError out of every run (round(inf / step)); a 14-day window
    # made each run take 75 s. Longer than an hour it flattens the daily peak it should forecast.
    if isinstance(bad, str):  # as the environment gives it
        monkeypatch.setenv("PROMPTEDGE_FORECASTER_RATE_WINDOW_S", bad)
        settings: dict[str, float] = {}
    else:
        settings = {"rate_window_s": bad}
    with pytest.raises(ValidationError) as error:
        ForecasterSettings(**settings)
    assert "rate_window_s" in str(error.value)


def test_a_rate_window_of_an_hour_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROMPTEDGE_FORECASTER_RATE_WINDOW_S", "3600")
    assert ForecasterSettings().rate_window_s == 3600.0
