"""Segments of a rate trace: where the ramp is, how much to scale it, the requests to replay,
and the days before it as per-minute history (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.client.traces import TraceRequest
from sim.client.traffic.arrivals import generate_arrivals
from sim.client.traffic.rates import RateSeries
from sim.client.traffic.tokens import TokenSampler


def steepest_ramp(series: RateSeries, hours: float, min_start_s: float = 0.0, max_jump: float | None = None) -> float:
    """Start (seconds from the trace start, on a window boundary, >= ``min_start_s``) of the
    ``hours``-long segment whose demand climbs most: the largest ratio of its highest later
    window's total rate to its first window's (replicas scale with the ratio; a centred moving
    average, used before, let a segment just before a step count the step as its rise; a
    segment starting idle counts as rising from 1 % of the trace's mean). ``max_jump``: only segments whose total rate never rises
    by more than this factor from one window to the next (a ramp that a forecast can follow,
    not a step that no forecast of the aggregate announces); None: any segment. Raises
    ValueError when no segment fits."""
    totals = np.asarray(series.totals(), dtype=float)
    floor = 0.01 * max(float(totals.mean()), 1e-12)
    length = max(2, int(round(hours * 3600 / series.step_s)))
    first = int(math.ceil(min_start_s / series.step_s))
    best, best_start = -math.inf, None
    for s in range(first, len(totals) - length + 1):
        if max_jump is not None and _largest_jump(totals[s : s + length]) > max_jump:
            continue
        rise = float(totals[s + 1 : s + length].max() / max(totals[s], floor))
        if rise > best:
            best, best_start = rise, s
    if best_start is None:
        within = "" if max_jump is None else f" rising at most {max_jump:g}x per window"
        raise ValueError(
            f"no {hours} h segment{within} after {min_start_s:.0f} s in a {series.span_s / 3600:.1f} h trace"
        )
    return best_start * series.step_s


def _largest_jump(totals: np.ndarray) -> float:
    """Largest ratio of a window's total rate to the window before it (inf after an idle one)."""
    before, after = totals[:-1], totals[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(before > 0, after / np.where(before > 0, before, 1.0), np.where(after > 0, np.inf, 1.0))
    return float(ratios.max(initial=1.0))


def scale_for_peak(series: RateSeries, start_s: float, span_s: float, peak_rps: float) -> float:
    """Factor that makes the segment's busiest window total ``peak_rps`` requests/s.
    Raises ValueError when the segment is idle throughout."""
    totals = series.totals()
    first, last = int(start_s // series.step_s), int(math.ceil((start_s + span_s) / series.step_s))
    peak = max(totals[first:last], default=0.0)
    if peak <= 0:
        raise ValueError("the segment has no traffic")
    return peak_rps / peak


@dataclass(frozen=True)
class Segment:
    """A replayable piece of a rate trace. ``start_s``/``span_s``: seconds in the trace;
    ``scale``: rate multiplier applied; ``requests``: arrivals (offset seconds from the
    segment start) with token counts; ``window_rps``: scaled total rate per trace window
    overlapping the segment, as published (the expected demand)."""

    start_s: float
    span_s: float
    scale: float
    requests: list[TraceRequest]
    window_rps: list[float]
    step_s: float


def build_segment(
    series: RateSeries, start_s: float, span_s: float, scale: float, tokens: TokenSampler, seed: int = 0
) -> Segment:
    """Arrivals of [start_s, start_s + span_s) at ``scale`` with token pairs from ``tokens``,
    seeded (the same seed gives the same requests). Raises ValueError outside the trace."""
    offsets = generate_arrivals(series, start_s, span_s, scale, seed)
    pairs = tokens.draw(len(offsets), np.random.default_rng(seed + 1))
    requests = [TraceRequest(float(t), int(c), int(g)) for t, (c, g) in zip(offsets, pairs)]
    totals = series.totals()
    first, last = int(start_s // series.step_s), int(math.ceil((start_s + span_s) / series.step_s))
    return Segment(start_s, span_s, scale, requests, [t * scale for t in totals[first:last]], series.step_s)


def history_minutes(
    series: RateSeries, start_s: float, days: float, scale: float, seed: int | None = None
) -> list[tuple[int, float]]:
    """Requests per minute in the ``days`` before ``start_s`` (clipped at the trace start):
    ``(minute offset from the segment start (negative), requests)``, oldest first.

    ``seed`` None: the expected count, a window's rate x scale for each of its minutes.
    With a seed: a count drawn per minute with that mean and the variance of the window's
    clients' renewal processes, sum of rate x scale x 60 x cv^2 (a renewal process's count
    variance over a span much longer than its gaps; Poisson where cv <= 1, gamma-Poisson
    above), so the history the forecaster calibrates its band on is as bursty as the live
    minutes it will see (expected counts made the band far too narrow in the loop)."""
    first_minute = -int(min(days * 86400, start_s) // 60)
    means, variances = [], []
    for w in series.windows:
        means.append(sum(c.rate for c in w) * scale * 60.0)
        variances.append(sum(c.rate * c.cv * c.cv for c in w) * scale * 60.0)
    rng = None if seed is None else np.random.default_rng(seed)
    out = []
    for m in range(first_minute, 0):
        i = int((start_s + m * 60) // series.step_s)
        mean, var = means[i], variances[i]
        if rng is None:
            out.append((m, mean))
        elif var > mean > 0:  # over-dispersed: Poisson of a gamma rate with that mean and variance
            out.append((m, float(rng.poisson(rng.gamma(mean * mean / (var - mean), (var - mean) / mean)))))
        else:
            out.append((m, float(rng.poisson(mean))))
    return out
