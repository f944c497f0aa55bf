"""Rolling-origin forecasts over a test period, and their error at one horizon.

At every origin o of the test period the forecaster sees y[:o] only. The model is chosen again
(``select``) every ``refit_every`` origins, exactly as ``run --once`` would, and applied with
``forward`` in between, so the backtest measures what production would have forecast.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from forecaster.models.band import bound_upper
from forecaster.models.base import clean
from forecaster.models.select import Selection, build_candidates, select
from forecaster.series import mask_outages


@dataclass(frozen=True)
class RollingForecasts:
    """origins: bucket indices (forecast made knowing y[:o]), shape (n,); mean, upper: shape
    (n, horizon), column k-1 = k steps ahead (k = 1 is bucket o), upper at the planning
    level; p90: the same band calibrated at 0.9 (the model's own P90 band where too few
    backtest residuals exist), to check the band's coverage; models: chosen model name per origin."""

    origins: np.ndarray
    mean: np.ndarray
    upper: np.ndarray
    models: list[str]
    p90: np.ndarray | None = None

    def head(self, n: int) -> RollingForecasts:
        """The first ``n`` origins."""
        p90 = None if self.p90 is None else self.p90[:n]
        return RollingForecasts(self.origins[:n], self.mean[:n], self.upper[:n], self.models[:n], p90)


def rolling_forecasts(
    y: np.ndarray,
    first_origin: int,
    horizon: int,
    lead: int,
    season: int,
    step: float,
    model_names: list[str],
    level: float = 0.9,
    budget_s: float = 5.0,
    refit_every: int = 144,
    max_origins: int = 144,
    progress: bool = True,
    band_window: int = 0,
    band_scale: bool = False,
) -> RollingForecasts:
    """Forecasts at every origin in [first_origin, len(y)]; y: rates per step with NaN gaps;
    band_window: buckets of the trailing mean that conditions the band (``select``; 0: static);
    band_scale: the band is also scaled by the volatility of that span (``select``)."""
    # outages of the demand signal are missing data to the models, as in ``run_once``
    y = mask_outages(y, step)
    origins = np.arange(first_origin, y.size + 1)
    mean = np.full((origins.size, horizon), np.nan)
    upper = np.full((origins.size, horizon), np.nan)
    p90 = np.full((origins.size, horizon), np.nan)
    models: list[str] = []
    chosen: Selection | None = None
    iterator: Iterable[tuple[int, int]] = enumerate(origins)
    if progress:
        iterator = tqdm(iterator, total=origins.size, desc="forecasting", unit="origin")
    for i, o in iterator:
        history = y[:o]
        if np.isnan(history).all():
            models.append("none")
            continue
        if chosen is None or i % refit_every == 0:
            candidates = build_candidates(model_names, season, step, level)
            chosen = select(
                history,
                horizon,
                lead,
                candidates,
                level,
                budget_s,
                max_origins,
                span=season,
                band_window=band_window,
                band_scale=band_scale,
            )
            fc = chosen.model.predict(horizon, level)
        else:
            fc = chosen.model.forward(history, horizon, level)
        seen = clean(history)
        if chosen.log_q is not None:
            p90[i] = chosen.calibrate(fc, 0.9, seen).upper
        else:  # too little history to calibrate: the model's own P90 band (forward = predict on the fit)
            p90[i] = chosen.model.forward(history, horizon, 0.9).upper
        fc = chosen.calibrate(fc, history=seen)
        mean[i], upper[i] = fc.mean, bound_upper(fc.mean, fc.upper, seen, step)
        models.append(chosen.model.name)
    return RollingForecasts(origins, mean, upper, models, p90)


def forecast_errors(
    y: np.ndarray, fc: RollingForecasts, k: int, level: float = 0.9, season: int | None = None
) -> dict[str, float]:
    """Errors of the k-steps-ahead forecast against the last-value forecast at the same horizon.

    mae, mae_last_value, mae_seasonal_naive (the value one ``season`` before the target; None
    without a season); smape (0-2, 0 when forecast and actual are both 0); mase = mae /
    mae_last_value; upper_coverage = share of actuals <= upper (target: ``level``);
    pinball_upper = quantile loss of the upper forecast at ``level``; p90_coverage and
    pinball_p90 the same for the P90 band (None without one). Targets that are missing (NaN)
    or beyond the series are skipped.
    """
    targets = fc.origins + k - 1
    inside = targets < y.size
    actual = np.full(targets.size, np.nan)
    actual[inside] = y[targets[inside]]
    last = np.array([_last_seen(y, o) for o in fc.origins])
    f, u = fc.mean[:, k - 1], fc.upper[:, k - 1]
    b = fc.p90[:, k - 1] if fc.p90 is not None else np.full(f.size, np.nan)
    sn = np.full(targets.size, np.nan)
    if season:
        back = targets - season
        has = inside & (back >= 0)
        sn[has] = y[back[has]]
    ok = ~np.isnan(actual) & ~np.isnan(f) & ~np.isnan(last)
    a, f, u, b, last, sn = actual[ok], f[ok], u[ok], b[ok], last[ok], sn[ok]
    if a.size == 0:  # test period shorter than the horizon: nothing to score
        keys = (
            "mae",
            "mae_last_value",
            "mae_seasonal_naive",
            "smape",
            "mase",
            "p90_coverage",
            "pinball_p90",
            "upper_coverage",
            "pinball_upper",
        )
        return {"horizon_steps": k, "n": 0, "level": level, **{key: None for key in keys}}  # type: ignore[dict-item]
    mae = float(np.mean(np.abs(a - f)))
    mae_lv = float(np.mean(np.abs(a - last)))
    denom = np.abs(a) + np.abs(f)
    smape = float(np.mean(np.where(denom > 0, 2 * np.abs(a - f) / np.maximum(denom, 1e-12), 0.0)))
    has_p90 = ~np.isnan(b)
    has_sn = ~np.isnan(sn)
    return {
        "horizon_steps": k,
        "n": int(ok.sum()),
        "mae": mae,
        "mae_last_value": mae_lv,
        "mae_seasonal_naive": float(np.mean(np.abs(a[has_sn] - sn[has_sn]))) if has_sn.any() else None,
        "smape": smape,
        "mase": mae / mae_lv if mae_lv > 0 else float("nan"),
        "level": level,
        "upper_coverage": float(np.mean(a <= u)),
        "pinball_upper": _pinball(a, u, level),
        "p90_coverage": float(np.mean(a[has_p90] <= b[has_p90])) if has_p90.any() else None,
        "pinball_p90": _pinball(a[has_p90], b[has_p90], 0.9) if has_p90.any() else None,
    }


def _pinball(actual: np.ndarray, upper: np.ndarray, level: float) -> float:
    """Mean quantile loss of ``upper`` as the ``level`` quantile of ``actual``."""
    diff = actual - upper
    return float(np.mean(np.maximum(level * diff, (level - 1) * diff)))


def _last_seen(y: np.ndarray, o: int) -> float:
    """The last observed value before bucket o (what last value would forecast)."""
    seen = np.flatnonzero(~np.isnan(y[:o]))
    return float(y[seen[-1]]) if seen.size else float("nan")
