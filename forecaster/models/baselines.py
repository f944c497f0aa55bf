"""Baselines: last value and seasonal naive.

Both take their upper quantile from the history's own empirical errors: for last value the
k-step changes y[t+k] - y[t], for seasonal naive the seasonal differences y[t] - y[t-S], both in
log1p space so the band scales with the level.
"""

from __future__ import annotations

import numpy as np

from forecaster.models.base import Forecast, clean

# Past this many buckets the error distribution is estimated on the most recent ones only.
_ERROR_WINDOW = 4032


def _upper(mean: np.ndarray, log_errors: list[np.ndarray], level: float) -> Forecast:
    """mean scaled in log1p space by the ``level`` quantile of each step's errors; a step
    without errors (history shorter than the step) keeps the widest band seen so far, so the
    band never narrows with the horizon."""
    mean = np.maximum(mean, 0.0)
    q = np.maximum.accumulate(np.array([max(np.quantile(e, level), 0.0) if e.size else 0.0 for e in log_errors]))
    upper = np.expm1(np.log1p(mean) + np.maximum(q, 0.0))
    return Forecast(mean, np.maximum(upper, mean))


class LastValue:
    """Repeats the last observed value; 0 when nothing was observed."""

    name = "last_value"

    def __init__(self) -> None:
        self._y = np.zeros(0)

    def fit(self, y: np.ndarray) -> LastValue:
        self._y = clean(y)[-_ERROR_WINDOW:]
        return self

    def predict(self, h: int, level: float = 0.9) -> Forecast:
        last = self._y[-1] if self._y.size else 0.0
        logs = np.log1p(self._y)
        errors = [logs[k:] - logs[:-k] for k in range(1, h + 1)]
        return _upper(np.full(h, last), errors, level)

    def forward(self, y: np.ndarray, h: int, level: float = 0.9) -> Forecast:
        return LastValue().fit(y).predict(h, level)


class SeasonalNaive:
    """Repeats the value one season (``season`` steps) earlier; last value while the history is
    shorter than a season."""

    name = "seasonal_naive"

    def __init__(self, season: int) -> None:
        self.season = season
        self._y = np.zeros(0)

    def fit(self, y: np.ndarray) -> SeasonalNaive:
        self._y = clean(y)[-max(_ERROR_WINDOW, 2 * self.season) :]
        return self

    def predict(self, h: int, level: float = 0.9) -> Forecast:
        s, y = self.season, self._y
        if y.size < s:
            return LastValue().fit(y).predict(h, level)
        idx = y.size - s + (np.arange(h) % s)
        logs = np.log1p(y)
        error = logs[s:] - logs[:-s]
        return _upper(y[idx], [error] * h, level)

    def forward(self, y: np.ndarray, h: int, level: float = 0.9) -> Forecast:
        return SeasonalNaive(self.season).fit(y).predict(h, level)
