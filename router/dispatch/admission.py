"""Admission by load (pure): which priorities a pool still takes when its replicas are full.

Pressure of one replica: 0 = has room; 1 = saturated (a fresh scrape shows at least
``queue_limit`` waiting requests or a hot GPU, or the router has ``max_inflight`` open requests
to it); 2 = overloaded (twice those limits). A pool's pressure is its least-pressed eligible
replica's. Shedding order: P2 is refused from pressure 1, P1 from pressure 2, P0 never
(it is forwarded and waits in the replica's queue).
"""

from __future__ import annotations

from collections.abc import Sequence

from router.dispatch.choice import ReplicaView, Weights, fresh, hot


def replica_pressure(view: ReplicaView, queue_limit: int, max_inflight: int | None, weights: Weights) -> int:
    """0 (room), 1 (saturated) or 2 (overloaded) for one replica; see the module docstring."""
    level = 0
    if max_inflight is not None:
        level = 2 if view.inflight >= 2 * max_inflight else 1 if view.inflight >= max_inflight else 0
    if fresh(view, weights):
        waiting = (view.signals.waiting or 0.0) if view.signals is not None else 0.0
        scraped = 2 if waiting >= 2 * queue_limit else 1 if waiting >= queue_limit or hot(view, weights) else 0
        level = max(level, scraped)
    return level


def pool_pressure(views: Sequence[ReplicaView], queue_limit: int, max_inflight: int | None, weights: Weights) -> int:
    """The pressure of a pool = that of its least-pressed replica (0 for an empty pool)."""
    return min((replica_pressure(v, queue_limit, max_inflight, weights) for v in views), default=0)


def sheds(priority: str, pressure: int) -> bool:
    """True if a request of ``priority`` (P0 | P1 | P2) is refused at pool ``pressure``."""
    if priority == "P2":
        return pressure >= 1
    if priority == "P1":
        return pressure >= 2
    return False
