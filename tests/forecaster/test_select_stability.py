"""Model selection on 1-minute counters must not flip with the minute (found in the closed loop).

With origins spaced ten minutes apart over the last day and the error scored at the lead step
alone, a daily step change was seen only by the origins that happened to fall just before it:
from one minute to the next the choice flipped between last value and a seasonal model, and
two minutes before a forecastable peak the forecaster planned on last value and scaled down.
"""

from __future__ import annotations

import numpy as np

from forecaster.models.select import build_candidates, select

SEASON = 1440  # 1-minute buckets, daily season
LOW, HIGH = 0.075, 0.375  # misses/s outside and inside the daily peak (12:00-13:00)
LEAD, HORIZON = 6, 30
MODELS = ["last_value", "seasonal_naive", "seasonal_level"]


def _series(days: int = 7) -> tuple[np.ndarray, int]:
    """Smooth history (expected counts, as the loop preloads) and Poisson minutes for the last
    quarter hour before each origin; returns (rate per minute, index of the peak's first minute)."""
    t = np.arange(days * SEASON + 12 * 60 + 30)
    minute = t % SEASON
    rate = np.where((minute >= 720) & (minute < 780), HIGH, LOW)
    return rate, days * SEASON + 720


def test_the_choice_and_the_peak_forecast_hold_minute_after_minute() -> None:
    rate, step = _series()
    rng = np.random.default_rng(0)
    chosen, covered = [], []
    for end in range(step - 12, step):
        y = np.round(rate[:end] * 60) / 60
        y[-15:] = rng.poisson(rate[end - 15 : end] * 60) / 60  # live, noisy minutes
        sel = select(y, HORIZON, LEAD, build_candidates(MODELS, SEASON, 60.0, 0.99), 0.99, 5.0, span=SEASON)
        fc = sel.calibrate(sel.model.predict(HORIZON, 0.99))
        chosen.append(sel.model.name)
        if step - end < LEAD:  # the lead step lies inside the peak: the plan must see it
            covered.append(float(fc.upper[LEAD - 1]) >= HIGH * 0.9)
    assert len(set(chosen)) == 1 and chosen[0] != "last_value", chosen
    assert all(covered), covered
