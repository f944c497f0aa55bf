"""Replicas reserved for long prompts (pure): which lane of a pool a request goes to.

A pool's replicas are in one of two lanes by their ``role`` (``ReplicaSpec.role``, a static
replica's ``role: long`` or an EndpointSlice label, ``PROMPTEDGE_ROUTER_K8S_ROLE_LABEL``):
``normal`` (default) or ``long``. A request's own lane is ``long`` when its prompt is in the
``long`` size class (``SIZE_THRESHOLDS``), else ``normal``. Why reserve: a long prefill stalls
every sequence batched with it on the same replica (vLLM schedules prefill chunks into the
running batch), so short interactive requests get their TTFT back when long prompts run
elsewhere; the reserved replicas may also be the ones with a larger ``max_model_len``.

Decision, on the replicas that may take a request now, each with its admission pressure
(0 room, 1 saturated, 2 overloaded; ``router.dispatch.admission.replica_pressure``):

- a long prompt goes to the long lane whenever it has an eligible replica, even a saturated
  one (it waits there, or is shed by priority: the reservation protects the normal lane); only
  when no long replica is eligible (none, down, draining, circuit open) it goes to the normal lane;
- a short or medium prompt goes to the normal lane unless that lane's least-pressed replica is
  more pressed than the long lane's (all normal replicas saturated while a long one has room),
  or the normal lane has no eligible replica; then it borrows the long lane.

The pressure returned with the lane is what admission sheds by (so a long prompt is shed when
the long lane is full, not admitted because the normal lane has room). A pool without long
replicas has one lane and behaves exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

NORMAL = "normal"
LONG = "long"


class Lane(NamedTuple):
    """The lane chosen (``normal`` | ``long``) and its pressure (min over its replicas)."""

    name: str
    pressure: int


def own_lane(size: str) -> str:
    """The lane a request of prompt size class ``size`` (short | medium | long) belongs to."""
    return LONG if size == LONG else NORMAL


def choose(own: str, pressures: Mapping[str, Sequence[int]]) -> Lane | None:
    """The lane for a request whose own lane is ``own``, given the pressures of the eligible
    replicas of each lane (``{"normal": [0, 2], "long": [1]}``; a missing or empty lane has no
    eligible replica). None when no lane has one. See the module docstring for the rules."""
    if own == LONG and pressures.get(LONG):
        return Lane(LONG, min(pressures[LONG]))
    options = [(min(values), name != own, name) for name, values in pressures.items() if values]
    if not options:
        return None
    pressure, _, name = min(options)  # least pressed; on a tie the request's own lane
    return Lane(name, pressure)


def readiness(members: Iterable[tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """Replica and ready-replica counts per lane of one pool, from each replica's (role, ready):
    ``{"normal": {"replicas": 2, "ready": 2}, "long": {"replicas": 1, "ready": 0}}``. A lane
    without replicas is absent. A lane with replicas and none ready loses its reservation (long
    prompts go to the normal lane, or short ones crowd the long lane): ``/health`` says degraded."""
    counts: dict[str, dict[str, int]] = {}
    for role, ready in members:
        lane = counts.setdefault(role, {"replicas": 0, "ready": 0})
        lane["replicas"] += 1
        lane["ready"] += ready
    return counts
