"""Predictive cache warming, the pure part: which slot is a peak, which keys to regenerate for
it, and how fast (issue 14 item 4). No I/O: the router's warmer (Redis, dispatch, upstream)
and the benchmark (``bench/cache_warming.py``) hand in plain data.

Terms. A **slot** is a time-of-day window of ``slot_s`` seconds, aligned to UTC midnight
(``slot_s`` divides 86400, so epoch-aligned slots are day-aligned). A key's **popularity** for
a slot is its request count in the same slot on each of the ``history_days`` earlier days.
Units: times in Unix seconds (float), demand and capacity in requests/s, budget in warm
generations per minute per pool.

Rules:
- a **peak** is the forecast's highest point within ``lead_s`` ahead of now when it reaches
  ``peak_fraction`` of the pool's capacity and is at least ``min_rise`` above the forecast
  nearest now (a rise to come); warming targets the slot holding that point (``peak_slot``);
- a key is **warmed** for that slot when it is among the ``top_k`` hottest of the slot (taken
  round-robin over tenants by rank, ``fair_top``: one tenant cannot take them all), was seen
  on at least ``min_days_seen`` earlier days (one-off prompts are never regenerated) and its
  cache entry is absent or expires before the slot ends (``choose``);
- warm generations are paced by a token bucket of ``budget_per_min`` per minute holding at most
  ``burst`` tokens (``allowance``), and run only while the pool's load (in flight / capacity)
  is below ``idle_load`` (``idle``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

DAY_S = 86400


@dataclass(frozen=True)
class WarmCandidate:
    """One exact-cache key of a slot's history.

    key: the exact-cache key (already scoped: tenant, pool/model, params, context);
    count: requests for this key in the same time-of-day slot on the earlier days kept (sum);
    days_seen: on how many of those days it appeared in that slot;
    cached_until_s: when its current cache entry expires (epoch s), None if absent;
    group: whose key it is (its tenant tag, cache/warming/popularity.py), for the round-robin of ``fair_top``.
    """

    key: str
    count: float
    days_seen: int
    cached_until_s: float | None
    group: str = ""


@dataclass(frozen=True)
class WarmPolicy:
    """Limits of warming for one pool. Raises ValueError on a value that cannot work.

    slot_s: time-of-day slot length (s), divides 86400; history_days: earlier days counted;
    top_k: hottest keys considered per slot and pool; min_days_seen: a key must recur on this
    many earlier days (<= history_days); budget_per_min: warm generations per minute per pool at
    most (0: none); lead_s: how long before the peak slot starts warming may begin (s);
    idle_load: warm only while pool load (in flight / capacity) is below this;
    peak_fraction: the forecast peak must reach this fraction of the pool's capacity to be worth
    warming for; min_rise: ... and be this fraction above the forecast nearest now (0.2 = 20 %
    more; 0: any rise), so a flat busy day is no peak; burst: tokens the budget's bucket holds at most (1: evenly paced, one warm
    generation every 60 / budget_per_min s).
    """

    slot_s: int = 600
    history_days: int = 7
    top_k: int = 50
    min_days_seen: int = 2
    budget_per_min: float = 6.0
    lead_s: int = 900
    idle_load: float = 0.5
    peak_fraction: float = 0.5
    min_rise: float = 0.2
    burst: float = 1.0

    def __post_init__(self) -> None:
        if self.slot_s <= 0 or DAY_S % self.slot_s:
            raise ValueError(f"slot_s {self.slot_s} must be > 0 and divide 86400")
        if self.history_days < 1 or self.top_k < 1:
            raise ValueError("history_days and top_k must be >= 1")
        if not 1 <= self.min_days_seen <= self.history_days:
            raise ValueError(f"min_days_seen {self.min_days_seen} must be in [1, history_days={self.history_days}]")
        if self.budget_per_min < 0 or self.lead_s < 0 or self.burst < 1:
            raise ValueError("budget_per_min and lead_s must be >= 0, burst >= 1")
        if self.idle_load <= 0 or self.peak_fraction < 0 or self.min_rise < 0:
            raise ValueError("idle_load must be > 0, peak_fraction and min_rise >= 0")


def slot_of(t_s: float, slot_s: int) -> tuple[int, int]:
    """(day, slot): the UTC day number since the epoch and the slot's index within that day."""
    day, second = divmod(math.floor(t_s), DAY_S)
    return int(day), int(second // slot_s)


def slot_bounds(t_s: float, slot_s: int) -> tuple[float, float]:
    """(start, end) in epoch s of the slot holding ``t_s``."""
    start = math.floor(t_s / slot_s) * slot_s
    return float(start), float(start + slot_s)


def earlier_days(slot_start_s: float, policy: WarmPolicy) -> list[tuple[int, int]]:
    """The (day, slot) pairs of the same time-of-day slot on the ``history_days`` days before."""
    day, slot = slot_of(slot_start_s, policy.slot_s)
    return [(day - back, slot) for back in range(1, policy.history_days + 1)]


def fair_top(candidates: Sequence[WarmCandidate], k: int) -> list[WarmCandidate]:
    """The ``k`` candidates taken round-robin over their groups (tenants) by rank: every group's
    hottest, then every group's second, ...; within a round hottest first (ties: key order). So
    one tenant holds at most ceil(k / groups) of them while the others have candidates; with one
    group it is the ``k`` hottest."""
    groups: dict[str, list[WarmCandidate]] = {}
    for c in sorted(candidates, key=lambda c: (-c.count, c.key)):
        groups.setdefault(c.group, []).append(c)
    ranked = sorted(((rank, -c.count, c.key), c) for g in groups.values() for rank, c in enumerate(g))
    return [c for _, c in ranked[:k]]


def choose(
    candidates: Sequence[WarmCandidate], slot_start_s: float, slot_end_s: float, policy: WarmPolicy
) -> list[str]:
    """Keys to regenerate for the slot [slot_start_s, slot_end_s), hottest first.

    The ``top_k`` candidates taken round-robin over tenants by rank (``fair_top``; by count
    within a round, ties: key order, so the choice is reproducible) are considered; of those, a key is chosen when ``days_seen >= min_days_seen`` and its entry is
    absent or expires before ``slot_end_s`` (an entry alive through the slot needs nothing).
    ``slot_start_s`` is not used by the rule itself; it is part of the interface so a caller
    names the slot it plans for.
    """
    del slot_start_s
    hottest = fair_top(candidates, policy.top_k)
    return [
        c.key
        for c in hottest
        if c.days_seen >= policy.min_days_seen and (c.cached_until_s is None or c.cached_until_s < slot_end_s)
    ]


def peak_slot(
    forecast: Sequence[tuple[float, float]], now_s: float, policy: WarmPolicy, capacity_rps: float
) -> tuple[float, float] | None:
    """The (start, end) of the slot to warm for, or None.

    forecast: (epoch s, requests/s) points; those after ``now_s`` and at most ``lead_s`` ahead
    count. The peak is their highest point (the earliest of equal ones); it is worth warming
    for when it is >= ``peak_fraction * capacity_rps`` and > ``(1 + min_rise)`` times the
    forecast point nearest ``now_s`` (demand is still to rise). Any demand unit works (tokens/s
    with a capacity in tokens/s): only ratios are compared. The slot returned holds the peak point; it may have
    started already when the peak is late in the current slot. capacity_rps <= 0 (no replica
    known) gives None: there is nothing idle to warm with.
    """
    if capacity_rps <= 0 or not forecast:
        return None
    ahead = [(t, rps) for t, rps in forecast if now_s < t <= now_s + policy.lead_s]
    if not ahead:
        return None
    peak_t, peak_rps = max(ahead, key=lambda p: (p[1], -p[0]))
    _, current_rps = min(forecast, key=lambda p: abs(p[0] - now_s))
    if peak_rps < policy.peak_fraction * capacity_rps or peak_rps <= current_rps * (1 + policy.min_rise):
        return None
    return slot_bounds(peak_t, policy.slot_s)


def allowance(now_s: float, last_s: float | None, tokens: float, policy: WarmPolicy) -> tuple[float, float]:
    """Token bucket of the warming budget: (tokens after refill, refill time = now_s).

    The bucket gains ``budget_per_min / 60`` tokens per second up to ``burst``; a first call
    (``last_s`` None) finds it full. The caller spends 1 token per warm generation, and only
    when it has >= 1. So in any window of W seconds at most ``burst + budget_per_min * W / 60``
    generations start. A clock that went backwards refills nothing.
    """
    if last_s is None:
        return float(policy.burst), now_s
    gained = max(0.0, now_s - last_s) * policy.budget_per_min / 60.0
    # Rounded: ten refills of 0.1 must make a whole token, not 0.9999999999999999.
    return min(float(policy.burst), round(tokens + gained, 9)), now_s


def wait_s(tokens: float, policy: WarmPolicy) -> float:
    """Seconds until the bucket holds one token again (inf with a budget of 0)."""
    if tokens >= 1:
        return 0.0
    if policy.budget_per_min <= 0:
        return math.inf
    return (1.0 - tokens) * 60.0 / policy.budget_per_min


def idle(in_flight: float, capacity: float, policy: WarmPolicy) -> bool:
    """True when the pool's load (in-flight requests / the requests it serves at once) is below
    ``idle_load``; a pool with no capacity is never idle."""
    return capacity > 0 and in_flight / capacity < policy.idle_load
