"""Arrivals from per-window rate statistics (pure: numpy only, seeded).

Method: each active client in each window is a renewal process whose inter-arrival gaps come
from its window's fitted family (ServeGen's ``pattern``: Gamma or Weibull; Exponential for a
Poisson client), with the two parameters set by the method of moments so that the mean gap is
1 / (rate x scale) and the gaps' coefficient of variation is the window's ``cv``:

- Gamma: shape k = 1 / cv^2, scale = mean / k;
- Weibull: shape k solving Gamma(1 + 2/k) / Gamma(1 + 1/k)^2 - 1 = cv^2 (bisection),
  scale = mean / Gamma(1 + 1/k);
- cv = 0: evenly spaced; Exponential (or cv = 1 for Gamma): Poisson.

ServeGen's own fitted ``arg1``/``arg2`` are not used: matching rate and CV makes every window
carry exactly the published mean rate and burstiness whatever the parameter convention. Each
window starts its processes afresh, the first gap a uniform fraction of a drawn gap (an
approximation of the stationary forward-recurrence time). Rescaling volume multiplies every
client's rate and keeps its CV.
"""

from __future__ import annotations

import math

import numpy as np

from sim.client.traffic.rates import ClientWindow, RateSeries

MIN_SHAPE, MAX_SHAPE = 0.02, 200.0


def _weibull_cv(k: float) -> float:
    return math.sqrt(max(0.0, math.exp(math.lgamma(1 + 2 / k) - 2 * math.lgamma(1 + 1 / k)) - 1.0))


def shape_for_cv(pattern: str, cv: float) -> float:
    """Shape parameter of ``pattern`` ("Gamma" or "Weibull") with coefficient of variation
    ``cv`` (> 0), clipped to [0.02, 200]. Raises ValueError for another pattern."""
    if pattern == "Gamma":
        return min(MAX_SHAPE, max(MIN_SHAPE, 1.0 / (cv * cv)))
    if pattern == "Weibull":
        lo, hi = MIN_SHAPE, MAX_SHAPE  # the Weibull CV falls as k grows
        if cv >= _weibull_cv(lo):
            return lo
        if cv <= _weibull_cv(hi):
            return hi
        for _ in range(80):
            mid = math.sqrt(lo * hi)
            if _weibull_cv(mid) > cv:
                lo = mid
            else:
                hi = mid
        return math.sqrt(lo * hi)
    raise ValueError(f"unknown inter-arrival pattern {pattern!r}")


def _gaps(client: ClientWindow, mean: float, n: int, rng: np.random.Generator) -> np.ndarray:
    if client.cv <= 1e-9:
        return np.full(n, mean)
    if client.pattern == "Exponential" or (client.pattern == "Gamma" and abs(client.cv - 1) < 1e-9):
        return rng.exponential(mean, n)
    k = shape_for_cv(client.pattern, client.cv)
    if client.pattern == "Gamma":
        return rng.gamma(k, mean / k, n)
    return rng.weibull(k, n) * (mean / math.exp(math.lgamma(1 + 1 / k)))


def _length_biased_gap(client: ClientWindow, mean: float, rng: np.random.Generator) -> float:
    """One gap drawn with density x f(x) / mean (f: the client's gap density), seconds."""
    if client.cv <= 1e-9:
        return mean
    if client.pattern == "Exponential" or (client.pattern == "Gamma" and abs(client.cv - 1) < 1e-9):
        return float(rng.gamma(2.0, mean))
    k = shape_for_cv(client.pattern, client.cv)
    if client.pattern == "Gamma":
        return float(rng.gamma(k + 1, mean / k))
    scale = mean / math.exp(math.lgamma(1 + 1 / k))
    return float(scale * rng.gamma(1 + 1 / k) ** (1 / k))


def client_arrivals(
    client: ClientWindow, start_s: float, span_s: float, scale: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival times (seconds, sorted) of one client in [start_s, start_s + span_s)."""
    rate = client.rate * scale
    if rate <= 0 or span_s <= 0:
        return np.empty(0)
    mean = 1.0 / rate
    expected = rate * span_s
    chunk = int(expected + 4 * math.sqrt(expected) + 16)
    first = _length_biased_gap(client, mean, rng) * rng.random()
    times = [np.array([start_s + first])]
    last = start_s + first
    while last < start_s + span_s:
        more = last + np.cumsum(_gaps(client, mean, chunk, rng))
        times.append(more)
        last = float(more[-1])
    out = np.concatenate(times)
    return out[out < start_s + span_s]


def generate_arrivals(
    series: RateSeries, start_s: float, span_s: float, scale: float = 1.0, seed: int = 0
) -> np.ndarray:
    """Arrival offsets (seconds from ``start_s``, sorted) of the segment
    [start_s, start_s + span_s) of ``series`` (seconds from the trace start), every rate
    multiplied by ``scale``. Same inputs and seed, same arrivals. Raises ValueError when
    the segment leaves the series."""
    if start_s < 0 or span_s <= 0 or start_s + span_s > series.span_s + 1e-9:
        raise ValueError(f"segment [{start_s:.0f} s, +{span_s:.0f} s) is outside the trace (0..{series.span_s:.0f} s)")
    rng = np.random.default_rng(seed)
    parts = []
    first, last = int(start_s // series.step_s), int(math.ceil((start_s + span_s) / series.step_s))
    for i in range(first, last):
        w0 = max(start_s, i * series.step_s)
        w1 = min(start_s + span_s, (i + 1) * series.step_s)
        for client in series.windows[i]:
            parts.append(client_arrivals(client, w0, w1 - w0, scale, rng))
    if not parts:
        return np.empty(0)
    return np.sort(np.concatenate(parts)) - start_s
