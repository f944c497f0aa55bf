"""The forecast band, calibrated on backtest residuals at any level, and the errors the backtest
reports against both baselines (last value, seasonal naive)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forecaster.backtest.forecasts import RollingForecasts, forecast_errors, rolling_forecasts
from forecaster.models.select import build_candidates, select
from forecaster.settings import ForecasterSettings
from forecaster.sources import read_trace


@pytest.fixture(scope="module")
def servegen(data_dir: Path) -> np.ndarray:
    """The real 14-day ServeGen m-large total rate, 10-minute windows."""
    return read_trace(data_dir / "traces/servegen-m-large").requests


def test_band_at_a_higher_level_is_wider_and_covers_more(servegen: np.ndarray) -> None:
    history = servegen[:1008]
    chosen = select(history, 4, 1, build_candidates(["last_value"], 144, 600.0, 0.9), 0.9)
    base = chosen.model.predict(4, 0.9)
    p90, p98 = chosen.calibrate(base, 0.9), chosen.calibrate(base, 0.98)
    np.testing.assert_allclose(p90.upper, chosen.calibrate(base).upper)  # the selection's own level
    assert np.all(p98.upper > p90.upper) and np.all(p98.mean == p90.mean)
    fc = rolling_forecasts(servegen, 1008, 4, 1, 144, 600.0, ["last_value"], 0.98, progress=False)
    errors = forecast_errors(servegen, fc.head(fc.origins.size - 1), 1, 0.98, 144)
    assert errors["upper_coverage"] > errors["p90_coverage"]  # the P98 band holds more actuals than the P90
    assert errors["level"] == 0.98


def test_errors_name_the_seasonal_naive_baseline() -> None:
    """A purely daily series: seasonal naive is exact, last value is not."""
    season = 24
    y = np.tile(np.r_[np.full(12, 5.0), np.full(12, 20.0)], 6)
    origins = np.arange(4 * season, y.size)
    flat = y[origins - 1][:, None]
    fc = RollingForecasts(origins, flat, flat.copy(), ["last_value"] * origins.size)
    errors = forecast_errors(y, fc, 1, 0.9, season)
    assert errors["mae_seasonal_naive"] == 0.0 and errors["mae_last_value"] > 0.0
    assert forecast_errors(y, fc, 1, 0.9)["mae_seasonal_naive"] is None  # no season, no baseline


def test_lead_time_adds_the_actuation_delay_to_the_warmup() -> None:
    settings = ForecasterSettings(warmup_s=300.0, actuation_delay_s=20.0)
    assert settings.planner().lead_time_s == 320.0
    assert settings.planner(lead_time_s=100.0).lead_time_s == 120.0  # measured from pods, + the delay
