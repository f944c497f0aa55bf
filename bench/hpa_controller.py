"""The reactive baseline: Kubernetes HPA's algorithm on observed load, as a small controller.

    python bench/hpa_controller.py --router http://127.0.0.1:8000 --namespace llm --deployment vllm \
        --kubeconfig KUBECONFIG --target-rps 1.6 [--clock-scale 6] [--min-replicas 1] [--max-replicas 10]

Every ``--sync-s`` (15) simulated seconds it reads the router's ``/metrics``: the requests the
router forwarded to replicas (``promptedge_router_requests_total`` whose ``cache`` label is not a
hit) since the last sync, per simulated second, is the pool's observed load; the Deployment's
``status.readyReplicas`` and ``spec.replicas`` come from the API (scale subresource and
Deployment status). Then, as the HPA controller does (kubernetes.io, "Horizontal Pod
Autoscaling", algorithm details; ``pkg/controller/podautoscaler``):

- per-pod metric = load / ready pods; ratio = metric / target;
- |ratio - 1| <= tolerance (0.1, ``--horizontal-pod-autoscaler-tolerance``) -> keep the current
  replicas; else desired = ceil(ready x ratio); when scaling up, pods not yet ready count as
  load 0 (HPA's rule), i.e. desired = ceil(load / target) over ready + unready pods;
- scale-up limit of the default ``behavior``: at most max(2 x current, current + 4) per 15 s;
- scale-down stabilisation: the highest recommendation of the last 300 s wins; the window is
  seeded with the current replicas at the first sync, as the controller's
  ``recordInitialRecommendation`` does, so a new controller does not scale down during its
  first 300 s (e.g. on the zero load before the traffic starts);
- bounds [min, max]; the scale subresource is written only when the result differs.

All windows are in simulated seconds: ``--clock-scale`` simulated seconds pass per wall second
(the loop's speedup), so a 15 s sync is 15 / scale wall seconds. One JSON line per decision on
stdout. SIGTERM/SIGINT stop it after the current sync.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from types import FrameType

from forecaster.plan import PLANNER_DEFAULTS

HIT_LABELS = frozenset({"hit", "exact", "semantic"})


@dataclass(frozen=True)
class HpaConfig:
    """HPA knobs; times in simulated seconds. ``target``: per-pod load (requests/s) the HPA
    aims at."""

    target: float
    # the predictive planner's bounds, so that a comparison differs in the policy alone
    min_replicas: int = PLANNER_DEFAULTS.min_replicas
    max_replicas: int = PLANNER_DEFAULTS.max_replicas
    tolerance: float = 0.1
    sync_s: float = 15.0
    stabilisation_s: float = 300.0

    def __post_init__(self) -> None:
        if self.target <= 0 or not 1 <= self.min_replicas <= self.max_replicas or self.tolerance < 0:
            raise ValueError("need target > 0, 1 <= min_replicas <= max_replicas, tolerance >= 0")


@dataclass
class HpaState:
    """Recommendations (simulated time, replicas) of the stabilisation window, oldest first;
    ``seeded``: the current replicas were recorded at the first sync."""

    recommendations: deque[tuple[float, int]] = field(default_factory=deque)
    seeded: bool = False


@dataclass(frozen=True)
class Decision:
    """``replicas``: what to write to the scale subresource; ``raw``: before stabilisation and
    bounds; ``reason``: one line."""

    replicas: int
    raw: int
    reason: str


def decide(cfg: HpaConfig, state: HpaState, now_s: float, load_rps: float | None, ready: int, current: int) -> Decision:
    """One HPA sync (pure apart from updating ``state``). ``load_rps``: the pool's observed
    load in requests per simulated second (None: no metric this sync -> hold, as the HPA does
    when metrics are missing); ``ready``: ready pods; ``current``: ``spec.replicas``."""
    if not state.seeded:
        state.recommendations.append((now_s, current))
        state.seeded = True
    if load_rps is None:
        return Decision(current, current, "hold: no metric")
    if ready <= 0:
        # No ready pod to average over: HPA scales up on unready pods' 0 load only when the
        # load needs more than exist; with none ready, size for the whole load.
        raw = max(current, math.ceil(load_rps / cfg.target)) if load_rps > 0 else current
        reason = f"no ready pod, load {load_rps:.2f}/s"
    else:
        ratio = load_rps / ready / cfg.target
        if abs(ratio - 1.0) <= cfg.tolerance:
            raw, reason = current, f"ratio {ratio:.2f} within tolerance {cfg.tolerance}"
        elif ratio > 1.0:
            # Unready pods count as 0 load; if that turns the direction, hold (HPA's rule).
            raw = max(current, math.ceil(load_rps / cfg.target))
            reason = f"ratio {ratio:.2f} over {ready} ready: up"
        else:
            raw = math.ceil(ready * ratio)
            reason = f"ratio {ratio:.2f} over {ready} ready: down"
    up_limit = max(2 * current, current + 4)
    wanted = min(raw, up_limit)
    state.recommendations.append((now_s, wanted))
    while state.recommendations and state.recommendations[0][0] < now_s - cfg.stabilisation_s:
        state.recommendations.popleft()
    stabilised = min(current, max(r for _, r in state.recommendations)) if wanted < current else wanted
    replicas = min(cfg.max_replicas, max(cfg.min_replicas, stabilised))
    if stabilised != wanted:
        reason += f"; stabilised at {stabilised} (highest of the last {cfg.stabilisation_s:.0f} s)"
    return Decision(replicas, raw, reason)


def forwarded_total(metrics_text: str) -> float:
    """Sum of ``promptedge_router_requests_total`` over series naming a replica whose
    ``cache`` label is not a hit: requests the router sent to replicas. Raises ValueError on
    unparsable text."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if (
                sample.name == "promptedge_router_requests_total"
                and sample.labels.get("replica")
                and sample.labels.get("cache", "") not in HIT_LABELS
            ):
                total += sample.value
    return total


