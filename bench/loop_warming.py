"""Predictive cache warming in the closed loop, against the same run without it (issue 34 item 4).

    PYTHONPATH=. python bench/loop_warming.py [--hours 0.75] [--start-hour 311] [--seed 0]
        [--runs predictive:off,predictive:on,fixed_peak:off,fixed_peak:oracle]
        [--warming-set KEY=VALUE ...] [--json out/loop_warming.json] [--from-json out/loop_warming.json]

Runs ``python -m sim loop``'s ``run_loop`` once per run on the same segment and seed (ServeGen
m-large, warm-up 300 simulated s, l4, as bench/closed_loop.py): the real router, Redis, control
plane and stand-in node. A run is ``POLICY:WARMING``:

- ``off``: no warming (the product's default);
- ``on``: the router warms (``LoopConfig.warming``, the product's ``WarmingSettings`` defaults
  unless ``--warming-set`` names others, ``tick_s`` 15 simulated s) on the forecast the
  forecaster daemon publishes (predictive policy);
- ``oracle``: the same warmer, but the forecast it reads is the segment's true window rates,
  published by this bench every 5 simulated s (``OracleForecast``) for a pool no forecaster
  runs for (the fixed policies): what warming would do with a forecast that sees the peak.

Prompt recurrence: an assumption, stated. The loop's prompt mix (sim/client/questions.py)
repeats earlier prompts *of the replayed segment* only; it has no days before it, so the
warmer, which warms the prompts counted in the same time-of-day slot on earlier days, finds
nothing to warm (0 candidates) whatever the forecast. Every run here, off runs included, starts
with popularity history written as if **the replayed day's prompts had been asked at the same
time of day on each of the ``history_days`` (7) days before** (``RecurringDay``: each planned
request counted through the product's ``Popularity.record`` at its simulated time minus d days,
d = 1..7): the most favourable recurrence there is (every prompt recurs, one-offs included), so
a warming that does not pay here does not pay with less recurrence either.

Measured per run (simulated minutes; JSON ``runs[name]``): the peak (``peak_minutes``: the
minutes of the segment's trace windows whose rate is >= 0.9 x the busiest window's, the same
for every run) and the ``pre_minutes`` (the ``lead_s`` = 15 minutes before the first peak
minute): requests, hit ratio, client misses, replica generations (requests the replicas
finished, from their ``vllm:request_queue_time_seconds`` counts: client misses and warm
generations alike) and GPU-seconds = generations x 1 / capacity_rps (what a generation costs
a replica serving at its SLO capacity, as in bench/cache_warming.py); warm generations
(attempted / stored / failed, the router's counter), warm entries left (``warm:mark`` keys at
the end), of which requested in the segment (hit) and never requested (wasted); SLO attainment,
TTFT p99, GPU-hours (Pods held). ``vs_off``: per warming run against the off run of its policy,
GPU-seconds moved out of the peak (off - on) and into the minutes before it (on - off).

Takes ~7 wall minutes a run at 0.75 h (417-423 s on the 2-core machine); run under ``flock /tmp/closed-loop.lock``.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis
import typer

from cache import CacheRequest
from cache.keys import exact_key
from cache.settings import CacheSettings
from cache.types import CacheControl
from cache.warming.plan import slot_of
from cache.warming.popularity import _RECORD_LUA, group_tag, mark_key, recipe_for, slot_keys, slots_key
from cache.warming.settings import WarmingSettings
from opskit import FORECAST_KEY, forecast_document
from sim.cli import warming_fields
from sim.client.replay import PlannedRequest
from sim.loop import LoopConfig, run_loop, write_json
from sim.loop.run import prepare

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
MODES = ("off", "on", "oracle")
PEAK_SHARE = 0.9  # a peak minute's window rate is at least this share of the busiest window's
ORACLE_EVERY_SIM_S = 5.0
HORIZON_MIN = 60


PREFIX = CacheSettings().key_prefix  # the router's: the loop sets no PROMPTEDGE_CACHE_KEY_PREFIX


def scope_request(body: dict[str, Any], pool: str) -> tuple[CacheRequest, str]:
    """The CacheRequest and exact key the router makes of a replayed body (no API key: tenant
    ``default``, the anonymous policy ``exact``, router/forward/service.py ``_handle``)."""
    req = CacheRequest("chat.completions", body, "default", CacheControl(semantic=False), pool, "default")
    return req, exact_key(PREFIX, req.endpoint, req.body, req.tenant, None, req.pool)


class RecurringDay:
    """The bench's hooks (``LoopConfig.hooks``): the recurring-day history before the replay, the
    oracle forecast during it (runs named ``oracle``), the warm entries' fate after it."""

    def __init__(self, model: str, settings: WarmingSettings, speedup: float, oracle: dict[str, Any] | None) -> None:
        self.model = model
        self.settings = settings
        self.speedup = speedup
        self.oracle = oracle  # {"window_rps", "window_s", "capacity_rps"} or None
        self.keys: set[str] = set()
        self.history_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def before_replay(
        self, redis_url: str, sim_start: float, replay_at: float, plan: list[PlannedRequest], policy: str
    ) -> None:
        began = time.time()
        self.keys = self._write_history(redis_url, sim_start, plan)
        self.history_s = round(time.time() - began, 2)
        if self.oracle is not None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._publish, args=(redis_url, sim_start, replay_at), name="oracle-forecast", daemon=True
            )
            self._thread.start()

    def _write_history(self, redis_url: str, sim_start: float, plan: list[PlannedRequest]) -> set[str]:
        """Count every planned request on each earlier day, as ``Popularity.record`` does (its
        own script and arguments), pipelined: one awaited call per request took 43 s for 21,000
        on this machine, and the replay waits for it."""
        s = self.settings
        keys: set[str] = set()
        slots: set[str] = set()
        counted = []  # (offset s, key, recipe JSON, tenant tag) of each request the product would count
        for req in plan:
            creq, key = scope_request(req.body, self.model)
            keys.add(key)
            recipe = recipe_for(PREFIX, creq, key)
            text = None if recipe is None else recipe.to_json()
            if text is not None and len(text.encode()) <= s.max_recipe_bytes:  # else not counted
                counted.append((req.at_s * self.speedup, key, text, group_tag(creq.label)))
        with redis.Redis.from_url(redis_url) as r:
            script = r.register_script(_RECORD_LUA)
            pipe = r.pipeline(transaction=False)
            for day in range(1, s.history_days + 1):
                for i, (offset, key, text, tag) in enumerate(counted):
                    d, slot = slot_of(sim_start + offset - day * 86400, s.slot_s)
                    skeys = slot_keys(PREFIX, self.model, d, slot)
                    slots.add(skeys[1])
                    script(keys=skeys, args=[key, text, s.history_ttl_s, s.keep_per_slot, tag], client=pipe)
                    if i % 500 == 499:
                        pipe.execute()
            if slots:
                pipe.sadd(slots_key(PREFIX), *slots)
            pipe.execute()
        return keys

    def _publish(self, redis_url: str, sim_start: float, replay_at: float) -> None:
        """Every 5 simulated s: the true window rate of each simulated minute from now to an hour
        ahead (the last window's after the segment), as the forecaster's document."""
        assert self.oracle is not None
        rates, window_s = self.oracle["window_rps"], self.oracle["window_s"]
        with redis.Redis.from_url(redis_url) as r:
            while not self._stop.is_set():
                now = sim_start + (time.time() - replay_at) * self.speedup
                first = math.floor(now / 60) * 60
                points = []
                for m in range(HORIZON_MIN + 1):
                    t = first + m * 60
                    w = min(len(rates) - 1, max(0, int((t - sim_start + self.oracle["offset_s"]) // window_s)))
                    points.append((t, rates[w]))
                doc = forecast_document(self.model, now, self.oracle["capacity_rps"], points, points, "requests")
                r.set(FORECAST_KEY.format(pool=self.model), json.dumps(doc))
                self._stop.wait(ORACLE_EVERY_SIM_S / self.speedup)

    def after_replay(self, redis_url: str, router_url: str, policy: str) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with redis.Redis.from_url(redis_url) as r:
            marks = {k.decode() for k in r.scan_iter(f"{PREFIX}:warm:mark:*", count=1000)}
        requested = {mark_key(PREFIX, k) for k in self.keys}
        return {
            "history_write_wall_s": self.history_s,
            "warm_entries_left": len(marks),
            "warm_entries_requested": len(marks & requested),
            "warm_entries_never_requested": len(marks - requested),
        }


def peak_and_pre(
    window_rps: list[float], window_s: float, offset_s: float, minutes: int, lead_min: int
) -> dict[str, list[int]]:
    """The peak minutes (their trace window's rate >= PEAK_SHARE x the busiest's) and the
    ``lead_min`` minutes before the first of them (pure). ``offset_s``: the segment's start
    within its first window."""
    top = max(window_rps)
    window = [min(len(window_rps) - 1, int((m * 60 + offset_s) // window_s)) for m in range(minutes)]
    peak = [m for m in range(minutes) if window_rps[window[m]] >= PEAK_SHARE * top]
    pre = list(range(max(0, peak[0] - lead_min), peak[0])) if peak else []
    return {"peak": peak, "pre": pre}


def minutes_sum(rows: list[dict[str, Any]], minutes: list[int], gen_gpu_s: float) -> dict[str, Any]:
    """Requests, hits, hit ratio, client misses, replica generations and GPU-seconds of the
    given minutes of a run's per-minute rows (pure)."""
    picked = [rows[m] for m in minutes if m < len(rows)]
    requests = sum(round(r["demand_rps"] * 60) for r in picked)
    misses = sum(round(r["forwarded_rps"] * 60) for r in picked)
    generations = sum((r.get("queue_time_s") or {}).get("requests") or 0 for r in picked)
    return {
        "requests": requests,
        "hits": requests - misses,
        "hit_ratio": round((requests - misses) / requests, 4) if requests else None,
        "client_misses": misses,
        "generations": generations,
        "gpu_s": round(generations * gen_gpu_s, 1),
    }


def measure(run: dict[str, Any], windows: dict[str, list[int]], gen_gpu_s: float) -> dict[str, Any]:
    """A run's row (module doc) from its loop report (pure)."""
    rows = run["minutes"]
    warm = run.get("warming") or {}
    gens = warm.get("generations", {})
    hooks = run.get("hooks", {})
    return {
        "peak": minutes_sum(rows, windows["peak"], gen_gpu_s),
        "pre": minutes_sum(rows, windows["pre"], gen_gpu_s),
        "all": minutes_sum(rows, list(range(len(rows))), gen_gpu_s),
        "warm_attempted": gens.get("attempted", 0),
        "warm_stored": gens.get("stored", 0),
        "warm_failed": gens.get("failed", 0),
        "warm_hits": warm.get("warm_hits", 0),
        "warm_entries_left": hooks.get("warm_entries_left"),
        "warm_hit_entries": hooks.get("warm_entries_requested"),
        "warm_wasted": hooks.get("warm_entries_never_requested"),
        "slo_attainment": run["slo_attainment"],
        "ttft_p99_s": run["ttft_s"]["p99"],
        "gpu_hours": run["gpu_hours"],
        "hit_ratio": run["hit_ratio"],
        "failed": run["failed_requests"],
        "models": run.get("models"),
        "invalid": run.get("invalid"),
        "wall_s": run.get("wall_s"),
    }


def compare(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each warming run against the off run of its policy: GPU-s out of the peak, into the
    minutes before, peak hit ratio change (pure)."""
    out = {}
    for name, row in rows.items():
        policy, mode = name.split(":")
        base = rows.get(f"{policy}:off")
        if mode == "off" or base is None:
            continue
        out[name] = {
            "peak_gpu_s_saved": round(base["peak"]["gpu_s"] - row["peak"]["gpu_s"], 1),
            "pre_gpu_s_added": round(row["pre"]["gpu_s"] - base["pre"]["gpu_s"], 1),
            "total_gpu_s_added": round(row["all"]["gpu_s"] - base["all"]["gpu_s"], 1),
            "peak_hit_ratio": [base["peak"]["hit_ratio"], row["peak"]["hit_ratio"]],
            "peak_client_misses": [base["peak"]["client_misses"], row["peak"]["client_misses"]],
        }
    return out


def render(doc: dict[str, Any]) -> str:
    head = (
        "| run | peak hit ratio | peak misses | peak GPU-s | pre GPU-s | warm att./stored | "
        "warm hit / wasted | SLO att. | TTFT p99 s | GPU-h |"
    )
    lines = [head, "|" + "---|" * 10]
    for name, r in doc["runs"].items():
        lines.append(
            f"| {name} | {r['peak']['hit_ratio']} | {r['peak']['client_misses']} | {r['peak']['gpu_s']} | "
            f"{r['pre']['gpu_s']} | {r['warm_attempted']}/{r['warm_stored']} | "
            f"{r['warm_hit_entries']} / {r['warm_wasted']} | {r['slo_attainment']} | {r['ttft_p99_s']} | "
            f"{r['gpu_hours']} |"
        )
    for name, c in doc["vs_off"].items():
        lines.append(
            f"{name} vs off: peak GPU-s saved {c['peak_gpu_s_saved']}, pre-peak GPU-s added "
            f"{c['pre_gpu_s_added']}, total {c['total_gpu_s_added']:+}, peak hit ratio "
            f"{c['peak_hit_ratio'][0]} -> {c['peak_hit_ratio'][1]}"
        )
    w = doc["windows"]
    lines.append(f"peak minutes {w['peak'][0]}-{w['peak'][-1]}, pre-peak minutes {w['pre'][0]}-{w['pre'][-1]}")
    return "\n".join(lines)


def build_doc(
    reports: dict[str, dict[str, Any]],
    segment: dict[str, Any],
    settings: WarmingSettings,
    capacity_rps: float,
    run: dict[str, Any],
) -> dict[str, Any]:
    """The bench's document of the runs done so far (pure)."""
    minutes = len(next(iter(reports.values()))["minutes"])
    windows = peak_and_pre(
        segment["window_rps"], segment["window_s"], segment["offset_s"], minutes, settings.lead_s // 60
    )
    rows = {name: measure(r, windows, 1.0 / capacity_rps) for name, r in reports.items()}
    return {
        "config": {
            **run,
            "capacity_rps": capacity_rps,
            "gen_gpu_s": round(1.0 / capacity_rps, 3),
            "warming": settings.model_dump(),
            "prompt_recurrence": "the replayed day's prompts asked at the same time of day on each of the 7 days before",
        },
        "segment": segment,
        "windows": windows,
        "runs": rows,
        "vs_off": compare(rows),
        "loop": reports,
    }


def main(
    hours: float = typer.Option(0.75, help="Segment length, hours."),
    start_hour: float = typer.Option(311.0, help="Segment start, hours from the trace start (a ramp to a peak)."),
    seed: int = 0,
    speedup: float = 7.0,
    capacity_rps: float = typer.Option(0.381, help="l4 capacity within the SLO (sim/README.md, Sizing)."),
    runs: str = "predictive:off,predictive:on,fixed_peak:off,fixed_peak:oracle",
    json_path: Path = typer.Option(Path("out/loop_warming.json"), "--json"),
    from_json: Path | None = typer.Option(None, help="Recompute the table from a saved run (no loop)."),
    log_dir: Path = Path("out/loop-warming"),
    warming_set: list[str] = typer.Option([], help="A WarmingSettings field KEY=VALUE (JSON) for the on/oracle runs."),
) -> None:
    if from_json is not None:
        typer.echo(render(json.loads(from_json.read_text())))
        return
    fields = warming_fields("on", warming_set) or {}
    settings = WarmingSettings(**(fields | {"enabled": True}))
    base = LoopConfig(
        trace=DATA / "traces" / "servegen-m-large",
        start_hour=start_hour,
        hours=hours,
        speedup=speedup,
        seed=seed,
        capacity_rps=capacity_rps,
    )
    names = [r.strip() for r in runs.split(",") if r.strip()]
    for name in names:
        policy, _, mode = name.partition(":")
        if mode not in MODES:
            raise typer.BadParameter(f"{name}: warming must be one of {MODES}")
        if mode == "oracle" and policy not in ("fixed_peak", "fixed_mean"):
            raise typer.BadParameter(f"{name}: an oracle forecast needs a fixed policy (no forecaster publishing)")
    prep = prepare(replace(base, progress=False))  # the segment every run replays (deterministic)
    seg = prep.segment
    first = int(seg.start_s // seg.step_s)
    segment = {
        "start_hour": round(seg.start_s / 3600, 3),
        "requests": len(seg.requests),
        "window_rps": [round(r, 4) for r in seg.window_rps],
        "window_s": seg.step_s,
        "offset_s": seg.start_s - first * seg.step_s,
    }
    reports: dict[str, dict[str, Any]] = {}
    began = time.time()
    for name in names:
        policy, mode = name.split(":")
        oracle = None
        if mode == "oracle":
            oracle = {
                "window_rps": list(seg.window_rps),
                "window_s": seg.step_s,
                "offset_s": segment["offset_s"],
                "capacity_rps": capacity_rps * prep.replicas[policy],
            }
        hooks = RecurringDay(base.model, settings, speedup, oracle)
        cfg = replace(
            base,
            policies=(policy,),
            warming=None if mode == "off" else fields,
            hooks=hooks,
            log_dir=log_dir / name.replace(":", "-"),
        )
        reports[name] = run_loop(cfg)["policies"][policy]
        typer.echo(f"{name}: done in {reports[name]['wall_s']} s", err=True)
        # after every run: a later run's failure must not cost the ones done
        doc = build_doc(
            reports,
            segment,
            settings,
            capacity_rps,
            {"hours": hours, "start_hour": start_hour, "seed": seed, "speedup": speedup},
        )
        doc["wall_s"] = round(time.time() - began, 1)
        write_json(doc, json_path)
    typer.echo(render(doc))
    typer.echo(f"written to {json_path}")


if __name__ == "__main__":
    typer.run(main)
