"""Seasonal level: a smoothed level plus a daily profile averaged over days of history.

In log1p space, y_t = level_t + profile[t mod S] + noise. The profile is the mean of the last
``days`` (at most 7) whole seasons at each phase, centred on zero and smoothed over a window of
about 1/48 of the season (30 minutes of a day), so one odd day does not become the shape. The
level is simple exponential smoothing of the deseasonalised series, with its smoothing weight
chosen from a small grid by one-step error on the most recent two seasons. The forecast k steps
ahead is level + profile at the phase of that step: the ramp of the daily curve is carried
forward, while the level follows today's volume (a "seasonal naive blended with level").

Unlike Holt-Winters (``ets.py``, a fitted additive season of at most 288 steps), this works for
any season length, so 1-minute counters (a season of 1,440 steps) get a daily shape too. It
needs ``MIN_SEASONS`` (3) whole seasons of history; with less it is a level only (the profile
is zero), which the name in reports does not hide: ``seasonal`` is False then. Upper quantile:
the one-step residuals' spread in log space widened by sqrt(k), as the ETS models do (model
selection replaces it with backtest-residual quantiles when it can). ``forward`` carries the
level on over new buckets with the fitted profile and weight (one fit per refit in backtests).
"""

from __future__ import annotations

import numpy as np
from scipy.signal import lfilter

from forecaster.models.base import Forecast, clean, log_band

MIN_SEASONS = 3
MAX_SEASONS = 7
ALPHAS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


def _smooth(y: np.ndarray, alpha: float, start: float) -> np.ndarray:
    """Exponential smoothing levels after each point: l_t = alpha y_t + (1 - alpha) l_{t-1}, l_{-1} = start."""
    out, _ = lfilter([alpha], [1.0, alpha - 1.0], y, zi=[(1.0 - alpha) * start])
    return np.asarray(out)


class SeasonalLevel:
    """Level + daily profile on log1p(y); ``season``: steps per day (any length >= 2)."""

    name = "seasonal_level"

    def __init__(self, season: int, days: int = MAX_SEASONS) -> None:
        self.season = season
        self.days = max(MIN_SEASONS, min(days, MAX_SEASONS))
        self.seasonal = False
        self._profile = np.zeros(max(season, 1))
        self._alpha = 0.5
        self._level = 0.0
        self._n = 0
        self._sigma = 0.0

    def _phase(self, index: np.ndarray) -> np.ndarray:
        return self._profile[index % self._profile.size]

    def _fit_profile(self, logs: np.ndarray) -> None:
        s = self.season
        whole = logs.size // s if s >= 2 else 0
        self.seasonal = whole >= MIN_SEASONS
        if not self.seasonal:
            self._profile = np.zeros(max(s, 1))
            return
        used = min(whole, self.days)
        first = logs.size - used * s  # the last `used` whole seasons, aligned to the series' phase
        days = logs[first:].reshape(used, s)
        shift = first % s  # phase of the first kept bucket
        profile = np.roll(days.mean(axis=0), shift)
        width = max(1, s // 48) | 1  # odd window, about 30 minutes of a day
        pad = width // 2
        wrapped = np.r_[profile[-pad:], profile, profile[:pad]] if pad else profile
        profile = np.convolve(wrapped, np.ones(width) / width, mode="valid")
        self._profile = profile - profile.mean()

    def fit(self, y: np.ndarray) -> SeasonalLevel:
        y = clean(y)
        self._n = y.size
        if y.size == 0:
            self._level, self._sigma, self.seasonal = 0.0, 0.0, False
            return self
        logs = np.log1p(y)
        self._fit_profile(logs)
        z = logs - self._phase(np.arange(logs.size))
        recent = min(z.size, max(2 * self.season, 10))
        best = None
        for alpha in ALPHAS:
            levels = _smooth(z, alpha, z[0])
            resid = z[1:] - levels[:-1]
            sse = float(np.mean(resid[-recent:] ** 2)) if resid.size else 0.0
            if best is None or sse < best[0]:
                best = (sse, alpha, levels, resid)
        assert best is not None
        _, self._alpha, levels, resid = best
        self._level = float(levels[-1])
        self._sigma = float(np.std(resid[-recent:])) if resid.size > 1 else 0.0
        return self

    def _forecast(self, level: float, n: int, h: int, level_q: float) -> Forecast:
        mean = np.expm1(level + self._phase(np.arange(n, n + h)))
        return log_band(mean, self._sigma, level_q)

    def predict(self, h: int, level: float = 0.9) -> Forecast:
        return self._forecast(self._level, self._n, h, level)

    def forward(self, y: np.ndarray, h: int, level: float = 0.9) -> Forecast:
        """The fitted level carried on over the buckets of ``y`` after the fitted ones (same
        profile and weight; the first ``n`` buckets of ``y`` must be the fitted history).
        Refits when ``y`` is shorter than that history."""
        y = clean(y)
        if y.size < self._n or self._n == 0:
            return SeasonalLevel(self.season, self.days).fit(y).predict(h, level)
        new = np.log1p(y[self._n :])
        lvl = self._level
        if new.size:
            z = new - self._phase(np.arange(self._n, y.size))
            lvl = float(_smooth(z, self._alpha, self._level)[-1])
        return self._forecast(lvl, y.size, h, level)
