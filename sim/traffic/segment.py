"""Segments of a rate trace: where the ramp is, how much to scale it, the requests to replay,
and the days before it as per-minute history (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.traces import TraceRequest
from sim.traffic.arrivals import generate_arrivals
from sim.traffic.rates import RateSeries
from sim.traffic.tokens import TokenSampler

SMOOTH_S = 1800.0


def _smoothed(series: RateSeries) -> np.ndarray:
    totals = np.asarray(series.totals(), dtype=float)
    width = max(1, int(round(SMOOTH_S / series.step_s)))
    return np.convolve(totals, np.ones(width) / width, mode="same")


def steepest_ramp(series: RateSeries, hours: float, min_start_s: float = 0.0) -> float:
    """Start (seconds from the trace start, on a window boundary, >= ``min_start_s``) of the
    ``hours``-long segment whose demand climbs most: the largest rise from the segment's first
    window to its highest later window, on the 30-minute moving average of the total rate,
    relative to the trace's mean rate. Raises ValueError when no segment fits."""
    smooth = _smoothed(series)
    length = max(2, int(round(hours * 3600 / series.step_s)))
    first = int(math.ceil(min_start_s / series.step_s))
    best, best_start = -math.inf, None
    for s in range(first, len(smooth) - length + 1):
        rise = float(smooth[s + 1:s + length].max() - smooth[s])
        if rise > best:
            best, best_start = rise, s
    if best_start is None:
        raise ValueError(f"no {hours} h segment after {min_start_s:.0f} s in a {series.span_s / 3600:.1f} h trace")
    return best_start * series.step_s


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


def build_segment(series: RateSeries, start_s: float, span_s: float, scale: float,
                  tokens: TokenSampler, seed: int = 0) -> Segment:
    """Arrivals of [start_s, start_s + span_s) at ``scale`` with token pairs from ``tokens``,
    seeded (the same seed gives the same requests). Raises ValueError outside the trace."""
    offsets = generate_arrivals(series, start_s, span_s, scale, seed)
    pairs = tokens.draw(len(offsets), np.random.default_rng(seed + 1))
    requests = [TraceRequest(float(t), int(c), int(g)) for t, (c, g) in zip(offsets, pairs)]
    totals = series.totals()
    first, last = int(start_s // series.step_s), int(math.ceil((start_s + span_s) / series.step_s))
    return Segment(start_s, span_s, scale, requests, [t * scale for t in totals[first:last]], series.step_s)


def history_minutes(series: RateSeries, start_s: float, days: float, scale: float) -> list[tuple[int, float]]:
    """Expected requests per minute in the ``days`` before ``start_s`` (clipped at the trace
    start): ``(minute offset from the segment start (negative), requests)``, oldest first.
    A window's rate x scale holds for each of its minutes."""
    totals = series.totals()
    first_minute = -int(min(days * 86400, start_s) // 60)
    out = []
    for m in range(first_minute, 0):
        t = start_s + m * 60
        out.append((m, totals[int(t // series.step_s)] * scale * 60.0))
    return out
