"""What would have happened had the forecaster been in control, from what advisory mode saw (pure).

Inputs are per-minute arrays on one grid (minute ``m`` = ``start + 60 m``): the forecaster's
desired replicas (its decisions, held until the next one), the Deployment's Ready replicas
and its ``spec.replicas`` (what the cluster did), and the demand (demand unit per second).
NaN marks a minute whose value is unknown; an unknown value is never replaced by a guess.

The model of "what would have happened" (stated in every report, :class:`Model`):

- a scale-up decided in minute ``m`` is Ready from minute ``m + lead_min``, ``lead_min`` =
  ceil(lead time / 60 s), the lead time being the warm-up the forecaster measured from the
  Deployment's pods plus its actuation delay (what it planned with);
- a scale-down takes effect at once, warming replicas go first, newest first (the
  ReplicaSet controller deletes not-ready Pods before Ready ones);
- one Ready replica serves ``capacity_per_replica`` demand per second; a minute is
  under-provisioned when its demand is above Ready replicas x capacity;
- an allocated replica (Ready or warming) holds ``gpus_per_replica`` GPUs.

This is the model of the closed loop's offline emulation (``sim/loop/whatif.py``; the two
agree minute for minute, tests/forecaster/test_advisory_whatif.py), restated here because the
forecaster imports nothing of ``sim``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Model:
    """The what-if's assumptions: capacity_per_replica (demand unit per s one Ready replica
    serves), lead_s (decision -> Ready, s), gpus_per_replica."""

    capacity_per_replica: float
    lead_s: float
    gpus_per_replica: float = 1.0

    @property
    def lead_min(self) -> int:
        """Minutes from a scale-up decision to its replicas being Ready (ceil of lead_s / 60)."""
        return max(0, math.ceil(self.lead_s / 60.0 - 1e-9))


def emulate(initial: int, desired: list[int], lead_min: int) -> tuple[list[int], list[int]]:
    """The Deployment under ``desired`` (one decision per minute) starting with ``initial``
    Ready replicas -> (ready, warming) per minute, each shape (n,). Raises ValueError on a
    negative count."""
    if initial < 0 or lead_min < 0 or any(d < 0 for d in desired):
        raise ValueError("replica counts and lead_min must be >= 0")
    ready = initial
    pending: list[list[int]] = []  # [minute it becomes Ready, count], oldest first
    ready_out: list[int] = []
    warming_out: list[int] = []
    for minute, want in enumerate(desired):
        ready += sum(count for at, count in pending if at <= minute)
        pending = [item for item in pending if item[0] > minute]
        have = ready + sum(count for _, count in pending)
        if want > have:
            if lead_min == 0:
                ready += want - have
            else:
                pending.append([minute + lead_min, want - have])
        drop = max(0, have - want)
        while drop and pending:  # the newest warming replicas go first
            cut = min(drop, pending[-1][1])
            pending[-1][1] -= cut
            drop -= cut
            if pending[-1][1] == 0:
                pending.pop()
        ready -= drop
        ready_out.append(ready)
        warming_out.append(sum(count for _, count in pending))
    return ready_out, warming_out


def hold_forward(values: FloatArray, max_age: int | None = None) -> FloatArray:
    """Each NaN minute takes the last known value before it, at most ``max_age`` minutes old
    (None: any age); minutes before the first known value stay NaN. Shape kept."""
    out = values.astype(float).copy()
    last, age = math.nan, 0
    for i, value in enumerate(out):
        if math.isnan(value):
            age += 1
            if not math.isnan(last) and (max_age is None or age <= max_age):
                out[i] = last
        else:
            last, age = float(value), 0
    return out


def _events(series: FloatArray) -> dict[str, int]:
    """Scale events of a replica series: changes between consecutive known minutes, each way."""
    known = series[~np.isnan(series)]
    steps = np.diff(known)
    return {"up": int((steps > 0).sum()), "down": int((steps < 0).sum())}


@dataclass(frozen=True)
class Outcome:
    """One side of the comparison over the scored minutes. None: could not be known."""

    under_provisioned_minutes: int | None
    replica_minutes: float | None
    gpu_hours: float | None
    scale_up_events: int | None
    scale_down_events: int | None

    def to_json(self) -> dict[str, float | int | None]:
        """The fields as a JSON object (None stays null)."""
        return {
            "under_provisioned_minutes": self.under_provisioned_minutes,
            "replica_minutes": self.replica_minutes,
            "gpu_hours": self.gpu_hours,
            "scale_up_events": self.scale_up_events,
            "scale_down_events": self.scale_down_events,
        }


@dataclass(frozen=True)
class WhatIf:
    """The comparison: ``forecaster`` (had it been in control) and ``cluster`` (what happened),
    the per-minute series behind them (lists, NaN where unknown; ``whatif_ready`` and
    ``whatif_allocated`` are NaN before the first minute the emulation could start), the
    minutes scored and what could not be known (``unknown``, one sentence each)."""

    forecaster: Outcome
    cluster: Outcome
    minutes: int
    scored_minutes: int
    unknown: list[str]
    whatif_ready: FloatArray
    whatif_allocated: FloatArray


def compare(desired: FloatArray, ready: FloatArray, spec: FloatArray, demand: FloatArray, model: Model) -> WhatIf:
    """Compare the forecaster's decisions with what the cluster did, minute by minute.

    desired, ready, spec, demand: shape (n,), NaN where unknown (desired and ready already held
    forward over the gaps the caller accepts). The emulation starts at the first minute with
    both a decision and a Ready count, from that Ready count. Under-provisioned minutes are
    counted on the minutes where the demand, the Ready count and the what-if are all known, the
    same minutes for both sides; replica-minutes over the same minutes (the cluster's from
    ``spec.replicas``: allocated, warming included, as the what-if's). Raises ValueError when
    the shapes differ or a model number is not positive."""
    n = desired.shape[0]
    if not (ready.shape == spec.shape == demand.shape == (n,)):
        raise ValueError("desired, ready, spec and demand need one value per minute each")
    if model.capacity_per_replica <= 0 or model.lead_s < 0 or model.gpus_per_replica <= 0:
        raise ValueError("capacity and GPUs per replica must be > 0 and the lead time >= 0")
    unknown: list[str] = []
    whatif_ready = np.full(n, np.nan)
    whatif_allocated = np.full(n, np.nan)
    both = np.flatnonzero(~np.isnan(desired) & ~np.isnan(ready))
    f_events = {"up": 0, "down": 0}
    if n == 0:
        unknown.append("the window holds no minute")
    elif np.isnan(desired).all():
        unknown.append("no decision recorded in the window: what the forecaster would have done")
    if n and np.isnan(ready).all():
        unknown.append("no Ready replica count recorded in the window: what the cluster had Ready")
    if both.size:
        first = int(both[0])
        wanted = [int(round(v)) for v in hold_forward(desired[first:])]
        r, w = emulate(int(round(ready[first])), wanted, model.lead_min)
        # the first decision counts against the replicas the emulation started from
        f_events = _events(np.asarray([round(ready[first]), *wanted], dtype=float))
        whatif_ready[first:] = r
        whatif_allocated[first:] = np.asarray(r, dtype=float) + np.asarray(w, dtype=float)
    if n and np.isnan(demand).all():
        unknown.append("no demand known in the window: under-provisioned minutes")
    scored = ~np.isnan(demand) & ~np.isnan(ready) & ~np.isnan(whatif_ready)
    count = int(scored.sum())
    cap = model.capacity_per_replica
    if count:
        forecaster_under: int | None = int((whatif_ready[scored] * cap < demand[scored]).sum())
        cluster_under: int | None = int((ready[scored] * cap < demand[scored]).sum())
    else:
        forecaster_under = cluster_under = None
    costed = ~np.isnan(whatif_allocated) & ~np.isnan(spec)
    if costed.any():
        f_rm: float | None = float(whatif_allocated[costed].sum())
        c_rm: float | None = float(spec[costed].sum())
    else:
        f_rm = c_rm = None
        if n:
            unknown.append("no minute with both a what-if and spec.replicas: replica-minutes")
    c_events = _events(spec)
    forecaster = Outcome(
        forecaster_under,
        f_rm,
        None if f_rm is None else f_rm * model.gpus_per_replica / 60.0,
        f_events["up"] if both.size else None,
        f_events["down"] if both.size else None,
    )
    spec_known = bool((~np.isnan(spec)).any())
    cluster = Outcome(
        cluster_under,
        c_rm,
        None if c_rm is None else c_rm * model.gpus_per_replica / 60.0,
        c_events["up"] if spec_known else None,
        c_events["down"] if spec_known else None,
    )
    return WhatIf(forecaster, cluster, n, count, unknown, whatif_ready, whatif_allocated)
