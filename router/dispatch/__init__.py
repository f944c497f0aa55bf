"""Dispatch: which replica of a pool a request goes to, decided by pure functions over plain
snapshots of replica state (no I/O: the import-linter contract "pure cores do no I/O" covers
every module of this package).

Public surface (the scoring and the policies, ``choice``)::

    view = ReplicaView(key=url, inflight=..., signals=..., ...)  # one replica, at decision time
    chosen = pick(views, policy, Context(...), weights)  # round_robin ... prefix_aware, predicted_ttft
    load = score(view, weights)                          # gpu_load: lower is better

Modules: ``choice`` (the score and the policies), ``signals`` (load signals parsed from a
replica's ``/metrics``), ``speed`` (each replica's learned speed), ``ttft`` (predicted time to
first token, each replica's learned prefill and step speeds), ``prefix_index`` and
``affinity`` (where prompt prefixes went, for prefix-aware dispatch), ``lanes`` (replicas
reserved for long prompts), ``admission`` (which priorities a full pool still takes). The
replicas' runtime state and its I/O (router/fleet/replicas.py, router/fleet/scraper.py, router/fleet/health.py)
feed these from outside.
"""

from router.dispatch.choice import (
    Context,
    ReplicaView,
    Weights,
    estimated_requests,
    fresh,
    hot,
    load_bound,
    pick,
    prefix_scores,
    ring_walk,
    score,
    speed_adjusted,
)

__all__ = [
    "Context",
    "ReplicaView",
    "Weights",
    "estimated_requests",
    "fresh",
    "hot",
    "load_bound",
    "pick",
    "prefix_scores",
    "ring_walk",
    "score",
    "speed_adjusted",
]
