"""The band conditioned on where demand stands against its trailing mean (forecaster/models/band.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from forecaster.backtest.forecasts import forecast_errors, rolling_forecasts
from forecaster.models.band import MIN_SCALE, fit_reversion_band, reversion_feature, volatility
from forecaster.models.select import build_candidates, select
from forecaster.sources import read_trace


def test_the_feature_is_the_last_bucket_against_the_trailing_mean_in_log_space() -> None:
    y = np.array([99.0, 99.0, 9.0])
    assert reversion_feature(y, 3) == pytest.approx(np.log(10.0) - np.mean(np.log([100.0, 100.0, 10.0])))
    assert reversion_feature(y, 1) == 0.0 and reversion_feature(y[:0], 3) == 0.0


def test_after_a_dip_the_band_is_wider_than_after_a_rise() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 0.2, 400)
    residuals = [-0.8 * x + rng.normal(0.0, 0.05, x.size)]  # dips revert: residual up when x < 0
    band = fit_reversion_band(residuals, x, window=6, min_points=10)
    assert band is not None and band.slope[0] == pytest.approx(-0.8, abs=0.05)
    dip, rise = np.r_[np.full(5, 100.0), 60.0], np.r_[np.full(5, 100.0), 160.0]
    assert band.log_offsets(dip, 0.99)[0] > band.log_offsets(rise, 0.99)[0] + 0.3


def test_momentum_is_not_fitted_and_a_constant_feature_gives_no_band() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 0.2, 400)
    band = fit_reversion_band([0.8 * x + rng.normal(0.0, 0.05, x.size)], x, window=6, min_points=10)
    assert band is not None and band.slope[0] == 0.0  # a rise is not extrapolated
    assert fit_reversion_band([x], np.zeros(x.size), window=6, min_points=10) is None
    assert fit_reversion_band([x], x, window=1, min_points=10) is None


@pytest.fixture(scope="module")
def servegen(data_dir: Path) -> np.ndarray:
    """The real 14-day ServeGen m-large total rate, 10-minute windows."""
    return read_trace(data_dir / "traces/servegen-m-large").requests


def test_on_servegen_the_conditioned_band_is_a_better_upper_quantile_than_one_band(servegen: np.ndarray) -> None:
    """Pinball loss at the band's level (a proper score for a quantile forecast) over days 8-14,
    never seen by either band's calibration at its origin."""
    for level in (0.9, 0.99):
        losses = {}
        for window in (0, 6):
            fc = rolling_forecasts(
                servegen, 1008, 2, 1, 144, 600.0, ["last_value"], level, progress=False, band_window=window
            )
            losses[window] = forecast_errors(servegen, fc.head(fc.origins.size - 1), 1, level)["pinball_upper"]
        assert losses[6] < losses[0], level


def test_selection_carries_the_band_and_a_history_moves_it(servegen: np.ndarray) -> None:
    history = servegen[:1008]
    chosen = select(history, 2, 1, build_candidates(["last_value"], 144, 600.0, 0.99), 0.99, band_window=6)
    assert chosen.band is not None and "band conditioned" in chosen.note
    base = chosen.model.predict(2, 0.99)
    dipped = np.r_[history[:-1], history[-1] * 0.6]
    assert chosen.calibrate(base, history=dipped).upper[0] > chosen.calibrate(base, history=history).upper[0]
    static = select(history, 2, 1, build_candidates(["last_value"], 144, 600.0, 0.99), 0.99)
    assert static.band is None  # band_window 0: one band, as before


def test_a_flat_history_with_one_odd_bucket_then_a_dip_keeps_the_band_finite_and_bounded() -> None:
    """Attack round: one extra request in a flat day, then a drop, fitted a slope of about -289
    on a feature that barely varied and applied it far outside that range: upper 4e94."""
    y = np.array([600.0] * 170 + [601.0] + [600.0] * 6 + [360.0, 360.0, 240.0])
    chosen = select(y, 8, 6, build_candidates(["last_value"], 1440, 60.0, 0.99), 0.99, band_window=60)
    fc = chosen.calibrate(chosen.model.predict(8, 0.99), history=y)
    assert np.all(np.isfinite(fc.upper)) and fc.upper.max() <= 2 * y.max()


