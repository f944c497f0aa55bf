"""The closed loop's predictive policy offline, in seconds: forecaster settings side by side.

    PYTHONPATH=. python bench/loop_whatif.py [--hours 1] [--start-hour H] [--seed 0] [--miss-ratio 0.7]
        [--history sampled|expected] [--lead-min N] [--capacity-rps 0.381]
        [--set KEY=VALUE ...] [--variant 'KEY=VALUE[,KEY=VALUE]' ...] [--json out/loop_whatif.json]

Builds the same segment and history as ``python -m sim loop`` (``sim.loop.run.prepare``: the
m-large ramp by default), draws the forwarded requests of every minute (the segment's arrivals
thinned by ``--miss-ratio``), then for each variant calls the forecaster's real ``run_once``
once per simulated minute, as the daemon does (the loop's settings: capacity per replica,
headroom 0.2, 1..8 replicas, warm-up 300 s, no scale-up cooldown; the model selection kept for
``reselect_s``; the planner state in memory), on counters read as the Redis source reads
them. The Deployment is emulated by ``sim.loop.whatif``: a scale-up Ready ``--lead-min``
minutes after its decision, a scale-down at once, warming replicas first.

``--set KEY=VALUE`` overrides a ForecasterSettings field in every run, the baseline included;
each ``--variant`` is one more run with its overrides on top (several separated by commas;
values are JSON when they parse as JSON, e.g. ``models=["last_value","ets_level"]``).
Prints per variant the replica-minutes allocated (from the decision: warming replicas hold
their GPU), GPU-hours, the ratio to the baseline, minutes with fewer Ready replicas than the
window's forwarded rate needs (capacity x 1.2 headroom), minutes below that minute's
forwarded rate at capacity (the loop's under-provisioned minutes, on counts), the models
chosen and the scale events. Counts only: it has no latency model, so it cannot tell whether
fewer replicas would still meet the TTFT SLO; the loop (bench/closed_loop.py) can.

As the daemon, ForecasterSettings also reads ``PROMPTEDGE_FORECASTER_*`` from the environment
for the fields the loop does not set; the JSON names any such variable found.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import typer
from pydantic import ValidationError

from forecaster import ForecasterSettings, PlannerState, Traffic, run_once
from forecaster.errors import ConfigError
from forecaster.models.select import build_candidates
from forecaster.run import SelectionCache
from sim.client.traffic.history import counter_fields
from sim.loop.config import LoopConfig
from sim.loop.run import Prepared, prepare, replicas_for
from sim.loop.whatif import emulate, forwarded_counts, score

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PROMPTEDGE_DATA_DIR", ROOT.parent / "shared" / "data"))
# Cache hits on the ramp in the loop: 0.30 of 3,869 requests (sim/README.md, "loop").
LIVE_MISS_RATIO = 0.70
# Pod created -> Ready beyond the warm-up: readiness probe period and the node's pod sync.
READINESS_S = 20.0
# Decisions every simulated minute, as the loop's daemon; these two cannot be varied here.
FIXED_KEYS = ("step_s", "daemon_interval_s")
T0 = 1_800_000_000.0 - 1_800_000_000.0 % 60  # any whole minute: the forecaster reads relative time


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> {field: value}; a value is JSON when it parses, else the string.
    Raises typer.BadParameter on a malformed item, an unknown field or a fixed one."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise typer.BadParameter(f"{item!r}: expected KEY=VALUE")
        if key not in ForecasterSettings.model_fields:
            raise typer.BadParameter(f"{key!r} is no ForecasterSettings field (forecaster/settings.py)")
        if key in FIXED_KEYS:
            raise typer.BadParameter(f"{key} is fixed at 60 s here: the emulation decides once a minute")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw.strip()
    return out


def split_variant(text: str) -> list[str]:
    """'a=1,b=["x","y"]' -> ['a=1', 'b=["x","y"]']: split at commas that start a new KEY=."""
    return [part for part in re.split(r",(?=\s*[A-Za-z_]\w*\s*=)", text) if part.strip()]


class MemoryStore:
    """The planner state in memory (the daemon keeps it in Redis)."""

    def __init__(self) -> None:
        self.state: PlannerState | None = None

    def load(self) -> PlannerState | None:
        return self.state

    def save(self, state: PlannerState) -> None:
        self.state = state


class CounterSource:
    """Per-minute counts as the Redis counter source reads them: minutes [now - history_s, now),
    the current minute left out as incomplete, NaN where nothing was written. ``requests``,
    ``misses``: counts per minute, shape (n,), index 0 = minute ``first`` (from the segment start,
    negative in the history)."""

    name = "whatif"

    def __init__(self, requests: np.ndarray, misses: np.ndarray, first: int, history_s: float) -> None:
        self._req, self._miss, self._first, self._minutes = requests, misses, first, math.ceil(history_s / 60)

    def fetch(self, now: float | None = None) -> Traffic:
        assert now is not None
        last = math.floor((now - T0) / 60) - 1
        lo = last - self._minutes + 1
        req, miss = np.full(self._minutes, np.nan), np.full(self._minutes, np.nan)
        a, b = max(lo, self._first), min(last + 1, self._first + len(self._req))
        if a < b:
            req[a - lo : b - lo] = self._req[a - self._first : b - self._first]
            miss[a - lo : b - lo] = self._miss[a - self._first : b - self._first]
        return Traffic(start=T0 + lo * 60.0, step=60.0, requests=req / 60.0, misses=miss / 60.0, name=self.name)


def run_variant(
    settings: ForecasterSettings, source: CounterSource, minutes: int, initial: int
) -> list[tuple[int, str, str]]:
    """(desired, model, reason) of the decision at the start of each minute, as the daemon."""
    store, cache, current = MemoryStore(), SelectionCache(settings.reselect_s), initial
    out = []
    for m in range(minutes):
        res = run_once(
            settings,
            source,
            now=T0 + m * 60 + 1,
            store=store,
            current=current,  # type: ignore[arg-type]
            cache=cache,
        )
        current = res.decision.replicas
        out.append((current, res.model, res.decision.reason))
    return out


@dataclass(frozen=True)
class Counts:
    """What every variant reads. ``requests``, ``misses``: counts per minute from minute
    ``first`` (negative: the history) to the segment's end; ``live``: forwarded requests per
    segment minute, shape (minutes,); ``need``: replicas each segment minute's window needs."""

    requests: np.ndarray
    misses: np.ndarray
    first: int
    live: np.ndarray
    need: list[int]