class _Stop:
    requested = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True


def run(args: argparse.Namespace) -> int:
    """The controller's loop (I/O shell around :func:`decide`)."""
    import httpx
    from kubernetes import client as k8s
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError as TransportError

    from forecaster.actuate import ActuationConfigError, ActuatorSettings
    from forecaster.actuate.kube import new_api_client

    cfg = HpaConfig(
        target=args.target_rps,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        tolerance=args.tolerance,
        sync_s=args.sync_s,
        stabilisation_s=args.stabilisation_s,
    )
    try:  # the forecaster's client: kubeconfig or in-cluster, no hidden urllib3 retries (the next sync retries)
        api = k8s.AppsV1Api(
            new_api_client(
                ActuatorSettings(
                    mode="kubernetes",
                    namespace=args.namespace,
                    deployment=args.deployment,
                    kubeconfig=args.kubeconfig,
                    context=args.context,
                )
            )
        )
    except ActuationConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = _Stop()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    state = HpaState()
    origin = time.time()
    wall_sync = cfg.sync_s / args.clock_scale
    timeout = max(1.0, wall_sync)  # wall s per call: one sync period, so a silent API server holds no sync long
    last: tuple[float, float] | None = None  # (wall time, forwarded total)
    with httpx.Client(timeout=timeout) as http:
        while not stop.requested:
            tick = time.time()
            sim_now = origin + (tick - origin) * args.clock_scale
            load = None
            try:
                total = forwarded_total(http.get(f"{args.router}/metrics").text)
                if last is not None and tick > last[0]:
                    load = max(0.0, total - last[1]) / ((tick - last[0]) * args.clock_scale)
                last = (tick, total)
            except (httpx.HTTPError, ValueError) as exc:
                print(json.dumps({"t": sim_now, "error": f"metrics: {exc!r}"}), flush=True)
            try:
                dep = api.read_namespaced_deployment(args.deployment, args.namespace, _request_timeout=timeout)
                current = int(dep.spec.replicas or 0)
                ready = int(dep.status.ready_replicas or 0)
                decision = decide(cfg, state, sim_now, load, ready, current)
                if decision.replicas != current:
                    api.patch_namespaced_deployment_scale(
                        args.deployment,
                        args.namespace,
                        {"spec": {"replicas": decision.replicas}},
                        _request_timeout=timeout,
                    )
                print(
                    json.dumps(
                        {
                            "t": round(sim_now, 1),
                            "load_rps": load,
                            "ready": ready,
                            "current": current,
                            "desired": decision.replicas,
                            "reason": decision.reason,
                        }
                    ),
                    flush=True,
                )
            except ApiException as exc:
                print(json.dumps({"t": sim_now, "error": f"kubernetes: {exc.status} {exc.reason}"}), flush=True)
            except TransportError as exc:  # refused, reset, timed out: no answer at all
                print(json.dumps({"t": sim_now, "error": f"kubernetes: {type(exc).__name__}: {exc}"}), flush=True)
            while not stop.requested and time.time() < tick + wall_sync:
                time.sleep(min(0.1, wall_sync))
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--router", required=True, help="router base URL (its /metrics is read)")
    p.add_argument("--namespace", default="default")
    p.add_argument("--deployment", required=True)
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--context", default=None)
    p.add_argument("--target-rps", type=float, required=True, help="per-pod load target, requests/s")
    p.add_argument("--clock-scale", type=float, default=1.0, help="simulated seconds per wall second")
    p.add_argument("--min-replicas", type=int, default=HpaConfig.min_replicas)
    p.add_argument("--max-replicas", type=int, default=HpaConfig.max_replicas)
    p.add_argument("--tolerance", type=float, default=0.1)
    p.add_argument("--sync-s", type=float, default=15.0, help="sync period, simulated s")
    p.add_argument("--stabilisation-s", type=float, default=300.0, help="scale-down window, simulated s")
    args = p.parse_args(argv)
    if args.clock_scale <= 0:
        p.error("--clock-scale must be > 0")
    return args


if __name__ == "__main__":
    sys.exit(run(parse_args(sys.argv[1:])))
