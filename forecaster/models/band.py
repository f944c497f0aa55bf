"""The upper band conditioned on where demand stands against its recent mean (pure numpy).

Request rates of a pool revert: after a dip below the last hour's level, a jump back up is far
more likely than after a rise (ServeGen m-large, 10-minute windows, 14 days: the next window's
log change correlates -0.27 with the current window's distance from the trailing hour's mean;
a rise of more than 20 % follows 18 % of the windows in the lowest third of that distance and
4-6 % of the others). A band calibrated as one quantile of all backtest residuals pays the dips'
margin everywhere. Here the ``level`` quantile of the residual of step k is

    a_k + b_k * x + q_k(level)

with x = log1p(y[-1]) - mean(log1p(y[-window:])) at the origin, (a_k, b_k) the least-squares line
of the backtest residuals (log1p space) on x, b_k <= 0 (reversion only: a positive slope would be
momentum fitted on a day of noisy points), and q_k the ``level`` quantile of what the line leaves.
A least-squares slope uses every residual; a quantile regression at 0.99 would rest on one or two.
The line is applied only within the feature range it was fitted on (x is clipped to it), and an
offset is never wider than the largest residual of its step in the calibration: a day of flat
history with one odd bucket once gave a slope of -289 that, at a dip far outside that range,
made the upper forecast 1e94.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Least spread of the feature (log1p units: 0.05 is a 5 % swing about the hour's mean) for a
# slope to be fitted; below it the static band is used.
MIN_SPREAD = 0.05


def reversion_feature(y: np.ndarray, window: int) -> float:
    """log1p of the last bucket minus the mean log1p of the last ``window`` buckets (0 for an
    empty history or ``window`` < 2). ``y``: rates per bucket, oldest first, no NaN (``clean``d)."""
    if y.size == 0 or window < 2:
        return 0.0
    tail = np.log1p(np.maximum(y[-window:], 0.0))
    return float(tail[-1] - tail.mean())


@dataclass(frozen=True)
class ReversionBand:
    """Per step ahead k (index k-1): intercept and slope of the residual on the reversion
    feature, and the residuals left by that line (log1p space), to take quantiles at any level.

    window: buckets of the trailing mean (one hour of buckets); intercept, slope: shape (h,);
    rest: h arrays, the residuals of each step minus the line; x_range: (lowest, highest)
    feature the line was fitted on; cap: shape (h,), the largest residual of each step."""

    window: int
    intercept: np.ndarray
    slope: np.ndarray
    rest: tuple[np.ndarray, ...]
    x_range: tuple[float, float]
    cap: np.ndarray

    def log_offsets(self, history: np.ndarray, level: float) -> np.ndarray:
        """Upper-quantile offsets in log1p space per step ahead, shape (h,), for the forecast
        made on ``history`` (rates, no NaN). They never narrow with the horizon, as the static
        band's do not."""
        x = min(max(reversion_feature(history, self.window), self.x_range[0]), self.x_range[1])
        q = np.array([np.quantile(r, level) for r in self.rest])
        return np.maximum.accumulate(np.minimum(self.intercept + self.slope * x + q, self.cap))


def fit_reversion_band(
    residuals: list[np.ndarray], features: np.ndarray, window: int, min_points: int
) -> ReversionBand | None:
    """Fit the band from backtest residuals. ``residuals[k]``: log1p residuals of step k+1 at the
    first ``len(residuals[k])`` origins, oldest first; ``features``: the reversion feature at
    every origin, shape (origins,). Steps with fewer than ``min_points`` residuals are dropped
    (the band then covers the steps before them, as the static band does). None when ``window``
    < 2 or no step has enough residuals, or the feature varies by less than ``MIN_SPREAD`` (a
    slope fitted on it would be noise)."""
    if window < 2:
        return None
    usable = [np.asarray(r, dtype=float) for r in residuals if len(r) >= min_points]
    if not usable:
        return None
    intercepts, slopes, rest = [], [], []
    for r in usable:
        x = features[: r.size]
        if not np.all(np.isfinite(x)) or np.ptp(x) < MIN_SPREAD:
            return None
        slope, intercept = np.polyfit(x, r, 1)
        slope = min(float(slope), 0.0)
        intercept = float(np.mean(r - slope * x))
        intercepts.append(intercept)
        slopes.append(slope)
        rest.append(r - intercept - slope * x)
    spans = features[: max(r.size for r in usable)]
    return ReversionBand(window, np.array(intercepts), np.array(slopes), tuple(rest),
                         (float(spans.min()), float(spans.max())), np.array([float(r.max()) for r in usable]))
