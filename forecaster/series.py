"""Traffic on a fixed time grid, with missing data kept as NaN.

Every source (Redis counters, Prometheus, trace files) returns a ``Traffic``: one bucket per
``step`` seconds starting at ``start`` (Unix s, UTC). Values are rates per second averaged over
the bucket. NaN means "no data" (an outage, a gap in the file, before the first counted minute);
it is never silently turned into zero, so the planner can refuse to scale down on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from forecaster.errors import ConfigError

DemandUnit = Literal["requests", "tokens"]


@dataclass(frozen=True)
class Traffic:
    """Demand on a fixed grid.

    start: Unix s of the first bucket's start; step: bucket length in s (> 0).
    requests: requests/s per bucket, shape (n,), NaN = missing.
    misses: cache misses/s per bucket (what reached the GPUs) or None when no cache counted.
    tokens: prompt + completion tokens/s per bucket or None when the source has no token counts.
    name: what the series is (model name, file name), for reports.
    """

    start: float
    step: float
    requests: np.ndarray
    misses: np.ndarray | None = None
    tokens: np.ndarray | None = None
    name: str = ""

    def __len__(self) -> int:
        return int(self.requests.shape[0])

    @property
    def end(self) -> float:
        """Unix s just after the last bucket."""
        return self.start + len(self) * self.step

    def times(self) -> np.ndarray:
        """Bucket start times, Unix s, shape (n,)."""
        return self.start + self.step * np.arange(len(self))

    def window(self, lo: int, hi: int) -> Traffic:
        """Buckets [lo, hi) as a new Traffic (same step)."""
        cut = slice(lo, hi)
        return replace(
            self,
            start=self.start + max(lo, 0) * self.step,
            requests=self.requests[cut],
            misses=None if self.misses is None else self.misses[cut],
            tokens=None if self.tokens is None else self.tokens[cut],
        )


def demand(traffic: Traffic, unit: DemandUnit) -> np.ndarray:
    """What reaches the GPUs, per bucket, NaN kept.

    "requests": cache misses/s when the source counts them, else requests/s.
    "tokens": tokens/s scaled by the bucket's miss ratio (misses / requests; 1 when no cache
    counted; buckets with no requests have no tokens either). Raises ConfigError when tokens are
    asked for and the source has no token counts.
    """
    if unit == "requests":
        return traffic.requests if traffic.misses is None else traffic.misses
    if traffic.tokens is None:
        raise ConfigError(
            f"demand unit 'tokens' but source {traffic.name!r} has no token counts; "
            "set PROMPTEDGE_FORECASTER_DEMAND_UNIT=requests"
        )
    if traffic.misses is None:
        return traffic.tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(traffic.requests > 0, traffic.misses / traffic.requests, 0.0)
    return traffic.tokens * ratio


def bucket_events(
    times: np.ndarray, weights: dict[str, np.ndarray], step: float
) -> tuple[float, dict[str, np.ndarray]]:
    """Count events into buckets of ``step`` s; returns (grid start, per-second rate per key).

    times: event times, Unix s (any order). weights: per-event amounts per key (e.g. tokens);
    the key "requests" is added as 1 per event. Every bucket inside the covered span is
    observed, so a bucket without events is 0, not missing. The buckets holding the first and
    last events are left out when the trace begins or ends inside them (they would read as a
    dip); a trace shorter than a bucket gives one bucket.
    """
    if times.size == 0:
        raise ValueError("no events")
    lo = math.ceil(times.min() / step) * step
    n = max(1, math.floor((times.max() - lo) / step))
    idx = np.floor((times - lo) / step).astype(np.int64)
    keep = (idx >= 0) & (idx < n)
    out: dict[str, np.ndarray] = {}
    for key, w in {"requests": np.ones_like(times, dtype=float), **weights}.items():
        out[key] = np.bincount(idx[keep], weights=w[keep], minlength=n)[:n] / step
    return float(lo), out


def resample_levels(
    times: np.ndarray, values: np.ndarray, step: float | None = None
) -> tuple[float, float, np.ndarray]:
    """Average sampled levels (rates) into buckets; returns (grid start, step, rates).

    times: sample times, Unix s; values: the rate over [t, t + native interval), where the native
    interval is the median spacing of the samples. step: bucket length in s (default: the native
    interval). A bucket with no sample covering it is NaN (missing, not zero). Used for
    Prometheus samples, ServeGen windows and timestamp,value CSVs.
    """
    if times.size == 0:
        raise ValueError("no samples")
    order = np.argsort(times, kind="stable")
    times, values = times[order], values[order]
    native = float(np.median(np.diff(times))) if times.size > 1 else 60.0
    native = native if native > 0 else 60.0
    step = native if step is None else float(step)
    repeat = max(1, round(native / step))
    if repeat > 1:  # a coarse sample holds for its whole interval on a finer grid
        times = (times[:, None] + step * np.arange(repeat)[None, :]).ravel()
        values = np.repeat(values, repeat)
    lo = math.floor(times.min() / step) * step
    n = math.floor((times.max() - lo) / step) + 1
    idx = np.floor((times - lo) / step).astype(np.int64)
    keep = ~np.isnan(values)
    sums = np.bincount(idx[keep], weights=values[keep], minlength=n)
    counts = np.bincount(idx[keep], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return float(lo), step, out


def trailing_mean(y: np.ndarray, buckets: int) -> np.ndarray:
    """Mean of each bucket and the ``buckets - 1`` before it, NaN ignored (NaN where all are),
    shape of ``y``: the rate over a trailing window, as PromQL's ``rate(x[5m])`` gives it.
    ``buckets`` <= 1 returns ``y`` unchanged.

    Why: a minute's count of a few requests is mostly Poisson noise (at 20 a minute, +-22 % at
    one standard deviation); the replica's capacity already covers that noise, so what the
    planner should size for is the rate, not the count."""
    if buckets <= 1 or y.size == 0:
        return y
    finite = np.isfinite(y)
    sums = np.cumsum(np.where(finite, y, 0.0))
    counts = np.cumsum(finite)
    sums[buckets:] = sums[buckets:] - sums[:-buckets]
    counts[buckets:] = counts[buckets:] - counts[:-buckets]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


# A trailing run of zero buckets is read as an outage of the demand signal (upstream stopped
# sending, a client's retry storm to come) rather than real quiet when the hour before it was
# busy and steady: at least ``OUTAGE_MIN_COUNT`` events per bucket on average (a Poisson count
# with that mean is 0 with probability e^-20, 2e-9) and no bucket of it below
# ``OUTAGE_STEADY_FRACTION`` of that mean (traffic that never came near zero does not stop on
# its own within a bucket). A bursty pool whose buckets already touched zero (the Azure code
# trace: 13 silent minutes at 155 requests/min) is real quiet. At most ``OUTAGE_MAX_S`` of a
# run is an outage; past it the demand is taken as gone (real quiet: the pool may shrink).
OUTAGE_MIN_COUNT = 20.0
OUTAGE_STEADY_FRACTION = 0.25
OUTAGE_MAX_S = 7200.0


@dataclass(frozen=True)
class ZeroRun:
    """The zero buckets that end a series. buckets: how many (0: the last bucket is not 0);
    level: mean rate of the counted buckets in the hour before the run (demand unit per s; NaN
    when none); outage: True when the run reads as an outage of the demand signal, False as
    real quiet (see ``OUTAGE_MIN_COUNT``)."""

    buckets: int
    level: float
    outage: bool

    def describe(self, step: float) -> str:
        """One line for a decision's reason."""
        span = f"{self.buckets} zero bucket{'s' if self.buckets != 1 else ''} ({self.buckets * step / 60:g} min)"
        if self.outage:
            return (
                f"demand signal outage: {span} right after a steady {self.level:.3g}/s, where a zero "
                "bucket is implausible; not read as demand"
            )
        return f"real quiet: {span} after {self.level:.3g}/s, a level where zero buckets happen"


