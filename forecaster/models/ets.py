"""statsmodels Holt-Winters (ExponentialSmoothing) on log1p of the rate.

Two variants: "holt_winters" with an additive damped trend, and "ets_level" with a level only
(simple exponential smoothing, which smooths noise without chasing it). Both add an additive
season of ``season`` steps only when at least two seasons of history exist (and the season is
short enough to fit in time), non-seasonal otherwise, so a short history never crashes them. The log transform keeps forecasts positive and makes the
seasonal swing proportional to the level. Upper quantile: the fitted one-step residuals' spread
in log space, widened by sqrt(k) for step k. ``forward`` runs the ETS recursions on from the
fitted state (checked against statsmodels' own filter), so a backtest pays for one fit per refit.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from forecaster.errors import ConfigError
from forecaster.models.base import Forecast, clean, log_band
from forecaster.models.baselines import LastValue

if TYPE_CHECKING:
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

# Fitting a 1,440-step season takes about a minute; longer seasons are fitted without one.
MAX_SEASON = 288
# The parameters are estimated on at most this many recent buckets (older history adds time,
# not accuracy, for a model whose state forgets exponentially).
FIT_WINDOW = 2016
MIN_HISTORY = 10


class HoltWinters:
    """ETS(A, Ad|N, A|N) on log1p(y) via statsmodels; ``trend`` False gives "ets_level"."""

    def __init__(self, season: int, trend: bool = True) -> None:
        self.season = season
        self.trend = trend
        self.name = "holt_winters" if trend else "ets_level"
        self._n = 0
        self._seasonal = False
        self._alpha = self._beta = self._gamma = self._phi = 0.0
        self._level = self._slope = 0.0
        self._seasons = np.zeros(0)
        self._sigma = 0.0
        self._fallback: LastValue | None = None

    def _model(self, logs: np.ndarray, seasonal: bool) -> ExponentialSmoothing:
        # imported here: statsmodels takes a second to import, and only the forecaster's
        # fitting needs it (its CLI, /desired and the router import this package's neighbours)
        try:
            from statsmodels.tsa.holtwinters import ExponentialSmoothing
        except ImportError:
            raise ConfigError(f"model {self.name!r} needs statsmodels: pip install 'promptedge[forecaster]'") from None
        return ExponentialSmoothing(
            logs,
            trend="add" if self.trend else None,
            damped_trend=self.trend,
            seasonal="add" if seasonal else None,
            seasonal_periods=self.season if seasonal else None,
            initialization_method="estimated" if not seasonal else "heuristic",
        )

    def fit(self, y: np.ndarray) -> HoltWinters:
        y = clean(y)
        self._n = y.size
        if y.size < MIN_HISTORY:
            self._fallback = LastValue().fit(y)
            return self
        self._fallback = None
        window = max(FIT_WINDOW, 3 * self.season) if self.season <= MAX_SEASON else FIT_WINDOW
        logs = np.log1p(y[-window:])
        self._seasonal = 1 < self.season <= MAX_SEASON and logs.size >= 2 * self.season
        model = self._model(logs, self._seasonal)
        from statsmodels.tools.sm_exceptions import ConvergenceWarning

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            result = model.fit()
        params = result.params
        self._alpha = float(params["smoothing_level"])
        self._beta = float(params["smoothing_trend"]) if self.trend else 0.0
        self._phi = float(params["damping_trend"]) if self.trend else 0.0
        self._gamma = float(params["smoothing_seasonal"]) if self._seasonal else 0.0
        self._level = float(result.level[-1])
        self._slope = float(result.trend[-1]) if self.trend else 0.0
        self._seasons = np.asarray(result.season[-self.season :], dtype=float) if self._seasonal else np.zeros(0)
        resid = np.asarray(result.resid)[self.season if self._seasonal else 1 :]
        self._sigma = float(np.std(resid)) if resid.size > 1 else 0.0
        return self

    def _forecast(self, level: float, slope: float, seasons: np.ndarray, h: int) -> np.ndarray:
        damp = np.cumsum(self._phi ** np.arange(1, h + 1)) if self.trend else np.zeros(h)
        seasonal = seasons[np.arange(h) % seasons.size] if seasons.size else np.zeros(h)
        return level + damp * slope + seasonal

    def predict(self, h: int, level: float = 0.9) -> Forecast:
        if self._fallback is not None:
            return self._fallback.predict(h, level)
        mean = np.expm1(self._forecast(self._level, self._slope, self._seasons, h))
        return log_band(mean, self._sigma, level)

    def forward(self, y: np.ndarray, h: int, level: float = 0.9) -> Forecast:
        """The fitted state carried on over the buckets of ``y`` after the fitted ones (the
        ETS recursions with the fitted smoothing parameters; the first ``n`` buckets of ``y``
        must be the fitted history). Refits when ``y`` is shorter than that history."""
        y = clean(y)
        if self._fallback is not None or y.size < self._n:
            return HoltWinters(self.season, self.trend).fit(y).predict(h, level)
        a, b, g, phi = self._alpha, self._beta, self._gamma, self._phi
        lvl, slope = self._level, self._slope
        seasons = list(self._seasons)
        for obs in np.log1p(y[self._n :]):
            past = seasons[-self.season] if self._seasonal else 0.0
            new_level = a * (obs - past) + (1 - a) * (lvl + phi * slope)
            if self._seasonal:
                seasons.append(g * (obs - lvl - phi * slope) + (1 - g) * past)
            slope = b * (new_level - lvl) + (1 - b) * phi * slope if self.trend else 0.0
            lvl = new_level
        tail = np.asarray(seasons[-self.season :]) if self._seasonal else np.zeros(0)
        return log_band(np.expm1(self._forecast(lvl, slope, tail, h)), self._sigma, level)
