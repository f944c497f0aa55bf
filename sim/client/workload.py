"""Loads a trace and a question pool into a replay plan and runs it into a report."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from sim.client.questions import MixConfig, QuestionMix, QuestionPair, load_pairs
from sim.client.replay import PlannedRequest, ReplayConfig, plan_requests, run_plan
from sim.client.report import demand_minutes, summarize
from sim.client.sample import QUESTIONS_FILE, TRACE_FILE
from sim.client.traces import TraceRequest, read_trace


def load_inputs(trace: Path | None, questions: Path | None) -> tuple[list[TraceRequest], list[QuestionPair]]:
    """The given files, or the shipped synthetic sample for a missing one.

    Raises TraceFormatError / QuestionsFormatError on bad files.
    """
    return read_trace(trace or TRACE_FILE), load_pairs(questions or QUESTIONS_FILE)


def thinning_fraction(
    rows: list[TraceRequest], speedup: float, duration_s: float | None, max_token_rate: float
) -> float:
    """Fraction of requests to keep so the generated tokens per wall second average at most
    ``max_token_rate`` (1.0 when they already do, or when max_token_rate <= 0: no limit).

    Tokens, not requests, because the cost of the local stack (SSE chunks through replica,
    router and load generator) grows with the tokens streamed."""
    window = [r for r in rows if duration_s is None or r.offset_s / speedup < duration_s]
    if max_token_rate <= 0 or len(window) < 2:
        return 1.0
    wall = max(window[-1].offset_s / speedup, 1e-9)
    tokens = sum(max(1, r.generated_tokens) for r in window)
    return min(1.0, max_token_rate * wall / tokens)


def build_plan(
    rows: list[TraceRequest], pairs: list[QuestionPair], cfg: ReplayConfig, mix: MixConfig = MixConfig()
) -> list[PlannedRequest]:
    return plan_requests(rows, QuestionMix(pairs, mix), cfg)


def replay_report(plan: list[PlannedRequest], cfg: ReplayConfig, clock_origin: float | None = None) -> dict[str, Any]:
    """Run the plan against ``cfg.target`` and summarise it (see report.summarize). With
    ``clock_origin`` (the Unix time at which the router's simulated clock, running ``cfg.speedup``
    times faster, read wall time), also ``demand_minutes`` on that clock (report.demand_minutes)."""
    outcomes, wall = asyncio.run(run_plan(plan, cfg))
    report = summarize(outcomes, wall)
    report["target"] = cfg.target
    report["speedup"] = cfg.speedup
    report["sample_fraction"] = round(cfg.sample_fraction, 4)
    if clock_origin is not None:
        to_wall = time.time() - time.perf_counter()  # an outcome's sent_s is a perf_counter() reading
        report["demand_minutes"] = demand_minutes(
            outcomes, lambda sent: clock_origin + (sent + to_wall - clock_origin) * cfg.speedup
        )
    return report


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
