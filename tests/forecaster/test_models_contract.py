"""One contract over every model: the statsforecast shape (fit -> self, predict(h, level),
forward), non-negative forecasts with upper >= mean, and no crash on short, gappy or all-zero
history."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forecaster.models.base import Model
from forecaster.models.baselines import LastValue, SeasonalNaive
from forecaster.models.ets import HoltWinters
from forecaster.models.seasonal import SeasonalLevel
from forecaster.sources import read_trace

SEASON = 24


def make(name: str) -> Model:
    if name == "prophet":
        from forecaster.models.prophet_adapter import ProphetModel

        return ProphetModel(step=3600.0)
    return {
        "last_value": LastValue,
        "seasonal_naive": lambda: SeasonalNaive(SEASON),
        "seasonal_level": lambda: SeasonalLevel(SEASON),
        "ets_level": lambda: HoltWinters(SEASON, trend=False),
        "holt_winters": lambda: HoltWinters(SEASON),
    }[name]()


MODELS = [
    "last_value",
    "seasonal_naive",
    "seasonal_level",
    "ets_level",
    "holt_winters",
    pytest.param("prophet", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def hourly(data_dir: Path) -> np.ndarray:
    """Ten days of the real ServeGen m-large total rate, hourly (two and more seasons of 24)."""
    return read_trace(data_dir / "traces/servegen-m-large", step=3600.0).requests[:240]


@pytest.mark.parametrize("name", MODELS)
def test_fit_predict_shape_and_band(name: str, hourly: np.ndarray) -> None:
    model = make(name)
    assert model.fit(hourly) is model
    fc = model.predict(6, 0.9)
    assert fc.mean.shape == fc.upper.shape == (6,)
    assert np.all(np.isfinite(fc.mean)) and np.all(fc.mean >= 0)
    assert np.all(fc.upper >= fc.mean)
    assert np.all(fc.upper > fc.mean)  # real data is noisy: a zero-width band would be a bug


@pytest.mark.parametrize("name", MODELS)
def test_forward_on_the_fitted_history_equals_predict(name: str, hourly: np.ndarray) -> None:
    model = make(name).fit(hourly)
    fc, again = model.predict(4, 0.9), model.forward(hourly, 4, 0.9)
    np.testing.assert_allclose(again.mean, fc.mean, rtol=1e-6)


@pytest.mark.parametrize("name", MODELS[:5])
def test_forward_follows_new_data(name: str, hourly: np.ndarray) -> None:
    """forward() on a longer history reacts to what came after the fit (a level shift)."""
    model = make(name).fit(hourly[:200])
    shifted = np.concatenate([hourly[:200], np.full(48, 5 * hourly.max())])
    assert model.forward(shifted, 1, 0.9).mean[0] > 2 * model.predict(1, 0.9).mean[0]


@pytest.mark.parametrize("name", MODELS[:5])
@pytest.mark.parametrize(
    "history",
    [np.array([3.0]), np.array([2.0, 4.0, 3.0]), np.zeros(60), np.r_[np.full(30, 5.0), [np.nan] * 5, np.full(30, 6.0)]],
    ids=["one", "three", "all-zero", "gap"],
)
def test_short_zero_and_gappy_history_never_crash(name: str, history: np.ndarray) -> None:
    fc = make(name).fit(history).predict(3, 0.9)
    assert np.all(np.isfinite(fc.mean)) and np.all(fc.mean >= 0) and np.all(fc.upper >= fc.mean)
    if not np.any(history):
        assert np.all(fc.mean == 0)  # nothing came, nothing is forecast


def test_holt_winters_is_seasonal_only_with_two_seasons(hourly: np.ndarray) -> None:
    short = HoltWinters(SEASON).fit(hourly[: 2 * SEASON - 1])
    long = HoltWinters(SEASON).fit(hourly[: 2 * SEASON])
    assert not short._seasonal and long._seasonal


def test_seasonal_level_carries_the_daily_ramp_forward() -> None:
    """Three days with a morning ramp from 10 to 50 at step 60 of 144: at the foot of the ramp
    on day four the forecast already climbs; with less than three days there is no profile."""
    day = np.r_[np.full(60, 10.0), np.full(84, 50.0)]
    rng = np.random.default_rng(0)
    history = np.tile(day, 4)[: 3 * 144 + 55] * rng.uniform(0.95, 1.05, 3 * 144 + 55)
    fc = SeasonalLevel(144).fit(history).predict(10, 0.9)
    assert fc.mean[0] < 15 and fc.mean[-1] > 35  # steps 56..65 of day four: up the ramp
    two_days = SeasonalLevel(144).fit(history[: 2 * 144 + 55])
    assert not two_days.seasonal
    flat = two_days.predict(10, 0.9).mean
    assert np.ptp(flat) < 1e-9  # level only


def test_seasonal_level_fits_a_season_of_1440_minutes() -> None:
    """1-minute counters: a daily season of 1,440 steps (Holt-Winters fits none past 288)."""
    minutes = np.arange(4 * 1440)
    y = 20 + 10 * np.sin(2 * np.pi * minutes / 1440)
    model = SeasonalLevel(1440).fit(y[: 3 * 1440 + 300])
    fc = model.predict(360, 0.9)
    assert model.seasonal
    np.testing.assert_allclose(fc.mean, y[3 * 1440 + 300 : 3 * 1440 + 660], rtol=0.03)
