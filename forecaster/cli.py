"""``python -m forecaster``: run (once, for cron), backtest.

Exit codes: 0 a decision was made (including a hold on a stale last bucket); 2 bad input
(trace file, flags, settings); 3 the source could not be read and the last decision was held.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import typer

from forecaster.errors import ForecasterError
from forecaster.run import RunResult, run_once
from forecaster.settings import ForecasterSettings
from forecaster.sources import RedisCounterSource, Source, TraceSource
from forecaster.state import RedisStateStore

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)

EXIT_BAD_INPUT = 2
EXIT_HELD_SOURCE = 3


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def print_plan(result: RunResult) -> None:
    """Plan table, then the model and the decision with its reason."""
    series = result.series
    typer.echo(
        f"series {series.get('name', '?')}: {series.get('buckets', 0)} buckets of "
        f"{series.get('step_s', 0):g} s, {series.get('missing_buckets', 0)} missing, "
        f"demand in {series.get('demand_unit', '?')}"
    )
    typer.echo(f"model  {result.model}: {result.note}")
    if result.steps:
        typer.echo(f"{'ahead':>7}  {'bucket (UTC)':16}  {'forecast':>10}  {'upper':>10}  {'replicas':>8}")
        for step in result.steps:
            ahead = (step.start - result.now) / 60
            typer.echo(
                f"{ahead:>5.0f} m  {_clock(step.start):16}  {step.forecast:>10.3f}  "
                f"{step.upper:>10.3f}  {step.replicas:>8d}"
            )
    d = result.decision
    typer.echo(f"decision: {d.replicas} replicas ({d.action}): {d.reason}")


@app.callback()
def _group() -> None:
    """PromptEdge forecaster: plans replicas ahead of demand by the warm-up time."""


@app.command()
def run(
    once: Annotated[bool, typer.Option("--once", help="Plan once and exit (for cron).")] = False,
    trace: Annotated[Optional[Path], typer.Option(help="Read demand from a trace file/folder.")] = None,
    trace_format: Annotated[str, typer.Option(help="auto|azure|mooncake|servegen|burstgpt|generic")] = "auto",
    model_name: Annotated[Optional[str], typer.Option(help="Router model/pool to plan for.")] = None,
    now: Annotated[Optional[float], typer.Option(help="Unix s to treat as now (simulated clock).")] = None,
    step: Annotated[Optional[float], typer.Option(help="Bucket length in s (default: setting).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the plan as JSON here.")] = None,
) -> None:
    """Forecast the next 30 minutes and decide replicas (dry-run until actuation is set)."""
    if not once:
        raise _fail("only --once is supported by 'run'; use 'daemon' for a schedule")
    try:
        settings = ForecasterSettings(**({"model_name": model_name} if model_name else {}))
        source: Source
        store = None
        if trace is not None:
            source = TraceSource(trace, step, settings.trace_tz, trace_format)
        else:
            source = RedisCounterSource(
                settings.redis_url, settings.model_name, settings.history_s, settings.source_timeout_s
            )
            store = RedisStateStore(settings.redis_url, settings.state_key, settings.source_timeout_s)
        result = run_once(settings, source, now, store)
    except ForecasterError as exc:
        raise _fail(str(exc)) from None
    except ValueError as exc:  # pydantic settings validation
        raise _fail(f"settings: {exc}") from None
    print_plan(result)
    typer.echo(f"actuation: {settings.actuation} (dry-run: nothing was scaled)")
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result.to_json(), indent=2))
    if result.decision.action == "hold" and "source unavailable" in result.decision.reason:
        raise typer.Exit(EXIT_HELD_SOURCE)


def main() -> None:
    """Entry point for ``python -m forecaster``."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    app()
