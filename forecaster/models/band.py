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

Scaled by recent volatility (``scales`` given to ``fit_reversion_band``): jumps cluster, a quiet hour is followed by small
changes and a restless one by large ones (ServeGen m-large days 1-7: the size of the next
window's log change correlates 0.50 with the root mean square of the last hour's changes, and a
rise of more than 20 % follows 11 % of the windows in the most restless third against 0.6-0.9 %
of the others). Then what the line leaves is divided by the trailing volatility s at its origin,
and the offset is

    a_k + b_k * x + q_k(level) * s_now

with s in log1p units per bucket, so one day's residuals calibrate a band that is wide in a
restless hour and narrow in a calm one, and a quantile chosen on calm days means about the same
on busy ones (docs/benchmarks.md, forecaster: the chosen setting's shortfall ratio to HPA-like 5.8x on the
tuning days, 6.4x held out; unscaled 6.1x and 12.2x). s is clipped to the range it was
calibrated on and floored at ``MIN_SCALE``; the cap above still holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Least spread of the feature (log1p units: 0.05 is a 5 % swing about the hour's mean) for a
# slope to be fitted; below it the static band is used.
MIN_SPREAD = 0.05
# Least trailing volatility (log1p units per bucket) a residual is divided by: a flat hour would
# otherwise make any later change an outlier of infinite size.
MIN_SCALE = 0.01


def reversion_feature(y: np.ndarray, window: int) -> float:
    """log1p of the last bucket minus the mean log1p of the last ``window`` buckets (0 for an
    empty history or ``window`` < 2). ``y``: rates per bucket, oldest first, no NaN (``clean``d)."""
    if y.size == 0 or window < 2:
        return 0.0
    tail = np.log1p(np.maximum(y[-window:], 0.0))
    return float(tail[-1] - tail.mean())


def volatility(y: np.ndarray, window: int) -> float:
    """Root mean square of the log1p changes between the last ``window`` buckets (log1p units
    per bucket), at least ``MIN_SCALE``; ``MIN_SCALE`` for fewer than two buckets. ``y``: rates
    per bucket, oldest first, no NaN."""
    if y.size < 2 or window < 2:
        return MIN_SCALE
    changes = np.diff(np.log1p(np.maximum(y[-window:], 0.0)))
    return max(MIN_SCALE, float(np.sqrt(np.mean(changes**2))))


@dataclass(frozen=True)
class ReversionBand:
    """Per step ahead k (index k-1): intercept and slope of the residual on the reversion
    feature, and the residuals left by that line (log1p space), to take quantiles at any level.

    window: buckets of the trailing mean (one hour of buckets); intercept, slope: shape (h,);
    rest: h arrays, the residuals of each step minus the line; x_range: (lowest, highest)
    feature the line was fitted on; cap: shape (h,), the largest residual of each step;
    scale_range: (lowest, highest) trailing volatility of the calibration origins when ``rest``
    is divided by it (``volatility``), None when the band is not scaled."""

    window: int
    intercept: np.ndarray
    slope: np.ndarray
    rest: tuple[np.ndarray, ...]
    x_range: tuple[float, float]
    cap: np.ndarray
    scale_range: tuple[float, float] | None = None

    def log_offsets(self, history: np.ndarray, level: float) -> np.ndarray:
        """Upper-quantile offsets in log1p space per step ahead, shape (h,), for the forecast
        made on ``history`` (rates, no NaN). They never narrow with the horizon, as the static
        band's do not."""
        x = min(max(reversion_feature(history, self.window), self.x_range[0]), self.x_range[1])
        q = np.array([np.quantile(r, level) for r in self.rest])
        if self.scale_range is not None:
            lo, hi = self.scale_range
            q = q * min(max(volatility(history, self.window), lo), hi)
        return np.maximum.accumulate(np.minimum(self.intercept + self.slope * x + q, self.cap))


def fit_reversion_band(
    residuals: list[np.ndarray],
    features: np.ndarray,
    window: int,
    min_points: int,
    scales: np.ndarray | None = None,
) -> ReversionBand | None:
    """Fit the band from backtest residuals. ``residuals[k]``: log1p residuals of step k+1 at the
    first ``len(residuals[k])`` origins, oldest first; ``features``: the reversion feature at
    every origin, shape (origins,). Steps with fewer than ``min_points`` residuals are dropped
    (the band then covers the steps before them, as the static band does). None when ``window``
    < 2 or no step has enough residuals, or the feature varies by less than ``MIN_SPREAD`` (a
    slope fitted on it would be noise). ``scales``: the trailing volatility at every origin
    (``volatility``), shape (origins,), to scale the band by (None: not scaled)."""
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
        left = r - intercept - slope * x
        rest.append(left if scales is None else left / scales[: r.size])
    spans = features[: max(r.size for r in usable)]
    scale_range = None
    if scales is not None:
        seen = scales[: max(r.size for r in usable)]
        scale_range = (float(seen.min()), float(seen.max()))
    return ReversionBand(
        window,
        np.array(intercepts),
        np.array(slopes),
        tuple(rest),
        (float(spans.min()), float(spans.max())),
        np.array([float(r.max()) for r in usable]),
        scale_range,
    )


# The upper forecast is never more than ``PEAK_FACTOR`` times the highest demand the pool counted
# in the trailing ``PEAK_WINDOW_S`` (nor below the mean forecast): a band calibrated on log
# residuals, with a zero in them (demand back after a stop: log1p(1500) - log1p(0) = 7.3), once
# asked for e^7.3, about 1,500 times the demand, for an hour after each quiet spell (issue 31).
# Demand that grows past the week's peak is still served: the mean forecast and the reactive
# floor are not bounded, only the margin the band adds over them.
PEAK_FACTOR = 1.5
PEAK_WINDOW_S = 7 * 86400.0


def bound_upper(mean: np.ndarray, upper: np.ndarray, history: np.ndarray, step: float) -> np.ndarray:
    """``upper`` capped at max(``mean``, PEAK_FACTOR x the peak of ``history`` over the last
    PEAK_WINDOW_S). mean, upper: shape (h,), demand unit per s; history: rates per bucket of
    ``step`` s, oldest first, NaN ignored. Unchanged when the history has no counted bucket."""
    recent = history[-max(1, round(PEAK_WINDOW_S / step)) :]
    recent = recent[np.isfinite(recent)]
    if recent.size == 0:
        return upper
    return np.minimum(upper, np.maximum(mean, PEAK_FACTOR * float(recent.max())))