def zero_run(y: np.ndarray, step: float) -> ZeroRun:
    """Classify the run of zero buckets at the end of ``y`` (rates per bucket of ``step`` s, NaN
    = missing; pure). See ``OUTAGE_MIN_COUNT`` for the rule."""
    n = y.size
    end = n
    while end > 0 and y[end - 1] == 0.0:
        end -= 1
    buckets = n - end
    if buckets == 0:
        return ZeroRun(0, float("nan"), False)
    hour = max(1, round(3600.0 / step))
    before = y[max(0, end - hour) : end]
    before = before[np.isfinite(before)]
    if before.size == 0:
        return ZeroRun(buckets, float("nan"), False)
    level = float(before.mean())
    outage = (
        buckets * step <= OUTAGE_MAX_S
        and level * step >= OUTAGE_MIN_COUNT
        and float(before.min()) >= OUTAGE_STEADY_FRACTION * level
    )
    return ZeroRun(buckets, level, outage)


def mask_outages(y: np.ndarray, step: float) -> np.ndarray:
    """``y`` with every zero bucket that was an outage when it was the last one (``zero_run``)
    set to NaN (missing), so models and the band never learn an outage as demand (pure; causal:
    each bucket is judged on the buckets up to it)."""
    out = np.asarray(y, dtype=float).copy()
    zeros = np.flatnonzero(out == 0.0)
    if zeros.size == 0:
        return out
    # runs of consecutive zeros: judge each once at its start, then cap its length
    starts = zeros[np.r_[True, np.diff(zeros) > 1]]
    ends = zeros[np.r_[np.diff(zeros) > 1, True]] + 1
    longest = int(OUTAGE_MAX_S // step)
    for lo, hi in zip(starts, ends):
        if zero_run(y[: lo + 1], step).outage:
            out[lo : min(hi, lo + longest)] = np.nan
    return out
