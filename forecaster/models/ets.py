"""statsmodels Holt-Winters (ExponentialSmoothing) on log1p of the rate.

Additive damped trend; an additive season of ``season`` steps only when at least two seasons of
history exist (and the season is short enough to fit in time), non-seasonal otherwise, so a
short history never crashes it. The log transform keeps forecasts positive and makes the
seasonal swing proportional to the level. Upper quantile: the fitted one-step residuals' spread
in log space, widened by sqrt(k) for step k.
"""

from __future__ import annotations

import warnings

import numpy as np
from statsmodels.tools.sm_exceptions import ConvergenceWarning
from statsmodels.tsa.holtwinters import ExponentialSmoothing

from forecaster.models.base import Forecast, clean, log_band
from forecaster.models.baselines import LastValue

# Fitting a 1,440-step season takes about a minute; longer seasons are fitted without one.
MAX_SEASON = 288
# The parameters are estimated on at most this many recent buckets (older history adds time,
# not accuracy, for a model whose state forgets exponentially).
FIT_WINDOW = 2016
MIN_HISTORY = 10


class HoltWinters:
    """ETS(A, Ad, A|N) on log1p(y) via statsmodels; see the module docstring."""

    def __init__(self, season: int) -> None:
        self.season = season
        self.name = "holt_winters"
        self._params: dict[str, float] = {}
        self._seasonal = False
        self._fitted: object | None = None
        self._sigma = 0.0
        self._fallback: LastValue | None = None

    def _model(self, logs: np.ndarray, seasonal: bool) -> ExponentialSmoothing:
        return ExponentialSmoothing(
            logs,
            trend="add",
            damped_trend=True,
            seasonal="add" if seasonal else None,
            seasonal_periods=self.season if seasonal else None,
            initialization_method="estimated" if not seasonal else "heuristic",
        )

    def fit(self, y: np.ndarray) -> HoltWinters:
        y = clean(y)
        if y.size < MIN_HISTORY:
            self._fallback = LastValue().fit(y)
            return self
        self._fallback = None
        window = max(FIT_WINDOW, 3 * self.season) if self.season <= MAX_SEASON else FIT_WINDOW
        logs = np.log1p(y[-window:])
        self._seasonal = 1 < self.season <= MAX_SEASON and logs.size >= 2 * self.season
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            result = self._model(logs, self._seasonal).fit()
        self._fitted = result
        self._params = {
            key: float(result.params[key])
            for key in ("smoothing_level", "smoothing_trend", "smoothing_seasonal", "damping_trend")
            if result.params.get(key) is not None and np.isfinite(result.params[key])
        }
        resid = np.asarray(result.resid)[self.season if self._seasonal else 1 :]
        self._sigma = float(np.std(resid)) if resid.size > 1 else 0.0
        return self

    def predict(self, h: int, level: float = 0.9) -> Forecast:
        if self._fallback is not None:
            return self._fallback.predict(h, level)
        mean = np.expm1(np.asarray(self._fitted.forecast(h)))  # type: ignore[attr-defined]
        return log_band(mean, self._sigma, level)

    def forward(self, y: np.ndarray, h: int, level: float = 0.9) -> Forecast:
        """Fitted smoothing parameters applied to the most recent part of ``y``: the state is
        re-run over at least four seasons (or 200 buckets), starting from the first season's
        mean level and shape (or the first 12 buckets' mean) with a flat trend."""
        if self._fallback is not None or not self._params:
            return HoltWinters(self.season).fit(y).predict(h, level)
        y = clean(y)
        window = max(4 * self.season, 200) if self._seasonal else 200
        logs = np.log1p(y[-window:])
        if logs.size < (2 * self.season if self._seasonal else MIN_HISTORY):
            return LastValue().fit(y).predict(h, level)
        head = logs[: self.season] if self._seasonal else logs[:12]
        known: dict[str, object] = {"initial_level": float(head.mean()), "initial_trend": 0.0}
        if self._seasonal:
            known["initial_seasonal"] = head - head.mean()
        model = ExponentialSmoothing(
            logs,
            trend="add",
            damped_trend=True,
            seasonal="add" if self._seasonal else None,
            seasonal_periods=self.season if self._seasonal else None,
            initialization_method="known",
            **known,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = model.fit(optimized=False, **self._params)
        mean = np.expm1(np.asarray(result.forecast(h)))
        return log_band(mean, self._sigma, level)
