"""The pool's queue time per simulated minute, from scrapes of each replica's vLLM histogram
``vllm:request_queue_time_seconds`` (pure: parsing and arithmetic, no I/O).

What a Prometheus user would compute on a real vLLM fleet, per Pod and then summed:

- a **scrape** is one Pod's cumulative histogram (``_sum`` in simulated seconds, ``_count``,
  cumulative ``_bucket`` counts by ``le``) at simulated time ``t_s``;
- per Pod (keyed by its UID), consecutive scrapes give the requests observed between them: the
  deltas of sum, count and every bucket. A Pod's first scrape counts from zero: a replica's
  counters start at 0 with its process, and the router sends it nothing before it is Ready,
  which is when the observer starts scraping it. A scrape below its predecessor (count, sum or
  a bucket lower) is a counter reset, the container restarted, and also counts from zero, as
  Prometheus's ``rate()`` treats resets;
- a delta belongs to the minute of its later scrape; the pool's minute is the sum of its Pods'
  deltas, so Pods appearing and disappearing mid-run need no special case;
- **mean** = delta sum / delta count; **p95** = Prometheus's ``histogram_quantile`` estimate on
  the summed bucket deltas (linear within the bucket holding the rank, the highest finite bound
  when the rank falls in ``+Inf``), so its resolution is vLLM's buckets (the first ends at
  0.3 s).

vLLM observes a request's queue time when the request finishes, so a minute's figures are
those of the requests that finished in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

METRIC = "vllm:request_queue_time_seconds"


@dataclass(frozen=True)
class HistogramTotals:
    """A cumulative histogram: ``sum`` (seconds), ``count`` and ``buckets`` as
    (upper bound ``le``, cumulative count), ascending, ``+Inf`` last."""

    sum: float
    count: float
    buckets: tuple[tuple[float, float], ...]


EMPTY = HistogramTotals(0.0, 0.0, ())


@dataclass(frozen=True)
class Scrape:
    """One Pod's histogram at simulated time ``t_s`` (seconds from the segment start)."""

    t_s: float
    pod: str
    hist: HistogramTotals


def parse_histogram(text: str, name: str = METRIC) -> HistogramTotals | None:
    """The histogram ``name`` in Prometheus text, its label sets (one per engine) summed;
    None when the text has no such histogram. Raises ValueError on malformed text."""
    totals: HistogramTotals | None = None
    for family in text_string_to_metric_families(text):
        if family.name != name or family.type != "histogram":
            continue
        sums: dict[tuple[tuple[str, str], ...], float] = {}
        counts: dict[tuple[tuple[str, str], ...], float] = {}
        buckets: dict[float, float] = {}
        for s in family.samples:
            if s.name == f"{name}_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
            elif s.name == f"{name}_sum":
                sums[_series(s.labels)] = s.value
            elif s.name == f"{name}_count":
                counts[_series(s.labels)] = s.value
        one = HistogramTotals(sum(sums.values()), sum(counts.values()), tuple(sorted(buckets.items())))
        totals = one if totals is None else add(totals, one)
    return totals


def _series(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def add(a: HistogramTotals, b: HistogramTotals) -> HistogramTotals:
    """Sum of two histograms, bucket by bucket (a bound missing from one counts 0 there)."""
    merged = dict(a.buckets)
    for le, n in b.buckets:
        merged[le] = merged.get(le, 0.0) + n
    return HistogramTotals(a.sum + b.sum, a.count + b.count, tuple(sorted(merged.items())))


def is_reset(prev: HistogramTotals, cur: HistogramTotals) -> bool:
    """True when ``cur`` is below ``prev`` anywhere: the counters restarted from zero."""
    before = dict(prev.buckets)
    return cur.count < prev.count or cur.sum < prev.sum or any(n < before.get(le, 0.0) for le, n in cur.buckets)


def since(prev: HistogramTotals | None, cur: HistogramTotals) -> HistogramTotals:
    """The observations between two scrapes of one Pod: ``cur`` itself after no scrape or a
    reset, else ``cur - prev`` bucket by bucket."""
    if prev is None or is_reset(prev, cur):
        return cur
    before = dict(prev.buckets)
    return HistogramTotals(
        cur.sum - prev.sum, cur.count - prev.count, tuple((le, n - before.get(le, 0.0)) for le, n in cur.buckets)
    )


def deltas(scrapes: Iterable[Scrape]) -> list[tuple[float, HistogramTotals]]:
    """(t_s, observations since that Pod's previous scrape) for every scrape, by time."""
    last: dict[str, HistogramTotals] = {}
    out: list[tuple[float, HistogramTotals]] = []
    for s in sorted(scrapes, key=lambda s: s.t_s):
        out.append((s.t_s, since(last.get(s.pod), s.hist)))
        last[s.pod] = s.hist
    return out


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus's ``histogram_quantile(q, ...)`` on cumulative (le, count) buckets,
    ascending with ``+Inf`` last; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(le):
                return lower  # beyond the last finite bound: that bound is all we know
            return lower + (le - lower) * (rank - below) / (cumulative - below)
        lower, below = le, cumulative
    return lower


def summarize_queue(observed: Iterable[HistogramTotals]) -> dict[str, Any]:
    """``{"mean", "p95", "requests"}`` of the summed observations: seconds (4 decimals) or
    None without any, and the number of requests observed."""
    total = EMPTY
    for h in observed:
        total = add(total, h)
    p95 = bucket_quantile(0.95, total.buckets) if total.count > 0 else None
    return {
        "mean": round(total.sum / total.count, 4) if total.count > 0 else None,
        "p95": None if p95 is None else round(p95, 4),
        "requests": int(round(total.count)),
    }


def queue_time_minutes(scrapes: Iterable[Scrape], minutes: int) -> list[dict[str, Any]]:
    """One :func:`summarize_queue` per simulated minute 0 .. ``minutes - 1``."""
    found = deltas(scrapes)
    return [summarize_queue(d for t, d in found if m * 60 <= t < (m + 1) * 60) for m in range(minutes)]


def queue_time_total(scrapes: Iterable[Scrape]) -> dict[str, Any]:
    """:func:`summarize_queue` over the whole run from the segment start (t_s >= 0), the drain
    after the last arrival included; scrapes before it only set each Pod's baseline."""
    return summarize_queue(d for t, d in deltas(scrapes) if t >= 0)
