"""One forecasting-model interface, in the statsforecast shape.

Every model has ``fit(y) -> self``, ``predict(h, level) -> Forecast`` (after fit) and
``forward(y, h, level) -> Forecast``, which applies the fitted parameters to a newer history
without estimating them again (cheap; used by rolling-origin backtests). ``y`` is a 1-D float
array of rates per step, oldest first; it may contain NaN (missing buckets) and zeros.
Forecasts are never negative. Models import numpy and their own engine only; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Forecast:
    """Point forecast and upper quantile for steps 1..h ahead.

    mean, upper: shape (h,), same unit as the input series, upper >= mean >= 0.
    """

    mean: np.ndarray
    upper: np.ndarray


class Model(Protocol):
    """A forecasting model; ``name`` identifies it in reports and JSON."""

    name: str

    def fit(self, y: np.ndarray) -> Model: ...

    def predict(self, h: int, level: float = 0.9) -> Forecast: ...

    def forward(self, y: np.ndarray, h: int, level: float = 0.9) -> Forecast: ...


def clean(y: np.ndarray) -> np.ndarray:
    """History ready for fitting: leading missing buckets dropped, interior gaps linearly
    interpolated (fitting engines cannot take NaN; the planner still sees the original NaN),
    trailing gaps dropped. Returns an empty array when nothing is observed."""
    y = np.asarray(y, dtype=float)
    seen = np.flatnonzero(~np.isnan(y))
    if seen.size == 0:
        return y[:0]
    y = y[seen[0] : seen[-1] + 1]
    gaps = np.isnan(y)
    if gaps.any():
        x = np.arange(y.size)
        y = y.copy()
        y[gaps] = np.interp(x[gaps], x[~gaps], y[~gaps])
    return y


def z_of(level: float) -> float:
    """Standard normal quantile at ``level``; raises ValueError outside (0.5, 1)."""
    if not 0.5 < level < 1.0:
        raise ValueError(f"level must be in (0.5, 1), got {level}")
    return NormalDist().inv_cdf(level)


def log_band(mean: np.ndarray, sigma_log: float, level: float) -> Forecast:
    """Forecast whose upper quantile is ``mean`` scaled in log1p space by sigma * sqrt(k) at
    step k (random-walk growth of uncertainty). mean is clipped at 0."""
    mean = np.maximum(np.asarray(mean, dtype=float), 0.0)
    k = np.arange(1, mean.size + 1)
    upper = np.expm1(np.log1p(mean) + z_of(level) * sigma_log * np.sqrt(k))
    return Forecast(mean, np.maximum(upper, mean))