def test_the_line_is_applied_only_within_the_feature_range_it_was_fitted_on() -> None:
    rng = np.random.default_rng(2)
    x = rng.uniform(-0.1, 0.1, 300)
    band = fit_reversion_band([-2.0 * x + rng.normal(0.0, 0.01, x.size)], x, window=6, min_points=10)
    assert band is not None
    far_dip = np.r_[np.full(5, 1000.0), 1.0]  # x about -5.8, far below the fitted -0.1
    assert band.log_offsets(far_dip, 0.99)[0] <= band.cap[0] + 1e-12
    assert fit_reversion_band([x], np.r_[np.zeros(299), 0.01], window=6, min_points=10) is None  # no spread


def test_a_band_window_that_is_not_finite_or_past_a_week_is_a_settings_error() -> None:
    from pydantic import ValidationError

    from forecaster.settings import ForecasterSettings

    for bad in (float("inf"), float("nan"), -1.0, 8 * 86400.0):  # inf crashed every run (attack round)
        with pytest.raises(ValidationError):
            ForecasterSettings(band_window_s=bad)


def test_scaled_by_volatility_the_band_is_wider_after_a_restless_hour_than_after_a_calm_one() -> None:
    """Residuals whose size follows the trailing hour's volatility (jumps cluster): the scaled
    band widens with it; one band for every volatility would give both hours the same offset."""
    rng = np.random.default_rng(3)
    scales = rng.uniform(0.02, 0.3, 400)
    residuals = [scales * rng.normal(0.0, 1.0, scales.size)]
    features = rng.normal(0.0, 0.2, scales.size)
    band = fit_reversion_band(residuals, features, window=6, min_points=10, scales=scales)
    assert band is not None and band.scale_range is not None
    calm = np.full(6, 100.0)
    restless = np.array([100.0, 130.0, 90.0, 125.0, 85.0, 100.0])  # same last bucket and about the same mean
    assert volatility(restless, 6) > 0.25 and volatility(calm, 6) == MIN_SCALE
    assert band.log_offsets(restless, 0.9)[0] > 3 * band.log_offsets(calm, 0.9)[0] > 0
    unscaled = fit_reversion_band(residuals, features, window=6, min_points=10)
    assert unscaled is not None  # its offsets differ only by the small reversion term here
    assert unscaled.log_offsets(restless, 0.9)[0] == pytest.approx(unscaled.log_offsets(calm, 0.9)[0], abs=0.01)


def test_the_volatility_is_clipped_to_the_range_it_was_calibrated_on() -> None:
    rng = np.random.default_rng(4)
    scales = rng.uniform(0.05, 0.1, 300)
    band = fit_reversion_band([scales * rng.normal(0.0, 1.0, 300)], rng.normal(0.0, 0.2, 300), 6, 10, scales)
    assert band is not None
    wild = np.array([1.0, 1000.0, 1.0, 1000.0, 1.0, 100.0])  # volatility about 6, far above 0.1
    assert band.log_offsets(wild, 0.99)[0] <= band.cap[0] + 1e-12
    assert volatility(np.array([5.0]), 6) == MIN_SCALE and volatility(np.full(6, 5.0), 1) == MIN_SCALE


def test_on_servegen_tuning_days_the_scaled_band_is_a_better_p90_than_the_conditioned_one(servegen: np.ndarray) -> None:
    """Pinball loss of the P90 band (the default level) over ServeGen days 4-7, the tuning days
    (the history the band is calibrated on ends at each origin; days 8-14 are not read)."""
    days = servegen[:1008]
    losses = {}
    for scaled in (False, True):
        fc = rolling_forecasts(
            days, 432, 2, 1, 144, 600.0, ["last_value"], 0.9, progress=False, band_window=6, band_scale=scaled
        )
        losses[scaled] = forecast_errors(days, fc.head(fc.origins.size - 1), 1, 0.9)["pinball_upper"]
    assert losses[True] < 0.95 * losses[False]
