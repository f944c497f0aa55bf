"""The closed loop's predictive policy offline: actuation emulated per minute, and scored (pure).

``bench/loop_whatif.py`` calls the forecaster's real ``run_once`` once per simulated minute on
the loop's segment and history; this module stands in for the rest of the loop, counts only:

- :func:`forwarded_counts`: the requests per minute that miss the cache (binomial thinning of
  the segment's arrivals);
- :func:`emulate`: the Deployment's replicas after each decision. A scale-up is Ready
  ``lead_min`` minutes after its decision (actuation delay + warm-up + readiness); a scale-down
  takes effect at once and removes warming replicas first, newest first (as the ReplicaSet
  controller deletes not-ready Pods before ready ones);
- :func:`score`: replica-minutes allocated, counted from the decision (a warming replica holds
  its GPU), minutes with fewer Ready replicas than needed, scale events.

Minute ``m`` is simulated minute m of the segment (0-based); the decision of minute ``m`` is
made at its start and sees minutes before it. No latency model and no SLO: whether fewer
replicas would still meet the TTFT SLO only the loop can say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def forwarded_counts(offsets_s: Sequence[float], minutes: int, miss_ratio: float, seed: int) -> np.ndarray:
    """Requests per minute that reach the GPUs: the arrivals (``offsets_s``, seconds from the
    segment start) counted per minute, each kept with probability ``miss_ratio`` (a cache
    miss). Returns int counts, shape (minutes,); arrivals at or after ``minutes`` x 60 s are
    dropped."""
    if not 0.0 <= miss_ratio <= 1.0:
        raise ValueError(f"miss_ratio must be in [0, 1], got {miss_ratio}")
    idx = (np.asarray(offsets_s, dtype=float) // 60).astype(int)
    arrivals = np.bincount(idx[(idx >= 0) & (idx < minutes)], minlength=minutes)
    return np.random.default_rng(seed).binomial(arrivals, miss_ratio)


@dataclass(frozen=True)
class Timeline:
    """Replicas per minute, each shape (n,) as lists of ints: ``desired`` (the decision,
    ``spec.replicas``), ``ready`` (serving during the minute), ``warming`` (decided, not yet
    Ready). ``ready[m] + warming[m] == desired[m]``: every decided replica holds a GPU."""

    desired: list[int]
    ready: list[int]
    warming: list[int]


def emulate(initial: int, desired: Sequence[int], lead_min: int) -> Timeline:
    """The Deployment under ``desired`` (one decision per minute, shape (n,)), starting with
    ``initial`` Ready replicas. A step up of k at minute m: k replicas Ready from minute
    m + ``lead_min``; a step down of k at minute m: the k newest warming replicas go first,
    then Ready ones, at once (Ready from minute m on is the smaller count)."""
    if initial < 0 or lead_min < 0 or any(d < 0 for d in desired):
        raise ValueError("replica counts and lead_min must be >= 0")
    ready = initial
    pending: list[list[int]] = []  # [ready_minute, count], oldest first
    out = Timeline([], [], [])
    for minute, want in enumerate(desired):
        ready += sum(c for at, c in pending if at <= minute)
        pending = [[at, c] for at, c in pending if at > minute]
        have = ready + sum(c for _, c in pending)
        if want > have and lead_min == 0:
            ready += want - have
        elif want > have:
            pending.append([minute + lead_min, want - have])
        drop = max(0, have - want)
        while drop and pending:
            cut = min(drop, pending[-1][1])
            pending[-1][1] -= cut
            drop -= cut
            if pending[-1][1] == 0:
                pending.pop()
        ready -= drop
        out.desired.append(int(want))
        out.ready.append(ready)
        out.warming.append(sum(c for _, c in pending))
    return out


@dataclass(frozen=True)
class Score:
    """One policy's cost and shortfall over the segment.

    ``replica_minutes``: sum over minutes of allocated replicas (ready + warming);
    ``gpu_hours``: the same / 60 (1 GPU a replica); ``under_need_minutes``: minutes whose Ready
    replicas are fewer than ``need``; ``under_demand_minutes``: minutes whose Ready replicas x
    capacity are below that minute's forwarded rate (the loop's ``under_provisioned_minutes``,
    on counts); ``scale_events``: changes of the desired count (the first against the initial
    count); ``need_replica_minutes``: sum of ``need``, what a policy knowing every window's
    rate and without warm-up would allocate."""

    replica_minutes: int
    gpu_hours: float
    under_need_minutes: int
    under_demand_minutes: int
    scale_events: int
    need_replica_minutes: int


def score(
    initial: int, timeline: Timeline, need: Sequence[int], forwarded_rps: Sequence[float], capacity_rps: float
) -> Score:
    """Score ``timeline`` (n minutes) against ``need`` (replicas, shape (n,)) and
    ``forwarded_rps`` (requests/s reaching the GPUs per minute, shape (n,)); ``capacity_rps``:
    requests/s one replica serves within the SLO."""
    n = len(timeline.desired)
    if len(need) != n or len(forwarded_rps) != n:
        raise ValueError(f"need {len(need)} and forwarded_rps {len(forwarded_rps)} must have {n} minutes")
    allocated = sum(r + w for r, w in zip(timeline.ready, timeline.warming))
    before = [initial, *timeline.desired[:-1]]
    return Score(
        replica_minutes=allocated,
        gpu_hours=allocated / 60.0,
        under_need_minutes=sum(int(r < k) for r, k in zip(timeline.ready, need)),
        under_demand_minutes=sum(int(r * capacity_rps < f) for r, f in zip(timeline.ready, forwarded_rps)),
        scale_events=sum(int(a != b) for a, b in zip(before, timeline.desired)),
        need_replica_minutes=int(sum(need)),
    )
