"""Loads a trace and a question pool into a replay plan and runs it into a report."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from sim.questions import MixConfig, QuestionMix, load_pairs
from sim.replay import PlannedRequest, ReplayConfig, plan_requests, run_plan
from sim.report import summarize
from sim.sample import QUESTIONS_FILE, TRACE_FILE
from sim.traces import read_trace


def build_plan(
    trace: Path | None, questions: Path | None, cfg: ReplayConfig, mix: MixConfig = MixConfig()
) -> list[PlannedRequest]:
    """Plan from the given files, or the shipped synthetic sample for a missing one.

    Raises TraceFormatError / QuestionsFormatError on bad files.
    """
    rows = read_trace(trace or TRACE_FILE)
    pairs = load_pairs(questions or QUESTIONS_FILE)
    return plan_requests(rows, QuestionMix(pairs, mix), cfg)


def replay_report(plan: list[PlannedRequest], cfg: ReplayConfig) -> dict[str, Any]:
    """Run the plan against ``cfg.target`` and summarise it (see report.summarize)."""
    outcomes, wall = asyncio.run(run_plan(plan, cfg))
    report = summarize(outcomes, wall)
    report["target"] = cfg.target
    report["speedup"] = cfg.speedup
    return report


def write_json(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