def counts(cfg: LoopConfig, prep: Prepared, miss_ratio: float) -> Counts:
    """The history as the loop writes it into the counters (``counter_fields``), then the
    segment's arrivals and their forwarded share drawn with ``cfg.seed``."""
    seg, minutes = prep.segment, math.ceil(prep.segment.span_s / 60)
    live = forwarded_counts([r.offset_s for r in seg.requests], minutes, miss_ratio, cfg.seed)
    arrivals = np.bincount([min(minutes - 1, int(r.offset_s // 60)) for r in seg.requests], minlength=minutes)
    hist = [counter_fields(r, cfg.miss_ratio, (0.0, 0.0)) for _, r in prep.history]
    window0 = int(seg.start_s // seg.step_s)
    need = [
        replicas_for(
            seg.window_rps[int((seg.start_s + m * 60) // seg.step_s) - window0] * miss_ratio,
            prep.capacity_rps,
            cfg.headroom,
            cfg.max_replicas,
        )
        for m in range(minutes)
    ]
    return Counts(
        np.array([h["requests"] for h in hist] + list(arrivals), dtype=float),
        np.array([h["misses"] for h in hist] + list(live), dtype=float),
        prep.history[0][0] if prep.history else 0,
        live,
        need,
    )


def compare(
    cfg: LoopConfig, prep: Prepared, data: Counts, variants: list[tuple[str, dict[str, Any]]], lead_min: int
) -> list[dict[str, Any]]:
    """One row per variant (overrides on the loop's forecaster settings): its score, the models
    chosen, ``ratio_to_baseline`` (replica-minutes over the first variant's) and ``minutes``."""
    initial, rows = prep.replicas["predictive"], []
    for name, over in variants:
        settings = ForecasterSettings(**{**loop_settings(cfg, prep.capacity_rps), **over})
        decided = run_variant(
            settings, CounterSource(data.requests, data.misses, data.first, settings.history_s), len(data.live), initial
        )
        timeline = emulate(initial, [d for d, _, _ in decided], lead_min)
        sc = score(initial, timeline, data.need, list(data.live / 60.0), prep.capacity_rps)
        rows.append(
            {
                "name": name,
                "overrides": over,
                **asdict(sc),
                "models": list(dict.fromkeys(m for _, m, _ in decided)),
                "minutes": [
                    {
                        "minute": m,
                        "forwarded": int(data.live[m]),
                        "need": data.need[m],
                        "desired": d,
                        "ready": timeline.ready[m],
                        "warming": timeline.warming[m],
                        "model": model,
                        "reason": why,
                    }
                    for m, (d, model, why) in enumerate(decided)
                ],
            }
        )
    for row in rows:
        base = rows[0]["replica_minutes"]
        row["ratio_to_baseline"] = round(row["replica_minutes"] / base, 3) if base else None
    return rows


def check_variant(name: str, overrides: dict[str, Any], base: dict[str, Any]) -> None:
    """Raise typer.BadParameter naming the variant when its overrides on ``base`` (settings
    fields) are not valid ForecasterSettings or name a model the forecaster does not have."""
    try:
        settings = ForecasterSettings(**{**base, **overrides})
        build_candidates(settings.models, 1440, 60.0, settings.level)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise typer.BadParameter(f"{name}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    except ConfigError as exc:
        raise typer.BadParameter(f"{name}: {exc}") from None


def loop_settings(cfg: LoopConfig, capacity_rps: float) -> dict[str, Any]:
    """The forecaster settings the loop gives its daemon (sim/loop/run.py, ``_start_actor``)."""
    return dict(
        capacity_per_replica=capacity_rps,
        headroom=cfg.headroom,
        min_replicas=1,
        max_replicas=cfg.max_replicas,
        warmup_s=cfg.warmup_s,
        up_cooldown_s=0.0,
        metrics_port=0,
        demand_unit="requests",
        daemon_interval_s=60.0,
        step_s=60.0,
    )


def main(
    hours: float = 1.0,
    start_hour: float | None = typer.Option(None, help="Segment start (hours into the trace); default: the ramp."),
    max_jump: float = typer.Option(1.35, help="Default segment: the steepest ramp rising at most this per window."),
    seed: int = typer.Option(0, help="Segment, history and the forwarded-count draw."),
    miss_ratio: float = typer.Option(LIVE_MISS_RATIO, help="Live cache-miss ratio (the loop's: 0.70 on the ramp)."),
    history_miss_ratio: float = typer.Option(LoopConfig.miss_ratio, help="Misses per request in the history."),
    history: str = typer.Option("sampled", help="sampled (counts, the loop's default) or expected (window means)."),
    warmup_s: float = typer.Option(300.0, help="Replica warm-up (simulated s), also the forecaster's warmup_s."),
    lead_min: int | None = typer.Option(
        None, help="Decision to Ready, minutes; default ceil((warm-up + actuation_delay_s + 20 s) / 60)."
    ),
    capacity_rps: float | None = typer.Option(None, help="Requests/s per replica; default measured as the loop does."),
    set_: list[str] = typer.Option([], "--set", help="KEY=VALUE: a ForecasterSettings field for every run."),
    variant: list[str] = typer.Option([], help="'KEY=VALUE[,KEY=VALUE]': one more run with these on top."),
    json_path: Path = typer.Option(Path("out/loop_whatif.json"), "--json"),
) -> None:
    logging.getLogger("forecaster").setLevel(logging.ERROR)  # holds would log a warning per minute
    warnings.filterwarnings("ignore")  # statsmodels' convergence warnings during selection
    common = parse_overrides(set_)
    variants = [("defaults" + (f" ({', '.join(set_)})" if set_ else ""), common)]
    variants += [(v, {**common, **parse_overrides(split_variant(v))}) for v in variant]
    try:
        cfg = LoopConfig(
            trace=DATA / "traces" / "servegen-m-large",
            start_hour=start_hour,
            max_jump=max_jump or None,
            hours=hours,
            warmup_s=warmup_s,
            seed=seed,
            history=history,
            capacity_rps=capacity_rps,
            miss_ratio=history_miss_ratio,
            progress=False,
            tokens_trace=DATA / "traces" / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv",
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    for name, over in variants:  # refuse a bad value before the half minute of preparation
        check_variant(name, over, loop_settings(cfg, 1.0))
    t0 = time.time()
    prep = prepare(cfg)
    data = counts(cfg, prep, miss_ratio)
    delay_s = ForecasterSettings(**{**loop_settings(cfg, prep.capacity_rps), **common}).actuation_delay_s
    lead = lead_min if lead_min is not None else math.ceil((warmup_s + delay_s + READINESS_S) / 60)
    rows = compare(cfg, prep, data, variants, lead)
    seg = prep.segment
    report = {
        "segment": {
            "start_hour": round(seg.start_s / 3600, 3),
            "hours": hours,
            "requests": len(seg.requests),
            "forwarded": int(data.live.sum()),
            "window_rps": [round(x, 4) for x in seg.window_rps],
            "seed": seed,
            "history": history,
        },
        "replica": {
            "capacity_rps": prep.capacity_rps,
            "warmup_s": warmup_s,
            "lead_min": lead,
            "initial": prep.replicas["predictive"],
            "headroom": cfg.headroom,
            "max_replicas": cfg.max_replicas,
        },
        "miss_ratio": miss_ratio,
        "history_miss_ratio": history_miss_ratio,
        "need_replica_minutes": sum(data.need),
        "env": sorted(k for k in os.environ if k.startswith("PROMPTEDGE_FORECASTER_")),
        "variants": rows,
        "wall_s": round(time.time() - t0, 1),
    }
    typer.echo(render(report))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    typer.echo(f"JSON {json_path}, wall {report['wall_s']:.0f} s")


def render(report: dict[str, Any]) -> str:
    """The side-by-side table and what it was computed on."""
    seg, rep = report["segment"], report["replica"]
    lines = [
        f"segment hour {seg['start_hour']} ({seg['hours']:g} h, {seg['requests']} requests, "
        f"{seg['forwarded']} forwarded at miss ratio {report['miss_ratio']:g}), history {seg['history']}, "
        f"seed {seg['seed']}; capacity {rep['capacity_rps']:g} req/s, start {rep['initial']} replicas, "
        f"Ready {rep['lead_min']} min after a scale-up decision",
        f"per-window need: {report['need_replica_minutes']} replica-minutes "
        f"({report['need_replica_minutes'] / 60:.2f} GPU-h)",
        "",
    ]
    head = ("variant", "replica-min", "GPU-h", "vs base", "min < need", "min < demand", "scale events", "models")
    rows = [
        (
            r["name"],
            str(r["replica_minutes"]),
            f"{r['gpu_hours']:.2f}",
            "-" if r["ratio_to_baseline"] is None else f"{r['ratio_to_baseline']:.2f}x",
            str(r["under_need_minutes"]),
            str(r["under_demand_minutes"]),
            str(r["scale_events"]),
            ",".join(r["models"]),
        )
        for r in report["variants"]
    ]
    widths = [max(len(x[i]) for x in (head, *rows)) for i in range(len(head))]
    for row in (head, *rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if report["env"]:
        lines.append(f"(also from the environment: {', '.join(report['env'])})")
    return "\n".join(lines)


if __name__ == "__main__":
    typer.run(main)
